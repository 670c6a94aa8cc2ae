//! `opjournal-chaos`: the fault-injection suite. Exit code 0 when every invariant holds, 1
//! when one is broken, 2 when the stand could not be run.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;
use clap::Parser;
use opjournal_chaos::run::{RunConfig, run};
use opjournal_chaos::stand::{Stand, StandConfig};
use tracing_subscriber::EnvFilter;

/// Runs intents through two server replicas under provider, process and network faults,
/// then checks the journal against the provider's effects, key by key.
#[derive(Debug, Parser)]
#[command(name = "opjournal-chaos", version)]
struct Args {
    /// How many intents to drive.
    #[arg(long, default_value_t = 500)]
    intents: usize,
    /// Seconds over which the intents are started while faults are injected (the faults go
    /// on until every kind was injected at least once).
    #[arg(long, default_value_t = 30)]
    drive_seconds: u64,
    /// Seconds the agents keep going after the last fault before they give up.
    #[arg(long, default_value_t = 60)]
    settle_seconds: u64,
    /// Most intents in flight at once.
    #[arg(long, default_value_t = 48)]
    concurrency: usize,
    /// Seed of every random choice (the plans, the faults, the lost answers).
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Probability that a call of an intent planned with lost answers loses its answer.
    #[arg(long, default_value_t = 0.3)]
    lose_probability: f64,
    /// Inject no process or network faults (provider faults, lost answers and agent crashes
    /// still happen).
    #[arg(long)]
    no_process_or_network_faults: bool,
    /// Run the sandbox as a deliberately broken provider, to prove the suite catches it:
    /// `store-payments-twice`. The run must then fail.
    #[arg(long)]
    sandbox_defect: Option<String>,
    /// Where to write the JSON report.
    #[arg(long, default_value = "target/chaos/report.json")]
    report: PathBuf,
    /// The work directory (logs, policy, the Postgres cluster); a new temporary one by
    /// default, removed after a passing run unless `--keep` (a given one is left to its
    /// owner). The Postgres cluster in it is removed at the end of every run.
    #[arg(long)]
    work_dir: Option<PathBuf>,
    /// Keep the work directory.
    #[arg(long)]
    keep: bool,
}

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| EnvFilter::new("warn,opjournal_client=error")),
        )
        .with_writer(std::io::stderr)
        .init();
    let _ = rustls::crypto::ring::default_provider().install_default();
    let args = Args::parse();
    match main_with(args).await {
        Ok(code) => code,
        Err(err) => {
            eprintln!("opjournal-chaos: {err:#}");
            ExitCode::from(2)
        }
    }
}

async fn main_with(args: Args) -> anyhow::Result<ExitCode> {
    let work = match &args.work_dir {
        Some(dir) => {
            std::fs::create_dir_all(dir).context("create the work directory")?;
            Work::Given(dir.clone())
        }
        None => Work::Temporary(
            tempfile::Builder::new()
                .prefix("opjournal-chaos-")
                .tempdir()
                .context("create a work directory")?,
        ),
    };
    let config = RunConfig {
        intents: args.intents,
        drive: Duration::from_secs(args.drive_seconds),
        settle: Duration::from_secs(args.settle_seconds),
        concurrency: args.concurrency,
        seed: args.seed,
        chaos: !args.no_process_or_network_faults,
        stand: StandConfig {
            sandbox_defect: args.sandbox_defect.clone(),
            lose_probability: args.lose_probability.clamp(0.0, 1.0),
            seed: args.seed,
        },
    };
    let mut stand = Stand::new(work.path());
    let outcome = tokio::select! {
        outcome = run(&config, &mut stand) => outcome,
        _ = opjournal_signal::stop_signal() => Err(anyhow::anyhow!("interrupted")),
    };
    stand.tear_down().await;
    let report = match outcome {
        Ok(report) => report,
        Err(err) => {
            eprintln!("logs: {}", work.keep().display());
            return Err(err);
        }
    };
    print!("{}", report.table());
    if let Some(parent) = args.report.parent() {
        std::fs::create_dir_all(parent).context("create the report's directory")?;
    }
    let json = serde_json::to_string_pretty(&report).context("encode the report")?;
    std::fs::write(&args.report, json + "\n").context("write the report")?;
    println!("Report: {}", args.report.display());
    if !report.passed || args.keep {
        println!("Logs: {}", work.keep().display());
    } else {
        work.remove();
    }
    Ok(if report.passed {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// The work directory: a temporary one is removed unless kept.
enum Work {
    Given(PathBuf),
    Temporary(tempfile::TempDir),
}

impl Work {
    fn path(&self) -> &std::path::Path {
        match self {
            Self::Given(path) => path,
            Self::Temporary(dir) => dir.path(),
        }
    }

    fn keep(self) -> PathBuf {
        match self {
            Self::Given(path) => path,
            Self::Temporary(dir) => dir.keep(),
        }
    }

    /// Removes a temporary directory; a given one is its owner's to remove.
    fn remove(self) {
        drop(self);
    }
}
