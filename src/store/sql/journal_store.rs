//! The journal's storage contract ([`JournalStore`], [`JournalMaintenance`]) on the SQL
//! store: each method binds its values and sends its statement.

use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use super::bind::{args, first, variant};
use super::clock::Clock;
use super::dialect::Dialect;
use super::rows::{EventRow, corrupt};
use super::statements::Collection;
use super::store::SqlStore;
use crate::domain::lease::LeaseToken;
use crate::domain::model::{
    ActionType, Attribution, Namespace, OperationEvent, OperationKey, OperationRecord, Status,
};
use crate::store::error::StoreError;
use crate::store::{
    BacklogStats, Claim, HistoryQuery, JournalMaintenance, JournalStore, ListQuery, Lookup,
    NewOperation, QueueStats, Registration, Resolution, ReviewQuery, SameRequest, SearchQuery,
    Settled, Settlement, StateCount,
};

#[async_trait]
impl<D: Dialect> JournalStore for SqlStore<D> {
    fn clock(&self) -> &Clock {
        &self.clock
    }

    async fn register(&self, new: &NewOperation) -> Result<Registration, StoreError> {
        let statement = &self.statements.register;
        match self.queues() {
            Some(queues) => {
                self.run(statement, queues.register.submit(new.clone()))
                    .await
            }
            None => self.run(statement, self.register_one(new)).await,
        }
    }

    async fn get(
        &self,
        namespace: &Namespace,
        key: &OperationKey,
    ) -> Result<Option<OperationRecord>, StoreError> {
        let args = args![namespace.as_str(), key.as_str()];
        Ok(self.many(&self.statements.get, args).await?.pop())
    }

    async fn claim(&self, claim: &Claim) -> Result<Option<OperationRecord>, StoreError> {
        let (ns, key) = (claim.namespace.as_str(), claim.operation_key.as_str());
        let (status, attempt) = (claim.expected_status.as_str(), claim.expected_attempt);
        let granted_to = claim.attempt.map(|a| a.to_hex());
        let args = args![
            ns,
            key,
            status,
            attempt,
            claim.lease,
            claim.lease_id,
            granted_to
        ];
        Ok(self.many(&self.statements.claim, args).await?.pop())
    }

    async fn settle(
        &self,
        token: &LeaseToken,
        settlement: &Settlement,
    ) -> Result<Option<Settled>, StoreError> {
        let statement = &self.statements.settle[variant(settlement)];
        match self.queues() {
            Some(queues) => {
                let report = (token.clone(), settlement.clone());
                self.run(statement, queues.settle.submit(report)).await
            }
            None => {
                self.run(statement, self.settle_one(token, settlement))
                    .await
            }
        }
    }

    async fn renew(
        &self,
        token: &LeaseToken,
        lease: Duration,
    ) -> Result<Option<OperationRecord>, StoreError> {
        let (ns, key) = (token.namespace.as_str(), token.operation_key.as_str());
        let args = args![ns, key, token.attempt, token.lease_id, lease];
        Ok(self.many(&self.statements.renew, args).await?.pop())
    }

    async fn list(&self, query: &ListQuery) -> Result<Vec<OperationRecord>, StoreError> {
        // No position: after the latest time both backends store.
        let end = DateTime::from_timestamp(253_402_300_799, 0).unwrap_or_default();
        let (at, key) = query.after.clone().unwrap_or((end, String::new()));
        let (status, action) = (query.status.map(Status::as_str), query.action_type.as_ref());
        let (ns, action) = (query.namespace.as_str(), action.map(ActionType::as_str));
        let args = args![
            ns,
            status,
            action,
            D::time_text(at.min(end)),
            key,
            query.limit
        ];
        self.many(&self.statements.list, args).await
    }

    async fn resolve(
        &self,
        expected: &OperationRecord,
        resolution: &Resolution,
        attribution: &Attribution,
        lookup: Lookup,
    ) -> Result<Option<OperationRecord>, StoreError> {
        let (ns, key) = (expected.namespace.as_str(), expected.operation_key.as_str());
        let (status, attempt) = (expected.status.as_str(), expected.attempt_count);
        let (kind, actor) = (attribution.kind.as_str(), first(&attribution.actor, 200));
        let reason = attribution.reason.as_deref().map(|r| first(r, 500));
        let made = i32::from(lookup == Lookup::Made);
        let mut args = args![ns, key, status, attempt, made, kind, actor, reason];
        let (variant, values) = match resolution {
            Resolution::Succeeded {
                external_id,
                result_json,
            } => (
                0,
                args![
                    external_id.as_ref().map(|i| i.as_str()),
                    result_json.clone()
                ],
            ),
            Resolution::FailedFinal { error_code } => (1, args![error_code.as_str()]),
            Resolution::ReleaseForRetry => (2, Vec::new()),
            Resolution::KeepUnknown { next_check_after } => (3, args![*next_check_after]),
            Resolution::Escalate { reason } => (4, args![reason.as_str()]),
        };
        args.extend(values);
        Ok(self
            .many(&self.statements.resolve[variant], args)
            .await?
            .pop())
    }

