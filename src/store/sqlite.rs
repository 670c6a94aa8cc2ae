//! The embedded backend: the journal in one SQLite file, for one node (development, a single
//! machine, small deployments). Same contract and observable behaviour as
//! [`PgStore`](super::PgStore); see docs/storage.md for what it is for and when to move to
//! Postgres.
//!
//! How the contract holds on SQLite:
//!
//! - Every change is one `INSERT … ON CONFLICT DO NOTHING RETURNING` or
//!   `UPDATE … WHERE <expected state> RETURNING` statement. SQLite runs one writer at a time
//!   per file (across processes too): a writing statement in autocommit mode takes the write
//!   lock before it reads anything, so its `WHERE` sees the latest committed state and the
//!   compare-and-set is atomic. Batch claims (`claim_due`, the sweep) select their rows inside
//!   the same statement, so two workers — two processes on one file included — never take one
//!   operation twice; there is no `SKIP LOCKED` to need.
//! - `purge` deletes an operation and its history in one short `BEGIN IMMEDIATE` transaction
//!   (SQLite has no data-modifying CTE); nothing slow runs inside it.
//! - Time is the database's: `'now'` is read once per statement (SQLite keeps it fixed for the
//!   whole statement, triggers included), with millisecond precision; the process clock never
//!   decides a lease. Times are stored as fixed-width UTC text (`2026-11-30T12:00:00.123Z`),
//!   which compares as the times do; the schema refuses any other form.
//! - Terminal rows, the append-only history, the history entries themselves and `purge_after`
//!   come from triggers, as on Postgres (`migrations/sqlite/`).
//! - Connections use WAL (readers never block the writer), `synchronous = FULL` (a commit is
//!   on disk before the answer leaves: an acknowledged Begin or report survives a power
//!   loss), foreign keys on, and a busy timeout of [`BUSY_TIMEOUT`]: a statement waits that
//!   long for the write lock, then fails as unavailable (`STORE_UNAVAILABLE`, retryable).

use std::path::{Path, PathBuf};
use std::str::FromStr as _;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, SecondsFormat, Utc};
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteRow,
    SqliteSynchronous,
};
use sqlx::{ConnectOptions as _, Connection as _, QueryBuilder, Row, Sqlite};
use uuid::Uuid;

use super::{
    BacklogStats, JournalStore, ListQuery, NewOperation, Resolution, Settlement, StoreError,
};
use crate::domain::canonical::RequestHash;
use crate::domain::lease::LeaseToken;
use crate::domain::model::{
    ActionType, ActorKind, Attribution, Namespace, OperationEvent, OperationKey, OperationRecord,
    Status,
};

/// The migrations of this backend (`migrations/sqlite/`), embedded in the binary. The
/// Postgres migrator reads only the files directly in `migrations/`, never this directory.
pub static SQLITE_MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations/sqlite");

/// How long a statement waits for another writer (another statement of this process, or
/// another process on the same file) before it fails as unavailable.
pub const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// How long `prepare` keeps retrying while another process is preparing the same file.
const PREPARE_PATIENCE: Duration = Duration::from_secs(30);

/// The database clock as stored: UTC, milliseconds, fixed width.
const NOW: &str = "strftime('%Y-%m-%dT%H:%M:%fZ', 'now')";

/// The database clock plus the seconds bound at parameter `param` (e.g. `$5`).
fn now_plus(param: &str) -> String {
    format!("strftime('%Y-%m-%dT%H:%M:%fZ', 'now', printf('%+.3f seconds', {param}))")
}

/// The database clock minus the seconds bound at parameter `param`.
fn now_minus(param: &str) -> String {
    format!("strftime('%Y-%m-%dT%H:%M:%fZ', 'now', printf('%+.3f seconds', -({param})))")
}

/// A time bound into a statement, in the stored form (see [`NOW`]).
fn stored_time(at: DateTime<Utc>) -> String {
    at.to_rfc3339_opts(SecondsFormat::Millis, true)
}

