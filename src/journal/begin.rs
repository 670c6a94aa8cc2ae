//! `BeginOperation`: validation, the new-key screening, duplicate intent, the Begin decision
//! and the claim of a lease.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::time::Duration;

use uuid::Uuid;

use super::Journal;
use super::limits::parse_references;
use crate::domain::canonical::{self, Limits, RequestHash};
use crate::domain::error::{ErrorReason, JournalError};
use crate::domain::lease::{self, AttemptId, BeginVerdict, LeaseToken};
use crate::domain::model::{ActionType, Namespace, OperationKey, OperationRecord, Status};
use crate::domain::policy::{ActionPolicy, DuplicateIntentMode};
use crate::domain::sensitive;
use crate::store::{Claim, NewOperation, Registration, SameRequest};
use crate::telemetry::propagation::TraceParent;

const MAX_CLAIM_ROUNDS: usize = 4;

/// A validated Begin request.
#[derive(Debug, Clone)]
pub struct BeginCommand {
    /// Tenant namespace.
    pub namespace: Namespace,
    /// The idempotency key.
    pub operation_key: OperationKey,
    /// The action type.
    pub action_type: ActionType,
    /// Hash of the canonical action type and payload.
    pub request_hash: RequestHash,
    /// Requested lease, seconds (0 = the action's default).
    pub lease_seconds: i32,
    /// Business links.
    pub references: BTreeMap<String, String>,
    /// The caller confirms a new intent although the same request is registered under
    /// another key (see `duplicate_intent` in the policy).
    pub confirm_duplicate_intent: bool,
    /// The trace context of the registering request, kept with a new operation so that its
    /// reconcile attempts link to that trace.
    pub trace_context: Option<TraceParent>,
    /// The caller's id of this Begin intent: a repeat with the same id while the lease
    /// granted to it is live gets that lease again (see [`lease::AttemptId`]).
    pub attempt_id: Option<AttemptId>,
}

/// A Begin as the transport received it, not yet validated but for its namespace (which the
/// transport needs first, to check the caller's access): [`Journal::begin_request`]
/// validates the rest (with this journal's limits) and begins, in one call.
#[derive(Debug, Clone)]
pub struct BeginRequest {
    /// Tenant namespace, parsed once at the edge.
    pub namespace: Namespace,
    /// The idempotency key.
    pub operation_key: String,
    /// The action type.
    pub action_type: String,
    /// The payload, a JSON object.
    pub payload_json: String,
    /// Requested lease, seconds (0 = the action's default).
    pub lease_seconds: i32,
    /// Business links; not hashed.
    pub references: std::collections::HashMap<String, String>,
    /// See [`BeginCommand::confirm_duplicate_intent`].
    pub confirm_duplicate_intent: bool,
    /// See [`BeginCommand::trace_context`].
    pub trace_context: Option<TraceParent>,
    /// See [`BeginCommand::attempt_id`]; empty = none.
    pub attempt_id: String,
}

/// The Begin answer.
#[derive(Debug, Clone)]
pub enum BeginOutcome {
    /// The caller holds a new lease: call the provider, then report with the token.
    Execute {
        /// The record, `in_progress`.
        record: OperationRecord,
        /// The fencing token of the lease.
        token: LeaseToken,
    },
    /// Terminal: return the stored outcome.
    Replay(OperationRecord),
    /// Another holder's lease is live for `retry_after`.
    InProgress {
        /// The record.
        record: OperationRecord,
        /// Time left on the live lease.
        retry_after: Duration,
    },
    /// Unknown outcome: reconcile before any retry.
    VerificationRequired(OperationRecord),
    /// Held: the same request is registered under `other_key`; nothing was registered. Send
    /// again with `confirm_duplicate_intent` to proceed.
    DuplicateIntentSuspected {
        /// The key of the other operation with the same request.
        other_key: String,
    },
}

impl BeginOutcome {
    /// The decision's name in metrics: `execute`, `replay`, `in_progress`,
    /// `verification_required`, `duplicate_intent_suspected`.
    pub fn decision(&self) -> &'static str {
        match self {
            Self::Execute { .. } => "execute",
            Self::Replay(_) => "replay",
            Self::InProgress { .. } => "in_progress",
            Self::VerificationRequired(_) => "verification_required",
            Self::DuplicateIntentSuspected { .. } => "duplicate_intent_suspected",
        }
    }
}

