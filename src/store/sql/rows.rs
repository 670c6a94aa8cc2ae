//! Decoding: the rows both backends return, read with `derive(FromRow)` and made domain
//! types through `TryFrom`, refusing what the journal could not have written.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use uuid::Uuid;

use crate::domain::canonical::RequestHash;
use crate::domain::escalation::{EscalationEvent, EventType};
use crate::domain::lease::AttemptDigest;
use crate::domain::model::{
    ActionType, ActorKind, Namespace, OperationEvent, OperationKey, OperationRecord, Status,
};
use crate::store::error::StoreError;
use crate::store::outbox::{DeliveryState, OutboxEntry};
use crate::store::{Registration, Settled};

/// The error for a row the journal could not have written; `what` names the column.
pub(super) fn corrupt(what: &str) -> StoreError {
    StoreError::Other(format!("corrupt journal row: {what}").into())
}

/// A stored status.
pub(super) fn status(value: &str) -> Result<Status, StoreError> {
    Status::from_db(value).ok_or_else(|| corrupt("status"))
}

/// A journal row as both backends return it (`{@columns}`), with what `register` and `settle`
/// answer besides.
#[derive(Debug, sqlx::FromRow)]
pub(super) struct OperationRow {
    pub(super) namespace: String,
    pub(super) operation_key: String,
    action_type: String,
    request_hash: String,
    status: String,
    attempt_count: i32,
    external_id: Option<String>,
    result_json: Option<String>,
    error_code: Option<String>,
    lease_until: Option<DateTime<Utc>>,
    lease_id: Option<String>,
    lease_attempt_sha256: Option<String>,
    business_references: String,
    unknown_since: Option<DateTime<Utc>>,
    next_check_at: Option<DateTime<Utc>>,
    reconcile_attempts: i32,
    created_at: DateTime<Utc>,
    updated_at: DateTime<Utc>,
    review_required_at: Option<DateTime<Utc>>,
    review_reason: Option<String>,
    last_actor_kind: String,
    action_policy: Option<String>,
    trace_context: Option<String>,
    observed_at: DateTime<Utc>,
    /// `register` only: whether it inserted the row.
    #[sqlx(default)]
    inserted: bool,
    /// `settle` on Postgres only: the status the report left.
    #[sqlx(default)]
    previous_status: Option<String>,
}

impl OperationRow {
    /// What `register` answers with this row.
    pub(super) fn registration(self) -> Result<Registration, StoreError> {
        let inserted = self.inserted;
        let record = self.try_into()?;
        Ok(match inserted {
            true => Registration::Inserted(record),
            false => Registration::Existing(record),
        })
    }

    /// What `settle` answers with this row: the status it left is the one the row answers,
    /// else `before` (read first).
    pub(super) fn settled(self, before: Option<Status>) -> Result<Settled, StoreError> {
        let answered = self.previous_status.as_deref().map(status).transpose()?;
        let previous = answered
            .or(before)
            .ok_or_else(|| corrupt("previous_status"))?;
        let record = self.try_into()?;
        Ok(Settled { record, previous })
    }
}

impl TryFrom<OperationRow> for OperationRecord {
    type Error = StoreError;

    fn try_from(row: OperationRow) -> Result<Self, StoreError> {
        let lease_id = row.lease_id.as_deref().map(Uuid::parse_str);
        Ok(OperationRecord {
            namespace: Namespace::parse(&row.namespace).map_err(|_| corrupt("namespace"))?,
            operation_key: OperationKey::parse(&row.operation_key)
                .map_err(|_| corrupt("operation_key"))?,
            action_type: ActionType::parse(&row.action_type).map_err(|_| corrupt("action_type"))?,
            request_hash: RequestHash::from_hex(&row.request_hash)
                .ok_or_else(|| corrupt("request_hash"))?,
            status: status(&row.status)?,
            attempt_count: row.attempt_count,
            lease_id: lease_id.transpose().map_err(|_| corrupt("lease_id"))?,
            lease_until: row.lease_until,
            lease_attempt: match row.lease_attempt_sha256.as_deref() {
                Some(hex) => Some(
                    AttemptDigest::from_hex(hex).ok_or_else(|| corrupt("lease_attempt_sha256"))?,
                ),
                None => None,
            },
            external_id: row.external_id,
            result_json: row.result_json,
            error_code: row.error_code,
            references: serde_json::from_str::<BTreeMap<String, String>>(&row.business_references)
                .map_err(|_| corrupt("business_references"))?,
            unknown_since: row.unknown_since,
            next_check_at: row.next_check_at,
            reconcile_attempts: row.reconcile_attempts,
            review_required_at: row.review_required_at,
            review_reason: row.review_reason,
            // A policy recorded by a newer version may not parse here: fall back to the
            // current file for it rather than fail the operation.
            action_policy: row
                .action_policy
                .and_then(|text| serde_json::from_str(&text).ok()),
            last_actor_kind: ActorKind::from_db(&row.last_actor_kind)
                .ok_or_else(|| corrupt("last_actor_kind"))?,
            trace_context: row.trace_context,
            created_at: row.created_at,
            updated_at: row.updated_at,
            observed_at: row.observed_at,
        })
    }
}

/// An event of an operation's history as both backends return it (`history.sql`).
#[derive(Debug, sqlx::FromRow)]
pub(super) struct EventRow {
    event_id: i64,
    from_status: Option<String>,
    to_status: String,
    attempt_count: i32,
    review: bool,
    actor_kind: String,
    actor: String,
    reason: Option<String>,
    occurred_at: DateTime<Utc>,
}

impl TryFrom<EventRow> for OperationEvent {
    type Error = StoreError;

    fn try_from(row: EventRow) -> Result<Self, StoreError> {
        Ok(OperationEvent {
            event_id: row.event_id,
            from_status: row.from_status.as_deref().map(status).transpose()?,
            to_status: status(&row.to_status)?,
            attempt_count: row.attempt_count,
            review_required: row.review,
            actor_kind: ActorKind::from_db(&row.actor_kind).ok_or_else(|| corrupt("actor_kind"))?,
            actor: row.actor,
            reason: row.reason,
            occurred_at: row.occurred_at,
        })
    }
}

/// An outbox row as both backends return it (`{@outbox_columns}`).
#[derive(Debug, sqlx::FromRow)]
pub(super) struct OutboxRow {
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
