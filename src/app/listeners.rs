//! What the servers of a process listen with: the gRPC server's settings (authentication,
//! TLS, limits), the review console, the Prometheus endpoint, and the lines that tell the
//! starter where each listens.

use std::net::SocketAddr;

use anyhow::Context as _;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::StartError;
use super::components::Components;
use crate::api::console::{self, ConsoleAccess, ConsoleOptions};
use crate::api::tls::{self, ServerTlsFiles};
use crate::api::{Authenticator, ServeOptions};
use crate::config::Config;
use crate::telemetry::{Metrics, Telemetry, admin};

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
    Ok(console_options_with(config, access, server.tls.clone()))
}

/// The review console's settings with `access` and `tls`, and the configured result size,
/// limits and allowed hosts.
pub fn console_options_with(
    config: &Config,
    access: ConsoleAccess,
    tls: Option<tls::ServerTls>,
) -> ConsoleOptions {
    let mut options = ConsoleOptions::new(access, tls, config.limits.max_result_bytes);
    options.limits = config.console_limits();
    options
}

/// Binds `address` for `what` (the message of a failure names both).
///
/// Errors: the address cannot be bound.
pub async fn bind(address: SocketAddr, what: &str) -> anyhow::Result<(TcpListener, SocketAddr)> {
    let listener = TcpListener::bind(address)
        .await
        .with_context(|| format!("cannot listen on {address}{what}"))?;
    let bound = listener.local_addr()?;
    Ok((listener, bound))
}

/// Serves the Prometheus scrape endpoint of `telemetry` on `address` until `shutdown`, when
/// Prometheus is on; returns the bound address (port 0 picks one) and the server's task.
///
/// Errors: the address cannot be bound.
pub async fn serve_metrics(
    telemetry: &Telemetry,
    address: SocketAddr,
    shutdown: CancellationToken,
) -> std::io::Result<Option<(SocketAddr, JoinHandle<()>)>> {
    let Some(registry) = telemetry.prometheus_registry().cloned() else {
        return Ok(None);
    };
    let listener = TcpListener::bind(address).await?;
    let bound = listener.local_addr()?;
    let task = tokio::spawn(async move {
        if let Err(error) = admin::serve_metrics(listener, registry, shutdown).await {
            tracing::error!(error = %error, "the metrics endpoint failed");
        }
    });
    tracing::info!(address = %bound, "serving Prometheus metrics at /metrics");
    Ok(Some((bound, task)))
}

/// The Prometheus endpoint of a process, when it serves one: stopped after the process's
/// other servers, so the last scrape sees their last values.
pub struct MetricsEndpoint {
    stop: CancellationToken,
    task: Option<JoinHandle<()>>,
}

impl MetricsEndpoint {
    /// Serves the endpoint of `telemetry` on `address` (see [`serve_metrics`]) and announces
    /// it as `{process} metrics on http://ADDRESS/metrics`.
    ///
    /// Errors: the address cannot be bound (the message names it).
    pub async fn start(
        telemetry: &Telemetry,
        address: SocketAddr,
        process: &str,
    ) -> anyhow::Result<Self> {
        let stop = CancellationToken::new();
        let served = serve_metrics(telemetry, address, stop.clone())
            .await
            .with_context(|| format!("cannot listen on {address} (metrics)"))?;
        let task = served.map(|(bound, task)| {
            announce(&format!("{process} metrics on http://{bound}/metrics"));
            task
        });
        Ok(Self { stop, task })
    }

    /// Stops the endpoint and waits for it.
    pub async fn stop(self) {
        self.stop.cancel();
        if let Some(task) = self.task {
            let _ = task.await;
        }
    }
}

/// Serves the review console of `parts` on `address` until `shutdown`; returns its URL
/// (port 0 picks one) and the server's task.
///
/// Errors: the address cannot be bound.
pub fn serve_console(
    parts: &Components,
    address: SocketAddr,
    options: ConsoleOptions,
    shutdown: CancellationToken,
) -> std::io::Result<(String, JoinHandle<()>)> {
    let listener = std::net::TcpListener::bind(address)?;
    listener.set_nonblocking(true)?;
    let listener = TcpListener::from_std(listener)?;
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