impl Journal {
    /// Validates raw Begin fields and computes the request hash (RFC 8785 canonical form of
    /// `{"action_type", "payload"}`, SHA-256). Nothing is written.
    ///
    /// Errors: `INVALID_ARGUMENT` with a field violation (`INVALID_PAYLOAD` names the JSON
    /// Pointer of the offending place in metadata `json_pointer`).
    pub fn parse_begin(
        &self,
        namespace: &str,
        operation_key: &str,
        action_type: &str,
        payload_json: &str,
        lease_seconds: i32,
        references: impl IntoIterator<Item = (String, String)>,
    ) -> Result<BeginCommand, JournalError> {
        let namespace = Namespace::parse(namespace)?;
        self.parse_fields(
            namespace,
            operation_key,
            action_type,
            payload_json,
            lease_seconds,
            references,
        )
    }

    /// [`Journal::parse_begin`] of a namespace already parsed.
    fn parse_fields(
        &self,
        namespace: Namespace,
        operation_key: &str,
        action_type: &str,
        payload_json: &str,
        lease_seconds: i32,
        references: impl IntoIterator<Item = (String, String)>,
    ) -> Result<BeginCommand, JournalError> {
        let operation_key = OperationKey::parse(operation_key)?;
        let action_type = ActionType::parse(action_type)?;
        let json_limits = Limits {
            max_bytes: self.limits.max_payload_bytes,
            max_depth: self.limits.max_json_depth,
        };
        let payload = canonical::parse_object(payload_json, &json_limits).map_err(|e| {
            JournalError::invalid_json("payload_json", ErrorReason::InvalidPayload, &e)
        })?;
        let request_hash = RequestHash::compute(action_type.as_str(), &payload);
        let references = parse_references(references, self.limits.max_references)?;
        Ok(BeginCommand {
            namespace,
            operation_key,
            action_type,
            request_hash,
            lease_seconds,
            references,
            confirm_duplicate_intent: false,
            trace_context: None,
            attempt_id: None,
        })
    }

    /// Validates a Begin as received ([`Journal::parse_begin`]) and begins it
    /// ([`Journal::begin`]).
    ///
    /// Errors: those of both; `INVALID_ARGUMENT`/`INVALID_ATTEMPT_ID` for a malformed
    /// attempt id.
    pub async fn begin_request(&self, request: BeginRequest) -> Result<BeginOutcome, JournalError> {
        let attempt_id = AttemptId::parse_optional(&request.attempt_id)?;
        let command = self.parse_fields(
            request.namespace,
            &request.operation_key,
            &request.action_type,
            &request.payload_json,
            request.lease_seconds,
            request.references,
        )?;
        self.begin(BeginCommand {
            confirm_duplicate_intent: request.confirm_duplicate_intent,
            trace_context: request.trace_context,
            attempt_id,
            ..command
        })
        .await
    }

    /// Registers the intent and, where the rules allow, claims a lease (article, step 4).
    ///
    /// Errors: `ALREADY_EXISTS`/`IDEMPOTENCY_KEY_REUSED` when the key is bound to another
    /// request hash or action type (the row is left untouched); `INVALID_ARGUMENT`/
    /// `ACTION_TYPE_NOT_CONFIGURED`; `INVALID_ARGUMENT`/`KEY_CONTAINS_SENSITIVE_DATA` when a
    /// key not yet registered looks like it holds personal data or a secret (see
    /// [`sensitive`]), `KEY_PATTERN_MISMATCH` when it does not match the action's
    /// `key_pattern`, nothing written; `UNAVAILABLE`/`STORE_UNAVAILABLE`.
    pub async fn begin(&self, command: BeginCommand) -> Result<BeginOutcome, JournalError> {
        let outcome = self.begin_unobserved(command).await;
        match &outcome {
            Ok(outcome) => self.metrics.begin_decision(outcome.decision()),
            Err(error) => self.metrics.journal_error(error),
        }
        outcome
    }

