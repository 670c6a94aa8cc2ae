//! Validation of a reviewer's decision before it touches the journal.

use crate::domain::canonical::{self, Limits};
use crate::domain::error::{FieldViolation, JournalError};
use crate::domain::model::{ActorKind, Attribution, ErrorCode, ExternalId};
use crate::journal::RequestLimits;
use crate::store::Resolution;

use super::ReviewDecision;
use opjournal_client::ErrorReason;

/// Who decided and why: reviewer 1-200 characters, reason 1-500, no control characters.
pub(super) fn attribution(reviewer: &str, reason: &str) -> Result<Attribution, JournalError> {
    let check = |field: &'static str, value: &str, max: usize| {
        let chars = value.chars().count();
        if chars == 0 || chars > max || value.chars().any(char::is_control) {
            Err(JournalError::invalid(
                ErrorReason::InvalidReview,
                FieldViolation::new(
                    field,
                    format!("is required: 1 to {max} characters without control characters"),
                ),
            ))
        } else {
            Ok(())
        }
    };
    check("reviewer", reviewer, 200)?;
    check("reason", reason, 500)?;
    Ok(Attribution {
        kind: ActorKind::Reviewer,
        actor: reviewer.to_owned(),
        reason: Some(reason.to_owned()),
    })
}

/// The resolution a decision asks for, with its fields validated like a holder's report
/// (within the same result size and depth limits).
pub(super) fn resolution(
    decision: ReviewDecision,
    request_limits: &RequestLimits,
) -> Result<Resolution, JournalError> {
    Ok(match decision {
        ReviewDecision::Succeeded {
            external_id,
            result_json,
        } => {
            let external_id =
                ExternalId::parse_optional(&external_id)?.map(|id| id.as_str().to_owned());
            let result_json = if result_json.is_empty() {
                None
            } else {
                let limits = Limits {
                    max_bytes: request_limits.max_result_bytes,
                    max_depth: request_limits.max_json_depth,
                };
                let value = canonical::parse_strict(&result_json, &limits).map_err(|e| {
                    JournalError::invalid_json(
                        "succeeded.result_json",
                        ErrorReason::InvalidResult,
                        &e,
                    )
                })?;
                Some(canonical::canonicalize(&value))
            };
            Resolution::Succeeded {
                external_id,
                result_json,
            }
        }
        ReviewDecision::FailedFinal { error_code } => {
            let code = ErrorCode::parse_optional(&error_code)?.ok_or_else(|| {
                JournalError::invalid(
                    ErrorReason::InvalidFieldLength,
                    FieldViolation::new("failed_final.error_code", "is required"),
                )
            })?;
            Resolution::FailedFinal {
                error_code: code.as_str().to_owned(),
            }
        }
        ReviewDecision::ReleaseForRetry => Resolution::ReleaseForRetry,
    })
}
