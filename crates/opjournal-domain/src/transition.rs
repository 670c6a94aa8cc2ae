//! The journal's state machine: what the use cases and the reconciler decide on a row they
//! read, as pure functions. Whether a write may apply is decided by the store alone, with
//! compare-and-set: the fences of `src/store/sql/` (each written once, rendered for every
//! database) are the single statement of those rules, and nothing in Rust repeats them. A Rust
//! copy could only mirror them, and the statement is what holds under concurrency.
//!
//! | rule | where |
//! |---|---|
//! | what a Begin gets for an existing row (and when a repeated Begin gets its lease again) | [`decide`] |
//! | what a report moves the row to | [`Settlement::target_status`] |
//! | a report repeated with the same outcome | [`Settlement::already_recorded_in`] |
//! | what a reconcile lookup establishes, and when it escalates | [`resolution_for`], [`EscalationReason`] |
//! | what a resolution moves the row to | [`Resolution::target_status`] |
//! | which report a lease token may make (its own lease; `in_progress`, or `unknown` / `pending` not yet reported) | `src/store/sql/fence_report.sql`, `fence_token.sql` |
//! | an ended lease nobody reported on becomes `unknown` (the sweep) | `src/store/sql/expired.sql`, `lease_ended.sql` |
//! | which resolution (lookup or reviewer) may apply: the status and attempt read, never a live lease | `src/store/sql/fence_read.sql` |
//! | which operation a reconcile lookup may claim (`unknown`, or an ended lease; no other looker) | `src/store/sql/claim_for_reconcile.sql`, `reconcile_free.sql` |
//! | a renewal only extends its holder's live lease | `src/store/sql/fence_renew.sql` |
//!
//! The use cases read the row again only to say why a write was refused (`LEASE_LOST`,
//! `OUTCOME_ALREADY_RECORDED`, `OPERATION_CHANGED`, ...), never to decide whether it applies.
//! The store conformance suite runs each fence on every database: late and concurrent reports,
//! a holder after the sweep, resolutions of a read attempt, claims, and the report table
//! (every status and lease state against every report kind).

use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};

use crate::canonical::RequestHash;
use crate::lease::AttemptDigest;
use crate::model::{ActionType, ActorKind, ErrorCode, ExternalId, OperationRecord, Status};
use crate::policy::{ActionPolicy, OnUnresolved};

/// What `BeginOperation` answers for an existing row, before any write.
#[derive(Debug, Clone, PartialEq)]
pub enum BeginVerdict {
    /// Key bound to another request hash or action type.
    Conflict,
    /// Terminal: return the stored outcome.
    Replay,
    /// Another holder's lease is live for this long.
    InProgress(Duration),
    /// The same Begin again (same attempt id, key and request hash) while the lease granted
    /// to it is live: its answer was lost. Answer `EXECUTE` with that lease's token again,
    /// rebuilt from the row; nothing is written and the history gets no transition.
    Reissue,
    /// Unknown outcome (reported, or an expired lease): reconcile before any retry.
    VerificationRequired,
    /// The caller may take a new lease with compare-and-set on this status and attempt.
    Claim {
        /// Status the row must still be in.
        expected_status: Status,
        /// Attempt count the row must still have.
        expected_attempt: i32,
    },
}

/// Decides what a Begin with (`action_type`, `request_hash`) gets for the existing `row`.
///
/// `attempt` is the digest of the Begin's attempt id, if it sent one: a Begin whose attempt
/// id is the one the row's live lease was granted to gets that lease again
/// ([`BeginVerdict::Reissue`]); every other caller, and the same one once the lease has
/// ended, gets what it would without an attempt id. `provider_deduplicates` is the action's
/// policy (`on_timeout: retry_with_same_key`): only then may an unknown operation or an
/// expired lease be claimed again with the same key.
pub fn decide(
    row: &OperationRecord,
    action_type: &ActionType,
    request_hash: &RequestHash,
    attempt: Option<&AttemptDigest>,
    provider_deduplicates: bool,
) -> BeginVerdict {
    if &row.request_hash != request_hash || &row.action_type != action_type {
        return BeginVerdict::Conflict;
    }
    let claim = BeginVerdict::Claim {
        expected_status: row.status,
        expected_attempt: row.attempt_count,
    };
    match row.status {
        Status::Succeeded | Status::FailedFinal => BeginVerdict::Replay,
        Status::Pending => claim,
        Status::InProgress
            if row.has_live_lease() && attempt.is_some_and(|a| row.lease_attempt == Some(*a)) =>
        {
            BeginVerdict::Reissue
        }
        Status::InProgress if row.has_live_lease() => {
            let remaining = row
                .lease_until
                .map(|until| (until - row.observed_at).to_std().unwrap_or_default())
                .unwrap_or_default();
            BeginVerdict::InProgress(remaining)
        }
        // An operation waiting for a person is never retried automatically.
        Status::Unknown if row.review_required_at.is_some() => BeginVerdict::VerificationRequired,
        Status::InProgress | Status::Unknown if provider_deduplicates => claim,
        Status::InProgress | Status::Unknown => BeginVerdict::VerificationRequired,
    }
}

