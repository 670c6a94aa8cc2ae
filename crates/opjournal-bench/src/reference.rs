//! The physical limit: pgbench running the reference SQL of `crates/opjournal-bench/pgbench/` on the same
//! Postgres, with as many clients as the journal's run, in a database of its own.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context as _, bail};
use serde_json::{Value, json};
use sqlx::{Connection as _, Executor as _, PgConnection};

/// One pgbench script's figures.
pub struct Reference {
    /// Script file name (`minimal-lifecycle.sql`, `seed-lifecycle.sql`).
    pub script: String,
    /// pgbench's clients (`-c`), each with its own connection.
    pub clients: usize,
    /// Transactions of the script per second (one operation's lifecycle each), excluding
    /// connection set-up, as pgbench reports it.
    pub tps: f64,
    /// Mean latency of one script run, milliseconds.
    pub latency_ms: f64,
    /// Script runs that failed (pgbench 15 counts serialization and deadlock failures).
    pub failed: u64,
    /// Where the CPU went (Postgres, pgbench), per script run.
    pub cpu: Option<Value>,
}

impl Reference {
    /// The figures as JSON for the report.
    pub fn to_json(&self) -> Value {
        json!({
            "script": self.script,
            "clients": self.clients,
            "tps": self.tps,
            "latency_ms": self.latency_ms,
            "failed": self.failed,
            "cpu": self.cpu,
        })
    }
}

/// The folder of the reference SQL: `crates/opjournal-bench/pgbench` of the source tree this
/// binary was built from, unless given.
pub fn default_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("pgbench")
}

/// Creates the reference table in `url`'s database from `schema.sql` (dropping any left by
/// an earlier call), then runs each script for `duration` with `clients` connections and
/// `threads` pgbench threads, emptying the table before each.
///
/// Errors: pgbench is missing or fails; the schema cannot be created.
pub async fn run(
    pgbench: &str,
    dir: &Path,
    url: &str,
    clients: usize,
    threads: usize,
    warmup: Duration,
    duration: Duration,
) -> anyhow::Result<Vec<Reference>> {
    let schema = std::fs::read_to_string(dir.join("schema.sql"))
        .with_context(|| format!("cannot read {}", dir.join("schema.sql").display()))?;
    let mut connection = PgConnection::connect(url).await?;
    connection
        .execute(sqlx::raw_sql(sqlx::AssertSqlSafe(schema)))
        .await
        .context("cannot create the reference table")?;
    let mut figures = Vec::new();
    for script in ["minimal-lifecycle.sql", "seed-lifecycle.sql"] {
        connection
            .execute("TRUNCATE agent_operations")
            .await
            .context("cannot empty the reference table")?;
        connection.execute("CHECKPOINT").await.ok();
        let path = dir.join(script);
        let pgbench_for = |seconds: Duration| {
            let mut command = tokio::process::Command::new(pgbench);
            command
                .args(["-n", "-M", "prepared"])
                .args(["-c", &clients.to_string()])
                .args(["-j", &threads.min(clients).to_string()])
                // pgbench counts whole seconds.
                .args(["-T", &(seconds.as_secs_f64().round().max(1.0)).to_string()])
                .arg("-f")
                .arg(&path)
                .arg(url);
            command
        };
        // Warm-up, not counted, as the journal's runs have.
        if !warmup.is_zero() {
            pgbench_for(warmup)
                .output()
                .await
                .with_context(|| format!("cannot run {pgbench} (install PostgreSQL's pgbench)"))?;
        }
        let before = crate::cpu::Snapshot::take(None);
        let output = pgbench_for(duration)
            .output()
            .await
            .with_context(|| format!("cannot run {pgbench} (install PostgreSQL's pgbench)"))?;
        let stdout = String::from_utf8_lossy(&output.stdout);
        if !output.status.success() {
            bail!(
                "pgbench {script} failed: {}{}",
                stdout,
                String::from_utf8_lossy(&output.stderr)
            );
        }
        let mut figure = parse(script, &stdout)?;
        figure.clients = clients;
        anyhow::ensure!(
            figure.failed == 0,
            "pgbench {script}: {} transactions failed:\n{stdout}",
            figure.failed
        );
        let runs = number_after(&stdout, "number of transactions actually processed: ")
            .map_or(1, |n| n as u64);
        figure.cpu = Some(before.since(&crate::cpu::Snapshot::take(None), runs));
        figures.push(figure);
    }
    connection.close().await.ok();
    Ok(figures)
}

/// Reads pgbench's summary: `tps = N (without initial connection time)`,
/// `latency average = N ms`, `number of failed transactions: N (…)`.
fn parse(script: &str, stdout: &str) -> anyhow::Result<Reference> {
    let tps = number_after(stdout, "tps = ")
        .with_context(|| format!("no tps in pgbench's output:\n{stdout}"))?;
    Ok(Reference {
        script: script.to_owned(),
        clients: 0,
        tps,
        latency_ms: number_after(stdout, "latency average = ").unwrap_or(f64::NAN),
        failed: number_after(stdout, "number of failed transactions: ").unwrap_or(0.0) as u64,
        cpu: None,
    })
}

/// The number after `prefix` on the first line of `stdout` that starts with it.
fn number_after(stdout: &str, prefix: &str) -> Option<f64> {
    stdout.lines().find_map(|line| {
        line.trim()
            .strip_prefix(prefix)
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|n| n.parse().ok())
    })
}

#[cfg(test)]
mod tests {
    use super::parse;

    #[test]
    fn reads_the_figures_of_a_pgbench_15_summary() {
        let out = "pgbench (15.19 (Debian 15.19-0+deb12u1))\ntransaction type: minimal-lifecycle.sql\n\
                   number of clients: 16\nnumber of transactions actually processed: 44283\n\
                   number of failed transactions: 0 (0.000%)\nlatency average = 5.420 ms\n\
                   initial connection time = 12.345 ms\n\
                   tps = 2952.123456 (without initial connection time)\n";
        let figures = parse("minimal-lifecycle.sql", out).expect("parsed");
        assert!((figures.tps - 2952.123456).abs() < 1e-9);
        assert!((figures.latency_ms - 5.42).abs() < 1e-9);
        assert_eq!(figures.failed, 0);
    }

    #[test]
    fn output_without_tps_is_an_error() {
        assert!(parse("x.sql", "connection refused\n").is_err());
    }
}
