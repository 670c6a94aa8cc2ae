//! The journal's database as the wiring picks it: the backend a URL's scheme selects, and
//! what only a backend can do (prepare its schema, close).

use std::sync::Arc;

use crate::config::Backend;
use crate::config::parse_url;
use crate::store::sql::Clock;
use crate::store::{JournalStore, PgStore, SqliteStore, StoreError};

/// The journal's database, of either backend.
#[derive(Debug, Clone)]
pub enum Database {
    /// Postgres.
    Postgres(PgStore),
    /// The embedded SQLite file.
    Sqlite(SqliteStore),
}

impl From<PgStore> for Database {
    fn from(store: PgStore) -> Self {
        Self::Postgres(store)
    }
}

impl From<SqliteStore> for Database {
    fn from(store: SqliteStore) -> Self {
        Self::Sqlite(store)
    }
}

impl Database {
    /// A lazily connecting pool of at most `max_connections` on `url`, of the backend its
    /// scheme selects (see [`Backend::of_url`]). Nothing is connected, created or migrated
    /// yet.
    ///
    /// Errors: an unknown scheme or a URL that does not parse (the message never repeats
    /// the URL, which may hold a password).
    pub fn connect_lazy(url: &str, max_connections: u32) -> Result<Self, StoreError> {
        match Backend::of_url(url) {
            Some(Backend::Postgres) => PgStore::connect_lazy(url, max_connections).map(Self::from),
            Some(Backend::Sqlite) => sqlite(url, max_connections).map(Self::from),
            None => Err(StoreError::Other(
                "database_url must start with postgres://, postgresql:// or sqlite:".into(),
            )),
        }
    }

    /// Which backend this is.
    pub fn backend(&self) -> Backend {
        match self {
            Self::Postgres(_) => Backend::Postgres,
            Self::Sqlite(_) => Backend::Sqlite,
        }
    }

    /// The store, shared by the journal and the reconcile path.
    pub fn store(&self) -> Arc<dyn JournalStore> {
        match self {
            Self::Postgres(store) => Arc::new(store.clone()),
            Self::Sqlite(store) => Arc::new(store.clone()),
        }
    }

    /// Applies pending migrations of this backend; on SQLite, first creates the file and
    /// its directory if missing. (Creating a missing Postgres database needs its URL: see
    /// `app::prepare_database`.)
    ///
    /// Errors: the database cannot be reached (`Unavailable`) or a migration fails.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        match self {
            Self::Postgres(store) => store.migrate().await,
            Self::Sqlite(store) => store.prepare().await,
        }
    }

    /// This database, its stores counting failed statements in `metrics`.
    pub fn with_metrics(self, metrics: crate::telemetry::Metrics) -> Self {
        match self {
            Self::Postgres(store) => Self::Postgres(store.with_metrics(metrics)),
            Self::Sqlite(store) => Self::Sqlite(store.with_metrics(metrics)),
        }
    }

    /// This database, its statements reading `clock` (shared with another, in tests).
    pub fn with_clock(self, clock: Clock) -> Self {
        match self {
            Self::Postgres(store) => Self::Postgres(store.with_clock(clock)),
            Self::Sqlite(store) => Self::Sqlite(store.with_clock(clock)),
        }
    }

    /// The clock of its statements: the database's, unless a test moves it.
    pub fn clock(&self) -> &Clock {
        match self {
            Self::Postgres(store) => store.clock(),
            Self::Sqlite(store) => store.clock(),
        }
    }

    /// Closes the pool, waiting for statements in flight.
    pub async fn close(&self) {
        match self {
            Self::Postgres(store) => store.pool().close().await,
            Self::Sqlite(store) => store.pool().close().await,
        }
    }
}

/// The journal in the SQLite file `url` names, with a lazily connecting pool of at most
/// `max_connections` (see [`SqliteStore::connect_lazy`]).
///
/// Errors: the URL is unusable (see [`parse_url`]).
pub fn sqlite(url: &str, max_connections: u32) -> Result<SqliteStore, StoreError> {
    let options = parse_url(url).map_err(|e| StoreError::Other(Box::new(e)))?;
    Ok(SqliteStore::connect_lazy(options, max_connections))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::config::SqliteUrlError;

    #[test]
    fn urls_name_a_writable_file() {
        let file = parse_url("sqlite://opjournal-data/journal.db").unwrap();
        assert_eq!(file.get_filename(), Path::new("opjournal-data/journal.db"));
        let file = parse_url("sqlite:///var/lib/opjournal/journal.db").unwrap();
        assert_eq!(
            file.get_filename(),
            Path::new("/var/lib/opjournal/journal.db")
        );
        let file = parse_url("sqlite:journal.db").unwrap();
        assert_eq!(file.get_filename(), Path::new("journal.db"));
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
}
