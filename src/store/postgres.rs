//! The Postgres dialect: how it spells the clock, intervals and types, and its statements
//! that really differ (`src/store/sql/postgres/`): `SKIP LOCKED` batch claims, a register and
//! a report answered in one statement each, a purge in one data-modifying CTE.

use chrono::{DateTime, SecondsFormat, Utc};
use sqlx::postgres::PgPool;

use super::error::StoreError;
use super::sql::{Arg, BindColumns, Decoded, Dialect, SqlStore, arguments, classify_by, run_on};

/// The migrations of this backend, embedded in the binary.
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations");

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

impl BindColumns for sqlx::Postgres {
    /// A batch column as a Postgres array, unnested by the batch statements.
    fn add_column(out: &mut Self::Arguments, column: Arg) -> Result<(), sqlx::error::BoxDynError> {
        use sqlx::Arguments as _;
        match column {
            Arg::Texts(values) => out.add(values),
            Arg::Ints(values) => out.add(values),
            Arg::Floats(values) => out.add(values),
            Arg::Text(_) | Arg::Int(_) | Arg::Float(_) => Err("a value where a column goes".into()),
        }
    }
}

impl Dialect for Pg {
    type Pool = PgPool;
    const SYSTEM: &'static str = "postgresql";
    const OWN: &'static [(&'static str, &'static str)] = &[
        ("register", include_str!("sql/postgres/register.sql")),
        ("settle", include_str!("sql/postgres/settle.sql")),
        (
            "register_many",
            include_str!("sql/postgres/register_many.sql"),
        ),
        ("settle_many", include_str!("sql/postgres/settle_many.sql")),
        (
            "sweep_expired_leases",
            include_str!("sql/postgres/sweep.sql"),
        ),
        ("claim_due", include_str!("sql/postgres/claim_due.sql")),
        ("purge", include_str!("sql/postgres/purge.sql")),
        (
            "claim_deliveries",
            include_str!("sql/postgres/claim_deliveries.sql"),
        ),
    ];
    const ANSWERS_IN_ONE: bool = true;
    const PING: &'static str = "SELECT 1";

    fn token(token: &str, arg: &str) -> String {
        let now = "coalesce($1::timestamptz, now())";
        match token {
            "now" => now.to_owned(),
            "now+" => format!("({now} + make_interval(secs => {arg}))"),
            "now-" => format!("({now} - make_interval(secs => {arg}))"),
            "cast" => arg.replacen(' ', "::", 1),
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

    /// One data-modifying CTE.
    async fn purge(pool: &PgPool, sql: &str, args: Vec<Arg>) -> Result<u64, StoreError> {
        let count: Vec<(i64,)> = Self::fetch(pool, sql, args).await?;
        Ok(count
            .first()
            .map_or(0, |(count,)| u64::try_from(*count).unwrap_or(0)))
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
        for (table, _) in unanalyzed
            .iter()
            .filter(|(_, changes)| *changes >= min_changes)
        {
            // UNANALYZED answers only these two names; each statement is a constant.
            let statement = match table.as_str() {
                "agent_operations" => "ANALYZE agent_operations",
                "operation_events" => "ANALYZE operation_events",
                _ => continue,
            };
            Self::execute(pool, statement, Vec::new()).await?;
            analyzed += 1;
        }
        Ok(Some(analyzed))
    }
}
