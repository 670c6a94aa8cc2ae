//! What a backend adds to the one store: how it spells the clock, intervals and types, how
//! it runs a statement and what its failures mean, and the few statements that really
//! differ.

use std::future::Future;

use chrono::{DateTime, Utc};
use sqlx::postgres::PgRow;
use sqlx::sqlite::SqliteRow;

use super::bind::Arg;
use crate::store::error::StoreError;

/// A row type both backends decode with `derive(FromRow)`.
pub trait Decoded:
    for<'r> sqlx::FromRow<'r, PgRow> + for<'r> sqlx::FromRow<'r, SqliteRow> + Send + Unpin + 'static
{
}
impl<T> Decoded for T where
    T: for<'r> sqlx::FromRow<'r, PgRow>
        + for<'r> sqlx::FromRow<'r, SqliteRow>
        + Send
        + Unpin
        + 'static
{
}

/// What a backend adds to the one store: how it spells the clock, intervals and types, how
/// it runs a statement, and the few statements that really differ.
pub trait Dialect: Clone + Send + Sync + Sized + 'static {
    /// The connection pool.
    type Pool: Clone + Send + Sync + std::fmt::Debug + 'static;
    /// The OpenTelemetry `db.system.name` of the backend: `postgresql` or `sqlite`.
    const SYSTEM: &'static str;
    /// The statements the backend writes its own way (`sql/postgres/`, `sql/sqlite/`), by
    /// the store method that sends them; every other method's statement is `sql/<method>.sql`.
    const OWN: &'static [(&'static str, &'static str)];
    /// Whether `register` and `settle` answer in one statement what else takes a second one:
    /// the existing row a registration met, the status a report left.
    const ANSWERS_IN_ONE: bool;
    /// The readiness check.
    const PING: &'static str;
    /// The spelling of `token` (a README token without its braces) with argument `arg`.
    fn token(token: &str, arg: &str) -> String;
    /// A time as bound into a statement.
    fn time_text(at: DateTime<Utc>) -> String;
    /// Runs `sql` and decodes every row.
    fn fetch<R: Decoded>(
        pool: &Self::Pool,
        sql: &str,
        args: Vec<Arg>,
    ) -> impl Future<Output = Result<Vec<R>, StoreError>> + Send;
    /// Runs `sql`; the number of rows it changed.
    fn execute(
        pool: &Self::Pool,
        sql: &str,
        args: Vec<Arg>,
    ) -> impl Future<Output = Result<u64, StoreError>> + Send;
    /// Deletes up to the bound limit of terminal operations past retention, with their
    /// history, through `sql` (the store's `purge` statement) with `args` (clock included);
    /// answers how many operations went.
    fn purge(
        pool: &Self::Pool,
        sql: &str,
        args: Vec<Arg>,
    ) -> impl Future<Output = Result<u64, StoreError>> + Send;
    /// See [`JournalMaintenance::analyze_new_tables`](crate::store::JournalMaintenance::analyze_new_tables).
    fn analyze_new_tables(
        _pool: &Self::Pool,
        _min_changes: i64,
    ) -> impl Future<Output = Result<Option<u64>, StoreError>> + Send {
        async { Ok(None) }
    }
}

/// Splits sqlx errors into "unavailable" (retry later, nothing changed) and the rest; a
/// database error is unavailable when `unavailable_code` says so of its code.
pub(in crate::store) fn classify_by(
    error: sqlx::Error,
    unavailable_code: fn(&str) -> bool,
) -> StoreError {
    let unavailable = match &error {
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed => true,
        sqlx::Error::Database(db) => db.code().is_some_and(|code| unavailable_code(&code)),
        _ => false,
    };
    if unavailable {
        StoreError::Unavailable(Box::new(error))
    } else {
        StoreError::Other(Box::new(error))
    }
}

/// A dialect's `fetch` and `execute`: the same sqlx calls on its own pool type.
macro_rules! run_on {
    ($pool:ty, $db:ty) => {
        async fn fetch<R: Decoded>(
            pool: &$pool,
            sql: &str,
            args: Vec<Arg>,
        ) -> Result<Vec<R>, StoreError> {
            let query =
                sqlx::query_as_with::<_, R, _>(sqlx::AssertSqlSafe(sql), arguments::<$db>(args)?);
            query.fetch_all(pool).await.map_err(classify)
        }

        async fn execute(pool: &$pool, sql: &str, args: Vec<Arg>) -> Result<u64, StoreError> {
            let query = sqlx::query_with(sqlx::AssertSqlSafe(sql), arguments::<$db>(args)?);
            Ok(query.execute(pool).await.map_err(classify)?.rows_affected())
        }
    };
}
pub(crate) use run_on;
