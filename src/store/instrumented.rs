//! A store decorator that traces and counts: every call inside a traced request or reconcile
//! attempt gets a client span (`db.system.name`, `db.operation.name`,
//! `db.collection.name`, by the database semantic conventions), and every failed call counts
//! in `opjournal.store.errors`. Background calls without a parent span (the worker's polls,
//! readiness checks, backlog samples) are counted but not traced, so that an idle process
//! sends no traces. It works over any backend.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use tracing::Instrument as _;
use tracing::field::Empty;
use uuid::Uuid;

use super::{
    BacklogStats, JournalStore, ListQuery, NewOperation, Registration, Resolution, Settled,
    Settlement, StoreError,
};
use crate::domain::canonical::RequestHash;
use crate::domain::lease::LeaseToken;
use crate::domain::model::{
    ActionType, Attribution, Namespace, OperationEvent, OperationKey, OperationRecord, Status,
};
use crate::telemetry::Metrics;

/// `inner`, traced and counted.
pub struct InstrumentedStore {
    inner: Arc<dyn JournalStore>,
    metrics: Metrics,
    system: &'static str,
}

impl InstrumentedStore {
    /// Wraps `inner`; `system` is its `db.system.name` (`postgresql`, `sqlite`).
    pub fn new(inner: Arc<dyn JournalStore>, metrics: Metrics, system: &'static str) -> Self {
        Self {
            inner,
            metrics,
            system,
        }
    }

    /// Runs one store call: `method` is the trait method, `operation` and `collection` its
    /// statement's kind and main table.
    async fn call<T>(
        &self,
        method: &'static str,
        operation: &'static str,
        collection: &'static str,
        call: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        let span = if tracing::Span::current().is_none() {
            tracing::Span::none()
        } else {
            let name = if collection.is_empty() {
                operation.to_owned()
            } else {
                format!("{operation} {collection}")
            };
            tracing::info_span!(
                "store",
                otel.name = name,
                otel.kind = "client",
                otel.status_code = Empty,
                db.system.name = self.system,
                db.operation.name = operation,
                db.collection.name = collection,
                opjournal.store.method = method,
                error.type = Empty,
            )
        };
        let result = call.instrument(span.clone()).await;
        if let Err(error) = &result {
            self.metrics.store_error(method, error);
            let kind = match error {
                StoreError::Unavailable(_) => "unavailable",
                StoreError::Other(_) => "other",
            };
            span.record("error.type", kind);
            span.record("otel.status_code", "error");
        }
        result
    }
}

const OPERATIONS: &str = "agent_operations";

#[async_trait]
impl JournalStore for InstrumentedStore {
    async fn insert_and_claim(
        &self,
        new: &NewOperation,
    ) -> Result<Option<OperationRecord>, StoreError> {
        self.call(
            "insert_and_claim",
            "INSERT",
            OPERATIONS,
            self.inner.insert_and_claim(new),
        )
        .await
    }

    async fn register(&self, new: &NewOperation) -> Result<Registration, StoreError> {
        self.call("register", "INSERT", OPERATIONS, self.inner.register(new))
            .await
    }

    async fn get(
        &self,
        namespace: &Namespace,
        key: &OperationKey,
    ) -> Result<Option<OperationRecord>, StoreError> {
        self.call("get", "SELECT", OPERATIONS, self.inner.get(namespace, key))
            .await
    }

    async fn claim(
        &self,
        namespace: &Namespace,
        key: &OperationKey,
        expected_status: Status,
        expected_attempt: i32,
        lease: Duration,
        lease_id: Uuid,
    ) -> Result<Option<OperationRecord>, StoreError> {
        self.call(
            "claim",
            "UPDATE",
            OPERATIONS,
            self.inner.claim(
                namespace,
                key,
                expected_status,
                expected_attempt,
                lease,
                lease_id,
            ),
        )
        .await
    }

    async fn settle(
        &self,
        token: &LeaseToken,
        settlement: &Settlement,
    ) -> Result<Option<OperationRecord>, StoreError> {
        self.call(
            "settle",
            "UPDATE",
            OPERATIONS,
            self.inner.settle(token, settlement),
        )
        .await
    }

