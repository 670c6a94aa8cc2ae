//! Wiring shared by the binaries: build the store, policy, journal and reconciler from a
//! [`Config`], install logging and telemetry, and turn SIGTERM/SIGINT into a cancellation.

use std::sync::Arc;

use sqlx::migrate::MigrateDatabase as _;
use tokio_util::sync::CancellationToken;

use crate::api::console::{self, ConsoleAccess, ConsoleOptions};
use crate::api::tls::{self, ServerTlsFiles, TlsError};
use crate::api::{Authenticator, ServeOptions};
use crate::config::{Config, ConfigError, LogFormat};
use crate::domain::derived_key::{KeyDeriver, SecretTooShort};
use crate::domain::policy::{Policy, PolicyError};
use crate::journal::{Journal, RequestLimits};
use crate::reconcile::adapter::AdapterError;
use crate::reconcile::worker::{Worker, WorkerConfig};
use crate::reconcile::{AdapterSet, Reconciler};
use crate::store::GroupCommit;
use crate::store::{JournalStore, StoreError};
pub mod database;

pub use database::Database;

use crate::telemetry::{LogOptions, Metrics, Telemetry, TelemetryError, TelemetryOptions, admin};

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
}

/// The journal's parts, built from a configuration.
#[derive(Clone)]
pub struct Components {
    /// The database (Postgres or the embedded SQLite file): migrations and closing.
    pub database: Database,
    /// The store the journal and the reconcile path share.
    pub store: Arc<dyn JournalStore>,
    /// The journal use cases.
    pub journal: Journal,
    /// The reconcile path.
    pub reconciler: Reconciler,
}

/// Loads the policy named by the configuration, or the built-in one.
///
/// Errors: the file is unreadable or invalid (the message names the file and setting).
pub fn load_policy(config: &Config) -> Result<Policy, PolicyError> {
    match &config.server.policy_file {
        Some(path) => Policy::load(path),
        None => Ok(Policy::builtin()),
    }
}

/// The warnings of the policy file named by the configuration, one line each
/// (`FILE:LINE: SETTING: why`); none for the built-in policy. `check-config` prints them and
/// [`build`] logs them.
///
/// Errors: the file is unreadable or invalid (the message names the file and setting).
pub fn policy_warnings(config: &Config) -> Result<Vec<String>, PolicyError> {
    let Some(path) = &config.server.policy_file else {
        return Ok(Vec::new());
    };
    let (_, warnings) = Policy::load_with_warnings(path)?;
    Ok(warnings
        .problems
        .into_iter()
        .map(|problem| {
            PolicyError {
                file: warnings.file.clone(),
                problems: vec![problem],
            }
            .to_string()
        })
        .collect())
}

/// The group commit `config` asks for: `group_commit_lanes` per kind of write, at most
/// `(max_connections - 1) / 2` (at least one); `None` when it is `0`.
fn group_commit(config: &Config) -> Option<GroupCommit> {
    let spare = (config.database.max_connections.saturating_sub(1) / 2).max(1) as usize;
    (config.database.group_commit_lanes > 0).then(|| GroupCommit {
        lanes: config.database.group_commit_lanes.min(spare),
        ..GroupCommit::default()
    })
}

/// Builds the components, recording into `metrics`; connects lazily, so the database may
/// still be down (and, on SQLite, the file may not exist yet: see [`prepare_database`]).
///
/// Errors: invalid policy, adapter or database URL.
pub fn build(config: &Config, metrics: &Metrics) -> Result<Components, StartError> {
    let policy = Arc::new(load_policy(config)?);
    for warning in policy_warnings(config)? {
        tracing::warn!(warning = %warning, "the policy weakens a lookup's proof");
    }
    let adapters = AdapterSet::from_policy(&policy)?;
    let database = Database::connect_lazy(
        config.database.url.expose(),
        config.database.max_connections,
    )?
    .with_group_commit(group_commit(config));
    let mut parts = components_with_telemetry(
        database,
        policy,
        adapters,
        config.request_limits(),
        metrics.clone(),
    );
    if let Some(secret) = &config.server.key_derivation_secret {
        let deriver = KeyDeriver::new(secret.expose().as_bytes())?;
        parts.journal = parts.journal.with_key_deriver(deriver);
    }
    Ok(parts)
}

