//! `opjournal-reconciler`: the reconcile worker. Sweeps expired leases into unknown, looks
//! unknown operations up through each action's provider adapter, and escalates what cannot
//! be proven to human review. Run any number of replicas on Postgres; on the embedded SQLite
//! journal, run it beside the server on the same machine and file (it prepares the file if
//! the server has not yet). Serves gRPC health and, on an admin HTTP port, Prometheus metrics
//! (with the backlog gauges, sampled here). With `webhook_url` set it also delivers the
//! escalation outbox to that URL (docs/webhooks.md).

use std::net::SocketAddr;

use anyhow::Context as _;
use clap::Parser;
use opjournal::cli::CommonFlags;
use opjournal::config::Backend;
use opjournal::config::Config;
use opjournal::reconcile::webhook::WebhookDelivery;
use opjournal::telemetry::Telemetry;
use opjournal::{api, app};
use serde::Serialize;
use tokio_util::sync::CancellationToken;

/// jemalloc rather than glibc's allocator, with its background threads: freed memory goes
/// back to the system within about 10 s (`dirty_decay_ms`) even when no thread allocates, so
/// the memory a flood of connections took comes back after they close (docs/performance.md,
/// "Held streams").
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

#[derive(Parser, Serialize)]
#[command(version, about = "The opjournal reconcile worker")]
struct Cli {
    #[command(flatten)]
    #[serde(flatten)]
    common: CommonFlags,
    /// gRPC health listen address (default: 127.0.0.1:50052).
    #[arg(long)]
    #[serde(
        rename = "reconciler_health_listen",
        skip_serializing_if = "Option::is_none"
    )]
    health_listen: Option<SocketAddr>,
    /// Admin HTTP address serving Prometheus metrics at /metrics (default: 127.0.0.1:9465).
    #[arg(long)]
    #[serde(
        rename = "reconciler_metrics_listen",
        skip_serializing_if = "Option::is_none"
    )]
    metrics_listen: Option<SocketAddr>,
    /// Run one poll (sweep, claim, look up) and exit; exit code 1 if the store is unreachable.
    #[arg(long)]
    #[serde(skip)]
    once: bool,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let config = Config::load(cli.common.config.as_ref(), &cli)?;
    let telemetry = app::init_telemetry(config.telemetry.log_format, "opjournal-reconciler")?;
    config.warn_deprecations();
    let result = run(&cli, &config, &telemetry).await;
    if let Err(error) = &result {
        tracing::error!(error = %format!("{error:#}"), "the reconcile worker stopped on an error");
    }
    // Spans and metrics of the last attempts are exported before the process exits.
    telemetry.shutdown().await;
    result
}

async fn run(cli: &Cli, config: &Config, telemetry: &Telemetry) -> anyhow::Result<()> {
    let parts = app::build(config, telemetry.metrics())?;
    app::log_database(&parts.database);
    if parts.database.backend() == Backend::Sqlite {
        app::prepare_database(config.database.url.expose(), &parts.database)
            .await
            .context("prepare the journal file")?;
    }
    let worker = app::worker(config, parts.reconciler.clone());
    let policy = app::load_policy(config)?;
    worker
        .check_claim_hold(&policy)
        .map_err(|e| anyhow::anyhow!("configuration: {e}"))?;
    if cli.once {
        let stats = worker.tick().await?;
        println!(
            "swept={} looked_up={} settled={} released={} escalated={} superseded={} errors={}",
            stats.swept,
            stats.looked_up,
            stats.settled,
            stats.released,
            stats.escalated,
            stats.superseded,
            stats.errors
        );
    } else {
        let shutdown = app::shutdown_on_signals();
        let listener = tokio::net::TcpListener::bind(config.reconcile.health_listen)
            .await
            .with_context(|| format!("cannot listen on {}", config.reconcile.health_listen))?;
        let address = listener.local_addr()?;
        app::announce(&format!("opjournal-reconciler health on {address}"));
        // The metrics endpoint outlives the worker's last poll, so the last scrape sees it.
        let admin_stop = CancellationToken::new();
        let admin = app::serve_metrics(
            telemetry,
            config.reconcile.metrics_listen,
            admin_stop.clone(),
        )
        .await
        .with_context(|| {
            format!(
                "cannot listen on {} (metrics)",
                config.reconcile.metrics_listen
            )
        })?;
        if let Some((metrics_address, _)) = &admin {
            app::announce(&format!(
                "opjournal-reconciler metrics on http://{metrics_address}/metrics"
            ));
        }
        let store = parts.reconciler.store().clone();
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
        let webhooks = match app::webhook_config(config).map_err(|e| anyhow::anyhow!(e))? {
            Some(webhook) => {
                let delivery = WebhookDelivery::new(
                    parts.reconciler.store().clone(),
                    webhook,
                    telemetry.metrics().clone(),
                )
                .map_err(|e| anyhow::anyhow!(e))?;
                tracing::info!("escalation webhook delivery started");
                let shutdown = shutdown.clone();
                Some(tokio::spawn(async move { delivery.run(shutdown).await }))
            }
            None => None,
        };
        tracing::info!(%address, "reconcile worker started");
        worker.run(shutdown).await;
        if let Some(webhooks) = webhooks {
            let _ = webhooks.await;
        }
        let _ = sampler.await;
        health.await??;
        admin_stop.cancel();
        if let Some((_, task)) = admin {
            let _ = task.await;
        }
        tracing::info!("reconcile worker stopped");
    }
    parts.database.close().await;
    Ok(())
}