    async fn settle_with_previous(
        &self,
        token: &LeaseToken,
        settlement: &Settlement,
    ) -> Result<Option<Settled>, StoreError> {
        self.call(
            "settle_with_previous",
            "UPDATE",
            OPERATIONS,
            self.inner.settle_with_previous(token, settlement),
        )
        .await
    }

    async fn renew(
        &self,
        token: &LeaseToken,
        lease: Duration,
    ) -> Result<Option<OperationRecord>, StoreError> {
        self.call(
            "renew",
            "UPDATE",
            OPERATIONS,
            self.inner.renew(token, lease),
        )
        .await
    }

    async fn list(&self, query: &ListQuery) -> Result<Vec<OperationRecord>, StoreError> {
        self.call("list", "SELECT", OPERATIONS, self.inner.list(query))
            .await
    }

    async fn resolve(
        &self,
        expected: &OperationRecord,
        resolution: &Resolution,
        attribution: &Attribution,
        lookup_made: bool,
    ) -> Result<Option<OperationRecord>, StoreError> {
        self.call(
            "resolve",
            "UPDATE",
            OPERATIONS,
            self.inner
                .resolve(expected, resolution, attribution, lookup_made),
        )
        .await
    }

    async fn sweep_expired_leases(&self, limit: i64, worker: &str) -> Result<u64, StoreError> {
        self.call(
            "sweep_expired_leases",
            "UPDATE",
            OPERATIONS,
            self.inner.sweep_expired_leases(limit, worker),
        )
        .await
    }

    async fn list_review(
        &self,
        namespace: &Namespace,
        after: Option<(DateTime<Utc>, String)>,
        limit: i64,
    ) -> Result<Vec<OperationRecord>, StoreError> {
        self.call(
            "list_review",
            "SELECT",
            OPERATIONS,
            self.inner.list_review(namespace, after, limit),
        )
        .await
    }

    async fn history(
        &self,
        namespace: &Namespace,
        key: &OperationKey,
        after_event_id: i64,
        limit: i64,
    ) -> Result<Vec<OperationEvent>, StoreError> {
        self.call(
            "history",
            "SELECT",
            "operation_events",
            self.inner.history(namespace, key, after_event_id, limit),
        )
        .await
    }

    async fn claim_due(
        &self,
        limit: i64,
        hold: Duration,
    ) -> Result<Vec<OperationRecord>, StoreError> {
        self.call(
            "claim_due",
            "UPDATE",
            OPERATIONS,
            self.inner.claim_due(limit, hold),
        )
        .await
    }

    async fn claim_for_reconcile(
        &self,
        namespace: &Namespace,
        key: &OperationKey,
        hold: Duration,
    ) -> Result<Option<OperationRecord>, StoreError> {
        self.call(
            "claim_for_reconcile",
            "UPDATE",
            OPERATIONS,
            self.inner.claim_for_reconcile(namespace, key, hold),
        )
        .await
    }

    async fn find_same_request(
        &self,
        namespace: &Namespace,
        action_type: &ActionType,
        request_hash: &RequestHash,
        other_than: &OperationKey,
        window: Duration,
    ) -> Result<Option<String>, StoreError> {
        self.call(
            "find_same_request",
            "SELECT",
            OPERATIONS,
            self.inner
                .find_same_request(namespace, action_type, request_hash, other_than, window),
        )
        .await
    }

    async fn purge(&self, limit: i64) -> Result<u64, StoreError> {
        self.call("purge", "DELETE", OPERATIONS, self.inner.purge(limit))
            .await
    }

    async fn ping(&self) -> Result<(), StoreError> {
        self.call("ping", "SELECT", "", self.inner.ping()).await
    }

    async fn backlog_stats(&self) -> Result<BacklogStats, StoreError> {
        self.call(
            "backlog_stats",
            "SELECT",
            OPERATIONS,
            self.inner.backlog_stats(),
        )
        .await
    }

    async fn analyze_new_tables(&self, min_changes: i64) -> Result<Option<u64>, StoreError> {
        self.call(
            "analyze_new_tables",
            "ANALYZE",
            OPERATIONS,
            self.inner.analyze_new_tables(min_changes),
        )
        .await
    }
}
