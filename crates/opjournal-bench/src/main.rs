//! `opjournal-bench`: the journal against the physical limit of its Postgres.
//!
//! Starts the sandbox provider and the server (and, for the backlog, the reconcile worker)
//! as processes on free local ports, each on a database of its own that the benchmark
//! creates; drives N gRPC clients through the real API for a fixed time; runs pgbench on the
//! reference SQL of `crates/opjournal-bench/pgbench/` against the same Postgres in the same run; prints the
//! journal's figures as ratios to pgbench's, checks them against the targets and writes
//! everything to a JSON report. With `--high-clients N` (64 by default) the lifecycle, its
//! open loop and pgbench run again at N clients; with `--preload N` it repeats the run on a
//! journal holding N operations and shows the hot-path query plans there. See
//! docs/performance.md.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use clap::Parser;
use opjournal::children::Process;
use serde_json::{Value, json};
use sqlx::{Connection as _, Executor as _, PgConnection, PgPool};

mod burst;
mod calls;
mod cpu;
mod floor;
mod load;
mod reference;
mod scale;

use load::{Recorder, RunResult};

/// Benchmarks the journal's server against pgbench on the same Postgres.
#[derive(Debug, Parser)]
#[command(version)]
struct Args {
    /// Postgres to benchmark on, as a role that may create databases; the benchmark
    /// creates its own databases next to this one and drops them afterwards.
    #[arg(
        long,
        env = "DATABASE_URL",
        default_value = "postgres://postgres@127.0.0.1:5432/postgres"
    )]
    database_url: String,
    /// Concurrent clients (each with its own connection), for the journal and for pgbench.
    #[arg(long, default_value_t = 16)]
    clients: usize,
    /// A second client count: pgbench's scripts, the journal's lifecycle and its open loop
    /// run again with this many clients, on a new empty journal; 0 skips them. Postgres must
    /// allow this many connections and a few more (`max_connections`).
    #[arg(long, default_value_t = 64)]
    high_clients: usize,
    /// Measured seconds of each closed-loop and open-loop run.
    #[arg(long, default_value_t = 10.0)]
    duration: f64,
    /// Seconds of load before each measured window, not counted.
    #[arg(long, default_value_t = 2.0)]
    warmup: f64,
    /// The open loop's rate as a share of the lifecycle throughput just measured.
    #[arg(long, default_value_t = 0.5)]
    open_loop_share: f64,
    /// Unknown operations in the backlog the reconcile worker drains.
    #[arg(long, default_value_t = 2000)]
    backlog: usize,
    /// Then preload a journal with this many operations (realistic mix of statuses) and
    /// run again on it, with the query plans. 10000000 takes about 5 minutes and 16 GB of
    /// disk on a 2-core machine; `--database-url` must then be a superuser's (the load turns
    /// triggers off for its own session).
    #[arg(long, default_value_t = 0)]
    preload: i64,
    /// Operations deleted by each timed purge statement (a preloaded journal has half a
    /// percent of its operations past retention).
    #[arg(long, default_value_t = 1000)]
    purge_batch: i64,
    /// Database pool of the server in every run; default: one connection per client of the
    /// run (`--clients`, `--high-clients`).
    #[arg(long)]
    max_connections: Option<u32>,
    /// pgbench to run.
    #[arg(long, default_value = "pgbench")]
    pgbench: String,
    /// pgbench threads (`-j`); default: the number of CPUs.
    #[arg(long)]
    pgbench_threads: Option<usize>,
    /// Folder of the reference SQL (`schema.sql`, `minimal-lifecycle.sql`,
    /// `seed-lifecycle.sql`).
    #[arg(long, default_value_os_t = reference::default_dir())]
    reference_sql: PathBuf,
    /// Skip pgbench (ratios to it are then not reported).
    #[arg(long)]
    no_pgbench: bool,
    /// Skip the gRPC floor (`opjournal-grpc-floor`: the same lifecycles against a server of
    /// the same protocol answering from memory), and with it the server's CPU as a multiple
    /// of the floor's.
    #[arg(long)]
    no_floor: bool,
    /// Callers of the burst: each runs one lifecycle (Begin of a new key, then Complete),
    /// all released at one instant against a server with its default limits, on a journal of
    /// its own; 0 skips it.
    #[arg(long, default_value_t = 1000)]
    burst_callers: usize,
    /// HTTP/2 connections the burst's callers are spread over (at most the server's
    /// per-peer share of connections, 256).
    #[arg(long, default_value_t = 32)]
    burst_connections: usize,
    /// Where to write the JSON report.
    #[arg(long, default_value = "target/bench/report.json")]
    report: PathBuf,
    /// Keep the benchmark's databases and the processes' logs.
    #[arg(long)]
    keep: bool,
}

/// The targets of the journal's performance (numbered as `print_targets` shows them), as
/// ratios to a baseline measured in the same run wherever one exists.
///
/// 1. the server's CPU per lifecycle at most 2 × the gRPC floor's (`floor.rs`), at both client
///    counts; 2. Postgres's CPU per lifecycle at most 1.5 × pgbench minimal's at `--clients`
///    and 1.0 × at `--high-clients`; 3. lifecycles per second at least 0.5 × and 0.65 ×
///    pgbench minimal's there; 4. Begin p99 in the open loop at half the lifecycle rate under
///    10 ms at `--clients`; 5. the burst with 0 refused (`burst.rs`); 6. kept from before:
///    replay at least pgbench minimal's, the preloaded journal within 1.2 × of the empty one,
///    the server's peak RSS under 64 MiB.
const TARGET_POSTGRES_CPU_TO_MINIMAL: f64 = 1.5;
const TARGET_HIGH_POSTGRES_CPU_TO_MINIMAL: f64 = 1.0;
const TARGET_LIFECYCLE_TO_MINIMAL: f64 = 0.5;
const TARGET_HIGH_LIFECYCLE_TO_MINIMAL: f64 = 0.65;
const TARGET_BEGIN_P99_MS: f64 = 10.0;
const TARGET_REPLAY_TO_MINIMAL: f64 = 1.0;
const TARGET_SCALE_RATIO: f64 = 1.2;
const TARGET_RSS_MIB: f64 = 64.0;
/// Figures printed beside the targets, with the bounds earlier targets set for them.
const EARLIER_LIFECYCLE_TO_ARTICLE: f64 = 1.0;
const EARLIER_REPLAY_TO_LIFECYCLE: f64 = 2.0;

/// pgbench's scripts (in `--reference-sql`).
const MINIMAL: &str = "minimal-lifecycle.sql";
const ARTICLE: &str = "seed-lifecycle.sql";

/// Connections to Postgres a run needs besides its server's pool and pgbench's clients:
/// the benchmark's own pool on the journal (2), an administration connection (1), the
/// reference table's connection while pgbench runs (1), and the reconcile worker's pool
/// (`OPJOURNAL_DATABASE__MAX_CONNECTIONS`' default, 10) during the backlog.
const OTHER_CONNECTIONS: u32 = 2 + 1 + 1 + 10;

/// The server's default share of connections per peer address
/// (`max_grpc_connections_per_peer`): the burst's connections all come from one address, and
/// one more would push out another.
const MAX_CONNECTIONS_PER_PEER: usize = 256;

