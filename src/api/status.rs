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
use crate::store::Cause;

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

/// Builds a status with one `ErrorInfo` and no metadata.
fn plain(code: Code, reason: &str, message: impl Into<String>) -> Status {
    status(code, reason, message, HashMap::new())
}

/// Builds an `INVALID_ARGUMENT` status with one `ErrorInfo` and one `BadRequest` field violation.
fn bad_request(
    reason: &str,
    field: &str,
    description: &str,
    metadata: HashMap<String, String>,
) -> Status {
    let mut details = ErrorDetails::with_error_info(reason, ERROR_DOMAIN, metadata);
    details.add_bad_request_violation(field, description);
    Status::with_error_details(
        Code::InvalidArgument,
        format!("{field}: {description}"),
        details,
    )
}

/// The status of a journal error: one gRPC code and one `ErrorInfo` reason per variant
/// (docs/errors.md). Internal detail is logged, never sent. The match is exhaustive, its arms
/// grouped by gRPC code; each arm names the code; the reason is [`JournalError::reason`],
/// itself exhaustive.
pub fn journal_status(error: JournalError) -> Status {
    let reason = error.reason();
    let reason = reason.as_str();
    match error {
        JournalError::InvalidArgument {
            violation,
            metadata,
            ..
        } => bad_request(
            reason,
            violation.field,
            &violation.description,
            metadata.into_iter().collect(),
        ),
        JournalError::ActionTypeNotConfigured => bad_request(
            reason,
            "action_type",
            "is not configured in the policy file",
            HashMap::new(),
        ),
        JournalError::NotFound => plain(
            Code::NotFound,
            reason,
            "no operation with this key in this namespace",
        ),
        JournalError::KeyReused => plain(
            Code::AlreadyExists,
            reason,
            "the idempotency key is bound to another request (other payload or action type); \
             the provider must not be called",
        ),
        JournalError::LeaseLost => plain(
            Code::Aborted,
            reason,
            "the lease behind this token ended or was taken over; nothing was changed",
        ),
        JournalError::Contention => retryable(
            Code::Aborted,
            reason,
            "the operation changed concurrently; retry the call",
            Duration::from_millis(50),
        ),
        JournalError::OutcomeAlreadyRecorded {
            status: current,
            recorded_by,
        } => outcome_already_recorded(reason, current, recorded_by),
        JournalError::OperationChanged {
            status: current,
            attempt_count,
        } => operation_changed(reason, current, attempt_count),
        JournalError::NotReconcilable {
            status: current,
            lease_live,
        } => not_reconcilable(reason, current, lease_live),
        JournalError::ReconcileInProgress => retryable(
            Code::FailedPrecondition,
            reason,
            "the operation is being looked up right now; read it again shortly",
            Duration::from_secs(1),
        ),
        JournalError::NoProviderAdapter => plain(
            Code::FailedPrecondition,
            reason,
            "the action has no provider adapter to look the operation up",
        ),
        JournalError::KeyDerivationDisabled => plain(
            Code::FailedPrecondition,
            reason,
            "this server has no key_derivation_secret configured, so it cannot derive keys",
        ),
        JournalError::StoreUnavailable(source) => store_unavailable(reason, &*source),
        JournalError::Internal(source) => internal(reason, &*source),
    }
}

/// `UNAVAILABLE` with a retry delay; the store's error is logged (the database's message and
/// SQLSTATE, see [`Cause`]), never sent.
fn store_unavailable(reason: &str, source: &(dyn std::error::Error + 'static)) -> Status {
    tracing::warn!(error = %Cause(source), "store unavailable");
    retryable(
        Code::Unavailable,
        reason,
        "the journal database is unavailable; retry the call later",
        Duration::from_secs(1),
    )
}

/// `INTERNAL`; the detail is logged (for a database error its message and SQLSTATE, see
/// [`Cause`]), never sent.
fn internal(reason: &str, source: &(dyn std::error::Error + 'static)) -> Status {
    tracing::error!(error = %Cause(source), "internal error");
    plain(Code::Internal, reason, "internal error")
}

/// `FAILED_PRECONDITION` for an outcome already recorded, naming who recorded it.
fn outcome_already_recorded(
    reason: &str,
    current: impl std::fmt::Display,
    recorded_by: ActorKind,
) -> Status {
    let message = match recorded_by {
        ActorKind::Client => {
            format!("this lease already recorded another outcome; the operation is {current}")
        }
        ActorKind::Worker => format!(
            "the reconcile worker has recorded this operation's outcome; \
             the operation is {current}"
        ),
        ActorKind::Reviewer => {
            format!("a reviewer has recorded this operation's outcome; the operation is {current}")
        }
    };
    let metadata = HashMap::from([
        ("status".to_owned(), current.to_string()),
        ("recorded_by".to_owned(), recorded_by.as_str().to_owned()),
    ]);
    status(Code::FailedPrecondition, reason, message, metadata)
}

/// `FAILED_PRECONDITION` for an operation with nothing to reconcile (or under a live lease).
fn not_reconcilable(reason: &str, current: impl std::fmt::Display, lease_live: bool) -> Status {
    let message = if lease_live {
        "the operation is under a live lease; reconcile it after the lease ends".into()
    } else {
        format!("an operation in status {current} has nothing to reconcile")
    };
    let metadata = HashMap::from([("status".to_owned(), current.to_string())]);
    status(Code::FailedPrecondition, reason, message, metadata)
}

/// `FAILED_PRECONDITION` for an operation that moved on since the caller saw it.
fn operation_changed(
    reason: &str,
    current: impl std::fmt::Display,
    attempt_count: impl std::fmt::Display,
) -> Status {
    let message = format!(
        "the operation changed since it was seen: it is {current} at attempt {attempt_count}"
    );
    let metadata = HashMap::from([
        ("status".to_owned(), current.to_string()),
        ("attempt_count".to_owned(), attempt_count.to_string()),
    ]);
    status(Code::FailedPrecondition, reason, message, metadata)
}

/// The status of an access error: `UNAUTHENTICATED` or `PERMISSION_DENIED` with its reason.
pub fn access_status(error: AccessError) -> Status {
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