/// The escalation webhook's delivery settings, when `webhook_url` is configured (the
/// configuration checked the URL and the secret).
///
/// Errors: the URL or the secret does not parse.
pub fn webhook_config(
    config: &Config,
) -> Result<Option<crate::reconcile::webhook::WebhookConfig>, String> {
    use crate::domain::escalation::{RetrySchedule, WebhookSecret};
    let (Some(url), Some(secret)) = (&config.webhook.url, &config.webhook.secret) else {
        return Ok(None);
    };
    Ok(Some(crate::reconcile::webhook::WebhookConfig {
        url: reqwest::Url::parse(url.expose()).map_err(|_| "webhook.url: not a URL".to_owned())?,
        secret: WebhookSecret::parse(secret.expose())?,
        timeout: config.webhook.timeout,
        claim_lease: config.webhook.claim_hold,
        schedule: RetrySchedule {
            base: config.webhook.retry_base,
            cap: config.webhook.retry_cap,
            max_age: config.webhook.max_age,
        },
        poll_interval: config.webhook.poll_interval,
        batch_size: config.webhook.batch_size,
        sample_interval: config.reconcile.backlog_sample_interval,
    }))
}

/// Assembles components over an existing database (a [`PgStore`](crate::store::PgStore),
/// a [`SqliteStore`](crate::store::SqliteStore) or a [`Database`]), with the default request
/// limits.
pub fn components(
    database: impl Into<Database>,
    policy: Arc<Policy>,
    adapters: AdapterSet,
) -> Components {
    components_with_limits(database, policy, adapters, RequestLimits::default())
}

/// Assembles components over an existing database, with `limits`, recording no metrics.
pub fn components_with_limits(
    database: impl Into<Database>,
    policy: Arc<Policy>,
    adapters: AdapterSet,
    limits: RequestLimits,
) -> Components {
    components_with_telemetry(database, policy, adapters, limits, Metrics::disabled())
}

/// Assembles components over an existing database, with `limits`, recording into `metrics`:
/// the store traces its statements and counts their failures.
pub fn components_with_telemetry(
    database: impl Into<Database>,
    policy: Arc<Policy>,
    adapters: AdapterSet,
    limits: RequestLimits,
    metrics: Metrics,
) -> Components {
    let database = database.into().with_metrics(metrics.clone());
    let store: Arc<dyn JournalStore> = database.store();
    Components {
        journal: Journal::new(store.clone(), policy.clone(), limits.clone())
            .with_metrics(metrics.clone()),
        reconciler: Reconciler::new(store.clone(), policy, adapters, default_actor())
            .with_limits(limits)
            .with_metrics(metrics),
        store,
        database,
    }
}

/// The reconcile worker over `reconciler`, with the `reconcile_*` and `purge_*` settings of
/// the configuration (the `opjournal-reconciler` binary and `opjournal dev` run it).
pub fn worker(config: &Config, reconciler: Reconciler) -> Worker {
    Worker::new(
        reconciler,
        WorkerConfig {
            poll_interval: config.reconcile.poll_interval,
            batch_size: config.reconcile.batch_size,
            concurrency: config.reconcile.concurrency,
            claim_hold: config.reconcile.claim_hold,
            purge_interval: config.reconcile.purge_interval,
            purge_batch_size: config.reconcile.purge_batch_size,
        },
    )
}

/// The server's settings from the configuration: lifecycle, bearer tokens (with those of
/// `tokens_file`), TLS files (read and checked now, and again every `tls_reload_seconds`
/// while serving), the message size limit and the transport's limits; RPC metrics go to
/// `metrics`.
///
/// Errors: invalid tokens, an unusable certificate file (naming the setting), or no
/// authentication on an address other hosts can reach ([`Config::check_exposure`]).
pub fn serve_options(config: &Config, metrics: &Metrics) -> Result<ServeOptions, StartError> {
    config.check_exposure()?;
    let registry = config.token_registry()?;
    let tls = match (&config.tls.cert_file, &config.tls.key_file) {
        (Some(cert_file), Some(key_file)) => Some(
            tls::server_config(&ServerTlsFiles {
                cert_file: cert_file.clone(),
                key_file: key_file.clone(),
                client_ca_file: config.tls.client_ca_file.clone(),
            })?
            .reload_every(config.tls.reload_interval),
        ),
        _ => None,
    };
    Ok(ServeOptions {
        readiness_interval: config.server.readiness_interval,
        drain_delay: config.server.drain_delay,
        auth: Authenticator::new(registry),
        tls,
        max_message_bytes: config.limits.max_message_bytes,
        limits: config.transport_limits(),
        metrics: metrics.clone(),
    })
}

