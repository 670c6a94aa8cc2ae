//! The escalation outbox's storage contract ([`EscalationOutbox`]) on the SQL store.

use std::time::Duration;

use async_trait::async_trait;
use uuid::Uuid;

use super::bind::args;
use super::dialect::Dialect;
use super::rows::{OutboxRow, corrupt};
use super::store::SqlStore;
use crate::domain::model::{Namespace, OperationKey};
use crate::store::error::StoreError;
use crate::store::outbox::{
    DeliveryOutcome, DeliveryState, EscalationOutbox, OutboxEntry, OutboxStats,
};

#[async_trait]
impl<D: Dialect> EscalationOutbox for SqlStore<D> {
    async fn claim_deliveries(
        &self,
        limit: i64,
        lease: Duration,
    ) -> Result<Vec<OutboxEntry>, StoreError> {
        let statement = &self.statements.claim_deliveries;
        let claim = self.decoded::<OutboxRow, _>(statement, args![limit, lease]);
        self.run(statement, claim).await
    }

    async fn record_delivery(
        &self,
        event_id: Uuid,
        attempt: i32,
        outcome: &DeliveryOutcome,
    ) -> Result<bool, StoreError> {
        let (state, code, error, after) = match outcome {
            DeliveryOutcome::Delivered { status_code } => {
                (DeliveryState::Delivered, Some(*status_code), None, None)
            }
            DeliveryOutcome::Failed {
                status_code,
                error,
                retry_after,
            } => (
                DeliveryState::Pending,
                *status_code,
                Some(error),
                Some(*retry_after),
            ),
            DeliveryOutcome::Dead { status_code, error } => {
                (DeliveryState::Dead, *status_code, Some(error), None)
            }
        };
        let error = error.map(|e| e.chars().take(100).collect::<String>());
        let code = i64::from(code.unwrap_or(0));
        let args = args![
            event_id,
            attempt,
            state.as_str(),
            code,
            error,
            after.unwrap_or_default()
        ];
        let statement = &self.statements.record_delivery;
        let args = self.args(statement, args);
        let record = D::execute(&self.pool, &statement.sql, args);
        let record = async { Ok(record.await? == 1) };
        self.run(statement, record).await
    }

    async fn deliveries(
        &self,
        namespace: &Namespace,
        key: &OperationKey,
    ) -> Result<Vec<OutboxEntry>, StoreError> {
        let statement = &self.statements.deliveries;
        let args = args![namespace.as_str(), key.as_str()];
        let read = self.decoded::<OutboxRow, _>(statement, args);
        self.run(statement, read).await
    }

    async fn outbox_stats(&self) -> Result<OutboxStats, StoreError> {
        let statement = &self.statements.outbox_stats;
        let read = async {
            let row = self.rows(statement, Vec::new()).await?.pop();
            let (pending, oldest, dead) = row.ok_or_else(|| corrupt("outbox"))?;
            Ok(OutboxStats::from_columns(pending, oldest, dead))
        };
        self.run(statement, read).await
    }
}
