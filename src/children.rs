//! This package's binaries as child processes on free local ports: how `opjournal demo` and
//! `opjournal-bench` start the server, the sandbox provider and the reconcile worker.
//!
//! Each child's stderr goes to `<dir>/<name>.log`; its stdout is read until the line that
//! carries its address (every binary prints one when it listens), then drained.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context as _, bail};
use tokio::io::{AsyncBufReadExt as _, BufReader};
use tokio::process::{Child, Command};

/// How long a process may take to start listening.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// What a child that exited before it listened said: its `Error:` report with the causes
/// (`main` returning an error), or else the last five lines of its log.
fn startup_error(log: &str) -> String {
    let lines: Vec<&str> = log.lines().collect();
    let report = lines
        .iter()
        .rposition(|line| line.starts_with("Error: "))
        .map(|start| {
            lines[start..]
                .iter()
                .take_while(|line| !line.starts_with("Stack backtrace:"))
                .filter(|line| !line.trim().is_empty())
                .copied()
                .collect::<Vec<_>>()
        });
    match report {
        Some(report) => report.join("\n"),
        None => lines[lines.len().saturating_sub(5)..].join("\n"),
    }
}

/// A child process, its stderr kept in `<dir>/<name>.log`; killed when dropped.
pub struct Process {
    name: &'static str,
    child: Child,
}

impl Process {
    /// Starts the sibling binary `name` and waits for the stdout line holding `marker`;
    /// returns the process and what follows the marker on that line (its address). `env`
    /// is added to the environment (`RUST_LOG` defaults to `info`).
    ///
    /// Errors: the binary is missing or cannot start, or it exits or stays silent for 30 s
    /// without printing the marker (the message holds its error report).
    pub async fn start(
        name: &'static str,
        args: &[&str],
        env: &[(&str, &str)],
        marker: &str,
        dir: &Path,
    ) -> anyhow::Result<(Self, String)> {
        let binary = sibling(name)?;
        let log_path = dir.join(format!("{name}.log"));
        let log = std::fs::File::create(&log_path)?;
        let mut command = Command::new(&binary);
        command
            .args(args)
            .env("RUST_LOG", "info")
            .envs(env.iter().copied())
            // The error chain, not a stack trace, is what `startup_error` shows.
            .env("RUST_LIB_BACKTRACE", "0")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(log)
            .kill_on_drop(true);
        let mut child = command
            .spawn()
            .with_context(|| format!("cannot start {}", binary.display()))?;
        let stdout = child.stdout.take().context("no stdout")?;
        let mut lines = BufReader::new(stdout).lines();
        let address = tokio::time::timeout(START_TIMEOUT, async {
            while let Some(line) = lines.next_line().await? {
                if let Some((_, address)) = line.split_once(marker) {
                    return Ok(address.trim().to_owned());
                }
            }
            anyhow::Ok(String::new())
        })
        .await
        .unwrap_or_else(|_| Ok(String::new()))?;
        if address.is_empty() {
            let log = std::fs::read_to_string(&log_path).unwrap_or_default();
            bail!("{name} did not start: {}", startup_error(&log));
        }
        // Keep draining stdout so the process never blocks on a full pipe.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        Ok((Self { name, child }, address))
    }

    /// The operating system's process id, while the process runs.
    pub fn id(&self) -> Option<u32> {
        self.child.id()
    }

    /// SIGTERM, then a grace period, then SIGKILL.
    pub async fn stop(&mut self) {
        if let Some(pid) = self.child.id().and_then(|pid| i32::try_from(pid).ok()) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGTERM,
            );
        }
        if tokio::time::timeout(Duration::from_secs(10), self.child.wait())
            .await
            .is_err()
        {
            tracing::warn!(process = self.name, "did not stop on SIGTERM; killing");
            let _ = self.child.kill().await;
        }
    }
}

/// The path of another binary of this package, next to the running one.
pub fn sibling(name: &str) -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe().context("cannot find the running binary")?;
    let path = exe.with_file_name(format!("{name}{}", std::env::consts::EXE_SUFFIX));
    if !path.exists() {
        bail!(
            "{} not found; build every binary of the package (`cargo build --release --bins`)",
            path.display()
        );
    }
    Ok(path)
}

/// An action policy file (YAML) for a stand around the sandbox provider (`opjournal-sandbox`), as `opjournal demo` and
/// `opjournal-bench` write it: `create_payment` with a 30 s lease, reconciled before any
/// retry through the sandbox's search by idempotency key at `sandbox_url` (first check at
/// once, then every second, absence trusted after 60 s). `written_by` names the writer in the
/// file's first line.
pub fn payments_policy_yaml(sandbox_url: &str, written_by: &str) -> String {
    format!(
        r#"# Written by {written_by}.
actions:
  create_payment:
    lease_seconds: 30
    retry:
      on_timeout: reconcile_before_retry
    reconcile:
      adapter: sandbox_payments
      first_check_after_seconds: 0
      interval_seconds: 1
      absence_grace_seconds: 60
adapters:
  sandbox_payments:
    kind: http
    url: "{sandbox_url}/v1/payments/by-idempotency-key/{{provider_key}}"
    timeout_seconds: 2
    search_complete: true
    absent_match: {{ pointer: /error, values: [not_found], key_pointer: /idempotency_key }}
    response: {{ status_pointer: /status, succeeded_values: [succeeded], key_pointer: /idempotency_key, external_id_pointer: /id }}
"#
    )
}

#[cfg(test)]
mod tests {
    use super::startup_error;

    #[test]
    fn a_failed_start_shows_the_error_report_without_the_stack_trace() {
        let log = "INFO journal on Postgres\nError: migrate on start\n\nCaused by:\n    0: database \
                   unavailable\n    1: failed to lookup address information\n\nStack backtrace:\n   \
                   0: anyhow::context\n             at src/backtrace.rs:10:14\n  32: _start\n";
        assert_eq!(
            startup_error(log),
            "Error: migrate on start\nCaused by:\n    0: database unavailable\n    1: failed to \
             lookup address information"
        );
    }

    #[test]
    fn without_an_error_report_the_last_five_lines_are_shown() {
        let log = "1\n2\n3\n4\n5\n6\n7\n";
        assert_eq!(startup_error(log), "3\n4\n5\n6\n7");
    }
}