#[tokio::main]
async fn main() -> anyhow::Result<std::process::ExitCode> {
    let args = Args::parse();
    opjournal::app::install_crypto_provider();
    anyhow::ensure!(args.clients > 0, "--clients must be at least 1");
    anyhow::ensure!(
        args.high_clients != args.clients,
        "--high-clients must differ from --clients (0 skips the second client count)"
    );
    anyhow::ensure!(
        args.duration.is_finite() && args.duration >= 1.0,
        "--duration must be a number of seconds, at least 1"
    );
    anyhow::ensure!(
        args.warmup.is_finite() && args.warmup >= 0.0,
        "--warmup must be a number of seconds, 0 or more"
    );
    anyhow::ensure!(
        args.open_loop_share > 0.0 && args.open_loop_share <= 1.0,
        "--open-loop-share must be above 0 and at most 1"
    );
    anyhow::ensure!(args.backlog > 0, "--backlog must be at least 1");
    anyhow::ensure!(args.purge_batch > 0, "--purge-batch must be at least 1");
    anyhow::ensure!(
        (1..=MAX_CONNECTIONS_PER_PEER).contains(&args.burst_connections),
        "--burst-connections must be 1 to {MAX_CONNECTIONS_PER_PEER} (the server's \
         connections per peer address)"
    );
    let run_id = format!("r{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    let workdir = tempfile::Builder::new()
        .prefix("opjournal-bench-")
        .tempdir()
        .context("cannot create a working directory")?;
    let mut bench = Bench::new(args, run_id, workdir.path().to_owned());
    // Interrupted, the run is dropped: its child processes are killed with it, and its
    // databases are dropped below as after any run.
    let result = tokio::select! {
        result = bench.run() => result,
        signal = opjournal_signal::stop_signal() => {
            eprintln!("[bench] {signal}: stopping and cleaning up");
            Ok(std::process::ExitCode::from(130))
        }
    };
    bench.drop_databases().await;
    if bench.args.keep {
        eprintln!("[bench] logs kept in {}", workdir.keep().display());
    }
    result
}

/// The state of one benchmark run.
struct Bench {
    args: Args,
    run_id: String,
    dir: PathBuf,
    databases: Vec<String>,
    report: serde_json::Map<String, Value>,
}

/// A server (with its sandbox provider) on one journal database.
struct Stand {
    sandbox: Process,
    server: Process,
    sandbox_url: String,
    server_address: String,
    journal_url: String,
    policy: PathBuf,
    pool: PgPool,
}

impl Stand {
    async fn stop(mut self) {
        self.server.stop().await;
        self.sandbox.stop().await;
        self.pool.close().await;
    }
}

/// What one journal run measured.
struct JournalRun {
    lifecycle: RunResult,
    replay: RunResult,
    conflict: RunResult,
    open_loop: RunResult,
    reconcile: Value,
    rss: Value,
    /// Milliseconds of each timed purge statement (`--purge-batch` operations each).
    purge_ms: Vec<f64>,
    /// Checkpoints Postgres made during the scenarios (each one's writes slow commits).
    checkpoints: i64,
}

/// What the run at `--high-clients` measured, on a journal of its own.
struct HighRun {
    clients: usize,
    lifecycle: RunResult,
    open_loop: RunResult,
    rss: Value,
    checkpoints: i64,
}

impl HighRun {
    fn errors(&self) -> u64 {
        self.lifecycle.errors + self.open_loop.errors
    }

    fn to_json(&self) -> Value {
        let mut runs = BTreeMap::new();
        for result in [&self.lifecycle, &self.open_loop] {
            runs.insert(result.name.clone(), result.to_json());
        }
        json!({
            "clients": self.clients,
            "runs": runs,
            "server_memory": self.rss,
            "checkpoints_during_run": self.checkpoints,
        })
    }
}

impl JournalRun {
    fn errors(&self) -> u64 {
        self.lifecycle.errors + self.replay.errors + self.conflict.errors + self.open_loop.errors
    }
}

impl Bench {
    fn new(args: Args, run_id: String, dir: PathBuf) -> Self {
        Self {
            args,
            run_id,
            dir,
            databases: Vec::new(),
            report: serde_json::Map::new(),
        }
    }

    async fn run(&mut self) -> anyhow::Result<std::process::ExitCode> {
        let started = Instant::now();
        let machine = self.machine().await?;
        print_header(&self.args, &machine);
        self.report.insert("machine".into(), machine);
        self.report.insert(
            "settings".into(),
            json!({
                "clients": self.args.clients,
                "high_clients": self.args.high_clients,
                "duration_seconds": self.args.duration,
                "warmup_seconds": self.args.warmup,
                "open_loop_share": self.args.open_loop_share,
                "backlog": self.args.backlog,
                "preload": self.args.preload,
                "server_max_connections": self.max_connections(self.args.clients),
                "server_max_connections_high": (self.args.high_clients > 0)
                    .then(|| self.max_connections(self.args.high_clients)),
                "grpc_floor": !self.args.no_floor,
                "burst_callers": self.args.burst_callers,
                "burst_connections": self.args.burst_connections,
            }),
        );

        // Each client count's pgbench runs just before the journal's at the same count, so
        // both sides of a ratio are measured within the same few minutes.
        let reference_url = if self.args.no_pgbench {
            None
        } else {
            Some(self.create_database("ref").await?)
        };
        let mut references = self
            .references(reference_url.as_deref(), self.args.clients)
            .await?;
        let empty = self.journal_run("empty").await?;
        // Each floor run comes right after the journal's at the same client count.
        let mut floors = Vec::new();
        floors.extend(self.floor_run(self.args.clients).await?);
        let high = if self.args.high_clients > 0 {
            references.extend(
                self.references(reference_url.as_deref(), self.args.high_clients)
                    .await?,
            );
            let high = self.high_run("high").await?;
            floors.extend(self.floor_run(self.args.high_clients).await?);
            Some(high)
        } else {
            None
        };
        let burst = self.burst_run().await?;
        self.report.insert(
            "pgbench".into(),
            Value::Array(
                references
                    .iter()
                    .map(reference::Reference::to_json)
                    .collect(),
            ),
        );
        let scaled = if self.args.preload > 0 {
            Some(self.scale_run().await?)
        } else {
            None
        };

        let mut targets = targets(
            &self.args,
            &references,
            &empty,
            high.as_ref(),
            scaled.as_ref().map(|s| &s.0),
            &floors,
        );
        targets.push(burst::target(self.args.burst_callers, burst.as_ref()));
        // Target 1 to 6 in order, then the figures with earlier bounds; stable within each.
        targets.sort_by_key(|t| t.number.unwrap_or(u8::MAX));
        print_results(
            self.args.clients,
            &references,
            &empty,
            high.as_ref(),
            scaled.as_ref().map(|s| &s.0),
            &floors,
        );
        if let Some(burst) = &burst {
            burst::print(burst);
            println!();
        }
        print_targets(&targets);
        self.report.insert("empty".into(), journal_json(&empty));
        if let Some(high) = &high {
            self.report.insert("high_clients".into(), high.to_json());
        }
        self.report.insert(
            "grpc_floor".into(),
            floor::report(
                &floors,
                (self.args.clients, &empty.lifecycle),
                high.as_ref().map(|h| &h.lifecycle),
            ),
        );
        if let Some((run, extra)) = &scaled {
            let mut value = journal_json(run);
            if let (Some(map), Value::Object(extra)) = (value.as_object_mut(), extra) {
                map.extend(extra.clone());
            }
            self.report.insert("preloaded".into(), value);
            if let Some(plans) = extra.get("plans") {
                print_plans(plans);
            }
        }
        self.report.insert(
            "targets".into(),
            Value::Array(targets.iter().map(Target::to_json).collect()),
        );
        self.report.insert(
            "total_seconds".into(),
            json!(started.elapsed().as_secs_f64()),
        );
        if let Some(parent) = self.args.report.parent() {
            std::fs::create_dir_all(parent).ok();
        }
        std::fs::write(
            &self.args.report,
            serde_json::to_string_pretty(&Value::Object(self.report.clone()))?,
        )
        .with_context(|| format!("cannot write {}", self.args.report.display()))?;
        println!("\nReport: {}", self.args.report.display());

        let errors = empty.errors()
            + floors.iter().map(|f| f.lifecycle.errors).sum::<u64>()
            + high.as_ref().map_or(0, HighRun::errors)
            + burst.as_ref().map_or(0, burst::BurstRun::errors_total)
            + scaled.as_ref().map_or(0, |s| s.0.errors());
        if errors > 0 {
            println!("FAILED: {errors} calls got an answer other than the one promised");
            return Ok(std::process::ExitCode::FAILURE);
        }
        Ok(std::process::ExitCode::SUCCESS)
    }

    /// pgbench's scripts at `clients` on the reference database `url`; none without it
    /// (`--no-pgbench`).
    async fn references(
        &self,
        url: Option<&str>,
        clients: usize,
    ) -> anyhow::Result<Vec<reference::Reference>> {
        let Some(url) = url else {
            return Ok(Vec::new());
        };
        eprintln!("[bench] pgbench on the reference SQL, {clients} clients");
        reference::run(
            &self.args.pgbench,
            &self.args.reference_sql,
            url,
            clients,
            self.args
                .pgbench_threads
                .unwrap_or_else(|| std::thread::available_parallelism().map_or(2, |n| n.get())),
            Duration::from_secs_f64(self.args.warmup),
            Duration::from_secs_f64(self.args.duration),
        )
        .await
    }

    /// The gRPC floor's lifecycle run at `clients` (see [`floor`]), unless `--no-floor`.
    async fn floor_run(&self, clients: usize) -> anyhow::Result<Option<floor::FloorRun>> {
        if self.args.no_floor {
            return Ok(None);
        }
        floor::run(
            clients,
            Duration::from_secs_f64(self.args.warmup),
            Duration::from_secs_f64(self.args.duration),
            &self.run_id,
            &self.dir,
        )
        .await
        .map(Some)
    }

    /// The server's database pool for a run of `clients` clients.
    fn max_connections(&self, clients: usize) -> u32 {
        self.args
            .max_connections
            .unwrap_or_else(|| u32::try_from(clients).unwrap_or(u32::MAX))
    }

    /// Connections to Postgres the largest run needs at once: its server's pool or
    /// pgbench's clients, whichever is more, and the others of [`OTHER_CONNECTIONS`].
    fn connections_needed(&self) -> u32 {
        let clients = self.args.clients.max(self.args.high_clients);
        let pool = self
            .max_connections(self.args.clients)
            .max(if self.args.high_clients > 0 {
                self.max_connections(self.args.high_clients)
            } else {
                0
            });
        pool.max(u32::try_from(clients).unwrap_or(u32::MAX))
            .saturating_add(OTHER_CONNECTIONS)
    }

    /// The machine and Postgres the figures were taken on.
    async fn machine(&self) -> anyhow::Result<Value> {
        let mut admin = PgConnection::connect(&self.args.database_url)
            .await
            .context("cannot connect to Postgres (--database-url)")?;
        let version: String = sqlx::query_scalar("SHOW server_version")
            .fetch_one(&mut admin)
            .await?;
        let synchronous_commit: String = sqlx::query_scalar("SHOW synchronous_commit")
            .fetch_one(&mut admin)
            .await?;
        let shared_buffers: String = sqlx::query_scalar("SHOW shared_buffers")
            .fetch_one(&mut admin)
            .await?;
        let (max_connections, reserved, in_use): (i32, i32, i64) = sqlx::query_as(
            "SELECT current_setting('max_connections')::int, \
                    current_setting('superuser_reserved_connections')::int, \
                    (SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend')",
        )
        .fetch_one(&mut admin)
        .await?;
        admin.close().await.ok();
        let needed = i64::from(self.connections_needed());
        let allowed = i64::from(max_connections) - i64::from(reserved);
        if needed > allowed {
            bail!(
                "Postgres allows {max_connections} connections, {reserved} of them reserved for \
                 superusers; the run at {} clients needs about {needed} at once (its server's \
                 pool or pgbench's clients, and {OTHER_CONNECTIONS} more): raise \
                 max_connections to {} or more (ALTER SYSTEM SET max_connections, then restart \
                 Postgres), or lower --high-clients (0 skips the second client count)",
                self.args.clients.max(self.args.high_clients),
                needed + i64::from(reserved),
            );
        }
        // `in_use` counts this benchmark's own connection, closed since.
        let others = in_use - 1;
        if needed > allowed - others {
            eprintln!(
                "[bench] warning: Postgres allows {allowed} connections outside the superuser \
                 reserve, {others} are in use by others, and the largest run needs about \
                 {needed}: it fails with \"too many clients\" unless they close"
            );
        }
        let cpu = std::fs::read_to_string("/proc/cpuinfo")
            .ok()
            .and_then(|info| {
                info.lines()
                    .find(|l| l.starts_with("model name"))
                    .and_then(|l| l.split_once(':'))
                    .map(|(_, v)| v.trim().to_owned())
            })
            .unwrap_or_default();
        Ok(json!({
            "cpus": std::thread::available_parallelism().map_or(0, |n| n.get()),
            "cpu": cpu,
            "postgres": version,
            "synchronous_commit": synchronous_commit,
            "shared_buffers": shared_buffers,
            "max_connections": max_connections,
            "connections_in_use_at_start": in_use,
            "connections_needed": needed,
            "load_average_at_start": std::fs::read_to_string("/proc/loadavg")
                .unwrap_or_default().trim(),
        }))
    }

    /// Creates a database of this run next to `--database-url`'s; returns its URL.
    async fn create_database(&mut self, suffix: &str) -> anyhow::Result<String> {
        let name = format!("opjournal_bench_{}_{suffix}", self.run_id);
        let mut admin = PgConnection::connect(&self.args.database_url).await?;
        admin
            .execute(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
            .await
            .with_context(|| format!("cannot create database {name}"))?;
        admin.close().await.ok();
        self.databases.push(name.clone());
        let mut url = reqwest::Url::parse(&self.args.database_url)?;
        url.set_path(&format!("/{name}"));
        Ok(url.to_string())
    }

    async fn drop_databases(&mut self) {
        if self.args.keep || self.databases.is_empty() {
            if !self.databases.is_empty() {
                eprintln!("[bench] databases kept: {}", self.databases.join(", "));
            }
            return;
        }
        let Ok(mut admin) = PgConnection::connect(&self.args.database_url).await else {
            eprintln!(
                "[bench] cannot connect to drop {}",
                self.databases.join(", ")
            );
            return;
        };
        for name in self.databases.drain(..) {
            let sql = format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)");
            if let Err(error) = admin.execute(sqlx::AssertSqlSafe(sql)).await {
                eprintln!("[bench] cannot drop {name}: {error}");
            }
        }
        admin.close().await.ok();
    }

    /// Starts the sandbox provider and a server on a new journal database, with a database
    /// pool of `max_connections` (`None`: the server's default).
    async fn start_stand(
        &mut self,
        label: &str,
        max_connections: Option<u32>,
    ) -> anyhow::Result<Stand> {
        let journal_url = self.create_database(label).await?;
        let dir = self.dir.join(label);
        std::fs::create_dir_all(&dir)?;
        let (sandbox, sandbox_address) = Process::start(
            "opjournal-sandbox",
            &["--listen", "127.0.0.1:0"],
            &[("RUST_LOG", "warn")],
            "listening on http://",
            &dir,
        )
        .await?;
        let sandbox_url = format!("http://{sandbox_address}");
        let policy = dir.join("policy.yaml");
        std::fs::write(
            &policy,
            opjournal::children::payments_policy_yaml(&sandbox_url, "opjournal-bench"),
        )?;
        let max_connections = max_connections.map(|n| n.to_string());
        let policy_arg = policy.display().to_string();
        let mut env = vec![("RUST_LOG", "warn")];
        if let Some(max_connections) = &max_connections {
            env.push((
                "OPJOURNAL_DATABASE__MAX_CONNECTIONS",
                max_connections.as_str(),
            ));
        }
        let (server, server_address) = Process::start(
            "opjournal",
            &[
                "serve",
                "--listen",
                "127.0.0.1:0",
                "--metrics-listen",
                "127.0.0.1:0",
                "--database-url",
                &journal_url,
                "--policy",
                &policy_arg,
                "--migrate",
            ],
            &env,
            "listening on ",
            &dir,
        )
        .await?;
        let pool = sqlx::postgres::PgPoolOptions::new()
            .max_connections(2)
            .connect(&journal_url)
            .await?;
        Ok(Stand {
            sandbox,
            server,
            sandbox_url,
            server_address,
            journal_url,
            policy,
            pool,
        })
    }

    /// Every journal scenario on a new, empty journal.
    async fn journal_run(&mut self, label: &str) -> anyhow::Result<JournalRun> {
        let stand = self
            .start_stand(label, Some(self.max_connections(self.args.clients)))
            .await?;
        let run = self.scenarios(&stand, label).await;
        let run = match run {
            Ok(mut run) => {
                // The baseline of the purge at scale: the same statement on this small journal.
                let timed = async {
                    scale::make_purge_due(&stand.pool, 3 * self.args.purge_batch).await?;
                    scale::time_purge(&stand.pool, self.args.purge_batch, 3).await
                };
                run.purge_ms = timed.await?;
                Ok(run)
            }
            Err(error) => Err(error),
        };
        stand.stop().await;
        run
    }

    /// The lifecycle and its open loop at `--high-clients`, on a new, empty journal whose
    /// server's pool has one connection per client (or `--max-connections`).
    async fn high_run(&mut self, label: &str) -> anyhow::Result<HighRun> {
        let clients = self.args.high_clients;
        let stand = self
            .start_stand(label, Some(self.max_connections(clients)))
            .await?;
        let run = async {
            let channels = load::connect_all(&stand.server_address, clients).await?;
            let run: Arc<str> = format!("{}{label}", self.run_id).into();
            let checkpoints_at_start = self.prepare(&stand, &channels, &run, label).await?;
            let lifecycle = self.lifecycle(&stand, &channels, &run, label).await;
            let open_loop = self.open_loop(&channels, &run, label, &lifecycle).await;
            Ok::<_, anyhow::Error>(HighRun {
                clients,
                lifecycle,
                open_loop,
                rss: rss(stand.server.id()),
                checkpoints: checkpoints(&stand.pool).await - checkpoints_at_start,
            })
        }
        .await;
        stand.stop().await;
        run
    }

    /// The burst (see [`burst`]) on a new journal whose server keeps every default setting
    /// (its limits and its database pool), after the same first batch and `ANALYZE` as the
    /// other runs, its figures added to the report; none with `--burst-callers 0`.
    async fn burst_run(&mut self) -> anyhow::Result<Option<burst::BurstRun>> {
        let callers = self.args.burst_callers;
        if callers == 0 {
            return Ok(None);
        }
        let label = "burst";
        let stand = self.start_stand(label, None).await?;
        let run = async {
            let connections = self.args.burst_connections.min(callers);
            let channels = load::connect_all(&stand.server_address, connections).await?;
            let run: Arc<str> = format!("{}{label}", self.run_id).into();
            self.prepare(&stand, &channels, &run, label).await?;
            eprintln!("[bench] {label}: {callers} callers over {connections} connections");
            let mut burst = burst::run(&channels, callers, &run).await;
            burst.rss = rss(stand.server.id());
            Ok::<_, anyhow::Error>(burst)
        }
        .await;
        stand.stop().await;
        let burst = run?;
        self.report.insert("burst".into(), burst.to_json());
        Ok(Some(burst))
    }

    /// Starts a journal's runs: a checkpoint, then a first batch of operations and
    /// `ANALYZE`. Returns the cluster's checkpoint count once checkpointed.
    async fn prepare(
        &self,
        stand: &Stand,
        channels: &[tonic::transport::Channel],
        run: &Arc<str>,
        label: &str,
    ) -> anyhow::Result<i64> {
        // Each run starts from a checkpoint, as pgbench's runs do (when the role may).
        checkpoint(&stand.pool).await;
        let checkpoints_at_start = checkpoints(&stand.pool).await;

        // A journal's first operations are planned without statistics: Postgres cannot tell
        // the primary key from the other indexes that lead with the namespace, and key
        // lookups may walk the whole namespace until autovacuum analyzes the table, within
        // its first minute. The benchmark measures the steady state: it registers a first
        // batch, then analyzes, as autovacuum would have.
        eprintln!("[bench] {label}: first operations, then ANALYZE");
        load::closed_loop(
            "prime",
            channels,
            Duration::ZERO,
            Duration::from_secs_f64(self.args.warmup).max(Duration::from_secs(1)),
            new_key_lifecycles(run.clone(), "p"),
        )
        .await;
        stand
            .pool
            .execute("ANALYZE agent_operations, operation_events")
            .await?;
        Ok(checkpoints_at_start)
    }

    /// The closed loop of lifecycles (Begin of a new key, then Complete) from every client
    /// of `channels`, with the CPU it cost.
    async fn lifecycle(
        &self,
        stand: &Stand,
        channels: &[tonic::transport::Channel],
        run: &Arc<str>,
        label: &str,
    ) -> RunResult {
        eprintln!("[bench] {label}: lifecycle, {} clients", channels.len());
        let server_pid = stand.server.id();
        let before = cpu::Snapshot::take(server_pid);
        let mut lifecycle = load::closed_loop(
            "lifecycle",
            channels,
            Duration::from_secs_f64(self.args.warmup),
            Duration::from_secs_f64(self.args.duration),
            new_key_lifecycles(run.clone(), "l"),
        )
        .await;
        lifecycle.cpu = Some(before.since(&cpu::Snapshot::take(server_pid), lifecycle.all_calls));
        lifecycle
    }

    /// Lifecycles sent on a fixed schedule at `--open-loop-share` of `lifecycle`'s
    /// throughput, spread over `channels`.
    async fn open_loop(
        &self,
        channels: &[tonic::transport::Channel],
        run: &Arc<str>,
        label: &str,
        lifecycle: &RunResult,
    ) -> RunResult {
        let rate = (lifecycle.throughput() * self.args.open_loop_share).max(1.0);
        eprintln!(
            "[bench] {label}: open loop at {rate:.0} lifecycles/s over {} clients",
            channels.len()
        );
        let run = run.clone();
        load::open_loop(
            "open_loop",
            channels,
            rate,
            Duration::from_secs_f64(self.args.warmup),
            Duration::from_secs_f64(self.args.duration),
            4096,
            move |channel, n, intended, recorder: Recorder| {
                let key = calls::key(&run, "o", 0, n);
                async move {
                    calls::lifecycle(channel, "", key, calls::payload(n, 0), intended, recorder)
                        .await
                }
            },
        )
        .await
    }

    /// The scenarios, in order, on a running stand.
    async fn scenarios(&self, stand: &Stand, label: &str) -> anyhow::Result<JournalRun> {
        let args = &self.args;
        let warmup = Duration::from_secs_f64(args.warmup);
        let duration = Duration::from_secs_f64(args.duration);
        let channels = load::connect_all(&stand.server_address, args.clients).await?;
        let run: Arc<str> = format!("{}{label}", self.run_id).into();
        let checkpoints_at_start = self.prepare(stand, &channels, &run, label).await?;
        let server_pid = stand.server.id();
        let lifecycle = self.lifecycle(stand, &channels, &run, label).await;
        // Every key the lifecycle run completed, per client, for replays and conflicts.
        let completed_per_client = {
            let rows: Vec<(String,)> = sqlx::query_as(
                "SELECT operation_key FROM agent_operations \
                 WHERE operation_key LIKE $1 AND status = 'succeeded' LIMIT 200000",
            )
            .bind(format!("bench:{run}:l:%"))
            .fetch_all(&stand.pool)
            .await?;
            let keys: Vec<(String, u64)> = rows
                .into_iter()
                .filter_map(|(key,)| {
                    let n = key.rsplit_once('n')?.1.parse().ok()?;
                    Some((key, n))
                })
                .collect();
            anyhow::ensure!(!keys.is_empty(), "the lifecycle run completed no operation");
            Arc::new(keys)
        };

        eprintln!("[bench] {label}: replay");
        let before = cpu::Snapshot::take(server_pid);
        let mut replay = {
            let keys = completed_per_client.clone();
            load::closed_loop(
                "replay",
                &channels,
                warmup,
                duration,
                move |channel, client, n, recorder: Recorder| {
                    let (key, sequence) = pick(&keys, client, n);
                    async move {
                        calls::replay(channel, "", key, calls::payload(sequence, 0), recorder).await
                    }
                },
            )
            .await
        };

        replay.cpu = Some(before.since(&cpu::Snapshot::take(server_pid), replay.all_calls));

        eprintln!("[bench] {label}: conflict");
        let conflict = {
            let keys = completed_per_client.clone();
            load::closed_loop(
                "conflict",
                &channels,
                warmup,
                duration,
                move |channel, client, n, recorder: Recorder| {
                    let (key, sequence) = pick(&keys, client, n);
                    async move {
                        calls::conflict(channel, "", key, calls::payload(sequence, 1), recorder)
                            .await
                    }
                },
            )
            .await
        };

        let open_loop = self.open_loop(&channels, &run, label, &lifecycle).await;

        eprintln!("[bench] {label}: reconcile backlog of {}", args.backlog);
        let reconcile = self.reconcile(stand, &channels, &run).await?;
        let rss = rss(stand.server.id());
        let checkpoints = checkpoints(&stand.pool).await - checkpoints_at_start;
        Ok(JournalRun {
            lifecycle,
            replay,
            conflict,
            open_loop,
            reconcile,
            rss,
            purge_ms: Vec::new(),
            checkpoints,
        })
    }

    /// Makes `--backlog` unknown operations whose effect exists at the provider, then starts
    /// the reconcile worker and times until every one is settled; checks each ended
    /// succeeded and the provider holds exactly one effect per operation.
    async fn reconcile(
        &self,
        stand: &Stand,
        channels: &[tonic::transport::Channel],
        run: &str,
    ) -> anyhow::Result<Value> {
        let namespace = format!("backlog-{run}");
        let http = reqwest::Client::new();
        let made = Instant::now();
        let mut tasks = futures::stream::FuturesUnordered::new();
        let backlog = self.args.backlog;
        for n in 0..backlog {
            let channel = channels[n % channels.len()].clone();
            let http = http.clone();
            let sandbox_url = stand.sandbox_url.clone();
            let namespace = namespace.clone();
            let key = calls::key(run, "u", 0, n as u64);
            tasks.push(async move {
                calls::unknown_after_effect(
                    channel,
                    &http,
                    &sandbox_url,
                    &namespace,
                    key,
                    calls::payload(n as u64, 0),
                )
                .await
            });
            if tasks.len() >= channels.len() {
                use futures::StreamExt as _;
                if let Some(result) = tasks.next().await {
                    result.context("cannot build the backlog")?;
                }
            }
        }
        {
            use futures::StreamExt as _;
            while let Some(result) = tasks.next().await {
                result.context("cannot build the backlog")?;
            }
        }
        let built_in = made.elapsed().as_secs_f64();
        let unknown = || async {
            sqlx::query_scalar::<_, i64>(
                "SELECT count(*) FROM agent_operations WHERE namespace = $1 AND status = 'unknown'",
            )
            .bind(&namespace)
            .fetch_one(&stand.pool)
            .await
        };
        anyhow::ensure!(
            unknown().await? == i64::try_from(backlog)?,
            "the backlog is not all unknown"
        );

        let dir = self.dir.join(format!("worker-{run}"));
        std::fs::create_dir_all(&dir)?;
        let policy = stand.policy.display().to_string();
        let started = Instant::now();
        let mut worker = Process::start(
            "opjournal-reconciler",
            &[
                "--health-listen",
                "127.0.0.1:0",
                "--metrics-listen",
                "127.0.0.1:0",
                "--database-url",
                &stand.journal_url,
                "--policy",
                &policy,
            ],
            &[
                ("RUST_LOG", "warn"),
                ("OPJOURNAL_RECONCILE__POLL_INTERVAL", "0.1"),
                // The preloaded journal's purge is timed separately.
                ("OPJOURNAL_RECONCILE__PURGE_INTERVAL", "86400"),
            ],
            "health on ",
            &dir,
        )
        .await?
        .0;
        let deadline = Instant::now() + Duration::from_secs(600);
        let remaining = loop {
            let left = unknown().await?;
            if left == 0 || Instant::now() > deadline {
                break left;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        let elapsed = started.elapsed().as_secs_f64();
        worker.stop().await;
        let succeeded: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM agent_operations WHERE namespace = $1 AND status = 'succeeded'",
        )
        .bind(&namespace)
        .fetch_one(&stand.pool)
        .await?;
        let stats: Value = http
            .get(format!("{}/v1/stats", stand.sandbox_url))
            .send()
            .await?
            .json()
            .await
            .unwrap_or(Value::Null);
        if remaining > 0 {
            bail!("the reconcile worker left {remaining} of {backlog} unknown after 600 s");
        }
        anyhow::ensure!(
            succeeded == i64::try_from(backlog)?,
            "{succeeded} of {backlog} reconciled operations ended succeeded"
        );
        // Reconciling looks effects up; it must never make one.
        anyhow::ensure!(
            stats["effects"].as_u64() == Some(u64::try_from(backlog)?),
            "the provider holds {} effects for {backlog} operations",
            stats["effects"]
        );
        Ok(json!({
            "operations": backlog,
            "built_seconds": built_in,
            "drained_seconds": elapsed,
            "throughput_per_second": backlog as f64 / elapsed,
            "succeeded": succeeded,
            "provider_stats": stats,
        }))
    }

    /// Preloads a new journal, then runs every scenario on it, times the purge and takes the
    /// query plans.
    async fn scale_run(&mut self) -> anyhow::Result<(JournalRun, Value)> {
        let label = "scaled";
        let stand = self
            .start_stand(label, Some(self.max_connections(self.args.clients)))
            .await?;
        // One real registration, whose recorded action policy the preload copies.
        let channels = load::connect_all(&stand.server_address, 1).await?;
        let (outcome, _) = calls::lifecycle(
            channels[0].clone(),
            "",
            calls::key(&self.run_id, "seed", 0, 0),
            calls::payload(0, 0),
            Instant::now(),
            Recorder::default(),
        )
        .await;
        outcome.map_err(anyhow::Error::msg)?;
        eprintln!("[bench] preloading {} operations", self.args.preload);
        let loaded_in = scale::preload(&stand.journal_url, self.args.preload).await?;
        let (rows, bytes) = scale::journal_size(&stand.pool).await?;
        eprintln!(
            "[bench] preloaded in {:.0} s: {rows} operations, {:.1} GiB",
            loaded_in.as_secs_f64(),
            bytes as f64 / f64::from(1u32 << 30)
        );
        let purge_ms = scale::time_purge(&stand.pool, self.args.purge_batch, 3).await?;
        let purged = scale::purge_all(&stand.pool, 1000).await?;
        eprintln!("[bench] purged the other {purged} operations past retention");
        // The load leaves gigabytes for the kernel to write back; measuring while it does
        // would time the disk, not the journal.
        checkpoint(&stand.pool).await;
        let synced = tokio::process::Command::new("sync").status().await;
        if !synced.is_ok_and(|status| status.success()) {
            eprintln!("[bench] sync failed; figures may include the load's write-back");
        }
        let plans = scale::plans(&stand.journal_url).await?;
        let run = self.scenarios(&stand, label).await;
        stand.stop().await;
        let mut run = run?;
        run.purge_ms = purge_ms.clone();
        Ok((
            run,
            json!({
                "operations": rows,
                "bytes": bytes,
                "preload_seconds": loaded_in.as_secs_f64(),
                "purge_batch_ms": purge_ms,
                "mix_per_mille": scale::MIX_PER_MILLE
                    .iter()
                    .map(|(s, n)| (s.to_string(), json!(n)))
                    .collect::<serde_json::Map<_, _>>(),
                "plans": scale::plans_json(&plans),
            }),
        ))
    }
}

/// Asks Postgres for a checkpoint; a role without `pg_checkpoint` goes without, said once
/// per run.
async fn checkpoint(pool: &PgPool) {
    if let Err(error) = pool.execute("CHECKPOINT").await {
        eprintln!("[bench] no checkpoint before the run ({error}); figures may include one");
    }
}

/// Checkpoints the whole Postgres cluster has made since its statistics were reset (0 if
/// unreadable): other databases' load counts too.
async fn checkpoints(pool: &PgPool) -> i64 {
    sqlx::query_scalar("SELECT checkpoints_timed + checkpoints_req FROM pg_stat_bgwriter")
        .fetch_one(pool)
        .await
        .unwrap_or(0)
}

/// The unit of a closed-loop lifecycle run: Begin of a new key (tagged `tag` within `run`),
/// then Complete.
fn new_key_lifecycles(
    run: Arc<str>,
    tag: &'static str,
) -> impl Fn(
    tonic::transport::Channel,
    usize,
    u64,
    Recorder,
) -> futures::future::BoxFuture<'static, (load::CallOutcome, Recorder)>
+ Send
+ Sync
+ Clone
+ 'static {
    move |channel, client, n, recorder| {
        let key = calls::key(&run, tag, client, n);
        Box::pin(calls::lifecycle(
            channel,
            "",
            key,
            calls::payload(n, 0),
            Instant::now(),
            recorder,
        ))
    }
}

/// Key number `n` of a client's turn through the completed keys (spread over all of them).
fn pick(keys: &[(String, u64)], client: usize, n: u64) -> (String, u64) {
    let index = (client as u64)
        .wrapping_mul(7919)
        .wrapping_add(n.wrapping_mul(104_729))
        % keys.len() as u64;
    keys[usize::try_from(index).unwrap_or(0)].clone()
}

/// The server's resident memory from /proc: now and its peak (`VmHWM`), in MiB.
fn rss(pid: Option<u32>) -> Value {
    let Some(status) =
        pid.and_then(|pid| std::fs::read_to_string(format!("/proc/{pid}/status")).ok())
    else {
        return Value::Null;
    };
    let field = |name: &str| {
        status.lines().find_map(|line| {
            line.strip_prefix(name)
                .and_then(|rest| rest.split_whitespace().next())
                .and_then(|kib| kib.parse::<f64>().ok())
                .map(|kib| kib / 1024.0)
        })
    };
    json!({ "rss_mib": field("VmRSS:"), "peak_rss_mib": field("VmHWM:") })
}

/// One target: the figure, the bound and whether it holds.
struct Target {
    /// The number of the performance target it checks (1 to 6), or none for one outside
    /// them (kept from the targets before them, or the gRPC floor's).
    number: Option<u8>,
    name: String,
    value: Option<f64>,
    bound: &'static str,
    met: Option<bool>,
}

impl Target {
    /// A target whose `value`, when measured, `holds` or not.
    fn new(
        number: Option<u8>,
        name: String,
        value: Option<f64>,
        bound: &'static str,
        holds: impl Fn(f64) -> bool,
    ) -> Self {
        Self {
            number,
            name,
            value,
            bound,
            met: value.map(holds),
        }
    }

    fn to_json(&self) -> Value {
        json!({
            "number": self.number,
            "target": self.name,
            "value": self.value,
            "bound": self.bound,
            "met": self.met,
        })
    }
}

/// pgbench's figures of `script` at `clients`, if it ran.
fn reference<'a>(
    references: &'a [reference::Reference],
    script: &str,
    clients: usize,
) -> Option<&'a reference::Reference> {
    references
        .iter()
        .find(|r| r.script == script && r.clients == clients)
}

