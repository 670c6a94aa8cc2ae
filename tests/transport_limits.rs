//! The gRPC port's bounds, driven by a raw HTTP/2 client (the `h2` crate) that opens streams
//! and never finishes them, the way a misbehaving caller would: streams per connection,
//! calls in flight (load shedding with `RESOURCE_EXHAUSTED`), header size, and the bare
//! `CANCELLED` of a call whose `grpc-timeout` passed. No assertion depends on timing.

#![allow(clippy::unwrap_used, missing_docs)]

mod common;

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use common::*;
use futures::task::AtomicWaker;
use h2::client::{ResponseFuture, SendRequest};
use opjournal::api::TransportLimits;
use opjournal::client::{ClientError, ErrorReason};
use opjournal::proto;
use sqlx::PgPool;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tonic::Code;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_types::StatusExt as _;

const GET_OPERATION: &str = "/opjournal.v1.OperationJournal/GetOperation";

async fn spawn_limited(pool: PgPool, transport: TransportLimits) -> TestApp {
    TestApp::spawn_with_options(
        pool,
        SpawnOptions {
            transport,
            ..SpawnOptions::default()
        },
    )
    .await
}

/// A raw HTTP/2 connection, its client honouring the server's SETTINGS.
async fn raw_connection(addr: SocketAddr) -> SendRequest<Bytes> {
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (client, connection) = h2::client::handshake(tcp).await.unwrap();
    tokio::spawn(async move {
        let _ = connection.await;
    });
    client
}

/// A connection whose reads wait until [`Gate::open`]: its HTTP/2 client sends everything
/// queued before it can read the server's SETTINGS, as a client that ignores them would.
struct GatedIo {
    tcp: tokio::net::TcpStream,
    gate: Arc<Gate>,
}

#[derive(Default)]
struct Gate {
    open: AtomicBool,
    waker: AtomicWaker,
}

impl Gate {
    fn open(&self) {
        self.open.store(true, Ordering::SeqCst);
        self.waker.wake();
    }
}

impl AsyncRead for GatedIo {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        self.gate.waker.register(cx.waker());
        if !self.gate.open.load(Ordering::SeqCst) {
            return Poll::Pending;
        }
        Pin::new(&mut self.tcp).poll_read(cx, buf)
    }
}

impl AsyncWrite for GatedIo {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.tcp).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.tcp).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.tcp).poll_shutdown(cx)
    }
}

/// A raw HTTP/2 connection that ignores the server's stream limit: up to `streams` streams
/// are sent before the server's SETTINGS are read (open the gate once they are queued).
async fn unruly_connection(addr: SocketAddr, streams: usize) -> (SendRequest<Bytes>, Arc<Gate>) {
    let gate = Arc::new(Gate::default());
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let io = GatedIo {
        tcp,
        gate: gate.clone(),
    };
    let (client, connection) = h2::client::Builder::new()
        .initial_max_send_streams(streams)
        .handshake(io)
        .await
        .unwrap();
    tokio::spawn(async move {
        let _ = connection.await;
    });
    (client, gate)
}

