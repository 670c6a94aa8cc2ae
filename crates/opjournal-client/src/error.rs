//! Typed errors: the `google.rpc.ErrorInfo` reason of every journal status, decoded.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use tonic::{Code, Status};
use tonic_types::StatusExt as _;

/// A failed call, decoded from the status's `google.rpc.ErrorInfo` and `BadRequest`.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{code:?} {reason}: {message}")]
pub struct ClientError {
    /// The gRPC code; `UNAVAILABLE` for a call the server refused unprocessed with an
    /// HTTP/2 GOAWAY while shutting down (which tonic itself reports as `INTERNAL`).
    pub code: Code,
    /// The `ErrorInfo.reason`, typed.
    pub reason: ErrorReason,
    /// The server's message (never carries payloads or keys), followed for a failure on
    /// this side (a refused TLS handshake, a reset connection) by its causes.
    pub message: String,
    /// `BadRequest` field violations as (field, description).
    pub field_violations: Vec<(String, String)>,
    /// `RetryInfo.retry_delay`, when the server suggests one.
    pub retry_after: Option<Duration>,
    /// `ErrorInfo.metadata` (e.g. `json_pointer`, `current_status`).
    pub metadata: BTreeMap<String, String>,
}

impl ClientError {
    fn local(code: Code, reason: ErrorReason, message: String) -> Self {
        Self {
            code,
            reason,
            message,
            field_violations: Vec::new(),
            retry_after: None,
            metadata: BTreeMap::new(),
        }
    }

    pub(crate) fn transport(code: Code, err: impl fmt::Display) -> Self {
        Self::local(code, ErrorReason::Transport, err.to_string())
    }

    /// The call got no answer within the client's deadline.
    pub(crate) fn deadline(timeout: Duration) -> Self {
        Self::local(
            Code::DeadlineExceeded,
            ErrorReason::Transport,
            format!("no answer within the call deadline of {timeout:?}"),
        )
    }

    pub(crate) fn malformed(message: &str) -> Self {
        Self::local(
            Code::Internal,
            ErrorReason::Other("MALFORMED_RESPONSE".into()),
            message.to_owned(),
        )
    }

    /// A Begin's `EXECUTE` answer arrived after the lease it granted had ended (measured
    /// from when the Begin was sent): the provider was not called, nothing was reported.
    pub(crate) fn lease_expired_before_call(length: Duration) -> Self {
        Self::local(
            Code::Aborted,
            ErrorReason::LeaseExpiredBeforeCall,
            format!(
                "the Begin answer arrived after its lease of {length:?} had ended; the provider \
                 was not called: begin the same intent again to see where it stands"
            ),
        )
    }

    /// The payload could not be made into JSON on this side (never sent).
    pub(crate) fn unserializable_payload() -> Self {
        Self::local(
            Code::InvalidArgument,
            ErrorReason::InvalidPayload,
            "the arguments could not be serialized as a JSON payload".into(),
        )
    }

    /// Whether the same call may simply be sent again because its answer was lost or the
    /// server could not act yet: `UNAVAILABLE` (unreachable server, `STORE_UNAVAILABLE`,
    /// a call refused by a server's GOAWAY),
    /// `CANCELLED` and `DEADLINE_EXCEEDED` whatever the reason (the server's transport ends
    /// a call whose `grpc-timeout` passed with a bare `CANCELLED`), `UNKNOWN` without an
    /// `ErrorInfo` (a broken connection; not HTTP 431, headers over the server's limit), `ABORTED`/`CONCURRENT_MODIFICATION` and
    /// `RESOURCE_EXHAUSTED`/`SERVER_OVERLOADED` (load shedding; wait `retry_after`).
    /// Business answers (`LEASE_LOST`, `IDEMPOTENCY_KEY_REUSED`, ...) are never transient.
    pub fn is_transient(&self) -> bool {
        match self.code {
            Code::Unavailable | Code::Cancelled | Code::DeadlineExceeded => true,
            // Except HTTP 431: the request's headers are larger than the server accepts
            // (`max_header_list_bytes`), and a repeat would carry the same headers.
            Code::Unknown => {
                self.reason == ErrorReason::Transport
                    && !self.message.contains("HTTP status code 431")
            }
            Code::Aborted => self.reason == ErrorReason::ConcurrentModification,
            Code::ResourceExhausted => self.reason == ErrorReason::ServerOverloaded,
            _ => false,
        }
    }
}

