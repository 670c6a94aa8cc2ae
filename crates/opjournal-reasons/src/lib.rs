//! The stable `google.rpc.ErrorInfo` reasons of the opjournal protocol (domain `opjournal.dev`),
//! as pure data: no transport, no storage, no dependencies. The server's domain names its errors
//! with them and the Rust client decodes statuses into them (`opjournal_client::ErrorReason` is
//! this type). docs/errors.md lists every reason with what a caller should do.

use std::fmt;
use std::str::FromStr;

/// The stable `ErrorInfo.reason` values of the journal (domain `opjournal.dev`), typed.
/// The catalog with what a client should do for each is in docs/errors.md.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorReason {
    /// `ALREADY_EXISTS`: the key is bound to another payload or action type. Stop: a bug or
    /// a new intent that needs a new key.
    IdempotencyKeyReused,
    /// `ABORTED`: a later lease exists (fencing), or (RenewLease) the lease has ended; this
    /// holder must not report.
    LeaseLost,
    /// `ABORTED`: the row kept changing under concurrent claims; retry the same call.
    ConcurrentModification,
    /// `FAILED_PRECONDITION`: the operation already holds another outcome, recorded by this
    /// lease or, once it ended, by the reconcile worker or a reviewer (metadata `status`,
    /// `recorded_by`).
    OutcomeAlreadyRecorded,
    /// `NOT_FOUND`: no such operation.
    OperationNotFound,
    /// `UNAVAILABLE`: the journal's database is unreachable; retry the same call.
    StoreUnavailable,
    /// `INVALID_ARGUMENT`: the lease token is not one the server issued.
    InvalidLeaseToken,
    /// `INVALID_ARGUMENT`: the payload is not I-JSON (or, made on this side, could not be
    /// serialized at all).
    InvalidPayload,
    /// `INVALID_ARGUMENT`: the key looks like it carries personal data.
    KeyContainsSensitiveData,
    /// `FAILED_PRECONDITION`: the action type is not in the policy file.
    ActionTypeNotConfigured,
    /// `UNAUTHENTICATED`: no token.
    MissingCredentials,
    /// `UNAUTHENTICATED`: an unknown token.
    InvalidCredentials,
    /// `PERMISSION_DENIED`: the token may not use this namespace.
    NamespaceNotAllowed,
    /// `PERMISSION_DENIED`: the token's role may not call this RPC.
    RoleNotAllowed,
    /// `FAILED_PRECONDITION`: nothing to reconcile (a terminal operation, or a live lease).
    OperationNotReconcilable,
    /// `FAILED_PRECONDITION`: the operation changed since the caller saw it (a reviewer's `expected_attempt`).
    OperationChanged,
    /// `FAILED_PRECONDITION`: the operation is being looked up right now; read it again shortly.
    ReconcileInProgress,
    /// `FAILED_PRECONDITION`: the action has no provider adapter to look operations up.
    NoProviderAdapter,
    /// `FAILED_PRECONDITION`: the server has no key derivation secret.
    KeyDerivationDisabled,
    /// `PERMISSION_DENIED`: the reviewer named is not the caller's token.
    ReviewerMismatch,
    /// `INTERNAL`: a server bug or corrupt data; nothing to retry.
    Internal,
    /// `INVALID_ARGUMENT`: the namespace is malformed.
    InvalidNamespace,
    /// `INVALID_ARGUMENT`: the operation key is malformed.
    InvalidOperationKey,
    /// `INVALID_ARGUMENT`: the action type is malformed.
    InvalidActionType,
    /// `INVALID_ARGUMENT`: the error code is malformed.
    InvalidErrorCode,
    /// `INVALID_ARGUMENT`: the provider's id is malformed.
    InvalidExternalId,
    /// `INVALID_ARGUMENT`: a field is empty where required, or too long.
    InvalidFieldLength,
    /// `INVALID_ARGUMENT`: a reviewer's `expected_attempt` is not positive.
    InvalidExpectedAttempt,
    /// `INVALID_ARGUMENT`: the result is not I-JSON.
    InvalidResult,
    /// `INVALID_ARGUMENT`: the sanitized result is larger than the action allows.
    ResultTooLarge,
    /// `INVALID_ARGUMENT`: too many or malformed references.
    InvalidReferences,
    /// `INVALID_ARGUMENT`: a negative page size.
    InvalidPageSize,
    /// `INVALID_ARGUMENT`: a page token this server did not issue for these filters.
    InvalidPageToken,
    /// `INVALID_ARGUMENT`: an unknown status filter.
    InvalidStatusFilter,
    /// `INVALID_ARGUMENT`: a review without exactly one resolution.
    InvalidReview,
    /// `INVALID_ARGUMENT`: the key does not match the action's `key_pattern`.
    KeyPatternMismatch,
    /// `INVALID_ARGUMENT`: the Begin's attempt id is not 16-64 characters of `[A-Za-z0-9_-]`.
    InvalidAttemptId,
    /// `ABORTED`, made on this side by `execute`: the Begin's `EXECUTE` answer arrived after
    /// the lease it granted had ended (measured from when the Begin was sent), so the
    /// provider was not called and nothing was reported. Begin the same intent again (same
    /// key): it replays, asks for verification, or grants a new lease.
    LeaseExpiredBeforeCall,
    /// `RESOURCE_EXHAUSTED`: the server is serving as many calls as it allows
    /// (`max_in_flight_requests`) and its admission queue is full, or the call waited in it
    /// without a place (metadata `limit` names which); nothing was done. Repeat the same call
    /// after the `RetryInfo` delay.
    ServerOverloaded,
    /// `DEADLINE_EXCEEDED`: the request's message did not arrive in full within the server's
    /// `request_body_timeout_seconds`; the call was not served, nothing was done. Repeat it.
    RequestBodyTimeout,
    /// No `ErrorInfo`: the call failed in transport (unreachable server, no answer within
    /// the deadline, oversized message).
    Transport,
    /// Any other reason, as sent.
    Other(String),
}