/// Every column of a record, plus the database clock. The one place that names them: a new
/// column is added here and in [`record_from_row`].
fn columns() -> String {
    format!(
        "namespace, operation_key, action_type, request_hash, status, attempt_count, \
         external_id, result_json, error_code, lease_until, lease_id, business_references, \
         unknown_since, next_check_at, reconcile_attempts, created_at, updated_at, \
         review_required_at, review_reason, last_actor_kind, action_policy, trace_context, \
         {NOW} AS observed_at"
    )
}

/// Why a `sqlite:` URL cannot hold the journal.
#[derive(Debug, thiserror::Error)]
pub enum SqliteUrlError {
    /// No file named.
    #[error("a sqlite: database_url must name a file, e.g. sqlite://opjournal-data/journal.db")]
    NoFile,
    /// An in-memory database: the journal would vanish with the process.
    #[error(
        "an in-memory SQLite database loses the journal when the process exits; name a file, \
         e.g. sqlite://opjournal-data/journal.db"
    )]
    InMemory,
    /// Read-only or immutable: the journal must be written.
    #[error("the journal's SQLite file must be writable (remove mode=ro / immutable)")]
    ReadOnly,
    /// The URL does not parse.
    #[error("invalid sqlite: URL: {0}")]
    Invalid(String),
}

/// The file a `sqlite:` URL names (`sqlite://relative/path.db`, `sqlite:///absolute/path.db`
/// or `sqlite:path.db`), with the connection options the journal needs.
///
/// Errors: no file, an in-memory or read-only database, an unknown URL parameter.
pub fn parse_url(url: &str) -> Result<(PathBuf, SqliteConnectOptions), SqliteUrlError> {
    let rest = url
        .strip_prefix("sqlite://")
        .or_else(|| url.strip_prefix("sqlite:"))
        .ok_or_else(|| SqliteUrlError::Invalid("not a sqlite: URL".into()))?;
    let (path, query) = rest.split_once('?').unwrap_or((rest, ""));
    if path.is_empty() {
        return Err(SqliteUrlError::NoFile);
    }
    if path == ":memory:" || query.split('&').any(|pair| pair == "mode=memory") {
        return Err(SqliteUrlError::InMemory);
    }
    let options =
        SqliteConnectOptions::from_str(url).map_err(|e| SqliteUrlError::Invalid(e.to_string()))?;
    if query
        .split('&')
        .any(|pair| matches!(pair, "mode=ro" | "immutable=true" | "immutable=1"))
    {
        return Err(SqliteUrlError::ReadOnly);
    }
    let file = options.get_filename().to_path_buf();
    let options = options
        .journal_mode(SqliteJournalMode::Wal)
        .synchronous(SqliteSynchronous::Full)
        .foreign_keys(true)
        .busy_timeout(BUSY_TIMEOUT);
    Ok((file, options))
}

/// The journal in one SQLite file.
#[derive(Debug, Clone)]
pub struct SqliteStore {
    pool: SqlitePool,
    file: PathBuf,
    options: Arc<SqliteConnectOptions>,
}

impl SqliteStore {
    /// Creates a lazily connecting pool of at most `max_connections` on the file `url`
    /// names. Nothing is created or opened yet: [`prepare`](Self::prepare) creates the file
    /// and its schema; other commands expect it to exist.
    ///
    /// Errors: the URL is unusable (see [`parse_url`]).
    pub fn connect_lazy(url: &str, max_connections: u32) -> Result<Self, StoreError> {
        let (file, options) = parse_url(url).map_err(|e| StoreError::Other(Box::new(e)))?;
        let pool = SqlitePoolOptions::new()
            .max_connections(max_connections)
            .acquire_timeout(Duration::from_secs(3))
            .connect_lazy_with(options.clone());
        Ok(Self {
            pool,
            file,
            options: Arc::new(options),
        })
    }

