//! Reconciliation: after a timeout, verify the real outcome before any retry (article, step 7).
//!
//! The reconcile path never repeats an action. It asks the provider, through the action's
//! provider adapter, what happened to the operation's key, and applies what it saw with
//! compare-and-set on the state it read, so that an operation completed by its holder in
//! the meantime is never overwritten ("superseded").
//!
//! "Not found" is weak evidence: a provider's search may lag behind its writes. It counts
//! as definitive absence, which releases the operation for retry with the same key, only
//! when the adapter declares its search complete AND the action's absence grace window has
//! passed since the outcome became unknown. Anything else keeps the operation unknown and
//! schedules another look, with exponential backoff and jitter.
//!
//! What cannot be proven is handed to a person instead of guessed: an action with no
//! lookup at all goes to review at once, and one still unknown after its
//! `unknown_after_seconds` is escalated (`on_unresolved: require_human_review`). An operation
//! under review is never looked up or retried automatically again; a reviewer settles it
//! with a compare-and-set on the attempt they saw.
//!
//! Whether a resolution or a lookup claim may apply is the store's fences' to say
//! (`fence_read.sql`, `claim_for_reconcile.sql`; see [`crate::domain::transition`]); this
//! module reads the row before only to choose what to ask and which refusal to answer. The
//! reads of the review queue, the history and the outbox are in `reads.rs`.

pub mod adapter;
mod command;
pub mod grpc;
mod poll;
mod reads;
pub mod webhook;
pub mod worker;

use std::sync::Arc;
use std::time::Duration;

use crate::domain::canonical;
use crate::domain::error::JournalError;
use crate::domain::model::{Attribution, ErrorCode, ExternalId, OperationRecord, Status};
use crate::domain::policy::{ActionPolicy, AdapterKind, Policy, ResultSource};
use crate::domain::result::{ResultRules, SanitizeError};
use crate::domain::transition::EscalationReason;
use crate::journal::{OperationRef, RequestLimits};
use crate::store::{JournalStore, Lookup, Resolution, StoreError};
use crate::telemetry::Metrics;
use crate::telemetry::propagation::TraceParent;
pub use adapter::{AdapterEntry, AdapterSet, LookupRequest, Observation, ProviderAdapter};
pub use command::{History, Resolve, ReviewDecision, ReviewFilter, ReviewQueue};
use tracing::Instrument as _;
use tracing::field::Empty;
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

/// What was done with an observation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReconcileAction {
    /// Marked `succeeded`.
    MarkedSucceeded,
    /// Marked `failed_final`.
    MarkedFailed,
    /// Released for retry: back to `pending`, same key.
    ReleasedForRetry,
    /// Kept `unknown`; another lookup is scheduled.
    KeptUnknown,
    /// Kept `unknown` and marked for human review; no more automatic lookups.
    Escalated,
    /// The row changed while the lookup ran; nothing was applied.
    Superseded,
}

impl ReconcileAction {
    /// Its name in metrics and spans: `marked_succeeded`, `marked_failed`,
    /// `released_for_retry`, `kept_unknown`, `escalated`, `superseded`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::MarkedSucceeded => "marked_succeeded",
            Self::MarkedFailed => "marked_failed",
            Self::ReleasedForRetry => "released_for_retry",
            Self::KeptUnknown => "kept_unknown",
            Self::Escalated => "escalated",
            Self::Superseded => "superseded",
        }
    }
}

/// The result of one reconcile attempt.
#[derive(Debug, Clone)]
pub struct ReconcileReport {
    /// The record after the attempt.
    pub record: OperationRecord,
    /// What the provider said; `None` when no lookup was possible.
    pub observation: Option<Observation>,
    /// What was done.
    pub action: ReconcileAction,
}

/// Settles unknown operations by asking providers, and by reviewers' decisions.
#[derive(Clone)]
pub struct Reconciler {
    store: Arc<dyn JournalStore>,
    policy: Arc<Policy>,
    adapters: AdapterSet,
    actor: String,
    lookup_hold: Duration,
    limits: RequestLimits,
    metrics: Metrics,
}

