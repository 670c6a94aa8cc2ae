//! `[limits]`: what one request may carry (bytes, JSON depth, page size) and what the gRPC
//! port admits (streams, calls in flight, connections, and their timeouts).

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::duration::{self, zero_is_none};
use super::{ConfigError, positive};
use crate::api::TransportLimits;
use crate::journal::RequestLimits;

/// Deepest `max_json_depth` accepted: the JSON parser recurses once per level.
pub const MAX_JSON_DEPTH: usize = 128;
/// Largest `max_page_size` accepted.
pub const MAX_PAGE_SIZE: u32 = 1000;
/// Room `max_message_bytes` must leave beyond the largest JSON field, in bytes.
pub const MESSAGE_HEADROOM_BYTES: usize = 16 * 1024;
/// Smallest `max_header_list_bytes` accepted.
pub const MIN_HEADER_LIST_BYTES: u32 = 4096;

/// `[limits]` settings.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default)]
pub struct LimitsSettings {
    /// Largest request message the server decodes, in bytes.
    pub max_message_bytes: usize,
    /// Largest `payload_json`, in bytes.
    pub max_payload_bytes: usize,
    /// Largest `result_json` (a holder's or a reviewer's), in bytes.
    pub max_result_bytes: usize,
    /// Deepest JSON nesting in payloads and results.
    pub max_json_depth: usize,
    /// Largest page of `ListOperations` and `ListOperationsForReview`.
    pub max_page_size: u32,
    /// Streams (calls) one HTTP/2 connection may have open at once.
    pub max_concurrent_streams: u32,
    /// Largest request header list, in bytes (HTTP/2 `SETTINGS_MAX_HEADER_LIST_SIZE`).
    pub max_header_list_bytes: u32,
    /// Calls served at once over all connections; one more waits in the admission queue
    /// (`max_queued_requests`).
    pub max_in_flight_requests: usize,
    /// Calls in flight one caller may hold (a token's principal; the peer's address without
    /// a valid token); at most `max_in_flight_requests`. One more waits in the queue.
    pub max_in_flight_requests_per_caller: usize,
    /// Calls waiting at once for a place in flight (places go to waiting callers in turn,
    /// each caller's oldest first), one caller at most its share (this ×
    /// `max_in_flight_requests_per_caller` / `max_in_flight_requests`); one more is answered `RESOURCE_EXHAUSTED` /
    /// `SERVER_OVERLOADED` with a `RetryInfo`. 0: none wait, a call past the in-flight
    /// budget is answered so at once. Each holds its request head (at most
    /// `max_header_list_bytes`) and at most 16 KiB of unread body (its HTTP/2 window).
    pub max_queued_requests: usize,
    /// Longest time a call waits in the queue (its `grpc-timeout`, less a tenth at most 1 s,
    /// when shorter); then it is answered `RESOURCE_EXHAUSTED` / `SERVER_OVERLOADED`.
    #[serde(with = "duration")]
    pub max_queue_wait: Duration,
    /// Health calls served at once per listener (a `Watch` holds its place while open).
    pub max_health_streams: usize,
    /// Health calls served at once from one peer address, per listener.
    pub max_health_streams_per_peer: usize,
    /// gRPC connections open at once per listener; past it a new connection pushes out the
    /// idlest one, or is closed at once.
    pub max_grpc_connections: usize,
    /// gRPC connections open at once from one peer address, per listener.
    pub max_grpc_connections_per_peer: usize,
    /// Time a new connection may take to send its first request (TLS handshake included).
    #[serde(with = "duration")]
    pub first_request_timeout: Duration,
    /// Time a connection may have no call open before it is closed; 0 never.
    #[serde(with = "duration")]
    pub max_connection_idle: Duration,
    /// Time a call's request message may take to arrive in full, from its admission (after
    /// any wait in the queue); past it the call ends with
    /// `DEADLINE_EXCEEDED`/`REQUEST_BODY_TIMEOUT`.
    #[serde(with = "duration")]
    pub request_body_timeout: Duration,
    /// Time between HTTP/2 PINGs on a connection; 0 sends none.
    #[serde(with = "duration")]
    pub http2_keepalive_interval: Duration,
    /// Time an unanswered PING waits before the connection is closed.
    #[serde(with = "duration")]
    pub http2_keepalive_timeout: Duration,
    /// Age after which a connection is asked to go away (GOAWAY); 0 never.
    #[serde(with = "duration")]
    pub max_connection_age: Duration,
    /// Time a connection past its age may still finish its calls before it is closed; 0
    /// waits for them however long they take.
    #[serde(with = "duration")]
    pub max_connection_age_grace: Duration,
}

