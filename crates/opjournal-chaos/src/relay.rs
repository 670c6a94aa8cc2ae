//! A gRPC relay in front of each server replica (HTTP/2, loopback): it forwards every call
//! and records the status code the server answered, per RPC, so the report can say which
//! codes the servers sent, read off the wire rather than from the clients' interpretation.
//!
//! Calls from a *lossy* client (its `user-agent` starts with [`LOSSY_AGENT`]) may lose their
//! answer: the relay forwards the request, waits for the server's whole answer (so the
//! server has done all its work), records it, and then never answers; the client's deadline
//! passes, exactly as when an answer is lost on the network.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};

use axum::body::Body;
use axum::extract::{Request, State};
use axum::response::{IntoResponse as _, Response};
use http::header::USER_AGENT;
use http_body_util::BodyExt as _;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::service::TowerToHyperService;
use rand::rngs::StdRng;
use rand::{Rng as _, SeedableRng as _};
use tonic::transport::{Channel, Endpoint};
use tower::ServiceExt as _;

/// The `user-agent` prefix of clients whose answers the relay may lose.
pub const LOSSY_AGENT: &str = "opjournal-chaos-lossy";

/// Counts per RPC, shared by every relay.
#[derive(Default)]
pub struct Wire {
    inner: Mutex<WireCounts>,
}

/// What the relays saw, per RPC (`Service/Method`).
#[derive(Debug, Default, Clone, serde::Serialize)]
pub struct WireCounts {
    /// Status codes the servers answered (`OK`, `UNAVAILABLE`, ...), per RPC.
    pub codes: BTreeMap<String, BTreeMap<String, u64>>,
    /// Answers received from a server and then withheld from a lossy client, per RPC.
    pub lost_answers: BTreeMap<String, u64>,
    /// Calls the relay could not deliver (the replica was down or restarting), per RPC.
    pub unreachable: BTreeMap<String, u64>,
    /// Answers whose stream broke before a status arrived (a replica killed mid-answer).
    pub broken_answers: BTreeMap<String, u64>,
}

impl Wire {
    fn with(&self, change: impl FnOnce(&mut WireCounts)) {
        change(&mut self.inner.lock().unwrap_or_else(PoisonError::into_inner));
    }

    fn code(&self, rpc: &str, code: &str) {
        self.with(|counts| {
            *counts
                .codes
                .entry(rpc.to_owned())
                .or_default()
                .entry(code.to_owned())
                .or_default() += 1;
        });
    }

