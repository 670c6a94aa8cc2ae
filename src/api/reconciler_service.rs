//! The `Reconciler` gRPC service: reconcile now, the review queue, resolutions, history.
//! Each handler checks the caller's role, converts the request into its command
//! (`api::convert`), checks the caller's namespace (see [`super::auth`]) and calls the
//! reconciler once; with authentication on, the reviewer of a resolution is the caller's
//! token name.

use tonic::{Request, Response, Status};

use super::auth::{self, check_namespace};
use super::convert;
use super::status::journal_status;
use crate::domain::access::Rpc;
use crate::journal::OperationRef;
use crate::proto;
use crate::proto::reconciler_server::Reconciler as ReconcilerRpc;
use crate::reconcile::{History, ReconcileAction, Reconciler, Resolve, ReviewQueue};

/// The `opjournal.v1.Reconciler` service over a [`Reconciler`]; served as
/// `ReconcilerServer::new(ReconcilerService(reconciler))`.
#[derive(Clone)]
pub struct ReconcilerService(pub Reconciler);

#[tonic::async_trait]
impl ReconcilerRpc for ReconcilerService {
    async fn reconcile_operation(
        &self,
        request: Request<proto::ReconcileOperationRequest>,
    ) -> Result<Response<proto::ReconcileOperationResponse>, Status> {
        let operation = auth::command(request, Rpc::ReconcileOperation, |c: &OperationRef| {
            &c.namespace
        })?;
        let report = self
            .0
            .reconcile_now(&operation)
            .await
            .map_err(journal_status)?;
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
        let command = auth::command(request, Rpc::ListOperationsForReview, |c: &ReviewQueue| {
            &c.namespace
        })?;
        let (records, next_page_token) = self
            .0
            .list_for_review(&command)
            .await
            .map_err(journal_status)?;
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
        let mut r = request.into_inner();
        r.reviewer = caller
            .reviewer(&r.reviewer)
            .map_err(|error| auth::refused(&caller, error))?;
        let command = Resolve::try_from(r).map_err(journal_status)?;
        check_namespace(&caller, &command.operation.namespace)?;
        let record = self
            .0
            .resolve_by_reviewer(command)
            .await
            .map_err(journal_status)?;
        Ok(Response::new(proto::ResolveOperationResponse {
            operation: Some(convert::operation(&record)),
        }))
    }

    async fn get_operation_history(
        &self,
        request: Request<proto::GetOperationHistoryRequest>,
    ) -> Result<Response<proto::GetOperationHistoryResponse>, Status> {
        let command = auth::command(request, Rpc::GetOperationHistory, |c: &History| {
            &c.operation.namespace
        })?;
        let (events, next_page_token) = self.0.history(&command).await.map_err(journal_status)?;
        Ok(Response::new(proto::GetOperationHistoryResponse {
            events: events.iter().map(convert::event).collect(),
            next_page_token,
        }))
    }
}