/// Logs how the server is secured; warns when it serves an address reachable from other
/// hosts with no authentication (allowed by `insecure_allow_unauthenticated`).
pub fn log_security(config: &Config, options: &ServeOptions) {
    let tls = match &options.tls {
        None => "off",
        Some(tls) if tls.is_mutual() => "mutual",
        Some(_) => "on",
    };
    if options.auth.is_enabled() {
        tracing::info!(
            tokens = options.auth.tokens(),
            tokens_file = config.auth.tokens_file.is_some(),
            tls,
            "bearer-token authentication on"
        );
    } else if config.server.listen.ip().is_loopback() {
        tracing::info!(tls, "authentication off (no tokens configured)");
    } else if config.tls.client_ca_file.is_some() {
        tracing::info!(
            tls,
            "callers authenticated by client certificate (no tokens)"
        );
    } else {
        tracing::warn!(
            listen = %config.server.listen,
            tls,
            "authentication off on an address other hosts can reach \
             (insecure_allow_unauthenticated): every caller can read and change every \
             namespace unless something in front authenticates them"
        );
    }
}

/// This process's name in the history: `HOSTNAME` (the pod name on Kubernetes) and pid.
pub fn default_actor() -> String {
    let host = std::env::var("HOSTNAME").unwrap_or_else(|_| "localhost".to_owned());
    format!("{host}:{}", std::process::id())
}

