//! Bounded resources on every gRPC listener (the journal's port, its health-only port and the
//! reconcile worker's health port): what one peer, one connection, one caller and the whole
//! server may hold at once, so that no caller can grow the server's memory without bound or
//! lock other callers out. Every bound is enforced before authentication, at the earliest
//! place that can.
//!
//! Connections ([`incoming`], [`LimitedIo`]):
//!
//! - **connections** and **connections per peer** (IP address): the accept loop never stops
//!   accepting. A connection past `max_connections_per_peer` of its address, or past
//!   `max_connections` in all, first pushes out the oldest connection of that peer (or of
//!   anyone) that has no call open — one that never sent a request, or idle since its last —
//!   and is closed at once when there is none (accept-then-close). Silent sockets cannot
//!   hold every slot, and a health probe always gets in.
//! - **first request**: a connection that has not sent a complete request's headers within
//!   `first_request_timeout` of being accepted (TLS handshake and HTTP/2 preface included)
//!   is closed.
//! - **idle**: a connection with no call open for `max_connection_idle` is closed (gRPC's
//!   max-connection-idle).
//! - **age**: at `max_connection_age` the server sends GOAWAY (tonic), clients reconnect (and
//!   may land on another replica), and calls in flight finish; a connection still open
//!   `max_connection_age_grace` later is closed.
//!
//! Streams and calls:
//!
//! - **streams per connection** (HTTP/2 `SETTINGS_MAX_CONCURRENT_STREAMS`, by h2): a client
//!   that opens more is refused per stream with `REFUSED_STREAM`, which gRPC clients see as
//!   `UNAVAILABLE` and may repeat: the server did not look at the request.
//! - **header list size** (HTTP/2 `SETTINGS_MAX_HEADER_LIST_SIZE`, by h2): see
//!   docs/errors.md for what a client sees.
//! - **calls in flight** ([`AdmissionLayer`]): at most `max_in_flight_requests` journal,
//!   reconciler and reflection calls over all connections, and at most
//!   `max_in_flight_requests_per_caller` of one caller (the token's principal; the peer's
//!   address when the call carries no valid token). Past either, the call is answered at
//!   once with `RESOURCE_EXHAUSTED`, `ErrorInfo` reason `SERVER_OVERLOADED` (metadata
//!   `limit`: the setting) and a `RetryInfo` (load shedding), instead of queueing.
//! - **health calls** have a budget of their own, `max_health_streams` (a `Watch` holds its
//!   place until the client ends it), at most `max_health_streams_per_peer` of one address:
//!   a flood of journal calls never sheds a probe, and a flood of health watches cannot
//!   grow the server. A peer's first two health calls are admitted even when the budget is
//!   full ([`HEALTH_PLACES_PER_PEER_ALWAYS_GIVEN`]), so a prober on its own address is always
//!   answered.
//! - **request body**: a call whose request message has not arrived in full within
//!   `request_body_timeout` ends with `DEADLINE_EXCEEDED`, `ErrorInfo` reason
//!   `REQUEST_BODY_TIMEOUT`, and gives its place back.

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::Duration;

use futures::Stream;
use futures::task::AtomicWaker;
use http_body::{Frame, SizeHint};
use pin_project_lite::pin_project;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::{Instant, Sleep};
use tonic::Code;
use tonic::codegen::Bytes;
use tonic::transport::server::{Connected, TlsConnectInfo};
use tonic_types::{ErrorDetails, StatusExt as _};
use tower::{Layer, Service};

use crate::api::auth::Authenticator;
use crate::api::status::ERROR_DOMAIN;
use crate::domain::access::Caller;
use crate::domain::error::ErrorReason;

