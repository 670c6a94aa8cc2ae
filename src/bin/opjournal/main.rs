//! `opjournal`: the journal's gRPC server and operator commands.

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use commands::{CopyFlags, PurgeFlags};
use opjournal::app::Application;
use opjournal::cli::{CommonFlags, ServeFlags};
use opjournal::config::Config;
use opjournal::ops::{self, OpsCommand};

mod commands;
#[cfg(feature = "dev")]
mod demo;
#[cfg(feature = "dev")]
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
    #[cfg(feature = "dev")]
    Dev(dev::DevFlags),
    /// Run the source article's seven-step check live: server, sandbox provider and
    /// reconcile worker on free local ports (or, with `--against`, an already running
    /// stand such as `opjournal dev`); exit code 0 only if every step holds.
    #[cfg(feature = "dev")]
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

#[tokio::main]
async fn main() -> anyhow::Result<ExitCode> {
    let done = match Cli::parse().command {
        Command::Serve(flags) => {
            let config = Config::load(flags.common.config.as_ref(), &flags)?;
            Application::build(config).await?.run_until_stopped().await
        }
        #[cfg(feature = "dev")]
        Command::Dev(flags) => dev::run(flags).await,
        #[cfg(feature = "dev")]
        Command::Demo(flags) => return demo::run(flags).await,
        Command::Migrate(flags) => commands::migrate(flags).await,
        Command::Purge(flags) => commands::purge(flags).await,
        Command::CheckConfig(flags) => commands::check_config(flags),
        Command::CopyJournal(flags) => commands::copy_journal(flags).await,
        Command::Ops(command) => return Ok(ops::run(*command).await),
    };
    done.map(|()| ExitCode::SUCCESS)
}
