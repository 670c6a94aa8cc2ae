//! The journal's error type: what a caller can act on, kept apart from internal detail.
//!
//! Client-facing text never carries payloads, results or internal detail; the transport maps
//! each variant to one gRPC code and one stable `ErrorInfo` reason (see `api::status`).

use std::collections::BTreeMap;

use super::canonical::JsonError;
use super::model::{ActorKind, Status};
pub use opjournal_reasons::ErrorReason;

/// One invalid request field, reported as a `google.rpc.BadRequest` field violation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldViolation {
    /// The request field, e.g. `payload_json`.
    pub field: &'static str,
    /// What is wrong, without quoting the value.
    pub description: String,
}

impl FieldViolation {
    /// A violation of `field`.
    pub fn new(field: &'static str, description: impl Into<String>) -> Self {
        Self {
            field,
            description: description.into(),
        }
    }
}

/// Everything the journal can answer besides success.
#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    /// Malformed input. gRPC `INVALID_ARGUMENT` with the given reason and a field violation.
    #[error("invalid argument: {violation:?}")]
    InvalidArgument {
        /// Its stable reason.
        reason: ErrorReason,
        /// The offending field.
        violation: FieldViolation,
        /// Extra `ErrorInfo` metadata (e.g. `json_pointer`, `rule`).
        metadata: BTreeMap<String, String>,
    },
    /// Same key with another request hash or action type. `ALREADY_EXISTS`,
    /// `IDEMPOTENCY_KEY_REUSED`; the row is left untouched.
    #[error("idempotency key is bound to another request")]
    KeyReused,
    /// A report from a holder whose lease was taken over or has ended. `ABORTED`, `LEASE_LOST`.
    #[error("the lease behind this token is no longer held")]
    LeaseLost,
    /// The operation already holds a different outcome than the token's report: recorded by
    /// this lease, or (once the lease ended) by the reconcile worker or a reviewer.
    /// `FAILED_PRECONDITION`, `OUTCOME_ALREADY_RECORDED`.
    #[error("the operation already holds a different outcome")]
    OutcomeAlreadyRecorded {
        /// Status the operation is in.
        status: Status,
        /// Who recorded it: the client (this lease), the worker or a reviewer.
        recorded_by: ActorKind,
    },
    /// The row kept changing under concurrent claims; nothing was written by this call.
    /// `ABORTED`, `CONCURRENT_MODIFICATION`: retry the call.
    #[error("concurrent modification")]
    Contention,
    /// No such operation. `NOT_FOUND`, `OPERATION_NOT_FOUND`.
    #[error("operation not found")]
    NotFound,
    /// The action type is not in the policy file. `INVALID_ARGUMENT`, `ACTION_TYPE_NOT_CONFIGURED`.
    #[error("action type is not configured")]
    ActionTypeNotConfigured,
    /// Reconcile asked for an operation that is not unknown. `FAILED_PRECONDITION`,
    /// `OPERATION_NOT_RECONCILABLE`.
    #[error("operation in status {status} cannot be reconciled")]
    NotReconcilable {
        /// Status the operation is in.
        status: Status,
        /// Whether a live lease is the reason.
        lease_live: bool,
    },
    /// A reviewer's resolution found the operation changed since it was seen.
    /// `FAILED_PRECONDITION`, `OPERATION_CHANGED`.
    #[error("operation changed since it was seen")]
    OperationChanged {
        /// Status now.
        status: Status,
        /// Attempt count now.
        attempt_count: i32,
    },
    /// Someone is looking the operation up right now. `FAILED_PRECONDITION`,
    /// `RECONCILE_IN_PROGRESS`.
    #[error("a reconcile of this operation is in progress")]
    ReconcileInProgress,
    /// The action has no provider lookup. `FAILED_PRECONDITION`, `NO_PROVIDER_ADAPTER`.
    #[error("action has no provider adapter")]
    NoProviderAdapter,
    /// `DeriveOperationKey` without a configured `key_derivation_secret`.
    /// `FAILED_PRECONDITION`, `KEY_DERIVATION_DISABLED`.
    #[error("key derivation is not configured")]
    KeyDerivationDisabled,
    /// The database cannot be reached. `UNAVAILABLE`, `STORE_UNAVAILABLE`.
    #[error("store unavailable: {0}")]
    StoreUnavailable(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// Anything else: a bug or a broken invariant. `INTERNAL`, `INTERNAL`; details go to logs only.
    #[error("internal error: {0}")]
    Internal(#[source] Box<dyn std::error::Error + Send + Sync>),
}

impl JournalError {
    /// The one `ErrorInfo` reason this error is sent with: the reasons are the variants of
    /// the Rust client's [`ErrorReason`], shared by the server (which sends them) and the
    /// client (which reads them).
    pub fn reason(&self) -> ErrorReason {
        match self {
            Self::InvalidArgument { reason, .. } => reason.clone(),
            Self::KeyReused => ErrorReason::IdempotencyKeyReused,
            Self::LeaseLost => ErrorReason::LeaseLost,
            Self::OutcomeAlreadyRecorded { .. } => ErrorReason::OutcomeAlreadyRecorded,
            Self::Contention => ErrorReason::ConcurrentModification,
            Self::NotFound => ErrorReason::OperationNotFound,
            Self::ActionTypeNotConfigured => ErrorReason::ActionTypeNotConfigured,
            Self::NotReconcilable { .. } => ErrorReason::OperationNotReconcilable,
            Self::OperationChanged { .. } => ErrorReason::OperationChanged,
            Self::ReconcileInProgress => ErrorReason::ReconcileInProgress,
            Self::NoProviderAdapter => ErrorReason::NoProviderAdapter,
            Self::KeyDerivationDisabled => ErrorReason::KeyDerivationDisabled,
            Self::StoreUnavailable(_) => ErrorReason::StoreUnavailable,
            Self::Internal(_) => ErrorReason::Internal,
        }
    }

    /// An `INVALID_ARGUMENT` with one field violation.
    pub fn invalid(reason: ErrorReason, violation: FieldViolation) -> Self {
        Self::InvalidArgument {
            reason,
            violation,
            metadata: BTreeMap::new(),
        }
    }

    /// An `INVALID_ARGUMENT` for a JSON field that is not strict I-JSON, naming the JSON Pointer
    /// of the offending place (RFC 6901) in the description and in `ErrorInfo` metadata.
    pub fn invalid_json(field: &'static str, reason: ErrorReason, error: &JsonError) -> Self {
        let mut metadata = BTreeMap::new();
        metadata.insert("json_pointer".to_owned(), error.pointer.clone());
        metadata.insert("rule".to_owned(), error.kind.rule().to_owned());
        let at = if error.pointer.is_empty() {
            "the top level".to_owned()
        } else {
            error.pointer.clone()
        };
        Self::InvalidArgument {
            reason,
            violation: FieldViolation::new(field, format!("at {at}: {}", error.kind)),
            metadata,
        }
    }

    /// An internal error from any source.
    pub fn internal(error: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> Self {
        Self::Internal(error.into())
    }
}
