//! Admission of calls: the in-flight budget shared per caller, the health budget, and the
//! request-body deadline (see the module above for the rules).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http_body::{Frame, SizeHint};
use pin_project_lite::pin_project;
use tokio::time::{Instant, Sleep};
use tonic::codegen::Bytes;
use tower::{Layer, Service};

use super::connections::ConnectionInfo;
use super::queue::{Admit, Budget, Holder, Place, Settings};
use super::{TransportLimits, overloaded, request_body_timed_out};
use crate::api::auth::Authenticator;
use crate::domain::access::Caller;
use crate::telemetry::Metrics;

/// Health calls of one peer admitted even when `max_health_streams` is reached, so that a
/// prober (liveness and readiness at once) is answered whoever else fills the budget. Peers
/// are at most the listener's connections, so this adds at most twice `max_connections`.
pub const HEALTH_PLACES_PER_PEER_ALWAYS_GIVEN: usize = 2;

/// The gRPC path prefix of the health service.
const HEALTH_PATH: &str = "/grpc.health.v1.Health/";
/// The gRPC path prefix of reflection, whose one RPC streams requests.
const REFLECTION_PATH: &str = "/grpc.reflection.";

/// Admission of calls, inside the connection limits: the health budget, the in-flight
/// budget shared per caller with its admission queue, and the request-body timeout. A call
/// that is admitted holds its place until its answer has been sent in full (a health
/// `Watch`: until it ends).
///
/// A journal, reconciler or reflection call that finds the in-flight budget full (or its
/// caller at its share) waits in a bounded, fair queue (see the `queue` module) for at most
/// `max_queue_wait`, and at most until shortly before its `grpc-timeout` deadline (see
/// [`queue_wait`]). It is refused with `RESOURCE_EXHAUSTED`, `ErrorInfo` reason
/// `SERVER_OVERLOADED` and a `RetryInfo` when the queue holds `max_queued_requests` calls
/// already, or the caller its share of them (metadata `limit`: `max_queued_requests`; with 0, the budget's setting as
/// before), or when its wait ends without a place (`limit`: `max_queue_wait`, or
/// `grpc-timeout` when the caller's deadline was the nearer). A refused call was not served:
/// nothing was done. Health calls are never queued.
#[derive(Debug, Clone)]
pub struct AdmissionLayer {
    calls: Arc<Budget>,
    health: Arc<Budget>,
    auth: Authenticator,
    retry_after: Duration,
    body_timeout: Duration,
    max_queue_wait: Duration,
    metrics: Metrics,
}

impl AdmissionLayer {
    /// The admission of a listener with `limits`, its callers told apart by `auth` (each
    /// listener gets its own layer, and so its own budgets and queue); the queue's length
    /// and waits are recorded in `metrics` (`opjournal.admission.queued`,
    /// `opjournal.admission.queue.wait`).
    pub fn new(limits: &TransportLimits, auth: Authenticator, metrics: Metrics) -> Self {
        Self {
            calls: Budget::new(
                limits.max_in_flight_requests,
                limits.max_in_flight_requests_per_caller,
                0,
                limits.max_queued_requests,
                Settings {
                    total: "max_in_flight_requests",
                    per_holder: "max_in_flight_requests_per_caller",
                    queue: "max_queued_requests",
                },
            ),
            health: Budget::new(
                limits.max_health_streams,
                limits.max_health_streams_per_peer,
                HEALTH_PLACES_PER_PEER_ALWAYS_GIVEN,
                0,
                Settings {
                    total: "max_health_streams",
                    per_holder: "max_health_streams_per_peer",
                    queue: "max_health_streams",
                },
            ),
            auth,
            retry_after: limits.overload_retry_after,
            body_timeout: limits.request_body_timeout,
            max_queue_wait: limits.max_queue_wait,
            metrics,
        }
    }

    /// The `RESOURCE_EXHAUSTED` / `SERVER_OVERLOADED` answer naming `limit`.
    fn refusal(&self, limit: &'static str) -> http::Response<tonic::body::Body> {
        tracing::debug!(limit, "call shed");
        overloaded(self.retry_after, limit).into_http()
    }
}

/// Part of a `grpc-timeout` a queued call leaves for being served: a tenth, at most
/// [`MAX_DEADLINE_MARGIN`].
const DEADLINE_MARGIN_DIVISOR: u32 = 10;
/// Most of a `grpc-timeout` kept back for serving a call once it leaves the queue.
const MAX_DEADLINE_MARGIN: Duration = Duration::from_secs(1);

/// How long a call with `headers` may wait in the queue, and the setting that bounds it:
/// `max_queue_wait`, or its `grpc-timeout` less a margin for being served (a tenth, at most
/// 1 s), so that a call that cannot be served in time is refused with `SERVER_OVERLOADED`
/// before its deadline instead of timing out (`grpc-timeout`).
fn queue_wait(headers: &http::HeaderMap, max_queue_wait: Duration) -> (Duration, &'static str) {
    match grpc_timeout(headers) {
        Some(timeout) => {
            let margin = (timeout / DEADLINE_MARGIN_DIVISOR).min(MAX_DEADLINE_MARGIN);
            let wait = timeout.saturating_sub(margin);
            if wait < max_queue_wait {
                (wait, "grpc-timeout")
            } else {
                (max_queue_wait, "max_queue_wait")
            }
        }
        None => (max_queue_wait, "max_queue_wait"),
    }
}