impl Reconciler {
    /// A reconciler over `store`, using `adapters`; `actor` names it in the history
    /// (e.g. the worker's host and process id).
    pub fn new(
        store: Arc<dyn JournalStore>,
        policy: Arc<Policy>,
        adapters: AdapterSet,
        actor: impl Into<String>,
    ) -> Self {
        let lookup_hold = reconcile_lease_for(&policy);
        Self {
            store,
            policy,
            adapters,
            actor: actor.into(),
            lookup_hold,
            limits: RequestLimits::default(),
            metrics: Metrics::disabled(),
        }
    }

    /// The same reconciler recording attempts, lookups and transitions into `metrics`.
    pub fn with_metrics(mut self, metrics: Metrics) -> Self {
        self.metrics = metrics;
        self
    }

    /// The instruments this reconciler records into.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// The same reconciler applying `limits` to reviewers' results and review pages.
    pub fn with_limits(mut self, limits: RequestLimits) -> Self {
        self.limits = limits;
        self
    }

    /// The name recorded in the history for this reconciler's transitions.
    pub fn actor(&self) -> &str {
        &self.actor
    }

    /// Moves in-progress operations whose lease ended into `unknown`, at most `batch_size`,
    /// recorded under this reconciler's actor and counted in its metrics; returns how many.
    ///
    /// Errors: the store is unavailable.
    pub async fn sweep_expired_leases(&self, batch_size: i64) -> Result<u64, StoreError> {
        let swept = self
            .store
            .sweep_expired_leases(batch_size, &self.actor)
            .await?;
        self.metrics.lease_expiries("sweep", swept);
        self.metrics
            .transitions(Some(Status::InProgress), Status::Unknown, swept);
        Ok(swept)
    }

    /// Claims up to `limit` operations due for a lookup, pushing their next check `hold`
    /// past now so no other replica claims them meanwhile.
    ///
    /// Errors: the store is unavailable.
    pub async fn claim_due(
        &self,
        limit: i64,
        hold: Duration,
    ) -> Result<Vec<OperationRecord>, StoreError> {
        self.store.claim_due(limit, hold).await
    }

    /// Deletes up to `batch_size` terminal operations past their retention; returns how
    /// many went.
    ///
    /// Errors: the store is unavailable.
    pub async fn purge(&self, batch_size: i64) -> Result<u64, StoreError> {
        self.store.purge(batch_size).await
    }

    /// Analyzes the journal tables without planner statistics once they hold `min_changes`
    /// changed rows; `None` when every table has statistics, else how many were analyzed.
    ///
    /// Errors: the store is unavailable.
    pub async fn analyze_new_tables(&self, min_changes: i64) -> Result<Option<u64>, StoreError> {
        self.store.analyze_new_tables(min_changes).await
    }

    /// Reconciles one operation now, on request (the `ReconcileOperation` RPC).
    ///
    /// Errors: `NOT_FOUND`/`OPERATION_NOT_FOUND`; `FAILED_PRECONDITION`/
    /// `OPERATION_NOT_RECONCILABLE` unless the operation is unknown or its lease ended;
    /// `FAILED_PRECONDITION`/`NO_PROVIDER_ADAPTER` when the action has no lookup.
    pub async fn reconcile_now(
        &self,
        operation: &OperationRef,
    ) -> Result<ReconcileReport, JournalError> {
        let (namespace, key) = (&operation.namespace, &operation.operation_key);
        let record = self
            .store
            .get(namespace, key)
            .await?
            .ok_or(JournalError::NotFound)?;
        if !(record.status == Status::Unknown || record.has_expired_lease()) {
            return Err(JournalError::NotReconcilable {
                status: record.status,
                lease_live: record.has_live_lease(),
            });
        }
        let action = self.action_policy(&record)?;
        let (name, adapter) = self
            .adapter_for(&record, &action)
            .ok_or(JournalError::NoProviderAdapter)?;
        let proof = absence_proof(&action);
        // Take the reconcile lease, so that no worker looks the operation up meanwhile.
        let record = self
            .store
            .claim_for_reconcile(namespace, key, self.lookup_hold)
            .await
            .map_err(JournalError::from)
            .and_then(|claimed| claimed.ok_or(JournalError::ReconcileInProgress))
            .inspect_err(|error| self.metrics.journal_error(error))?;
        let span = attempt_span(&record, "request");
        let attempt = async {
            let observation = self.lookup(name, adapter.as_ref(), &record).await;
            let observation = proof(self.sanitize(observation, &action, name));
            self.apply(record, &action, Some(observation)).await
        };
        self.observe_attempt(name, attempt.instrument(span.clone()), &span)
            .await
    }