/// Postgres's CPU milliseconds per operation in a run's CPU figures, if measured.
fn postgres_ms(cpu: Option<&Value>) -> Option<f64> {
    cpu.and_then(|cpu| cpu["postgres_ms_per_op"].as_f64())
        .filter(|ms| *ms > 0.0)
}

/// Every target, measured on the runs of this benchmark (`None` where a run was skipped).
fn targets(
    args: &Args,
    references: &[reference::Reference],
    empty: &JournalRun,
    high: Option<&HighRun>,
    scaled: Option<&JournalRun>,
    floors: &[floor::FloorRun],
) -> Vec<Target> {
    let (clients, high_clients) = (args.clients, args.high_clients);
    let tps = |script: &str, clients: usize| {
        reference(references, script, clients)
            .map(|r| r.tps)
            .filter(|tps| *tps > 0.0)
    };
    let lifecycle = empty.lifecycle.throughput();
    let to_minimal = tps(MINIMAL, clients).map(|b| lifecycle / b);
    let to_article = tps(ARTICLE, clients).map(|b| lifecycle / b);
    let high_to_minimal =
        high.and_then(|h| tps(MINIMAL, high_clients).map(|b| h.lifecycle.throughput() / b));
    // Calls an open loop could not send are not in its latencies: with any, the server did
    // not keep up with half its rate and the target is not met whatever the p99 says.
    let high_p99 = high.and_then(|h| h.open_loop.percentile_ms("begin", 0.99));
    let high_kept_up = high.is_some_and(|h| h.open_loop.dropped == 0);
    let cpu_to_minimal = |run: &RunResult, clients: usize| {
        let journal = postgres_ms(run.cpu.as_ref())?;
        postgres_ms(reference(references, MINIMAL, clients).and_then(|r| r.cpu.as_ref()))
            .map(|minimal| journal / minimal)
    };
    let low_cpu = cpu_to_minimal(&empty.lifecycle, clients);
    let high_cpu = high.and_then(|h| cpu_to_minimal(&h.lifecycle, high_clients));
    let replay_to_minimal = tps(MINIMAL, clients).map(|b| empty.replay.throughput() / b);
    let replay_to_lifecycle = (lifecycle > 0.0).then(|| empty.replay.throughput() / lifecycle);
    let begin_p99 = empty.open_loop.percentile_ms("begin", 0.99);
    let kept_up = empty.open_loop.dropped == 0;
    let scale_throughput = scaled.and_then(|s| {
        let loaded = s.lifecycle.throughput();
        (loaded > 0.0).then(|| lifecycle / loaded)
    });
    let scale_p99 = scaled.and_then(|s| {
        let loaded = s.open_loop.percentile_ms("begin", 0.99)?;
        Some(loaded / begin_p99?)
    });
    let scale_kept_up = scaled.is_some_and(|s| s.open_loop.dropped == 0);
    let peak = |rss: &Value| rss.get("peak_rss_mib").and_then(Value::as_f64);
    let rss = [
        peak(&empty.rss),
        high.and_then(|h| peak(&h.rss)),
        scaled.and_then(|s| peak(&s.rss)),
    ]
    .into_iter()
    .flatten()
    .reduce(f64::max);
    let mut targets = floor::targets(
        floors,
        (clients, &empty.lifecycle),
        (high_clients, high.map(|h| &h.lifecycle)),
    );
    targets.extend([
        Target::new(
            Some(2),
            format!("Postgres CPU per lifecycle / minimal txn's, {clients} clients"),
            low_cpu,
            "<= 1.5",
            |v| v <= TARGET_POSTGRES_CPU_TO_MINIMAL,
        ),
        Target::new(
            Some(2),
            format!("Postgres CPU per lifecycle / minimal txn's, {high_clients} clients"),
            high_cpu,
            "<= 1",
            |v| v <= TARGET_HIGH_POSTGRES_CPU_TO_MINIMAL,
        ),
        Target::new(
            Some(3),
            format!("lifecycle / pgbench minimal, {clients} clients"),
            to_minimal,
            ">= 0.5",
            |v| v >= TARGET_LIFECYCLE_TO_MINIMAL,
        ),
        Target::new(
            Some(3),
            format!("lifecycle / pgbench minimal, {high_clients} clients"),
            high_to_minimal,
            ">= 0.65",
            |v| v >= TARGET_HIGH_LIFECYCLE_TO_MINIMAL,
        ),
        Target::new(
            Some(4),
            format!("Begin p99 at half the lifecycle rate, {clients} clients, ms"),
            begin_p99,
            "< 10",
            |v| kept_up && v < TARGET_BEGIN_P99_MS,
        ),
        Target::new(
            Some(6),
            format!("replay / pgbench minimal, {clients} clients"),
            replay_to_minimal,
            ">= 1",
            |v| v >= TARGET_REPLAY_TO_MINIMAL,
        ),
        Target::new(
            Some(6),
            "lifecycle throughput empty / preloaded".to_owned(),
            scale_throughput,
            "<= 1.2",
            |v| v <= TARGET_SCALE_RATIO,
        ),
        Target::new(
            Some(6),
            "Begin p99 preloaded / empty".to_owned(),
            scale_p99,
            "<= 1.2",
            |v| scale_kept_up && v <= TARGET_SCALE_RATIO,
        ),
        Target::new(
            Some(6),
            "server peak RSS over every run, MiB".to_owned(),
            rss,
            "< 64",
            |v| v < TARGET_RSS_MIB,
        ),
        Target::new(
            None,
            format!("lifecycle / pgbench article SQL, {clients} clients"),
            to_article,
            "> 1",
            |v| v > EARLIER_LIFECYCLE_TO_ARTICLE,
        ),
        Target::new(
            None,
            "replay / lifecycle".to_owned(),
            replay_to_lifecycle,
            ">= 2",
            |v| v >= EARLIER_REPLAY_TO_LIFECYCLE,
        ),
        Target::new(
            None,
            format!("Begin p99 at half that rate, {high_clients} clients, ms"),
            high_p99,
            "< 10",
            |v| high_kept_up && v < TARGET_BEGIN_P99_MS,
        ),
    ]);
    targets
}