impl From<Status> for ClientError {
    fn from(status: Status) -> Self {
        let details = status.get_error_details();
        let (reason, metadata) = match details.error_info() {
            Some(info) => (
                info.reason
                    .parse()
                    .unwrap_or_else(|_| ErrorReason::Other(info.reason.clone())),
                info.metadata.clone().into_iter().collect(),
            ),
            // No ErrorInfo: the status was made by the transport (connection refused,
            // message too large), not by the journal.
            None => (ErrorReason::Transport, BTreeMap::new()),
        };
        let field_violations = details
            .bad_request()
            .map(|bad| {
                bad.field_violations
                    .iter()
                    .map(|v| (v.field.clone(), v.description.clone()))
                    .collect()
            })
            .unwrap_or_default();
        // A stream the server refused with HTTP/2 GOAWAY was never processed (RFC 9113
        // §6.8); tonic reports it as INTERNAL, gRPC's other transports as UNAVAILABLE.
        let code = if refused_by_go_away(&status) {
            Code::Unavailable
        } else {
            status.code()
        };
        Self {
            code,
            reason,
            message: message_with_causes(&status),
            field_violations,
            retry_after: details.retry_info().and_then(|info| info.retry_delay),
            metadata,
        }
    }
}

/// Whether the call failed because the server said HTTP/2 GOAWAY (`NO_ERROR`, a graceful
/// shutdown) before taking its stream: the server promises it did not process any stream
/// above the GOAWAY's last stream id, so the call changed nothing and may be sent again on
/// another connection (RFC 9113 §6.8). Any other GOAWAY reason or a stream closed after the
/// server took it is not this case: such a call may have run.
fn refused_by_go_away(status: &Status) -> bool {
    let mut cause = std::error::Error::source(status);
    while let Some(error) = cause {
        if let Some(h2) = error.downcast_ref::<h2::Error>() {
            return h2.is_go_away() && h2.is_remote() && h2.reason() == Some(h2::Reason::NO_ERROR);
        }
        cause = error.source();
    }
    false
}

/// The status message followed by the causes of a client-side failure (a refused TLS
/// handshake, a reset connection), each said once.
fn message_with_causes(status: &Status) -> String {
    let mut message = status.message().to_owned();
    let mut cause = std::error::Error::source(status);
    while let Some(error) = cause {
        let text = error.to_string();
        if !message.contains(&text) {
            message.push_str(": ");
            message.push_str(&text);
        }
        cause = error.source();
    }
    message
}

pub use opjournal_reasons::ErrorReason;

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn a_journal_status_decodes_into_a_typed_reason_with_details() {
        let mut details = tonic_types::ErrorDetails::with_error_info(
            "LEASE_LOST",
            "opjournal.dev",
            [("current_attempt".to_owned(), "2".to_owned())],
        );
        details.set_retry_info(Some(Duration::from_secs(3)));
        let status = Status::with_error_details(Code::Aborted, "lease lost", details);
        let error = ClientError::from(status);
        assert_eq!(error.code, Code::Aborted);
        assert_eq!(error.reason, ErrorReason::LeaseLost);
        assert_eq!(error.retry_after, Some(Duration::from_secs(3)));
        assert_eq!(error.metadata["current_attempt"], "2");
        assert!(!error.is_transient());
    }

    #[test]
    fn a_status_without_error_info_is_a_transport_failure() {
        let error = ClientError::from(Status::unavailable("connection refused"));
        assert_eq!(error.reason, ErrorReason::Transport);
        assert!(error.is_transient());
    }

    #[test]
    fn lost_answers_are_transient_and_business_answers_are_not() {
        for code in [Code::Unavailable, Code::Cancelled, Code::DeadlineExceeded] {
            assert!(
                ClientError::from(Status::new(code, "")).is_transient(),
                "{code:?}"
            );
        }
        assert!(ClientError::from(Status::unknown("connection reset")).is_transient());
        let too_large = "grpc-status header missing, mapped from HTTP status code 431";
        assert!(!ClientError::from(Status::unknown(too_large)).is_transient());
        assert!(ClientError::deadline(Duration::from_secs(1)).is_transient());
        let business = |code, reason: &str| {
            let details = tonic_types::ErrorDetails::with_error_info(
                reason,
                "opjournal.dev",
                std::collections::HashMap::new(),
            );
            ClientError::from(Status::with_error_details(code, "", details))
        };
        assert!(business(Code::Aborted, "CONCURRENT_MODIFICATION").is_transient());
        assert!(business(Code::ResourceExhausted, "SERVER_OVERLOADED").is_transient());
        assert!(!business(Code::ResourceExhausted, "SOMETHING_ELSE").is_transient());
        assert!(!business(Code::AlreadyExists, "IDEMPOTENCY_KEY_REUSED").is_transient());
        assert!(!business(Code::FailedPrecondition, "OUTCOME_ALREADY_RECORDED").is_transient());
        assert!(!business(Code::Unknown, "SOMETHING_NEW").is_transient());
    }
}