    /// Asks `adapter` about `record` in a client span, timing the lookup.
    async fn lookup(
        &self,
        name: &str,
        adapter: &dyn ProviderAdapter,
        record: &OperationRecord,
    ) -> Observation {
        let span = tracing::info_span!(
            "lookup",
            otel.name = %format_args!("lookup {name}"),
            otel.kind = "client",
            opjournal.adapter = name,
            opjournal.lookup.observation = Empty,
        );
        let started = std::time::Instant::now();
        let observation = adapter
            .lookup(&lookup_request(record))
            .instrument(span.clone())
            .await;
        self.metrics
            .lookup(name, observation.kind(), started.elapsed());
        span.record("opjournal.lookup.observation", observation.kind());
        observation
    }

    /// Runs one reconcile attempt in `span`, counting its outcome under `adapter`.
    async fn observe_attempt(
        &self,
        adapter: &str,
        attempt: impl std::future::Future<Output = Result<ReconcileReport, JournalError>>,
        span: &tracing::Span,
    ) -> Result<ReconcileReport, JournalError> {
        let result = attempt.await;
        let outcome = match &result {
            Ok(report) => report.action.as_str(),
            Err(_) => "error",
        };
        self.metrics.reconcile_outcome(adapter, outcome);
        span.record("opjournal.reconcile.outcome", outcome);
        if result.is_err() {
            span.record("otel.status_code", "error");
        }
        result
    }

    /// Reconciles a record the worker claimed. An action without a lookup is escalated to
    /// review at once: it is never re-sent automatically.
    pub async fn reconcile_claimed(
        &self,
        record: OperationRecord,
    ) -> Result<ReconcileReport, JournalError> {
        let span = attempt_span(&record, "worker");
        let adapter = self
            .action_policy(&record)
            .ok()
            .and_then(|action| {
                self.adapter_for(&record, &action)
                    .map(|(name, _)| name.to_owned())
            })
            .unwrap_or_else(|| "none".to_owned());
        let attempt = self.reconcile_claimed_unobserved(record);
        self.observe_attempt(&adapter, attempt.instrument(span.clone()), &span)
            .await
    }

    async fn reconcile_claimed_unobserved(
        &self,
        record: OperationRecord,
    ) -> Result<ReconcileReport, JournalError> {
        let Ok(action) = self.action_policy(&record) else {
            // Neither the recorded rules nor today's file know the action: a person decides.
            let reason = EscalationReason::ActionNotConfigured;
            let escalate = Resolution::Escalate { reason };
            let attribution =
                Attribution::worker(self.actor.clone(), format!("escalated:{reason}"));
            return match self
                .store
                .resolve(&record, &escalate, &attribution, Lookup::NotMade)
                .await?
            {
                Some(updated) => Ok(ReconcileReport {
                    record: updated,
                    observation: None,
                    action: ReconcileAction::Escalated,
                }),
                None => Ok(ReconcileReport {
                    record: self.current(&record).await?,
                    observation: None,
                    action: ReconcileAction::Superseded,
                }),
            };
        };
        let observation = match self.adapter_for(&record, &action) {
            Some((name, adapter)) => {
                let observation = self.lookup(name, adapter.as_ref(), &record).await;
                Some(absence_proof(&action)(self.sanitize(
                    observation,
                    &action,
                    name,
                )))
            }
            None => None,
        };
        self.apply(record, &action, observation).await
    }

