//! Persistence of the journal behind one trait, so that every backend honours one contract:
//! atomic register-and-claim, compare-and-set transitions, database-clock leases.
//!
//! One implementation, [`SqlStore`], serves both backends from one set of `.sql` files
//! (`src/store/sql/`): [`PgStore`] (Postgres, any number of servers and workers) and
//! [`SqliteStore`] (one embedded file, one node) differ only in their [`sql::Dialect`].
//! The wiring picks one from the URL's scheme (`app::Database`).
//!
//! Every method is a single statement (one round trip, one commit): no transaction is ever
//! held open across anything slow. Methods that change a row take the state the caller
//! read and return `None` when the row no longer matches it; the caller decides what that
//! means. On SQLite, [`JournalStore::register`] and [`JournalStore::settle`]
//! take two statements (Postgres answers each in one).

pub mod copy;
mod error;
pub mod group_commit;
pub mod outbox;
pub mod postgres;
pub mod sql;
pub mod sqlite;

use std::collections::BTreeMap;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use uuid::Uuid;

use crate::domain::canonical::RequestHash;
use crate::domain::lease::{AttemptDigest, LeaseToken};
use crate::domain::model::{
    ActionType, Attribution, Namespace, OperationEvent, OperationKey, OperationRecord, Status,
};

pub use crate::domain::transition::{Resolution, Settlement};
pub use crate::telemetry::metrics::BacklogStats;
pub use error::{Cause, StoreError};
pub use group_commit::GroupCommit;
pub use outbox::{DeliveryOutcome, DeliveryState, EscalationOutbox, OutboxEntry, OutboxStats};
pub use postgres::PgStore;
pub use sql::{Clock, SqlStore};
pub use sqlite::SqliteStore;

/// A new intent to register, with the lease its registering caller gets.
#[derive(Debug, Clone)]
pub struct NewOperation {
    /// Tenant namespace.
    pub namespace: Namespace,
    /// The idempotency key.
    pub operation_key: OperationKey,
    /// The action type.
    pub action_type: ActionType,
    /// The request hash the key is bound to.
    pub request_hash: RequestHash,
    /// Business links; not hashed.
    pub references: BTreeMap<String, String>,
    /// Lease length granted to the first caller.
    pub lease: Duration,
    /// Random id of the lease (the secret part of the fencing token).
    pub lease_id: Uuid,
    /// SHA-256 of the registering Begin's attempt id, kept with the lease.
    pub attempt: Option<AttemptDigest>,
    /// The action policy in force, as JSON, recorded with the operation.
    pub action_policy: serde_json::Value,
    /// The W3C `traceparent` of the registering request, in the form
    /// `00-<32 hex trace id>-<16 hex span id>-<2 hex flags>` with non-zero ids (checked by
    /// [`crate::telemetry::propagation::TraceParent`]); kept for the operation's life.
    pub trace_context: Option<String>,
}

/// The answer of [`JournalStore::register`].
#[derive(Debug, Clone, PartialEq)]
pub enum Registration {
    /// The key was new: the operation is registered `in_progress`, attempt 1, under the
    /// lease of the [`NewOperation`].
    Inserted(OperationRecord),
    /// The key already exists in the namespace: its row as read by the same call, unchanged.
    Existing(OperationRecord),
    /// The key exists but this call could not read its row: it was committed by a concurrent
    /// call after this one's snapshot was taken (Postgres), or removed in between. Nothing
    /// was changed; read the row again ([`JournalStore::get`]).
    Raced,
}

/// A report applied by [`JournalStore::settle`].
#[derive(Debug, Clone, PartialEq)]
pub struct Settled {
    /// The row after the report.
    pub record: OperationRecord,
    /// The status the report moved the row from (`in_progress`, or `unknown` / `pending` when
    /// the sweep or a release put it there), for the transition's `from`.
    pub previous: Status,
}

/// Whether a resolution follows a provider lookup, which counts in `reconcile_attempts`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lookup {
    /// The provider was asked.
    Made,
    /// No lookup: a reviewer's decision, or an escalation without asking.
    NotMade,
}

/// Filters and position for listing operations.
#[derive(Debug, Clone)]
pub struct ListQuery {
    /// Tenant namespace.
    pub namespace: Namespace,
    /// Only this status.
    pub status: Option<Status>,
    /// Only this action type.
    pub action_type: Option<ActionType>,
    /// Continue after this (created_at, operation_key) position.
    pub after: Option<(DateTime<Utc>, String)>,
    /// At most this many rows.
    pub limit: i64,
}