    /// The underlying pool.
    pub fn pool(&self) -> &SqlitePool {
        &self.pool
    }

    /// The journal file.
    pub fn file(&self) -> &Path {
        &self.file
    }

    /// Creates the file's directory and the file if missing, switches it to WAL, and applies
    /// pending migrations. Safe to run from several processes at once: the migrations run in
    /// one `BEGIN IMMEDIATE` transaction, so a second process waits, then finds them applied.
    ///
    /// Errors: the directory or file cannot be created (`Unavailable`), a migration fails or
    /// the file holds migrations this binary does not know (`Other`).
    pub async fn prepare(&self) -> Result<(), StoreError> {
        if let Some(dir) = self.file.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|e| StoreError::Unavailable(Box::new(e)))?;
        }
        let deadline = tokio::time::Instant::now() + PREPARE_PATIENCE;
        loop {
            match self.migrate_once().await {
                // Switching a new file to WAL takes an exclusive lock that the busy timeout
                // does not wait for: another process preparing the same file makes it fail
                // for a moment.
                Err(error) if is_busy(&error) && tokio::time::Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                other => return other,
            }
        }
    }

    /// Applies pending migrations once, creating the file (not its directory) if missing;
    /// [`prepare`](Self::prepare) also creates the directory and waits out another process
    /// switching a new file to WAL.
    ///
    /// Errors: as `prepare`.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        self.migrate_once().await
    }

    async fn migrate_once(&self) -> Result<(), StoreError> {
        let mut conn = SqliteConnectOptions::clone(&self.options)
            .create_if_missing(true)
            .connect()
            .await
            .map_err(classify)?;
        let mut tx = conn.begin_with("BEGIN IMMEDIATE").await.map_err(classify)?;
        SQLITE_MIGRATOR.run(&mut *tx).await.map_err(|e| match e {
            sqlx::migrate::MigrateError::Execute(e) => classify(e),
            other => StoreError::Other(Box::new(other)),
        })?;
        tx.commit().await.map_err(classify)?;
        conn.close().await.map_err(classify)
    }

    async fn fetch_optional(
        &self,
        query: sqlx::query::Query<'_, Sqlite, sqlx::sqlite::SqliteArguments>,
    ) -> Result<Option<OperationRecord>, StoreError> {
        query
            .fetch_optional(&self.pool)
            .await
            .map_err(classify)?
            .map(|row| record_from_row(&row))
            .transpose()
    }

    async fn fetch_all(
        &self,
        query: sqlx::query::Query<'_, Sqlite, sqlx::sqlite::SqliteArguments>,
    ) -> Result<Vec<OperationRecord>, StoreError> {
        let rows = query.fetch_all(&self.pool).await.map_err(classify)?;
        rows.iter().map(record_from_row).collect()
    }
}

