//! Protobuf messages -> output rows: what an operator sees, in text or JSON.
//!
//! Enum values are spelled in lowercase as in the database (`in_progress`), times are
//! RFC 3339 UTC, and a field the server left unset is `None` (`null` in JSON, `-` in text).
//! A value this client does not know (a newer server) is shown as `unrecognized`, never
//! guessed.

use std::collections::BTreeMap;

use chrono::{DateTime, SecondsFormat, Utc};
use serde::{Serialize, Serializer};

use opjournal_client::ClientError;

use crate::api::convert::status_from_proto;
use crate::proto;

/// The spelling of an enum value this client does not know.
pub const UNRECOGNIZED: &str = "unrecognized";

/// One operation as listed: everything but the stored result.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct OperationRow {
    /// Tenant namespace.
    pub namespace: String,
    /// The idempotency key.
    pub operation_key: String,
    /// The action type.
    pub action_type: String,
    /// `pending`, `in_progress`, `unknown`, `succeeded` or `failed_final`.
    pub status: &'static str,
    /// How many leases have been granted; `resolve --expected-attempt` takes this value.
    pub attempt_count: i32,
    /// The provider's id of the effect.
    pub external_id: Option<String>,
    /// The last failure or unknown-outcome code.
    pub error_code: Option<String>,
    /// SHA-256 of the canonical request, 64 lowercase hex.
    pub request_hash: String,
    /// Business links such as `order_id`.
    pub references: BTreeMap<String, String>,
    /// When the current lease ends.
    #[serde(serialize_with = "rfc3339")]
    pub lease_until: Option<DateTime<Utc>>,
    /// When the reconcile worker will next look the operation up.
    #[serde(serialize_with = "rfc3339")]
    pub next_check_at: Option<DateTime<Utc>>,
    /// How many provider lookups the reconcile path has made.
    pub reconcile_attempts: i32,
    /// When the operation was escalated to human review.
    #[serde(serialize_with = "rfc3339")]
    pub review_required_at: Option<DateTime<Utc>>,
    /// Why it was escalated.
    pub review_reason: Option<String>,
    /// When the intent was registered.
    #[serde(serialize_with = "rfc3339")]
    pub created_at: Option<DateTime<Utc>>,
    /// When the record last changed.
    #[serde(serialize_with = "rfc3339")]
    pub updated_at: Option<DateTime<Utc>>,
}

impl From<&proto::Operation> for OperationRow {
    fn from(op: &proto::Operation) -> Self {
        Self {
            namespace: op.namespace.clone(),
            operation_key: op.operation_key.clone(),
            action_type: op.action_type.clone(),
            status: status_name(op.status),
            attempt_count: op.attempt_count,
            external_id: op.external_id.clone(),
            error_code: op.error_code.clone(),
            request_hash: op.request_hash.clone(),
            references: op.references.clone().into_iter().collect(),
            lease_until: time(op.lease_until.as_ref()),
            next_check_at: time(op.next_check_at.as_ref()),
            reconcile_attempts: op.reconcile_attempts,
            review_required_at: time(op.review_required_at.as_ref()),
            review_reason: non_empty(&op.review_reason),
            created_at: time(op.created_at.as_ref()),
            updated_at: time(op.updated_at.as_ref()),
        }
    }
}

/// One operation as shown by `show`: the row plus the stored result.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct OperationDetail {
    /// The listed fields.
    #[serde(flatten)]
    pub row: OperationRow,
    /// The stored result as canonical JSON text; `None` when no result was recorded.
    pub result_json: Option<String>,
}

impl From<&proto::Operation> for OperationDetail {
    fn from(op: &proto::Operation) -> Self {
        Self {
            row: op.into(),
            result_json: op.result_json.clone(),
        }
    }
}

/// One transition in an operation's history.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EventRow {
    /// Increasing id; the order of events.
    pub event_id: i64,
    /// When, by the database clock.
    #[serde(serialize_with = "rfc3339")]
    pub occurred_at: Option<DateTime<Utc>>,
    /// The status before; `None` for the registration.
    pub from_status: Option<&'static str>,
    /// The status after.
    pub to_status: &'static str,
    /// The attempt count after.
    pub attempt_count: i32,
    /// `client`, `worker` or `reviewer`.
    pub actor_kind: &'static str,
    /// Which worker or reviewer; `None` for anonymous clients.
    pub actor: Option<String>,
    /// An error code, an observation, or a reviewer's reason.
    pub reason: Option<String>,
    /// Whether the operation was left waiting for review.
    pub review_required: bool,
}

impl From<&proto::OperationEvent> for EventRow {
    fn from(event: &proto::OperationEvent) -> Self {
        Self {
            event_id: event.event_id,
            occurred_at: time(event.occurred_at.as_ref()),
            from_status: match proto::OperationStatus::try_from(event.from_status) {
                Ok(proto::OperationStatus::Unspecified) => None,
                _ => Some(status_name(event.from_status)),
            },
            to_status: status_name(event.to_status),
            attempt_count: event.attempt_count,
            actor_kind: actor_kind_name(event.actor_kind),
            actor: non_empty(&event.actor),
            reason: non_empty(&event.reason),
            review_required: event.review_required,
        }
    }
}

/// What `reconcile` saw and did.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ReconcileRow {
    /// The record after the observation was applied.
    pub operation: OperationRow,
    /// What the provider adapter saw; `None` when no lookup was made.
    pub observation: Option<ObservationRow>,
    /// What was done: `marked_succeeded`, `marked_failed`, `released_for_retry`,
    /// `kept_unknown`, `superseded` or `escalated`.
    pub action: &'static str,
}