/// The limits of a gRPC listener; every field has a safe default (see docs/configuration.md,
/// "Connection and load limits", for why each value).
#[derive(Debug, Clone, PartialEq)]
pub struct TransportLimits {
    /// Streams (calls) one HTTP/2 connection may have open at once.
    pub max_concurrent_streams: u32,
    /// Largest request header list, in bytes, as HTTP/2 counts it (each field's name and
    /// value plus 32).
    pub max_header_list_bytes: u32,
    /// Journal, reconciler and reflection calls served at once over all connections; past
    /// it, `RESOURCE_EXHAUSTED`.
    pub max_in_flight_requests: usize,
    /// Of those, the most one caller may hold (a token's principal, or a peer address when
    /// the call carries no valid token); at most `max_in_flight_requests`.
    pub max_in_flight_requests_per_caller: usize,
    /// Health calls (`Check`, and `Watch` for as long as it is open) served at once.
    pub max_health_streams: usize,
    /// Of those, the most from one peer address.
    pub max_health_streams_per_peer: usize,
    /// Connections open at once.
    pub max_connections: usize,
    /// Connections open at once from one peer address.
    pub max_connections_per_peer: usize,
    /// How long a new connection may take to send its first request's headers (TLS
    /// handshake and HTTP/2 preface included) before it is closed.
    pub first_request_timeout: Duration,
    /// How long a connection may have no call open before it is closed; `None` never.
    pub max_connection_idle: Option<Duration>,
    /// How long a call's request message may take to arrive in full, from its headers.
    pub request_body_timeout: Duration,
    /// What `RetryInfo` suggests to a shed call.
    pub overload_retry_after: Duration,
    /// Interval of HTTP/2 PING frames on an idle connection; `None` sends none.
    pub http2_keepalive_interval: Option<Duration>,
    /// How long an unanswered PING waits before the connection is closed.
    pub http2_keepalive_timeout: Duration,
    /// Age at which a connection is asked to go away (GOAWAY); `None` never.
    pub max_connection_age: Option<Duration>,
    /// How long after `max_connection_age` a connection may still finish its calls before it
    /// is closed; `None` waits for them however long they take.
    pub max_connection_age_grace: Option<Duration>,
}

/// Default streams per connection: gRPC's own servers (Go, Java) use 100.
pub const DEFAULT_MAX_CONCURRENT_STREAMS: u32 = 100;
/// Default header list limit: 16 KiB, what hyper and gRPC C-core accept by default.
pub const DEFAULT_MAX_HEADER_LIST_BYTES: u32 = 16 * 1024;
/// Default calls in flight over all connections.
pub const DEFAULT_MAX_IN_FLIGHT_REQUESTS: usize = 128;
/// Default calls in flight of one caller: half of all, so two callers always fit.
pub const DEFAULT_MAX_IN_FLIGHT_REQUESTS_PER_CALLER: usize = 64;
/// Default health calls at once.
pub const DEFAULT_MAX_HEALTH_STREAMS: usize = 128;
/// Default health calls at once from one address.
pub const DEFAULT_MAX_HEALTH_STREAMS_PER_PEER: usize = 16;
/// Default connections open at once.
pub const DEFAULT_MAX_CONNECTIONS: usize = 1024;
/// Most connections of a health-only listener.
pub const HEALTH_LISTENER_MAX_CONNECTIONS: usize = 128;
/// Most streams per connection of a health-only listener.
pub const HEALTH_LISTENER_MAX_STREAMS: u32 = 16;
/// Default connections open at once from one address.
pub const DEFAULT_MAX_CONNECTIONS_PER_PEER: usize = 256;

impl Default for TransportLimits {
    fn default() -> Self {
        Self {
            max_concurrent_streams: DEFAULT_MAX_CONCURRENT_STREAMS,
            max_header_list_bytes: DEFAULT_MAX_HEADER_LIST_BYTES,
            max_in_flight_requests: DEFAULT_MAX_IN_FLIGHT_REQUESTS,
            max_in_flight_requests_per_caller: DEFAULT_MAX_IN_FLIGHT_REQUESTS_PER_CALLER,
            max_health_streams: DEFAULT_MAX_HEALTH_STREAMS,
            max_health_streams_per_peer: DEFAULT_MAX_HEALTH_STREAMS_PER_PEER,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            max_connections_per_peer: DEFAULT_MAX_CONNECTIONS_PER_PEER,
            first_request_timeout: Duration::from_secs(10),
            max_connection_idle: Some(Duration::from_secs(300)),
            request_body_timeout: Duration::from_secs(10),
            overload_retry_after: Duration::from_secs(1),
            http2_keepalive_interval: Some(Duration::from_secs(60)),
            http2_keepalive_timeout: Duration::from_secs(20),
            max_connection_age: Some(Duration::from_secs(1800)),
            max_connection_age_grace: Some(Duration::from_secs(60)),
        }
    }
}

