//! A gRPC relay in front of the journal, as a service mesh's proxy stands in front of a pod:
//! it forwards every call unchanged, and, when told to, loses the answer of the next Begin of
//! a key. That Begin reaches the journal and is processed to the end (its answer is read in
//! full), then the caller gets `UNAVAILABLE` instead of it, as when a proxy's connection to
//! the pod breaks after the request went through. Or it holds that answer back for a while
//! before passing it on (a slow proxy, a long GC pause of the caller), and it can refuse
//! every `RenewLease` with `UNAVAILABLE` (the journal unreachable while a provider call
//! runs). Calls the journal does not answer (it is stopped) are answered `UNAVAILABLE` too.

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
const RENEW: &str = "/opjournal.v1.OperationJournal/RenewLease";

/// What happens to the answer of an armed Begin.
#[derive(Debug, Clone, Copy)]
enum Fault {
    /// Dropped; the caller gets `UNAVAILABLE`.
    Lose,
    /// Passed on after this long.
    Delay(std::time::Duration),
}

/// The relay: its address, and the keys whose next Begin answer it loses or delays.
pub struct Relay {
    pub addr: SocketAddr,
    next_begin: Mutex<Vec<(String, Fault)>>,
    lost: std::sync::Mutex<BTreeMap<String, usize>>,
    delayed: std::sync::Mutex<BTreeMap<String, usize>>,
    refuse_renewals: std::sync::atomic::AtomicBool,
    upstream: Channel,
}

impl Relay {
    /// Starts a relay on a new port forwarding to the journal at `journal`.
    pub async fn start(journal: SocketAddr) -> Arc<Self> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let relay = Arc::new(Self {
            addr: listener.local_addr().unwrap(),
            next_begin: Mutex::new(Vec::new()),
            lost: std::sync::Mutex::default(),
            delayed: std::sync::Mutex::default(),
            refuse_renewals: std::sync::atomic::AtomicBool::new(false),
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
        self.next_begin
            .lock()
            .await
            .push((operation_key.to_owned(), Fault::Lose));
    }

    /// Holds the answer of the next Begin of `operation_key` back for `delay`, then passes
    /// it on.
    pub async fn delay_next_begin_answer(&self, operation_key: &str, delay: std::time::Duration) {
        self.next_begin
            .lock()
            .await
            .push((operation_key.to_owned(), Fault::Delay(delay)));
    }

    /// How many Begin answers of `operation_key` the relay has delayed so far.
    pub fn answers_delayed_for(&self, operation_key: &str) -> usize {
        let delayed = self.delayed.lock().unwrap();
        delayed.get(operation_key).copied().unwrap_or_default()
    }

    /// From now on (`true`) answers every `RenewLease` `UNAVAILABLE` without forwarding it.
    pub fn refuse_renewals(&self, refuse: bool) {
        self.refuse_renewals
            .store(refuse, std::sync::atomic::Ordering::SeqCst);
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

    /// The key of this Begin body (one gRPC frame) and its fault when its answer is one to
    /// lose or delay; takes the key off the list then.
    async fn take_if_armed(&self, frame: &[u8]) -> Option<(String, Fault)> {
        let begin = BeginOperationRequest::decode(frame.get(5..)?).ok()?;
        let mut armed = self.next_begin.lock().await;
        let at = armed
            .iter()
            .position(|(key, _)| *key == begin.operation_key)?;
        Some(armed.remove(at))
    }
}

fn unavailable(message: &str) -> Response {
    tonic::Status::unavailable(message.to_owned()).into_http::<Body>()
}

/// Forwards one call; loses or delays its answer when it is an armed Begin.
async fn forward(State(relay): State<Arc<Relay>>, request: Request) -> Response {
    let (parts, body) = request.into_parts();
    if parts.uri.path() == RENEW
        && relay
            .refuse_renewals
            .load(std::sync::atomic::Ordering::SeqCst)
    {
        return unavailable("relay: the journal cannot be reached");
    }
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
    let Some((key, fault)) = lose else {
        return answer.map(Body::new);
    };
    if let Fault::Delay(delay) = fault {
        // A unary answer's head arrives once the journal's handler has returned: the Begin
        // is processed; its answer is passed on later.
        tokio::time::sleep(delay).await;
        *relay.delayed.lock().unwrap().entry(key).or_default() += 1;
        return answer.map(Body::new);
    }
    // Let the journal finish the call (the whole answer, trailers included), then drop it.
    let _ = axum::body::to_bytes(Body::new(answer.into_body()), 16 * 1024 * 1024).await;
    *relay.lost.lock().unwrap().entry(key).or_default() += 1;
    unavailable("relay: the connection to the journal broke before its answer came back")
}
