//! The journal's use cases: Begin, the lease holder's reports, reads.
//!
//! This layer turns raw request fields into domain types (refusing bad input before anything
//! is written), applies the action policy and the Begin decision, and interprets a failed
//! compare-and-set by re-reading the row. It knows the storage trait, not SQL or gRPC.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use chrono::{DateTime, Utc};
use uuid::Uuid;

use crate::domain::canonical::{self, Limits, RequestHash};
use crate::domain::derived_key::KeyDeriver;
use crate::domain::error::{FieldViolation, JournalError};
use crate::domain::lease::{self, AttemptId, BeginVerdict, LeaseToken};
use crate::domain::model::{
    ActionType, ErrorCode, ExternalId, Namespace, OperationKey, OperationRecord, Status,
};
use crate::domain::policy::{
    ActionPolicy, AdapterConfig, DuplicateIntentMode, Policy, ResultSource,
};
use crate::domain::sensitive;
use crate::store::{
    Claim, Clock, JournalStore, ListQuery, NewOperation, Registration, SameRequest, SearchQuery,
    Settlement, StoreError,
};
use crate::telemetry::Metrics;
use crate::telemetry::propagation::TraceParent;
use crate::domain::error::ErrorReason;

mod command;

pub use command::{
    Complete, DeriveKey, Fail, ListOperations, OperationRef, Page, Renew, ReportUnknown,
};

/// A store failure as the use cases answer it: unavailable (retryable) or internal.
impl From<StoreError> for JournalError {
    fn from(error: StoreError) -> Self {
        match error {
            StoreError::Unavailable(source) => JournalError::StoreUnavailable(source),
            StoreError::Other(source) => JournalError::Internal(source),
        }
    }
}

/// Limits on request fields (sizes in bytes), set from the configuration.
#[derive(Debug, Clone)]
pub struct RequestLimits {
    /// Largest `payload_json`, in bytes.
    pub max_payload_bytes: usize,
    /// Largest `result_json`, in bytes.
    pub max_result_bytes: usize,
    /// Deepest JSON nesting.
    pub max_json_depth: usize,
    /// Most entries in `references`.
    pub max_references: usize,
    /// Largest page of `ListOperations` and `ListOperationsForReview`.
    pub max_page_size: u32,
}

impl Default for RequestLimits {
    fn default() -> Self {
        Self {
            max_payload_bytes: 256 * 1024,
            max_result_bytes: 64 * 1024,
            max_json_depth: 32,
            max_references: 16,
            max_page_size: 500,
        }
    }
}

/// Page of `ListOperations` when the request asks for none (or `max_page_size`, if smaller).
pub const DEFAULT_PAGE_SIZE: i64 = 50;
/// Largest page of `ListOperations` unless configured otherwise (`max_page_size`).
pub const MAX_PAGE_SIZE: i64 = 500;
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

/// A Begin as the transport received it, not yet validated: [`Journal::begin_request`]
/// validates it (with this journal's limits) and begins, in one call.
#[derive(Debug, Clone, Default)]
pub struct BeginRequest {
    /// Tenant namespace ("" = the default).
    pub namespace: String,
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

/// What [`Journal::search`] looks an operation up by.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SearchTerm {
    /// The idempotency key.
    OperationKey(String),
    /// The provider's id of the effect.
    ExternalId(String),
    /// A business reference, `name` = `value` (e.g. `order_id` = `817`).
    Reference {
        /// The reference's name.
        name: String,
        /// Its value.
        value: String,
    },
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

/// Counters of notable journal decisions (exported as metrics by the transport).
#[derive(Debug, Default)]
pub struct JournalCounters {
    /// Begins with a new key for a request already registered, let through (`warn`, or
    /// `hold` with confirmation).
    pub duplicate_intent_warned: AtomicU64,
    /// Begins held as suspected duplicate intent.
    pub duplicate_intent_held: AtomicU64,
}

/// The journal over a store and a policy.
#[derive(Clone)]
pub struct Journal {
    store: Arc<dyn JournalStore>,
    policy: Arc<Policy>,
    limits: RequestLimits,
    counters: Arc<JournalCounters>,
    key_deriver: Option<Arc<KeyDeriver>>,
    metrics: Metrics,
    leases: LeaseRules,
}

impl Journal {
    /// A journal over `store` applying `policy`, without key derivation. It keeps in memory
    /// the action type and recorded policy of up to [`LEASE_RULES_ENTRIES`] leases it
    /// granted, each until its holder's report or the end of its lease, so that the report
    /// need not read the row first.
    pub fn new(store: Arc<dyn JournalStore>, policy: Arc<Policy>, limits: RequestLimits) -> Self {
        Self {
            policy,
            limits,
            counters: Arc::default(),
            key_deriver: None,
            metrics: Metrics::disabled(),
            leases: LeaseRules::new(LEASE_RULES_ENTRIES, store.clock().clone()),
            store,
        }
    }