impl TransportLimits {
    /// `builder` with the HTTP/2 limits, keepalive and connection age applied.
    pub fn apply(&self, builder: tonic::transport::Server) -> tonic::transport::Server {
        let builder = builder
            .max_concurrent_streams(self.max_concurrent_streams)
            .http2_max_header_list_size(self.max_header_list_bytes)
            .http2_keepalive_interval(self.http2_keepalive_interval)
            .http2_keepalive_timeout(Some(self.http2_keepalive_timeout));
        // tonic's own grace (0.14) closes the connection at age + grace without sending
        // GOAWAY at age first, so the grace is enforced here instead, by `LimitedIo`.
        match self.max_connection_age {
            Some(age) => builder.max_connection_age(age),
            None => builder,
        }
    }

    /// The limits of a listener that serves health alone (`health_listen`, the reconcile
    /// worker's health port): the same, with at most [`HEALTH_LISTENER_MAX_CONNECTIONS`]
    /// connections, a quarter of them per peer, and [`HEALTH_LISTENER_MAX_STREAMS`] streams
    /// per connection. Probes open one connection and one call at a time, and a silent
    /// connection is pushed out by the next one, so a few connections serve every prober
    /// and keep the port's memory to a few MiB.
    pub fn health_only(&self) -> Self {
        let max_connections = self.max_connections.min(HEALTH_LISTENER_MAX_CONNECTIONS);
        Self {
            max_connections,
            max_connections_per_peer: self
                .max_connections_per_peer
                .min((max_connections / 4).max(1)),
            max_concurrent_streams: self.max_concurrent_streams.min(HEALTH_LISTENER_MAX_STREAMS),
            ..self.clone()
        }
    }

    /// When a connection accepted now is closed whatever it is doing: age plus grace.
    fn close_after(&self) -> Option<Duration> {
        Some(self.max_connection_age? + self.max_connection_age_grace?)
    }
}

/// The `RESOURCE_EXHAUSTED` answer of a shed call: `ErrorInfo` reason `SERVER_OVERLOADED`
/// (metadata `limit`: the setting that was reached, e.g. `max_in_flight_requests`) and a
/// `RetryInfo` of `retry_after`.
pub fn overloaded(retry_after: Duration, limit: &str) -> tonic::Status {
    let mut details = ErrorDetails::with_error_info(
        ErrorReason::ServerOverloaded.as_str(),
        ERROR_DOMAIN,
        HashMap::from([("limit".to_owned(), limit.to_owned())]),
    );
    details.set_retry_info(Some(retry_after));
    tonic::Status::with_error_details(
        Code::ResourceExhausted,
        "the server is serving as many calls as it allows; nothing was done, retry later",
        details,
    )
}

/// The `DEADLINE_EXCEEDED` answer of a call whose request message did not arrive in full
/// within `request_body_timeout`: `ErrorInfo` reason `REQUEST_BODY_TIMEOUT` (metadata
/// `limit`: `request_body_timeout_seconds`). The call was not served; nothing was done.
/// (Not `CANCELLED`: tonic reads a request body that fails with `CANCELLED` as its end.)
pub fn request_body_timed_out() -> tonic::Status {
    tonic::Status::with_error_details(
        Code::DeadlineExceeded,
        "the request did not arrive in full in time; nothing was done",
        ErrorDetails::with_error_info(
            ErrorReason::RequestBodyTimeout.as_str(),
            ERROR_DOMAIN,
            HashMap::from([(
                "limit".to_owned(),
                "request_body_timeout_seconds".to_owned(),
            )]),
        ),
    )
}

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
        let stream = connection.map(|info| info.state.open_stream());
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

/// What the accept loop and the calls of one connection share.
#[derive(Debug)]
struct ConnectionState {
    accepted: Instant,
    /// Whether a request's headers have arrived.
    requested: AtomicBool,
    /// Calls open now.
    open_streams: AtomicUsize,
    /// When the last call ended, in milliseconds since `accepted`.
    idle_since_ms: AtomicU64,
    /// Pushed out by a newer connection: close now.
    evicted: AtomicBool,
    /// The connection's task, woken when it must look at its deadlines again.
    waker: AtomicWaker,
}

impl ConnectionState {
    /// A call opened on the connection; it counts as open until the guard is dropped.
    fn open_stream(self: &Arc<Self>) -> OpenStream {
        self.requested.store(true, Ordering::Release);
        self.open_streams.fetch_add(1, Ordering::AcqRel);
        OpenStream(self.clone())
    }