/// A lease holder's report.
#[derive(Debug, Clone, PartialEq)]
pub enum Settlement {
    /// Confirmed success -> `succeeded`.
    Succeeded {
        /// Provider's id of the effect.
        external_id: Option<ExternalId>,
        /// Canonical JSON text of the result, if any.
        result_json: Option<String>,
    },
    /// Confirmed rejection with no effect -> `failed_final`.
    FailedFinal {
        /// Why.
        error_code: ErrorCode,
    },
    /// Outcome not known -> `unknown`; first lookup after `first_check_after`.
    Unknown {
        /// Why, if known.
        error_code: Option<ErrorCode>,
        /// Delay before the first reconcile lookup.
        first_check_after: Duration,
    },
}

impl Settlement {
    /// The status this report moves the operation to.
    pub fn target_status(&self) -> Status {
        match self {
            Self::Succeeded { .. } => Status::Succeeded,
            Self::FailedFinal { .. } => Status::FailedFinal,
            Self::Unknown { .. } => Status::Unknown,
        }
    }

    /// Whether `row` already holds exactly this outcome (a retried report).
    pub fn already_recorded_in(&self, row: &OperationRecord) -> bool {
        match self {
            // The same success: the same provider id, and the same result unless the row was
            // settled by someone else (a reconcile keeps only the provider's kept fields).
            Self::Succeeded {
                external_id,
                result_json,
            } => {
                row.status == Status::Succeeded
                    && row.external_id.as_deref() == external_id.as_ref().map(ExternalId::as_str)
                    && (row.result_json == *result_json || row.last_actor_kind != ActorKind::Client)
            }
            Self::FailedFinal { error_code } => {
                row.status == Status::FailedFinal
                    && row.error_code.as_deref() == Some(error_code.as_str())
            }
            Self::Unknown { .. } => row.status == Status::Unknown,
        }
    }
}

/// Why an operation goes to human review.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EscalationReason {
    /// Still unknown at the action's `unknown_after_seconds` (`unresolved_after_deadline`).
    UnresolvedAfterDeadline,
    /// The action has no provider lookup (`no_provider_lookup`).
    NoProviderLookup,
    /// Neither the recorded rules nor today's policy file know the action
    /// (`action_not_configured`).
    ActionNotConfigured,
}

impl EscalationReason {
    /// Its name in the store (`review_reason`), the history and the webhook event.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::UnresolvedAfterDeadline => "unresolved_after_deadline",
            Self::NoProviderLookup => "no_provider_lookup",
            Self::ActionNotConfigured => "action_not_configured",
        }
    }
}

impl std::fmt::Display for EscalationReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a reconcile lookup established, to apply with compare-and-set.
#[derive(Debug, Clone, PartialEq)]
pub enum Resolution {
    /// The provider has the effect -> `succeeded`.
    Succeeded {
        /// Provider's id of the effect.
        external_id: Option<ExternalId>,
        /// Canonical JSON text of the kept result fields.
        result_json: Option<String>,
    },
    /// The provider rejected the operation definitively -> `failed_final`.
    FailedFinal {
        /// Why.
        error_code: ErrorCode,
    },
    /// Proven absent -> `pending`, same key, so the next Begin executes again.
    ReleaseForRetry,
    /// Not provable automatically -> stays `unknown`, marked for human review, never looked
    /// up or retried automatically again.
    Escalate {
        /// Why.
        reason: EscalationReason,
    },
    /// Still not known -> `unknown`; look again after the delay (unless under review). The
    /// holder's error code is kept; what the lookup saw goes to the history.
    KeepUnknown {
        /// Delay before the next lookup.
        next_check_after: Duration,
    },
}

impl Resolution {
    /// The status this resolution moves the operation to.
    pub fn target_status(&self) -> Status {
        match self {
            Self::Succeeded { .. } => Status::Succeeded,
            Self::FailedFinal { .. } => Status::FailedFinal,
            Self::ReleaseForRetry => Status::Pending,
            Self::Escalate { .. } | Self::KeepUnknown { .. } => Status::Unknown,
        }
    }
}

