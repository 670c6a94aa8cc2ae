//! `opjournal`: the journal's gRPC server and operator commands.

use std::process::ExitCode;

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use opjournal::app::Database;
use opjournal::cli::{CommonFlags, ServeFlags};
use opjournal::config::Backend;
use opjournal::config::Config;
use opjournal::ops::OpsCommand;
use opjournal::telemetry::{Metrics, Telemetry, TelemetryOptions};
use opjournal::{api, app, ops};
use tokio_util::sync::CancellationToken;

mod demo;
mod dev;

/// jemalloc rather than glibc's allocator, with its background threads: freed memory goes
/// back to the system within about 10 s (`dirty_decay_ms`) even when no thread allocates, so
/// the memory a flood of connections took comes back after they close (docs/performance.md,
/// "Held streams").
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

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
    /// Run everything in one process for local development: the server, the reconcile
    /// worker and the sandbox provider on an embedded journal, on loopback only; prints the
    /// addresses, a Python snippet and the demo command.
    Dev(dev::DevFlags),
    /// Run the source article's seven-step check live: server, sandbox provider and
    /// reconcile worker on free local ports (or, with `--against`, an already running
    /// stand such as `opjournal dev`); exit code 0 only if every step holds.
    Demo(demo::DemoFlags),
    /// Create the database (Postgres) or the journal file (SQLite) if missing and apply
    /// migrations, then exit.
    Migrate(CommonFlags),
    /// Validate the configuration and the policy file without starting.
    CheckConfig(CommonFlags),
    /// Copy the embedded journal file (`database_url`, a sqlite: URL) with its whole history
    /// into an empty Postgres journal: the move from one node to Postgres. Stop the server and
    /// the worker first.
    CopyJournal(CopyFlags),
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

/// Flags of `opjournal copy-journal`.
#[derive(clap::Args)]
struct CopyFlags {
    #[command(flatten)]
    common: CommonFlags,
    /// Postgres URL of the target journal; the database is created and migrated if missing,
    /// and must hold no operations.
    #[arg(long, value_name = "POSTGRES_URL")]
    to: String,
}

