//! The Postgres dialect: how it spells the clock, intervals and types, and its statements
//! that really differ (`src/store/sql/postgres/`): `SKIP LOCKED` batch claims, a register and
//! a report answered in one statement each, a purge in one data-modifying CTE.

use chrono::{DateTime, SecondsFormat, Utc};
use sqlx::postgres::PgPool;

use super::StoreError;
use super::sql::{Arg, CountRow, Decoded, Dialect, SqlStore, arguments, classify_by, run_on};

/// The migrations of this backend, embedded in the binary.
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations");

/// The purge, in one data-modifying CTE (for the query plans the benchmark shows).
pub const PURGE: &str = include_str!("sql/postgres/purge.sql");

/// The journal's tables that have never been analyzed, with their changes since.
const UNANALYZED: &str = "SELECT relname::text, n_mod_since_analyze FROM pg_stat_user_tables \
    WHERE schemaname = current_schema() \
      AND relname IN ('agent_operations', 'operation_events') \
      AND last_analyze IS NULL AND last_autoanalyze IS NULL";

/// The Postgres dialect of the one SQL store.
#[derive(Debug, Clone, Copy, Default)]
pub struct Pg;

/// The journal on Postgres: any number of servers and workers.
pub type PgStore = SqlStore<Pg>;

impl PgStore {
    /// Wraps an existing pool.
    pub fn new(pool: PgPool) -> Self {
        Self::from_parts(pool, Pg)
    }
}

/// Splits sqlx errors into "unavailable" (retry later, nothing changed) and the rest.
pub(crate) fn classify(error: sqlx::Error) -> StoreError {
    // 08: connection exception; 57P01..57P03: shutdown / cannot connect now.
    classify_by(error, |code| {
        code.starts_with("08") || matches!(code, "57P01" | "57P02" | "57P03")
    })
}

impl Dialect for Pg {
    type Pool = PgPool;
    const SYSTEM: &'static str = "postgresql";
    const REGISTER: Option<&'static str> = Some(include_str!("sql/postgres/register.sql"));
    const SETTLE_WITH_PREVIOUS: Option<&'static str> =
        Some(include_str!("sql/postgres/settle_with_previous.sql"));
    const SWEEP: &'static str = include_str!("sql/postgres/sweep.sql");
    const CLAIM_DUE: &'static str = include_str!("sql/postgres/claim_due.sql");
    const CLAIM_DELIVERIES: &'static str = include_str!("sql/postgres/claim_deliveries.sql");
    const PING: &'static str = "SELECT 1";

    fn token(token: &str, arg: &str) -> String {
        let now = "coalesce($1::timestamptz, now())";
        match token {
            "now" => now.to_owned(),
            "now+" => format!("({now} + make_interval(secs => {arg}))"),
            "now-" => format!("({now} - make_interval(secs => {arg}))"),
            "uuid" => format!("{arg}::uuid"),
            "json" => format!("{arg}::jsonb"),
            "hash" => format!("{arg}::char(64)"),
            "time" => format!("{arg}::timestamptz"),
            "text" => format!("{arg}::text"),
            "dbnow" => "now()".to_owned(),
            "age" => format!("EXTRACT(EPOCH FROM now() - {arg})::float8"),
            "policy" => format!("(action_policy ->> '{arg}')::float8"),
            "member" => {
                let (object, name) = arg.split_once(' ').unwrap_or((arg, ""));
                format!("({object} ->> {name}::text)")
            }
            other => panic!("unknown statement token {other}"),
        }
    }

    fn time_text(at: DateTime<Utc>) -> String {
        at.to_rfc3339_opts(SecondsFormat::AutoSi, true)
    }

    run_on!(PgPool, sqlx::Postgres);

    async fn purge(store: &PgStore, limit: i64) -> Result<u64, StoreError> {
        let purge = super::sql::Statement::new::<Pg>("purge", "DELETE", PURGE);
        let rows: Vec<CountRow> = store.rows(&purge, vec![Arg::Int(limit)]).await?;
        Ok(rows
            .first()
            .map_or(0, |row| u64::try_from(row.count).unwrap_or(0)))
    }

    async fn analyze_new_tables(
        pool: &PgPool,
        min_changes: i64,
    ) -> Result<Option<u64>, StoreError> {
        let unanalyzed: Vec<(String, i64)> = Self::fetch(pool, UNANALYZED, Vec::new()).await?;
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
            Self::execute(pool, statement, Vec::new()).await?;
            analyzed += 1;
        }
        Ok(Some(analyzed))
    }
}
