//! The `OperationJournal` gRPC service: thin handlers over [`Journal`]. Each checks the
//! caller's role, converts the request into its command (`api::convert`: every field parsed,
//! the lease token once), checks the caller's namespace (see [`super::auth`]) and calls the
//! journal once.

use tonic::{Request, Response, Status};

use super::auth::{self, check_namespace};
use super::convert;
use super::status::journal_status;
use crate::domain::access::Rpc;
use crate::domain::error::JournalError;
use crate::domain::model::OperationRecord;
use crate::journal::{
    BeginOutcome, BeginRequest, DeriveKey, Journal, ListOperations, OperationRef, UnderLease,
};
use crate::proto;
use crate::proto::operation_journal_server::OperationJournal;
use crate::telemetry::propagation;

/// The `opjournal.v1.OperationJournal` service over a [`Journal`]; served as
/// `OperationJournalServer::new(JournalService(journal))`.
#[derive(Clone)]
pub struct JournalService(pub Journal);

/// A lease holder's call (a report or a renewal): the caller's role for `rpc` and the
/// namespace inside its lease token checked, the command run once by `run`, and the
/// operation it left in the answer.
///
/// Errors: those of [`auth::command`], and the journal's (`journal_status`).
async fn under_lease<R, C, Fut>(
    request: Request<R>,
    rpc: Rpc,
    run: impl FnOnce(C) -> Fut,
) -> Result<Option<proto::Operation>, Status>
where
    C: TryFrom<R, Error = JournalError> + UnderLease,
    Fut: Future<Output = Result<OperationRecord, JournalError>>,
{
    let command = auth::command(request, rpc, |c: &C| &c.token().namespace)?;
    let record = run(command).await.map_err(journal_status)?;
    Ok(Some(convert::operation(&record)))
}

#[tonic::async_trait]
impl OperationJournal for JournalService {
    async fn begin_operation(
        &self,
        request: Request<proto::BeginOperationRequest>,
    ) -> Result<Response<proto::BeginOperationResponse>, Status> {
        let caller = auth::caller(&request, Rpc::BeginOperation)?;
        let trace_context = propagation::registering_trace_context(request.metadata().as_ref());
        let r = request.into_inner();
        let request = BeginRequest::try_from(r).map_err(journal_status)?;
        check_namespace(&caller, &request.namespace)?;
        let request = BeginRequest {
            trace_context,
            ..request
        };
        let outcome = self
            .0
            .begin_request(request)
            .await
            .map_err(journal_status)?;
        tracing::Span::current().record("opjournal.begin.decision", outcome.decision());
        let answer =
            |decision: proto::Decision, record: &OperationRecord| proto::BeginOperationResponse {
                decision: decision.into(),
                operation: Some(convert::operation(record)),
                ..Default::default()
            };
        let response = match outcome {
            BeginOutcome::Execute { record, token } => proto::BeginOperationResponse {
                lease_token: token.encode(),
                ..answer(proto::Decision::Execute, &record)
            },
            BeginOutcome::Replay(record) => answer(proto::Decision::Replay, &record),
            BeginOutcome::InProgress {
                record,
                retry_after,
            } => proto::BeginOperationResponse {
                retry_after: Some(convert::duration(retry_after)),
                ..answer(proto::Decision::InProgress, &record)
            },
            BeginOutcome::VerificationRequired(record) => {
                answer(proto::Decision::VerificationRequired, &record)
            }
            BeginOutcome::DuplicateIntentSuspected { other_key } => proto::BeginOperationResponse {
                decision: proto::Decision::DuplicateIntentSuspected.into(),
                duplicate_of_operation_key: other_key,
                ..Default::default()
            },
        };
        Ok(Response::new(response))
    }

    async fn complete_operation(
        &self,
        request: Request<proto::CompleteOperationRequest>,
    ) -> Result<Response<proto::CompleteOperationResponse>, Status> {
        let operation =
            under_lease(request, Rpc::CompleteOperation, |c| self.0.complete(c)).await?;
        Ok(Response::new(proto::CompleteOperationResponse {
            operation,
        }))
    }

    async fn get_operation(
        &self,
        request: Request<proto::GetOperationRequest>,
    ) -> Result<Response<proto::GetOperationResponse>, Status> {
        let operation = auth::command(request, Rpc::GetOperation, |c: &OperationRef| &c.namespace)?;
        let record = self.0.get(&operation).await.map_err(journal_status)?;
        Ok(Response::new(proto::GetOperationResponse {
            operation: Some(convert::operation(&record)),
        }))
    }

    async fn fail_operation(
        &self,
        request: Request<proto::FailOperationRequest>,
    ) -> Result<Response<proto::FailOperationResponse>, Status> {
        let operation = under_lease(request, Rpc::FailOperation, |c| self.0.fail(c)).await?;
        Ok(Response::new(proto::FailOperationResponse { operation }))
    }

    async fn derive_operation_key(
        &self,
        request: Request<proto::DeriveOperationKeyRequest>,
    ) -> Result<Response<proto::DeriveOperationKeyResponse>, Status> {
        let command = auth::command(request, Rpc::DeriveOperationKey, |c: &DeriveKey| {
            &c.namespace
        })?;
        let key = self.0.derive_key(&command).map_err(journal_status)?;
        Ok(Response::new(proto::DeriveOperationKeyResponse {
            operation_key: key.to_string(),
        }))
    }

    async fn report_unknown_outcome(
        &self,
        request: Request<proto::ReportUnknownOutcomeRequest>,
    ) -> Result<Response<proto::ReportUnknownOutcomeResponse>, Status> {
        let operation = under_lease(request, Rpc::ReportUnknownOutcome, |c| {
            self.0.report_unknown(c)
        })
        .await?;
        Ok(Response::new(proto::ReportUnknownOutcomeResponse {
            operation,
        }))
    }

    async fn list_operations(
        &self,
        request: Request<proto::ListOperationsRequest>,
    ) -> Result<Response<proto::ListOperationsResponse>, Status> {
        let command = auth::command(request, Rpc::ListOperations, |c: &ListOperations| {
            &c.namespace
        })?;
        let (records, next_page_token) = self.0.list(command).await.map_err(journal_status)?;
        Ok(Response::new(proto::ListOperationsResponse {
            operations: records.iter().map(convert::operation).collect(),
            next_page_token,
        }))
    }

    async fn renew_lease(
        &self,
        request: Request<proto::RenewLeaseRequest>,
    ) -> Result<Response<proto::RenewLeaseResponse>, Status> {
        let operation = under_lease(request, Rpc::RenewLease, |c| self.0.renew(c)).await?;
        Ok(Response::new(proto::RenewLeaseResponse { operation }))
    }
}
