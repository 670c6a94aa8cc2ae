//! `JournalError` and `AccessError` -> `tonic::Status`: one gRPC code and exactly one
//! `google.rpc.ErrorInfo` (AIP-193) per error, with a stable reason: a variant of
//! [`ErrorReason`], the enum the Rust client reads them into. The mappings are
//! exhaustive on purpose: a new error variant does not compile until it is given a code and a
//! reason.

use std::collections::HashMap;
use std::time::Duration;

use tonic::{Code, Status};
use tonic_types::{ErrorDetails, StatusExt as _};

use crate::domain::access::AccessError;
use crate::domain::error::{ErrorReason, JournalError};
use crate::domain::model::ActorKind;

/// The `ErrorInfo.domain` of every error this service returns.
pub const ERROR_DOMAIN: &str = "opjournal.dev";

/// Builds a status with one `ErrorInfo`.
pub fn status(
    code: Code,
    reason: &str,
    message: impl Into<String>,
    metadata: HashMap<String, String>,
) -> Status {
    let details = ErrorDetails::with_error_info(reason, ERROR_DOMAIN, metadata);
    Status::with_error_details(code, message, details)
}

/// Builds a status with one `ErrorInfo` and a `RetryInfo` suggesting `delay`.
fn retryable(code: Code, reason: &str, message: &str, delay: Duration) -> Status {
    let mut details = ErrorDetails::with_error_info(reason, ERROR_DOMAIN, HashMap::new());
    details.set_retry_info(Some(delay));
    Status::with_error_details(code, message, details)
}

/// The status of a journal error: one gRPC code and one `ErrorInfo` reason per variant
/// (docs/errors.md). Internal detail is logged, never sent.
pub fn journal_status(error: JournalError) -> Status {
    {
        let reason = error.reason();
        let reason = reason.as_str();
        match error {
            JournalError::InvalidArgument {
                violation,
                metadata,
                ..
            } => {
                let mut details = ErrorDetails::with_error_info(
                    reason,
                    ERROR_DOMAIN,
                    metadata.into_iter().collect::<HashMap<_, _>>(),
                );
                details.add_bad_request_violation(violation.field, violation.description.clone());
                Status::with_error_details(
                    Code::InvalidArgument,
                    format!("{}: {}", violation.field, violation.description),
                    details,
                )
            }
            JournalError::KeyReused => status(
                Code::AlreadyExists,
                reason,
                "the idempotency key is bound to another request (other payload or action type); \
                 the provider must not be called",
                HashMap::new(),
            ),
            JournalError::LeaseLost => status(
                Code::Aborted,
                reason,
                "the lease behind this token ended or was taken over; nothing was changed",
                HashMap::new(),
            ),
            JournalError::OutcomeAlreadyRecorded {
                status: current,
                recorded_by,
            } => status(
                Code::FailedPrecondition,
                reason,
                match recorded_by {
                    ActorKind::Client => format!(
                        "this lease already recorded another outcome; the operation is {current}"
                    ),
                    ActorKind::Worker => format!(
                        "the reconcile worker has recorded this operation's outcome; \
                         the operation is {current}"
                    ),
                    ActorKind::Reviewer => format!(
                        "a reviewer has recorded this operation's outcome; the operation is {current}"
                    ),
                },
                HashMap::from([
                    ("status".to_owned(), current.to_string()),
                    ("recorded_by".to_owned(), recorded_by.as_str().to_owned()),
                ]),
            ),
            JournalError::Contention => retryable(
                Code::Aborted,
                reason,
                "the operation changed concurrently; retry the call",
                Duration::from_millis(50),
            ),
            JournalError::NotFound => status(
                Code::NotFound,
                reason,
                "no operation with this key in this namespace",
                HashMap::new(),
            ),
            JournalError::ActionTypeNotConfigured => {
                let mut details =
                    ErrorDetails::with_error_info(reason, ERROR_DOMAIN, HashMap::new());
                details.add_bad_request_violation(
                    "action_type",
                    "is not configured in the policy file",
                );
                Status::with_error_details(
                    Code::InvalidArgument,
                    "action_type: is not configured in the policy file",
                    details,
                )
            }
            JournalError::NotReconcilable {
                status: current,
                lease_live,
            } => status(
                Code::FailedPrecondition,
                reason,
                if lease_live {
                    "the operation is under a live lease; reconcile it after the lease ends".into()
                } else {
                    format!("an operation in status {current} has nothing to reconcile")
                },
                HashMap::from([("status".to_owned(), current.to_string())]),
            ),
            JournalError::OperationChanged {
                status: current,
                attempt_count,
            } => status(
                Code::FailedPrecondition,
                reason,
                format!(
                    "the operation changed since it was seen: it is {current} at attempt {attempt_count}"
                ),
                HashMap::from([
                    ("status".to_owned(), current.to_string()),
                    ("attempt_count".to_owned(), attempt_count.to_string()),
                ]),
            ),
            JournalError::ReconcileInProgress => retryable(
                Code::FailedPrecondition,
                reason,
                "the operation is being looked up right now; read it again shortly",
                Duration::from_secs(1),
            ),
            JournalError::NoProviderAdapter => status(
                Code::FailedPrecondition,
                reason,
                "the action has no provider adapter to look the operation up",
                HashMap::new(),
            ),
            JournalError::KeyDerivationDisabled => status(
                Code::FailedPrecondition,
                reason,
                "this server has no key_derivation_secret configured, so it cannot derive keys",
                HashMap::new(),
            ),
            JournalError::StoreUnavailable(source) => {
                tracing::warn!(error = %source, "store unavailable");
                retryable(
                    Code::Unavailable,
                    reason,
                    "the journal database is unavailable; retry the call later",
                    Duration::from_secs(1),
                )
            }
            JournalError::Internal(source) => {
                tracing::error!(error = %source, "internal error");
                status(Code::Internal, reason, "internal error", HashMap::new())
            }
        }
    }
}

/// The status of an access error: `UNAUTHENTICATED` or `PERMISSION_DENIED` with its reason.
pub fn access_status(error: AccessError) -> Status {
    {
        match error {
            AccessError::MissingCredentials => status(
                Code::Unauthenticated,
                ErrorReason::MissingCredentials.as_str(),
                "this server requires an `authorization: Bearer <token>` header",
                HashMap::new(),
            ),
            AccessError::InvalidCredentials => status(
                Code::Unauthenticated,
                ErrorReason::InvalidCredentials.as_str(),
                "the bearer token is malformed or not known to this server",
                HashMap::new(),
            ),
            AccessError::RoleNotAllowed { rpc } => status(
                Code::PermissionDenied,
                ErrorReason::RoleNotAllowed.as_str(),
                format!("{} is not allowed for this token's roles", rpc.name()),
                HashMap::from([("rpc".to_owned(), rpc.name().to_owned())]),
            ),
            AccessError::NamespaceNotAllowed { namespace } => status(
                Code::PermissionDenied,
                ErrorReason::NamespaceNotAllowed.as_str(),
                format!("namespace {namespace} is not allowed for this token"),
                HashMap::from([("namespace".to_owned(), namespace)]),
            ),
            AccessError::ReviewerMismatch => status(
                Code::PermissionDenied,
                ErrorReason::ReviewerMismatch.as_str(),
                "reviewer must be empty or the name of the caller's token",
                HashMap::new(),
            ),
        }
    }
}