impl Default for LimitsSettings {
    fn default() -> Self {
        let limits = RequestLimits::default();
        let transport = TransportLimits::default();
        let or_zero = |value: Option<Duration>| value.unwrap_or_default();
        Self {
            max_message_bytes: crate::api::DEFAULT_MAX_MESSAGE_BYTES,
            max_payload_bytes: limits.max_payload_bytes,
            max_result_bytes: limits.max_result_bytes,
            max_json_depth: limits.max_json_depth,
            max_page_size: limits.max_page_size,
            max_concurrent_streams: transport.max_concurrent_streams,
            max_header_list_bytes: transport.max_header_list_bytes,
            max_in_flight_requests: transport.max_in_flight_requests,
            max_in_flight_requests_per_caller: transport.max_in_flight_requests_per_caller,
            max_queued_requests: transport.max_queued_requests,
            max_queue_wait: transport.max_queue_wait,
            max_health_streams: transport.max_health_streams,
            max_health_streams_per_peer: transport.max_health_streams_per_peer,
            max_grpc_connections: transport.max_connections,
            max_grpc_connections_per_peer: transport.max_connections_per_peer,
            first_request_timeout: transport.first_request_timeout,
            max_connection_idle: or_zero(transport.max_connection_idle),
            request_body_timeout: transport.request_body_timeout,
            http2_keepalive_interval: or_zero(transport.http2_keepalive_interval),
            http2_keepalive_timeout: transport.http2_keepalive_timeout,
            max_connection_age: or_zero(transport.max_connection_age),
            max_connection_age_grace: or_zero(transport.max_connection_age_grace),
        }
    }
}

impl LimitsSettings {
    /// The request limits of the journal and the review path.
    pub fn request_limits(&self) -> RequestLimits {
        RequestLimits {
            max_payload_bytes: self.max_payload_bytes,
            max_result_bytes: self.max_result_bytes,
            max_json_depth: self.max_json_depth,
            max_page_size: self.max_page_size,
            ..RequestLimits::default()
        }
    }

    /// The limits of the gRPC port.
    pub fn transport_limits(&self) -> TransportLimits {
        TransportLimits {
            max_concurrent_streams: self.max_concurrent_streams,
            max_header_list_bytes: self.max_header_list_bytes,
            max_in_flight_requests: self.max_in_flight_requests,
            max_in_flight_requests_per_caller: self.max_in_flight_requests_per_caller,
            max_queued_requests: self.max_queued_requests,
            max_queue_wait: self.max_queue_wait,
            max_health_streams: self.max_health_streams,
            max_health_streams_per_peer: self.max_health_streams_per_peer,
            max_connections: self.max_grpc_connections,
            max_connections_per_peer: self.max_grpc_connections_per_peer,
            first_request_timeout: self.first_request_timeout,
            max_connection_idle: zero_is_none(self.max_connection_idle),
            request_body_timeout: self.request_body_timeout,
            http2_keepalive_interval: zero_is_none(self.http2_keepalive_interval),
            http2_keepalive_timeout: self.http2_keepalive_timeout,
            max_connection_age: zero_is_none(self.max_connection_age),
            max_connection_age_grace: zero_is_none(self.max_connection_age_grace),
            ..TransportLimits::default()
        }
    }

    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        self.validate_request()?;
        self.validate_transport()
    }

    fn validate_request(&self) -> Result<(), ConfigError> {
        if self.max_payload_bytes == 0 || self.max_result_bytes == 0 {
            return Err(ConfigError(
                "limits.max_payload_bytes, limits.max_result_bytes: must be at least 1".into(),
            ));
        }
        if !(1..=MAX_JSON_DEPTH).contains(&self.max_json_depth) {
            return Err(ConfigError(format!(
                "limits.max_json_depth: must be 1 to {MAX_JSON_DEPTH}"
            )));
        }
        if !(1..=MAX_PAGE_SIZE).contains(&self.max_page_size) {
            return Err(ConfigError(format!(
                "limits.max_page_size: must be 1 to {MAX_PAGE_SIZE}"
            )));
        }
        let needed = self.max_payload_bytes.max(self.max_result_bytes) + MESSAGE_HEADROOM_BYTES;
        if self.max_message_bytes < needed {
            return Err(ConfigError(format!(
                "limits.max_message_bytes: must be at least {needed} (the larger of \
                 max_payload_bytes and max_result_bytes plus {MESSAGE_HEADROOM_BYTES} for the \
                 other fields)"
            )));
        }
        Ok(())
    }

    fn validate_transport(&self) -> Result<(), ConfigError> {
        for (name, value) in [
            (
                "max_concurrent_streams",
                self.max_concurrent_streams as usize,
            ),
            ("max_in_flight_requests", self.max_in_flight_requests),
            (
                "max_in_flight_requests_per_caller",
                self.max_in_flight_requests_per_caller,
            ),
            ("max_health_streams", self.max_health_streams),
            (
                "max_health_streams_per_peer",
                self.max_health_streams_per_peer,
            ),
            ("max_grpc_connections", self.max_grpc_connections),
            (
                "max_grpc_connections_per_peer",
                self.max_grpc_connections_per_peer,
            ),
        ] {
            if value == 0 {
                return Err(ConfigError(format!("limits.{name}: must be at least 1")));
            }
        }
        if self.max_header_list_bytes < MIN_HEADER_LIST_BYTES {
            return Err(ConfigError(format!(
                "limits.max_header_list_bytes: must be at least {MIN_HEADER_LIST_BYTES} (gRPC's \
                 own headers, a bearer token and a traceparent must fit)"
            )));
        }
        positive(
            "limits.http2_keepalive_timeout",
            self.http2_keepalive_timeout,
        )?;
        positive("limits.first_request_timeout", self.first_request_timeout)?;
        positive("limits.request_body_timeout", self.request_body_timeout)?;
        positive("limits.max_queue_wait", self.max_queue_wait)
    }
}
