//! The suite's own Postgres cluster: Debian's binaries (`/usr/lib/postgresql/<version>/bin`),
//! `initdb` into the work directory, `pg_ctl` on a free loopback port (never the one the tests
//! use), stopped, its postmaster killed with SIGKILL, started again, and removed at the end.
//!
//! `initdb` refuses to run as root, so as root every command runs as the `postgres` user
//! (`runuser`), which Debian's package creates. `fsync` is off: the suite kills processes,
//! never the machine, and a killed process cannot lose what it already gave the kernel;
//! `synchronous_commit` stays on, so an acknowledged commit is in the kernel's hands.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use nix::sys::signal::{Signal, kill};
use nix::unistd::{Pid, User};
use tokio::process::Command;

/// The test suite's Postgres port; the cluster never takes it.
const TEST_PORT: u16 = 5432;

/// A Postgres cluster owned by the suite.
pub struct Postgres {
    bin: PathBuf,
    data: PathBuf,
    log: PathBuf,
    port: u16,
    /// `Some("postgres")` when running as root.
    run_as: Option<String>,
}

impl Postgres {
    /// Creates the cluster in `<dir>/pg` on a free port (not started).
    ///
    /// Errors: no Postgres binaries (install Debian's `postgresql`), no `postgres` user while
    /// running as root, or `initdb` failing (its output is in the message).
    pub async fn create(dir: &Path) -> anyhow::Result<Self> {
        let bin = binaries()?;
        let home = dir.join("pg");
        std::fs::create_dir_all(&home)?;
        let run_as = if nix::unistd::geteuid().is_root() {
            let user = User::from_name("postgres")?.context(
                "running as root needs the `postgres` user (Debian's postgresql package)",
            )?;
            // The postgres user must reach its directory through the work directory.
            std::fs::set_permissions(dir, std::os::unix::fs::PermissionsExt::from_mode(0o755))?;
            std::os::unix::fs::chown(&home, Some(user.uid.as_raw()), Some(user.gid.as_raw()))?;
            Some(user.name)
        } else {
            None
        };
        let port = free_port()?;
        let cluster = Self {
            bin,
            data: home.join("data"),
            log: home.join("postgres.log"),
            port,
            run_as,
        };
        let data = cluster.data.display().to_string();
        cluster
            .run(
                "initdb",
                &[
                    "-D",
                    &data,
                    "-U",
                    "postgres",
                    "--auth=trust",
                    "--encoding=UTF8",
                    "--no-locale",
                    "--no-sync",
                ],
            )
            .await?;
        let settings = format!(
            "\n# opjournal-chaos\nport = {port}\nlisten_addresses = '127.0.0.1'\n\
             unix_socket_directories = '{}'\nmax_connections = 300\nfsync = off\n\
             full_page_writes = off\nshared_buffers = 64MB\nlog_min_messages = warning\n",
            home.display()
        );
        let conf = cluster.data.join("postgresql.conf");
        let mut text = std::fs::read_to_string(&conf).context("read postgresql.conf")?;
        text.push_str(&settings);
        std::fs::write(&conf, text).context("write postgresql.conf")?;
        Ok(cluster)
    }

    /// The URL of database `name` on this cluster.
    pub fn url(&self, name: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{name}", self.port)
    }

    /// The cluster's port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Starts the cluster and waits until it accepts connections. After a killed postmaster
    /// its old backends may still hold the shared memory for a moment: starting is tried
    /// again for up to 30 s.
    ///
    /// Errors: it did not start within 30 s (see `pg/postgres.log`).
    pub async fn start(&self) -> anyhow::Result<()> {
        let started = Instant::now();
        let data = self.data.display().to_string();
        let log = self.log.display().to_string();
        loop {
            let outcome = self
                .run(
                    "pg_ctl",
                    &["-D", &data, "-l", &log, "-w", "-t", "30", "start"],
                )
                .await;
            match outcome {
                Ok(()) => return Ok(()),
                Err(err) if started.elapsed() < Duration::from_secs(30) => {
                    tracing::debug!(error = %err, "postgres did not start yet; trying again");
                    tokio::time::sleep(Duration::from_millis(300)).await;
                }
                Err(err) => return Err(err.context(format!("see {log}"))),
            }
        }
    }