fn print_header(args: &Args, machine: &Value) {
    let high = if args.high_clients > 0 {
        format!(" (lifecycle and open loop also at {})", args.high_clients)
    } else {
        String::new()
    };
    println!(
        "opjournal-bench: {} clients{high}, {} s measured after {} s warm-up per run",
        args.clients, args.duration, args.warmup
    );
    println!(
        "machine: {} CPUs ({}), Postgres {}, synchronous_commit={}, max_connections={}, load average at start {}\n",
        machine["cpus"],
        machine["cpu"].as_str().unwrap_or(""),
        machine["postgres"].as_str().unwrap_or(""),
        machine["synchronous_commit"].as_str().unwrap_or(""),
        machine["max_connections"],
        machine["load_average_at_start"].as_str().unwrap_or(""),
    );
}

fn fmt_ms(value: Option<f64>) -> String {
    value.map_or_else(|| "-".to_owned(), |v| format!("{v:.2}"))
}

/// One row of a journal run's table: throughput, its ratio to pgbench minimal at the same
/// client count, and the latencies of `stage`.
fn print_row(name: &str, result: &RunResult, stage: &str, minimal: Option<f64>) {
    // An open loop's throughput is its schedule: no ratio.
    let ratio = minimal
        .filter(|m| *m > 0.0 && result.target_rate.is_none())
        .map_or_else(
            || "-".to_owned(),
            |m| format!("{:.2}", result.throughput() / m),
        );
    let name = if result.target_rate.is_some() {
        format!("{name} @ {:.0}/s", result.target_rate.unwrap_or(0.0))
    } else {
        name.to_owned()
    };
    println!(
        "  {:<42} {:>10.0} {:>8} {:>8} {:>8} {:>8} {:>7}",
        name,
        result.throughput(),
        ratio,
        fmt_ms(result.percentile_ms(stage, 0.50)),
        fmt_ms(result.percentile_ms(stage, 0.99)),
        fmt_ms(result.percentile_ms(stage, 0.999)),
        result.errors + result.dropped,
    );
}