/// What a provider said.
#[derive(Debug, Clone, PartialEq)]
pub enum Observation {
    /// The effect exists and completed.
    Succeeded {
        /// Provider's id of the effect.
        external_id: Option<String>,
        /// The result the adapter found, canonical JSON text (the http adapter: the provider's
        /// whole answer). The reconciler applies the action's result rules (deny-list,
        /// `result.keep`, size) before anything is stored, and keeps only the sanitized text
        /// in its report.
        result_json: Option<String>,
    },
    /// The operation exists and failed definitively.
    Failed {
        /// Short machine code.
        code: String,
    },
    /// The operation exists but has not finished.
    Pending,
    /// Not found; `search_complete` says whether the provider guarantees its search is
    /// complete (absence still proves nothing inside the grace window).
    NotFound {
        /// Whether the search is declared complete.
        search_complete: bool,
    },
    /// The lookup itself failed; nothing was learned.
    LookupFailed {
        /// Short machine code, e.g. `timeout` or `http_500`.
        code: String,
    },
}

impl Observation {
    /// Its kind, for metrics and spans: `succeeded`, `failed`, `pending`, `not_found`,
    /// `lookup_failed`.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Succeeded { .. } => "succeeded",
            Self::Failed { .. } => "failed",
            Self::Pending => "pending",
            Self::NotFound { .. } => "not_found",
            Self::LookupFailed { .. } => "lookup_failed",
        }
    }
}

/// When the outcome became unknown: the grace window and the escalation deadline count from
/// here.
pub fn unknown_since(record: &OperationRecord) -> DateTime<Utc> {
    record
        .unknown_since
        .or(record.lease_until)
        .unwrap_or(record.updated_at)
}

/// Decides what an observation means for `record` under `action`'s schedule; `jitter_unit`
/// is a random draw in [0, 1).
pub fn resolution_for(
    record: &OperationRecord,
    action: &ActionPolicy,
    observation: &Observation,
    jitter_unit: f64,
) -> Resolution {
    let lookups = u32::try_from(record.reconcile_attempts.saturating_add(1)).unwrap_or(1);
    let next_check_after = action.reconcile.backoff_with_jitter(lookups, jitter_unit);
    let keep = || {
        let escalates = action.on_unresolved == OnUnresolved::RequireHumanReview;
        let deadline = action
            .unknown_after_seconds
            .filter(|_| escalates)
            .map(|s| unknown_since(record) + TimeDelta::seconds(i64::from(s)));
        match deadline {
            Some(deadline) if record.observed_at >= deadline => Resolution::Escalate {
                reason: EscalationReason::UnresolvedAfterDeadline,
            },
            // Never look later than the deadline: escalation happens on time.
            Some(deadline) => Resolution::KeepUnknown {
                next_check_after: next_check_after
                    .min((deadline - record.observed_at).to_std().unwrap_or_default()),
            },
            None => Resolution::KeepUnknown { next_check_after },
        }
    };
    // An id or a code the journal cannot store proves nothing: the reconciler turns such an
    // observation into a failed lookup before it gets here, and it reads as one here too.
    match observation {
        Observation::Succeeded {
            external_id,
            result_json,
        } => match ExternalId::parse_optional(external_id.as_deref().unwrap_or_default()) {
            Ok(external_id) => Resolution::Succeeded {
                external_id,
                result_json: result_json.clone(),
            },
            Err(_) => keep(),
        },
        Observation::Failed { code } => match ErrorCode::parse_optional(code) {
            Ok(Some(error_code)) => Resolution::FailedFinal { error_code },
            Ok(None) | Err(_) => keep(),
        },
        Observation::NotFound {
            search_complete: true,
        } if grace_has_passed(record, action) => Resolution::ReleaseForRetry,
        Observation::NotFound { .. } | Observation::Pending | Observation::LookupFailed { .. } => {
            keep()
        }
    }
}