    async fn begin_unobserved(&self, command: BeginCommand) -> Result<BeginOutcome, JournalError> {
        let action = self
            .policy
            .action(&command.action_type)
            .ok_or(JournalError::ActionTypeNotConfigured)?;
        self.screen_new_key(&command, action).await?;
        if let Some(outcome) = self.check_duplicate_intent(&command, action).await? {
            return Ok(outcome);
        }
        let recorded_policy = serde_json::to_value(action).map_err(JournalError::internal)?;
        let attempt = command.attempt_id.as_ref().map(AttemptId::digest);
        for _ in 0..MAX_CLAIM_ROUNDS {
            let new = NewOperation {
                namespace: command.namespace.clone(),
                operation_key: command.operation_key.clone(),
                action_type: command.action_type.clone(),
                request_hash: command.request_hash,
                references: command.references.clone(),
                lease: self.lease_for(&command, action),
                lease_id: Uuid::new_v4(),
                attempt,
                action_policy: recorded_policy.clone(),
                trace_context: command
                    .trace_context
                    .as_ref()
                    .map(|t| t.as_str().to_owned()),
            };
            let row = match self.store.register(&new).await? {
                Registration::Inserted(record) => {
                    self.metrics.transitions(None, Status::InProgress, 1);
                    return Ok(self.execute(record, new.lease_id));
                }
                Registration::Existing(row) => row,
                // Committed by a concurrent Begin after the register statement's snapshot (or
                // removed meanwhile): read it now.
                Registration::Raced => match self
                    .store
                    .get(&command.namespace, &command.operation_key)
                    .await?
                {
                    Some(row) => row,
                    None => continue, // removed before it could be read: register again
                },
            };
            if let Some(outcome) = self.answer_existing(&command, action, row).await? {
                return Ok(outcome);
            }
            // Someone else changed the row first: read it again and decide again.
        }
        Err(JournalError::Contention)
    }

    /// The lease a Begin of `command` gets under `rules`.
    fn lease_for(&self, command: &BeginCommand, rules: &ActionPolicy) -> Duration {
        lease::lease_duration(
            command.lease_seconds,
            self.policy.default_lease_seconds(rules),
            self.policy.defaults.max_lease_seconds,
        )
    }

    /// What a Begin gets for the existing `row` ([`lease::decide`]), claiming a lease where
    /// the rules allow; `None` when the claim lost to another change of the row.
    async fn answer_existing(
        &self,
        command: &BeginCommand,
        action: &ActionPolicy,
        row: OperationRecord,
    ) -> Result<Option<BeginOutcome>, JournalError> {
        // The rules the operation was registered under, not today's file.
        let rules = row.action_policy.clone();
        let rules = rules.as_ref().unwrap_or(action);
        let attempt = command.attempt_id.as_ref().map(AttemptId::digest);
        let verdict = lease::decide(
            &row,
            &command.action_type,
            &command.request_hash,
            attempt.as_ref(),
            rules.provider_deduplicates(),
        );
        let outcome = match verdict {
            BeginVerdict::Conflict => return Err(JournalError::KeyReused),
            // The same caller's Begin again: its first answer was lost. The lease it was
            // granted, read with the row in one statement, is still live.
            BeginVerdict::Reissue => match row.lease_id {
                Some(lease_id) => self.execute(row, lease_id),
                None => return Err(JournalError::internal("a live lease without a lease id")),
            },
            BeginVerdict::Replay => BeginOutcome::Replay(row),
            BeginVerdict::InProgress(retry_after) => BeginOutcome::InProgress {
                record: row,
                retry_after,
            },
            BeginVerdict::VerificationRequired => BeginOutcome::VerificationRequired(row),
            BeginVerdict::Claim {
                expected_status,
                expected_attempt,
            } => {
                let claim = Claim {
                    namespace: row.namespace,
                    operation_key: row.operation_key,
                    expected_status,
                    expected_attempt,
                    lease: self.lease_for(command, rules),
                    lease_id: Uuid::new_v4(),
                    attempt,
                };
                return self.claim(&claim).await;
            }
        };
        Ok(Some(outcome))
    }