fn print_run_header(title: &str) {
    println!(
        "{:<44} {:>10} {:>8} {:>8} {:>8} {:>8} {:>7}",
        title, "ops/s", "x min.", "p50 ms", "p99 ms", "p99.9 ms", "errors"
    );
}

/// The notes under a run's rows: open-loop calls not sent, CPU per operation, first errors.
fn print_run_notes(open_loop: &RunResult, cpu_runs: &[(&str, &RunResult)], all: &[&RunResult]) {
    if open_loop.dropped > 0 {
        println!(
            "  ! open loop: {} calls not sent (4096 outstanding): the server fell behind",
            open_loop.dropped
        );
    }
    for (what, result) in cpu_runs {
        if let Some(cpu) = &result.cpu {
            println!(
                "  CPU ms per {what}: server {:.3}, Postgres {:.3}, benchmark clients {:.3}",
                cpu["server_ms_per_op"].as_f64().unwrap_or(0.0),
                cpu["postgres_ms_per_op"].as_f64().unwrap_or(0.0),
                cpu["clients_ms_per_op"].as_f64().unwrap_or(0.0),
            );
        }
    }
    for result in all {
        if let Some(error) = &result.first_error {
            println!("  ! {}: {error}", result.name);
        }
    }
}

fn print_results(
    clients: usize,
    references: &[reference::Reference],
    empty: &JournalRun,
    high: Option<&HighRun>,
    scaled: Option<&JournalRun>,
    floors: &[floor::FloorRun],
) {
    if !references.is_empty() {
        println!(
            "{:<44} {:>10} {:>10}",
            "pgbench (same Postgres)", "ops/s", "mean ms"
        );
        for r in references {
            println!(
                "  {:<42} {:>10.0} {:>10.2}",
                format!("{}, {} clients", r.script, r.clients),
                r.tps,
                r.latency_ms
            );
        }
        for r in references {
            if let Some(cpu) = &r.cpu {
                println!(
                    "  CPU ms per {} at {} clients: Postgres {:.3}, pgbench {:.3}",
                    r.script,
                    r.clients,
                    cpu["postgres_ms_per_op"].as_f64().unwrap_or(0.0),
                    cpu["clients_ms_per_op"].as_f64().unwrap_or(0.0),
                );
            }
        }
        println!();
    }
    let minimal = |clients: usize| reference(references, MINIMAL, clients).map(|r| r.tps);
    let mut runs = vec![("empty journal", empty)];
    if let Some(scaled) = scaled {
        runs.push(("preloaded journal", scaled));
    }
    for (i, (title, run)) in runs.into_iter().enumerate() {
        print_run_header(&format!("journal, {title}, {clients} clients"));
        let rows: [(&str, &RunResult, &str); 4] = [
            ("lifecycle (Begin + Complete)", &run.lifecycle, "lifecycle"),
            ("replay (Begin, succeeded key)", &run.replay, "call"),
            ("conflict (same key, other payload)", &run.conflict, "call"),
            ("open loop of lifecycles: Begin", &run.open_loop, "begin"),
        ];
        for (name, result, stage) in rows {
            print_row(name, result, stage, minimal(clients));
        }
        println!(
            "  {:<42} {:>10.0}   ({} operations drained in {:.1} s)",
            "reconcile worker on an unknown backlog",
            run.reconcile["throughput_per_second"]
                .as_f64()
                .unwrap_or(0.0),
            run.reconcile["operations"],
            run.reconcile["drained_seconds"].as_f64().unwrap_or(0.0),
        );
        println!(
            "  {:<42} {:>10}",
            "server peak RSS, MiB",
            fmt_ms(run.rss["peak_rss_mib"].as_f64())
        );
        println!(
            "  {:<42} {:>10}",
            "Postgres checkpoints during the runs", run.checkpoints
        );
        if !run.purge_ms.is_empty() {
            let times: Vec<String> = run.purge_ms.iter().map(|ms| format!("{ms:.1}")).collect();
            println!(
                "  {:<42} {:>10}",
                "timed purge statements (--purge-batch), ms",
                times.join(" / ")
            );
        }
        print_run_notes(
            &run.open_loop,
            &[("lifecycle", &run.lifecycle), ("replay", &run.replay)],
            &[&run.lifecycle, &run.replay, &run.conflict, &run.open_loop],
        );
        // The floor ran beside the empty journal, not the preloaded one.
        if let (0, Some(f)) = (i, floors.iter().find(|f| f.clients == clients)) {
            floor::print(f, &run.lifecycle);
        }
        println!();
        // The run at the second client count came right after the empty journal's.
        if let (0, Some(high)) = (i, high) {
            print_run_header(&format!("journal, empty journal, {} clients", high.clients));
            print_row(
                "lifecycle (Begin + Complete)",
                &high.lifecycle,
                "lifecycle",
                minimal(high.clients),
            );
            print_row(
                "open loop of lifecycles: Begin",
                &high.open_loop,
                "begin",
                minimal(high.clients),
            );
            println!(
                "  {:<42} {:>10}",
                "server peak RSS, MiB",
                fmt_ms(high.rss["peak_rss_mib"].as_f64())
            );
            println!(
                "  {:<42} {:>10}",
                "Postgres checkpoints during the runs", high.checkpoints
            );
            print_run_notes(
                &high.open_loop,
                &[("lifecycle", &high.lifecycle)],
                &[&high.lifecycle, &high.open_loop],
            );
            if let Some(f) = floors.iter().find(|f| f.clients == high.clients) {
                floor::print(f, &high.lifecycle);
            }
            println!();
        }
    }
}

