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
//! schedules another look.

pub mod adapter;
pub mod worker;

use std::sync::Arc;
use std::time::Duration;

use chrono::TimeDelta;

use crate::domain::error::JournalError;
use crate::domain::model::{Namespace, OperationKey, OperationRecord, Status};
use crate::domain::policy::{ActionPolicy, Policy};
use crate::store::{JournalStore, Resolution};
pub use adapter::{AdapterSet, LookupRequest, Observation, ProviderAdapter};

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
    /// The row changed while the lookup ran; nothing was applied.
    Superseded,
}

/// The result of one reconcile attempt.
#[derive(Debug, Clone)]
pub struct ReconcileReport {
    /// The record after the attempt.
    pub record: OperationRecord,
    /// What the provider said.
    pub observation: Observation,
    /// What was done.
    pub action: ReconcileAction,
}

/// Settles unknown operations by asking providers.
#[derive(Clone)]
pub struct Reconciler {
    store: Arc<dyn JournalStore>,
    policy: Arc<Policy>,
    adapters: AdapterSet,
}

impl Reconciler {
    /// A reconciler over `store`, using the adapters of `policy`.
    pub fn new(store: Arc<dyn JournalStore>, policy: Arc<Policy>, adapters: AdapterSet) -> Self {
        Self {
            store,
            policy,
            adapters,
        }
    }

    /// The store behind the reconciler.
    pub fn store(&self) -> &Arc<dyn JournalStore> {
        &self.store
    }

    /// Reconciles one operation now, on request (the `ReconcileOperation` RPC).
    ///
    /// Errors: `NOT_FOUND`/`OPERATION_NOT_FOUND`; `FAILED_PRECONDITION`/
    /// `OPERATION_NOT_RECONCILABLE` unless the operation is unknown or its lease ended;
    /// `FAILED_PRECONDITION`/`NO_PROVIDER_ADAPTER` when the action has no lookup.
    pub async fn reconcile_now(
        &self,
        namespace: &str,
        operation_key: &str,
    ) -> Result<ReconcileReport, JournalError> {
        let namespace = Namespace::parse(namespace)?;
        let key = OperationKey::parse(operation_key)?;
        let record = self
            .store
            .get(&namespace, &key)
            .await?
            .ok_or(JournalError::NotFound)?;
        if !(record.status == Status::Unknown || record.has_expired_lease()) {
            return Err(JournalError::NotReconcilable {
                status: record.status,
                lease_live: record.has_live_lease(),
            });
        }
        let action = self.action_policy(&record)?;
        let adapter = action
            .reconcile
            .adapter
            .as_deref()
            .and_then(|name| self.adapters.get(name))
            .ok_or(JournalError::NoProviderAdapter)?;
        let observation = adapter.lookup(&lookup_request(&record)).await;
        self.apply(record, action, observation).await
    }

    /// Reconciles a record the worker claimed; an action without a lookup is kept unknown
    /// and looked at again after its interval.
    pub async fn reconcile_claimed(
        &self,
        record: OperationRecord,
    ) -> Result<ReconcileReport, JournalError> {
        let action = self.action_policy(&record)?;
        let adapter = action
            .reconcile
            .adapter
            .as_deref()
            .and_then(|name| self.adapters.get(name));
        let observation = match adapter {
            Some(adapter) => adapter.lookup(&lookup_request(&record)).await,
            None => Observation::LookupFailed {
                code: "no_provider_adapter".into(),
            },
        };
        self.apply(record, action, observation).await
    }

    fn action_policy(&self, record: &OperationRecord) -> Result<&ActionPolicy, JournalError> {
        self.policy
            .action(&record.action_type)
            .ok_or(JournalError::ActionTypeNotConfigured)
    }

    async fn apply(
        &self,
        record: OperationRecord,
        action: &ActionPolicy,
        observation: Observation,
    ) -> Result<ReconcileReport, JournalError> {
        let resolution = resolution_for(&record, action, &observation);
        let applied = self.store.resolve(&record, &resolution).await?;
        let (record, action) = match applied {
            Some(updated) => (updated, action_of(&resolution)),
            None => {
                let current = self
                    .store
                    .get(&record.namespace, &record.operation_key)
                    .await?
                    .ok_or(JournalError::NotFound)?;
                (current, ReconcileAction::Superseded)
            }
        };
        Ok(ReconcileReport {
            record,
            observation,
            action,
        })
    }
}

fn lookup_request(record: &OperationRecord) -> LookupRequest {
    LookupRequest {
        namespace: record.namespace.to_string(),
        operation_key: record.operation_key.to_string(),
        action_type: record.action_type.to_string(),
        external_id: record.external_id.clone(),
    }
}

/// Decides what an observation means for `record` under `action`'s schedule.
pub fn resolution_for(
    record: &OperationRecord,
    action: &ActionPolicy,
    observation: &Observation,
) -> Resolution {
    let interval = Duration::from_secs(u64::from(action.reconcile.interval_seconds));
    match observation {
        Observation::Succeeded {
            external_id,
            result_json,
        } => Resolution::Succeeded {
            external_id: external_id.clone(),
            result_json: result_json.clone(),
        },
        Observation::Failed { code } => Resolution::FailedFinal {
            error_code: code.clone(),
        },
        Observation::NotFound {
            search_complete: true,
        } if grace_has_passed(record, action) => Resolution::ReleaseForRetry,
        Observation::NotFound { .. } | Observation::Pending => Resolution::KeepUnknown {
            next_check_after: interval,
            error_code: None,
        },
        Observation::LookupFailed { code } => Resolution::KeepUnknown {
            next_check_after: interval,
            error_code: Some(format!("lookup_{code}")),
        },
    }
}

/// Whether the absence grace window has passed since the outcome became unknown, by the
/// database clock.
fn grace_has_passed(record: &OperationRecord, action: &ActionPolicy) -> bool {
    let since = record
        .unknown_since
        .or(record.lease_until)
        .unwrap_or(record.updated_at);
    let grace = TimeDelta::seconds(i64::from(action.reconcile.absence_grace_seconds));
    record.observed_at >= since + grace
}

fn action_of(resolution: &Resolution) -> ReconcileAction {
    match resolution {
        Resolution::Succeeded { .. } => ReconcileAction::MarkedSucceeded,
        Resolution::FailedFinal { .. } => ReconcileAction::MarkedFailed,
        Resolution::ReleaseForRetry => ReconcileAction::ReleasedForRetry,
        Resolution::KeepUnknown { .. } => ReconcileAction::KeptUnknown,
    }
}
