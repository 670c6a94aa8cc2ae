//! Admission of calls: the in-flight budget shared per caller, the health budget, and the
//! request-body deadline (see the module above for the rules).

use std::collections::HashMap;
use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::Duration;

use http_body::{Frame, SizeHint};
use pin_project_lite::pin_project;
use tokio::time::{Instant, Sleep};
use tonic::codegen::Bytes;
use tower::{Layer, Service};

use super::connections::ConnectionInfo;
use super::{TransportLimits, overloaded, request_body_timed_out};
use crate::api::auth::Authenticator;
use crate::domain::access::Caller;

/// Health calls of one peer admitted even when `max_health_streams` is reached, so that a
/// prober (liveness and readiness at once) is answered whoever else fills the budget. Peers
/// are at most the listener's connections, so this adds at most twice `max_connections`.
pub const HEALTH_PLACES_PER_PEER_ALWAYS_GIVEN: usize = 2;

/// The gRPC path prefix of the health service.
const HEALTH_PATH: &str = "/grpc.health.v1.Health/";
/// The gRPC path prefix of reflection, whose one RPC streams requests.
const REFLECTION_PATH: &str = "/grpc.reflection.";

/// Who a place in a budget is counted against.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Holder {
    /// The principal of a valid token, by its (unique) name.
    Principal(Arc<str>),
    /// The peer's address: no valid token, or authentication off.
    Peer(IpAddr),
    /// No address known (not a TCP connection).
    Unknown,
}

impl Holder {
    fn peer(address: Option<IpAddr>) -> Self {
        address.map_or(Self::Unknown, Self::Peer)
    }
}

/// Places shared by holders: at most `total` at once, at most `per_holder` of one holder;
/// but a holder's first `always` places are given even when `total` is reached.
#[derive(Debug)]
struct Budget {
    total: usize,
    per_holder: usize,
    always: usize,
    total_setting: &'static str,
    per_holder_setting: &'static str,
    held: Mutex<BudgetState>,
}

#[derive(Debug, Default)]
struct BudgetState {
    total: usize,
    by_holder: HashMap<Holder, usize>,
}

impl Budget {
    fn new(
        total: usize,
        per_holder: usize,
        always: usize,
        total_setting: &'static str,
        per_holder_setting: &'static str,
    ) -> Arc<Self> {
        let total = total.max(1);
        let per_holder = per_holder.clamp(1, total);
        Arc::new(Self {
            total,
            per_holder,
            always: always.min(per_holder),
            total_setting,
            per_holder_setting,
            held: Mutex::default(),
        })
    }

    fn lock(&self) -> MutexGuard<'_, BudgetState> {
        self.held
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// A place for `holder`, or the setting that is reached.
    fn try_acquire(self: &Arc<Self>, holder: Holder) -> Result<Place, &'static str> {
        let mut held = self.lock();
        let full = held.total >= self.total;
        let count = held.by_holder.entry(holder.clone()).or_default();
        if full && *count >= self.always {
            if *count == 0 {
                held.by_holder.remove(&holder);
            }
            return Err(self.total_setting);
        }
        if *count >= self.per_holder {
            return Err(self.per_holder_setting);
        }
        *count += 1;
        held.total += 1;
        Ok(Place {
            budget: self.clone(),
            holder,
        })
    }
}

/// One place in a [`Budget`], given back when dropped.
#[derive(Debug)]
struct Place {
    budget: Arc<Budget>,
    holder: Holder,
}

impl Drop for Place {
    fn drop(&mut self) {
        let mut held = self.budget.lock();
        held.total = held.total.saturating_sub(1);
        if let Some(count) = held.by_holder.get_mut(&self.holder) {
            *count -= 1;
            if *count == 0 {
                held.by_holder.remove(&self.holder);
            }
        }
    }
}

/// Admission of calls, inside the connection limits: the health budget, the in-flight
/// budget shared per caller, and the request-body timeout. A call that is admitted holds its
/// place until its answer has been sent in full (a health `Watch`: until it ends).
///
/// This is where a call waits or is refused; an admission queue (waiting for a place for a
/// bounded time instead of shedding at once) belongs in [`AdmissionLayer`]'s `call`, in
/// place of `Budget::try_acquire`.
#[derive(Debug, Clone)]
pub struct AdmissionLayer {
    calls: Arc<Budget>,
    health: Arc<Budget>,
    auth: Authenticator,
    retry_after: Duration,
    body_timeout: Duration,
}

