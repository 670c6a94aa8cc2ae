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
//!   address when the call carries no valid token). Past either, the call waits in a
//!   bounded, fair **admission queue** (at most `max_queued_requests` calls; places freed
//!   are handed to waiting callers in turn, each caller's oldest first, never past a
//!   caller's share; one caller queues at most its share of the queue, in the same
//!   proportion) for at most `max_queue_wait` and at most until shortly before its own
//!   `grpc-timeout` deadline. It is answered `RESOURCE_EXHAUSTED`, `ErrorInfo` reason
//!   `SERVER_OVERLOADED` (metadata `limit`: `max_queued_requests` when the queue is full,
//!   `max_queue_wait` or `grpc-timeout` when its wait ended) and a `RetryInfo` (load
//!   shedding) only then; nothing was done. With `max_queued_requests` 0 it is answered so
//!   at once (metadata `limit`: the in-flight setting). A queued call holds its request head
//!   (at most `max_header_list_bytes`) and what h2 has received of its body into the
//!   stream's flow-control window ([`STREAM_WINDOW_BYTES`], 16 KiB): at most
//!   `max_queued_requests` × 16 KiB of unread bodies (32 MiB with the defaults); its head is
//!   an open stream's, counted with the connection's streams.
//! - **health calls** have a budget of their own, `max_health_streams` (a `Watch` holds its
//!   place until the client ends it), at most `max_health_streams_per_peer` of one address:
//!   a flood of journal calls never sheds a probe, and a flood of health watches cannot
//!   grow the server. A peer's first two health calls are admitted even when the budget is
//!   full ([`HEALTH_PLACES_PER_PEER_ALWAYS_GIVEN`]), so a prober on its own address is always
//!   answered. Health calls are never queued: past their budget they are refused at once.
//! - **request body**: a call whose request message has not arrived in full within
//!   `request_body_timeout` of its admission ends with `DEADLINE_EXCEEDED`, `ErrorInfo` reason
//!   `REQUEST_BODY_TIMEOUT`, and gives its place back.

mod admission;
mod connections;
mod queue;

use std::collections::HashMap;
use std::time::Duration;

use tonic::Code;
use tonic_types::{ErrorDetails, StatusExt as _};

use crate::api::status::ERROR_DOMAIN;
use crate::domain::error::ErrorReason;

pub use admission::{Admission, AdmissionLayer, HEALTH_PLACES_PER_PEER_ALWAYS_GIVEN};
pub use connections::{ConnectionInfo, LimitedIncoming, LimitedIo, incoming};

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
    /// it, a call waits in the admission queue (`max_queued_requests`).
    pub max_in_flight_requests: usize,
    /// Of those, the most one caller may hold (a token's principal, or a peer address when
    /// the call carries no valid token); at most `max_in_flight_requests`.
    pub max_in_flight_requests_per_caller: usize,
    /// Calls waiting at once for a place in flight, over all callers (0: none wait, a call
    /// past the in-flight budget is refused at once); one caller at most its share,
    /// `max_queued_requests` × `max_in_flight_requests_per_caller` /
    /// `max_in_flight_requests`. Past either, `RESOURCE_EXHAUSTED`,
    /// `ErrorInfo` reason `SERVER_OVERLOADED`, metadata `limit` `max_queued_requests`. Each
    /// holds its request head (at most `max_header_list_bytes`) and at most its stream's
    /// HTTP/2 flow-control window ([`STREAM_WINDOW_BYTES`], 16 KiB) of unread body.
    pub max_queued_requests: usize,
    /// Longest time a call waits in the queue (a shorter `grpc-timeout`, less a margin for
    /// being served, bounds it too); past it, `RESOURCE_EXHAUSTED` / `SERVER_OVERLOADED`,
    /// metadata `limit` `max_queue_wait` (or `grpc-timeout`).
    pub max_queue_wait: Duration,
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
    /// How long a call's request message may take to arrive in full, from its admission
    /// (its headers; for a call that waited in the queue, the moment it got its place).
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
/// Default calls waiting for a place: a burst of a thousand short calls from one caller
/// (its share: 1,024) waits instead of being refused; their bodies cost at most
/// 2,048 × [`STREAM_WINDOW_BYTES`] = 32 MiB.
pub const DEFAULT_MAX_QUEUED_REQUESTS: usize = 2048;
/// The HTTP/2 flow-control window of each request stream, in bytes: what a client may send
/// of a body before the server reads it, so what a queued call holds of its body. A message
/// of up to `max_message_bytes` still arrives whole: the server opens the window again as
/// it reads.
pub const STREAM_WINDOW_BYTES: u32 = 16 * 1024;
/// Default longest wait in the queue.
pub const DEFAULT_MAX_QUEUE_WAIT: Duration = Duration::from_secs(10);
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
            max_queued_requests: DEFAULT_MAX_QUEUED_REQUESTS,
            max_queue_wait: DEFAULT_MAX_QUEUE_WAIT,
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
            .initial_stream_window_size(Some(STREAM_WINDOW_BYTES))
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
/// (metadata `limit`: the setting that was reached, e.g. `max_queued_requests`) and a
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
}