/// A new lease on an existing operation, for [`JournalStore::claim`].
#[derive(Debug, Clone)]
pub struct Claim {
    /// Tenant namespace.
    pub namespace: Namespace,
    /// The operation.
    pub operation_key: OperationKey,
    /// The status the caller read; the claim applies only if the row is still in it.
    pub expected_status: Status,
    /// The attempt the caller read; the claim applies only if the row is still at it.
    pub expected_attempt: i32,
    /// Lease length granted.
    pub lease: Duration,
    /// Random id of the new lease (the secret part of the fencing token).
    pub lease_id: Uuid,
    /// SHA-256 of the claiming Begin's attempt id, kept with the lease (replacing the last
    /// lease's, `NULL` without one).
    pub attempt: Option<AttemptDigest>,
}

/// Another operation with the same request, for [`JournalStore::find_same_request`].
#[derive(Debug, Clone)]
pub struct SameRequest {
    /// Tenant namespace.
    pub namespace: Namespace,
    /// The action type.
    pub action_type: ActionType,
    /// The request hash.
    pub request_hash: RequestHash,
    /// The operation asking, never answered.
    pub other_than: OperationKey,
    /// How long ago a succeeded operation still counts.
    pub window: Duration,
}

/// Filters and position in the review queue, for [`JournalStore::list_review`].
#[derive(Debug, Clone)]
pub struct ReviewQuery {
    /// Tenant namespace.
    pub namespace: Namespace,
    /// Only this action type.
    pub action_type: Option<ActionType>,
    /// Only operations escalated at least this long ago (zero: every one).
    pub min_age: Duration,
    /// Continue after this (review_required_at, operation_key) position.
    pub after: Option<(DateTime<Utc>, String)>,
    /// At most this many rows.
    pub limit: i64,
}

/// Operations by the provider's id or a business reference, for [`JournalStore::search`];
/// the filters that are set must all match.
#[derive(Debug, Clone)]
pub struct SearchQuery {
    /// Tenant namespace.
    pub namespace: Namespace,
    /// Only operations with this external id.
    pub external_id: Option<String>,
    /// Only operations whose business reference of this name has this value.
    pub reference: Option<(String, String)>,
    /// At most this many rows.
    pub limit: i64,
}

/// How many operations of one namespace are in a state, and since when the oldest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StateCount {
    /// How many.
    pub count: i64,
    /// The oldest one's time (what it is depends on the state: see [`QueueStats`]); `None`
    /// when there are none.
    pub oldest: Option<DateTime<Utc>>,
}

/// One namespace's work in flight and waiting, for [`JournalStore::queue_stats`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueStats {
    /// Unknown operations, oldest by when the outcome became unknown.
    pub unknown: StateCount,
    /// In-progress operations, oldest by their last claim or lease renewal.
    pub in_progress: StateCount,
    /// Unknown operations due for a provider lookup now, oldest by when it fell due.
    pub due: StateCount,
    /// Operations waiting for review, oldest by escalation.
    pub review: StateCount,
    /// The database clock when they were counted.
    pub observed_at: DateTime<Utc>,
}

/// One operation's history page, for [`JournalStore::history`].
#[derive(Debug, Clone)]
pub struct HistoryQuery {
    /// Tenant namespace.
    pub namespace: Namespace,
    /// The operation.
    pub operation_key: OperationKey,
    /// Continue after this event id (0: from the start).
    pub after_event_id: i64,
    /// At most this many events.
    pub limit: i64,
}

/// [`JournalMaintenance::backlog_stats`] feeds the backlog gauges.
#[async_trait]
impl<T: JournalMaintenance + ?Sized> crate::telemetry::metrics::BacklogSource for T {
    type Error = StoreError;

    async fn backlog(&self) -> Result<BacklogStats, StoreError> {
        self.backlog_stats().await
    }
}

/// The journal's storage contract.
#[async_trait]
pub trait JournalStore: JournalMaintenance + EscalationOutbox {
    /// Registers `new`: inserts it already `in_progress` with attempt 1 and its lease, or,
    /// when the key already exists, answers its row in the same call: [`Registration::Inserted`] with the
    /// new row, [`Registration::Existing`] with the existing row (nothing is changed), or
    /// [`Registration::Raced`] when the existing row could not be read (see there).
    async fn register(&self, new: &NewOperation) -> Result<Registration, StoreError>;

    /// The clock this store's statements read: the database's unless a test moved it. The
    /// journal keeps what it caches about a lease by the same clock.
    fn clock(&self) -> &Clock;

    /// Reads one operation with the database clock.
    async fn get(
        &self,
        namespace: &Namespace,
        key: &OperationKey,
    ) -> Result<Option<OperationRecord>, StoreError>;

    /// Grants a new lease on an existing operation if it is still as the claim expects (and,
    /// for `in_progress`, its lease has ended): attempt + 1.
    async fn claim(&self, claim: &Claim) -> Result<Option<OperationRecord>, StoreError>;