    /// The adapter that may look the operation up, by the rules it was registered under
    /// (`action`), or `None` for no lookup (the operation goes to review):
    ///
    /// - no adapter recorded, or one recorded as `kind: none`: no lookup, whatever today's
    ///   file says (a changed file never turns "no lookup" into a lookup);
    /// - the recorded adapter in today's file: that adapter, with today's endpoint and
    ///   credentials; no lookup if it is `kind: none` today;
    /// - the recorded adapter gone from today's file: the adapter today's file names for the
    ///   action, but only when the operation was recorded under a lookup (`http` or `grpc`);
    ///   operations recorded before adapter kinds were kept go to review.
    ///
    /// An operation recorded before adapter kinds were kept may have been registered under a
    /// `kind: none` adapter since redefined under the same name: its lookup can settle it
    /// (the provider found the object) but never release it ([`absence_proof`]).
    fn adapter_for<'a>(
        &'a self,
        record: &OperationRecord,
        action: &ActionPolicy,
    ) -> Option<(&'a str, &'a Arc<dyn ProviderAdapter>)> {
        let recorded = action.reconcile.adapter.as_deref()?;
        let kind = action.reconcile.adapter_kind;
        if kind.is_some_and(|kind| !kind.looks_up()) {
            return None;
        }
        if let Some((name, entry)) = self.adapters.entry_named(recorded) {
            return match entry {
                AdapterEntry::Lookup(adapter) => Some((name, adapter)),
                AdapterEntry::NoLookup => None,
            };
        }
        if !kind.is_some_and(AdapterKind::looks_up) {
            return None;
        }
        let today = self
            .policy
            .action(&record.action_type)?
            .reconcile
            .adapter
            .as_deref()?;
        self.adapters
            .entry_named(today)
            .and_then(|(name, entry)| match entry {
                AdapterEntry::Lookup(adapter) => Some((name, adapter)),
                AdapterEntry::NoLookup => None,
            })
    }

    /// What a provider says is input too: an id the journal cannot store, or a result it may
    /// not store, makes the lookup a failed one; only the sanitized result goes any further.
    fn sanitize(
        &self,
        observation: Observation,
        action: &ActionPolicy,
        adapter: &str,
    ) -> Observation {
        let rules = self
            .policy
            .result_rules(Some(action), ResultSource::Adapter(adapter));
        sanitize_observation(observation, &rules)
    }

    /// The rules the operation was registered under; today's file for operations recorded
    /// before policies were kept with them.
    fn action_policy(&self, record: &OperationRecord) -> Result<ActionPolicy, JournalError> {
        record
            .action_policy
            .as_ref()
            .or_else(|| self.policy.action(&record.action_type))
            .cloned()
            .ok_or(JournalError::ActionTypeNotConfigured)
    }

    async fn apply(
        &self,
        record: OperationRecord,
        action: &ActionPolicy,
        observation: Option<Observation>,
    ) -> Result<ReconcileReport, JournalError> {
        let (resolution, lookup) = match &observation {
            Some(observation) => (
                resolution_for(&record, action, observation, rand::random()),
                Lookup::Made,
            ),
            None => (
                Resolution::Escalate {
                    reason: EscalationReason::NoProviderLookup,
                },
                Lookup::NotMade,
            ),
        };
        let attribution = Attribution::worker(
            self.actor.clone(),
            describe(&resolution, observation.as_ref()),
        );
        let applied = self
            .store
            .resolve(&record, &resolution, &attribution, lookup)
            .await?;
        let (record, action) = match applied {
            Some(updated) => {
                self.metrics
                    .transitions(Some(record.status), updated.status, 1);
                (updated, action_of(&resolution))
            }
            None => (self.current(&record).await?, ReconcileAction::Superseded),
        };
        Ok(ReconcileReport {
            record,
            observation,
            action,
        })
    }

    async fn current(&self, record: &OperationRecord) -> Result<OperationRecord, JournalError> {
        self.store
            .get(&record.namespace, &record.operation_key)
            .await?
            .ok_or(JournalError::NotFound)
    }

    /// Applies a reviewer's decision to an `unknown` operation, compare-and-set on the
    /// attempt count the reviewer saw.
    ///
    /// Errors: `INVALID_ARGUMENT`/`INVALID_RESULT` for a success's result that is not strict
    /// I-JSON within the request limits, `RESULT_TOO_LARGE` when it is over the action's
    /// `result.max_bytes` once sanitized; `NOT_FOUND`/`OPERATION_NOT_FOUND`; `FAILED_PRECONDITION`/`OPERATION_CHANGED` when
    /// the operation is no longer unknown at that attempt.
    pub async fn resolve_by_reviewer(
        &self,
        command: Resolve,
    ) -> Result<OperationRecord, JournalError> {
        self.resolve_by_reviewer_unobserved(command)
            .await
            .inspect_err(|error| self.metrics.journal_error(error))
    }

    async fn resolve_by_reviewer_unobserved(
        &self,
        command: Resolve,
    ) -> Result<OperationRecord, JournalError> {
        let Resolve {
            operation,
            expected_attempt,
            attribution,
            decision,
        } = command;
        let mut resolution = match decision {
            ReviewDecision::Succeeded {
                external_id,
                result_json,
            } => Resolution::Succeeded {
                external_id,
                result_json: (self.limits)
                    .result("succeeded.result_json", &result_json)?
                    .map(|value| canonical::canonicalize(&value)),
            },
            ReviewDecision::FailedFinal { error_code } => Resolution::FailedFinal { error_code },
            ReviewDecision::ReleaseForRetry => Resolution::ReleaseForRetry,
        };
        let current = self
            .store
            .get(&operation.namespace, &operation.operation_key)
            .await?
            .ok_or(JournalError::NotFound)?;
        if current.status != Status::Unknown || current.attempt_count != expected_attempt {
            return Err(JournalError::OperationChanged {
                status: current.status,
                attempt_count: current.attempt_count,
            });
        }
        if let Resolution::Succeeded { result_json, .. } = &mut resolution
            && let Some(text) = result_json.take()
        {
            let recorded = current
                .action_policy
                .as_ref()
                .or_else(|| self.policy.action(&current.action_type));
            let rules = self.policy.result_rules(recorded, ResultSource::Caller);
            *result_json = rules.sanitize_text(&text).map_err(|e| match e {
                SanitizeError::TooLarge(e) => e.into_error("succeeded.result_json"),
                SanitizeError::Invalid => {
                    JournalError::internal("a validated result no longer parses")
                }
            })?;
        }
        match self
            .store
            .resolve(&current, &resolution, &attribution, Lookup::NotMade)
            .await?
        {
            Some(record) => {
                self.metrics
                    .transitions(Some(current.status), record.status, 1);
                Ok(record)
            }
            None => {
                let now = self.current(&current).await?;
                Err(JournalError::OperationChanged {
                    status: now.status,
                    attempt_count: now.attempt_count,
                })
            }
        }
    }
}