    /// A clean stop (`pg_ctl stop -m fast`): sessions are ended, the cluster shuts down.
    ///
    /// Errors: `pg_ctl` failed.
    pub async fn stop(&self) -> anyhow::Result<()> {
        let data = self.data.display().to_string();
        self.run("pg_ctl", &["-D", &data, "-m", "fast", "-w", "stop"])
            .await
    }

    /// SIGKILL to the postmaster (its pid from `postmaster.pid`); backends notice and exit.
    ///
    /// Errors: no running postmaster.
    pub fn kill_postmaster(&self) -> anyhow::Result<()> {
        let pid = self.postmaster_pid().context("no postmaster is running")?;
        kill(Pid::from_raw(pid), Signal::SIGKILL).context("kill the postmaster")?;
        Ok(())
    }

    /// Stops the cluster at once (`pg_ctl stop -m immediate`), whatever state it is in, and
    /// removes it, keeping its server log as `<work>/postgres.log`.
    pub async fn destroy(&self) {
        if self.postmaster_pid().is_some() {
            let data = self.data.display().to_string();
            if let Err(err) = self
                .run("pg_ctl", &["-D", &data, "-m", "immediate", "-w", "stop"])
                .await
            {
                tracing::warn!(error = %err, "pg_ctl stop -m immediate failed");
                if let Some(pid) = self.postmaster_pid() {
                    let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
                }
            }
        }
        if let Some(home) = self.data.parent() {
            if let Some(work) = home.parent() {
                let _ = std::fs::copy(&self.log, work.join("postgres.log"));
            }
            if let Err(err) = std::fs::remove_dir_all(home) {
                tracing::warn!(error = %err, "cannot remove the cluster's directory");
            }
        }
    }

    /// Whether a postmaster of this cluster is alive.
    pub fn is_running(&self) -> bool {
        self.postmaster_pid().is_some()
    }

    fn postmaster_pid(&self) -> Option<i32> {
        let text = std::fs::read_to_string(self.data.join("postmaster.pid")).ok()?;
        let pid: i32 = text.lines().next()?.trim().parse().ok()?;
        // Signal 0: is it alive?
        kill(Pid::from_raw(pid), None).ok().map(|()| pid)
    }

    /// Runs one of the cluster's programs (as `postgres` when root); its output goes into
    /// the error when it fails.
    async fn run(&self, program: &str, args: &[&str]) -> anyhow::Result<()> {
        let program = self.bin.join(program);
        let mut command = match &self.run_as {
            Some(user) => {
                let mut command = Command::new("runuser");
                command.args(["-u", user, "--"]).arg(&program);
                command
            }
            None => Command::new(&program),
        };
        command.args(args).stdin(std::process::Stdio::null());
        let output = command
            .output()
            .await
            .with_context(|| format!("cannot run {}", program.display()))?;
        if !output.status.success() {
            bail!(
                "{} {} failed ({}): {}{}",
                program.display(),
                args.last().unwrap_or(&""),
                output.status,
                String::from_utf8_lossy(&output.stdout).trim(),
                String::from_utf8_lossy(&output.stderr).trim()
            );
        }
        Ok(())
    }
}

/// The newest `/usr/lib/postgresql/<version>/bin` holding `initdb` and `pg_ctl`.
fn binaries() -> anyhow::Result<PathBuf> {
    let root = Path::new("/usr/lib/postgresql");
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir(root)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let version = entry.file_name().to_str()?.parse().ok()?;
            let bin = entry.path().join("bin");
            (bin.join("initdb").exists() && bin.join("pg_ctl").exists()).then_some((version, bin))
        })
        .collect();
    versions.sort();
    versions.pop().map(|(_, bin)| bin).context(
        "no Postgres binaries under /usr/lib/postgresql (scripts/chaos installs Debian's postgresql)",
    )
}

/// A free loopback port other than the test suite's.
pub fn free_port() -> anyhow::Result<u16> {
    loop {
        let listener = std::net::TcpListener::bind(("127.0.0.1", 0))?;
        let port = listener.local_addr()?.port();
        if port != TEST_PORT {
            return Ok(port);
        }
    }
}