    /// The same journal recording decisions, conflicts and transitions into `metrics`.
    pub fn with_metrics(mut self, metrics: Metrics) -> Self {
        self.metrics = metrics;
        self
    }

    /// The instruments this journal records into.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// The same journal deriving opaque keys with `deriver` (`DeriveOperationKey`).
    pub fn with_key_deriver(mut self, deriver: KeyDeriver) -> Self {
        self.key_deriver = Some(Arc::new(deriver));
        self
    }

    /// The store behind the journal.
    pub fn store(&self) -> &Arc<dyn JournalStore> {
        &self.store
    }

    /// The action policy.
    pub fn policy(&self) -> &Arc<Policy> {
        &self.policy
    }

    /// The request limits.
    pub fn limits(&self) -> &RequestLimits {
        &self.limits
    }

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
        let command = self.parse_begin(
            &request.namespace,
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
        let lease_for = |rules: &ActionPolicy| {
            lease::lease_duration(
                command.lease_seconds,
                self.policy.default_lease_seconds(rules),
                self.policy.defaults.max_lease_seconds,
            )
        };
        let attempt = command.attempt_id.as_ref().map(AttemptId::digest);
        for _ in 0..MAX_CLAIM_ROUNDS {
            let new = NewOperation {
                namespace: command.namespace.clone(),
                operation_key: command.operation_key.clone(),
                action_type: command.action_type.clone(),
                request_hash: command.request_hash,
                references: command.references.clone(),
                lease: lease_for(action),
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
            // The rules the operation was registered under, not today's file.
            let rules = row.action_policy.clone();
            let rules = rules.as_ref().unwrap_or(action);
            match lease::decide(
                &row,
                &command.action_type,
                &command.request_hash,
                attempt.as_ref(),
                rules.provider_deduplicates(),
            ) {
                BeginVerdict::Conflict => return Err(JournalError::KeyReused),
                // The same caller's Begin again: its first answer was lost. The lease it was
                // granted, read with the row in one statement, is still live.
                BeginVerdict::Reissue => match row.lease_id {
                    Some(lease_id) => return Ok(self.execute(row, lease_id)),
                    None => return Err(JournalError::internal("a live lease without a lease id")),
                },
                BeginVerdict::Replay => return Ok(BeginOutcome::Replay(row)),
                BeginVerdict::InProgress(retry_after) => {
                    return Ok(BeginOutcome::InProgress {
                        record: row,
                        retry_after,
                    });
                }
                BeginVerdict::VerificationRequired => {
                    return Ok(BeginOutcome::VerificationRequired(row));
                }
                BeginVerdict::Claim {
                    expected_status,
                    expected_attempt,
                } => {
                    let lease_id = Uuid::new_v4();
                    let claimed = self
                        .store
                        .claim(&Claim {
                            namespace: row.namespace.clone(),
                            operation_key: row.operation_key.clone(),
                            expected_status,
                            expected_attempt,
                            lease: lease_for(rules),
                            lease_id,
                            attempt,
                        })
                        .await?;
                    if let Some(record) = claimed {
                        self.metrics
                            .transitions(Some(expected_status), Status::InProgress, 1);
                        if expected_status == Status::InProgress {
                            self.metrics.lease_expiries("begin", 1);
                        }
                        return Ok(self.execute(record, lease_id));
                    }
                    // Someone else changed the row first: read it again and decide again.
                }
            }
        }
        Err(JournalError::Contention)
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
            return Ok(None);
        };
        // An ordinary retry of an operation that already exists is not a new intent.
        if self
            .store
            .get(&command.namespace, &command.operation_key)
            .await?
            .is_some()
        {
            return Ok(None);
        }
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

    /// Counters of notable decisions, for metrics.
    pub fn counters(&self) -> &JournalCounters {
        &self.counters
    }

    /// Records a confirmed success: -> `succeeded` (article, step 6).
    ///
    /// The command's `result_json` is any JSON value as text (empty = no result body); it is
    /// parsed within the request limits (`INVALID_RESULT`), then sanitized by
    /// the action's result rules (deny-list, `result.keep`, `result.max_bytes`; see
    /// [`crate::domain::result`]) and stored in its RFC 8785 canonical form. Errors:
    /// `ABORTED`/`LEASE_LOST`, `FAILED_PRECONDITION`/`OUTCOME_ALREADY_RECORDED`,
    /// `NOT_FOUND`/`OPERATION_NOT_FOUND`, `INVALID_ARGUMENT` (`RESULT_TOO_LARGE` when the
    /// sanitized result is over `result.max_bytes`).
    pub async fn complete(&self, command: Complete) -> Result<OperationRecord, JournalError> {
        let Complete {
            token,
            external_id,
            result_json,
        } = command;
        let value = self.limits.result("result_json", &result_json)?;
        let (result_json, before) = match value {
            None => (None, None),
            Some(value) => {
                let rules = self.report_rules(&token).await?;
                let sanitized = self
                    .policy
                    .result_rules(self.action_of(&rules), ResultSource::Caller)
                    .sanitize(value);
                match sanitized {
                    Ok(result_json) => (result_json, rules.status()),
                    Err(error) => {
                        if rules.status().is_none() {
                            // As when the row is read first: a missing operation is
                            // NOT_FOUND before its result is refused.
                            self.read_for_report(&token).await?;
                        }
                        return Err(error.into_error("result_json"));
                    }
                }
            }
        };
        self.settle(
            &token,
            before,
            Settlement::Succeeded {
                external_id,
                result_json,
            },
        )
        .await
    }

    /// The row a holder reports on, read before the report: its status is the transition's
    /// "from".
    ///
    /// Errors: `NOT_FOUND`/`OPERATION_NOT_FOUND`; `UNAVAILABLE`/`STORE_UNAVAILABLE`.
    async fn read_for_report(&self, token: &LeaseToken) -> Result<OperationRecord, JournalError> {
        self.store
            .get(&token.namespace, &token.operation_key)
            .await?
            .ok_or(JournalError::NotFound)
    }

    /// The rules of the operation a holder reports on: kept from the Begin that granted the
    /// lease when this journal granted it and it has not ended, else read from the row.
    ///
    /// Errors: as [`Journal::read_for_report`].
    async fn report_rules(&self, token: &LeaseToken) -> Result<ReportRules, JournalError> {
        match self.leases.recall(token) {
            Some(kept) => Ok(ReportRules::Kept(kept)),
            None => Ok(ReportRules::Read(Box::new(
                self.read_for_report(token).await?,
            ))),
        }
    }

    /// The action policy a report applies: the one recorded with the operation, or the
    /// file's entry for its action type when none was recorded (or it does not parse).
    fn action_of<'a>(&'a self, rules: &'a ReportRules) -> Option<&'a ActionPolicy> {
        let (action_type, recorded) = match rules {
            ReportRules::Kept(kept) => (&kept.action_type, kept.recorded.as_ref()),
            ReportRules::Read(row) => (&row.action_type, row.action_policy.as_ref()),
        };
        recorded.or_else(|| self.policy.action(action_type))
    }

    /// Records a definitive rejection that proves no effect: -> `failed_final`.
    ///
    /// Errors: as [`Journal::complete`]; `error_code` is required.
    pub async fn fail(&self, command: Fail) -> Result<OperationRecord, JournalError> {
        let Fail { token, error_code } = command;
        self.settle(&token, None, Settlement::FailedFinal { error_code })
            .await
    }

    /// Records that the outcome is not known: -> `unknown`; the first reconcile lookup is
    /// scheduled after the action's `first_check_after_seconds`.
    ///
    /// Errors: as [`Journal::complete`].
    pub async fn report_unknown(
        &self,
        command: ReportUnknown,
    ) -> Result<OperationRecord, JournalError> {
        let token = command.token;
        let error_code = (command.error_code).or(Some(ErrorCode::internal("unknown_outcome")));
        let rules = self.report_rules(&token).await?;
        // An action without a lookup goes to review at once; others wait for the first check.
        // An operation recorded under a `kind: none` adapter has none, whatever today's file
        // says of that name.
        let first_check_after = self
            .action_of(&rules)
            .filter(|a| {
                a.reconcile.adapter_kind.is_none_or(|kind| kind.looks_up())
                    && matches!(
                        self.policy.adapter_for(a),
                        Some((_, AdapterConfig::Http(_) | AdapterConfig::Grpc(_)))
                    )
            })
            .map(|a| Duration::from_secs(u64::from(a.reconcile.first_check_after_seconds)))
            .unwrap_or_default();
        self.settle(
            &token,
            rules.status(),
            Settlement::Unknown {
                error_code,
                first_check_after,
            },
        )
        .await
    }

    /// Applies a holder's report, counting the transition and any conflict. `before` is the
    /// status of the row when the caller read it first; without it, the report's statement
    /// answers the status it changed.
    async fn settle(
        &self,
        token: &LeaseToken,
        before: Option<Status>,
        settlement: Settlement,
    ) -> Result<OperationRecord, JournalError> {
        let result = self.settle_unobserved(token, before, settlement).await;
        match &result {
            Ok((record, Some(from))) => {
                self.metrics.transitions(Some(*from), record.status, 1);
            }
            Ok((_, None)) => {}
            Err(error) => self.metrics.journal_error(error),
        }
        result.map(|(record, _)| record)
    }

    /// The record after the report, and the status this call changed it from (`None`: a
    /// retried report answered from the row).
    async fn settle_unobserved(
        &self,
        token: &LeaseToken,
        before: Option<Status>,
        settlement: Settlement,
    ) -> Result<(OperationRecord, Option<Status>), JournalError> {
        let applied = self.store.settle(token, &settlement).await?;
        let applied = applied.map(|settled| (settled.record, before.unwrap_or(settled.previous)));
        // Applied or not, this lease reports nothing more that needs its rules.
        self.leases.forget(token);
        if let Some((record, from)) = applied {
            return Ok((record, Some(from)));
        }
        let row = self
            .store
            .get(&token.namespace, &token.operation_key)
            .await?
            .ok_or(JournalError::NotFound)?;
        if row.attempt_count != token.attempt || row.lease_id != Some(token.lease_id) {
            return Err(JournalError::LeaseLost);
        }
        if settlement.already_recorded_in(&row) {
            return Ok((row, None)); // a retried report after its commit
        }
        Err(JournalError::OutcomeAlreadyRecorded {
            status: row.status,
            recorded_by: row.last_actor_kind,
        })
    }

    /// Extends a live lease to `lease_seconds` from now (0 or less gets the minimum).
    ///
    /// Errors: `ABORTED`/`LEASE_LOST` when the lease ended or was taken over;
    /// `NOT_FOUND`/`OPERATION_NOT_FOUND`; `INVALID_ARGUMENT`/`INVALID_LEASE_TOKEN`.
    pub async fn renew(&self, command: Renew) -> Result<OperationRecord, JournalError> {
        let Renew {
            token,
            lease_seconds,
        } = command;
        let lease = lease::renewal_duration(lease_seconds, self.policy.defaults.max_lease_seconds);
        if let Some(record) = self.store.renew(&token, lease).await? {
            self.leases.extend(&token, &record);
            return Ok(record);
        }
        let error = match self
            .store
            .get(&token.namespace, &token.operation_key)
            .await?
        {
            None => JournalError::NotFound,
            Some(_) => JournalError::LeaseLost,
        };
        self.metrics.journal_error(&error);
        Err(error)
    }

    /// The opaque, stable key for an intent (see [`crate::domain::derived_key`]): the same
    /// namespace, action type and intent reference always give the same key under the same
    /// server secret. Nothing is stored; the intent reference is neither kept nor logged.
    ///
    /// Errors: `FAILED_PRECONDITION`/`KEY_DERIVATION_DISABLED` without a configured secret;
    /// `INVALID_ARGUMENT`/`ACTION_TYPE_NOT_CONFIGURED`; `INVALID_ARGUMENT` for an empty or
    /// too long intent reference.
    pub fn derive_key(&self, command: &DeriveKey) -> Result<OperationKey, JournalError> {
        let deriver = self
            .key_deriver
            .as_ref()
            .ok_or(JournalError::KeyDerivationDisabled)?;
        if self.policy.action(&command.action_type).is_none() {
            return Err(JournalError::ActionTypeNotConfigured);
        }
        deriver.derive(
            &command.namespace,
            &command.action_type,
            &command.intent_reference,
        )
    }

    /// Reads one operation. Errors: `NOT_FOUND`/`OPERATION_NOT_FOUND`.
    pub async fn get(&self, operation: &OperationRef) -> Result<OperationRecord, JournalError> {
        self.store
            .get(&operation.namespace, &operation.operation_key)
            .await?
            .ok_or(JournalError::NotFound)
    }

    /// Finds a namespace's operations by `term`, newest first, at most a page of them
    /// (`page_size` as in [`Journal::list`]). A key finds its one operation.
    ///
    /// Errors: `INVALID_ARGUMENT` for a malformed namespace, key, external id or reference
    /// name, or an empty term (`INVALID_FIELD_LENGTH`); `INVALID_PAGE_SIZE`.
    pub async fn search(
        &self,
        namespace: &str,
        term: &SearchTerm,
        page_size: i32,
    ) -> Result<Vec<OperationRecord>, JournalError> {
        let namespace = Namespace::parse(namespace)?;
        let limit = self.limits.page_limit(page_size)?;
        let required = |field: &'static str| {
            JournalError::invalid(
                ErrorReason::InvalidFieldLength,
                FieldViolation::new(field, "is required"),
            )
        };
        let (external_id, reference) = match term {
            SearchTerm::OperationKey(key) => {
                let key = OperationKey::parse(key)?;
                let found = self.store.get(&namespace, &key).await?;
                return Ok(found.into_iter().collect());
            }
            SearchTerm::ExternalId(id) => {
                let id = ExternalId::parse_optional(id)?.ok_or_else(|| required("external_id"))?;
                (Some(id.as_str().to_owned()), None)
            }
            SearchTerm::Reference { name, value } => {
                if name.is_empty() {
                    return Err(required("references"));
                }
                let reference = parse_references([(name.clone(), value.clone())], 1)?;
                (None, reference.into_iter().next())
            }
        };
        let query = SearchQuery {
            namespace,
            external_id,
            reference,
            limit,
        };
        Ok(self.store.search(&query).await?)
    }