/// The reconcile lease of an on-request lookup: twice the slowest adapter's timeout.
fn reconcile_lease_for(policy: &Policy) -> Duration {
    (policy.longest_lookup_timeout() * 2).max(Duration::from_secs(10))
}

/// An observation as the journal may use it: an external id it can store, and only the
/// sanitized result (an oversized or malformed one makes the lookup a failed one).
fn sanitize_observation(observation: Observation, rules: &ResultRules<'_>) -> Observation {
    let failed = |code: &str| Observation::LookupFailed { code: code.into() };
    match observation {
        Observation::Succeeded {
            external_id,
            result_json,
        } => {
            if external_id
                .as_deref()
                .is_some_and(|id| ExternalId::parse_optional(id).is_err())
            {
                return failed("invalid_external_id");
            }
            match result_json
                .map(|text| rules.sanitize_text(&text))
                .transpose()
            {
                Ok(result_json) => Observation::Succeeded {
                    external_id,
                    result_json: result_json.flatten(),
                },
                Err(SanitizeError::TooLarge(_)) => failed("result_too_large"),
                Err(SanitizeError::Invalid) => failed("invalid_result_json"),
            }
        }
        // A code the journal cannot store makes the lookup a failed one, like an id.
        Observation::Failed { code }
            if !matches!(ErrorCode::parse_optional(&code), Ok(Some(_))) =>
        {
            failed("invalid_error_code")
        }
        other => other,
    }
}

