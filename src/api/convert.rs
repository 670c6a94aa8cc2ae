//! Domain records -> protobuf messages.

use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::domain::model::{ActorKind, OperationEvent, OperationRecord, Status};
use crate::journal::BeginRequest;
use crate::proto;
use crate::reconcile::{Observation, ReconcileAction};

/// A protobuf timestamp from a database time.
pub fn timestamp(time: DateTime<Utc>) -> prost_types::Timestamp {
    prost_types::Timestamp {
        seconds: time.timestamp(),
        // Always below 2e9, so it fits.
        nanos: i32::try_from(time.timestamp_subsec_nanos()).unwrap_or(0),
    }
}

/// A protobuf duration, whole milliseconds.
pub fn duration(d: Duration) -> prost_types::Duration {
    prost_types::Duration {
        seconds: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        nanos: i32::try_from(d.subsec_millis() * 1_000_000).unwrap_or(0),
    }
}

/// The protobuf status of a domain status.
pub fn status_to_proto(status: Status) -> proto::OperationStatus {
    match status {
        Status::Pending => proto::OperationStatus::Pending,
        Status::InProgress => proto::OperationStatus::InProgress,
        Status::Unknown => proto::OperationStatus::Unknown,
        Status::Succeeded => proto::OperationStatus::Succeeded,
        Status::FailedFinal => proto::OperationStatus::FailedFinal,
    }
}

/// The domain status of a protobuf filter; `None` for UNSPECIFIED.
pub fn status_from_proto(status: proto::OperationStatus) -> Option<Status> {
    match status {
        proto::OperationStatus::Unspecified => None,
        proto::OperationStatus::Pending => Some(Status::Pending),
        proto::OperationStatus::InProgress => Some(Status::InProgress),
        proto::OperationStatus::Unknown => Some(Status::Unknown),
        proto::OperationStatus::Succeeded => Some(Status::Succeeded),
        proto::OperationStatus::FailedFinal => Some(Status::FailedFinal),
    }
}

/// The protobuf message of a record.
pub fn operation(record: &OperationRecord) -> proto::Operation {
    proto::Operation {
        namespace: record.namespace.to_string(),
        operation_key: record.operation_key.to_string(),
        action_type: record.action_type.to_string(),
        request_hash: record.request_hash.to_hex(),
        status: status_to_proto(record.status).into(),
        attempt_count: record.attempt_count,
        external_id: record.external_id.clone(),
        result_json: record.result_json.clone(),
        error_code: record.error_code.clone(),
        lease_until: record.lease_until.map(timestamp),
        created_at: Some(timestamp(record.created_at)),
        updated_at: Some(timestamp(record.updated_at)),
        references: record.references.clone().into_iter().collect(),
        next_check_at: record.next_check_at.map(timestamp),
        reconcile_attempts: record.reconcile_attempts,
        review_required_at: record.review_required_at.map(timestamp),
        review_reason: record.review_reason.clone().unwrap_or_default(),
        provider_key: record.provider_key(),
    }
}

/// The protobuf message of an observation.
pub fn observation(observation: &Observation) -> proto::Observation {
    use proto::ObservationOutcome as O;
    let (outcome, external_id, detail_code) = match observation {
        Observation::Succeeded { external_id, .. } => (
            O::Succeeded,
            external_id.clone().unwrap_or_default(),
            String::new(),
        ),
        Observation::Failed { code } => (O::Failed, String::new(), code.clone()),
        Observation::Pending => (O::Pending, String::new(), String::new()),
        Observation::NotFound { .. } => (O::NotFound, String::new(), String::new()),
        Observation::LookupFailed { code } => (O::LookupFailed, String::new(), code.clone()),
    };
    proto::Observation {
        outcome: outcome.into(),
        external_id,
        detail_code,
    }
}

/// The protobuf message of a reconcile action; a release means the absence was definitive.
pub fn reconcile_action(action: ReconcileAction) -> proto::ReconcileAction {
    match action {
        ReconcileAction::MarkedSucceeded => proto::ReconcileAction::MarkedSucceeded,
        ReconcileAction::MarkedFailed => proto::ReconcileAction::MarkedFailed,
        ReconcileAction::ReleasedForRetry => proto::ReconcileAction::ReleasedForRetry,
        ReconcileAction::KeptUnknown => proto::ReconcileAction::KeptUnknown,
        ReconcileAction::Superseded => proto::ReconcileAction::Superseded,
        ReconcileAction::Escalated => proto::ReconcileAction::Escalated,
    }
}

/// The protobuf message of a history entry.
pub fn event(event: &OperationEvent) -> proto::OperationEvent {
    proto::OperationEvent {
        event_id: event.event_id,
        from_status: event
            .from_status
            .map(status_to_proto)
            .unwrap_or(proto::OperationStatus::Unspecified)
            .into(),
        to_status: status_to_proto(event.to_status).into(),
        attempt_count: event.attempt_count,
        review_required: event.review_required,
        actor_kind: match event.actor_kind {
            ActorKind::Client => proto::ActorKind::Client,
            ActorKind::Worker => proto::ActorKind::Worker,
            ActorKind::Reviewer => proto::ActorKind::Reviewer,
        }
        .into(),
        actor: event.actor.clone(),
        reason: event.reason.clone().unwrap_or_default(),
        occurred_at: Some(timestamp(event.occurred_at)),
    }
}

impl From<proto::BeginOperationRequest> for BeginRequest {
    fn from(r: proto::BeginOperationRequest) -> Self {
        Self {
            namespace: r.namespace,
            operation_key: r.operation_key,
            action_type: r.action_type,
            payload_json: r.payload_json,
            lease_seconds: r.lease_seconds,
            references: r.references,
            confirm_duplicate_intent: r.confirm_duplicate_intent,
            attempt_id: r.attempt_id,
            trace_context: None,
        }
    }
}