    /// Since when (absolute) the connection has had nothing open, or `None` when a call
    /// is open.
    fn idle_since(&self) -> Option<Instant> {
        if !self.requested.load(Ordering::Acquire) {
            return Some(self.accepted);
        }
        if self.open_streams.load(Ordering::Acquire) > 0 {
            return None;
        }
        Some(self.accepted + Duration::from_millis(self.idle_since_ms.load(Ordering::Acquire)))
    }
}

/// One open call of a connection.
#[derive(Debug)]
struct OpenStream(Arc<ConnectionState>);

impl Drop for OpenStream {
    fn drop(&mut self) {
        let state = &self.0;
        // Before the count falls, so that a connection seen idle has its idle start.
        let since = u64::try_from(state.accepted.elapsed().as_millis()).unwrap_or(u64::MAX);
        state.idle_since_ms.store(since, Ordering::Release);
        if state.open_streams.fetch_sub(1, Ordering::AcqRel) == 1 {
            state.waker.wake();
        }
    }
}

/// The connection information tonic puts in each request's extensions: the peer's
/// addresses and the connection's shared state.
#[derive(Debug, Clone)]
pub struct ConnectionInfo {
    /// The peer's address.
    pub remote: Option<SocketAddr>,
    /// The server's address of the connection.
    pub local: Option<SocketAddr>,
    state: Arc<ConnectionState>,
}

impl ConnectionInfo {
    /// The connection of a request, over TLS or not.
    fn of(extensions: &http::Extensions) -> Option<&Self> {
        extensions.get::<Self>().or_else(|| {
            extensions
                .get::<TlsConnectInfo<Self>>()
                .map(TlsConnectInfo::get_ref)
        })
    }
}

/// The open connections of one listener, and how many per peer address.
#[derive(Debug, Default)]
struct Connections {
    next_id: u64,
    open: HashMap<u64, (IpAddr, Arc<ConnectionState>)>,
    by_peer: HashMap<IpAddr, usize>,
}

impl Connections {
    /// Pushes out the connection that has been idle longest (or never sent a request), of
    /// `peer` only when given; false when every such connection has a call open.
    fn evict_idlest(&mut self, peer: Option<IpAddr>) -> bool {
        let idlest = self
            .open
            .iter()
            .filter(|(_, (ip, _))| peer.is_none_or(|peer| *ip == peer))
            .filter_map(|(id, (_, state))| Some((state.idle_since()?, *id)))
            .min();
        let Some((_, id)) = idlest else {
            return false;
        };
        if let Some((_, state)) = self.open.remove(&id) {
            state.evicted.store(true, Ordering::Release);
            state.waker.wake();
        }
        true
    }
}

/// One connection's place among its listener's connections, given back when dropped.
#[derive(Debug)]
struct ConnectionSlot {
    connections: Arc<Mutex<Connections>>,
    id: u64,
    peer: IpAddr,
}

fn lock(connections: &Mutex<Connections>) -> MutexGuard<'_, Connections> {
    connections
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Drop for ConnectionSlot {
    fn drop(&mut self) {
        let mut connections = lock(&self.connections);
        connections.open.remove(&self.id);
        if let Some(count) = connections.by_peer.get_mut(&self.peer) {
            *count -= 1;
            if *count == 0 {
                connections.by_peer.remove(&self.peer);
            }
        }
    }
}

/// Admits a connection from `peer`: within the per-peer and total limits, pushing out an
/// idle connection when either is reached; `None` when it must be closed.
fn admit(
    connections: &Arc<Mutex<Connections>>,
    peer: IpAddr,
    limits: &TransportLimits,
) -> Option<(ConnectionSlot, Arc<ConnectionState>)> {
    let mut open = lock(connections);
    let from_peer = open.by_peer.get(&peer).copied().unwrap_or(0);
    if from_peer >= limits.max_connections_per_peer.max(1) && !open.evict_idlest(Some(peer)) {
        return None;
    }
    if open.open.len() >= limits.max_connections.max(1) && !open.evict_idlest(None) {
        return None;
    }
    let state = Arc::new(ConnectionState {
        accepted: Instant::now(),
        requested: AtomicBool::new(false),
        open_streams: AtomicUsize::new(0),
        idle_since_ms: AtomicU64::new(0),
        evicted: AtomicBool::new(false),
        waker: AtomicWaker::new(),
    });
    open.next_id += 1;
    let id = open.next_id;
    open.open.insert(id, (peer, state.clone()));
    *open.by_peer.entry(peer).or_default() += 1;
    Some((
        ConnectionSlot {
            connections: connections.clone(),
            id,
            peer,
        },
        state,
    ))
}