/// The `grpc-timeout` header's duration (gRPC over HTTP/2: at most 8 digits and a unit of
/// `H`, `M`, `S`, `m`, `u` or `n`); `None` when absent or malformed.
fn grpc_timeout(headers: &http::HeaderMap) -> Option<Duration> {
    let value = headers.get("grpc-timeout")?.to_str().ok()?;
    if value.len() < 2 || value.len() > 9 {
        return None;
    }
    let (digits, unit) = value.split_at(value.len() - 1);
    if !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let amount: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(amount * 3600),
        "M" => Duration::from_secs(amount * 60),
        "S" => Duration::from_secs(amount),
        "m" => Duration::from_millis(amount),
        "u" => Duration::from_micros(amount),
        "n" => Duration::from_nanos(amount),
        _ => return None,
    })
}

impl<S> Layer<S> for AdmissionLayer {
    type Service = Admission<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Admission {
            inner,
            layer: self.clone(),
        }
    }
}

/// The service [`AdmissionLayer`] wraps around a server's routes.
#[derive(Debug, Clone)]
pub struct Admission<S> {
    inner: S,
    layer: AdmissionLayer,
}

type Request = http::Request<tonic::body::Body>;

impl<S> Admission<S> {
    /// Who `request` is counted against, and the budget it takes a place in.
    fn holder(&self, request: &mut Request, peer: Option<std::net::IpAddr>) -> Holder {
        match self.layer.auth.authenticate_headers(request.headers()) {
            Ok(Caller::Principal(principal)) => {
                let name = Arc::from(principal.name.as_str());
                // Authenticated once: the services' interceptor takes it from here.
                request
                    .extensions_mut()
                    .insert(Caller::Principal(principal));
                Holder::Principal(name)
            }
            // No token, or one the interceptor will refuse: counted by address.
            _ => Holder::peer(peer),
        }
    }
}

impl<S> Service<Request> for Admission<S>
where
    S: Service<Request, Response = http::Response<tonic::body::Body>> + Clone + Send + 'static,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: Request) -> Self::Future {
        let connection = ConnectionInfo::of(request.extensions());
        // The connection has a call open from here until the answer is sent.
        let stream = connection.map(|info| info.open_stream());
        let peer = connection.and_then(|info| info.remote).map(|a| a.ip());
        let path = request.uri().path();
        let until = if path.starts_with(REFLECTION_PATH) {
            Arrival::FirstMessage
        } else {
            Arrival::End
        };
        let admit = if path.starts_with(HEALTH_PATH) {
            self.layer.health.acquire(Holder::peer(peer))
        } else {
            let holder = self.holder(&mut request, peer);
            self.layer.calls.acquire(holder)
        };
        let ticket = match admit {
            Ok(Admit::Now(place)) => {
                let answer = serve(&mut self.inner, request, &self.layer, until, place);
                return Box::pin(async move { answer.await.map(|r| held(r, stream)) });
            }
            Ok(Admit::Queued(ticket)) => ticket,
            Err(limit) => {
                let response = self.layer.refusal(limit);
                return Box::pin(async move { Ok(response) });
            }
        };
        // The service that was made ready serves this call later; a clone takes its place.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let layer = self.layer.clone();
        let (wait, limit) = queue_wait(request.headers(), layer.max_queue_wait);
        Box::pin(async move {
            let queued = layer.metrics.queued_call();
            let Some(place) = ticket.granted(Instant::now() + wait).await else {
                queued.refused();
                return Ok(layer.refusal(limit));
            };
            queued.admitted();
            let answer = serve(&mut inner, request, &layer, until, place);
            answer.await.map(|r| held(r, stream))
        })
    }
}

/// Serves `request` with `inner`, its body given `body_timeout` (counted from admission) to
/// arrive; the answer holds `place` until it has been sent.
fn serve<S>(
    inner: &mut S,
    request: Request,
    layer: &AdmissionLayer,
    until: Arrival,
    place: Place,
) -> impl Future<Output = Result<(S::Response, Place), S::Error>> + use<S>
where
    S: Service<Request, Response = http::Response<tonic::body::Body>>,
{
    let deadline = Instant::now() + layer.body_timeout;
    let request =
        request.map(|body| tonic::body::Body::new(RequestDeadline::new(body, deadline, until)));
    let answer = inner.call(request);
    async move { Ok((answer.await?, place)) }
}

/// The answer, its body holding the call's place and open stream until it is dropped.
fn held<H: Send + 'static>(
    (response, place): (http::Response<tonic::body::Body>, Place),
    stream: H,
) -> http::Response<tonic::body::Body> {
    response.map(|body| {
        tonic::body::Body::new(Holding {
            inner: body,
            _held: (place, stream),
        })
    })
}