/// The span of one reconcile attempt (`trigger`: `worker` or `request`), linked to the trace
/// of the request that registered the operation. It names the action type, never the key.
fn attempt_span(record: &OperationRecord, trigger: &'static str) -> tracing::Span {
    let span = tracing::info_span!(
        "reconcile",
        otel.name = "reconcile",
        otel.kind = "internal",
        otel.status_code = Empty,
        opjournal.action_type = %record.action_type,
        opjournal.reconcile.trigger = trigger,
        opjournal.reconcile.attempt = record.reconcile_attempts.saturating_add(1),
        opjournal.reconcile.outcome = Empty,
    );
    if let Some(registered) = record.trace_context.as_deref().and_then(TraceParent::parse) {
        span.add_link(registered.span_context());
    }
    span
}

/// What a "not found" may prove for an operation registered under `action`: for one
/// recorded before adapter kinds were kept (`adapter_kind` missing), nothing, since its
/// adapter may have been a `kind: none` one that a later file redefined under the same name,
/// and a changed file never turns "no lookup" into a release; a complete search then reads
/// as an incomplete one (the operation stays `unknown`, and goes to review at its deadline).
fn absence_proof(action: &ActionPolicy) -> impl Fn(Observation) -> Observation + use<> {
    let kind_recorded = action.reconcile.adapter_kind.is_some();
    move |observation| match observation {
        Observation::NotFound {
            search_complete: true,
        } if !kind_recorded => Observation::NotFound {
            search_complete: false,
        },
        observation => observation,
    }
}

fn lookup_request(record: &OperationRecord) -> LookupRequest {
    LookupRequest {
        namespace: record.namespace.to_string(),
        operation_key: record.operation_key.to_string(),
        provider_key: record.provider_key(),
        action_type: record.action_type.to_string(),
        external_id: record.external_id.clone(),
        references: record.references.clone(),
    }
}

pub use crate::domain::transition::resolution_for;

fn action_of(resolution: &Resolution) -> ReconcileAction {
    match resolution {
        Resolution::Succeeded { .. } => ReconcileAction::MarkedSucceeded,
        Resolution::FailedFinal { .. } => ReconcileAction::MarkedFailed,
        Resolution::ReleaseForRetry => ReconcileAction::ReleasedForRetry,
        Resolution::KeepUnknown { .. } => ReconcileAction::KeptUnknown,
        Resolution::Escalate { .. } => ReconcileAction::Escalated,
    }
}

/// The history's reason for a worker's transition: what was seen, and what it led to.
fn describe(resolution: &Resolution, observation: Option<&Observation>) -> String {
    let seen = match observation {
        None => "no_lookup".to_owned(),
        Some(Observation::Succeeded { .. }) => "found_succeeded".to_owned(),
        Some(Observation::Failed { code }) => format!("found_failed:{code}"),
        Some(Observation::Pending) => "found_pending".to_owned(),
        Some(Observation::NotFound { search_complete }) => {
            if *search_complete {
                "not_found".to_owned()
            } else {
                "not_found_incomplete_search".to_owned()
            }
        }
        Some(Observation::LookupFailed { code }) => format!("lookup_failed:{code}"),
    };
    match resolution {
        Resolution::ReleaseForRetry => format!("{seen}; definitively_absent"),
        Resolution::Escalate { reason } => format!("{seen}; escalated:{reason}"),
        _ => seen,
    }
}
