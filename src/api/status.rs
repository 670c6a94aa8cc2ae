//! `JournalError` and `AccessError` -> `tonic::Status`: one gRPC code and exactly one
//! `google.rpc.ErrorInfo` (AIP-193) per error, with a stable reason. The mappings are
//! exhaustive on purpose: a new error variant does not compile until it is given a code and a
//! reason.

use std::collections::HashMap;
use std::time::Duration;

use tonic::{Code, Status};
use tonic_types::{ErrorDetails, StatusExt as _};

use crate::domain::access::AccessError;
use crate::domain::error::JournalError;

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

impl From<JournalError> for Status {
    fn from(error: JournalError) -> Self {
        match error {
            JournalError::InvalidArgument {
                reason,
                violation,
                metadata,
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
                "IDEMPOTENCY_KEY_REUSED",
                "the idempotency key is bound to another request (other payload or action type); \
                 the provider must not be called",
                HashMap::new(),
            ),
            JournalError::LeaseLost => status(
                Code::Aborted,
                "LEASE_LOST",
                "the lease behind this token ended or was taken over; nothing was changed",
                HashMap::new(),
            ),
            JournalError::OutcomeAlreadyRecorded { status: current } => status(
                Code::FailedPrecondition,
                "OUTCOME_ALREADY_RECORDED",
                format!("this lease already recorded another outcome; the operation is {current}"),
                HashMap::from([("status".to_owned(), current.to_string())]),
            ),
            JournalError::Contention => retryable(
                Code::Aborted,
                "CONCURRENT_MODIFICATION",
                "the operation changed concurrently; retry the call",
                Duration::from_millis(50),
            ),
            JournalError::NotFound => status(
                Code::NotFound,
                "OPERATION_NOT_FOUND",
                "no operation with this key in this namespace",
                HashMap::new(),
            ),
            JournalError::ActionTypeNotConfigured => {
                let mut details = ErrorDetails::with_error_info(
                    "ACTION_TYPE_NOT_CONFIGURED",
                    ERROR_DOMAIN,
                    HashMap::new(),
                );
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
                "OPERATION_NOT_RECONCILABLE",
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
                "OPERATION_CHANGED",
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
                "RECONCILE_IN_PROGRESS",
                "the operation is being looked up right now; read it again shortly",
                Duration::from_secs(1),
            ),
            JournalError::NoProviderAdapter => status(
                Code::FailedPrecondition,
                "NO_PROVIDER_ADAPTER",
                "the action has no provider adapter to look the operation up",
                HashMap::new(),
            ),
            JournalError::KeyDerivationDisabled => status(
                Code::FailedPrecondition,
                "KEY_DERIVATION_DISABLED",
                "this server has no key_derivation_secret configured, so it cannot derive keys",
                HashMap::new(),
            ),
            JournalError::StoreUnavailable(source) => {
                tracing::warn!(error = %source, "store unavailable");
                retryable(
                    Code::Unavailable,
                    "STORE_UNAVAILABLE",
                    "the journal database is unavailable; retry the call later",
                    Duration::from_secs(1),
                )
            }
            JournalError::Internal(source) => {
                tracing::error!(error = %source, "internal error");
                status(Code::Internal, "INTERNAL", "internal error", HashMap::new())
            }
        }
    }
}

impl From<AccessError> for Status {
    fn from(error: AccessError) -> Self {
        match error {
            AccessError::MissingCredentials => status(
                Code::Unauthenticated,
                "MISSING_CREDENTIALS",
                "this server requires an `authorization: Bearer <token>` header",
                HashMap::new(),
            ),
            AccessError::InvalidCredentials => status(
                Code::Unauthenticated,
                "INVALID_CREDENTIALS",
                "the bearer token is malformed or not known to this server",
                HashMap::new(),
            ),
            AccessError::RoleNotAllowed { rpc } => status(
                Code::PermissionDenied,
                "ROLE_NOT_ALLOWED",
                format!("{} is not allowed for this token's roles", rpc.name()),
                HashMap::from([("rpc".to_owned(), rpc.name().to_owned())]),
            ),
            AccessError::NamespaceNotAllowed { namespace } => status(
                Code::PermissionDenied,
                "NAMESPACE_NOT_ALLOWED",
                format!("namespace {namespace} is not allowed for this token"),
                HashMap::from([("namespace".to_owned(), namespace)]),
            ),
            AccessError::ReviewerMismatch => status(
                Code::PermissionDenied,
                "REVIEWER_MISMATCH",
                "reviewer must be empty or the name of the caller's token",
                HashMap::new(),
            ),
        }
    }
}