impl ErrorReason {
    const NAMED: [(&'static str, ErrorReason); 40] = [
        ("IDEMPOTENCY_KEY_REUSED", Self::IdempotencyKeyReused),
        ("LEASE_LOST", Self::LeaseLost),
        ("CONCURRENT_MODIFICATION", Self::ConcurrentModification),
        ("OUTCOME_ALREADY_RECORDED", Self::OutcomeAlreadyRecorded),
        ("OPERATION_NOT_FOUND", Self::OperationNotFound),
        ("STORE_UNAVAILABLE", Self::StoreUnavailable),
        ("INVALID_LEASE_TOKEN", Self::InvalidLeaseToken),
        ("INVALID_PAYLOAD", Self::InvalidPayload),
        (
            "KEY_CONTAINS_SENSITIVE_DATA",
            Self::KeyContainsSensitiveData,
        ),
        ("ACTION_TYPE_NOT_CONFIGURED", Self::ActionTypeNotConfigured),
        ("MISSING_CREDENTIALS", Self::MissingCredentials),
        ("INVALID_CREDENTIALS", Self::InvalidCredentials),
        ("NAMESPACE_NOT_ALLOWED", Self::NamespaceNotAllowed),
        ("ROLE_NOT_ALLOWED", Self::RoleNotAllowed),
        ("OPERATION_NOT_RECONCILABLE", Self::OperationNotReconcilable),
        ("OPERATION_CHANGED", Self::OperationChanged),
        ("RECONCILE_IN_PROGRESS", Self::ReconcileInProgress),
        ("NO_PROVIDER_ADAPTER", Self::NoProviderAdapter),
        ("KEY_DERIVATION_DISABLED", Self::KeyDerivationDisabled),
        ("REVIEWER_MISMATCH", Self::ReviewerMismatch),
        ("INTERNAL", Self::Internal),
        ("INVALID_NAMESPACE", Self::InvalidNamespace),
        ("INVALID_OPERATION_KEY", Self::InvalidOperationKey),
        ("INVALID_ACTION_TYPE", Self::InvalidActionType),
        ("INVALID_ERROR_CODE", Self::InvalidErrorCode),
        ("INVALID_EXTERNAL_ID", Self::InvalidExternalId),
        ("INVALID_FIELD_LENGTH", Self::InvalidFieldLength),
        ("INVALID_EXPECTED_ATTEMPT", Self::InvalidExpectedAttempt),
        ("INVALID_RESULT", Self::InvalidResult),
        ("RESULT_TOO_LARGE", Self::ResultTooLarge),
        ("INVALID_REFERENCES", Self::InvalidReferences),
        ("INVALID_PAGE_SIZE", Self::InvalidPageSize),
        ("INVALID_PAGE_TOKEN", Self::InvalidPageToken),
        ("INVALID_STATUS_FILTER", Self::InvalidStatusFilter),
        ("INVALID_REVIEW", Self::InvalidReview),
        ("KEY_PATTERN_MISMATCH", Self::KeyPatternMismatch),
        ("INVALID_ATTEMPT_ID", Self::InvalidAttemptId),
        ("SERVER_OVERLOADED", Self::ServerOverloaded),
        ("LEASE_EXPIRED_BEFORE_CALL", Self::LeaseExpiredBeforeCall),
        ("REQUEST_BODY_TIMEOUT", Self::RequestBodyTimeout),
    ];

    /// Every named reason with its wire name (not `TRANSPORT`, which no server sends, nor
    /// `Other`), in the catalog's order.
    pub fn all() -> impl Iterator<Item = (&'static str, ErrorReason)> {
        Self::NAMED.into_iter()
    }

    /// The reason as sent on the wire (`TRANSPORT` when there was no `ErrorInfo`).
    pub fn as_str(&self) -> &str {
        match self {
            Self::Transport => "TRANSPORT",
            Self::Other(reason) => reason,
            known => Self::NAMED
                .iter()
                .find(|(_, reason)| reason == known)
                .map_or("", |(name, _)| name),
        }
    }
}

impl FromStr for ErrorReason {
    type Err = std::convert::Infallible;

    fn from_str(value: &str) -> Result<Self, Self::Err> {
        Ok(Self::NAMED
            .iter()
            .find(|(name, _)| *name == value)
            .map_or_else(
                || Self::Other(value.to_owned()),
                |(_, reason)| reason.clone(),
            ))
    }
}

/// Compares with a wire name, e.g. `reason == "LEASE_LOST"`.
impl PartialEq<&str> for ErrorReason {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

impl fmt::Display for ErrorReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn reasons_round_trip_through_their_wire_names() {
        for (name, reason) in ErrorReason::NAMED {
            assert_eq!(name.parse::<ErrorReason>().unwrap(), reason);
            assert_eq!(reason.as_str(), name);
        }
        assert_eq!(
            "SOMETHING_NEW".parse::<ErrorReason>().unwrap(),
            ErrorReason::Other("SOMETHING_NEW".into())
        );
    }
}