    async fn sweep_expired_leases(&self, limit: i64, worker: &str) -> Result<u64, StoreError> {
        let statement = &self.statements.sweep;
        let args = self.args(statement, args![limit, first(worker, 200)]);
        let sweep = D::execute(&self.pool, &statement.sql, args);
        self.run(statement, sweep).await
    }

    async fn list_review(&self, query: &ReviewQuery) -> Result<Vec<OperationRecord>, StoreError> {
        // No position: before the beginning of time.
        let start = (DateTime::<Utc>::UNIX_EPOCH, String::new());
        let (at, key) = query.after.clone().unwrap_or(start);
        let action = query.action_type.as_ref().map(|a| a.as_str().to_owned());
        let (ns, min_age) = (query.namespace.as_str(), query.min_age);
        let args = args![ns, D::time_text(at), key, query.limit, action, min_age];
        self.many(&self.statements.list_review, args).await
    }

    async fn search(&self, query: &SearchQuery) -> Result<Vec<OperationRecord>, StoreError> {
        let (name, value) = query.reference.clone().unzip();
        let (ns, external_id) = (query.namespace.as_str(), query.external_id.clone());
        let args = args![ns, external_id, name, value, query.limit];
        self.many(&self.statements.search, args).await
    }

    async fn queue_stats(&self, namespace: &Namespace) -> Result<QueueStats, StoreError> {
        let statement = &self.statements.queue_stats;
        let stats = async {
            // Each state's count and oldest time, then the clock (`queue_stats.sql`).
            let row = self.rows(statement, args![namespace.as_str()]).await?.pop();
            let row: (_, _, _, _, _, _, _, _, _) = row.ok_or_else(|| corrupt("queue_stats"))?;
            let count = |count, oldest| StateCount { count, oldest };
            Ok(QueueStats {
                unknown: count(row.0, row.1),
                in_progress: count(row.2, row.3),
                due: count(row.4, row.5),
                review: count(row.6, row.7),
                observed_at: row.8,
            })
        };
        self.run(statement, stats).await
    }

    async fn history(&self, query: &HistoryQuery) -> Result<Vec<OperationEvent>, StoreError> {
        let (ns, key) = (query.namespace.as_str(), query.operation_key.as_str());
        let args = args![ns, key, query.after_event_id, query.limit];
        let statement = &self.statements.history;
        let events = self.decoded::<EventRow, _>(statement, args);
        self.run(statement, events).await
    }

    async fn claim_due(
        &self,
        limit: i64,
        hold: Duration,
    ) -> Result<Vec<OperationRecord>, StoreError> {
        self.many(&self.statements.claim_due, args![limit, hold])
            .await
    }

    async fn claim_for_reconcile(
        &self,
        namespace: &Namespace,
        key: &OperationKey,
        hold: Duration,
    ) -> Result<Option<OperationRecord>, StoreError> {
        let args = args![namespace.as_str(), key.as_str(), hold];
        Ok(self
            .many(&self.statements.claim_for_reconcile, args)
            .await?
            .pop())
    }

    async fn find_same_request(&self, query: &SameRequest) -> Result<Option<String>, StoreError> {
        let (ns, action) = (query.namespace.as_str(), query.action_type.as_str());
        let (hash, other_than) = (query.request_hash.to_hex(), query.other_than.as_str());
        let args = args![ns, action, hash, other_than, query.window];
        let statement = &self.statements.find_same_request;
        let find = async { Ok(self.rows(statement, args).await?.pop().map(|(key,)| key)) };
        self.run(statement, find).await
    }
}

#[async_trait]
impl<D: Dialect> JournalMaintenance for SqlStore<D> {
    async fn purge(&self, limit: i64) -> Result<u64, StoreError> {
        let statement = &self.statements.purge;
        let args = self.args(statement, args![limit]);
        let purge = D::purge(&self.pool, &statement.sql, args);
        self.run(statement, purge).await
    }

    async fn ping(&self) -> Result<(), StoreError> {
        let ping = D::execute(&self.pool, D::PING, Vec::new());
        self.call("ping", "SELECT", None, async { ping.await.map(drop) })
            .await
    }

    async fn backlog_stats(&self) -> Result<BacklogStats, StoreError> {
        let statement = &self.statements.backlog_stats;
        let stats = async {
            let row = self.rows(statement, Vec::new()).await?.pop();
            let (unknown, oldest, review, oldest_review, overdue, most_overdue) =
                row.ok_or_else(|| corrupt("backlog"))?;
            Ok(BacklogStats::from_columns(
                (unknown, oldest),
                (review, oldest_review),
                (overdue, most_overdue),
            ))
        };
        self.run(statement, stats).await
    }

    async fn analyze_new_tables(&self, min_changes: i64) -> Result<Option<u64>, StoreError> {
        let analyze = D::analyze_new_tables(&self.pool, min_changes);
        // Counted as the journal's table, as every statement on it.
        let collection = Some(Collection::Operations);
        self.call("analyze_new_tables", "ANALYZE", collection, analyze)
            .await
    }
}
