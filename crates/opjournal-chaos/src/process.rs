//! The stand's own processes (server replicas, reconcile workers, the sandbox): started from
//! the binaries next to this one, each with its stderr appended to `<dir>/<name>.log`, and
//! stopped gracefully (SIGTERM) or killed (SIGKILL) and started again with the same
//! arguments, so a restarted server listens on the same address. Every pid goes into
//! `<dir>/pids`, so that `scripts/chaos` can end them should this process be killed.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context as _, bail};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::io::{AsyncBufReadExt as _, BufReader};
use tokio::process::{Child, Command};

/// How long a process may take to print the line that says it listens.
const START_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a process may take to exit after SIGTERM before it is killed.
const STOP_TIMEOUT: Duration = Duration::from_secs(15);

/// One supervised process; killed when dropped.
pub struct Service {
    name: String,
    binary: PathBuf,
    args: Vec<String>,
    env: Vec<(String, String)>,
    marker: &'static str,
    log: PathBuf,
    /// Every pid started, one a line, for a wrapper that cleans up after a killed run.
    pids: PathBuf,
    child: Option<Child>,
    starts: u32,
}

impl Service {
    /// A process of the sibling binary `binary` (not started yet). `marker` is the text of the
    /// stdout line that says it is ready; what follows it on that line is its address.
    ///
    /// Errors: the binary is not next to this one.
    pub fn new(
        name: &str,
        binary: &str,
        args: &[String],
        env: &[(&str, &str)],
        marker: &'static str,
        dir: &Path,
    ) -> anyhow::Result<Self> {
        Ok(Self {
            name: name.to_owned(),
            binary: sibling(binary)?,
            args: args.to_vec(),
            env: env
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            marker,
            log: dir.join(format!("{name}.log")),
            pids: dir.join("pids"),
            child: None,
            starts: 0,
        })
    }

    /// The process's name in logs and the report.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Starts the process and waits for its ready line; returns what follows the marker.
    ///
    /// Errors: it cannot start, or exits or stays silent for 60 s (the message points at its
    /// log).
    pub async fn start(&mut self) -> anyhow::Result<String> {
        self.starts += 1;
        let mut log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .with_context(|| format!("cannot open {}", self.log.display()))?;
        std::io::Write::write_all(
            &mut log,
            format!("---- start {} of {} ----\n", self.starts, self.name).as_bytes(),
        )?;
        let mut child = Command::new(&self.binary)
            .args(&self.args)
            .env("RUST_LOG", "warn")
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .env("RUST_LIB_BACKTRACE", "0")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("cannot start {}", self.binary.display()))?;
        if let Some(pid) = child.id() {
            let mut pids = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&self.pids)?;
            std::io::Write::write_all(&mut pids, format!("{pid}\n").as_bytes())?;
        }
        let stdout = child.stdout.take().context("no stdout")?;
        let mut lines = BufReader::new(stdout).lines();
        let marker = self.marker;
        let ready = tokio::time::timeout(START_TIMEOUT, async {
            while let Ok(Some(line)) = lines.next_line().await {
                if let Some((_, rest)) = line.split_once(marker) {
                    return Some(rest.trim().to_owned());
                }
            }
            None
        })
        .await
        .ok()
        .flatten();
        let Some(address) = ready else {
            let _ = child.kill().await;
            bail!("{} did not start; see {}", self.name, self.log.display());
        };
        // Keep draining stdout so the process never blocks on a full pipe.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        self.child = Some(child);
        Ok(address)
    }

    /// SIGKILL, and waits until the process is gone.
    pub async fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill().await;
        }
    }

    /// SIGTERM, waits for the exit (up to 15 s, then SIGKILL).
    pub async fn terminate(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        if let Some(pid) = child.id().and_then(|pid| i32::try_from(pid).ok()) {
            let _ = kill(Pid::from_raw(pid), Signal::SIGTERM);
        }
        if tokio::time::timeout(STOP_TIMEOUT, child.wait())
            .await
            .is_err()
        {
            tracing::warn!(process = %self.name, "did not stop on SIGTERM; killing it");
            let _ = child.kill().await;
        }
    }

    /// Whether the process was started and has not been stopped by this supervisor.
    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }
}

/// The path of another binary of this workspace, next to the running one.
///
/// Errors: it is not there (build every binary: `cargo build --workspace --bins`).
pub fn sibling(name: &str) -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe().context("cannot find the running binary")?;
    let path = exe.with_file_name(format!("{name}{}", std::env::consts::EXE_SUFFIX));
    if !path.exists() {
        bail!(
            "{} not found; build every binary of the workspace (`cargo build --workspace --bins`)",
            path.display()
        );
    }
    Ok(path)
}