/// Accepted connections within `limits` (see the module's documentation), each with
/// `TCP_NODELAY` (an answer goes out in several small writes, which Nagle's algorithm would
/// hold back for the client's delayed acknowledgement, some 40 ms on Linux). The listener
/// never stops accepting: a connection over a limit that cannot push out an idle one is
/// closed as soon as it is accepted.
pub fn incoming(
    listener: TcpListener,
    limits: &TransportLimits,
) -> impl Stream<Item = io::Result<LimitedIo>> + Send + 'static {
    let connections = Arc::new(Mutex::new(Connections::default()));
    let limits = limits.clone();
    futures::stream::unfold(listener, move |listener| {
        let connections = connections.clone();
        let limits = limits.clone();
        async move {
            loop {
                let (stream, peer) = match listener.accept().await {
                    Ok(accepted) => accepted,
                    Err(error) => {
                        if !is_connection_error(&error) {
                            // Out of file descriptors and the like: let some connections
                            // close first.
                            tokio::time::sleep(Duration::from_millis(50)).await;
                        }
                        return Some((Err(error), listener));
                    }
                };
                let Some((slot, state)) = admit(&connections, peer.ip(), &limits) else {
                    tracing::debug!("connection closed at once: the connection limit is reached");
                    drop(stream);
                    continue;
                };
                if let Err(error) = stream.set_nodelay(true) {
                    return Some((Err(error), listener));
                }
                let io = LimitedIo {
                    stream,
                    close_at: limits.close_after().map(tokio::time::sleep).map(Box::pin),
                    timer: None,
                    first_request_timeout: limits.first_request_timeout,
                    max_idle: limits.max_connection_idle,
                    state,
                    _slot: slot,
                };
                return Some((Ok(io), listener));
            }
        }
    })
}

/// An error of one connection (the next accept may well succeed), as hyper and tonic tell.
fn is_connection_error(error: &io::Error) -> bool {
    matches!(
        error.kind(),
        io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
    )
}

pin_project! {
    /// One accepted connection: holds its place among the listener's connections, and fails
    /// its reads and writes (which ends it) once it is pushed out, once it sent no request
    /// within the first-request timeout, once it has had no call open for the idle timeout,
    /// or once its age plus grace has passed.
    pub struct LimitedIo {
        #[pin]
        stream: TcpStream,
        close_at: Option<Pin<Box<Sleep>>>,
        timer: Option<Pin<Box<Sleep>>>,
        first_request_timeout: Duration,
        max_idle: Option<Duration>,
        state: Arc<ConnectionState>,
        _slot: ConnectionSlot,
    }
}

fn closed(why: &'static str) -> io::Error {
    io::Error::new(io::ErrorKind::TimedOut, why)
}

impl LimitedIo {
    /// An error once the connection must be closed; otherwise its next deadline armed.
    fn check(
        state: &ConnectionState,
        close_at: &mut Option<Pin<Box<Sleep>>>,
        timer: &mut Option<Pin<Box<Sleep>>>,
        first_request_timeout: Duration,
        max_idle: Option<Duration>,
        cx: &mut Context<'_>,
    ) -> io::Result<()> {
        state.waker.register(cx.waker());
        if state.evicted.load(Ordering::Acquire) {
            return Err(closed(
                "pushed out by a newer connection: the server was full",
            ));
        }
        if let Some(sleep) = close_at
            && sleep.as_mut().poll(cx).is_ready()
        {
            return Err(closed("max_connection_age_grace passed"));
        }
        loop {
            let deadline = if !state.requested.load(Ordering::Acquire) {
                Some((state.accepted + first_request_timeout, "no request in time"))
            } else {
                match (state.idle_since(), max_idle) {
                    (Some(since), Some(idle)) => Some((since + idle, "idle for too long")),
                    _ => None,
                }
            };
            let Some((deadline, why)) = deadline else {
                return Ok(());
            };
            if deadline <= Instant::now() {
                return Err(closed(why));
            }
            let sleep = timer.get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
            if sleep.deadline() != deadline {
                sleep.as_mut().reset(deadline);
            }
            if sleep.as_mut().poll(cx).is_pending() {
                return Ok(());
            }
        }
    }
}