/// The targets table: each target's figure, bound and verdict, then the figures that only
/// earlier targets bound (their verdict in parentheses: they fail nothing).
fn print_targets(targets: &[Target]) {
    println!("{:<59} {:>10} {:>8}", "target", "value", "bound");
    let mut earlier_heading = false;
    for t in targets {
        let verdict = match t.met {
            Some(true) => "met",
            Some(false) => "NOT MET",
            None => "not measured",
        };
        let Some(number) = t.number else {
            if !earlier_heading {
                println!("  figures an earlier target bound:");
                earlier_heading = true;
            }
            println!(
                "   - {:<54} {:>10} {:>8}  ({verdict})",
                t.name,
                fmt_ms(t.value),
                t.bound
            );
            continue;
        };
        println!(
            "  {number:>2} {:<54} {:>10} {:>8}  {verdict}",
            t.name,
            fmt_ms(t.value),
            t.bound
        );
    }
}

fn print_plans(plans: &Value) {
    println!("\nQuery plans on the preloaded journal (generic plans of the prepared statements):");
    for plan in plans.as_array().into_iter().flatten() {
        println!("\n-- {}", plan["statement"].as_str().unwrap_or(""));
        println!("{}", plan["plan"].as_str().unwrap_or(""));
    }
}

fn journal_json(run: &JournalRun) -> Value {
    let mut runs = BTreeMap::new();
    for result in [&run.lifecycle, &run.replay, &run.conflict, &run.open_loop] {
        runs.insert(result.name.clone(), result.to_json());
    }
    json!({
        "runs": runs,
        "reconcile": run.reconcile,
        "server_memory": run.rss,
        "purge_batch_ms": run.purge_ms,
        "checkpoints_during_run": run.checkpoints,
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    /// A run of `ok` operations in one second, its `begin` stage all at `begin_ms`.
    fn result(name: &str, ok: u64, begin_ms: f64, dropped: u64, postgres_ms: f64) -> RunResult {
        let mut begin = hdrhistogram::Histogram::new_with_bounds(1, 60_000_000, 3).unwrap();
        begin.record((begin_ms * 1000.0) as u64).unwrap();
        RunResult {
            name: name.to_owned(),
            ok,
            errors: 0,
            dropped,
            seconds: 1.0,
            latencies: BTreeMap::from([("begin", begin)]),
            first_error: None,
            target_rate: None,
            all_calls: ok,
            cpu: Some(json!({ "postgres_ms_per_op": postgres_ms })),
        }
    }

    fn journal(lifecycle: u64, replay: u64, begin_ms: f64, rss: f64) -> JournalRun {
        JournalRun {
            lifecycle: result("lifecycle", lifecycle, 1.0, 0, 0.4),
            replay: result("replay", replay, 1.0, 0, 0.1),
            conflict: result("conflict", replay, 1.0, 0, 0.1),
            open_loop: result("open_loop", lifecycle / 2, begin_ms, 0, 0.4),
            reconcile: Value::Null,
            rss: json!({ "peak_rss_mib": rss }),
            purge_ms: Vec::new(),
            checkpoints: 0,
        }
    }

    fn pgbench(script: &str, clients: usize, tps: f64, postgres_ms: f64) -> reference::Reference {
        reference::Reference {
            script: script.to_owned(),
            clients,
            tps,
            latency_ms: 1.0,
            failed: 0,
            cpu: Some(json!({ "postgres_ms_per_op": postgres_ms })),
        }
    }

    fn by_number(targets: &[Target], number: u8) -> Vec<&Target> {
        targets
            .iter()
            .filter(|t| t.number == Some(number))
            .collect()
    }

    #[test]
    fn each_ratio_is_taken_against_pgbench_at_the_same_client_count() {
        let args = Args::parse_from(["opjournal-bench"]);
        let references = [
            pgbench(MINIMAL, 16, 1000.0, 0.2),
            pgbench(ARTICLE, 16, 500.0, 0.5),
            pgbench(MINIMAL, 64, 2000.0, 0.2),
            pgbench(ARTICLE, 64, 800.0, 0.5),
        ];
        let empty = journal(900, 1200, 4.0, 30.0);
        let high = HighRun {
            clients: 64,
            lifecycle: result("lifecycle", 1500, 1.0, 0, 0.4),
            open_loop: result("open_loop", 750, 12.0, 0, 0.4),
            rss: json!({ "peak_rss_mib": 70.0 }),
            checkpoints: 0,
        };
        let scaled = journal(800, 1200, 4.4, 20.0);
        let targets = targets(&args, &references, &empty, Some(&high), Some(&scaled), &[]);

        // The journal's Postgres CPU: 0.4 ms per lifecycle against 0.2 at both counts.
        let two = by_number(&targets, 2);
        assert!((two[0].value.unwrap() - 2.0).abs() < 1e-9);
        assert_eq!(two[0].met, Some(false), "2.0 is over 1.5");
        assert!((two[1].value.unwrap() - 2.0).abs() < 1e-9);
        assert_eq!(two[1].met, Some(false), "2.0 is over 1.0");
        let three = by_number(&targets, 3);
        assert_eq!(three[0].value, Some(0.9));
        assert_eq!(three[0].met, Some(true), "0.9 is at least 0.5");
        assert_eq!(three[1].value, Some(0.75));
        assert_eq!(three[1].met, Some(true), "0.75 is at least 0.65");
        let four = by_number(&targets, 4);
        assert!((four[0].value.unwrap() - 4.0).abs() < 0.01);
        assert_eq!(four[0].met, Some(true));
        let six = by_number(&targets, 6);
        assert_eq!(six[0].value, Some(1.2), "replay / minimal");
        assert_eq!(six[0].met, Some(true));
        assert_eq!(six[1].value, Some(900.0 / 800.0));
        assert_eq!(six[1].met, Some(true));
        assert!((six[2].value.unwrap() - 1.1).abs() < 0.01);
        assert_eq!(six[2].met, Some(true));
        // The highest peak of every server, the 64-client one's here.
        assert_eq!(six[3].value, Some(70.0));
        assert_eq!(six[3].met, Some(false));
        // Beside the targets: the article's ratio and the 64-client p99, unnumbered.
        let earlier: Vec<&Target> = targets.iter().filter(|t| t.number.is_none()).collect();
        assert_eq!(earlier[0].value, Some(1.8));
        assert_eq!(earlier[2].met, Some(false), "a 12 ms p99 is over 10");
    }

    /// `run` with its server's CPU per operation at `ms`.
    fn with_server_ms(mut run: RunResult, ms: f64) -> RunResult {
        run.cpu = Some(json!({ "server_ms_per_op": ms }));
        run
    }

    #[test]
    fn the_server_cpu_is_read_against_the_floor_at_the_same_client_count() {
        let args = Args::parse_from(["opjournal-bench"]);
        let mut empty = journal(900, 1200, 4.0, 30.0);
        empty.lifecycle = with_server_ms(result("lifecycle", 900, 1.0, 0, 0.4), 0.3);
        let high = HighRun {
            clients: 64,
            lifecycle: with_server_ms(result("lifecycle", 1500, 1.0, 0, 0.4), 0.5),
            open_loop: result("open_loop", 750, 2.0, 0, 0.4),
            rss: json!({ "peak_rss_mib": 30.0 }),
            checkpoints: 0,
        };
        let floor = |clients: usize, ms: f64| floor::FloorRun {
            clients,
            lifecycle: with_server_ms(result("lifecycle", 5000, 1.0, 0, 0.0), ms),
        };
        let floors = [floor(16, 0.1), floor(64, 0.25)];
        let is_floor = |t: &&Target| t.name.starts_with("server CPU per lifecycle / gRPC floor");

        let measured = targets(&args, &[], &empty, Some(&high), None, &floors);
        let ratios: Vec<&Target> = measured.iter().filter(is_floor).collect();
        assert_eq!(ratios.len(), 2);
        assert!(
            (ratios[0].value.unwrap() - 3.0).abs() < 1e-9,
            "0.3 / 0.1 at 16"
        );
        assert_eq!(ratios[0].met, Some(false));
        assert!(
            (ratios[1].value.unwrap() - 2.0).abs() < 1e-9,
            "0.5 / 0.25 at 64"
        );
        assert_eq!(ratios[1].met, Some(true));

        // `--no-floor`: both rows stay, unmeasured.
        let skipped = targets(&args, &[], &empty, Some(&high), None, &[]);
        for target in skipped.iter().filter(is_floor) {
            assert_eq!((target.value, target.met), (None, None), "{}", target.name);
        }
    }

    #[test]
    fn a_skipped_run_leaves_its_targets_unmeasured_and_unsent_calls_fail_them() {
        let args = Args::parse_from(["opjournal-bench", "--high-clients", "0"]);
        let references = [pgbench(MINIMAL, 16, 1000.0, 0.2)];
        let mut empty = journal(900, 1200, 4.0, 30.0);
        empty.open_loop.dropped = 3;
        let targets = targets(&args, &references, &empty, None, None, &[]);
        // No 64-client run, no preload: the second of targets 2 and 3, and 6's scale rows.
        for target in [
            by_number(&targets, 2)[1],
            by_number(&targets, 3)[1],
            by_number(&targets, 6)[1],
            by_number(&targets, 6)[2],
        ] {
            assert_eq!(target.value, None, "{}", target.name);
            assert_eq!(target.met, None, "{}", target.name);
        }
        let article = targets
            .iter()
            .find(|t| t.name.starts_with("lifecycle / pgbench article SQL"))
            .unwrap();
        assert_eq!(article.met, None, "no article script ran");
        let kept = by_number(&targets, 4)[0];
        assert!((kept.value.unwrap() - 4.0).abs() < 0.01);
        assert_eq!(
            kept.met,
            Some(false),
            "calls left unsent fail the p99 target"
        );
    }
}
