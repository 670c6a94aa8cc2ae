//! The Postgres backend: one statement per method, compare-and-set in every `WHERE`.

use std::collections::BTreeMap;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::postgres::{PgPool, PgPoolOptions, PgRow};
use sqlx::{Postgres, QueryBuilder, Row};
use uuid::Uuid;

use super::{
    BacklogStats, JournalStore, ListQuery, NewOperation, Registration, Resolution, Settled,
    Settlement, StoreError,
};
use crate::domain::canonical::RequestHash;
use crate::domain::lease::LeaseToken;
use crate::domain::model::{
    ActionType, ActorKind, Attribution, Namespace, OperationEvent, OperationKey, OperationRecord,
    Status,
};

/// The migrations of this backend, embedded in the binary.
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations");

/// Every column of a record, plus the database clock.
const COLUMNS: &str = "namespace, operation_key, action_type, request_hash, status, \
    attempt_count, external_id, result_json, error_code, lease_until, lease_id, \
    business_references, unknown_since, next_check_at, reconcile_attempts, created_at, \
    updated_at, review_required_at, review_reason, last_actor_kind, action_policy, \
    trace_context, now() AS observed_at";

/// The statement behind [`JournalStore::backlog_stats`]: partial indexes on unknown and on
/// review-waiting rows answer each part (`agent_operations_unknown_since`,
/// `agent_operations_review_queue`), so its cost follows the backlog, not the journal.
pub const BACKLOG_STATS_SQL: &str = "SELECT \
    (SELECT count(*) FROM agent_operations WHERE status = 'unknown') AS unknown, \
    (SELECT EXTRACT(EPOCH FROM now() - min(unknown_since))::float8 \
       FROM agent_operations WHERE status = 'unknown') AS oldest_unknown_seconds, \
    (SELECT count(*) FROM agent_operations WHERE review_required_at IS NOT NULL) AS review_queue";

/// [`JournalStore::sweep_expired_leases`]: in-progress operations whose lease ended become
/// unknown, oldest lease first, by the partial index on in-progress leases; each is then
/// updated by its primary key. `FOR UPDATE` locks the latest version of each row and
/// checks the condition again on it, so no other transaction can change a row between the
/// scan and the update: repeating the condition in the update is not needed, and would let
/// the planner scan every expired lease again to join back the few it locked.
const SWEEP_EXPIRED_LEASES_SQL: &str = "WITH expired AS ( \
             SELECT namespace AS expired_namespace, operation_key AS expired_key \
             FROM agent_operations \
             WHERE status = 'in_progress' AND lease_until < now() \
             ORDER BY lease_until LIMIT $1 FOR UPDATE SKIP LOCKED) \
         UPDATE agent_operations \
         SET status = 'unknown', error_code = 'lease_expired', \
             unknown_since = lease_until, lease_until = NULL, \
             next_check_at = now(), updated_at = now(), \
             last_actor_kind = 'worker', last_actor = $2, last_reason = 'lease_expired' \
         FROM expired \
         WHERE namespace = expired_namespace AND operation_key = expired_key";

/// [`JournalStore::purge`]: terminal operations past retention and their history, by the
/// partial index on `purge_after`.
const PURGE_SQL: &str = "WITH doomed AS ( \
             SELECT namespace, operation_key FROM agent_operations \
             WHERE purge_after < now() AND status IN ('succeeded', 'failed_final') \
             ORDER BY purge_after LIMIT $1 FOR UPDATE SKIP LOCKED), \
         gone AS ( \
             DELETE FROM agent_operations o USING doomed d \
             WHERE o.namespace = d.namespace AND o.operation_key = d.operation_key \
               AND o.status IN ('succeeded', 'failed_final') \
             RETURNING o.namespace, o.operation_key), \
         history AS ( \
             DELETE FROM operation_events e USING gone g \
             WHERE e.namespace = g.namespace AND e.operation_key = g.operation_key) \
         SELECT COUNT(*) FROM gone";

/// [`JournalStore::find_same_request`]. The hash is bound as text and the column is
/// CHAR(64): compared as they are, Postgres casts the column to text and the index cannot
/// look the hash up, leaving a scan of every operation of the action. The parameter is cast
/// to the column's type.
const FIND_SAME_REQUEST_SQL: &str = "SELECT operation_key FROM agent_operations \
         WHERE namespace = $1 AND action_type = $2 AND request_hash = $3::char(64) \
           AND operation_key <> $4 \
           AND (status IN ('pending', 'in_progress', 'unknown') \
                OR (status = 'succeeded' \
                    AND updated_at > now() - make_interval(secs => $5))) \
         ORDER BY created_at DESC LIMIT 1";

