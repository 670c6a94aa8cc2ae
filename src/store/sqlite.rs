//! The embedded backend: the journal in one SQLite file, for one node (development, a single
//! machine, small deployments). The same statements as
//! [`PgStore`](super::PgStore) (`src/store/sql/`), spelled for SQLite, and its own batch
//! claims and purge (`src/store/sql/sqlite/`); see docs/storage.md for what it is for and when to move to
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
//!   loss), foreign keys on, and a busy timeout (`app::database::BUSY_TIMEOUT`): a statement waits that
//!   long for the write lock, then fails as unavailable (`STORE_UNAVAILABLE`, retryable).

use std::path::PathBuf;

use chrono::{DateTime, SecondsFormat, Utc};
use sqlx::sqlite::{SqliteConnectOptions, SqlitePool};

use super::error::StoreError;
use super::sql::{Arg, BindColumns, Decoded, Dialect, SqlStore, arguments, classify_by, run_on};

/// The migrations of this backend (`migrations/sqlite/`), embedded in the binary. The
/// Postgres migrator reads only the files directly in `migrations/`, never this directory.
pub static SQLITE_MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations/sqlite");

/// The SQLite dialect of the one SQL store, with the file it opens.
#[derive(Debug, Clone)]
pub struct Lite {
    pub(crate) file: PathBuf,
    pub(crate) options: SqliteConnectOptions,
}

/// The journal in one SQLite file.
pub type SqliteStore = SqlStore<Lite>;

/// Splits sqlx errors into "unavailable" (retry later, nothing changed) and the rest.
pub(crate) fn classify(error: sqlx::Error) -> StoreError {
    // The primary result code is the low byte of the extended one: SQLITE_BUSY (5),
    // SQLITE_LOCKED (6), SQLITE_IOERR (10), SQLITE_FULL (13), SQLITE_CANTOPEN (14).
    classify_by(error, |code| {
        code.parse::<i32>()
            .is_ok_and(|code| matches!(code & 0xff, 5 | 6 | 10 | 13 | 14))
    })
}

/// The database clock as stored: UTC, milliseconds, fixed width.
const NOW: &str = "strftime('%Y-%m-%dT%H:%M:%fZ', coalesce($1, 'now')";

impl BindColumns for sqlx::Sqlite {
    /// SQLite runs no batch statement (it has no arrays): a column is refused.
    fn add_column(_: &mut Self::Arguments, _: Arg) -> Result<(), sqlx::error::BoxDynError> {
        Err("SQLite binds no batch column".into())
    }
}

impl Dialect for Lite {
    type Pool = SqlitePool;
    const SYSTEM: &'static str = "sqlite";
    const OWN: &'static [(&'static str, &'static str)] = &[
        ("sweep_expired_leases", include_str!("sql/sqlite/sweep.sql")),
        ("claim_due", include_str!("sql/sqlite/claim_due.sql")),
        ("purge", include_str!("sql/sqlite/purge.sql")),
        (
            "claim_deliveries",
            include_str!("sql/sqlite/claim_deliveries.sql"),
        ),
    ];
    const ANSWERS_IN_ONE: bool = false;
    // Reads the schema, so that a file that is missing or not yet prepared is not ready.
    const PING: &'static str = "SELECT 1 FROM agent_operations LIMIT 0";

    fn token(token: &str, arg: &str) -> String {
        match token {
            "now" => format!("{NOW})"),
            "now+" => format!("{NOW}, printf('%+.3f seconds', {arg}))"),
            "now-" => format!("{NOW}, printf('%+.3f seconds', -({arg})))"),
            "cast" => arg.split(' ').next().unwrap_or(arg).to_owned(),
            "dbnow" => "strftime('%Y-%m-%dT%H:%M:%fZ', 'now')".to_owned(),
            "age" => format!(
                "(julianday(strftime('%Y-%m-%dT%H:%M:%fZ', 'now')) - julianday({arg})) * 86400.0"
            ),
            "policy" => format!("CAST(json_extract(action_policy, '$.{arg}') AS REAL)"),
            // A quoted label: member names may hold '.', which a bare path would split.
            "member" => {
                let (object, name) = arg.split_once(' ').unwrap_or((arg, ""));
                format!("({object} ->> ('$.\"' || {name} || '\"'))")
            }
            other => panic!("unknown statement token {other}"),
        }
    }

    /// A time bound into a statement, in the stored form (see [`NOW`]).
    fn time_text(at: DateTime<Utc>) -> String {
        at.to_rfc3339_opts(SecondsFormat::Millis, true)
    }

    run_on!(SqlitePool, sqlx::Sqlite);

    /// SQLite has no data-modifying CTE: the batch goes, then its history and its escalation
    /// events, in one short write transaction taken up front, so that nothing comes in
    /// between.
    async fn purge(pool: &SqlitePool, sql: &str, args: Vec<Arg>) -> Result<u64, StoreError> {
        let args = arguments::<sqlx::Sqlite>(args)?;
        let begin = pool.begin_with("BEGIN IMMEDIATE");
        let mut tx = begin.await.map_err(classify)?;
        let gone: Vec<(String, String)> = sqlx::query_as_with(sqlx::AssertSqlSafe(sql), args)
            .fetch_all(&mut *tx)
            .await
            .map_err(classify)?;
        let keys = serde_json::to_string(&gone).map_err(|e| StoreError::Other(Box::new(e)))?;
        for dependent in [
            include_str!("sql/sqlite/purge_events.sql"),
            include_str!("sql/sqlite/purge_outbox.sql"),
        ] {
            let delete = sqlx::query(dependent).bind(&keys).execute(&mut *tx);
            delete.await.map_err(classify)?;
        }
        tx.commit().await.map_err(classify)?;
        Ok(gone.len() as u64)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn stored_times_are_fixed_width_utc_milliseconds() {
        let at = DateTime::parse_from_rfc3339("2026-11-30T12:00:00.123456+03:00")
            .unwrap()
            .with_timezone(&Utc);
        assert_eq!(Lite::time_text(at), "2026-11-30T09:00:00.123Z");
    }
}
