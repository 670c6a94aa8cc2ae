//! A gRPC relay in front of the journal, as a service mesh's proxy stands in front of a pod:
//! it forwards every call unchanged, and, when told to, loses the answer of the next Begin of
//! a key. That Begin reaches the journal and is processed to the end (its answer is read in
//! full), then the caller gets `UNAVAILABLE` instead of it, as when a proxy's connection to
//! the pod breaks after the request went through. Calls the journal does not answer (it is
//! stopped) are answered `UNAVAILABLE` too.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;

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
    lost: std::sync::Mutex<BTreeMap<String, usize>>,
    upstream: Channel,
}

impl Relay {
    /// Starts a relay on a new port forwarding to the journal at `journal`.
    pub async fn start(journal: SocketAddr) -> Arc<Self> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let relay = Arc::new(Self {
            addr: listener.local_addr().unwrap(),
            lose_next_begin: Mutex::new(Vec::new()),
            lost: std::sync::Mutex::default(),
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
        self.lost.lock().unwrap().values().sum()
    }

    /// How many Begin answers of `operation_key` the relay has lost so far.
    pub fn answers_lost_for(&self, operation_key: &str) -> usize {
        let lost = self.lost.lock().unwrap();
        lost.get(operation_key).copied().unwrap_or_default()
    }

    /// The key of this Begin body (one gRPC frame) when its answer is one to lose; takes the
    /// key off the list then.
    async fn take_if_armed(&self, frame: &[u8]) -> Option<String> {
        let begin = BeginOperationRequest::decode(frame.get(5..)?).ok()?;
        let mut armed = self.lose_next_begin.lock().await;
        let at = armed.iter().position(|key| *key == begin.operation_key)?;
        Some(armed.remove(at))
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
        (body, None)
    };
    let request = http::Request::from_parts(parts, tonic::body::Body::new(body));
    let answer = match relay.upstream.clone().oneshot(request).await {
        Ok(answer) => answer,
        Err(_) => return unavailable("relay: the journal did not answer"),
    };
    let Some(key) = lose else {
        return answer.map(Body::new);
    };
    // Let the journal finish the call (the whole answer, trailers included), then drop it.
    let _ = axum::body::to_bytes(Body::new(answer.into_body()), 16 * 1024 * 1024).await;
    *relay.lost.lock().unwrap().entry(key).or_default() += 1;
    unavailable("relay: the connection to the journal broke before its answer came back")
}