/// [`JournalStore::history`]: one operation's events in order.
const HISTORY_SQL: &str = "SELECT event_id, from_status, to_status, attempt_count, review, actor_kind, \
             actor, reason, occurred_at \
         FROM operation_events \
         WHERE namespace = $1 AND operation_key = $2 AND event_id > $3 \
         ORDER BY event_id LIMIT $4";

/// [`JournalStore::claim_due`]: unknown operations due for a lookup, by the partial index
/// on `next_check_at`. The CTE's columns are renamed so that COLUMNS stays unambiguous in
/// RETURNING.
fn claim_due_sql() -> String {
    format!(
        "WITH due AS ( \
                 SELECT namespace AS due_namespace, operation_key AS due_key \
                 FROM agent_operations \
                 WHERE status = 'unknown' AND next_check_at <= now() \
                   AND (reconcile_lease_until IS NULL OR reconcile_lease_until < now()) \
                 ORDER BY next_check_at LIMIT $1 FOR UPDATE SKIP LOCKED) \
             UPDATE agent_operations \
             SET next_check_at = now() + make_interval(secs => $2), \
                 reconcile_lease_until = now() + make_interval(secs => $2) \
             FROM due \
             WHERE namespace = due_namespace AND operation_key = due_key \
             RETURNING {COLUMNS}"
    )
}

/// [`JournalStore::claim_for_reconcile`]: one operation by its primary key.
fn claim_for_reconcile_sql() -> String {
    format!(
        "UPDATE agent_operations SET reconcile_lease_until = now() + make_interval(secs => $3) \
             WHERE namespace = $1 AND operation_key = $2 \
               AND (status = 'unknown' OR (status = 'in_progress' AND lease_until <= now())) \
               AND (reconcile_lease_until IS NULL OR reconcile_lease_until < now()) \
             RETURNING {COLUMNS}"
    )
}

/// [`JournalStore::list`]: newest first within a namespace, by the
/// `agent_operations_namespace_created` index, keyset-paginated.
fn list_query(query: &ListQuery) -> QueryBuilder<Postgres> {
    let mut sql: QueryBuilder<Postgres> = QueryBuilder::new(format!(
        "SELECT {COLUMNS} FROM agent_operations WHERE namespace = "
    ));
    sql.push_bind(query.namespace.as_str());
    if let Some(status) = query.status {
        sql.push(" AND status = ").push_bind(status.as_str());
    }
    if let Some(action) = &query.action_type {
        sql.push(" AND action_type = ").push_bind(action.as_str());
    }
    if let Some((created_at, key)) = &query.after {
        sql.push(" AND (created_at, operation_key) < (")
            .push_bind(*created_at)
            .push(", ")
            .push_bind(key.as_str())
            .push(")");
    }
    sql.push(" ORDER BY created_at DESC, operation_key DESC LIMIT ")
        .push_bind(query.limit);
    sql
}

/// [`JournalStore::list_review`]: the review queue of a namespace, oldest first, by the
/// partial `agent_operations_review_queue` index.
fn list_review_query(
    namespace: &Namespace,
    after: Option<(DateTime<Utc>, String)>,
    limit: i64,
) -> QueryBuilder<Postgres> {
    let mut sql: QueryBuilder<Postgres> = QueryBuilder::new(format!(
        "SELECT {COLUMNS} FROM agent_operations \
             WHERE review_required_at IS NOT NULL AND namespace = "
    ));
    sql.push_bind(namespace.as_str());
    if let Some((at, key)) = after {
        sql.push(" AND (review_required_at, operation_key) > (")
            .push_bind(at)
            .push(", ")
            .push_bind(key)
            .push(")");
    }
    sql.push(" ORDER BY review_required_at, operation_key LIMIT ")
        .push_bind(limit);
    sql
}

/// How long a pooled connection may sit idle before it is pinged on its next use.
pub const IDLE_PING_AFTER: Duration = Duration::from_secs(1);

/// The journal on Postgres.
#[derive(Debug, Clone)]
pub struct PgStore {
    pool: PgPool,
}

impl PgStore {
    /// Wraps an existing pool.
    pub fn new(pool: PgPool) -> Self {
        Self { pool }
    }

