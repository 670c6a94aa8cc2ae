//! The `Reconciler` gRPC service: reconcile now, the review queue, resolutions, history.
//! Each handler checks the caller's role and namespace first (see [`super::auth`]); with
//! authentication on, the reviewer of a resolution is the caller's token name.

use tonic::{Request, Response, Status};

use super::auth::{self, check_namespace};
use super::convert;
use crate::domain::access::Rpc;
use crate::domain::error::{FieldViolation, JournalError};
use crate::proto;
use crate::proto::reconciler_server::{Reconciler as ReconcilerRpc, ReconcilerServer};
use crate::proto::resolve_operation_request::Resolution as ProtoResolution;
use crate::reconcile::{ReconcileAction, Reconciler, ReviewDecision};
use opjournal_client::ErrorReason;

/// The `opjournal.v1.Reconciler` service.
#[derive(Clone)]
pub struct ReconcilerService {
    reconciler: Reconciler,
}

impl ReconcilerService {
    /// A service over `reconciler`.
    pub fn new(reconciler: Reconciler) -> Self {
        Self { reconciler }
    }

    /// The tonic server for this service.
    pub fn into_server(self) -> ReconcilerServer<Self> {
        ReconcilerServer::new(self)
    }
}

#[tonic::async_trait]
impl ReconcilerRpc for ReconcilerService {
    async fn reconcile_operation(
        &self,
        request: Request<proto::ReconcileOperationRequest>,
    ) -> Result<Response<proto::ReconcileOperationResponse>, Status> {
        let caller = auth::caller(&request, Rpc::ReconcileOperation)?;
        let r = request.into_inner();
        check_namespace(&caller, &r.namespace)?;
        let report = self
            .reconciler
            .reconcile_now(&r.namespace, &r.operation_key)
            .await?;
        let observation = report.observation.as_ref().map(|o| {
            let mut observation = convert::observation(o);
            if report.action == ReconcileAction::ReleasedForRetry {
                observation.outcome = proto::ObservationOutcome::DefinitivelyAbsent.into();
            }
            observation
        });
        Ok(Response::new(proto::ReconcileOperationResponse {
            operation: Some(convert::operation(&report.record)),
            observation,
            action: convert::reconcile_action(report.action).into(),
        }))
    }

    async fn list_operations_for_review(
        &self,
        request: Request<proto::ListOperationsForReviewRequest>,
    ) -> Result<Response<proto::ListOperationsForReviewResponse>, Status> {
        let caller = auth::caller(&request, Rpc::ListOperationsForReview)?;
        let r = request.into_inner();
        check_namespace(&caller, &r.namespace)?;
        let (records, next_page_token) = self
            .reconciler
            .list_for_review(&r.namespace, r.page_size, &r.page_token)
            .await?;
        Ok(Response::new(proto::ListOperationsForReviewResponse {
            operations: records.iter().map(convert::operation).collect(),
            next_page_token,
        }))
    }

    async fn resolve_operation(
        &self,
        request: Request<proto::ResolveOperationRequest>,
    ) -> Result<Response<proto::ResolveOperationResponse>, Status> {
        let caller = auth::caller(&request, Rpc::ResolveOperation)?;
        let r = request.into_inner();
        check_namespace(&caller, &r.namespace)?;
        let decision = match r.resolution {
            Some(ProtoResolution::Succeeded(s)) => ReviewDecision::Succeeded {
                external_id: s.external_id,
                result_json: s.result_json,
            },
            Some(ProtoResolution::FailedFinal(f)) => ReviewDecision::FailedFinal {
                error_code: f.error_code,
            },
            Some(ProtoResolution::ReleaseForRetry(_)) => ReviewDecision::ReleaseForRetry,
            None => {
                return Err(JournalError::invalid(
                    ErrorReason::InvalidReview,
                    FieldViolation::new(
                        "resolution",
                        "is required: succeeded, failed_final or release_for_retry",
                    ),
                )
                .into());
            }
        };
        let reviewer = caller
            .reviewer(&r.reviewer)
            .map_err(|error| auth::refused(&caller, error))?;
        let record = self
            .reconciler
            .resolve_by_reviewer(
                &r.namespace,
                &r.operation_key,
                r.expected_attempt_count,
                &reviewer,
                &r.reason,
                decision,
            )
            .await?;
        Ok(Response::new(proto::ResolveOperationResponse {
            operation: Some(convert::operation(&record)),
        }))
    }

    async fn get_operation_history(
        &self,
        request: Request<proto::GetOperationHistoryRequest>,
    ) -> Result<Response<proto::GetOperationHistoryResponse>, Status> {
        let caller = auth::caller(&request, Rpc::GetOperationHistory)?;
        let r = request.into_inner();
        check_namespace(&caller, &r.namespace)?;
        let (events, next_page_token) = self
            .reconciler
            .history(&r.namespace, &r.operation_key, r.page_size, &r.page_token)
            .await?;
        Ok(Response::new(proto::GetOperationHistoryResponse {
            events: events.iter().map(convert::event).collect(),
            next_page_token,
        }))
    }
}
