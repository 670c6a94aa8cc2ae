//! The wiring of the binaries: the journal's [`Components`] built from a [`Config`], the
//! server process ([`Application`]) and the reconcile worker process
//! ([`WorkerApplication`]), what their servers listen with, and what every process does
//! around its work (logging, telemetry, stopping on SIGTERM or SIGINT).
//!
//! | file | concern |
//! | --- | --- |
//! | `components.rs` | store, policy, journal, reconciler and worker from the configuration |
//! | `database.rs` | the backend a URL selects: connecting, preparing, closing |
//! | `listeners.rs` | gRPC server settings, the console, the metrics endpoint, announcements |
//! | `process.rs` | logging, telemetry, the shutdown signal, the error a process stops on |
//! | `server.rs` | `opjournal serve` |
//! | `reconciler.rs` | `opjournal-reconciler` |

mod components;
pub mod database;
mod listeners;
mod process;
mod reconciler;
mod server;

pub use components::{Components, default_actor, load_policy, policy_warnings, webhook_config};
pub use database::Database;
pub use listeners::{
    MetricsEndpoint, announce, bind, console_options, console_options_with, log_security,
    serve_console, serve_metrics, serve_options,
};
pub use process::{
    finish, init_telemetry, init_tracing, install_crypto_provider, shutdown_on_signals, stop_signal,
};
pub use reconciler::WorkerApplication;
pub use server::Application;

use crate::api::tls::TlsError;
use crate::config::{Config, ConfigError};
use crate::domain::derived_key::SecretTooShort;
use crate::domain::policy::PolicyError;
use crate::reconcile::adapter::AdapterError;
use crate::store::StoreError;
use crate::telemetry::TelemetryError;

/// Why a process could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The policy file is unusable.
    #[error(transparent)]
    Policy(#[from] PolicyError),
    /// A provider adapter cannot be built.
    #[error(transparent)]
    Adapter(#[from] AdapterError),
    /// The database cannot be prepared.
    #[error("database: {0}")]
    Store(#[from] StoreError),
    /// A setting is invalid.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// A certificate file is unusable.
    #[error("TLS: {0}")]
    Tls(#[from] TlsError),
    /// The key derivation secret is unusable.
    #[error("key_derivation_secret: {0}")]
    KeyDerivation(#[from] SecretTooShort),
    /// An `OTEL_*` setting is unusable.
    #[error(transparent)]
    Telemetry(#[from] TelemetryError),
    /// The reconcile worker's settings do not fit the policy (a claim hold shorter than
    /// twice the longest lookup timeout).
    #[error("configuration: {0}")]
    Worker(#[from] crate::reconcile::adapter::SetupError),
}

/// Checks the configuration `opjournal check-config` reads, as a start would: the policy
/// and its adapters, the database URL, the server's tokens and certificates, the console's
/// settings and the `OTEL_*` variables; returns the policy's warnings, one line each.
///
/// Errors: the first unusable setting, naming it.
pub fn check_config(config: &Config) -> Result<Vec<String>, StartError> {
    let metrics = crate::telemetry::Metrics::disabled();
    install_crypto_provider();
    Components::build(config, &metrics)?;
    let options = serve_options(config, &metrics)?;
    console_options(config, &options)?;
    crate::telemetry::TelemetryOptions::from_env("opjournal-server")?;
    Ok(policy_warnings(config)?)
}
