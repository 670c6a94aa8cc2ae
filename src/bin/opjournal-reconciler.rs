//! `opjournal-reconciler`: the reconcile worker. Sweeps expired leases into unknown, looks
//! unknown operations up through each action's provider adapter, and escalates what cannot
//! be proven to human review. Run any number of replicas on Postgres; on the embedded SQLite
//! journal, run it beside the server on the same machine and file (it prepares the file if
//! the server has not yet). Serves gRPC health and, on an admin HTTP port, Prometheus metrics
//! (with the backlog gauges, sampled here). With `webhook_url` set it also delivers the
//! escalation outbox to that URL (docs/webhooks.md).

use std::net::SocketAddr;

use clap::Parser;
use opjournal::app::WorkerApplication;
use opjournal::cli::CommonFlags;
use opjournal::config::Config;
use serde::Serialize;

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
    let worker = WorkerApplication::build(config).await?;
    if !cli.once {
        return worker.run_until_stopped().await;
    }
    let stats = worker.run_once().await?;
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
    Ok(())
}