    /// Takes a new lease with compare-and-set on the status and attempt read; `None` when
    /// the row changed first.
    async fn claim(&self, claim: &Claim) -> Result<Option<BeginOutcome>, JournalError> {
        let Some(record) = self.store.claim(claim).await? else {
            return Ok(None);
        };
        let from = claim.expected_status;
        self.metrics.transitions(Some(from), Status::InProgress, 1);
        if from == Status::InProgress {
            self.metrics.lease_expiries("begin", 1);
        }
        Ok(Some(self.execute(record, claim.lease_id)))
    }

    /// Refuses a key that is not registered yet and begins or ends with whitespace, looks
    /// like it holds personal data or a secret, or does not match the action's `key_pattern`. A key already registered (before
    /// the screening, or before the pattern changed) is let through, so its retries still get
    /// the operation's answer: the rules never change for operations already recorded.
    async fn screen_new_key(
        &self,
        command: &BeginCommand,
        action: &ActionPolicy,
    ) -> Result<(), JournalError> {
        let key = &command.operation_key;
        let screened = sensitive::check_key_form(key)
            .and_then(|()| sensitive::check_key(key))
            .and_then(|()| match &action.key_pattern {
                Some(pattern) => sensitive::check_pattern(key, pattern),
                None => Ok(()),
            });
        let Err(refusal) = screened else {
            return Ok(());
        };
        match self.store.get(&command.namespace, key).await? {
            Some(_) => Ok(()),
            None => Err(refusal),
        }
    }

    /// Duplicate intent under a new key (the model invented a fresh key for a retry): the
    /// same request as a pending, in-progress, unknown or recently succeeded operation of
    /// another key. Under `hold` the Begin is answered without registering anything.
    async fn check_duplicate_intent(
        &self,
        command: &BeginCommand,
        action: &ActionPolicy,
    ) -> Result<Option<BeginOutcome>, JournalError> {
        let rule = &action.duplicate_intent;
        if rule.mode == DuplicateIntentMode::Allow {
            return Ok(None);
        }
        let Some(other_key) = self
            .store
            .find_same_request(&SameRequest {
                namespace: command.namespace.clone(),
                action_type: command.action_type.clone(),
                request_hash: command.request_hash,
                other_than: command.operation_key.clone(),
                window: Duration::from_secs(u64::from(rule.window_seconds)),
            })
            .await?
        else {
            // None, or the key is registered already: an ordinary retry of an operation that
            // exists is not a new intent (the same statement answers both).
            return Ok(None);
        };
        let hold = rule.mode == DuplicateIntentMode::Hold && !command.confirm_duplicate_intent;
        self.metrics.duplicate_intent(hold);
        if hold {
            self.counters
                .duplicate_intent_held
                .fetch_add(1, Ordering::Relaxed);
        } else {
            self.counters
                .duplicate_intent_warned
                .fetch_add(1, Ordering::Relaxed);
        }
        tracing::warn!(
            namespace = %command.namespace,
            action_type = %command.action_type,
            held = hold,
            confirmed = command.confirm_duplicate_intent,
            "duplicate intent suspected: same request under a new idempotency key"
        );
        Ok(hold.then_some(BeginOutcome::DuplicateIntentSuspected { other_key }))
    }
}

impl Journal {
    /// An `EXECUTE` answer for the lease `lease_id` just granted on `record`, keeping the
    /// lease's rules for its holder's report.
    fn execute(&self, record: OperationRecord, lease_id: Uuid) -> BeginOutcome {
        let outcome = execute_outcome(record, lease_id);
        if let BeginOutcome::Execute { record, token } = &outcome {
            let file = self.policy.action(&record.action_type);
            self.leases.remember(token, record, file);
        }
        outcome
    }
}

fn execute_outcome(record: OperationRecord, lease_id: Uuid) -> BeginOutcome {
    let token = LeaseToken {
        namespace: record.namespace.clone(),
        operation_key: record.operation_key.clone(),
        attempt: record.attempt_count,
        lease_id,
    };
    BeginOutcome::Execute { record, token }
}