    /// Creates a lazily connecting pool of at most `max_connections`; connections are made
    /// on first use, so the server starts (not ready) while the database is down.
    ///
    /// A connection that sat idle for [`IDLE_PING_AFTER`] or longer is pinged before it is
    /// used (a dead one is replaced); one in steady use is not, which saves a round trip per
    /// statement. A statement sent on a connection that died since its last use fails
    /// `UNAVAILABLE`/`STORE_UNAVAILABLE` having written nothing, and the connection is
    /// dropped.
    ///
    /// Errors: the URL cannot be parsed.
    pub fn connect_lazy(url: &str, max_connections: u32) -> Result<Self, StoreError> {
        let pool = PgPoolOptions::new()
            .max_connections(max_connections)
            .acquire_timeout(Duration::from_secs(3))
            .test_before_acquire(false)
            .before_acquire(|connection, meta| {
                Box::pin(async move {
                    if meta.idle_for >= IDLE_PING_AFTER {
                        sqlx::Connection::ping(connection).await?;
                    }
                    Ok(true)
                })
            })
            .connect_lazy(url)
            .map_err(|e| StoreError::Other(Box::new(e)))?;
        Ok(Self { pool })
    }

    /// The underlying pool.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// Applies pending migrations.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        MIGRATOR.run(&self.pool).await.map_err(|e| match e {
            sqlx::migrate::MigrateError::Execute(e) => classify(e),
            other => StoreError::Other(Box::new(other)),
        })
    }

    async fn fetch_optional(
        &self,
        query: sqlx::query::Query<'_, Postgres, sqlx::postgres::PgArguments>,
    ) -> Result<Option<OperationRecord>, StoreError> {
        query
            .fetch_optional(&self.pool)
            .await
            .map_err(classify)?
            .map(|row| record_from_row(&row))
            .transpose()
    }
}

/// Splits sqlx errors into "unavailable" (retry later, nothing changed) and the rest.
pub(crate) fn classify(error: sqlx::Error) -> StoreError {
    let unavailable = match &error {
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed => true,
        sqlx::Error::Database(db) => db.code().is_some_and(|code| {
            // 08: connection exception; 57P01..57P03: shutdown / cannot connect now.
            code.starts_with("08") || matches!(code.as_ref(), "57P01" | "57P02" | "57P03")
        }),
        _ => false,
    };
    if unavailable {
        StoreError::Unavailable(Box::new(error))
    } else {
        StoreError::Other(Box::new(error))
    }
}

fn corrupt(what: &str) -> StoreError {
    StoreError::Other(format!("corrupt journal row: {what}").into())
}

fn record_from_row(row: &PgRow) -> Result<OperationRecord, StoreError> {
    let get_err = |e: sqlx::Error| StoreError::Other(Box::new(e));
    let status: String = row.try_get("status").map_err(get_err)?;
    let hash: String = row.try_get("request_hash").map_err(get_err)?;
    let namespace: String = row.try_get("namespace").map_err(get_err)?;
    let key: String = row.try_get("operation_key").map_err(get_err)?;
    let action: String = row.try_get("action_type").map_err(get_err)?;
    let references: sqlx::types::Json<BTreeMap<String, String>> =
        row.try_get("business_references").map_err(get_err)?;
    Ok(OperationRecord {
        namespace: Namespace::parse(&namespace).map_err(|_| corrupt("namespace"))?,
        operation_key: OperationKey::parse(&key).map_err(|_| corrupt("operation_key"))?,
        action_type: ActionType::parse(&action).map_err(|_| corrupt("action_type"))?,
        request_hash: RequestHash::from_hex(&hash).ok_or_else(|| corrupt("request_hash"))?,
        status: Status::from_db(&status).ok_or_else(|| corrupt("status"))?,
        attempt_count: row.try_get("attempt_count").map_err(get_err)?,
        lease_id: row.try_get("lease_id").map_err(get_err)?,
        lease_until: row.try_get("lease_until").map_err(get_err)?,
        external_id: row.try_get("external_id").map_err(get_err)?,
        result_json: row.try_get("result_json").map_err(get_err)?,
        error_code: row.try_get("error_code").map_err(get_err)?,
        references: references.0,
        unknown_since: row.try_get("unknown_since").map_err(get_err)?,
        next_check_at: row.try_get("next_check_at").map_err(get_err)?,
        reconcile_attempts: row.try_get("reconcile_attempts").map_err(get_err)?,
        review_required_at: row.try_get("review_required_at").map_err(get_err)?,
        review_reason: row.try_get("review_reason").map_err(get_err)?,
        action_policy: {
            let stored: Option<serde_json::Value> =
                row.try_get("action_policy").map_err(get_err)?;
            // A policy recorded by a newer version may not parse here: fall back to the
            // current file for it rather than fail the operation.
            stored.and_then(|v| serde_json::from_value(v).ok())
        },
        last_actor_kind: {
            let kind: String = row.try_get("last_actor_kind").map_err(get_err)?;
            ActorKind::from_db(&kind).ok_or_else(|| corrupt("last_actor_kind"))?
        },
        trace_context: row.try_get("trace_context").map_err(get_err)?,
        created_at: row.try_get("created_at").map_err(get_err)?,
        updated_at: row.try_get("updated_at").map_err(get_err)?,
        observed_at: row.try_get("observed_at").map_err(get_err)?,
    })
}