    /// Lists operations newest first; returns the page and the next page token (empty at the
    /// end). Page size 0 means 50; the largest page is `max_page_size` (500 by default).
    ///
    /// Errors: `INVALID_ARGUMENT`/`INVALID_PAGE_TOKEN` for a token from other filters,
    /// `INVALID_PAGE_SIZE` for a negative size.
    pub async fn list(
        &self,
        command: ListOperations,
    ) -> Result<(Vec<OperationRecord>, String), JournalError> {
        let ListOperations {
            namespace,
            status,
            action_type,
            page,
        } = command;
        let limit = self.limits.page_limit(page.size)?;
        let filters = format!(
            "{}|{}|{}",
            namespace,
            status.map(Status::as_str).unwrap_or(""),
            action_type.as_ref().map(ActionType::as_str).unwrap_or("")
        );
        let after = if page.token.is_empty() {
            None
        } else {
            Some(PageToken::decode(&page.token, &filters)?)
        };
        let mut rows = self
            .store
            .list(&ListQuery {
                namespace,
                status,
                action_type,
                after,
                limit: limit + 1,
            })
            .await?;
        let next = if rows.len() as i64 > limit {
            rows.truncate(limit as usize);
            rows.last()
                .map(|last| {
                    PageToken::encode(last.created_at, last.operation_key.as_str(), &filters)
                })
                .unwrap_or_default()
        } else {
            String::new()
        };
        Ok((rows, next))
    }
}

impl RequestLimits {
    /// A result as a caller gives it in `field` ("" = none), parsed as strict I-JSON within
    /// `max_result_bytes` and `max_json_depth`.
    ///
    /// Errors: `INVALID_ARGUMENT`/`INVALID_RESULT`, naming the JSON Pointer of the offending
    /// place.
    pub(crate) fn result(
        &self,
        field: &'static str,
        text: &str,
    ) -> Result<Option<serde_json::Value>, JournalError> {
        if text.is_empty() {
            return Ok(None);
        }
        let limits = Limits {
            max_bytes: self.max_result_bytes,
            max_depth: self.max_json_depth,
        };
        let value = canonical::parse_strict(text, &limits)
            .map_err(|e| JournalError::invalid_json(field, ErrorReason::InvalidResult, &e))?;
        Ok(Some(value))
    }

