//! `opjournal-sandbox`: runs the fake payment/e-mail provider of
//! [`opjournal_sandbox`] over HTTP until SIGTERM or Ctrl-C.

use std::io::Write;
use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use opjournal_sandbox::{Defect, Sandbox, SandboxConfig};
use tracing_subscriber::EnvFilter;

/// Fake HTTP payment and e-mail provider with an in-memory store, for tests,
/// demos and local stands.
#[derive(Debug, Parser)]
#[command(
    name = "opjournal-sandbox",
    version,
    about = "Fake HTTP payment and e-mail provider with an in-memory store, for tests, demos and local stands",
    allow_negative_numbers = true
)]
struct Args {
    /// Address to listen on (host:port; port 0 picks a free port).
    #[arg(
        long,
        env = "OPJOURNAL_SANDBOX_LISTEN",
        default_value = "127.0.0.1:8081"
    )]
    listen: SocketAddr,

    /// Seconds a new payment or e-mail stays invisible to lookups (index lag).
    #[arg(
        long,
        allow_negative_numbers = true,
        env = "OPJOURNAL_SANDBOX_LOOKUP_LAG_SECONDS",
        default_value_t = 0.0
    )]
    lookup_lag_seconds: f64,

    /// Seconds a `commit-then-timeout` request stalls before it answers.
    #[arg(
        long,
        allow_negative_numbers = true,
        env = "OPJOURNAL_SANDBOX_HANG_SECONDS",
        default_value_t = 30.0
    )]
    hang_seconds: f64,

    /// Seconds a `slow` request waits before it stores its effect and answers.
    #[arg(
        long,
        allow_negative_numbers = true,
        env = "OPJOURNAL_SANDBOX_SLOW_SECONDS",
        default_value_t = 2.0
    )]
    slow_seconds: f64,

    /// Run as a deliberately broken provider, to prove that a checker (the
    /// fault-injection suite, `opjournal-chaos`) catches the bug. Never for
    /// anything else.
    #[arg(long, value_enum)]
    deliberately_broken: Option<BrokenMode>,
}

/// The deliberate defects `--deliberately-broken` can switch on.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum BrokenMode {
    /// Store every new payment twice (two payment ids, two effects).
    StorePaymentsTwice,
}

fn seconds(name: &str, value: f64) -> anyhow::Result<Duration> {
    Duration::try_from_secs_f64(value)
        .with_context(|| format!("{name} must be a finite, non-negative number of seconds"))
}

/// Resolves on SIGTERM or SIGINT, logging it.
async fn shutdown_signal() {
    let signal = opjournal_signal::stop_signal().await;
    tracing::info!(signal, "shutting down");
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();

    let args = Args::parse();
    let config = SandboxConfig {
        lookup_lag: seconds("--lookup-lag-seconds", args.lookup_lag_seconds)?,
        hang: seconds("--hang-seconds", args.hang_seconds)?,
        slow: seconds("--slow-seconds", args.slow_seconds)?,
        defect: args.deliberately_broken.map(|mode| match mode {
            BrokenMode::StorePaymentsTwice => Defect::StorePaymentsTwice,
        }),
    };
    if let Some(defect) = config.defect {
        tracing::warn!(?defect, "running as a DELIBERATELY BROKEN provider");
    }

    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    let addr = listener
        .local_addr()
        .context("cannot read the bound address")?;
    {
        let mut stdout = std::io::stdout().lock();
        writeln!(stdout, "opjournal-sandbox listening on http://{addr}")?;
        stdout.flush()?;
    }
    tracing::info!(%addr, ?config, "sandbox started");

    Sandbox::new(config)
        .serve(listener, shutdown_signal())
        .await
        .context("sandbox server failed")?;
    Ok(())
}