/// SQL assembled in this file from constant fragments only; every value is bound.
fn trusted(sql: String) -> sqlx::AssertSqlSafe<String> {
    sqlx::AssertSqlSafe(sql)
}

fn truncate(text: &str, chars: usize) -> String {
    text.chars().take(chars).collect()
}

fn event_from_row(row: &PgRow) -> Result<OperationEvent, StoreError> {
    let get_err = |e: sqlx::Error| StoreError::Other(Box::new(e));
    let from: Option<String> = row.try_get("from_status").map_err(get_err)?;
    let to: String = row.try_get("to_status").map_err(get_err)?;
    let kind: String = row.try_get("actor_kind").map_err(get_err)?;
    Ok(OperationEvent {
        event_id: row.try_get("event_id").map_err(get_err)?,
        from_status: from
            .map(|s| Status::from_db(&s).ok_or_else(|| corrupt("from_status")))
            .transpose()?,
        to_status: Status::from_db(&to).ok_or_else(|| corrupt("to_status"))?,
        attempt_count: row.try_get("attempt_count").map_err(get_err)?,
        review_required: row.try_get("review").map_err(get_err)?,
        actor_kind: ActorKind::from_db(&kind).ok_or_else(|| corrupt("actor_kind"))?,
        actor: row.try_get("actor").map_err(get_err)?,
        reason: row.try_get("reason").map_err(get_err)?,
        occurred_at: row.try_get("occurred_at").map_err(get_err)?,
    })
}

fn seconds(duration: Duration) -> f64 {
    duration.as_secs_f64()
}

/// Registers a new operation `in_progress` with attempt 1 and a lease, unless its key
/// exists (parameters bound by [`bind_new`]); without a RETURNING list.
const INSERT_AND_CLAIM: &str = "INSERT INTO agent_operations (namespace, operation_key, \
         action_type, request_hash, status, attempt_count, lease_until, lease_id, \
         business_references, last_actor_kind, last_actor, last_reason, action_policy, \
         trace_context, created_at, updated_at) \
     VALUES ($1, $2, $3, $4, 'in_progress', 1, now() + make_interval(secs => $5), \
         $6, $7, 'client', '', 'registered', $8, $9, now(), now()) \
     ON CONFLICT (namespace, operation_key) DO NOTHING";

/// Binds the parameters of [`INSERT_AND_CLAIM`].
fn bind_new<'q>(
    query: sqlx::query::Query<'q, Postgres, sqlx::postgres::PgArguments>,
    new: &'q NewOperation,
) -> sqlx::query::Query<'q, Postgres, sqlx::postgres::PgArguments> {
    query
        .bind(new.namespace.as_str())
        .bind(new.operation_key.as_str())
        .bind(new.action_type.as_str())
        .bind(new.request_hash.to_hex())
        .bind(seconds(new.lease))
        .bind(new.lease_id)
        .bind(sqlx::types::Json(&new.references))
        .bind(&new.action_policy)
        .bind(new.trace_context.as_deref())
}

/// What every report sets besides its outcome: the holder reported.
const REPORTED: &str = "last_actor_kind = 'client', last_actor = '', outcome_reported = true";

/// Which rows a report (`$1`..`$4`: namespace, key, attempt, lease id) may change: the
/// holder of an attempt reports once, while no later attempt exists: from in_progress (even
/// after its lease ended), or from unknown or pending when the sweep or a release, not the
/// holder, put it there.
const REPORT_FENCE: &str = "namespace = $1 AND operation_key = $2 \
     AND attempt_count = $3 AND lease_id = $4 \
     AND (status = 'in_progress' \
          OR (status IN ('unknown', 'pending') AND NOT outcome_reported))";

