//! The `Reconciler` gRPC service.

use tonic::{Request, Response, Status};

use super::convert;
use crate::proto;
use crate::proto::reconciler_server::{Reconciler as ReconcilerRpc, ReconcilerServer};
use crate::reconcile::{ReconcileAction, Reconciler};

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
    #[tracing::instrument(skip_all, fields(rpc.method = "opjournal.v1.Reconciler/ReconcileOperation"))]
    async fn reconcile_operation(
        &self,
        request: Request<proto::ReconcileOperationRequest>,
    ) -> Result<Response<proto::ReconcileOperationResponse>, Status> {
        let r = request.into_inner();
        let report = self
            .reconciler
            .reconcile_now(&r.namespace, &r.operation_key)
            .await?;
        let mut observation = convert::observation(&report.observation);
        if report.action == ReconcileAction::ReleasedForRetry {
            observation.outcome = proto::ObservationOutcome::DefinitivelyAbsent.into();
        }
        Ok(Response::new(proto::ReconcileOperationResponse {
            operation: Some(convert::operation(&report.record)),
            observation: Some(observation),
            action: convert::reconcile_action(report.action).into(),
        }))
    }
}
