//! The escalation outbox: the events a webhook receives, written by the journal's own trigger
//! in the transaction of each escalation and resolution (`domain::escalation::event_for`),
//! and their delivery state. Claims and records follow the journal's leases: a claim pushes
//! a due event's next attempt past a short claim lease (with `FOR UPDATE SKIP LOCKED` on
//! Postgres, under SQLite's one writer), and a record applies only to the attempt its worker
//! claimed, so two workers never deliver one event at once and a late worker's answer never
//! overwrites a newer attempt's.

use std::collections::BTreeMap;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::StoreError;
use super::sql::{Dialect, SqlStore, Statement, args, corrupt, file, status};
use crate::domain::escalation::{EscalationEvent, EventType};
use crate::domain::model::{ActorKind, Namespace, OperationKey};
pub use crate::telemetry::metrics::OutboxStats;

/// Where an event's delivery stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeliveryState {
    /// Not yet delivered: due at `next_attempt_at` (or being attempted until then).
    Pending,
    /// A 2xx answer was received.
    Delivered,
    /// Given up after its max age; kept and counted.
    Dead,
}

impl DeliveryState {
    /// The stored name: `pending`, `delivered`, `dead`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Delivered => "delivered",
            Self::Dead => "dead",
        }
    }

    fn from_db(value: &str) -> Option<Self> {
        Some(match value {
            "pending" => Self::Pending,
            "delivered" => Self::Delivered,
            "dead" => Self::Dead,
            _ => return None,
        })
    }
}

/// An event of the outbox with its delivery state.
#[derive(Debug, Clone, PartialEq)]
pub struct OutboxEntry {
    /// The event, as every attempt sends it.
    pub event: EscalationEvent,
    /// Where its delivery stands.
    pub state: DeliveryState,
    /// Attempts made (claimed) so far.
    pub attempts: i32,
    /// When it is due next (while pending; during an attempt, the end of its claim).
    pub next_attempt_at: DateTime<Utc>,
    /// When the last attempt started.
    pub last_attempt_at: Option<DateTime<Utc>>,
    /// The HTTP status of the last answer, if one came.
    pub last_status_code: Option<u16>,
    /// Why the last attempt failed (`timeout`, `connect`, `http_503`, ...).
    pub last_error: Option<String>,
    /// When it was delivered or given up.
    pub finished_at: Option<DateTime<Utc>>,
    /// The database clock when this was read.
    pub observed_at: DateTime<Utc>,
}

/// How a claimed attempt ended, for [`EscalationOutbox::record_delivery`].
#[derive(Debug, Clone, PartialEq)]
pub enum DeliveryOutcome {
    /// The receiver answered 2xx.
    Delivered {
        /// Its status code.
        status_code: u16,
    },
    /// It failed; try again after `retry_after`.
    Failed {
        /// The status code, if an answer came.
        status_code: Option<u16>,
        /// A short machine code (at most 100 characters).
        error: String,
        /// Delay before the next attempt.
        retry_after: Duration,
    },
    /// It failed and the event is past its max age: give up.
    Dead {
        /// The status code, if an answer came.
        status_code: Option<u16>,
        /// A short machine code (at most 100 characters).
        error: String,
    },
}

/// The outbox's storage contract; every journal store offers it.
#[async_trait]
pub trait EscalationOutbox: Send + Sync + 'static {
    /// Claims up to `limit` pending events due now, oldest schedule first: each one's
    /// attempt count goes up by one and its next attempt moves `lease` ahead, so no other
    /// worker claims it until then. Answers them with the attempt each was claimed as.
    async fn claim_deliveries(
        &self,
        limit: i64,
        lease: Duration,
    ) -> Result<Vec<OutboxEntry>, StoreError>;

    /// Records how attempt `attempt` of event `event_id` ended, if that attempt is still the
    /// event's latest and it is pending; `false` when it no longer is (its claim ran out and
    /// another worker claimed it again), and nothing is changed.
    async fn record_delivery(
        &self,
        event_id: Uuid,
        attempt: i32,
        outcome: &DeliveryOutcome,
    ) -> Result<bool, StoreError>;

    /// An operation's events with their delivery state, oldest first.
    async fn deliveries(
        &self,
        namespace: &Namespace,
        key: &OperationKey,
    ) -> Result<Vec<OutboxEntry>, StoreError>;

    /// Pending and dead events, and the oldest pending event's age (by the database clock).
    async fn outbox_stats(&self) -> Result<OutboxStats, StoreError>;
}

/// The outbox statements of a store, rendered once, by the method that sends them.
#[derive(Debug)]
pub(super) struct Statements {
    claim_deliveries: Statement,
    record_delivery: Statement,
    deliveries: Statement,
    outbox_stats: Statement,
}