/// The outcome columns a report sets, from parameters `$5` on (see [`bind_settlement`]).
fn settlement_set(settlement: &Settlement) -> &'static str {
    match settlement {
        Settlement::Succeeded { .. } => {
            "status = 'succeeded', external_id = $5, \
             result_json = $6, error_code = NULL, lease_until = NULL, \
             unknown_since = NULL, next_check_at = NULL, updated_at = now(), \
             last_reason = 'completed', review_required_at = NULL, \
             review_reason = NULL"
        }
        Settlement::FailedFinal { .. } => {
            "status = 'failed_final', error_code = $5, \
             lease_until = NULL, unknown_since = NULL, next_check_at = NULL, \
             updated_at = now(), last_reason = $5, review_required_at = NULL, \
             review_reason = NULL"
        }
        Settlement::Unknown { .. } => {
            "status = 'unknown', error_code = $5, \
             lease_until = NULL, unknown_since = COALESCE(unknown_since, now()), \
             next_check_at = CASE WHEN review_required_at IS NULL \
                 THEN now() + make_interval(secs => $6) END, \
             updated_at = now(), last_reason = $5"
        }
    }
}

/// [`JournalStore::register`]: the insert, or else the existing row, by the primary key.
/// The SELECT reads the statement's snapshot, while the insert's conflict check also sees a
/// row committed after it (it waits for a concurrent inserter): such a row is answered as
/// [`Registration::Raced`], and the caller reads it again.
fn register_sql() -> String {
    format!(
        "WITH inserted AS ({INSERT_AND_CLAIM} RETURNING {COLUMNS}, true AS inserted) \
         SELECT * FROM inserted \
         UNION ALL \
         SELECT {COLUMNS}, false AS inserted FROM agent_operations \
         WHERE namespace = $1 AND operation_key = $2 \
           AND NOT EXISTS (SELECT 1 FROM inserted)"
    )
}

/// [`JournalStore::settle_with_previous`]: a report by the primary key, answering the status
/// it replaced. The subquery locks the row's latest version before the update is applied, and
/// answers that version's status: under READ COMMITTED a concurrent change committed after
/// this statement's snapshot (the sweep, a release) is waited for and followed, the fence is
/// rechecked on the same latest version (EvalPlanQual), and the status returned is the one
/// the update replaced. The update takes the same lock mode, so nothing can change the row
/// between the lock and the update.
fn settle_with_previous_sql(settlement: &Settlement) -> String {
    format!(
        "UPDATE agent_operations SET {set}, {REPORTED} \
         FROM (SELECT status AS previous_status FROM agent_operations \
               WHERE namespace = $1 AND operation_key = $2 FOR NO KEY UPDATE) previous \
         WHERE {REPORT_FENCE} \
         RETURNING {COLUMNS}, previous.previous_status",
        set = settlement_set(settlement),
    )
}

/// Binds a report's parameters: the token's as `$1`..`$4`, the outcome's from `$5`.
fn bind_settlement<'q>(
    query: sqlx::query::Query<'q, Postgres, sqlx::postgres::PgArguments>,
    token: &'q LeaseToken,
    settlement: &Settlement,
) -> sqlx::query::Query<'q, Postgres, sqlx::postgres::PgArguments> {
    let query = query
        .bind(token.namespace.as_str())
        .bind(token.operation_key.as_str())
        .bind(token.attempt)
        .bind(token.lease_id);
    match settlement {
        Settlement::Succeeded {
            external_id,
            result_json,
        } => query
            .bind(external_id.as_ref().map(|id| id.as_str().to_owned()))
            .bind(result_json.clone()),
        Settlement::FailedFinal { error_code } => query.bind(error_code.as_str().to_owned()),
        Settlement::Unknown {
            error_code,
            first_check_after,
        } => query
            .bind(error_code.as_ref().map(|c| c.as_str().to_owned()))
            .bind(seconds(*first_check_after)),
    }
}

#[async_trait]
impl JournalStore for PgStore {
    async fn insert_and_claim(
        &self,
        new: &NewOperation,
    ) -> Result<Option<OperationRecord>, StoreError> {
        let sql = format!("{INSERT_AND_CLAIM} RETURNING {COLUMNS}");
        self.fetch_optional(bind_new(sqlx::query(trusted(sql)), new))
            .await
    }

    async fn register(&self, new: &NewOperation) -> Result<Registration, StoreError> {
        let sql = register_sql();
        let row = bind_new(sqlx::query(trusted(sql)), new)
            .fetch_optional(&self.pool)
            .await
            .map_err(classify)?;
        let Some(row) = row else {
            return Ok(Registration::Raced);
        };
        let inserted: bool = row
            .try_get("inserted")
            .map_err(|e| StoreError::Other(Box::new(e)))?;
        let record = record_from_row(&row)?;
        Ok(if inserted {
            Registration::Inserted(record)
        } else {
            Registration::Existing(record)
        })
    }

