//! `opjournal-reconciler`: the reconcile worker. Sweeps expired leases into unknown, looks
//! unknown operations up through each action's provider adapter, and escalates what cannot
//! be proven to human review. Run any number of replicas on Postgres; on the embedded SQLite
//! journal, run it beside the server on the same machine and file (it prepares the file if
//! the server has not yet).

use std::net::SocketAddr;

use anyhow::Context as _;
use clap::Parser;
use opjournal::cli::CommonFlags;
use opjournal::config::Config;
use opjournal::reconcile::worker::{Worker, WorkerConfig};
use opjournal::store::Backend;
use opjournal::{api, app};
use serde::Serialize;

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
    /// Run one poll (sweep, claim, look up) and exit; exit code 1 if the store is unreachable.
    #[arg(long)]
    #[serde(skip)]
    once: bool,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let config = Config::load(cli.common.config.as_ref(), &cli)?;
    app::init_tracing(config.log_format);
    let parts = app::build(&config)?;
    app::log_database(&parts.database);
    if parts.database.backend() == Backend::Sqlite {
        app::prepare_database(&config.database_url, &parts.database)
            .await
            .context("prepare the journal file")?;
    }
    let worker = Worker::new(
        parts.reconciler,
        WorkerConfig {
            poll_interval: Config::seconds(config.reconcile_poll_seconds),
            batch_size: config.reconcile_batch_size,
            concurrency: config.reconcile_concurrency,
            claim_hold: Config::seconds(config.reconcile_claim_hold_seconds),
            purge_interval: Config::seconds(config.purge_interval_seconds),
            purge_batch_size: config.purge_batch_size,
        },
    );
    let policy = app::load_policy(&config)?;
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
        let listener = tokio::net::TcpListener::bind(config.reconciler_health_listen)
            .await
            .with_context(|| format!("cannot listen on {}", config.reconciler_health_listen))?;
        let address = listener.local_addr()?;
        println!("opjournal-reconciler health on {address}");
        let health = tokio::spawn(api::serve_health(
            parts.store.clone(),
            listener,
            Config::seconds(config.readiness_interval_seconds),
            shutdown.clone(),
        ));
        tracing::info!(%address, "reconcile worker started");
        worker.run(shutdown).await;
        health.await??;
        tracing::info!("reconcile worker stopped");
    }
    parts.database.close().await;
    Ok(())
}
