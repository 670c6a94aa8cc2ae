//! What a storage failure is, for every store and the outbox alike, and how it is told in a
//! log line: with the database's own message and code, never a value the statement carried.

use std::error::Error;
use std::fmt;

/// A storage failure, split by what the caller can do about it.
///
/// Its `Display` is a log line: `database unavailable: <cause>` or `database error: <cause>`,
/// the cause as [`Cause`] tells it (the database's message and SQLSTATE). It is logged, never
/// sent to a caller: gRPC answers carry only `UNAVAILABLE` / `INTERNAL` and a reason.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The database cannot be reached now; the request changed nothing and may be retried.
    #[error("database unavailable: {}", Cause(.0.as_ref()))]
    Unavailable(#[source] Box<dyn Error + Send + Sync>),
    /// Anything else: a bug, a broken constraint, corrupt data, a missing table.
    #[error("database error: {}", Cause(.0.as_ref()))]
    Other(#[source] Box<dyn Error + Send + Sync>),
}

/// An error's cause as a log may carry it.
///
/// For an error the database returned (Postgres, Citus or SQLite, at any depth of the
/// chain): its message, then `SQLSTATE <code>` (Postgres) or `SQLite code <code>`, and the
/// constraint and table it names when it names them — for example
/// `relation "agent_operations" does not exist (SQLSTATE 42P01)`. The message's detail and
/// hint, which may repeat a row's values, are left out, and so is whatever a message quotes
/// after `: "` (Postgres's `invalid input syntax for type uuid: "…"` repeats the input):
/// it reads `: "…"`. For any other error: its own message, and its sources' after `: `
/// (up to an error of sqlx, whose message already tells its source).
pub struct Cause<'a>(pub &'a (dyn Error + 'static));

impl fmt::Display for Cause<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut current: Option<&(dyn Error + 'static)> = Some(self.0);
        let mut first = true;
        while let Some(error) = current {
            if !first {
                f.write_str(": ")?;
            }
            match error.downcast_ref::<sqlx::Error>() {
                Some(sqlx::Error::Database(db)) => return database(f, db.as_ref()),
                // sqlx's other errors already tell their source.
                Some(other) => return write!(f, "{other}"),
                None => write!(f, "{error}")?,
            }
            first = false;
            current = error.source();
        }
        Ok(())
    }
}

/// The database's message without quoted input, its code, constraint and table.
fn database(f: &mut fmt::Formatter<'_>, db: &dyn sqlx::error::DatabaseError) -> fmt::Result {
    let message = db.message();
    match message.find(": \"") {
        Some(at) => write!(f, "{}: \"…\"", &message[..at])?,
        None => f.write_str(message)?,
    }
    let is_postgres = db
        .try_downcast_ref::<sqlx::postgres::PgDatabaseError>()
        .is_some();
    let mut notes = Vec::new();
    if let Some(code) = db.code() {
        notes.push(if is_postgres {
            format!("SQLSTATE {code}")
        } else {
            format!("SQLite code {code}")
        });
    }
    if let Some(constraint) = db.constraint() {
        notes.push(format!("constraint {constraint}"));
    }
    if let Some(table) = db.table() {
        notes.push(format!("table {table}"));
    }
    if !notes.is_empty() {
        write!(f, " ({})", notes.join(", "))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    async fn sqlite_error(sql: &str) -> StoreError {
        let pool = sqlx::SqlitePool::connect("sqlite::memory:").await.unwrap();
        sqlx::query("CREATE TABLE t (k TEXT PRIMARY KEY, n INTEGER CHECK (n > 0))")
            .execute(&pool)
            .await
            .unwrap();
        sqlx::query("INSERT INTO t VALUES ('secret-key', 1)")
            .execute(&pool)
            .await
            .unwrap();
        let error = sqlx::query(sqlx::AssertSqlSafe(sql.to_owned()))
            .execute(&pool)
            .await
            .unwrap_err();
        StoreError::Other(Box::new(error))
    }

    #[tokio::test]
    async fn a_sqlite_error_carries_its_message_and_code_and_no_value() {
        let missing = sqlite_error("SELECT * FROM agent_operations").await;
        assert_eq!(
            missing.to_string(),
            "database error: no such table: agent_operations (SQLite code 1)"
        );
        let duplicate = sqlite_error("INSERT INTO t VALUES ('secret-key', 2)").await;
        let line = duplicate.to_string();
        assert!(
            line.starts_with("database error: UNIQUE constraint failed: t.k (SQLite code 1555"),
            "{line}"
        );
        assert!(!line.contains("secret-key"), "{line}");
    }

    #[test]
    fn another_error_is_told_with_its_sources() {
        let error = StoreError::Unavailable(Box::new(std::io::Error::new(
            std::io::ErrorKind::ConnectionRefused,
            "connection refused",
        )));
        assert_eq!(
            error.to_string(),
            "database unavailable: connection refused"
        );
    }
}