    async fn get(
        &self,
        namespace: &Namespace,
        key: &OperationKey,
    ) -> Result<Option<OperationRecord>, StoreError> {
        let sql = format!(
            "SELECT {COLUMNS} FROM agent_operations WHERE namespace = $1 AND operation_key = $2"
        );
        self.fetch_optional(
            sqlx::query(trusted(sql))
                .bind(namespace.as_str())
                .bind(key.as_str()),
        )
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
        let sql = format!(
            "UPDATE agent_operations \
             SET status = 'in_progress', attempt_count = attempt_count + 1, \
                 lease_until = now() + make_interval(secs => $5), lease_id = $6, \
                 error_code = NULL, unknown_since = NULL, next_check_at = NULL, \
                 last_actor_kind = 'client', last_actor = '', outcome_reported = false, \
                 last_reason = CASE WHEN status = 'pending' THEN 'claimed' \
                                    ELSE 'reclaimed_with_same_key' END, \
                 updated_at = now() \
             WHERE namespace = $1 AND operation_key = $2 \
               AND status = $3 AND attempt_count = $4 \
               AND review_required_at IS NULL \
               AND (status <> 'in_progress' OR lease_until <= now()) \
             RETURNING {COLUMNS}"
        );
        self.fetch_optional(
            sqlx::query(trusted(sql))
                .bind(namespace.as_str())
                .bind(key.as_str())
                .bind(expected_status.as_str())
                .bind(expected_attempt)
                .bind(seconds(lease))
                .bind(lease_id),
        )
        .await
    }

    async fn settle(
        &self,
        token: &LeaseToken,
        settlement: &Settlement,
    ) -> Result<Option<OperationRecord>, StoreError> {
        let sql = format!(
            "UPDATE agent_operations SET {set}, {REPORTED} WHERE {REPORT_FENCE} \
             RETURNING {COLUMNS}",
            set = settlement_set(settlement),
        );
        self.fetch_optional(bind_settlement(
            sqlx::query(trusted(sql)),
            token,
            settlement,
        ))
        .await
    }

    async fn settle_with_previous(
        &self,
        token: &LeaseToken,
        settlement: &Settlement,
    ) -> Result<Option<Settled>, StoreError> {
        let sql = settle_with_previous_sql(settlement);
        let row = bind_settlement(sqlx::query(trusted(sql)), token, settlement)
            .fetch_optional(&self.pool)
            .await
            .map_err(classify)?;
        let Some(row) = row else {
            return Ok(None);
        };
        let previous: String = row
            .try_get("previous_status")
            .map_err(|e| StoreError::Other(Box::new(e)))?;
        Ok(Some(Settled {
            record: record_from_row(&row)?,
            previous: Status::from_db(&previous).ok_or_else(|| corrupt("status"))?,
        }))
    }

    async fn renew(
        &self,
        token: &LeaseToken,
        lease: Duration,
    ) -> Result<Option<OperationRecord>, StoreError> {
        let sql = format!(
            "UPDATE agent_operations \
             SET lease_until = now() + make_interval(secs => $5), updated_at = now() \
             WHERE namespace = $1 AND operation_key = $2 AND attempt_count = $3 \
               AND lease_id = $4 AND status = 'in_progress' AND lease_until > now() \
             RETURNING {COLUMNS}"
        );
        self.fetch_optional(
            sqlx::query(trusted(sql))
                .bind(token.namespace.as_str())
                .bind(token.operation_key.as_str())
                .bind(token.attempt)
                .bind(token.lease_id)
                .bind(seconds(lease)),
        )
        .await
    }

    async fn list(&self, query: &ListQuery) -> Result<Vec<OperationRecord>, StoreError> {
        let mut sql = list_query(query);
        let rows = sql.build().fetch_all(&self.pool).await.map_err(classify)?;
        rows.iter().map(record_from_row).collect()
    }

