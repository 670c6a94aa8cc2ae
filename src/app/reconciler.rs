//! The reconcile worker process (`opjournal-reconciler`): the worker's polls, gRPC health,
//! the Prometheus endpoint with the backlog gauges, and the escalation webhook's delivery.

use anyhow::Context as _;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::components::{self, Components};
use super::listeners::{MetricsEndpoint, announce, bind};
use super::process::{self, finish};
use crate::api;
use crate::config::{Backend, Config};
use crate::reconcile::webhook::WebhookDelivery;
use crate::reconcile::worker::{TickStats, Worker};
use crate::telemetry::Telemetry;

/// The reconcile worker, built: telemetry installed, the embedded journal file prepared, the
/// worker's settings checked against the policy. Run it once
/// ([`run_once`](Self::run_once)) or until stopped
/// ([`run_until_stopped`](Self::run_until_stopped)).
pub struct WorkerApplication {
    config: Config,
    telemetry: Telemetry,
    components: Components,
    worker: Worker,
}

impl WorkerApplication {
    /// Installs telemetry and builds the components and the worker `config` describes; on
    /// the embedded journal, prepares its file (the server may not have yet). A failure is
    /// logged before it is returned.
    ///
    /// Errors: invalid settings (a claim hold too short for the policy's lookups among them)
    /// or an unusable database.
    pub async fn build(config: Config) -> anyhow::Result<Self> {
        let telemetry =
            process::init_telemetry(config.telemetry.log_format, "opjournal-reconciler")?;
        config.warn_deprecations();
        match Self::parts(&config, &telemetry).await {
            Ok((components, worker)) => Ok(Self {
                config,
                telemetry,
                components,
                worker,
            }),
            Err(error) => finish("the reconcile worker", telemetry, Err(error)).await,
        }
    }

    async fn parts(config: &Config, telemetry: &Telemetry) -> anyhow::Result<(Components, Worker)> {
        let components = Components::build(config, telemetry.metrics())?;
        components.database.log_backend();
        if components.database.backend() == Backend::Sqlite {
            components
                .database
                .prepare(config.database.url.expose())
                .await
                .context("prepare the journal file")?;
        }
        let worker = components.worker(config)?;
        Ok((components, worker))
    }

    /// Runs one poll (sweep, claim, look up) and stops.
    ///
    /// Errors: the store is unreachable.
    pub async fn run_once(self) -> anyhow::Result<TickStats> {
        let result = self.worker.tick().await.map_err(anyhow::Error::from);
        self.components.database.close().await;
        finish("the reconcile worker", self.telemetry, result).await
    }

    /// Binds and announces the health address (`opjournal-reconciler health on ADDRESS`)
    /// and the metrics endpoint, starts the backlog sampler and, with `webhook_url`, the
    /// webhook delivery, then polls until SIGTERM or SIGINT; every part stops before this
    /// returns, the metrics endpoint last.
    ///
    /// Errors: an address cannot be bound, the webhook settings are unusable, or the health
    /// server failed.
    pub async fn run_until_stopped(self) -> anyhow::Result<()> {
        let result = run(
            &self.config,
            &self.telemetry,
            &self.components,
            &self.worker,
        )
        .await;
        self.components.database.close().await;
        finish("the reconcile worker", self.telemetry, result).await
    }
}

async fn run(
    config: &Config,
    telemetry: &Telemetry,
    components: &Components,
    worker: &Worker,
) -> anyhow::Result<()> {
    let shutdown = process::shutdown_on_signals();
    let (listener, address) = bind(config.reconcile.health_listen, "").await?;
    announce(&format!("opjournal-reconciler health on {address}"));
    // The metrics endpoint outlives the worker's last poll, so the last scrape sees it.
    let metrics = MetricsEndpoint::start(
        telemetry,
        config.reconcile.metrics_listen,
        "opjournal-reconciler",
    )
    .await?;
    let store = components.store.clone();
    let health = tokio::spawn(api::serve_health(
        store.clone(),
        listener,
        config.server.readiness_interval,
        config.transport_limits(),
        shutdown.clone(),
    ));
    let sampler = tokio::spawn(telemetry.metrics().clone().run_backlog_sampler(
        store,
        config.reconcile.backlog_sample_interval,
        shutdown.clone(),
    ));
    let webhooks = start_webhooks(config, telemetry, components, &shutdown)?;
    tracing::info!(%address, "reconcile worker started");
    worker.run(shutdown).await;
    if let Some(webhooks) = webhooks {
        let _ = webhooks.await;
    }
    let _ = sampler.await;
    health.await??;
    metrics.stop().await;
    tracing::info!("reconcile worker stopped");
    Ok(())
}

/// Starts delivering the escalation outbox when `webhook_url` is configured.
fn start_webhooks(
    config: &Config,
    telemetry: &Telemetry,
    components: &Components,
    shutdown: &CancellationToken,
) -> anyhow::Result<Option<JoinHandle<()>>> {
    let Some(webhook) = components::webhook_config(config)? else {
        return Ok(None);
    };
    let delivery = WebhookDelivery::new(
        components.store.clone(),
        webhook,
        telemetry.metrics().clone(),
    )
    .map_err(|e| anyhow::anyhow!(e))?;
    tracing::info!("escalation webhook delivery started");
    let shutdown = shutdown.clone();
    Ok(Some(tokio::spawn(
        async move { delivery.run(shutdown).await },
    )))
}
