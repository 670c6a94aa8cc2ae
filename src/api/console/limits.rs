//! What the console reads of a request before anyone is signed in, and for how long: the
//! limits of its connections ([`super::listener`]), the deadline of every request body, and
//! the sign-in form's size and rate.

use std::net::{IpAddr, SocketAddr};
use std::num::NonZeroU32;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{ConnectInfo, Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::Response;
use governor::clock::{Clock as _, DefaultClock};
use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};
use http_body::Frame;
use tokio::time::Sleep;

use super::listener::peer_key;
use super::view;

/// The console's limits and timeouts; every field has a safe default
/// (docs/review-console.md, "Limits and timeouts").
#[derive(Debug, Clone)]
pub struct ConsoleLimits {
    /// Connections open at once; one more is accepted and closed at once.
    pub max_connections: usize,
    /// Connections open at once from one peer (an IPv4 address or an IPv6 /64).
    pub max_connections_per_peer: usize,
    /// Longest wait for a request's line and headers (HTTP/1.1), from the moment the
    /// connection waits for them (a new one, or a kept-alive one between requests).
    pub header_timeout: Duration,
    /// Longest wait for a request's whole body once its headers arrived; past it the
    /// request is answered 408 and nothing is changed.
    pub body_timeout: Duration,
    /// A connection on which no byte moves either way for this long is closed.
    pub idle_timeout: Duration,
    /// Largest sign-in form, in bytes; a larger one is answered 413 unread.
    pub sign_in_max_bytes: usize,
    /// Sign-in attempts one peer may make at once before it is slowed down.
    pub sign_in_burst: u32,
    /// Sign-in attempts one peer may make per minute, once its burst is spent; one more is
    /// answered 429 with `Retry-After`, unread.
    pub sign_in_per_minute: u32,
    /// Further names (`host` for any port, `host:port` for one) the console answers to,
    /// besides its own address (see [`super::hosts`]).
    pub allowed_hosts: Vec<String>,
}

impl Default for ConsoleLimits {
    /// 256 connections, 32 a peer; 5 s for a request's head, 10 s for its body, 60 s idle;
    /// sign-in forms of at most 4 KiB, a burst of 10 a peer, then 10 a minute.
    fn default() -> Self {
        Self {
            max_connections: 256,
            max_connections_per_peer: 32,
            header_timeout: Duration::from_secs(5),
            body_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            sign_in_max_bytes: 4096,
            sign_in_burst: 10,
            sign_in_per_minute: 10,
            allowed_hosts: Vec::new(),
        }
    }
}

/// Answers a request whose body has not arrived whole within `timeout` of its headers with
/// 408 (the handler reading it gets an error, and changes nothing).
pub(super) async fn body_deadline(
    State(timeout): State<Duration>,
    request: Request,
    next: Next,
) -> Response {
    let expired = Arc::new(AtomicBool::new(false));
    let request = request.map(|body| {
        Body::new(DeadlineBody {
            inner: body,
            deadline: tokio::time::sleep(timeout),
            expired: Arc::clone(&expired),
        })
    });
    let response = next.run(request).await;
    if expired.load(Ordering::Relaxed) {
        tracing::info!("console request refused: its body did not arrive in time");
        return view::error_page(
            None,
            StatusCode::REQUEST_TIMEOUT,
            "Request timed out",
            "The form did not arrive in time: nothing was changed. Try again.",
        );
    }
    response
}

pin_project_lite::pin_project! {
    /// A request body that fails once its deadline passes before it ends.
    struct DeadlineBody {
        #[pin]
        inner: Body,
        #[pin]
        deadline: Sleep,
        expired: Arc<AtomicBool>,
    }
}

impl http_body::Body for DeadlineBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let this = self.project();
        if let Poll::Ready(frame) = this.inner.poll_frame(cx) {
            return Poll::Ready(frame);
        }
        match this.deadline.poll(cx) {
            Poll::Ready(()) => {
                this.expired.store(true, Ordering::Relaxed);
                Poll::Ready(Some(Err(axum::Error::new("request body timed out"))))
            }
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// Sign-in attempts per peer.
pub(super) struct SignInGate {
    limiter: DefaultKeyedRateLimiter<IpAddr>,
    max_bytes: usize,
}

/// Peers remembered by the sign-in rate limit before those back to a full burst are
/// forgotten.
const REMEMBERED_PEERS: usize = 10_000;

impl SignInGate {
    pub(super) fn new(limits: &ConsoleLimits) -> Self {
        let per_minute = NonZeroU32::new(limits.sign_in_per_minute).unwrap_or(NonZeroU32::MIN);
        let burst = NonZeroU32::new(limits.sign_in_burst).unwrap_or(NonZeroU32::MIN);
        Self {
            limiter: RateLimiter::keyed(Quota::per_minute(per_minute).allow_burst(burst)),
            max_bytes: limits.sign_in_max_bytes,
        }
    }
}

/// Before a sign-in form is read: a peer past its sign-in rate gets 429 with `Retry-After`,
/// a form declared larger than the sign-in limit 413; neither body is read. (A form sent
/// without a length is cut at the same limit by the route's body limit.)
pub(super) async fn sign_in_gate(
    State(gate): State<Arc<SignInGate>>,
    request: Request,
    next: Next,
) -> Response {
    let peer = request
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map_or(IpAddr::from([0, 0, 0, 0]), |info| info.0.ip());
    let limiter = &gate.limiter;
    if limiter.len() >= REMEMBERED_PEERS {
        limiter.retain_recent();
    }
    if let Err(not_until) = limiter.check_key(&peer_key(peer)) {
        let wait = not_until.wait_time_from(DefaultClock::default().now());
        let seconds = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
        tracing::info!("console sign-in refused: too many attempts from one peer");
        let mut response = view::error_page(
            None,
            StatusCode::TOO_MANY_REQUESTS,
            "Too many sign-in attempts",
            &format!(
                "Too many sign-in attempts came from your address: nothing was checked. \
                 Try again in {seconds} s."
            ),
        );
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(seconds.max(1)));
        return response;
    }
    let declared = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|length| length > gate.max_bytes as u64) {
        tracing::info!("console sign-in refused: form over the size limit");
        return too_large();
    }
    next.run(request).await
}

/// The 413 page: nothing was read or changed.
pub(super) fn too_large() -> Response {
    view::error_page(
        None,
        StatusCode::PAYLOAD_TOO_LARGE,
        "Request too large",
        "The form is larger than the console accepts. Nothing was changed.",
    )
}