    /// Applies a lease holder's report if the token's lease is still the row's (same attempt
    /// and lease id) and the row is in a status the report may leave, and answers the row
    /// with the status it left; `None` when the report does not apply (nothing is changed).
    ///
    /// SQLite reads the row, then settles (the status read may be older than the one the
    /// report changed if another writer came in between, as when the caller reads first).
    /// Postgres answers in one statement, from the row version it changed.
    async fn settle(
        &self,
        token: &LeaseToken,
        settlement: &Settlement,
    ) -> Result<Option<Settled>, StoreError>;

    /// Extends a live lease held by `token` to `lease` from now.
    async fn renew(
        &self,
        token: &LeaseToken,
        lease: Duration,
    ) -> Result<Option<OperationRecord>, StoreError>;

    /// Lists operations newest first.
    async fn list(&self, query: &ListQuery) -> Result<Vec<OperationRecord>, StoreError>;

    /// Applies a resolution (from a lookup or a reviewer) if the row is still as `expected`
    /// was read (same status and attempt; an `in_progress` row only once its lease has
    /// ended), recording `attribution` in the history. [`Lookup::Made`] counts a provider
    /// lookup in `reconcile_attempts`.
    async fn resolve(
        &self,
        expected: &OperationRecord,
        resolution: &Resolution,
        attribution: &Attribution,
        lookup: Lookup,
    ) -> Result<Option<OperationRecord>, StoreError>;

    /// Moves up to `limit` `in_progress` rows whose lease has ended to `unknown`, due for a
    /// lookup now; returns how many moved. Live leases are never touched.
    async fn sweep_expired_leases(&self, limit: i64, worker: &str) -> Result<u64, StoreError>;

    /// Operations waiting for review, oldest escalation first.
    async fn list_review(&self, query: &ReviewQuery) -> Result<Vec<OperationRecord>, StoreError>;

    /// Operations of a namespace with the query's external id and business reference, newest
    /// first. No index serves it: it reads the namespace's operations newest first until it
    /// has `limit` matches (an operator's search, not a hot path).
    async fn search(&self, query: &SearchQuery) -> Result<Vec<OperationRecord>, StoreError>;

    /// Counts a namespace's unknown, in-progress, due and escalated operations and finds the
    /// oldest of each, in one read through the partial indexes of those states.
    async fn queue_stats(&self, namespace: &Namespace) -> Result<QueueStats, StoreError>;

    /// An operation's history, oldest first.
    async fn history(&self, query: &HistoryQuery) -> Result<Vec<OperationEvent>, StoreError>;

    /// Claims up to `limit` unknown operations due for a lookup, pushing their next check
    /// `hold` into the future so that no other worker looks them up meanwhile.
    async fn claim_due(
        &self,
        limit: i64,
        hold: Duration,
    ) -> Result<Vec<OperationRecord>, StoreError>;

    /// Takes the reconcile lease of one unknown operation (or one whose lease ended) for
    /// `hold`, so that no worker looks it up meanwhile; `None` when it is not reconcilable or
    /// someone is already looking it up.
    async fn claim_for_reconcile(
        &self,
        namespace: &Namespace,
        key: &OperationKey,
        hold: Duration,
    ) -> Result<Option<OperationRecord>, StoreError>;

    /// The key of another operation in the namespace with the same action type and request
    /// hash that is pending, in progress or unknown, or succeeded less than `window` ago;
    /// `None` also when `other_than` is registered itself (a retry of an existing operation
    /// is not a new intent).
    async fn find_same_request(&self, query: &SameRequest) -> Result<Option<String>, StoreError>;
}

/// The journal's upkeep, apart from its operations: retention, readiness, the backlog
/// gauges and planner statistics. Every store offers both.
#[async_trait]
pub trait JournalMaintenance: Send + Sync + 'static {
    /// Deletes up to `limit` terminal operations whose retention has passed, with their
    /// history and their escalation events; returns how many went. Pending, in-progress and unknown operations are never
    /// deleted, whatever their age.
    async fn purge(&self, limit: i64) -> Result<u64, StoreError>;

    /// Checks that the database answers.
    async fn ping(&self) -> Result<(), StoreError>;

    /// Counts the unknown operations and the review queue and measures the oldest unknown
    /// operation's age, in one read that indexes answer (never a scan of terminal rows).
    /// Meant to be sampled every few seconds, not per request.
    async fn backlog_stats(&self) -> Result<BacklogStats, StoreError>;

    /// Gathers planner statistics for the journal's tables that have never had any, once at
    /// least `min_changes` rows of them have changed. Returns how many tables it analyzed, or
    /// `None` when every table already has statistics (there will be nothing more to do).
    ///
    /// A new journal's statements are otherwise planned without statistics, and on Postgres
    /// key lookups may then walk a whole namespace through another index until autovacuum's
    /// first analyze (docs/performance.md). Tables analyzed once are left to autovacuum.
    /// Backends whose planner needs no help answer `None`.
    async fn analyze_new_tables(&self, min_changes: i64) -> Result<Option<u64>, StoreError>;
}