    /// A page size of an operations list: 0 means [`DEFAULT_PAGE_SIZE`] (at most
    /// `max_page_size`), larger than `max_page_size` means `max_page_size`.
    ///
    /// Errors: `INVALID_ARGUMENT`/`INVALID_PAGE_SIZE` for a negative size.
    pub(crate) fn page_limit(&self, page_size: i32) -> Result<i64, JournalError> {
        let max = i64::from(self.max_page_size.max(1));
        page_limit(page_size, DEFAULT_PAGE_SIZE.min(max), max)
    }
}

/// A page size: 0 means `default`, larger than `max` means `max`, negative is refused.
///
/// Errors: `INVALID_ARGUMENT`/`INVALID_PAGE_SIZE`.
pub(crate) fn page_limit(page_size: i32, default: i64, max: i64) -> Result<i64, JournalError> {
    match page_size {
        n if n < 0 => Err(JournalError::invalid(
            ErrorReason::InvalidPageSize,
            FieldViolation::new("page_size", "must not be negative"),
        )),
        0 => Ok(default),
        n => Ok(i64::from(n).min(max)),
    }
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

/// Most leases whose rules a [`Journal`] keeps in memory at once (see [`LeaseRules`]). An
/// entry holds the lease token, the action type and, only when it differs from the policy
/// file's entry, the recorded action policy: a few hundred bytes.
pub const LEASE_RULES_ENTRIES: u64 = 10_000;

/// What a holder's report needs from its operation's row besides the row's status: the action
/// type and the recorded action policy. Neither changes after registration (no statement
/// updates `action_type` or `action_policy`), so they can be kept from the Begin that granted
/// the lease.
#[derive(Debug)]
struct LeaseRule {
    /// The lease it belongs to; a token must match it in full.
    token: LeaseToken,
    /// The operation's action type.
    action_type: ActionType,
    /// The recorded policy when it is not the file's entry for `action_type`; `None` means
    /// that entry (the same rule as for a row without a readable recorded policy).
    recorded: Option<ActionPolicy>,
    /// Time left on the lease when it was granted or last renewed.
    lives_for: Duration,
    /// When the lease ends, by the store's clock as this process reads it.
    ends: DateTime<Utc>,
}

/// The rules of the leases this journal granted, by lease id, so that Complete and
/// ReportUnknown need not read the row before their report. Bounded: at most the configured
/// number of entries, each removed at its holder's report or at the end of its lease
/// (renewals move the end), whichever comes first. A missing entry (granted by another
/// replica or before a restart, evicted, or past its lease) only means the row is read, as
/// it always was.
///
/// The end of a lease is measured as the database measured its length, and an entry is
/// answered only before it by the store's [`Clock`]: real time in production, moved forward
/// by tests (which then need not sleep for an entry to end). The cache also drops each entry
/// at that end by real time, to bound its memory.
#[derive(Clone)]
struct LeaseRules {
    entries: moka::sync::Cache<Uuid, Arc<LeaseRule>>,
    clock: Clock,
}

/// Expires an entry when its lease ends.
struct AtLeaseEnd;

impl moka::Expiry<Uuid, Arc<LeaseRule>> for AtLeaseEnd {
    fn expire_after_create(
        &self,
        _lease_id: &Uuid,
        rule: &Arc<LeaseRule>,
        _created_at: std::time::Instant,
    ) -> Option<Duration> {
        Some(rule.lives_for)
    }

    fn expire_after_update(
        &self,
        _lease_id: &Uuid,
        rule: &Arc<LeaseRule>,
        _updated_at: std::time::Instant,
        _duration_until_expiry: Option<Duration>,
    ) -> Option<Duration> {
        Some(rule.lives_for)
    }
}

impl LeaseRules {
    fn new(max_entries: u64, clock: Clock) -> Self {
        Self {
            entries: moka::sync::Cache::builder()
                .max_capacity(max_entries)
                .expire_after(AtLeaseEnd)
                .build(),
            clock,
        }
    }

    /// Now, by the store's clock.
    fn now(&self) -> DateTime<Utc> {
        self.clock.now().unwrap_or_else(Utc::now)
    }

    /// Keeps the rules of the lease `token` just granted on `record`; `file` is the policy
    /// file's entry for its action type.
    fn remember(&self, token: &LeaseToken, record: &OperationRecord, file: Option<&ActionPolicy>) {
        let Some(lives_for) = lease_left(record) else {
            return;
        };
        let recorded = record
            .action_policy
            .as_ref()
            .filter(|recorded| Some(*recorded) != file)
            .cloned();
        self.entries.insert(
            token.lease_id,
            Arc::new(LeaseRule {
                token: token.clone(),
                action_type: record.action_type.clone(),
                recorded,
                lives_for,
                ends: self.now() + lives_for,
            }),
        );
    }

    /// The rules kept for `token`'s lease, if any and the lease has not ended.
    fn recall(&self, token: &LeaseToken) -> Option<Arc<LeaseRule>> {
        self.entries
            .get(&token.lease_id)
            .filter(|rule| rule.token == *token && self.now() < rule.ends)
    }

    /// Moves the end of a kept lease to the renewed `record`'s.
    fn extend(&self, token: &LeaseToken, record: &OperationRecord) {
        let (Some(rule), Some(lives_for)) = (self.recall(token), lease_left(record)) else {
            return;
        };
        self.entries.insert(
            token.lease_id,
            Arc::new(LeaseRule {
                token: rule.token.clone(),
                action_type: rule.action_type.clone(),
                recorded: rule.recorded.clone(),
                lives_for,
                ends: self.now() + lives_for,
            }),
        );
    }

    /// Drops what was kept for `token`'s lease.
    fn forget(&self, token: &LeaseToken) {
        self.entries.invalidate(&token.lease_id);
    }
}

/// Time left on `record`'s lease by the database clock; `None` when it has none left.
fn lease_left(record: &OperationRecord) -> Option<Duration> {
    let left = (record.lease_until? - record.observed_at).to_std().ok()?;
    (!left.is_zero()).then_some(left)
}

/// Where a report takes its rules from.
enum ReportRules {
    /// Kept from the Begin that granted the lease; the row was not read.
    Kept(Arc<LeaseRule>),
    /// The row, read before the report.
    Read(Box<OperationRecord>),
}

impl ReportRules {
    /// The row's status when it was read first: the transition's "from".
    fn status(&self) -> Option<Status> {
        match self {
            Self::Kept(_) => None,
            Self::Read(row) => Some(row.status),
        }
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

fn parse_references(
    references: impl IntoIterator<Item = (String, String)>,
    max: usize,
) -> Result<BTreeMap<String, String>, JournalError> {
    let invalid = |description: &str| {
        JournalError::invalid(
            ErrorReason::InvalidReferences,
            FieldViolation::new("references", description),
        )
    };
    let map: BTreeMap<String, String> = references.into_iter().collect();
    if map.len() > max {
        return Err(invalid(&format!("at most {max} entries")));
    }
    for (name, value) in &map {
        let name_ok = !name.is_empty()
            && name.len() <= 64
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
        if !name_ok {
            return Err(invalid(
                "names must be 1-64 characters of letters, digits, '_', '-' and '.'",
            ));
        }
        if value.chars().count() > 200 || value.chars().any(char::is_control) {
            return Err(invalid(
                "values must be at most 200 characters without control characters",
            ));
        }
    }
    Ok(map)
}

/// An opaque keyset position bound to the filters it was made for.
pub(crate) struct PageToken;

impl PageToken {
    fn fingerprint(filters: &str) -> String {
        use sha2::Digest as _;
        hex::encode(&sha2::Sha256::digest(filters.as_bytes())[..8])
    }

    /// A token for the (time, key) position of a keyset ordered by time and key.
    pub(crate) fn encode(created_at: DateTime<Utc>, key: &str, filters: &str) -> String {
        Self::encode_position(created_at.timestamp_micros(), key, filters)
    }

    /// Reads a token made by [`PageToken::encode`] for the same filters.
    pub(crate) fn decode(
        token: &str,
        filters: &str,
    ) -> Result<(DateTime<Utc>, String), JournalError> {
        let (micros, key) = Self::decode_position(token, filters)?;
        let created_at =
            DateTime::<Utc>::from_timestamp_micros(micros).ok_or_else(Self::invalid)?;
        Ok((created_at, key))
    }

    /// A token for a position given by a number (such as an event id) and a key (may be empty).
    pub(crate) fn encode_position(position: i64, key: &str, filters: &str) -> String {
        let body = serde_json::json!({
            "c": position,
            "k": key,
            "f": Self::fingerprint(filters),
        });
        URL_SAFE_NO_PAD.encode(body.to_string())
    }

    fn invalid() -> JournalError {
        JournalError::invalid(
            ErrorReason::InvalidPageToken,
            FieldViolation::new(
                "page_token",
                "is not a next_page_token of a call with the same filters",
            ),
        )
    }

    /// Reads a token made by [`PageToken::encode_position`] for the same filters.
    pub(crate) fn decode_position(
        token: &str,
        filters: &str,
    ) -> Result<(i64, String), JournalError> {
        let invalid = Self::invalid;
        let bytes = URL_SAFE_NO_PAD.decode(token).map_err(|_| invalid())?;
        let body: serde_json::Value = serde_json::from_slice(&bytes).map_err(|_| invalid())?;
        if body.get("f").and_then(serde_json::Value::as_str) != Some(&Self::fingerprint(filters)) {
            return Err(invalid());
        }
        let position = body
            .get("c")
            .and_then(serde_json::Value::as_i64)
            .ok_or_else(invalid)?;
        let key = body
            .get("k")
            .and_then(serde_json::Value::as_str)
            .ok_or_else(invalid)?;
        if !key.is_empty() && OperationKey::parse(key).is_err() {
            return Err(invalid());
        }
        Ok((position, key.to_owned()))
    }
}