impl Statements {
    pub(super) fn new<D: Dialect>() -> Self {
        Self {
            claim_deliveries: file!(D "UPDATE" claim_deliveries own),
            record_delivery: file!(D "UPDATE" record_delivery),
            deliveries: file!(D "SELECT" deliveries),
            outbox_stats: file!(D "SELECT" outbox_stats),
        }
    }
}

#[async_trait]
impl<D: Dialect> EscalationOutbox for SqlStore<D> {
    async fn claim_deliveries(
        &self,
        limit: i64,
        lease: Duration,
    ) -> Result<Vec<OutboxEntry>, StoreError> {
        let statement = &self.statements.outbox.claim_deliveries;
        let claim = self.decoded::<OutboxRow, _>(statement, args![limit, lease]);
        self.run(statement, claim).await
    }

    async fn record_delivery(
        &self,
        event_id: Uuid,
        attempt: i32,
        outcome: &DeliveryOutcome,
    ) -> Result<bool, StoreError> {
        let (state, code, error, after) = match outcome {
            DeliveryOutcome::Delivered { status_code } => {
                (DeliveryState::Delivered, Some(*status_code), None, None)
            }
            DeliveryOutcome::Failed {
                status_code,
                error,
                retry_after,
            } => (
                DeliveryState::Pending,
                *status_code,
                Some(error),
                Some(*retry_after),
            ),
            DeliveryOutcome::Dead { status_code, error } => {
                (DeliveryState::Dead, *status_code, Some(error), None)
            }
        };
        let error = error.map(|e| e.chars().take(100).collect::<String>());
        let code = i64::from(code.unwrap_or(0));
        let args = args![
            event_id,
            attempt,
            state.as_str(),
            code,
            error,
            after.unwrap_or_default()
        ];
        let statement = &self.statements.outbox.record_delivery;
        let args = self.args(statement, args);
        let record = D::execute(&self.pool, &statement.sql, args);
        let record = async { Ok(record.await? == 1) };
        self.run(statement, record).await
    }

    async fn deliveries(
        &self,
        namespace: &Namespace,
        key: &OperationKey,
    ) -> Result<Vec<OutboxEntry>, StoreError> {
        let statement = &self.statements.outbox.deliveries;
        let args = args![namespace.as_str(), key.as_str()];
        let read = self.decoded::<OutboxRow, _>(statement, args);
        self.run(statement, read).await
    }

    async fn outbox_stats(&self) -> Result<OutboxStats, StoreError> {
        let statement = &self.statements.outbox.outbox_stats;
        let read = async {
            let row = self.rows(statement, Vec::new()).await?.pop();
            let (pending, oldest, dead) = row.ok_or_else(|| corrupt("outbox"))?;
            Ok(OutboxStats::from_columns(pending, oldest, dead))
        };
        self.run(statement, read).await
    }
}

/// An outbox row as both backends return it (`{@outbox_columns}`).
#[derive(Debug, sqlx::FromRow)]
struct OutboxRow {
    event_id: String,
    event_type: String,
    occurred_at: DateTime<Utc>,
    namespace: String,
    operation_key: String,
    action_type: String,
    status: String,
    attempt_count: i32,
    reason: Option<String>,
    actor_kind: String,
    actor: String,
    business_references: String,
    state: String,
    attempts: i32,
    next_attempt_at: DateTime<Utc>,
    last_attempt_at: Option<DateTime<Utc>>,
    last_status_code: Option<i32>,
    last_error: Option<String>,
    finished_at: Option<DateTime<Utc>>,
    observed_at: DateTime<Utc>,
}

impl TryFrom<OutboxRow> for OutboxEntry {
    type Error = StoreError;

    fn try_from(row: OutboxRow) -> Result<Self, StoreError> {
        let references: BTreeMap<String, String> =
            serde_json::from_str(&row.business_references)
                .map_err(|_| corrupt("outbox business_references"))?;
        Ok(Self {
            event: EscalationEvent {
                event_id: Uuid::parse_str(&row.event_id).map_err(|_| corrupt("event_id"))?,
                event_type: EventType::from_db(&row.event_type)
                    .ok_or_else(|| corrupt("event_type"))?,
                occurred_at: row.occurred_at,
                namespace: row.namespace,
                operation_key: row.operation_key,
                action_type: row.action_type,
                status: status(&row.status)?,
                attempt_count: row.attempt_count,
                reason: row.reason,
                actor_kind: ActorKind::from_db(&row.actor_kind)
                    .ok_or_else(|| corrupt("outbox actor_kind"))?,
                actor: row.actor,
                references,
            },
            state: DeliveryState::from_db(&row.state).ok_or_else(|| corrupt("outbox state"))?,
            attempts: row.attempts,
            next_attempt_at: row.next_attempt_at,
            last_attempt_at: row.last_attempt_at,
            last_status_code: row.last_status_code.and_then(|c| u16::try_from(c).ok()),
            last_error: row.last_error,
            finished_at: row.finished_at,
            observed_at: row.observed_at,
        })
    }
}