/// Whether the absence grace window has passed since the outcome became unknown, by the
/// database clock.
fn grace_has_passed(record: &OperationRecord, action: &ActionPolicy) -> bool {
    let grace = TimeDelta::seconds(i64::from(action.reconcile.absence_grace_seconds));
    record.observed_at >= unknown_since(record) + grace
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::lease::AttemptId;
    use crate::model::{Namespace, OperationKey};
    use Status::*;

    fn attempt(text: &str) -> AttemptDigest {
        AttemptId::parse_optional(text).unwrap().unwrap().digest()
    }

    /// A row in `status`, its lease `lease_secs` from now (negative: ended), granted to
    /// `granted_to`.
    fn row(status: Status, lease_secs: i64, granted_to: Option<AttemptDigest>) -> OperationRecord {
        let now = Utc::now();
        OperationRecord {
            namespace: Namespace::parse("").unwrap(),
            operation_key: OperationKey::parse("payment:order-817:intent-01").unwrap(),
            action_type: ActionType::parse("create_payment").unwrap(),
            request_hash: RequestHash::from_hex(&"a".repeat(64)).unwrap(),
            status,
            attempt_count: 1,
            lease_id: Some(uuid::Uuid::new_v4()),
            lease_until: Some(now + TimeDelta::seconds(lease_secs)),
            lease_attempt: granted_to,
            external_id: None,
            result_json: None,
            error_code: None,
            references: Default::default(),
            unknown_since: None,
            next_check_at: None,
            reconcile_attempts: 0,
            review_required_at: None,
            review_reason: None,
            last_actor_kind: ActorKind::Client,
            action_policy: None,
            trace_context: None,
            created_at: now,
            updated_at: now,
            observed_at: now,
        }
    }

    #[test]
    fn a_repeated_begin_gets_its_own_live_lease_again_and_nobody_else_does() {
        let mine = attempt("0f8fad5b-d9cb-469f-a165-70867728950e");
        let other = attempt("7c9e6679-7425-40de-944b-e07fc1f90ae7");
        // (status, lease left s, granted to, asking, provider deduplicates) -> verdict kind
        let table = [
            (InProgress, 30, Some(mine), Some(mine), false, "reissue"),
            (InProgress, 30, Some(mine), Some(mine), true, "reissue"),
            (
                InProgress,
                30,
                Some(mine),
                Some(other),
                false,
                "in_progress",
            ),
            (InProgress, 30, Some(mine), None, false, "in_progress"),
            (InProgress, 30, None, Some(mine), false, "in_progress"),
            (InProgress, 30, None, None, false, "in_progress"),
            // The lease ended: its answer may have arrived after all; never given back.
            (
                InProgress,
                -1,
                Some(mine),
                Some(mine),
                false,
                "verification",
            ),
            (InProgress, -1, Some(mine), Some(mine), true, "claim"),
            // The holder reported, or the sweep ran: the lease is no longer there to give.
            (Unknown, 30, Some(mine), Some(mine), false, "verification"),
            (Succeeded, 30, Some(mine), Some(mine), false, "replay"),
            (FailedFinal, 30, Some(mine), Some(mine), false, "replay"),
            (Pending, 30, Some(mine), Some(mine), false, "claim"),
        ];
        for (status, left, granted_to, asking, dedup, want) in table {
            let r = row(status, left, granted_to);
            let got = match decide(&r, &r.action_type, &r.request_hash, asking.as_ref(), dedup) {
                BeginVerdict::Reissue => "reissue",
                BeginVerdict::InProgress(_) => "in_progress",
                BeginVerdict::VerificationRequired => "verification",
                BeginVerdict::Claim { .. } => "claim",
                BeginVerdict::Replay => "replay",
                BeginVerdict::Conflict => "conflict",
            };
            assert_eq!(
                got,
                want,
                "{status:?} left={left} granted={} asking={} dedup={dedup}",
                granted_to.is_some(),
                asking.map(|a| a == mine).unwrap_or_default()
            );
        }
        // Another request under the key is a conflict, whatever the attempt id says.
        let r = row(InProgress, 30, Some(mine));
        let another = RequestHash::from_hex(&"b".repeat(64)).unwrap();
        assert_eq!(
            decide(&r, &r.action_type, &another, Some(&mine), false),
            BeginVerdict::Conflict
        );
    }

    #[test]
    fn targets_table() {
        let success = Settlement::Succeeded {
            external_id: None,
            result_json: None,
        };
        let unknown = Settlement::Unknown {
            error_code: None,
            first_check_after: Duration::ZERO,
        };
        assert_eq!(success.target_status(), Succeeded);
        assert_eq!(unknown.target_status(), Unknown);
        let targets = [
            (Resolution::ReleaseForRetry, Pending),
            (
                Resolution::FailedFinal {
                    error_code: ErrorCode::internal("declined"),
                },
                FailedFinal,
            ),
            (
                Resolution::Escalate {
                    reason: EscalationReason::NoProviderLookup,
                },
                Unknown,
            ),
            (
                Resolution::KeepUnknown {
                    next_check_after: Duration::ZERO,
                },
                Unknown,
            ),
        ];
        for (resolution, status) in targets {
            assert_eq!(resolution.target_status(), status, "{resolution:?}");
        }
    }

    #[test]
    fn escalation_reasons_keep_their_stored_names() {
        let names = [
            EscalationReason::UnresolvedAfterDeadline,
            EscalationReason::NoProviderLookup,
            EscalationReason::ActionNotConfigured,
        ]
        .map(EscalationReason::as_str);
        assert_eq!(
            names,
            [
                "unresolved_after_deadline",
                "no_provider_lookup",
                "action_not_configured"
            ]
        );
    }
}