/// Creates the database named in `url` if it does not exist, then applies migrations. On
/// Postgres the database is created through the `postgres` maintenance database; on SQLite
/// the file and its directory are created, and several processes may prepare one file at
/// once.
///
/// Errors: the database cannot be reached or created, or a migration fails.
pub async fn prepare_database(url: &str, database: &Database) -> Result<(), StoreError> {
    match database {
        Database::Postgres(_) => {
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
        Database::Sqlite(store) => {
            if !store.file().exists() {
                tracing::info!(file = %store.file().display(), "creating the journal file");
            }
        }
    }
    database.migrate().await
}

/// Logs which backend holds the journal; for the embedded file, where it is and what it is
/// for.
pub fn log_database(database: &Database) {
    match database {
        Database::Postgres(_) => tracing::info!(backend = "postgres", "journal on Postgres"),
        Database::Sqlite(store) => tracing::info!(
            backend = "sqlite",
            file = %store.file().display(),
            "journal in an embedded SQLite file: for one node only (see docs/storage.md)"
        ),
    }
}

pub use crate::reconcile::adapter::install_crypto_provider;

/// Installs logging only (commands that run and exit): `RUST_LOG` filter (default `info`),
/// text or JSON lines on standard error; no spans are exported and no metrics served.
pub fn init_tracing(format: LogFormat) {
    let _ = Telemetry::disabled().install(LogOptions::from_env(format));
}

/// Builds and installs the telemetry of a long-running process named `service` (the default
/// `service.name`): options from the `OTEL_*` variables, logs as `format` says.
///
/// Errors: an unsupported or unusable `OTEL_*` setting, naming it.
pub fn init_telemetry(format: LogFormat, service: &str) -> Result<Telemetry, StartError> {
    let options = TelemetryOptions::from_env(service)?;
    let telemetry = Telemetry::new(&options)?;
    telemetry.install(LogOptions::from_env(format))?;
    tracing::info!(
        service_name = %options.service_name,
        tracing = options.tracing,
        otlp_traces = options.traces.is_some(),
        otlp_metrics = options.otlp_metrics.is_some(),
        prometheus = options.prometheus,
        "telemetry ready"
    );
    Ok(telemetry)
}

/// Serves the Prometheus scrape endpoint of `telemetry` on `address` until `shutdown`, when
/// Prometheus is on; returns the bound address (port 0 picks one) and the server's task.
///
/// Errors: the address cannot be bound.
pub async fn serve_metrics(
    telemetry: &Telemetry,
    address: std::net::SocketAddr,
    shutdown: CancellationToken,
) -> std::io::Result<Option<(std::net::SocketAddr, tokio::task::JoinHandle<()>)>> {
    let Some(registry) = telemetry.prometheus_registry().cloned() else {
        return Ok(None);
    };
    let listener = tokio::net::TcpListener::bind(address).await?;
    let bound = listener.local_addr()?;
    let task = tokio::spawn(async move {
        if let Err(error) = admin::serve_metrics(listener, registry, shutdown).await {
            tracing::error!(error = %error, "the metrics endpoint failed");
        }
    });
    tracing::info!(address = %bound, "serving Prometheus metrics at /metrics");
    Ok(Some((bound, task)))
}

/// The review console's settings: sign-in by the server's tokens (or by name when there
/// are none), HTTPS with the server's certificates when it has them (`server`'s TLS,
/// reloaded with it), and the configured limits and allowed hosts.
///
/// Errors: invalid tokens (naming the setting).
pub fn console_options(
    config: &Config,
    server: &ServeOptions,
) -> Result<ConsoleOptions, StartError> {
    let access = ConsoleAccess::from_registry(config.token_registry()?);
    let tls = server.tls.clone();
    let mut options = ConsoleOptions::new(access, tls, config.limits.max_result_bytes);
    options.limits = config.console_limits();
    Ok(options)
}

/// Serves the review console of `parts` on `address` until `shutdown`; returns its URL
/// (port 0 picks one) and the server's task.
///
/// Errors: the address cannot be bound.
pub fn serve_console(
    parts: &Components,
    address: std::net::SocketAddr,
    options: ConsoleOptions,
    shutdown: CancellationToken,
) -> std::io::Result<(String, tokio::task::JoinHandle<()>)> {
    let listener = std::net::TcpListener::bind(address)?;
    listener.set_nonblocking(true)?;
    let listener = tokio::net::TcpListener::from_std(listener)?;
    let bound = listener.local_addr()?;
    let scheme = if options.tls.is_some() {
        "https"
    } else {
        "http"
    };
    let url = format!("{scheme}://{bound}/");
    match &options.access {
        ConsoleAccess::Tokens(registry) => tracing::info!(
            address = %bound,
            tokens = registry.len(),
            "serving the review console (sign-in by bearer token)"
        ),
        ConsoleAccess::Open if bound.ip().is_loopback() => tracing::info!(
            address = %bound,
            "serving the review console without tokens, on loopback (sign-in by name)"
        ),
        ConsoleAccess::Open => tracing::warn!(
            address = %bound,
            "serving the review console without tokens on an address other hosts can reach: \
             whoever reaches it may resolve operations in every namespace"
        ),
    }
    let (journal, reconciler) = (parts.journal.clone(), parts.reconciler.clone());
    let task = tokio::spawn(async move {
        if let Err(error) = console::serve(journal, reconciler, listener, options, shutdown).await {
            tracing::error!(error = %error, "the review console failed");
        }
    });
    Ok((url, task))
}

/// Writes one line to standard output for whoever started a long-running process (its
/// addresses); a closed standard output (the starter stopped reading) is not an error.
pub fn announce(line: &str) {
    use std::io::Write as _;
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}").and_then(|()| out.flush());
}

/// A token cancelled on SIGTERM or SIGINT.
pub fn shutdown_on_signals() -> CancellationToken {
    let token = CancellationToken::new();
    let cancel = token.clone();
    tokio::spawn(async move {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{SignalKind, signal};
            match signal(SignalKind::terminate()) {
                Ok(mut term) => {
                    tokio::select! {
                        _ = term.recv() => tracing::info!("SIGTERM received"),
                        _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT received"),
                    }
                }
                Err(_) => {
                    let _ = tokio::signal::ctrl_c().await;
                }
            }
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
        }
        cancel.cancel();
    });
    token
}