/// Splits sqlx errors into "unavailable" (retry later, nothing changed) and the rest.
pub(crate) fn classify(error: sqlx::Error) -> StoreError {
    let unavailable = match &error {
        sqlx::Error::Io(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed => true,
        sqlx::Error::Database(db) => db
            .code()
            .and_then(|code| code.parse::<i32>().ok())
            // The primary result code is the low byte of the extended one: SQLITE_BUSY (5),
            // SQLITE_LOCKED (6), SQLITE_IOERR (10), SQLITE_FULL (13), SQLITE_CANTOPEN (14).
            .is_some_and(|code| matches!(code & 0xff, 5 | 6 | 10 | 13 | 14)),
        _ => false,
    };
    if unavailable {
        StoreError::Unavailable(Box::new(error))
    } else {
        StoreError::Other(Box::new(error))
    }
}

/// Whether `error` is SQLITE_BUSY or SQLITE_LOCKED: another connection holds the lock.
fn is_busy(error: &StoreError) -> bool {
    let StoreError::Unavailable(source) = error else {
        return false;
    };
    match source.downcast_ref::<sqlx::Error>() {
        Some(sqlx::Error::Database(db)) => db
            .code()
            .and_then(|code| code.parse::<i32>().ok())
            .is_some_and(|code| matches!(code & 0xff, 5 | 6)),
        _ => false,
    }
}

fn corrupt(what: &str) -> StoreError {
    StoreError::Other(format!("corrupt journal row: {what}").into())
}

fn record_from_row(row: &SqliteRow) -> Result<OperationRecord, StoreError> {
    let get_err = |e: sqlx::Error| StoreError::Other(Box::new(e));
    let status: String = row.try_get("status").map_err(get_err)?;
    let hash: String = row.try_get("request_hash").map_err(get_err)?;
    let namespace: String = row.try_get("namespace").map_err(get_err)?;
    let key: String = row.try_get("operation_key").map_err(get_err)?;
    let action: String = row.try_get("action_type").map_err(get_err)?;
    let references: String = row.try_get("business_references").map_err(get_err)?;
    let lease_id: Option<String> = row.try_get("lease_id").map_err(get_err)?;
    Ok(OperationRecord {
        namespace: Namespace::parse(&namespace).map_err(|_| corrupt("namespace"))?,
        operation_key: OperationKey::parse(&key).map_err(|_| corrupt("operation_key"))?,
        action_type: ActionType::parse(&action).map_err(|_| corrupt("action_type"))?,
        request_hash: RequestHash::from_hex(&hash).ok_or_else(|| corrupt("request_hash"))?,
        status: Status::from_db(&status).ok_or_else(|| corrupt("status"))?,
        attempt_count: row.try_get("attempt_count").map_err(get_err)?,
        lease_id: lease_id
            .map(|id| Uuid::parse_str(&id).map_err(|_| corrupt("lease_id")))
            .transpose()?,
        lease_until: row.try_get("lease_until").map_err(get_err)?,
        external_id: row.try_get("external_id").map_err(get_err)?,
        result_json: row.try_get("result_json").map_err(get_err)?,
        error_code: row.try_get("error_code").map_err(get_err)?,
        references: serde_json::from_str(&references)
            .map_err(|_| corrupt("business_references"))?,
        unknown_since: row.try_get("unknown_since").map_err(get_err)?,
        next_check_at: row.try_get("next_check_at").map_err(get_err)?,
        reconcile_attempts: row.try_get("reconcile_attempts").map_err(get_err)?,
        review_required_at: row.try_get("review_required_at").map_err(get_err)?,
        review_reason: row.try_get("review_reason").map_err(get_err)?,
        action_policy: {
            let stored: Option<String> = row.try_get("action_policy").map_err(get_err)?;
            // A policy recorded by a newer version may not parse here: fall back to the
            // current file for it rather than fail the operation.
            stored.and_then(|text| serde_json::from_str(&text).ok())
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

fn event_from_row(row: &SqliteRow) -> Result<OperationEvent, StoreError> {
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

/// SQL assembled in this file from constant fragments only; every value is bound.
fn trusted(sql: String) -> sqlx::AssertSqlSafe<String> {
    sqlx::AssertSqlSafe(sql)
}

fn truncate(text: &str, chars: usize) -> String {
    text.chars().take(chars).collect()
}

fn seconds(duration: Duration) -> f64 {
    duration.as_secs_f64()
}

fn json_text(value: &impl serde::Serialize) -> Result<String, StoreError> {
    serde_json::to_string(value).map_err(|e| StoreError::Other(Box::new(e)))
}

#[async_trait]
impl JournalStore for SqliteStore {
    async fn insert_and_claim(
        &self,
        new: &NewOperation,
    ) -> Result<Option<OperationRecord>, StoreError> {
        let sql = format!(
            "INSERT INTO agent_operations (namespace, operation_key, action_type, request_hash, \
                 status, attempt_count, lease_until, lease_id, business_references, \
                 last_actor_kind, last_actor, last_reason, action_policy, trace_context, \
                 created_at, updated_at) \
             VALUES ($1, $2, $3, $4, 'in_progress', 1, {lease_until}, $6, $7, 'client', '', \
                 'registered', $8, $9, {NOW}, {NOW}) \
             ON CONFLICT (namespace, operation_key) DO NOTHING \
             RETURNING {columns}",
            lease_until = now_plus("$5"),
            columns = columns(),
        );
        self.fetch_optional(
            sqlx::query(trusted(sql))
                .bind(new.namespace.as_str())
                .bind(new.operation_key.as_str())
                .bind(new.action_type.as_str())
                .bind(new.request_hash.to_hex())
                .bind(seconds(new.lease))
                .bind(new.lease_id.hyphenated().to_string())
                .bind(json_text(&new.references)?)
                .bind(json_text(&new.action_policy)?)
                .bind(new.trace_context.as_deref()),
        )
        .await
    }

    async fn get(
        &self,
        namespace: &Namespace,
        key: &OperationKey,
    ) -> Result<Option<OperationRecord>, StoreError> {
        let sql = format!(
            "SELECT {} FROM agent_operations WHERE namespace = $1 AND operation_key = $2",
            columns()
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
                 lease_until = {lease_until}, lease_id = $6, \
                 error_code = NULL, unknown_since = NULL, next_check_at = NULL, \
                 last_actor_kind = 'client', last_actor = '', outcome_reported = FALSE, \
                 last_reason = CASE WHEN status = 'pending' THEN 'claimed' \
                                    ELSE 'reclaimed_with_same_key' END, \
                 updated_at = {NOW} \
             WHERE namespace = $1 AND operation_key = $2 \
               AND status = $3 AND attempt_count = $4 \
               AND review_required_at IS NULL \
               AND (status <> 'in_progress' OR lease_until <= {NOW}) \
             RETURNING {columns}",
            lease_until = now_plus("$5"),
            columns = columns(),
        );
        self.fetch_optional(
            sqlx::query(trusted(sql))
                .bind(namespace.as_str())
                .bind(key.as_str())
                .bind(expected_status.as_str())
                .bind(expected_attempt)
                .bind(seconds(lease))
                .bind(lease_id.hyphenated().to_string()),
        )
        .await
    }

    async fn settle(
        &self,
        token: &LeaseToken,
        settlement: &Settlement,
    ) -> Result<Option<OperationRecord>, StoreError> {
        // The holder of an attempt reports once, while no later attempt exists: from
        // in_progress (even after its lease ended), or from unknown or pending when the sweep
        // or a release, not the holder, put it there.
        let fence = "last_actor_kind = 'client', last_actor = '', outcome_reported = TRUE \
                     WHERE namespace = $1 AND operation_key = $2 \
                     AND attempt_count = $3 AND lease_id = $4 \
                     AND (status = 'in_progress' \
                          OR (status IN ('unknown', 'pending') AND NOT outcome_reported))";
        let columns = columns();
        let sql = match settlement {
            Settlement::Succeeded { .. } => format!(
                "UPDATE agent_operations SET status = 'succeeded', external_id = $5, \
                     result_json = $6, error_code = NULL, lease_until = NULL, \
                     unknown_since = NULL, next_check_at = NULL, updated_at = {NOW}, \
                     last_reason = 'completed', review_required_at = NULL, \
                     review_reason = NULL, \
                 {fence} RETURNING {columns}"
            ),
            Settlement::FailedFinal { .. } => format!(
                "UPDATE agent_operations SET status = 'failed_final', error_code = $5, \
                     lease_until = NULL, unknown_since = NULL, next_check_at = NULL, \
                     updated_at = {NOW}, last_reason = $5, review_required_at = NULL, \
                     review_reason = NULL, \
                 {fence} RETURNING {columns}"
            ),
            Settlement::Unknown { .. } => format!(
                "UPDATE agent_operations SET status = 'unknown', error_code = $5, \
                     lease_until = NULL, unknown_since = COALESCE(unknown_since, {NOW}), \
                     next_check_at = CASE WHEN review_required_at IS NULL \
                         THEN {next_check} END, \
                     updated_at = {NOW}, last_reason = $5, \
                 {fence} RETURNING {columns}",
                next_check = now_plus("$6"),
            ),
        };
        let query = sqlx::query(trusted(sql))
            .bind(token.namespace.as_str())
            .bind(token.operation_key.as_str())
            .bind(token.attempt)
            .bind(token.lease_id.hyphenated().to_string());
        let query = match settlement {
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
        };
        self.fetch_optional(query).await
    }

    async fn renew(
        &self,
        token: &LeaseToken,
        lease: Duration,
    ) -> Result<Option<OperationRecord>, StoreError> {
        let sql = format!(
            "UPDATE agent_operations \
             SET lease_until = {lease_until}, updated_at = {NOW} \
             WHERE namespace = $1 AND operation_key = $2 AND attempt_count = $3 \
               AND lease_id = $4 AND status = 'in_progress' AND lease_until > {NOW} \
             RETURNING {columns}",
            lease_until = now_plus("$5"),
            columns = columns(),
        );
        self.fetch_optional(
            sqlx::query(trusted(sql))
                .bind(token.namespace.as_str())
                .bind(token.operation_key.as_str())
                .bind(token.attempt)
                .bind(token.lease_id.hyphenated().to_string())
                .bind(seconds(lease)),
        )
        .await
    }

    async fn list(&self, query: &ListQuery) -> Result<Vec<OperationRecord>, StoreError> {
        let mut sql: QueryBuilder<Sqlite> = QueryBuilder::new(format!(
            "SELECT {} FROM agent_operations WHERE namespace = ",
            columns()
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
                .push_bind(stored_time(*created_at))
                .push(", ")
                .push_bind(key.as_str())
                .push(")");
        }
        sql.push(" ORDER BY created_at DESC, operation_key DESC LIMIT ")
            .push_bind(query.limit);
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
            Resolution::KeepUnknown { .. } => format!(
                "status = 'unknown', \
                 unknown_since = COALESCE(unknown_since, lease_until, {NOW}), \
                 lease_until = NULL, \
                 next_check_at = CASE WHEN review_required_at IS NULL THEN {next_check} END",
                next_check = now_plus("$8"),
            ),
            Resolution::Escalate { .. } => format!(
                "status = 'unknown', \
                 unknown_since = COALESCE(unknown_since, lease_until, {NOW}), \
                 lease_until = NULL, next_check_at = NULL, \
                 review_required_at = COALESCE(review_required_at, {NOW}), \
                 review_reason = COALESCE(review_reason, $8)"
            ),
        };
        let sql = format!(
            "UPDATE agent_operations SET {set}, reconcile_lease_until = NULL, \
                 reconcile_attempts = reconcile_attempts + $5, \
                 last_actor_kind = $6, last_actor = $7, last_reason = $10, \
                 updated_at = {NOW} \
             WHERE namespace = $1 AND operation_key = $2 AND status = $3 \
               AND attempt_count = $4 \
               AND (status <> 'in_progress' OR lease_until <= {NOW}) \
             RETURNING {columns}",
            columns = columns(),
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
        // One statement: the batch is chosen under the write lock, so two sweepers never
        // move one row twice, and the outer WHERE repeats the condition for clarity.
        let sql = format!(
            "UPDATE agent_operations \
             SET status = 'unknown', error_code = 'lease_expired', \
                 unknown_since = lease_until, lease_until = NULL, \
                 next_check_at = {NOW}, updated_at = {NOW}, \
                 last_actor_kind = 'worker', last_actor = $2, last_reason = 'lease_expired' \
             WHERE rowid IN ( \
                 SELECT rowid FROM agent_operations \
                 WHERE status = 'in_progress' AND lease_until < {NOW} \
                 ORDER BY lease_until LIMIT $1) \
               AND status = 'in_progress' AND lease_until < {NOW}"
        );
        let result = sqlx::query(trusted(sql))
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
        let mut sql: QueryBuilder<Sqlite> = QueryBuilder::new(format!(
            "SELECT {} FROM agent_operations \
             WHERE review_required_at IS NOT NULL AND namespace = ",
            columns()
        ));
        sql.push_bind(namespace.as_str());
        if let Some((at, key)) = after {
            sql.push(" AND (review_required_at, operation_key) > (")
                .push_bind(stored_time(at))
                .push(", ")
                .push_bind(key)
                .push(")");
        }
        sql.push(" ORDER BY review_required_at, operation_key LIMIT ")
            .push_bind(limit);
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
        let rows = sqlx::query(
            "SELECT event_id, from_status, to_status, attempt_count, review, actor_kind, \
                 actor, reason, occurred_at \
             FROM operation_events \
             WHERE namespace = $1 AND operation_key = $2 AND event_id > $3 \
             ORDER BY event_id LIMIT $4",
        )
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
        // One statement under the write lock: a row claimed here has its reconcile lease set
        // before any other claimer (this process or another on the file) can read it.
        let sql = format!(
            "UPDATE agent_operations \
             SET next_check_at = {until}, reconcile_lease_until = {until} \
             WHERE rowid IN ( \
                 SELECT rowid FROM agent_operations \
                 WHERE status = 'unknown' AND next_check_at <= {NOW} \
                   AND (reconcile_lease_until IS NULL OR reconcile_lease_until < {NOW}) \
                 ORDER BY next_check_at LIMIT $1) \
             RETURNING {columns}",
            until = now_plus("$2"),
            columns = columns(),
        );
        self.fetch_all(sqlx::query(trusted(sql)).bind(limit).bind(seconds(hold)))
            .await
    }

    async fn claim_for_reconcile(
        &self,
        namespace: &Namespace,
        key: &OperationKey,
        hold: Duration,
    ) -> Result<Option<OperationRecord>, StoreError> {
        let sql = format!(
            "UPDATE agent_operations SET reconcile_lease_until = {until} \
             WHERE namespace = $1 AND operation_key = $2 \
               AND (status = 'unknown' OR (status = 'in_progress' AND lease_until <= {NOW})) \
               AND (reconcile_lease_until IS NULL OR reconcile_lease_until < {NOW}) \
             RETURNING {columns}",
            until = now_plus("$3"),
            columns = columns(),
        );
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
        let sql = format!(
            "SELECT operation_key FROM agent_operations \
             WHERE namespace = $1 AND action_type = $2 AND request_hash = $3 \
               AND operation_key <> $4 \
               AND (status IN ('pending', 'in_progress', 'unknown') \
                    OR (status = 'succeeded' AND updated_at > {since})) \
             ORDER BY created_at DESC LIMIT 1",
            since = now_minus("$5"),
        );
        sqlx::query_scalar(trusted(sql))
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
        // SQLite has no data-modifying CTE: the batch, its history and the operations go in
        // one short write transaction, taken up front so the batch cannot change under it.
        let mut tx = self
            .pool
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(classify)?;
        let doomed: Vec<i64> = sqlx::query_scalar(trusted(format!(
            "SELECT rowid FROM agent_operations \
             WHERE purge_after < {NOW} AND status IN ('succeeded', 'failed_final') \
             ORDER BY purge_after LIMIT $1"
        )))
        .bind(limit)
        .fetch_all(&mut *tx)
        .await
        .map_err(classify)?;
        if doomed.is_empty() {
            tx.rollback().await.map_err(classify)?;
            return Ok(0);
        }
        let doomed = json_text(&doomed)?;
        sqlx::query(
            "DELETE FROM operation_events \
             WHERE (namespace, operation_key) IN ( \
                 SELECT namespace, operation_key FROM agent_operations \
                 WHERE rowid IN (SELECT value FROM json_each($1)))",
        )
        .bind(&doomed)
        .execute(&mut *tx)
        .await
        .map_err(classify)?;
        let gone = sqlx::query(
            "DELETE FROM agent_operations \
             WHERE rowid IN (SELECT value FROM json_each($1)) \
               AND status IN ('succeeded', 'failed_final')",
        )
        .bind(&doomed)
        .execute(&mut *tx)
        .await
        .map_err(classify)?
        .rows_affected();
        tx.commit().await.map_err(classify)?;
        Ok(gone)
    }

    async fn backlog_stats(&self) -> Result<BacklogStats, StoreError> {
        // Each part is answered by a partial index (unknown_since, review_queue), as on
        // Postgres, so the cost follows the backlog, not the journal.
        let sql = format!(
            "SELECT \
               (SELECT count(*) FROM agent_operations WHERE status = 'unknown') AS unknown, \
               (SELECT (julianday({NOW}) - julianday(min(unknown_since))) * 86400.0 \
                  FROM agent_operations WHERE status = 'unknown') AS oldest_unknown_seconds, \
               (SELECT count(*) FROM agent_operations WHERE review_required_at IS NOT NULL) \
                  AS review_queue"
        );
        let row = sqlx::query(trusted(sql))
            .fetch_one(&self.pool)
            .await
            .map_err(classify)?;
        let get_err = |e: sqlx::Error| StoreError::Other(Box::new(e));
        let unknown: i64 = row.try_get("unknown").map_err(get_err)?;
        let review_queue: i64 = row.try_get("review_queue").map_err(get_err)?;
        let oldest: Option<f64> = row.try_get("oldest_unknown_seconds").map_err(get_err)?;
        Ok(BacklogStats::from_columns(unknown, oldest, review_queue))
    }

    async fn ping(&self) -> Result<(), StoreError> {
        // Reads the schema, so that a file that is missing or not yet prepared is not ready.
        sqlx::query("SELECT 1 FROM agent_operations LIMIT 0")
            .execute(&self.pool)
            .await
            .map_err(classify)?;
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn urls_name_a_writable_file() {
        let (file, _) = parse_url("sqlite://opjournal-data/journal.db").unwrap();
        assert_eq!(file, Path::new("opjournal-data/journal.db"));
        let (file, _) = parse_url("sqlite:///var/lib/opjournal/journal.db").unwrap();
        assert_eq!(file, Path::new("/var/lib/opjournal/journal.db"));
        let (file, _) = parse_url("sqlite:journal.db").unwrap();
        assert_eq!(file, Path::new("journal.db"));
        assert!(matches!(
            parse_url("sqlite::memory:"),
            Err(SqliteUrlError::InMemory)
        ));
        assert!(matches!(
            parse_url("sqlite://x.db?mode=memory"),
            Err(SqliteUrlError::InMemory)
        ));
        assert!(matches!(
            parse_url("sqlite://x.db?mode=ro"),
            Err(SqliteUrlError::ReadOnly)
        ));
        assert!(matches!(
            parse_url("sqlite://"),
            Err(SqliteUrlError::NoFile)
        ));
        assert!(matches!(
            parse_url("sqlite://x.db?colour=blue"),
            Err(SqliteUrlError::Invalid(_))
        ));
    }

    #[test]
    fn stored_times_are_fixed_width_utc_milliseconds() {
        let at = DateTime::parse_from_rfc3339("2026-11-30T12:00:00.123456+03:00")
            .unwrap()
            .with_timezone(&Utc);
        assert_eq!(stored_time(at), "2026-11-30T09:00:00.123Z");
    }
}