#[tokio::main]
async fn main() -> anyhow::Result<ExitCode> {
    let cli = Cli::parse();
    match cli.command {
        Command::Serve(flags) => serve(flags).await.map(|()| ExitCode::SUCCESS),
        Command::Dev(flags) => dev::run(flags).await.map(|()| ExitCode::SUCCESS),
        Command::Demo(flags) => demo::run(flags).await,
        Command::Migrate(flags) => {
            let config = Config::load(flags.config.as_ref(), &flags)?;
            app::init_tracing(config.telemetry.log_format);
            config.warn_deprecations();
            let parts = app::build(&config, &Metrics::disabled())?;
            app::prepare_database(config.database.url.expose(), &parts.database)
                .await
                .context("migrate")?;
            println!("migrations applied ({})", parts.database.backend().name());
            Ok(ExitCode::SUCCESS)
        }
        Command::Purge(flags) => {
            let config = Config::load(flags.common.config.as_ref(), &flags.common)?;
            app::init_tracing(config.telemetry.log_format);
            config.warn_deprecations();
            let parts = app::build(&config, &Metrics::disabled())?;
            let purged = opjournal::reconcile::worker::purge(
                parts.store.as_ref(),
                flags
                    .batch_size
                    .unwrap_or(config.reconcile.purge_batch_size),
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
            for notice in config.deprecations() {
                eprintln!("warning: {notice}");
            }
            app::install_crypto_provider();
            app::build(&config, &Metrics::disabled())?;
            let serve_options = app::serve_options(&config, &Metrics::disabled())?;
            app::console_options(&config, &serve_options)?;
            TelemetryOptions::from_env("opjournal-server")?;
            for warning in app::policy_warnings(&config)? {
                eprintln!("warning: {warning}");
            }
            print!("{}", config.to_toml());
            println!("# configuration and policy are valid");
            Ok(ExitCode::SUCCESS)
        }
        Command::CopyJournal(flags) => copy_journal(flags).await.map(|()| ExitCode::SUCCESS),
        Command::Ops(command) => Ok(ops::run(*command).await),
    }
}

async fn copy_journal(flags: CopyFlags) -> anyhow::Result<()> {
    let config = Config::load(flags.common.config.as_ref(), &flags.common)?;
    app::init_tracing(config.telemetry.log_format);
    config.warn_deprecations();
    let Database::Sqlite(source) = Database::connect_lazy(config.database.url.expose(), 2)? else {
        anyhow::bail!(
            "copy-journal copies an embedded journal: database_url must be a sqlite: URL"
        );
    };
    if Backend::of_url(&flags.to) != Some(Backend::Postgres) {
        anyhow::bail!("--to must be a postgres:// or postgresql:// URL");
    }
    if !source.file().exists() {
        anyhow::bail!("no journal file at {}", source.file().display());
    }
    source.migrate().await.context("migrate the journal file")?;
    let target = Database::connect_lazy(&flags.to, 2)?;
    app::prepare_database(&flags.to, &target)
        .await
        .context("prepare the Postgres journal")?;
    let Database::Postgres(pg) = &target else {
        anyhow::bail!("--to must be a postgres:// or postgresql:// URL");
    };
    let report = opjournal::store::copy::sqlite_to_postgres(&source, pg)
        .await
        .context("copy-journal")?;
    target.close().await;
    source.pool().close().await;
    println!(
        "copied {} operations and {} history entries from {} to Postgres; \
         set database_url to the Postgres URL before starting again",
        report.operations,
        report.events,
        source.file().display()
    );
    Ok(())
}

async fn serve(flags: ServeFlags) -> anyhow::Result<()> {
    let config = Config::load(flags.common.config.as_ref(), &flags)?;
    let telemetry = app::init_telemetry(config.telemetry.log_format, "opjournal-server")?;
    config.warn_deprecations();
    app::install_crypto_provider();
    let result = run_server(&config, &telemetry).await;
    if let Err(error) = &result {
        tracing::error!(error = %format!("{error:#}"), "the server stopped on an error");
    }
    // Spans and metrics of the last calls are exported before the process exits.
    telemetry.shutdown().await;
    result
}

async fn run_server(config: &Config, telemetry: &Telemetry) -> anyhow::Result<()> {
    let parts = app::build(config, telemetry.metrics())?;
    let options = app::serve_options(config, telemetry.metrics())?;
    app::log_database(&parts.database);
    // The embedded journal needs no setup: its file and schema are made at start.
    if config.database.migrate_on_start || parts.database.backend() == Backend::Sqlite {
        app::prepare_database(config.database.url.expose(), &parts.database)
            .await
            .context("migrate on start")?;
    }
    let listener = tokio::net::TcpListener::bind(config.server.listen)
        .await
        .with_context(|| format!("cannot listen on {}", config.server.listen))?;
    let address = listener.local_addr()?;
    tracing::info!(%address, "opjournal serving gRPC");
    app::announce(&format!("opjournal listening on {address}"));
    // The metrics endpoint outlives the gRPC server's drain, so the last scrape sees it.
    let admin_stop = CancellationToken::new();
    let admin = app::serve_metrics(telemetry, config.server.metrics_listen, admin_stop.clone())
        .await
        .with_context(|| {
            format!(
                "cannot listen on {} (metrics)",
                config.server.metrics_listen
            )
        })?;
    if let Some((metrics_address, _)) = &admin {
        app::announce(&format!(
            "opjournal metrics on http://{metrics_address}/metrics"
        ));
    }
    let health_listener = match config.server.health_listen {
        Some(address) => {
            let listener = tokio::net::TcpListener::bind(address)
                .await
                .with_context(|| format!("cannot listen on {address} (health)"))?;
            let bound = listener.local_addr()?;
            tracing::info!(address = %bound, "serving gRPC health in plaintext");
            app::announce(&format!("opjournal health on {bound}"));
            Some(listener)
        }
        None => None,
    };
    app::log_security(config, &options);
    let shutdown = app::shutdown_on_signals();
    let console = match config.console.listen {
        Some(address) => {
            let console_options = app::console_options(config, &options)?;
            let (url, task) =
                app::serve_console(&parts, address, console_options, shutdown.clone())
                    .with_context(|| format!("cannot listen on {address} (console)"))?;
            app::announce(&format!("opjournal console on {url}"));
            Some(task)
        }
        None => None,
    };
    let served = api::serve_with_health(
        parts.journal,
        parts.reconciler,
        listener,
        health_listener,
        options,
        shutdown,
    )
    .await;
    admin_stop.cancel();
    if let Some(task) = console {
        let _ = task.await;
    }
    if let Some((_, task)) = admin {
        let _ = task.await;
    }
    parts.database.close().await;
    served?;
    tracing::info!("stopped");
    Ok(())
}
