//! The `OperationJournal` gRPC service: thin handlers over [`Journal`], each checking the
//! caller's role and namespace first (see [`super::auth`]).

use tonic::{Request, Response, Status};

use super::auth::{self, check_lease_namespace, check_namespace};
use super::convert;
use crate::domain::access::Rpc;
use crate::domain::model::OperationRecord;
use crate::journal::{BeginOutcome, BeginRequest, Journal};
use crate::proto;
use crate::proto::operation_journal_server::{OperationJournal, OperationJournalServer};
use crate::telemetry::propagation;
use opjournal_client::ErrorReason;

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
        check_namespace(&caller, &r.namespace)?;
        let request = BeginRequest {
            trace_context,
            ..BeginRequest::from(r)
        };
        let outcome = self.journal.begin_request(request).await?;
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
        let caller = auth::caller(&request, Rpc::CompleteOperation)?;
        let r = request.into_inner();
        let token = check_lease_namespace(&caller, &r.lease_token)?;
        let record = self
            .journal
            .complete(&token, &r.external_id, &r.result_json)
            .await?;
        Ok(Response::new(proto::CompleteOperationResponse {
            operation: Some(convert::operation(&record)),
        }))
    }

    async fn fail_operation(
        &self,
        request: Request<proto::FailOperationRequest>,
    ) -> Result<Response<proto::FailOperationResponse>, Status> {
        let caller = auth::caller(&request, Rpc::FailOperation)?;
        let r = request.into_inner();
        let token = check_lease_namespace(&caller, &r.lease_token)?;
        let record = self.journal.fail(&token, &r.error_code).await?;
        Ok(Response::new(proto::FailOperationResponse {
            operation: Some(convert::operation(&record)),
        }))
    }

    async fn report_unknown_outcome(
        &self,
        request: Request<proto::ReportUnknownOutcomeRequest>,
    ) -> Result<Response<proto::ReportUnknownOutcomeResponse>, Status> {
        let caller = auth::caller(&request, Rpc::ReportUnknownOutcome)?;
        let r = request.into_inner();
        let token = check_lease_namespace(&caller, &r.lease_token)?;
        let record = self.journal.report_unknown(&token, &r.error_code).await?;
        Ok(Response::new(proto::ReportUnknownOutcomeResponse {
            operation: Some(convert::operation(&record)),
        }))
    }

    async fn renew_lease(
        &self,
        request: Request<proto::RenewLeaseRequest>,
    ) -> Result<Response<proto::RenewLeaseResponse>, Status> {
        let caller = auth::caller(&request, Rpc::RenewLease)?;
        let r = request.into_inner();
        let token = check_lease_namespace(&caller, &r.lease_token)?;
        let record = self.journal.renew(&token, r.lease_seconds).await?;
        Ok(Response::new(proto::RenewLeaseResponse {
            operation: Some(convert::operation(&record)),
        }))
    }

    async fn get_operation(
        &self,
        request: Request<proto::GetOperationRequest>,
    ) -> Result<Response<proto::GetOperationResponse>, Status> {
        let caller = auth::caller(&request, Rpc::GetOperation)?;
        let r = request.into_inner();
        check_namespace(&caller, &r.namespace)?;
        let record = self.journal.get(&r.namespace, &r.operation_key).await?;
        Ok(Response::new(proto::GetOperationResponse {
            operation: Some(convert::operation(&record)),
        }))
    }

    async fn derive_operation_key(
        &self,
        request: Request<proto::DeriveOperationKeyRequest>,
    ) -> Result<Response<proto::DeriveOperationKeyResponse>, Status> {
        let caller = auth::caller(&request, Rpc::DeriveOperationKey)?;
        let r = request.into_inner();
        check_namespace(&caller, &r.namespace)?;
        let key = self
            .journal
            .derive_key(&r.namespace, &r.action_type, &r.intent_reference)?;
        Ok(Response::new(proto::DeriveOperationKeyResponse {
            operation_key: key.to_string(),
        }))
    }

    async fn list_operations(
        &self,
        request: Request<proto::ListOperationsRequest>,
    ) -> Result<Response<proto::ListOperationsResponse>, Status> {
        let caller = auth::caller(&request, Rpc::ListOperations)?;
        let r = request.into_inner();
        check_namespace(&caller, &r.namespace)?;
        let status = proto::OperationStatus::try_from(r.status).map_err(|_| {
            Status::from(crate::domain::error::JournalError::invalid(
                ErrorReason::InvalidStatusFilter,
                crate::domain::error::FieldViolation::new(
                    "status",
                    "is not an OperationStatus value",
                ),
            ))
        })?;
        let (records, next_page_token) = self
            .journal
            .list(
                &r.namespace,
                convert::status_from_proto(status),
                &r.action_type,
                r.page_size,
                &r.page_token,
            )
            .await?;
        Ok(Response::new(proto::ListOperationsResponse {
            operations: records.iter().map(convert::operation).collect(),
            next_page_token,
        }))
    }
}
