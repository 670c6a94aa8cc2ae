//! The escalation outbox: the events a webhook receives, written by the journal's own trigger
//! in the transaction of each escalation and resolution (`domain::escalation::event_for`),
//! and their delivery state. Claims and records follow the journal's leases: a claim pushes
//! a due event's next attempt past a short claim lease (with `FOR UPDATE SKIP LOCKED` on
//! Postgres, under SQLite's one writer), and a record applies only to the attempt its worker
//! claimed, so two workers never deliver one event at once and a late worker's answer never
//! overwrites a newer attempt's.

use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::error::StoreError;
use crate::domain::escalation::EscalationEvent;
use crate::domain::model::{Namespace, OperationKey};
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

    /// The state of stored name `value`.
    pub(super) fn from_db(value: &str) -> Option<Self> {
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
