//! The reconcile path's commands, their fields already parsed into domain types at the edge
//! (`api::convert`); the reconciler checks what depends on the configured limits (a result's
//! size and depth, a page's size).

use crate::domain::error::{FieldViolation, JournalError};
use std::time::Duration;

use crate::domain::error::ErrorReason;
use crate::domain::model::{ActionType, Attribution, ErrorCode, ExternalId, Namespace};
use crate::journal::{OperationRef, Page};

/// A reviewer's decision on an unknown operation.
#[derive(Debug, Clone)]
pub enum ReviewDecision {
    /// The provider has the effect.
    Succeeded {
        /// The provider's id of the effect, if known.
        external_id: Option<ExternalId>,
        /// The result, any JSON value as text ("" = none); checked within the request
        /// limits and sanitized by the action's result rules when the decision applies.
        result_json: String,
    },
    /// No effect, never retry automatically.
    FailedFinal {
        /// Why, as a short machine code.
        error_code: ErrorCode,
    },
    /// No effect; the next Begin may execute again with the same key.
    ReleaseForRetry,
}

impl ReviewDecision {
    /// A definitive failure with the form's or request's `failed_final.error_code`, which is
    /// required.
    ///
    /// Errors: `INVALID_ARGUMENT` for a missing or malformed error code.
    pub fn failed_final(error_code: &str) -> Result<Self, JournalError> {
        let error_code = ErrorCode::parse_optional(error_code)?.ok_or_else(|| {
            JournalError::invalid(
                ErrorReason::InvalidFieldLength,
                FieldViolation::new("failed_final.error_code", "is required"),
            )
        })?;
        Ok(Self::FailedFinal { error_code })
    }
}

/// A reviewer's decision on one operation as they saw it (`ResolveOperation`).
#[derive(Debug, Clone)]
pub struct Resolve {
    /// The operation.
    pub operation: OperationRef,
    /// The attempt count the reviewer saw; the decision applies only at that attempt.
    pub expected_attempt: i32,
    /// Who decided and why ([`Attribution::reviewer`]).
    pub attribution: Attribution,
    /// The decision.
    pub decision: ReviewDecision,
}

impl Resolve {
    /// A decision on `operation` at `expected_attempt`, which must be an attempt count (1 or
    /// more).
    ///
    /// Errors: `INVALID_ARGUMENT`/`INVALID_EXPECTED_ATTEMPT`.
    pub fn new(
        operation: OperationRef,
        expected_attempt: i32,
        attribution: Attribution,
        decision: ReviewDecision,
    ) -> Result<Self, JournalError> {
        if expected_attempt < 1 {
            return Err(JournalError::invalid(
                ErrorReason::InvalidExpectedAttempt,
                FieldViolation::new(
                    "expected_attempt_count",
                    "must be the attempt_count of the operation as you saw it",
                ),
            ));
        }
        Ok(Self {
            operation,
            expected_attempt,
            attribution,
            decision,
        })
    }
}

/// Filters of the review queue besides its namespace; the default lets every operation
/// through.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReviewFilter {
    /// Only this action type.
    pub action_type: Option<ActionType>,
    /// Only operations escalated at least this long ago (zero: every one).
    pub min_age: Duration,
}

/// A page of a namespace's review queue, oldest escalation first
/// (`ListOperationsForReview`; the review console's queue, with its filter).
#[derive(Debug, Clone)]
pub struct ReviewQueue {
    /// Tenant namespace.
    pub namespace: Namespace,
    /// Only the operations that pass.
    pub filter: ReviewFilter,
    /// The page.
    pub page: Page,
}

/// A page of one operation's history, oldest first (`GetOperationHistory`).
#[derive(Debug, Clone)]
pub struct History {
    /// The operation.
    pub operation: OperationRef,
    /// The page.
    pub page: Page,
}
