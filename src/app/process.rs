//! What every long-running process does around its work: install logging and telemetry,
//! turn SIGTERM and SIGINT ([`stop_signal`], shared by every binary of the workspace) into a
//! cancellation, and report the error it stopped on.

use tokio_util::sync::CancellationToken;

use super::StartError;
use crate::config::LogFormat;
use crate::telemetry::{LogOptions, Telemetry, TelemetryOptions};

pub use crate::reconcile::adapter::install_crypto_provider;
pub use opjournal_signal::stop_signal;

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

/// Logs the error `process` stopped on (with its causes), then exports the spans and
/// metrics of its last calls before the process exits.
pub async fn finish<T>(
    process: &str,
    telemetry: Telemetry,
    result: anyhow::Result<T>,
) -> anyhow::Result<T> {
    if let Err(error) = &result {
        tracing::error!(error = %format!("{error:#}"), "{process} stopped on an error");
    }
    telemetry.shutdown().await;
    result
}

/// A token cancelled on SIGTERM or SIGINT (see [`stop_signal`]).
pub fn shutdown_on_signals() -> CancellationToken {
    let token = CancellationToken::new();
    let cancel = token.clone();
    tokio::spawn(async move {
        let signal = stop_signal().await;
        tracing::info!("{signal} received");
        cancel.cancel();
    });
    token
}
