//! `[database]`: where the journal lives and how many connections it may take. The URL's
//! scheme picks the backend (docs/storage.md).

use std::str::FromStr as _;

use serde::{Deserialize, Serialize};
use sqlx::sqlite::SqliteConnectOptions;

use super::{ConfigError, DatabaseUrl};

/// The journal when no `[database] url` is configured: an embedded SQLite file under the
/// working directory, created with its directory at start (zero setup, one node).
pub const DEFAULT_DATABASE_URL: &str = "sqlite://opjournal-data/journal.db";

/// `[database]` settings.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default)]
pub struct DatabaseSettings {
    /// Where the journal lives (`OPJOURNAL_DATABASE__URL`, `--database-url`):
    /// `postgres://…` (or `postgresql://…`) for Postgres, `sqlite://PATH` for the embedded
    /// journal file (one node; see docs/storage.md). Default: [`DEFAULT_DATABASE_URL`]. It
    /// may hold a password: printed with the password redacted.
    pub url: DatabaseUrl,
    /// Largest database pool per process.
    pub max_connections: u32,
    /// Postgres group commit: how many batches of registrations, and as many of reports,
    /// run at once, each one statement and one commit for every call that queued while the
    /// previous ones ran; `0` sends every call alone. At most `(max_connections - 1) / 2`
    /// are used, so that reads always find a connection. Ignored on SQLite. Default 2.
    pub group_commit_lanes: usize,
    /// Create the database if missing and apply migrations before serving (Postgres; the
    /// embedded SQLite journal is always prepared at start).
    pub migrate_on_start: bool,
}

impl Default for DatabaseSettings {
    fn default() -> Self {
        Self {
            url: DatabaseUrl::new(DEFAULT_DATABASE_URL),
            max_connections: 10,
            group_commit_lanes: 2,
            migrate_on_start: false,
        }
    }
}

impl DatabaseSettings {
    /// The URL's scheme picks the backend; a `sqlite:` URL must name a writable file. The
    /// message never repeats the URL, which may hold a password.
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        if self.max_connections == 0 {
            return Err(ConfigError(
                "database.max_connections: must be at least 1".into(),
            ));
        }
        let url = self.url.expose();
        match Backend::of_url(url) {
            Some(Backend::Postgres) => Ok(()),
            Some(Backend::Sqlite) => parse_url(url)
                .map(|_| ())
                .map_err(|e| ConfigError(format!("database.url: {e}"))),
            None if url.is_empty() => Err(ConfigError("database.url: must be set".into())),
            None => Err(ConfigError(
                "database.url: must start with postgres://, postgresql:// or sqlite: \
                 (e.g. sqlite://opjournal-data/journal.db)"
                    .into(),
            )),
        }
    }
}

/// The storage backend a database URL selects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// `postgres://` or `postgresql://`.
    Postgres,
    /// `sqlite:` (e.g. `sqlite://opjournal-data/journal.db`): the embedded journal file.
    Sqlite,
}

impl Backend {
    /// The backend of `url`, by its scheme; `None` for any other scheme.
    pub fn of_url(url: &str) -> Option<Self> {
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            Some(Self::Postgres)
        } else if url.starts_with("sqlite:") {
            Some(Self::Sqlite)
        } else {
            None
        }
    }

    /// `postgres` or `sqlite`, for logs.
    pub fn name(self) -> &'static str {
        match self {
            Self::Postgres => "postgres",
            Self::Sqlite => "sqlite",
        }
    }
}

/// Why a `sqlite:` URL cannot hold the journal.
#[derive(Debug, thiserror::Error)]
pub enum SqliteUrlError {
    /// No file named.
    #[error("a sqlite: database URL must name a file, e.g. sqlite://opjournal-data/journal.db")]
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
/// or `sqlite:path.db`), as connection options.
///
/// Errors: no file, an in-memory or read-only database, an unknown URL parameter.
pub fn parse_url(url: &str) -> Result<SqliteConnectOptions, SqliteUrlError> {
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
    Ok(options)
}