    /// A copy of the counts so far.
    pub fn snapshot(&self) -> WireCounts {
        self.inner
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

struct Relay {
    upstream: Channel,
    lose_probability: f64,
    rng: Mutex<StdRng>,
    wire: Arc<Wire>,
}

/// Starts a relay on a free loopback port in front of the server at `server`; returns its
/// address. Lossy calls lose their answer with `lose_probability` (0 to 1).
///
/// Errors: the port cannot be bound.
pub async fn start(
    server: SocketAddr,
    lose_probability: f64,
    seed: u64,
    wire: Arc<Wire>,
) -> anyhow::Result<SocketAddr> {
    let upstream = Endpoint::from_shared(format!("http://{server}"))?
        .connect_timeout(std::time::Duration::from_secs(1))
        .connect_lazy();
    let relay = Arc::new(Relay {
        upstream,
        lose_probability,
        rng: Mutex::new(StdRng::seed_from_u64(seed)),
        wire,
    });
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0)).await?;
    let addr = listener.local_addr()?;
    let router = axum::Router::new().fallback(forward).with_state(relay);
    // HTTP/2 only (gRPC). After a stall, clients reset many streams the relay has not taken
    // up yet; hyper's default guard against rapid resets (20) would then close the
    // connection with ENHANCE_YOUR_CALM, a fault of the relay rather than of the server.
    let mut http2 = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
    http2.max_pending_accept_reset_streams(RESET_STREAMS);
    tokio::spawn(async move {
        loop {
            let stream = match listener.accept().await {
                Ok((stream, _)) => stream,
                Err(err) => {
                    tracing::debug!(error = %err, "relay accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                }
            };
            let _ = stream.set_nodelay(true);
            let service = TowerToHyperService::new(router.clone());
            let connection = http2.serve_connection(TokioIo::new(stream), service);
            tokio::spawn(async move {
                if let Err(err) = connection.await {
                    tracing::debug!(error = %err, "relay connection ended");
                }
            });
        }
    });
    Ok(addr)
}

/// How many streams a client may reset before the relay takes them up.
const RESET_STREAMS: usize = 100_000;

async fn forward(State(relay): State<Arc<Relay>>, request: Request) -> Response {
    let rpc = rpc_name(request.uri().path());
    let lossy = request
        .headers()
        .get(USER_AGENT)
        .is_some_and(|agent| agent.as_bytes().starts_with(LOSSY_AGENT.as_bytes()));
    let lose = lossy && {
        let mut rng = relay.rng.lock().unwrap_or_else(PoisonError::into_inner);
        rng.random_bool(relay.lose_probability)
    };
    let request = request.map(tonic::body::Body::new);
    let answered = relay.upstream.clone().oneshot(request).await;
    let wire = Arc::clone(&relay.wire);
    let response = match answered {
        Ok(response) => response,
        Err(_) => {
            wire.with(|counts| *counts.unreachable.entry(rpc.clone()).or_default() += 1);
            return tonic::Status::unavailable("the replica could not be reached")
                .into_http::<Body>();
        }
    };
    if let Some(code) = header_code(response.headers()) {
        // A trailers-only answer: the status is in the headers.
        wire.code(&rpc, code);
        if lose {
            return withhold(&wire, &rpc).await;
        }
        return response.map(Body::new).into_response();
    }
    if lose {
        let (_, body) = response.into_parts();
        match body.collect().await {
            Ok(collected) => {
                let code = collected.trailers().and_then(header_code).unwrap_or("NONE");
                wire.code(&rpc, code);
            }
            Err(_) => {
                wire.with(|counts| *counts.broken_answers.entry(rpc.clone()).or_default() += 1)
            }
        }
        return withhold(&wire, &rpc).await;
    }
    let on_error = Arc::clone(&wire);
    let rpc_error = rpc.clone();
    response
        .map(|body| {
            Body::new(
                body.inspect_frame(move |frame| {
                    if let Some(code) = frame.trailers_ref().and_then(header_code) {
                        wire.code(&rpc, code);
                    }
                })
                .inspect_err(move |_| {
                    on_error.with(|counts| {
                        *counts.broken_answers.entry(rpc_error.clone()).or_default() += 1;
                    });
                }),
            )
        })
        .into_response()
}

/// Never answers: the call ends when the client gives up (its deadline) and drops it.
async fn withhold(wire: &Wire, rpc: &str) -> Response {
    wire.with(|counts| *counts.lost_answers.entry(rpc.to_owned()).or_default() += 1);
    std::future::pending().await
}

/// `Service/Method` from a gRPC path `/package.Service/Method`.
fn rpc_name(path: &str) -> String {
    let mut parts = path.trim_start_matches('/').splitn(2, '/');
    let service = parts.next().unwrap_or_default();
    let method = parts.next().unwrap_or_default();
    let service = service.rsplit('.').next().unwrap_or(service);
    format!("{service}/{method}")
}

/// The `grpc-status` in `headers`, by its canonical name.
fn header_code(headers: &http::HeaderMap) -> Option<&'static str> {
    let value: i32 = headers.get("grpc-status")?.to_str().ok()?.parse().ok()?;
    Some(code_name(value))
}

/// The canonical name of a gRPC status code.
pub fn code_name(code: i32) -> &'static str {
    const NAMES: [&str; 17] = [
        "OK",
        "CANCELLED",
        "UNKNOWN",
        "INVALID_ARGUMENT",
        "DEADLINE_EXCEEDED",
        "NOT_FOUND",
        "ALREADY_EXISTS",
        "PERMISSION_DENIED",
        "RESOURCE_EXHAUSTED",
        "FAILED_PRECONDITION",
        "ABORTED",
        "OUT_OF_RANGE",
        "UNIMPLEMENTED",
        "INTERNAL",
        "UNAVAILABLE",
        "DATA_LOSS",
        "UNAUTHENTICATED",
    ];
    usize::try_from(code)
        .ok()
        .and_then(|index| NAMES.get(index))
        .copied()
        .unwrap_or("INVALID_CODE")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rpc_names_keep_the_service_and_the_method() {
        assert_eq!(
            rpc_name("/opjournal.v1.OperationJournal/BeginOperation"),
            "OperationJournal/BeginOperation"
        );
        assert_eq!(code_name(13), "INTERNAL");
        assert_eq!(code_name(99), "INVALID_CODE");
    }
}