impl AdmissionLayer {
    /// The admission of a listener with `limits`, its callers told apart by `auth` (each
    /// listener gets its own layer, and so its own budgets).
    pub fn new(limits: &TransportLimits, auth: Authenticator) -> Self {
        Self {
            calls: Budget::new(
                limits.max_in_flight_requests,
                limits.max_in_flight_requests_per_caller,
                0,
                "max_in_flight_requests",
                "max_in_flight_requests_per_caller",
            ),
            health: Budget::new(
                limits.max_health_streams,
                limits.max_health_streams_per_peer,
                HEALTH_PLACES_PER_PEER_ALWAYS_GIVEN,
                "max_health_streams",
                "max_health_streams_per_peer",
            ),
            auth,
            retry_after: limits.overload_retry_after,
            body_timeout: limits.request_body_timeout,
        }
    }
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

impl<S> Service<http::Request<tonic::body::Body>> for Admission<S>
where
    S: Service<http::Request<tonic::body::Body>, Response = http::Response<tonic::body::Body>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: http::Request<tonic::body::Body>) -> Self::Future {
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
        let place = if path.starts_with(HEALTH_PATH) {
            self.layer.health.try_acquire(Holder::peer(peer))
        } else {
            let holder = match self.layer.auth.authenticate_headers(request.headers()) {
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
            };
            self.layer.calls.try_acquire(holder)
        };
        let place = match place {
            Ok(place) => place,
            Err(limit) => {
                tracing::debug!(limit, "call shed");
                let response = overloaded(self.layer.retry_after, limit).into_http();
                return Box::pin(async move { Ok(response) });
            }
        };
        let deadline = Instant::now() + self.layer.body_timeout;
        let request =
            request.map(|body| tonic::body::Body::new(RequestDeadline::new(body, deadline, until)));
        let answer = self.inner.call(request);
        Box::pin(async move {
            let response = answer.await?;
            Ok(response.map(|body| {
                tonic::body::Body::new(Holding {
                    inner: body,
                    _held: (place, stream),
                })
            }))
        })
    }
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
    fn one_holder_gets_its_share_and_another_still_fits() {
        let budget = Budget::new(4, 2, 0, "total", "per_holder");
        let a = Holder::Principal(Arc::from("a"));
        let b = Holder::Peer(IpAddr::from([127, 0, 0, 1]));
        let first = budget.try_acquire(a.clone()).unwrap();
        let _second = budget.try_acquire(a.clone()).unwrap();
        assert_eq!(budget.try_acquire(a.clone()).unwrap_err(), "per_holder");
        let _b1 = budget.try_acquire(b.clone()).unwrap();
        let _b2 = budget.try_acquire(b.clone()).unwrap();
        assert_eq!(budget.try_acquire(b).unwrap_err(), "total");
        drop(first);
        let _again = budget.try_acquire(a).unwrap();
        // A share above the total is the total.
        assert_eq!(Budget::new(2, 10, 0, "t", "p").per_holder, 2);
    }

    #[test]
    fn a_holder_s_first_places_are_given_even_when_the_budget_is_full() {
        let budget = Budget::new(2, 2, 1, "total", "per_holder");
        let a = Holder::Peer(IpAddr::from([127, 0, 0, 2]));
        let b = Holder::Peer(IpAddr::from([127, 0, 0, 3]));
        let _a = (budget.try_acquire(a.clone()), budget.try_acquire(a));
        let b1 = budget.try_acquire(b.clone()).unwrap();
        assert_eq!(budget.try_acquire(b.clone()).unwrap_err(), "total");
        drop(b1);
        let c = Holder::Peer(IpAddr::from([127, 0, 0, 4]));
        let _c = budget.try_acquire(c).unwrap();
        assert_eq!(budget.lock().by_holder.len(), 2);
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