impl AsyncRead for LimitedIo {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.project();
        if let Err(error) = Self::check(
            this.state,
            this.close_at,
            this.timer,
            *this.first_request_timeout,
            *this.max_idle,
            cx,
        ) {
            return Poll::Ready(Err(error));
        }
        this.stream.poll_read(cx, buf)
    }
}

impl AsyncWrite for LimitedIo {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.project();
        if let Err(error) = Self::check(
            this.state,
            this.close_at,
            this.timer,
            *this.first_request_timeout,
            *this.max_idle,
            cx,
        ) {
            return Poll::Ready(Err(error));
        }
        this.stream.poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.project().stream.poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.project().stream.poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.project();
        if let Err(error) = Self::check(
            this.state,
            this.close_at,
            this.timer,
            *this.first_request_timeout,
            *this.max_idle,
            cx,
        ) {
            return Poll::Ready(Err(error));
        }
        this.stream.poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}

impl Connected for LimitedIo {
    type ConnectInfo = ConnectionInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        ConnectionInfo {
            remote: self.stream.peer_addr().ok(),
            local: self.stream.local_addr().ok(),
            state: self.state.clone(),
        }
    }
}

/// Accepted connections as [`incoming`] makes them.
pub type LimitedIncoming = Pin<Box<dyn Stream<Item = io::Result<LimitedIo>> + Send>>;

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn a_shed_call_carries_error_info_and_retry_info() {
        let status = overloaded(Duration::from_millis(1500), "max_in_flight_requests");
        assert_eq!(status.code(), Code::ResourceExhausted);
        let details = status.get_error_details();
        let info = details.error_info().unwrap();
        assert_eq!(info.reason, "SERVER_OVERLOADED");
        assert_eq!(info.domain, ERROR_DOMAIN);
        assert_eq!(info.metadata["limit"], "max_in_flight_requests");
        assert_eq!(
            details.retry_info().unwrap().retry_delay,
            Some(Duration::from_millis(1500))
        );
    }

    #[test]
    fn connections_close_at_age_plus_grace_only_when_both_are_set() {
        let limits = TransportLimits::default();
        assert_eq!(limits.close_after(), Some(Duration::from_secs(1860)));
        let no_grace = TransportLimits {
            max_connection_age_grace: None,
            ..TransportLimits::default()
        };
        assert_eq!(no_grace.close_after(), None);
    }

    #[test]
    fn a_health_only_listener_keeps_few_connections_and_streams() {
        let health = TransportLimits::default().health_only();
        assert_eq!(health.max_connections, HEALTH_LISTENER_MAX_CONNECTIONS);
        assert_eq!(health.max_connections_per_peer, 32);
        assert_eq!(health.max_concurrent_streams, HEALTH_LISTENER_MAX_STREAMS);
        assert_eq!(
            health.first_request_timeout,
            TransportLimits::default().first_request_timeout
        );
        let small = TransportLimits {
            max_connections: 2,
            ..TransportLimits::default()
        }
        .health_only();
        assert_eq!(
            (small.max_connections, small.max_connections_per_peer),
            (2, 1)
        );
    }

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

    fn state(accepted: Instant) -> Arc<ConnectionState> {
        Arc::new(ConnectionState {
            accepted,
            requested: AtomicBool::new(false),
            open_streams: AtomicUsize::new(0),
            idle_since_ms: AtomicU64::new(0),
            evicted: AtomicBool::new(false),
            waker: AtomicWaker::new(),
        })
    }

    #[tokio::test]
    async fn a_full_listener_pushes_out_the_idlest_connection_and_never_a_busy_one() {
        let peer = IpAddr::from([127, 0, 0, 2]);
        let mut connections = Connections::default();
        let now = Instant::now();
        let busy = state(now - Duration::from_secs(30));
        let _open = busy.open_stream();
        let silent = state(now - Duration::from_secs(5));
        let fresh = state(now);
        for (id, state) in [(1, busy.clone()), (2, silent.clone()), (3, fresh.clone())] {
            connections.open.insert(id, (peer, state));
        }
        assert!(connections.evict_idlest(None));
        assert!(silent.evicted.load(Ordering::Acquire));
        assert!(!busy.evicted.load(Ordering::Acquire));
        assert!(connections.evict_idlest(Some(peer)));
        assert!(fresh.evicted.load(Ordering::Acquire));
        // Only the busy one is left.
        assert!(!connections.evict_idlest(None));
        assert!(!connections.evict_idlest(Some(IpAddr::from([10, 0, 0, 1]))));
    }
}
