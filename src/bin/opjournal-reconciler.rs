//! `opjournal-reconciler`: the reconcile worker. Polls unknown operations and expired leases
//! and asks each action's provider adapter what really happened. Run any number of replicas.

use clap::Parser;
use opjournal::app;
use opjournal::cli::CommonFlags;
use opjournal::config::Config;
use opjournal::reconcile::worker::{Worker, WorkerConfig};

#[derive(Parser)]
#[command(version, about = "The opjournal reconcile worker")]
struct Cli {
    #[command(flatten)]
    common: CommonFlags,
    /// Run one poll (sweep, claim, look up) and exit; exit code 1 if the store is unreachable.
    #[arg(long)]
    once: bool,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let config = Config::load(cli.common.config.as_ref(), &cli.common)?;
    app::init_tracing(config.log_format);
    let parts = app::build(&config)?;
    let worker = Worker::new(
        parts.reconciler,
        WorkerConfig {
            poll_interval: Config::seconds(config.reconcile_poll_seconds),
            batch_size: config.reconcile_batch_size,
            concurrency: config.reconcile_concurrency,
            claim_hold: Config::seconds(config.reconcile_claim_hold_seconds),
        },
    );
    if cli.once {
        let stats = worker.tick().await?;
        println!(
            "swept={} looked_up={} settled={} released={} superseded={} errors={}",
            stats.swept,
            stats.looked_up,
            stats.settled,
            stats.released,
            stats.superseded,
            stats.errors
        );
    } else {
        tracing::info!("reconcile worker started");
        worker.run(app::shutdown_on_signals()).await;
        tracing::info!("reconcile worker stopped");
    }
    parts.store.pool().close().await;
    Ok(())
}
