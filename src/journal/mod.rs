//! The journal's use cases: Begin, the lease holder's reports, reads.
//!
//! This layer turns raw request fields into domain types (refusing bad input before anything
//! is written), applies the action policy and the Begin decision, and interprets a failed
//! compare-and-set by re-reading the row. It knows the storage trait, not SQL or gRPC.
//!
//! One concern per file:
//!
//! | file | what |
//! |---|---|
//! | `begin.rs` | `BeginOperation`: validation, the new-key screening, duplicate intent, claims |
//! | `reports.rs` | the lease holder's reports (complete, fail, unknown) and renewals |
//! | `reads.rs` | one operation, search, the operations list, key derivation |
//! | `lease_rules.rs` | the rules of the leases this journal granted, kept for their reports |
//! | `limits.rs` | request limits: payload and result sizes, references, page sizes |
//! | `page_token.rs` | opaque keyset positions bound to their filters |
//! | `command.rs` | each request as its use case takes it |

use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use crate::domain::derived_key::KeyDeriver;
use crate::domain::error::JournalError;
use crate::domain::policy::Policy;
use crate::store::{JournalStore, StoreError};
use crate::telemetry::Metrics;

mod begin;
mod command;
mod lease_rules;
mod limits;
mod page_token;
mod reads;
mod reports;

pub use begin::{BeginCommand, BeginOutcome, BeginRequest};
pub use command::{
    Complete, DeriveKey, Fail, ListOperations, OperationRef, Page, Renew, ReportUnknown, UnderLease,
};
pub use lease_rules::LEASE_RULES_ENTRIES;
use lease_rules::LeaseRules;
pub(crate) use limits::page_limit;
pub use limits::{DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE, RequestLimits};
pub(crate) use page_token::PageToken;
pub use reads::SearchTerm;

/// A store failure as the use cases answer it: unavailable (retryable) or internal.
impl From<StoreError> for JournalError {
    fn from(error: StoreError) -> Self {
        match error {
            StoreError::Unavailable(source) => JournalError::StoreUnavailable(source),
            StoreError::Other(source) => JournalError::Internal(source),
        }
    }
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

    /// Counters of notable decisions, for metrics.
    pub fn counters(&self) -> &JournalCounters {
        &self.counters
    }
}
