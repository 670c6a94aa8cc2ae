//! A gRPC relay in front of the journal, as a service mesh's proxy stands in front of a pod:
//! it forwards every call unchanged, and, when told to, loses the answer of the next Begin of
//! a key. That Begin reaches the journal and is processed to the end (its answer is read in
//! full), then the caller gets `UNAVAILABLE` instead of it, as when a proxy's connection to
//! the pod breaks after the request went through. Calls the journal does not answer (it is
//! stopped) are answered `UNAVAILABLE` too.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::body::Body;
use axum::extract::{Request, State};
use axum::response::Response;
use prost::Message as _;
use tokio::sync::Mutex;
use tonic::transport::Channel;
use tower::ServiceExt as _;

use opjournal::proto::BeginOperationRequest;

const BEGIN: &str = "/opjournal.v1.OperationJournal/BeginOperation";

/// The relay: its address, and the keys whose next Begin answer it loses.
pub struct Relay {
    pub addr: SocketAddr,
    lose_next_begin: Mutex<Vec<String>>,
    lost: AtomicUsize,
    upstream: Channel,
}

impl Relay {
    /// Starts a relay on a new port forwarding to the journal at `journal`.
    pub async fn start(journal: SocketAddr) -> Arc<Self> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let relay = Arc::new(Self {
            addr: listener.local_addr().unwrap(),
            lose_next_begin: Mutex::new(Vec::new()),
            lost: AtomicUsize::new(0),
            upstream: Channel::from_shared(format!("http://{journal}"))
                .unwrap()
                .connect_lazy(),
        });
        let router = axum::Router::new()
            .fallback(forward)
            .with_state(relay.clone());
        tokio::spawn(async move {
            tonic::transport::Server::builder()
                .add_routes(tonic::service::Routes::from(router))
                .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener))
                .await
                .unwrap();
        });
        relay
    }

    /// Loses the answer of the next Begin of `operation_key` (after the journal processed it).
    pub async fn lose_next_begin_answer(&self, operation_key: &str) {
        self.lose_next_begin
            .lock()
            .await
            .push(operation_key.to_owned());
    }

    /// How many Begin answers the relay has lost so far.
    pub fn answers_lost(&self) -> usize {
        self.lost.load(Ordering::SeqCst)
    }

    /// Whether the answer to this Begin body (one gRPC frame) is one to lose; takes the key off
    /// the list when it is.
    async fn take_if_armed(&self, frame: &[u8]) -> bool {
        let Some(message) = frame.get(5..) else {
            return false;
        };
        let Ok(begin) = BeginOperationRequest::decode(message) else {
            return false;
        };
        let mut armed = self.lose_next_begin.lock().await;
        match armed.iter().position(|key| *key == begin.operation_key) {
            Some(at) => {
                armed.remove(at);
                true
            }
            None => false,
        }
    }
}

fn unavailable(message: &str) -> Response {
    tonic::Status::unavailable(message.to_owned()).into_http::<Body>()
}

/// Forwards one call; loses its answer when it is an armed Begin.
async fn forward(State(relay): State<Arc<Relay>>, request: Request) -> Response {
    let (parts, body) = request.into_parts();
    let (body, lose) = if parts.uri.path() == BEGIN {
        let Ok(frame) = axum::body::to_bytes(body, 16 * 1024 * 1024).await else {
            return unavailable("relay: the request could not be read");
        };
        let lose = relay.take_if_armed(&frame).await;
        (Body::from(frame), lose)
    } else {
        (body, false)
    };
    let request = http::Request::from_parts(parts, tonic::body::Body::new(body));
    let answer = match relay.upstream.clone().oneshot(request).await {
        Ok(answer) => answer,
        Err(_) => return unavailable("relay: the journal did not answer"),
    };
    if !lose {
        return answer.map(Body::new);
    }
    // Let the journal finish the call (the whole answer, trailers included), then drop it.
    let _ = axum::body::to_bytes(Body::new(answer.into_body()), 16 * 1024 * 1024).await;
    relay.lost.fetch_add(1, Ordering::SeqCst);
    unavailable("relay: the connection to the journal broke before its answer came back")
}