/// What a call's request body must have delivered before `request_body_timeout`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Arrival {
    /// Its end (unary and server-streaming RPCs: one message, then the end).
    End,
    /// Its first complete message (an RPC that streams requests).
    FirstMessage,
}

pin_project! {
    /// A request body that fails with [`request_body_timed_out`] when it has not arrived
    /// (as [`Arrival`] says) by `deadline`.
    struct RequestDeadline<B> {
        #[pin]
        inner: B,
        deadline: Option<Instant>,
        sleep: Option<Pin<Box<Sleep>>>,
        until: Arrival,
        // Bytes of the first message seen so far, and its length once its prefix is in.
        received: Vec<u8>,
        seen: usize,
    }
}

impl<B> RequestDeadline<B> {
    fn new(inner: B, deadline: Instant, until: Arrival) -> Self {
        Self {
            inner,
            deadline: Some(deadline),
            sleep: None,
            until,
            received: Vec::new(),
            seen: 0,
        }
    }
}

/// Counts `data` towards the first gRPC message (a 5-byte prefix: flag and big-endian
/// length, then the message); true once it is complete.
fn first_message_complete(prefix: &mut Vec<u8>, seen: &mut usize, data: &[u8]) -> bool {
    for &byte in data {
        if prefix.len() < 5 {
            prefix.push(byte);
        } else {
            *seen += 1;
        }
    }
    if prefix.len() < 5 {
        return false;
    }
    let length = u32::from_be_bytes([prefix[1], prefix[2], prefix[3], prefix[4]]);
    *seen >= length as usize
}

impl<B> http_body::Body for RequestDeadline<B>
where
    B: http_body::Body<Data = Bytes>,
    B::Error: Into<tower::BoxError>,
{
    type Data = Bytes;
    type Error = tower::BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = self.project();
        match this.inner.poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if *this.until == Arrival::FirstMessage
                    && this.deadline.is_some()
                    && let Some(data) = frame.data_ref()
                    && first_message_complete(this.received, this.seen, data)
                {
                    *this.deadline = None;
                    *this.sleep = None;
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(error))) => Poll::Ready(Some(Err(error.into()))),
            Poll::Ready(None) => {
                *this.deadline = None;
                *this.sleep = None;
                Poll::Ready(None)
            }
            Poll::Pending => {
                let Some(deadline) = *this.deadline else {
                    return Poll::Pending;
                };
                let sleep = this
                    .sleep
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
                if sleep.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                *this.deadline = None;
                *this.sleep = None;
                tracing::debug!("request body timed out");
                Poll::Ready(Some(Err(request_body_timed_out().into())))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

pin_project! {
    /// An answer's body that holds the call's places until it is dropped.
    struct Holding<B, H> {
        #[pin]
        inner: B,
        _held: H,
    }
}

impl<B, H> http_body::Body for Holding<B, H>
where
    B: http_body::Body<Data = Bytes>,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        self.project().inner.poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn a_queued_call_waits_until_shortly_before_its_deadline_or_max_queue_wait() {
        let headers = |value: &str| {
            let mut headers = http::HeaderMap::new();
            headers.insert("grpc-timeout", value.parse().unwrap());
            headers
        };
        let max = Duration::from_secs(10);
        let ms = Duration::from_millis;
        assert_eq!(queue_wait(&headers("400m"), max), (ms(360), "grpc-timeout"));
        assert_eq!(queue_wait(&headers("5S"), max), (ms(4500), "grpc-timeout"));
        // The margin is at most 1 s.
        assert_eq!(
            queue_wait(&headers("1M"), Duration::from_secs(120)),
            (Duration::from_secs(59), "grpc-timeout")
        );
        assert_eq!(queue_wait(&headers("1H"), max), (max, "max_queue_wait"));
        assert_eq!(
            queue_wait(&http::HeaderMap::new(), max),
            (max, "max_queue_wait")
        );
        for bad in ["", "5", "S", "123456789S", "5x", "-5S"] {
            assert_eq!(grpc_timeout(&headers(bad)), None, "{bad}");
        }
        assert_eq!(
            grpc_timeout(&headers("20u")),
            Some(Duration::from_micros(20))
        );
        assert_eq!(grpc_timeout(&headers("7n")), Some(Duration::from_nanos(7)));
    }

    #[test]
    fn the_first_message_is_complete_once_its_length_has_arrived() {
        let (mut prefix, mut seen) = (Vec::new(), 0);
        assert!(!first_message_complete(&mut prefix, &mut seen, &[0, 0, 0]));
        assert!(!first_message_complete(&mut prefix, &mut seen, &[0, 3, 1]));
        assert!(first_message_complete(&mut prefix, &mut seen, &[2, 3]));
        let (mut prefix, mut seen) = (Vec::new(), 0);
        assert!(first_message_complete(
            &mut prefix,
            &mut seen,
            &[0, 0, 0, 0, 0]
        ));
    }
}
