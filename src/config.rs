//! Layered configuration: typed defaults, then a TOML file, then `OPJOURNAL_*` environment
//! variables, then command-line flags; validated once at start.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use figment::Figment;
use figment::providers::{Env, Format as _, Serialized, Toml};
use serde::{Deserialize, Serialize};

/// Settings of the server and of the reconcile worker.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default)]
pub struct Config {
    /// gRPC listen address (`OPJOURNAL_LISTEN`).
    pub listen: SocketAddr,
    /// Postgres URL (`OPJOURNAL_DATABASE_URL`).
    pub database_url: String,
    /// Action policy file, YAML (`OPJOURNAL_POLICY_FILE`); without one every action type is
    /// allowed and timeouts are reconciled before retry.
    pub policy_file: Option<PathBuf>,
    /// Largest database pool (`OPJOURNAL_MAX_CONNECTIONS`).
    pub max_connections: u32,
    /// Seconds between readiness checks of the database.
    pub readiness_interval_seconds: f64,
    /// Seconds between NOT_SERVING and closing the listener on SIGTERM.
    pub drain_delay_seconds: f64,
    /// Log format: `text` or `json` (`OPJOURNAL_LOG_FORMAT`).
    pub log_format: LogFormat,
    /// Create the database if missing and apply migrations before serving.
    pub migrate_on_start: bool,
    /// Reconcile worker: seconds between polls when idle.
    pub reconcile_poll_seconds: f64,
    /// Reconcile worker: operations claimed per poll.
    pub reconcile_batch_size: i64,
    /// Reconcile worker: lookups running at once.
    pub reconcile_concurrency: usize,
    /// Reconcile worker: seconds a claimed operation stays hidden from other replicas.
    pub reconcile_claim_hold_seconds: f64,
    /// Reconcile worker: gRPC health listen address (`liveness`, `readiness`).
    pub reconciler_health_listen: SocketAddr,
    /// Reconcile worker: seconds between purges of operations past retention.
    pub purge_interval_seconds: f64,
    /// Operations deleted per purge statement.
    pub purge_batch_size: i64,
}

/// Log output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 50051)),
            database_url: "postgres://postgres@127.0.0.1:5432/opjournal".to_owned(),
            policy_file: None,
            max_connections: 10,
            readiness_interval_seconds: 2.0,
            drain_delay_seconds: 0.0,
            log_format: LogFormat::Text,
            migrate_on_start: false,
            reconcile_poll_seconds: 1.0,
            reconcile_batch_size: 50,
            reconcile_concurrency: 8,
            reconcile_claim_hold_seconds: 60.0,
            reconciler_health_listen: SocketAddr::from(([127, 0, 0, 1], 50052)),
            purge_interval_seconds: 300.0,
            purge_batch_size: 1000,
        }
    }
}

/// A configuration that cannot be used; the message names the setting.
#[derive(Debug, thiserror::Error)]
#[error("configuration: {0}")]
pub struct ConfigError(String);

impl Config {
    /// Loads defaults, then `file` (TOML), then `OPJOURNAL_*` variables, then `overrides`
    /// (flags, as a serializable struct whose `None` fields are skipped), and validates.
    ///
    /// Errors: a value of the wrong type or out of range, naming the setting.
    pub fn load(file: Option<&PathBuf>, overrides: impl Serialize) -> Result<Self, ConfigError> {
        let mut figment = Figment::from(Serialized::defaults(Config::default()));
        if let Some(file) = file {
            if !file.exists() {
                return Err(ConfigError(format!("{}: no such file", file.display())));
            }
            figment = figment.merge(Toml::file(file));
        }
        let config: Config = figment
            .merge(Env::prefixed("OPJOURNAL_"))
            .merge(Serialized::defaults(overrides))
            .extract()
            .map_err(|e| ConfigError(e.to_string()))?;
        config.validate()?;
        Ok(config)
    }

    fn validate(&self) -> Result<(), ConfigError> {
        let positive = |name: &str, v: f64| {
            if v.is_finite() && v > 0.0 {
                Ok(())
            } else {
                Err(ConfigError(format!(
                    "{name}: must be a positive number of seconds"
                )))
            }
        };
        if self.max_connections == 0 {
            return Err(ConfigError("max_connections: must be at least 1".into()));
        }
        if self.reconcile_batch_size < 1 || self.reconcile_concurrency == 0 {
            return Err(ConfigError(
                "reconcile_batch_size, reconcile_concurrency: must be at least 1".into(),
            ));
        }
        if !(self.drain_delay_seconds.is_finite() && self.drain_delay_seconds >= 0.0) {
            return Err(ConfigError("drain_delay_seconds: must be 0 or more".into()));
        }
        positive(
            "readiness_interval_seconds",
            self.readiness_interval_seconds,
        )?;
        positive("reconcile_poll_seconds", self.reconcile_poll_seconds)?;
        positive(
            "reconcile_claim_hold_seconds",
            self.reconcile_claim_hold_seconds,
        )?;
        positive("purge_interval_seconds", self.purge_interval_seconds)?;
        if self.purge_batch_size < 1 {
            return Err(ConfigError("purge_batch_size: must be at least 1".into()));
        }
        if self.database_url.is_empty() {
            return Err(ConfigError("database_url: must be set".into()));
        }
        Ok(())
    }

    /// Seconds as a duration.
    pub fn seconds(value: f64) -> Duration {
        Duration::from_secs_f64(value.max(0.0))
    }
}
