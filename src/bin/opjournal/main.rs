//! `opjournal`: the journal's gRPC server and operator commands.

use std::process::ExitCode;

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use opjournal::cli::{CommonFlags, ServeFlags};
use opjournal::config::Config;
use opjournal::ops::OpsCommand;
use opjournal::store::Backend;
use opjournal::{api, app, ops};

mod demo;

#[derive(Parser)]
#[command(
    version,
    about = "An operation journal that makes side-effecting tool calls safe to retry"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the OperationJournal and Reconciler gRPC services.
    Serve(ServeFlags),
    /// Run the source article's seven-step check live: server, sandbox provider and
    /// reconcile worker on free local ports; exit code 0 only if every step holds.
    Demo(demo::DemoFlags),
    /// Create the database (Postgres) or the journal file (SQLite) if missing and apply
    /// migrations, then exit.
    Migrate(CommonFlags),
    /// Validate the configuration and the policy file without starting.
    CheckConfig(CommonFlags),
    /// Delete terminal operations past their retention (and their history), in batches;
    /// pending, in-progress and unknown operations are never deleted.
    Purge(PurgeFlags),
    #[command(flatten)]
    Ops(Box<OpsCommand>),
}

/// Flags of `opjournal purge`.
#[derive(clap::Args)]
struct PurgeFlags {
    #[command(flatten)]
    common: CommonFlags,
    /// Operations deleted per statement (default: the `purge_batch_size` setting).
    #[arg(long)]
    batch_size: Option<i64>,
    /// Most statements to run.
    #[arg(long, default_value_t = 1000)]
    max_batches: u32,
}

#[tokio::main]
async fn main() -> anyhow::Result<ExitCode> {
    let cli = Cli::parse();
    match cli.command {
        Command::Serve(flags) => serve(flags).await.map(|()| ExitCode::SUCCESS),
        Command::Demo(flags) => demo::run(flags).await,
        Command::Migrate(flags) => {
            let config = Config::load(flags.config.as_ref(), &flags)?;
            app::init_tracing(config.log_format);
            let parts = app::build(&config)?;
            app::prepare_database(&config.database_url, &parts.database)
                .await
                .context("migrate")?;
            println!("migrations applied ({})", parts.database.backend().name());
            Ok(ExitCode::SUCCESS)
        }
        Command::Purge(flags) => {
            let config = Config::load(flags.common.config.as_ref(), &flags.common)?;
            app::init_tracing(config.log_format);
            let parts = app::build(&config)?;
            let purged = opjournal::reconcile::worker::purge(
                parts.store.as_ref(),
                flags.batch_size.unwrap_or(config.purge_batch_size),
                flags.max_batches,
            )
            .await
            .context("purge")?;
            parts.database.close().await;
            println!("purged {purged} operations past retention");
            Ok(ExitCode::SUCCESS)
        }
        Command::CheckConfig(flags) => {
            let config = Config::load(flags.config.as_ref(), &flags)?;
            app::install_crypto_provider();
            app::build(&config)?;
            app::serve_options(&config)?;
            println!("configuration and policy are valid");
            Ok(ExitCode::SUCCESS)
        }
        Command::Ops(command) => Ok(ops::run(*command).await),
    }
}

async fn serve(flags: ServeFlags) -> anyhow::Result<()> {
    let config = Config::load(flags.common.config.as_ref(), &flags)?;
    app::init_tracing(config.log_format);
    app::install_crypto_provider();
    let parts = app::build(&config)?;
    let options = app::serve_options(&config)?;
    app::log_database(&parts.database);
    // The embedded journal needs no setup: its file and schema are made at start.
    if config.migrate_on_start || parts.database.backend() == Backend::Sqlite {
        app::prepare_database(&config.database_url, &parts.database)
            .await
            .context("migrate on start")?;
    }
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .with_context(|| format!("cannot listen on {}", config.listen))?;
    let address = listener.local_addr()?;
    tracing::info!(%address, "opjournal serving gRPC");
    println!("opjournal listening on {address}");
    app::log_security(&config, &options);
    let shutdown = app::shutdown_on_signals();
    api::serve(parts.journal, parts.reconciler, listener, options, shutdown).await?;
    parts.database.close().await;
    tracing::info!("stopped");
    Ok(())
}
