//! The `OperationJournal` gRPC service: thin handlers over [`Journal`]. Each checks the
//! caller's role, converts the request into its command (`api::convert`: every field parsed,
//! the lease token once), checks the caller's namespace (see [`super::auth`]) and calls the
//! journal once.

use tonic::{Request, Response, Status};

use super::auth::{self, check_namespace};
use super::convert;
use super::status::journal_status;
use crate::domain::access::Rpc;
use crate::domain::model::OperationRecord;
use crate::journal::{
    BeginOutcome, BeginRequest, Complete, DeriveKey, Fail, Journal, ListOperations, OperationRef,
    Renew, ReportUnknown,
};
use crate::proto;
use crate::proto::operation_journal_server::{OperationJournal, OperationJournalServer};
use crate::telemetry::propagation;

/// The `opjournal.v1.OperationJournal` service.
#[derive(Clone)]
pub struct JournalService {
    journal: Journal,
}

impl JournalService {
    /// A service over `journal`.
    pub fn new(journal: Journal) -> Self {
        Self { journal }
    }

    /// The tonic server for this service.
    pub fn into_server(self) -> OperationJournalServer<Self> {
        OperationJournalServer::new(self)
    }
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
            .journal
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
        let command = auth::command(request, Rpc::CompleteOperation, |c: &Complete| {
            &c.token.namespace
        })?;
        let record = self
            .journal
            .complete(command)
            .await
            .map_err(journal_status)?;
        Ok(Response::new(proto::CompleteOperationResponse {
            operation: Some(convert::operation(&record)),
        }))
    }

    async fn fail_operation(
        &self,
        request: Request<proto::FailOperationRequest>,
    ) -> Result<Response<proto::FailOperationResponse>, Status> {
        let command = auth::command(request, Rpc::FailOperation, |c: &Fail| &c.token.namespace)?;
        let record = self.journal.fail(command).await.map_err(journal_status)?;
        Ok(Response::new(proto::FailOperationResponse {
            operation: Some(convert::operation(&record)),
        }))
    }

    async fn report_unknown_outcome(
        &self,
        request: Request<proto::ReportUnknownOutcomeRequest>,
    ) -> Result<Response<proto::ReportUnknownOutcomeResponse>, Status> {
        let command = auth::command(request, Rpc::ReportUnknownOutcome, |c: &ReportUnknown| {
            &c.token.namespace
        })?;
        let record = self
            .journal
            .report_unknown(command)
            .await
            .map_err(journal_status)?;
        Ok(Response::new(proto::ReportUnknownOutcomeResponse {
            operation: Some(convert::operation(&record)),
        }))
    }

    async fn renew_lease(
        &self,
        request: Request<proto::RenewLeaseRequest>,
    ) -> Result<Response<proto::RenewLeaseResponse>, Status> {
        let command = auth::command(request, Rpc::RenewLease, |c: &Renew| &c.token.namespace)?;
        let record = self.journal.renew(command).await.map_err(journal_status)?;
        Ok(Response::new(proto::RenewLeaseResponse {
            operation: Some(convert::operation(&record)),
        }))
    }

    async fn get_operation(
        &self,
        request: Request<proto::GetOperationRequest>,
    ) -> Result<Response<proto::GetOperationResponse>, Status> {
        let operation = auth::command(request, Rpc::GetOperation, |c: &OperationRef| &c.namespace)?;
        let record = self.journal.get(&operation).await.map_err(journal_status)?;
        Ok(Response::new(proto::GetOperationResponse {
            operation: Some(convert::operation(&record)),
        }))
    }

    async fn derive_operation_key(
        &self,
        request: Request<proto::DeriveOperationKeyRequest>,
    ) -> Result<Response<proto::DeriveOperationKeyResponse>, Status> {
        let command = auth::command(request, Rpc::DeriveOperationKey, |c: &DeriveKey| {
            &c.namespace
        })?;
        let key = self.journal.derive_key(&command).map_err(journal_status)?;
        Ok(Response::new(proto::DeriveOperationKeyResponse {
            operation_key: key.to_string(),
        }))
    }

    async fn list_operations(
        &self,
        request: Request<proto::ListOperationsRequest>,
    ) -> Result<Response<proto::ListOperationsResponse>, Status> {
        let command = auth::command(request, Rpc::ListOperations, |c: &ListOperations| {
            &c.namespace
        })?;
        let (records, next_page_token) =
            self.journal.list(command).await.map_err(journal_status)?;
        Ok(Response::new(proto::ListOperationsResponse {
            operations: records.iter().map(convert::operation).collect(),
            next_page_token,
        }))
    }
}
