//! Moving from the embedded journal to Postgres: copies every operation, its whole history and
//! its escalation webhook events (delivered, pending or dead, with the same event ids) from a
//! SQLite journal file into an empty Postgres journal, unchanged (statuses, attempts,
//! leases, review marks, retention deadlines, event ids). Terminal operations matter as much
//! as open ones: a retry of a completed key must still be answered with a replay after the
//! move, never executed again.
//!
//! The copy is generic over columns: every column of the file's tables is copied into the
//! Postgres column of the same name, cast to its type, so a column added by a later migration
//! to both backends needs no change here.

use futures::TryStreamExt as _;
use sqlx::{Connection as _, Row as _};

use super::error::StoreError;
use super::postgres::PgStore;
use super::sqlite::SqliteStore;

/// What was copied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CopyReport {
    /// Operations copied.
    pub operations: u64,
    /// History entries copied.
    pub events: u64,
}

/// Why the journal was not copied; nothing was written to the target then.
#[derive(Debug, thiserror::Error)]
pub enum CopyError {
    /// The target already holds a journal: copying would mix two journals.
    #[error(
        "the Postgres journal is not empty ({operations} operations, {events} history \
         entries); copy into a database that holds no journal yet"
    )]
    TargetNotEmpty {
        /// Operations found in the target.
        operations: i64,
        /// History entries found in the target.
        events: i64,
    },
    /// The two schemas differ: the file or the database was migrated by another version.
    #[error("schema mismatch: {0}; migrate both with the same opjournal version")]
    SchemaMismatch(String),
    /// The copy read back differs from the source.
    #[error("the copy does not match the source: {0}")]
    Verification(String),
    /// A database failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// The tables of the journal, in the order they are copied.
const TABLES: [(&str, &str); 3] = [
    ("agent_operations", "namespace, operation_key"),
    ("operation_events", "event_id"),
    ("escalation_outbox", "seq"),
];

/// Copies the journal in `source` into `target`, which must hold no operations and no history.
/// Both must already be migrated to this version's schema. The file is read under its write
/// lock (a server still running on it waits, then fails as unavailable, rather than write
/// something the copy would miss); the target is written in one transaction, so a failed copy
/// leaves it empty.
///
/// Errors: a non-empty target, a schema mismatch, a database failure.
pub async fn sqlite_to_postgres(
    source: &SqliteStore,
    target: &PgStore,
) -> Result<CopyReport, CopyError> {
    let mut reader = source.pool().acquire().await.map_err(sqlite_error)?;
    let mut snapshot = reader
        .begin_with("BEGIN IMMEDIATE")
        .await
        .map_err(sqlite_error)?;
    let mut writer = target.pool().begin().await.map_err(pg_error)?;
    sqlx::query(
        "LOCK TABLE agent_operations, operation_events, escalation_outbox IN EXCLUSIVE MODE",
    )
    .execute(&mut *writer)
    .await
    .map_err(pg_error)?;
    let (operations, events): (i64, i64) = sqlx::query_as(
        "SELECT (SELECT COUNT(*) FROM agent_operations), (SELECT COUNT(*) FROM operation_events)",
    )
    .fetch_one(&mut *writer)
    .await
    .map_err(pg_error)?;
    if operations > 0 || events > 0 {
        return Err(CopyError::TargetNotEmpty { operations, events });
    }

    let mut report = CopyReport {
        operations: 0,
        events: 0,
    };
    for (table, order) in TABLES {
        if table == "operation_events" {
            // Inserting operations made the history trigger write a registration entry for
            // each; the real history replaces them.
            sqlx::query("DELETE FROM operation_events")
                .execute(&mut *writer)
                .await
                .map_err(pg_error)?;
        }
        let copied = copy_table(&mut snapshot, &mut writer, table, order).await?;
        match table {
            "agent_operations" => report.operations = copied,
            "operation_events" => report.events = copied,
            _ => {}
        }
    }
    // New history entries continue after the copied ones.
    sqlx::query(
        "SELECT setval(pg_get_serial_sequence('operation_events', 'event_id'), \
             (SELECT MAX(event_id) FROM operation_events)) \
         WHERE EXISTS (SELECT 1 FROM operation_events)",
    )
    .execute(&mut *writer)
    .await
    .map_err(pg_error)?;
    sqlx::query(
        "SELECT setval(pg_get_serial_sequence('escalation_outbox', 'seq'), \
             (SELECT MAX(seq) FROM escalation_outbox)) \
         WHERE EXISTS (SELECT 1 FROM escalation_outbox)",
    )
    .execute(&mut *writer)
    .await
    .map_err(pg_error)?;
    writer.commit().await.map_err(pg_error)?;
    snapshot.rollback().await.map_err(sqlite_error)?;
    Ok(report)
}

