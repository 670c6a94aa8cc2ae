//! The gRPC listeners' bounds, driven by a raw HTTP/2 client (the `h2` crate) that opens
//! streams and never finishes them and by sockets that never send a byte, the way a
//! misbehaving caller would: streams per connection, calls in flight (load shedding with
//! `RESOURCE_EXHAUSTED`), their share per caller and the fair admission queue in front of
//! them (bursts wait instead of being refused), the health budget on the journal's port
//! and on a health port, connections per peer, the first-request, idle and request-body
//! timeouts (plaintext and TLS), header size, and the bare `CANCELLED` of a call whose
//! `grpc-timeout` passed. Attackers connect from other loopback addresses (127.0.0.2 and
//! up) than the callers they must not lock out. No assertion depends on speed; waits are
//! bounded.

use crate::common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::observe::{samples, value};
use common::*;
use h2::client::{ResponseFuture, SendRequest};
use opjournal::api::TransportLimits;
use opjournal::client::{ClientError, ErrorReason};
use opjournal::proto;
use opjournal::telemetry::{Telemetry, TelemetryOptions};
use opjournal_gated_io::{Gate, GatedIo};
use sqlx::PgPool;
use tokio::io::AsyncRead;
use tokio_util::sync::CancellationToken;
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

/// A raw HTTP/2 connection that ignores the server's stream limit: up to `streams` streams
/// are sent before the server's SETTINGS are read (open the gate once they are queued).
async fn unruly_connection(addr: SocketAddr, streams: usize) -> (SendRequest<Bytes>, Arc<Gate>) {
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (io, gate) = GatedIo::new(tcp);
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
    // Without a queue (`max_queued_requests` 0): shed at once, as before the queue.
    let app = spawn_limited(
        pool,
        TransportLimits {
            max_in_flight_requests: 4,
            max_queued_requests: 0,
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

// ---------------------------------------------------------------------------------------
// Every listener bounded before authentication, and fairness between callers.

const HEALTH_WATCH: &str = "/grpc.health.v1.Health/Watch";
const BEGIN: &str = "/opjournal.v1.OperationJournal/BeginOperation";

/// A TCP connection to `addr` from the loopback address `127.0.0.<host>`.
async fn tcp_from(host: u8, addr: SocketAddr) -> tokio::net::TcpStream {
    opjournal_gated_io::connect_from(host, addr).await.unwrap()
}

/// A raw HTTP/2 connection from `127.0.0.<host>`; the handle resolves when it ends.
async fn raw_connection_from(
    host: u8,
    addr: SocketAddr,
) -> (SendRequest<Bytes>, tokio::task::JoinHandle<()>) {
    let (client, connection) = h2::client::handshake(tcp_from(host, addr).await)
        .await
        .unwrap();
    let ended = tokio::spawn(async move {
        let _ = connection.await;
    });
    (client, ended)
}

/// Whether the server closes `stream` within `limit` (reads until the end or an error).
async fn closed_within(stream: &mut (impl AsyncRead + Unpin), limit: Duration) -> bool {
    use tokio::io::AsyncReadExt as _;
    let mut buffer = [0u8; 4096];
    tokio::time::timeout(limit, async {
        loop {
            match stream.read(&mut buffer).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await
    .is_ok()
}

/// Opens a health `Watch` of `""` (request sent in full) and waits for its answer's headers:
/// `Ok` while it is held open, `Err` with the status when it was refused.
async fn watch(client: &mut SendRequest<Bytes>) -> Result<h2::RecvStream, tonic::Status> {
    let (response, mut stream) = open_call(client, HEALTH_WATCH, &[]);
    let request = tonic_health::pb::HealthCheckRequest {
        service: String::new(),
    };
    stream.send_data(grpc_frame(&request), true).unwrap();
    let response = response.await.unwrap();
    if response.headers().contains_key("grpc-status") {
        return Err(tonic::Status::from_header_map(response.headers()).unwrap());
    }
    Ok(response.into_body())
}

/// `streams` health watches on each of `connections` connections from each of `hosts`:
/// the open ones (with their connections, to keep them) and the refusals' `limit`s.
async fn flood_watches(
    addr: SocketAddr,
    hosts: &[u8],
    connections: usize,
    streams: usize,
) -> (Vec<(SendRequest<Bytes>, h2::RecvStream)>, Vec<String>) {
    let mut open = Vec::new();
    let mut refused = Vec::new();
    for &host in hosts {
        for _ in 0..connections {
            let (client, _) = raw_connection_from(host, addr).await;
            for _ in 0..streams {
                let mut client = client.clone().ready().await.unwrap();
                match watch(&mut client).await {
                    Ok(body) => open.push((client, body)),
                    Err(status) => {
                        assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
                        assert_eq!(reason(&status), "SERVER_OVERLOADED");
                        let info = status.get_details_error_info().unwrap();
                        refused.push(info.metadata["limit"].clone());
                    }
                }
            }
        }
    }
    (open, refused)
}

fn count(limits: &[String], limit: &str) -> usize {
    limits.iter().filter(|l| *l == limit).count()
}

fn health_budget() -> TransportLimits {
    TransportLimits {
        max_health_streams: 6,
        max_health_streams_per_peer: 3,
        ..TransportLimits::default()
    }
}

/// Health watches over the budget: each peer gets its share, all peers the budget, the rest
/// is refused at once; `other` is served meanwhile; closing the watches gives the places
/// back.
async fn health_watches_are_bounded(addr: SocketAddr, other: impl AsyncFn()) {
    // Three peers, two connections each, five watches per connection: 30 asked for.
    let (open, refused) = flood_watches(addr, &[2, 3, 4], 2, 5).await;
    // Peer 2 got its share (3 of 10); peer 3 its share too, which filled the budget; peer
    // 4 found the budget full but had its first two, as every peer has.
    assert_eq!(open.len(), 8, "the budget, {refused:?}");
    assert_eq!(count(&refused, "max_health_streams_per_peer"), 7);
    assert_eq!(count(&refused, "max_health_streams"), 7 + 8);
    other().await;
    // A prober on its own address is answered while the budget is full.
    assert_eq!(
        common::observe::health_status(addr, "liveness").await,
        ServingStatus::Serving as i32
    );
    drop(open);
    // The places come back once the server sees the streams end.
    let mut attempts = 0;
    loop {
        let (open, refused) = flood_watches(addr, &[5], 1, 3).await;
        if open.len() == 3 {
            assert!(refused.is_empty());
            break;
        }
        attempts += 1;
        assert!(
            attempts < 200,
            "the places were not given back: {refused:?}"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn health_watches_have_a_budget_of_their_own_with_a_share_per_peer(pool: PgPool) {
    let app = spawn_limited(pool, health_budget()).await;
    health_watches_are_bounded(app.addr, async || {
        // Journal calls do not use the health budget.
        let status = app
            .journal
            .clone()
            .get_operation(missing_key())
            .await
            .unwrap_err();
        assert_eq!(reason(&status), "OPERATION_NOT_FOUND");
    })
    .await;
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn the_health_port_has_the_same_limits(pool: PgPool) {
    let app = spawn_limited(pool, TransportLimits::default()).await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let health = listener.local_addr().unwrap();
    let shutdown = tokio_util::sync::CancellationToken::new();
    tokio::spawn(opjournal::api::serve_health(
        app.parts.journal.store().clone(),
        listener,
        Duration::from_millis(200),
        TransportLimits {
            max_connections: 8,
            max_connections_per_peer: 4,
            first_request_timeout: Duration::from_millis(500),
            ..health_budget()
        },
        shutdown.clone(),
    ));
    health_watches_are_bounded(health, async || {
        assert_eq!(
            common::observe::health_status(health, "liveness").await,
            ServingStatus::Serving as i32
        );
    })
    .await;
    // Silent connections from one peer past its share are pushed out or closed; a probe
    // from another address is answered; every silent one is closed.
    let mut silent = Vec::new();
    for _ in 0..10 {
        silent.push(tcp_from(6, health).await);
    }
    assert_eq!(
        common::observe::health_status(health, "liveness").await,
        ServingStatus::Serving as i32
    );
    for socket in &mut silent {
        assert!(closed_within(socket, Duration::from_secs(10)).await);
    }
    shutdown.cancel();
}

/// A journal client on a new connection to `url` (with `tls`), given 5 s for everything.
async fn begin_within_five_seconds(
    url: String,
    tls: Option<tonic::transport::ClientTlsConfig>,
    key: &str,
) {
    let call = async {
        let mut endpoint = tonic::transport::Channel::from_shared(url).unwrap();
        if let Some(tls) = tls {
            endpoint = endpoint.tls_config(tls).unwrap();
        }
        let channel = endpoint.connect().await.unwrap();
        let mut request = tonic::Request::new(proto::BeginOperationRequest {
            operation_key: key.into(),
            action_type: "create_payment".into(),
            payload_json: r#"{"amount_minor":1000,"currency":"EUR"}"#.into(),
            ..Default::default()
        });
        request.set_timeout(Duration::from_secs(5));
        proto::operation_journal_client::OperationJournalClient::new(channel)
            .begin_operation(request)
            .await
            .unwrap()
            .into_inner()
    };
    let answer = tokio::time::timeout(Duration::from_secs(5), call)
        .await
        .expect("the Begin was served within its 5 s deadline");
    assert_eq!(decision(&answer), proto::Decision::Execute);
}

fn idle_limits() -> TransportLimits {
    TransportLimits {
        max_connections: 8,
        max_connections_per_peer: 4,
        first_request_timeout: Duration::from_secs(1),
        max_connection_idle: Some(Duration::from_secs(1)),
        ..TransportLimits::default()
    }
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn idle_connections_cannot_lock_callers_out_and_are_closed(pool: PgPool) {
    let app = spawn_limited(pool, idle_limits()).await;
    // Three attacker addresses, five silent sockets each: past the per-peer share and past
    // the listener's connections.
    let mut silent = Vec::new();
    for host in [2, 3, 4] {
        for _ in 0..5 {
            silent.push(tcp_from(host, app.addr).await);
        }
    }
    begin_within_five_seconds(format!("http://{}", app.addr), None, "payment:idle:plain").await;
    for socket in &mut silent {
        assert!(
            closed_within(socket, Duration::from_secs(10)).await,
            "a silent connection stayed open"
        );
    }
    // A connection that made one call and then has none open is closed when idle.
    let (mut client, ended) = raw_connection_from(2, app.addr).await;
    let (response, mut stream) = open_call(&mut client, GET_OPERATION, &[]);
    stream.send_data(grpc_frame(&missing_key()), true).unwrap();
    assert_eq!(grpc_status(response).await.code(), Code::NotFound);
    tokio::time::timeout(Duration::from_secs(10), ended)
        .await
        .expect("the idle connection was closed")
        .unwrap();
    assert_eq!(app.rows_for("payment:idle:plain").await, 1);
}

/// A CA and a server certificate for 127.0.0.1 in `dir`: the server's TLS, a tonic client
/// trusting the CA, and a raw rustls client for attackers.
fn test_tls(
    dir: &std::path::Path,
) -> (
    opjournal::api::tls::ServerTls,
    tonic::transport::ClientTlsConfig,
    tokio_rustls::TlsConnector,
) {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca_key = KeyPair::generate().unwrap();
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(ca_params, ca_key);
    let key = KeyPair::generate().unwrap();
    let server = CertificateParams::new(vec!["127.0.0.1".to_owned()])
        .unwrap()
        .signed_by(&key, &issuer)
        .unwrap();
    std::fs::write(dir.join("ca.pem"), ca.pem()).unwrap();
    std::fs::write(dir.join("server.pem"), server.pem()).unwrap();
    std::fs::write(dir.join("server-key.pem"), key.serialize_pem()).unwrap();
    let files = opjournal::api::tls::ServerTlsFiles {
        cert_file: dir.join("server.pem"),
        key_file: dir.join("server-key.pem"),
        client_ca_file: None,
    };
    let server_tls = opjournal::api::tls::server_config(&files).unwrap();
    let client = opjournal::api::tls::client_config(Some(&dir.join("ca.pem")), None).unwrap();
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca.der().clone()).unwrap();
    let raw = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    (
        server_tls,
        client,
        tokio_rustls::TlsConnector::from(Arc::new(raw)),
    )
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn idle_connections_over_tls_cannot_lock_callers_out_and_are_closed(pool: PgPool) {
    let dir = tempfile::tempdir().unwrap();
    let (server_tls, client_tls, connector) = test_tls(dir.path());
    let app = TestApp::spawn_with_options(
        pool,
        SpawnOptions {
            tls: Some(server_tls),
            client_tls: Some(client_tls.clone()),
            transport: idle_limits(),
            ..SpawnOptions::default()
        },
    )
    .await;
    // Attackers that finish the TLS handshake and then say nothing, and some that never
    // start it.
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
    let mut handshaken = Vec::new();
    let mut silent = Vec::new();
    for host in [2, 3, 4] {
        for i in 0..5 {
            let tcp = tcp_from(host, app.addr).await;
            if i % 2 == 0 {
                // Pushed out or closed before its handshake ends is fine too.
                if let Ok(Ok(tls)) = tokio::time::timeout(
                    Duration::from_secs(5),
                    connector.connect(name.clone(), tcp),
                )
                .await
                {
                    handshaken.push(tls);
                }
            } else {
                silent.push(tcp);
            }
        }
    }
    assert!(!handshaken.is_empty());
    begin_within_five_seconds(
        format!("https://{}", app.addr),
        Some(client_tls),
        "payment:idle:tls",
    )
    .await;
    for socket in &mut handshaken {
        assert!(closed_within(socket, Duration::from_secs(10)).await);
    }
    for socket in &mut silent {
        assert!(closed_within(socket, Duration::from_secs(10)).await);
    }
}

const TOKEN_A: &str = "tok-a.0f3c9d2e71b84a6f";
const TOKEN_B: &str = "tok-b.8e1d4c7a09b25f36";

fn tenants() -> opjournal::api::Authenticator {
    use sha2::Digest as _;
    let entry = |name: &str, token: &str, namespace: &str| {
        format!(
            "[[tokens]]\nname = \"{name}\"\nsha256 = \"{}\"\nnamespaces = [\"{namespace}\"]\n\
             roles = [\"client\"]\n\n",
            hex::encode(sha2::Sha256::digest(token.as_bytes()))
        )
    };
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("opjournal.toml");
    let toml = entry("tenant-a-agent", TOKEN_A, "tenant-a")
        + &entry("tenant-b-agent", TOKEN_B, "tenant-b");
    std::fs::write(&path, toml).unwrap();
    let config = opjournal::config::Config::load(Some(&path), serde_json::json!({})).unwrap();
    opjournal::api::Authenticator::new(config.token_registry().unwrap())
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn one_tenant_holding_header_only_begins_cannot_block_another_and_its_calls_end(
    pool: PgPool,
) {
    let app = TestApp::spawn_with_options(
        pool,
        SpawnOptions {
            auth: tenants(),
            transport: TransportLimits {
                max_in_flight_requests: 8,
                max_in_flight_requests_per_caller: 4,
                request_body_timeout: Duration::from_secs(1),
                ..TransportLimits::default()
            },
            ..SpawnOptions::default()
        },
    )
    .await;
    // Tenant A's token: eight BeginOperation HEADERS on two connections, no body ever.
    let bearer = format!("Bearer {TOKEN_A}");
    let mut held = Vec::new();
    for _ in 0..2 {
        let mut client = raw_connection(app.addr).await;
        for _ in 0..4 {
            held.push(open_call(
                &mut client,
                BEGIN,
                &[("authorization", bearer.as_str())],
            ));
        }
    }
    // Tenant B is served meanwhile.
    let mut request = tonic::Request::new(proto::BeginOperationRequest {
        namespace: "tenant-b".into(),
        operation_key: "payment:order-9:intent-01".into(),
        action_type: "create_payment".into(),
        payload_json: r#"{"amount_minor":1000,"currency":"EUR"}"#.into(),
        ..Default::default()
    });
    request.set_timeout(Duration::from_secs(5));
    let answer = app
        .journal_as(TOKEN_B)
        .begin_operation(request)
        .await
        .unwrap();
    assert_eq!(decision(&answer.into_inner()), proto::Decision::Execute);
    // Tenant A had its share; the rest of its calls queued behind it (never more than its
    // share running), and every one ends with a clear status once the body timeout passes
    // (the queued ones one timeout after they were admitted): no place leaks.
    let mut shed = 0;
    let mut timed_out = 0;
    for (response, _stream) in held {
        let status = tokio::time::timeout(Duration::from_secs(10), grpc_status(response))
            .await
            .expect("every held call ends");
        match status.code() {
            Code::ResourceExhausted => {
                let error = ClientError::from(status);
                assert_eq!(error.reason, ErrorReason::ServerOverloaded);
                assert_eq!(error.metadata["limit"], "max_in_flight_requests_per_caller");
                shed += 1;
            }
            Code::DeadlineExceeded => {
                assert_eq!(reason(&status), "REQUEST_BODY_TIMEOUT");
                let error = ClientError::from(status);
                assert_eq!(error.reason, ErrorReason::RequestBodyTimeout);
                assert!(error.is_transient(), "nothing was done: {error:?}");
                timed_out += 1;
            }
            other => panic!("unexpected {other:?}: {status:?}"),
        }
    }
    assert_eq!((shed, timed_out), (0, 8));
    // Tenant A's places are back: its next Begin is served.
    let mut request = tonic::Request::new(proto::BeginOperationRequest {
        namespace: "tenant-a".into(),
        operation_key: "payment:order-10:intent-01".into(),
        action_type: "create_payment".into(),
        payload_json: r#"{"amount_minor":1000,"currency":"EUR"}"#.into(),
        ..Default::default()
    });
    request.set_timeout(Duration::from_secs(5));
    app.journal_as(TOKEN_A)
        .begin_operation(request)
        .await
        .unwrap();
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM agent_operations")
        .fetch_one(app.pool())
        .await
        .unwrap();
    assert_eq!(rows, 2, "the header-only calls wrote nothing");
}

// ---------------------------------------------------------------------------------------
// The admission queue: bursts wait for a place instead of being refused.

fn begin_request(namespace: &str, key: &str) -> proto::BeginOperationRequest {
    proto::BeginOperationRequest {
        namespace: namespace.into(),
        operation_key: key.into(),
        action_type: "create_payment".into(),
        payload_json: r#"{"amount_minor":1000,"currency":"EUR"}"#.into(),
        ..Default::default()
    }
}

/// Sends a whole unary call (headers, its one message, the end) on `client`.
fn send_call(
    client: &mut SendRequest<Bytes>,
    path: &str,
    extra: &[(&str, &str)],
    message: &impl prost::Message,
) -> ResponseFuture {
    let (response, mut stream) = open_call(client, path, extra);
    stream.send_data(grpc_frame(message), true).unwrap();
    response
}

async fn rows(app: &TestApp) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM agent_operations")
        .fetch_one(app.pool())
        .await
        .unwrap()
}

/// The `limit` of a `RESOURCE_EXHAUSTED` / `SERVER_OVERLOADED` refusal with a `RetryInfo`.
fn overload_limit(status: tonic::Status) -> String {
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    let error = ClientError::from(status);
    assert_eq!(error.reason, ErrorReason::ServerOverloaded);
    assert_eq!(error.retry_after, Some(Duration::from_secs(1)));
    assert!(error.is_transient());
    error.metadata["limit"].clone()
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn a_burst_of_two_hundred_lifecycles_at_once_is_queued_and_every_call_served(pool: PgPool) {
    let app = spawn_limited(pool, TransportLimits::default()).await;
    // Four connections, so that up to 200 calls reach the server at once (100 streams per
    // connection), all of one caller (one address): past its share of 64 and the 128.
    // Without the queue (`max_queued_requests` 0) about 136 of them are refused.
    let mut clients = Vec::new();
    for _ in 0..4 {
        let channel = tonic::transport::Channel::from_shared(format!("http://{}", app.addr))
            .unwrap()
            .connect()
            .await
            .unwrap();
        clients.push(proto::operation_journal_client::OperationJournalClient::new(channel));
    }
    let barrier = Arc::new(tokio::sync::Barrier::new(200));
    let callers: Vec<_> = (0..200)
        .map(|i| {
            let mut client = clients[i % 4].clone();
            let barrier = barrier.clone();
            tokio::spawn(async move {
                barrier.wait().await;
                let key = format!("payment:burst-{i}:intent-01");
                let begun = client
                    .begin_operation(begin_request("", &key))
                    .await?
                    .into_inner();
                assert_eq!(decision(&begun), proto::Decision::Execute);
                client
                    .complete_operation(proto::CompleteOperationRequest {
                        lease_token: begun.lease_token,
                        external_id: format!("pay_{i}"),
                        result_json: String::new(),
                    })
                    .await?;
                Ok::<_, tonic::Status>(())
            })
        })
        .collect();
    let mut refused = Vec::new();
    for caller in callers {
        if let Err(status) = caller.await.unwrap() {
            refused.push(status);
        }
    }
    assert!(refused.is_empty(), "{} refused: {refused:?}", refused.len());
    let succeeded: i64 =
        sqlx::query_scalar("SELECT count(*) FROM agent_operations WHERE status = 'succeeded'")
            .fetch_one(app.pool())
            .await
            .unwrap();
    assert_eq!(succeeded, 200);
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn a_call_past_a_full_queue_is_refused_with_retry_info_and_writes_nothing(pool: PgPool) {
    let app = spawn_limited(
        pool,
        TransportLimits {
            max_in_flight_requests: 2,
            max_queued_requests: 4,
            ..TransportLimits::default()
        },
    )
    .await;
    // On one connection, in order: two calls held in flight (no body yet), four queued.
    let mut raw = raw_connection(app.addr).await;
    let held: Vec<_> = (0..6)
        .map(|_| open_call(&mut raw, GET_OPERATION, &[]))
        .collect();
    // The seventh finds the queue full: refused at once, not served.
    let begin = send_call(
        &mut raw,
        BEGIN,
        &[],
        &begin_request("", "payment:queue-full:intent-01"),
    );
    assert_eq!(
        overload_limit(grpc_status(begin).await),
        "max_queued_requests"
    );
    // So is another connection's Begin while they wait.
    let status = app
        .journal
        .clone()
        .begin_operation(begin_request("", "payment:queue-full:intent-02"))
        .await
        .unwrap_err();
    assert_eq!(overload_limit(status), "max_queued_requests");
    assert_eq!(rows(&app).await, 0, "a refused Begin wrote nothing");
    // The held and queued calls are served in turn once their requests arrive.
    for (response, mut stream) in held {
        stream.send_data(grpc_frame(&missing_key()), true).unwrap();
        let status = tokio::time::timeout(Duration::from_secs(10), grpc_status(response))
            .await
            .expect("every queued call is served");
        assert_eq!(status.code(), Code::NotFound, "{status:?}");
    }
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn a_queued_call_whose_deadline_nears_is_refused_before_it_and_writes_nothing(pool: PgPool) {
    let app = spawn_limited(
        pool,
        TransportLimits {
            max_in_flight_requests: 1,
            max_queue_wait: Duration::from_secs(2),
            ..TransportLimits::default()
        },
    )
    .await;
    let mut raw = raw_connection(app.addr).await;
    let (_held, _stream) = open_call(&mut raw, GET_OPERATION, &[]);
    // A Begin with a 400 ms deadline waits for the one place, then is refused with
    // SERVER_OVERLOADED shortly before its deadline (not a bare CANCELLED at it).
    let started = tokio::time::Instant::now();
    let begin = send_call(
        &mut raw,
        BEGIN,
        &[("grpc-timeout", "400m")],
        &begin_request("", "payment:deadline:intent-01"),
    );
    assert_eq!(overload_limit(grpc_status(begin).await), "grpc-timeout");
    assert!(
        started.elapsed() >= Duration::from_millis(300),
        "it waited: {:?}",
        started.elapsed()
    );
    assert_eq!(rows(&app).await, 0, "the refused Begin wrote nothing");
    // Without a header, `max_queue_wait` bounds the wait.
    let begin = send_call(
        &mut raw,
        BEGIN,
        &[],
        &begin_request("", "payment:deadline:intent-02"),
    );
    assert_eq!(overload_limit(grpc_status(begin).await), "max_queue_wait");
    assert_eq!(rows(&app).await, 0);
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn one_caller_s_queue_does_not_delay_another_caller_beyond_one_freed_place(pool: PgPool) {
    let app = TestApp::spawn_with_options(
        pool,
        SpawnOptions {
            auth: tenants(),
            transport: TransportLimits {
                max_in_flight_requests: 3,
                max_in_flight_requests_per_caller: 2,
                // A caller queues at most 6 × 2 / 3 = 4 of them.
                max_queued_requests: 6,
                ..TransportLimits::default()
            },
            ..SpawnOptions::default()
        },
    )
    .await;
    let bearer_a = format!("Bearer {TOKEN_A}");
    let bearer_b = format!("Bearer {TOKEN_B}");
    let a = [("authorization", bearer_a.as_str())];
    let b = [("authorization", bearer_b.as_str())];
    // On one connection, in order: tenant A holds its share (two calls, no body yet), B one
    // call, which fills the budget; then A asks for six more (four queued: its share of the
    // queue, two refused), and B one Begin after them, which still finds room.
    let mut raw = raw_connection(app.addr).await;
    let a_held: Vec<_> = (0..2)
        .map(|_| open_call(&mut raw, GET_OPERATION, &a))
        .collect();
    let (b_held, mut b_stream) = open_call(&mut raw, GET_OPERATION, &b);
    let a_queued: Vec<_> = (0..6)
        .map(|_| open_call(&mut raw, GET_OPERATION, &a))
        .collect();
    let b_begin = send_call(
        &mut raw,
        BEGIN,
        &b,
        &begin_request("tenant-b", "payment:fair:intent-01"),
    );
    // One place frees (B's held call is answered): it goes to B's Begin, queued last,
    // because A is at its share.
    let get = proto::GetOperationRequest {
        namespace: "tenant-b".into(),
        operation_key: "payment:order-missing:intent-01".into(),
    };
    b_stream.send_data(grpc_frame(&get), true).unwrap();
    assert_eq!(grpc_status(b_held).await.code(), Code::NotFound);
    let status = tokio::time::timeout(Duration::from_secs(10), grpc_status(b_begin))
        .await
        .expect("B's Begin got the freed place");
    assert_eq!(status.code(), Code::Ok, "{status:?}");
    assert_eq!(app.rows_for("payment:fair:intent-01").await, 1);
    // A's calls past its share of the queue were refused; its queued calls are still
    // waiting: A never ran more than its share.
    let mut a_queued = a_queued.into_iter();
    let (first_queued, _stream) = a_queued.next().unwrap();
    let refused: Vec<_> = a_queued.skip(3).collect();
    for (response, _stream) in refused {
        assert_eq!(
            overload_limit(grpc_status(response).await),
            "max_queued_requests"
        );
    }
    assert!(
        tokio::time::timeout(Duration::from_millis(200), first_queued)
            .await
            .is_err(),
        "A's oldest queued call is still waiting"
    );
    drop(a_held);
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn the_admission_queue_s_length_and_waits_are_measured(pool: PgPool) {
    let telemetry = Telemetry::new(&TelemetryOptions::local("opjournal-test")).unwrap();
    let app = TestApp::spawn_with_options(
        pool,
        SpawnOptions {
            transport: TransportLimits {
                max_in_flight_requests: 1,
                max_queued_requests: 4,
                ..TransportLimits::default()
            },
            metrics: telemetry.metrics().clone(),
            ..SpawnOptions::default()
        },
    )
    .await;
    let stop = CancellationToken::new();
    let (metrics_address, _) =
        opjournal::app::serve_metrics(&telemetry, "127.0.0.1:0".parse().unwrap(), stop.clone())
            .await
            .unwrap()
            .unwrap();
    let scrape = async || {
        let url = format!("http://{metrics_address}/metrics");
        samples(&reqwest::get(url).await.unwrap().text().await.unwrap())
    };
    // One call held in flight, one queued behind it, and one queued that gives up shortly
    // before its deadline.
    let mut raw = raw_connection(app.addr).await;
    let (held, mut held_stream) = open_call(&mut raw, GET_OPERATION, &[]);
    let (queued, mut queued_stream) = open_call(&mut raw, GET_OPERATION, &[]);
    let late = send_call(
        &mut raw,
        GET_OPERATION,
        &[("grpc-timeout", "2S")],
        &missing_key(),
    );
    let started = Instant::now();
    while value(&scrape().await, "opjournal_admission_queued", &[]) != Some(2.0) {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "two calls never queued"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(overload_limit(grpc_status(late).await), "grpc-timeout");
    for (response, stream) in [(held, &mut held_stream), (queued, &mut queued_stream)] {
        stream.send_data(grpc_frame(&missing_key()), true).unwrap();
        assert_eq!(grpc_status(response).await.code(), Code::NotFound);
    }
    let after = scrape().await;
    assert_eq!(value(&after, "opjournal_admission_queued", &[]), Some(0.0));
    let waits = |outcome: &str| {
        value(
            &after,
            "opjournal_admission_queue_wait_seconds_count",
            &[("outcome", outcome)],
        )
    };
    assert_eq!(waits("admitted"), Some(1.0));
    assert_eq!(waits("refused"), Some(1.0));
    stop.cancel();
}
