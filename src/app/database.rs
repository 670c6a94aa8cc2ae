//! The journal's database as the wiring picks it: the backend a URL's scheme selects, and
//! what only a backend can do (prepare its schema, close). Opening a store — its pool's
//! settings, creating the SQLite file, applying migrations — is the wiring's too, here; the
//! store only runs statements on the pool it is given.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use sqlx::migrate::MigrateDatabase as _;
use sqlx::postgres::PgPoolOptions;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use sqlx::{ConnectOptions as _, Connection as _};

use crate::config::Backend;
use crate::config::parse_url;
use crate::store::postgres::{MIGRATOR, classify as pg_classify};
use crate::store::sql::Clock;
use crate::store::sqlite::{Lite, SQLITE_MIGRATOR, classify as lite_classify};
use crate::store::{GroupCommit, JournalStore, PgStore, SqliteStore, StoreError};

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
    /// [`prepare`](Self::prepare).)
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

    /// This database with group commit set by `group` (Postgres; SQLite sends every call
    /// alone whatever `group` says).
    pub fn with_group_commit(self, group: Option<GroupCommit>) -> Self {
        match self {
            Self::Postgres(store) => Self::Postgres(store.with_group_commit(group)),
            sqlite => sqlite,
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

    /// Creates the database named in `url` (this database's URL) if it does not exist, then
    /// applies migrations. On Postgres the database is created through the `postgres`
    /// maintenance database; on SQLite the file and its directory are created, and several
    /// processes may prepare one file at once.
    ///
    /// Errors: the database cannot be reached or created, or a migration fails.
    pub async fn prepare(&self, url: &str) -> Result<(), StoreError> {
        match self {
            Self::Postgres(_) => {
                let exists = sqlx::Postgres::database_exists(url)
                    .await
                    .map_err(|e| StoreError::Unavailable(Box::new(e)))?;
                if !exists {
                    sqlx::Postgres::create_database(url)
                        .await
                        .map_err(|e| StoreError::Other(Box::new(e)))?;
                    tracing::info!("created the journal database");
                }
            }
            Self::Sqlite(store) => {
                if !store.file().exists() {
                    tracing::info!(file = %store.file().display(), "creating the journal file");
                }
            }
        }
        self.migrate().await
    }

    /// Logs which backend holds the journal; for the embedded file, where it is and what it
    /// is for.
    pub fn log_backend(&self) {
        match self {
            Self::Postgres(_) => tracing::info!(backend = "postgres", "journal on Postgres"),
            Self::Sqlite(store) => tracing::info!(
                backend = "sqlite",
                file = %store.file().display(),
                "journal in an embedded SQLite file: for one node only (see docs/storage.md)"
            ),
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

/// How long a pooled connection may sit idle before it is pinged on its next use.
pub const IDLE_PING_AFTER: Duration = Duration::from_secs(1);

impl PgStore {
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
        Ok(Self::new(pool))
    }

    /// Applies pending migrations.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        MIGRATOR.run(&self.pool).await.map_err(|e| match e {
            sqlx::migrate::MigrateError::Execute(e) => pg_classify(e),
            other => StoreError::Other(Box::new(other)),
        })
    }
}

/// How long a statement waits for another writer (another statement of this process, or
/// another process on the same file) before it fails as unavailable.
pub const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// How long `prepare` keeps retrying while another process is preparing the same file.
const PREPARE_PATIENCE: Duration = Duration::from_secs(30);

impl SqliteStore {
    /// Creates a lazily connecting pool of at most `max_connections` on the file `options`
    /// name (checked by `app::database::sqlite`), with WAL, `synchronous = FULL`, foreign keys
    /// and [`BUSY_TIMEOUT`]. Nothing is created or opened yet: [`prepare`](Self::prepare)
    /// creates the file and its schema; other commands expect it to exist.
    pub fn connect_lazy(options: SqliteConnectOptions, max_connections: u32) -> Self {
        let file = options.get_filename().to_path_buf();
        let options = options
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Full)
            .foreign_keys(true)
            .busy_timeout(BUSY_TIMEOUT);
        let pool = SqlitePoolOptions::new()
            .max_connections(max_connections)
            .acquire_timeout(Duration::from_secs(3))
            .connect_lazy_with(options.clone());
        Self::from_parts(pool, Lite { file, options })
    }

    /// The journal file.
    pub fn file(&self) -> &Path {
        &self.extra.file
    }

    /// Creates the file's directory and the file if missing, switches it to WAL, and applies
    /// pending migrations. Safe to run from several processes at once: the migrations run in
    /// one `BEGIN IMMEDIATE` transaction, so a second process waits, then finds them applied.
    ///
    /// Errors: the directory or file cannot be created (`Unavailable`), a migration fails or
    /// the file holds migrations this binary does not know (`Other`).
    pub async fn prepare(&self) -> Result<(), StoreError> {
        if let Some(dir) = self
            .extra
            .file
            .parent()
            .filter(|d| !d.as_os_str().is_empty())
        {
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
        let mut conn = self
            .extra
            .options
            .clone()
            .create_if_missing(true)
            .connect()
            .await
            .map_err(lite_classify)?;
        let mut tx = conn
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(lite_classify)?;
        SQLITE_MIGRATOR.run(&mut *tx).await.map_err(|e| match e {
            sqlx::migrate::MigrateError::Execute(e) => lite_classify(e),
            other => StoreError::Other(Box::new(other)),
        })?;
        tx.commit().await.map_err(lite_classify)?;
        conn.close().await.map_err(lite_classify)
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