/// Opens a gRPC call to `path` and leaves its request open: no message, no end of stream.
fn open_call(
    client: &mut SendRequest<Bytes>,
    path: &str,
    extra: &[(&str, &str)],
) -> (ResponseFuture, h2::SendStream<Bytes>) {
    let mut request = http::Request::builder()
        .method("POST")
        .uri(format!("http://localhost{path}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers");
    for (name, value) in extra {
        request = request.header(*name, *value);
    }
    client
        .send_request(request.body(()).unwrap(), false)
        .unwrap()
}

/// One gRPC message frame: uncompressed, length-prefixed.
fn grpc_frame(message: &impl prost::Message) -> Bytes {
    let body = message.encode_to_vec();
    let mut frame = vec![0u8];
    frame.extend_from_slice(&u32::try_from(body.len()).unwrap().to_be_bytes());
    frame.extend_from_slice(&body);
    Bytes::from(frame)
}

/// The gRPC status of an answer: from its headers (a trailers-only answer) or its trailers.
async fn grpc_status(response: ResponseFuture) -> tonic::Status {
    let response = response.await.unwrap();
    if response.headers().contains_key("grpc-status") {
        return tonic::Status::from_header_map(response.headers()).unwrap();
    }
    let mut body = response.into_body();
    while let Some(chunk) = body.data().await {
        chunk.unwrap();
    }
    let trailers = body.trailers().await.unwrap().unwrap();
    tonic::Status::from_header_map(&trailers).unwrap()
}

fn missing_key() -> proto::GetOperationRequest {
    proto::GetOperationRequest {
        namespace: String::new(),
        operation_key: "payment:order-missing:intent-01".into(),
    }
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn one_connection_cannot_open_more_streams_than_the_limit_and_others_are_served(
    pool: PgPool,
) {
    let app = spawn_limited(
        pool,
        TransportLimits {
            max_concurrent_streams: 8,
            ..TransportLimits::default()
        },
    )
    .await;
    let (mut raw, gate) = unruly_connection(app.addr, 1000).await;
    // Forty calls at once, none of them finished by the client.
    let calls: Vec<_> = (0..40)
        .map(|_| open_call(&mut raw, GET_OPERATION, &[]))
        .collect();
    // Let every HEADERS frame go out before the client can learn the limit.
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    gate.open();
    let (held, over): (Vec<_>, Vec<_>) = calls.into_iter().enumerate().partition(|(i, _)| *i < 8);

    let mut refused = 0;
    for (_, (response, _stream)) in over {
        let error = response.await.unwrap_err();
        assert_eq!(error.reason(), Some(h2::Reason::REFUSED_STREAM), "{error}");
        refused += 1;
    }
    assert_eq!(refused, 32);

    // Another client is served while the eight streams are held open.
    let status = app
        .journal
        .clone()
        .get_operation(missing_key())
        .await
        .unwrap_err();
    assert_eq!(reason(&status), "OPERATION_NOT_FOUND");

    // The eight accepted streams were being served: finished now, each gets its answer.
    for (_, (response, mut stream)) in held {
        stream.send_data(grpc_frame(&missing_key()), true).unwrap();
        let status = grpc_status(response).await;
        assert_eq!(status.code(), Code::NotFound);
        assert_eq!(reason(&status), "OPERATION_NOT_FOUND");
    }
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn calls_past_the_in_flight_limit_are_shed_with_retry_info_and_health_is_not(pool: PgPool) {
    let app = spawn_limited(
        pool,
        TransportLimits {
            max_in_flight_requests: 4,
            overload_retry_after: Duration::from_millis(700),
            ..TransportLimits::default()
        },
    )
    .await;
    let mut raw = raw_connection(app.addr).await;
    let held: Vec<_> = (0..4)
        .map(|_| open_call(&mut raw, GET_OPERATION, &[]))
        .collect();
    // The fifth call on the same connection comes after the four: it is shed at once.
    let (fifth, _stream) = open_call(&mut raw, GET_OPERATION, &[]);
    let shed = grpc_status(fifth).await;
    assert_eq!(raw.current_max_send_streams(), 100);
    assert_eq!(shed.code(), Code::ResourceExhausted);
    assert_eq!(reason(&shed), "SERVER_OVERLOADED");

    // So is any other client's call while the four are held, with the RetryInfo.
    let status = app
        .journal
        .clone()
        .get_operation(missing_key())
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted);
    let error = ClientError::from(status.clone());
    assert_eq!(error.reason, ErrorReason::ServerOverloaded);
    assert_eq!(error.retry_after, Some(Duration::from_millis(700)));
    assert_eq!(error.metadata["limit"], "max_in_flight_requests");
    assert!(error.is_transient());
    // Health is never shed.
    assert_eq!(
        common::observe::health_status(app.addr, "").await,
        ServingStatus::Serving as i32
    );

    // The held connection goes away; its places are given back.
    drop(held);
    drop(raw);
    let mut attempts = 0;
    loop {
        match app.journal.clone().get_operation(missing_key()).await {
            Err(status) if status.code() == Code::NotFound => break,
            Err(status) if status.code() == Code::ResourceExhausted && attempts < 200 => {
                attempts += 1;
                tokio::time::sleep(Duration::from_millis(25)).await;
            }
            other => panic!("unexpected answer: {other:?}"),
        }
    }
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn a_call_whose_deadline_passes_in_the_server_is_cancelled_without_error_info_and_may_be_repeated(
    pool: PgPool,
) {
    let app = spawn_limited(pool, TransportLimits::default()).await;
    let mut raw = raw_connection(app.addr).await;
    // The request never arrives in full, so the handler waits until the deadline.
    let (response, _stream) = open_call(&mut raw, GET_OPERATION, &[("grpc-timeout", "200m")]);
    let status = grpc_status(response).await;
    // What tonic's transport answers: a bare CANCELLED, before or around any handler.
    assert_eq!(status.code(), Code::Cancelled);
    assert!(status.get_details_error_info().is_none());
    let error = ClientError::from(status);
    assert_eq!(error.reason, ErrorReason::Transport);
    assert!(error.is_transient(), "safe to repeat: {error:?}");
    // The connection serves the next call.
    let (response, mut stream) = open_call(&mut raw, GET_OPERATION, &[]);
    stream.send_data(grpc_frame(&missing_key()), true).unwrap();
    assert_eq!(grpc_status(response).await.code(), Code::NotFound);
}

/// A GetOperation with one extra metadata entry of `bytes` bytes, on the harness's channel.
async fn get_with_header(app: &TestApp, bytes: usize) -> Result<(), tonic::Status> {
    let mut request = tonic::Request::new(missing_key());
    request
        .metadata_mut()
        .insert("x-padding", "a".repeat(bytes).parse().unwrap());
    match app.journal.clone().get_operation(request).await {
        Err(status) if status.code() == Code::NotFound => Ok(()),
        Err(status) => Err(status),
        Ok(_) => panic!("the key does not exist"),
    }
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn headers_over_the_limit_fail_that_call_only_and_repeating_it_cannot_help(pool: PgPool) {
    let app = spawn_limited(pool, TransportLimits::default()).await;
    // Under the 16 KiB default: served.
    get_with_header(&app, 8 * 1024).await.unwrap();
    for bytes in [20 * 1024, 64 * 1024] {
        let status = get_with_header(&app, bytes).await.unwrap_err();
        // Refused by HTTP/2 before any handler: no ErrorInfo, and not UNAVAILABLE (which a
        // mesh would repeat, with the same headers, to the same end).
        assert!(status.get_details_error_info().is_none(), "{status:?}");
        assert_ne!(status.code(), Code::Unavailable, "{bytes}: {status:?}");
        assert!(
            !ClientError::from(status).is_transient(),
            "{bytes}: a repeat carries the same headers"
        );
        // The connection was not ended: the next call on the same channel is served.
        get_with_header(&app, 100).await.unwrap();
    }
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn a_connection_past_its_age_and_grace_is_closed_even_with_a_call_held_open(pool: PgPool) {
    let app = spawn_limited(
        pool,
        TransportLimits {
            max_connection_age: Some(Duration::from_millis(500)),
            max_connection_age_grace: Some(Duration::from_millis(500)),
            ..TransportLimits::default()
        },
    )
    .await;
    let mut raw = raw_connection(app.addr).await;
    // A call whose request never ends would keep a graceful close waiting for ever.
    let (held, _stream) = open_call(&mut raw, GET_OPERATION, &[]);
    let ended = tokio::time::timeout(Duration::from_secs(60), held)
        .await
        .expect("the connection is closed after its age and grace");
    assert!(ended.is_err(), "the held call got no answer: {ended:?}");
    // A new connection is served.
    let mut fresh = proto::operation_journal_client::OperationJournalClient::connect(format!(
        "http://{}",
        app.addr
    ))
    .await
    .unwrap();
    let status = fresh.get_operation(missing_key()).await.unwrap_err();
    assert_eq!(reason(&status), "OPERATION_NOT_FOUND");
}