impl TryFrom<&proto::ReconcileOperationResponse> for ReconcileRow {
    type Error = ClientError;

    /// Errors: `INTERNAL` (no `ErrorInfo`) when the response has no operation.
    fn try_from(reconciled: &proto::ReconcileOperationResponse) -> Result<Self, ClientError> {
        let operation = reconciled.operation.as_ref().ok_or_else(|| {
            ClientError::from(tonic::Status::internal(
                "the server's response has no ReconcileOperationResponse.operation",
            ))
        })?;
        Ok(Self {
            operation: operation.into(),
            observation: reconciled.observation.as_ref().map(ObservationRow::from),
            action: action_name(reconciled.action),
        })
    }
}

/// A provider adapter's answer to a lookup.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ObservationRow {
    /// `succeeded`, `failed`, `pending`, `not_found`, `definitively_absent` or `lookup_failed`.
    pub outcome: &'static str,
    /// The provider's id of the effect, when found.
    pub external_id: Option<String>,
    /// A short code describing a failed lookup or a failed operation.
    pub detail_code: Option<String>,
}

impl From<&proto::Observation> for ObservationRow {
    fn from(observation: &proto::Observation) -> Self {
        Self {
            outcome: outcome_name(observation.outcome),
            external_id: non_empty(&observation.external_id),
            detail_code: non_empty(&observation.detail_code),
        }
    }
}

/// The database spelling of a protobuf `OperationStatus` value.
pub fn status_name(value: i32) -> &'static str {
    match proto::OperationStatus::try_from(value).map(status_from_proto) {
        Ok(Some(status)) => status.as_str(),
        Ok(None) => "unspecified",
        Err(_) => UNRECOGNIZED,
    }
}

/// The spelling of a protobuf `ActorKind` value.
pub fn actor_kind_name(value: i32) -> &'static str {
    match proto::ActorKind::try_from(value) {
        Ok(proto::ActorKind::Client) => "client",
        Ok(proto::ActorKind::Worker) => "worker",
        Ok(proto::ActorKind::Reviewer) => "reviewer",
        Ok(proto::ActorKind::Unspecified) => "unspecified",
        Err(_) => UNRECOGNIZED,
    }
}

/// The spelling of a protobuf `ObservationOutcome` value.
pub fn outcome_name(value: i32) -> &'static str {
    use proto::ObservationOutcome as O;
    match O::try_from(value) {
        Ok(O::Succeeded) => "succeeded",
        Ok(O::Failed) => "failed",
        Ok(O::Pending) => "pending",
        Ok(O::NotFound) => "not_found",
        Ok(O::DefinitivelyAbsent) => "definitively_absent",
        Ok(O::LookupFailed) => "lookup_failed",
        Ok(O::Unspecified) => "unspecified",
        Err(_) => UNRECOGNIZED,
    }
}

/// The spelling of a protobuf `ReconcileAction` value.
pub fn action_name(value: i32) -> &'static str {
    use proto::ReconcileAction as A;
    match A::try_from(value) {
        Ok(A::MarkedSucceeded) => "marked_succeeded",
        Ok(A::MarkedFailed) => "marked_failed",
        Ok(A::ReleasedForRetry) => "released_for_retry",
        Ok(A::KeptUnknown) => "kept_unknown",
        Ok(A::Superseded) => "superseded",
        Ok(A::Escalated) => "escalated",
        Ok(A::Unspecified) => "unspecified",
        Err(_) => UNRECOGNIZED,
    }
}

/// A protobuf timestamp as a UTC time; `None` when unset or out of range.
pub fn time(timestamp: Option<&prost_types::Timestamp>) -> Option<DateTime<Utc>> {
    let t = timestamp?;
    DateTime::from_timestamp(t.seconds, u32::try_from(t.nanos).ok()?)
}

/// A time as RFC 3339 UTC with microseconds (the database's precision).
pub fn format_time(time: &DateTime<Utc>) -> String {
    time.to_rfc3339_opts(SecondsFormat::Micros, true)
}

fn rfc3339<S: Serializer>(time: &Option<DateTime<Utc>>, serializer: S) -> Result<S::Ok, S::Error> {
    match time {
        Some(time) => serializer.serialize_str(&format_time(time)),
        None => serializer.serialize_none(),
    }
}

fn non_empty(value: &str) -> Option<String> {
    (!value.is_empty()).then(|| value.to_owned())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn statuses_are_spelled_as_in_the_database() {
        assert_eq!(
            status_name(proto::OperationStatus::InProgress.into()),
            "in_progress"
        );
        assert_eq!(
            status_name(proto::OperationStatus::FailedFinal.into()),
            "failed_final"
        );
        assert_eq!(status_name(99), UNRECOGNIZED);
    }

    #[test]
    fn the_registration_event_has_no_from_status_and_empty_fields_are_null() {
        let event = proto::OperationEvent {
            event_id: 7,
            to_status: proto::OperationStatus::InProgress.into(),
            attempt_count: 1,
            actor_kind: proto::ActorKind::Client.into(),
            occurred_at: Some(prost_types::Timestamp {
                seconds: 1_700_000_000,
                nanos: 5_000,
            }),
            ..Default::default()
        };
        let json = serde_json::to_value(EventRow::from(&event)).unwrap();
        assert_eq!(json["from_status"], serde_json::Value::Null);
        assert_eq!(json["to_status"], "in_progress");
        assert_eq!(json["actor_kind"], "client");
        assert_eq!(json["actor"], serde_json::Value::Null);
        assert_eq!(json["occurred_at"], "2023-11-14T22:13:20.000005Z");
    }
}