    async fn resolve(
        &self,
        expected: &OperationRecord,
        resolution: &Resolution,
        attribution: &Attribution,
        lookup_made: bool,
    ) -> Result<Option<OperationRecord>, StoreError> {
        let clear_review = "review_required_at = NULL, review_reason = NULL";
        let set = match resolution {
            Resolution::Succeeded { .. } => format!(
                "status = 'succeeded', external_id = COALESCE($8, external_id), \
                 result_json = $9, error_code = NULL, lease_until = NULL, \
                 unknown_since = NULL, next_check_at = NULL, {clear_review}"
            ),
            Resolution::FailedFinal { .. } => format!(
                "status = 'failed_final', error_code = $8, lease_until = NULL, \
                 unknown_since = NULL, next_check_at = NULL, {clear_review}"
            ),
            Resolution::ReleaseForRetry => format!(
                "status = 'pending', lease_until = NULL, \
                 error_code = 'released_for_retry', unknown_since = NULL, \
                 next_check_at = NULL, {clear_review}"
            ),
            // An operation waiting for review is never scheduled again automatically.
            Resolution::KeepUnknown { .. } => "status = 'unknown', \
                 unknown_since = COALESCE(unknown_since, lease_until, now()), \
                 lease_until = NULL, \
                 next_check_at = CASE WHEN review_required_at IS NULL \
                     THEN now() + make_interval(secs => $8) END"
                .to_owned(),
            Resolution::Escalate { .. } => "status = 'unknown', \
                 unknown_since = COALESCE(unknown_since, lease_until, now()), \
                 lease_until = NULL, next_check_at = NULL, \
                 review_required_at = COALESCE(review_required_at, now()), \
                 review_reason = COALESCE(review_reason, $8)"
                .to_owned(),
        };
        let sql = format!(
            "UPDATE agent_operations SET {set}, reconcile_lease_until = NULL, \
                 reconcile_attempts = reconcile_attempts + $5, \
                 last_actor_kind = $6, last_actor = $7, last_reason = $10, \
                 updated_at = now() \
             WHERE namespace = $1 AND operation_key = $2 AND status = $3 \
               AND attempt_count = $4 \
               AND (status <> 'in_progress' OR lease_until <= now()) \
             RETURNING {COLUMNS}"
        );
        let query = sqlx::query(trusted(sql))
            .bind(expected.namespace.as_str())
            .bind(expected.operation_key.as_str())
            .bind(expected.status.as_str())
            .bind(expected.attempt_count)
            .bind(i32::from(lookup_made))
            .bind(attribution.kind.as_str())
            .bind(truncate(&attribution.actor, 200));
        let query = match resolution {
            Resolution::Succeeded {
                external_id,
                result_json,
            } => query.bind(external_id.clone()).bind(result_json.clone()),
            Resolution::FailedFinal { error_code } => {
                query.bind(error_code.clone()).bind(None::<String>)
            }
            Resolution::ReleaseForRetry => query.bind(None::<String>).bind(None::<String>),
            Resolution::KeepUnknown { next_check_after } => {
                query.bind(seconds(*next_check_after)).bind(None::<String>)
            }
            Resolution::Escalate { reason } => query.bind(reason.clone()).bind(None::<String>),
        };
        let query = query.bind(attribution.reason.as_deref().map(|r| truncate(r, 500)));
        self.fetch_optional(query).await
    }

    async fn sweep_expired_leases(&self, limit: i64, worker: &str) -> Result<u64, StoreError> {
        let result = sqlx::query(SWEEP_EXPIRED_LEASES_SQL)
            .bind(limit)
            .bind(truncate(worker, 200))
            .execute(&self.pool)
            .await
            .map_err(classify)?;
        Ok(result.rows_affected())
    }

    async fn list_review(
        &self,
        namespace: &Namespace,
        after: Option<(DateTime<Utc>, String)>,
        limit: i64,
    ) -> Result<Vec<OperationRecord>, StoreError> {
        let mut sql = list_review_query(namespace, after, limit);
        let rows = sql.build().fetch_all(&self.pool).await.map_err(classify)?;
        rows.iter().map(record_from_row).collect()
    }

    async fn history(
        &self,
        namespace: &Namespace,
        key: &OperationKey,
        after_event_id: i64,
        limit: i64,
    ) -> Result<Vec<OperationEvent>, StoreError> {
        let rows = sqlx::query(HISTORY_SQL)
            .bind(namespace.as_str())
            .bind(key.as_str())
            .bind(after_event_id)
            .bind(limit)
            .fetch_all(&self.pool)
            .await
            .map_err(classify)?;
        rows.iter().map(event_from_row).collect()
    }

    async fn claim_due(
        &self,
        limit: i64,
        hold: Duration,
    ) -> Result<Vec<OperationRecord>, StoreError> {
        let sql = claim_due_sql();
        let rows = sqlx::query(trusted(sql))
            .bind(limit)
            .bind(seconds(hold))
            .fetch_all(&self.pool)
            .await
            .map_err(classify)?;
        rows.iter().map(record_from_row).collect()
    }

