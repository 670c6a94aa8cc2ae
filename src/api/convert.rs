//! Protobuf requests -> the use cases' commands (one `TryFrom` per request, every field
//! parsed here, once), and domain records -> protobuf messages.

use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::domain::error::ErrorReason;
use crate::domain::error::{FieldViolation, JournalError};
use crate::domain::model::{
    ActionType, ActorKind, Attribution, ExternalId, Namespace, OperationEvent, OperationRecord,
    Status,
};
use crate::journal::{
    BeginRequest, Complete, DeriveKey, Fail, ListOperations, OperationRef, Page, Renew,
    ReportUnknown,
};
use crate::proto;
use crate::proto::resolve_operation_request::Resolution as ProtoResolution;
use crate::reconcile::{
    History, Observation, ReconcileAction, Resolve, ReviewDecision, ReviewFilter, ReviewQueue,
};

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

impl TryFrom<proto::BeginOperationRequest> for BeginRequest {
    type Error = JournalError;

    /// Parses the namespace (the rest is validated by `Journal::begin_request`).
    fn try_from(r: proto::BeginOperationRequest) -> Result<Self, JournalError> {
        Ok(Self {
            namespace: Namespace::parse(&r.namespace)?,
            operation_key: r.operation_key,
            action_type: r.action_type,
            payload_json: r.payload_json,
            lease_seconds: r.lease_seconds,
            references: r.references,
            confirm_duplicate_intent: r.confirm_duplicate_intent,
            attempt_id: r.attempt_id,
            trace_context: None,
        })
    }
}

impl TryFrom<proto::CompleteOperationRequest> for Complete {
    type Error = JournalError;

    fn try_from(r: proto::CompleteOperationRequest) -> Result<Self, JournalError> {
        Complete::new(r.lease_token.as_str(), &r.external_id, r.result_json)
    }
}

impl TryFrom<proto::FailOperationRequest> for Fail {
    type Error = JournalError;

    fn try_from(r: proto::FailOperationRequest) -> Result<Self, JournalError> {
        Fail::new(r.lease_token.as_str(), &r.error_code)
    }
}

impl TryFrom<proto::ReportUnknownOutcomeRequest> for ReportUnknown {
    type Error = JournalError;

    fn try_from(r: proto::ReportUnknownOutcomeRequest) -> Result<Self, JournalError> {
        ReportUnknown::new(r.lease_token.as_str(), &r.error_code)
    }
}

impl TryFrom<proto::RenewLeaseRequest> for Renew {
    type Error = JournalError;

    fn try_from(r: proto::RenewLeaseRequest) -> Result<Self, JournalError> {
        Renew::new(r.lease_token.as_str(), r.lease_seconds)
    }
}

impl TryFrom<proto::GetOperationRequest> for OperationRef {
    type Error = JournalError;

    fn try_from(r: proto::GetOperationRequest) -> Result<Self, JournalError> {
        OperationRef::new(&r.namespace, &r.operation_key)
    }
}

impl TryFrom<proto::DeriveOperationKeyRequest> for DeriveKey {
    type Error = JournalError;

    fn try_from(r: proto::DeriveOperationKeyRequest) -> Result<Self, JournalError> {
        Ok(DeriveKey {
            namespace: Namespace::parse(&r.namespace)?,
            action_type: ActionType::parse(&r.action_type)?,
            intent_reference: r.intent_reference,
        })
    }
}

impl TryFrom<proto::ListOperationsRequest> for ListOperations {
    type Error = JournalError;

    fn try_from(r: proto::ListOperationsRequest) -> Result<Self, JournalError> {
        let namespace = Namespace::parse(&r.namespace)?;
        let status = proto::OperationStatus::try_from(r.status).map_err(|_| {
            JournalError::invalid(
                ErrorReason::InvalidStatusFilter,
                FieldViolation::new("status", "is not an OperationStatus value"),
            )
        })?;
        let action_type = match r.action_type.as_str() {
            "" => None,
            action_type => Some(ActionType::parse(action_type)?),
        };
        Ok(ListOperations {
            namespace,
            status: status_from_proto(status),
            action_type,
            page: Page {
                size: r.page_size,
                token: r.page_token,
            },
        })
    }
}

impl TryFrom<proto::ReconcileOperationRequest> for OperationRef {
    type Error = JournalError;

    fn try_from(r: proto::ReconcileOperationRequest) -> Result<Self, JournalError> {
        OperationRef::new(&r.namespace, &r.operation_key)
    }
}

impl TryFrom<proto::ListOperationsForReviewRequest> for ReviewQueue {
    type Error = JournalError;