/// Copies `table` row by row, in `order`, from the file into Postgres, each value as text
/// cast back to its column's type; answers how many rows went once both sides count them.
async fn copy_table(
    snapshot: &mut sqlx::SqliteConnection,
    writer: &mut sqlx::PgConnection,
    table: &str,
    order: &str,
) -> Result<u64, CopyError> {
    let columns = shared_columns(snapshot, writer, table).await?;
    let select = format!(
        "SELECT {} FROM {table} ORDER BY {order}",
        columns
            .iter()
            .map(|(name, _)| format!("CAST({name} AS TEXT) AS {name}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let insert = format!(
        "INSERT INTO {table} ({}) OVERRIDING SYSTEM VALUE VALUES ({})",
        columns
            .iter()
            .map(|(name, _)| name.as_str())
            .collect::<Vec<_>>()
            .join(", "),
        columns
            .iter()
            .enumerate()
            .map(|(i, (_, cast))| format!("CAST(${} AS {cast})", i + 1))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let mut rows = sqlx::query(sqlx::AssertSqlSafe(select)).fetch(&mut *snapshot);
    let mut copied = 0;
    while let Some(row) = rows.try_next().await.map_err(sqlite_error)? {
        let mut query = sqlx::query(sqlx::AssertSqlSafe(insert.clone()));
        for i in 0..columns.len() {
            let value: Option<String> = row.try_get(i).map_err(sqlite_error)?;
            query = query.bind(value);
        }
        query.execute(&mut *writer).await.map_err(pg_error)?;
        copied += 1;
    }
    drop(rows);
    let (expected,): (i64,) =
        sqlx::query_as(sqlx::AssertSqlSafe(format!("SELECT COUNT(*) FROM {table}")))
            .fetch_one(&mut *snapshot)
            .await
            .map_err(sqlite_error)?;
    let (written,): (i64,) =
        sqlx::query_as(sqlx::AssertSqlSafe(format!("SELECT COUNT(*) FROM {table}")))
            .fetch_one(&mut *writer)
            .await
            .map_err(pg_error)?;
    if expected != written || u64::try_from(written).ok() != Some(copied) {
        return Err(CopyError::Verification(format!(
            "{table}: {expected} rows in the file, {written} in Postgres"
        )));
    }
    Ok(copied)
}

/// The columns of `table` in the file, each with the type of its Postgres counterpart to
/// cast to. Names and types come from the two catalogs and are checked before they are put
/// into SQL.
///
/// Errors: a column of the file missing in Postgres, or a Postgres type this copy does not
/// know.
async fn shared_columns(
    source: &mut sqlx::SqliteConnection,
    target: &mut sqlx::PgConnection,
    table: &str,
) -> Result<Vec<(String, &'static str)>, CopyError> {
    let names: Vec<String> =
        sqlx::query_scalar("SELECT name FROM pragma_table_info($1) ORDER BY cid")
            .bind(table)
            .fetch_all(&mut *source)
            .await
            .map_err(sqlite_error)?;
    let types: Vec<(String, String)> = sqlx::query_as(
        "SELECT column_name::text, data_type::text FROM information_schema.columns \
         WHERE table_schema = current_schema() AND table_name = $1",
    )
    .bind(table)
    .fetch_all(&mut *target)
    .await
    .map_err(pg_error)?;
    if names.is_empty() || types.is_empty() {
        return Err(CopyError::SchemaMismatch(format!("no table {table}")));
    }
    names
        .into_iter()
        .map(|name| {
            if !name
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
            {
                return Err(CopyError::SchemaMismatch(format!(
                    "unexpected column name in {table}"
                )));
            }
            let data_type = types
                .iter()
                .find(|(column, _)| *column == name)
                .map(|(_, data_type)| data_type.as_str())
                .ok_or_else(|| {
                    CopyError::SchemaMismatch(format!("{table}.{name} is missing in Postgres"))
                })?;
            let cast = match data_type {
                "text" => "text",
                "character varying" => "varchar",
                "character" => "bpchar",
                "integer" => "integer",
                "bigint" => "bigint",
                "boolean" => "boolean",
                "uuid" => "uuid",
                "jsonb" => "jsonb",
                "timestamp with time zone" => "timestamptz",
                other => {
                    return Err(CopyError::SchemaMismatch(format!(
                        "{table}.{name} has the Postgres type {other}, which the copy does not \
                         know"
                    )));
                }
            };
            Ok((name, cast))
        })
        .collect()
}

fn sqlite_error(error: sqlx::Error) -> CopyError {
    CopyError::Store(super::sqlite::classify(error))
}

fn pg_error(error: sqlx::Error) -> CopyError {
    CopyError::Store(super::postgres::classify(error))
}