    async fn claim_for_reconcile(
        &self,
        namespace: &Namespace,
        key: &OperationKey,
        hold: Duration,
    ) -> Result<Option<OperationRecord>, StoreError> {
        let sql = claim_for_reconcile_sql();
        self.fetch_optional(
            sqlx::query(trusted(sql))
                .bind(namespace.as_str())
                .bind(key.as_str())
                .bind(seconds(hold)),
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
        sqlx::query_scalar(FIND_SAME_REQUEST_SQL)
            .bind(namespace.as_str())
            .bind(action_type.as_str())
            .bind(request_hash.to_hex())
            .bind(other_than.as_str())
            .bind(seconds(window))
            .fetch_optional(&self.pool)
            .await
            .map_err(classify)
    }

    async fn purge(&self, limit: i64) -> Result<u64, StoreError> {
        let purged: i64 = sqlx::query_scalar(PURGE_SQL)
            .bind(limit)
            .fetch_one(&self.pool)
            .await
            .map_err(classify)?;
        Ok(u64::try_from(purged).unwrap_or(0))
    }

    async fn ping(&self) -> Result<(), StoreError> {
        sqlx::query("SELECT 1")
            .execute(&self.pool)
            .await
            .map_err(classify)?;
        Ok(())
    }

    async fn backlog_stats(&self) -> Result<BacklogStats, StoreError> {
        let row = sqlx::query(BACKLOG_STATS_SQL)
            .fetch_one(&self.pool)
            .await
            .map_err(classify)?;
        let get_err = |e: sqlx::Error| StoreError::Other(Box::new(e));
        let unknown: i64 = row.try_get("unknown").map_err(get_err)?;
        let review_queue: i64 = row.try_get("review_queue").map_err(get_err)?;
        let oldest: Option<f64> = row.try_get("oldest_unknown_seconds").map_err(get_err)?;
        Ok(BacklogStats::from_columns(unknown, oldest, review_queue))
    }

    async fn analyze_new_tables(&self, min_changes: i64) -> Result<Option<u64>, StoreError> {
        let unanalyzed: Vec<(String, i64)> = sqlx::query_as(
            "SELECT relname::text, n_mod_since_analyze FROM pg_stat_user_tables \
             WHERE schemaname = current_schema() \
               AND relname IN ('agent_operations', 'operation_events') \
               AND last_analyze IS NULL AND last_autoanalyze IS NULL",
        )
        .fetch_all(&self.pool)
        .await
        .map_err(classify)?;
        if unanalyzed.is_empty() {
            return Ok(None);
        }
        let mut analyzed = 0;
        for (table, changes) in unanalyzed {
            // Only these two names can come back; each statement is a constant.
            let statement = match table.as_str() {
                "agent_operations" => "ANALYZE agent_operations",
                "operation_events" => "ANALYZE operation_events",
                _ => continue,
            };
            if changes < min_changes {
                continue;
            }
            sqlx::query(statement)
                .execute(&self.pool)
                .await
                .map_err(classify)?;
            analyzed += 1;
        }
        Ok(Some(analyzed))
    }
}

/// A statement of this backend, named by the store method that runs it, for the query
/// plans the benchmark shows (docs/performance.md).
#[derive(Debug, Clone)]
pub struct ExplainedStatement {
    /// The store method (and variant) that runs it.
    pub name: &'static str,
    /// The statement as the method sends it, with `$n` parameters.
    pub sql: String,
}

/// The statements whose cost must not grow with the journal: the client hot path, the
/// reconcile worker's scans, the purge and the operator's listings, each as its method
/// sends it (list queries on their next-page variant, the broadest).
pub fn explained_statements() -> Vec<ExplainedStatement> {
    let statement = |name, sql: &str| ExplainedStatement {
        name,
        sql: sql.to_owned(),
    };
    let page_after = Some((DateTime::<Utc>::UNIX_EPOCH, String::new()));
    let list = ListQuery {
        namespace: Namespace::default(),
        status: Some(Status::Unknown),
        action_type: None,
        after: page_after.clone(),
        limit: 50,
    };
    let succeeded = Settlement::Succeeded {
        external_id: None,
        result_json: None,
    };
    vec![
        statement("register", &register_sql()),
        statement(
            "settle_with_previous (succeeded)",
            &settle_with_previous_sql(&succeeded),
        ),
        statement("find_same_request", FIND_SAME_REQUEST_SQL),
        statement("sweep_expired_leases", SWEEP_EXPIRED_LEASES_SQL),
        statement("claim_due", &claim_due_sql()),
        statement("claim_for_reconcile", &claim_for_reconcile_sql()),
        statement("purge", PURGE_SQL),
        statement("backlog_stats", BACKLOG_STATS_SQL),
        statement("history", HISTORY_SQL),
        statement("list (by status)", list_query(&list).sql().as_str()),
        statement(
            "list_review",
            list_review_query(&Namespace::default(), page_after, 50)
                .sql()
                .as_str(),
        ),
    ]
}