    fn try_from(r: proto::ListOperationsForReviewRequest) -> Result<Self, JournalError> {
        Ok(ReviewQueue {
            namespace: Namespace::parse(&r.namespace)?,
            filter: ReviewFilter::default(),
            page: Page {
                size: r.page_size,
                token: r.page_token,
            },
        })
    }
}

/// The reviewer is the request's `reviewer` as given: with authentication on, the transport
/// first puts the caller's name there (`Caller::reviewer`).
impl TryFrom<proto::ResolveOperationRequest> for Resolve {
    type Error = JournalError;

    fn try_from(r: proto::ResolveOperationRequest) -> Result<Self, JournalError> {
        let operation = OperationRef::new(&r.namespace, &r.operation_key)?;
        let attribution = Attribution::reviewer(&r.reviewer, &r.reason)?;
        let decision = match r.resolution {
            Some(ProtoResolution::Succeeded(s)) => ReviewDecision::Succeeded {
                external_id: ExternalId::parse_optional(&s.external_id)?,
                result_json: s.result_json,
            },
            Some(ProtoResolution::FailedFinal(f)) => ReviewDecision::failed_final(&f.error_code)?,
            Some(ProtoResolution::ReleaseForRetry(_)) => ReviewDecision::ReleaseForRetry,
            None => {
                return Err(JournalError::invalid(
                    ErrorReason::InvalidReview,
                    FieldViolation::new(
                        "resolution",
                        "is required: succeeded, failed_final or release_for_retry",
                    ),
                ));
            }
        };
        Resolve::new(operation, r.expected_attempt_count, attribution, decision)
    }
}

impl TryFrom<proto::GetOperationHistoryRequest> for History {
    type Error = JournalError;

    fn try_from(r: proto::GetOperationHistoryRequest) -> Result<Self, JournalError> {
        Ok(History {
            operation: OperationRef::new(&r.namespace, &r.operation_key)?,
            page: Page {
                size: r.page_size,
                token: r.page_token,
            },
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// The reason and field of a refused conversion.
    fn refusal<T: std::fmt::Debug>(
        converted: Result<T, JournalError>,
    ) -> (ErrorReason, &'static str) {
        match converted.unwrap_err() {
            JournalError::InvalidArgument {
                reason, violation, ..
            } => (reason, violation.field),
            other => panic!("expected INVALID_ARGUMENT, got {other:?}"),
        }
    }

    fn resolve(
        change: impl FnOnce(&mut proto::ResolveOperationRequest),
    ) -> proto::ResolveOperationRequest {
        let mut request = proto::ResolveOperationRequest {
            namespace: String::new(),
            operation_key: "order-1".into(),
            expected_attempt_count: 1,
            reviewer: "alice".into(),
            reason: "no charge at the provider".into(),
            resolution: Some(ProtoResolution::FailedFinal(proto::ResolveFailedFinal {
                error_code: "not_charged".into(),
            })),
        };
        change(&mut request);
        request
    }

    #[test]
    fn a_review_decision_is_refused_at_the_edge_naming_its_field() {
        let resolved = Resolve::try_from(resolve(|_| ())).unwrap();
        assert_eq!(resolved.attribution.actor, "alice");
        assert!(matches!(
            resolved.decision,
            ReviewDecision::FailedFinal { ref error_code } if error_code.as_str() == "not_charged"
        ));
        for (change, expected) in [
            (
                resolve(|r| r.resolution = None),
                (ErrorReason::InvalidReview, "resolution"),
            ),
            (
                resolve(|r| r.reviewer.clear()),
                (ErrorReason::InvalidReview, "reviewer"),
            ),
            (
                resolve(|r| r.reason = "line\nbreak".into()),
                (ErrorReason::InvalidReview, "reason"),
            ),
            (
                resolve(|r| r.expected_attempt_count = 0),
                (
                    ErrorReason::InvalidExpectedAttempt,
                    "expected_attempt_count",
                ),
            ),
            (
                resolve(|r| {
                    r.resolution = Some(ProtoResolution::FailedFinal(proto::ResolveFailedFinal {
                        error_code: String::new(),
                    }))
                }),
                (ErrorReason::InvalidFieldLength, "failed_final.error_code"),
            ),
        ] {
            assert_eq!(refusal(Resolve::try_from(change)), expected);
        }
    }

    #[test]
    fn a_lease_holder_call_is_refused_at_the_edge_naming_its_field() {
        let complete = proto::CompleteOperationRequest {
            lease_token: "not-a-token".into(),
            ..Default::default()
        };
        assert_eq!(
            refusal(Complete::try_from(complete)),
            (ErrorReason::InvalidLeaseToken, "lease_token")
        );
        let list = proto::ListOperationsRequest {
            status: 99,
            ..Default::default()
        };
        assert_eq!(
            refusal(ListOperations::try_from(list)),
            (ErrorReason::InvalidStatusFilter, "status")
        );
    }
}
