//! What the flood binaries (`opjournal-held-streams`, `opjournal-console-flood`) share about
//! the server they start and watch: its settings from the command line, a free port for it,
//! and its resident memory.

use anyhow::Context as _;

/// A `--server-env KEY=VALUE` argument as (key, value).
///
/// # Errors
///
/// When `value` has no `=`.
pub fn parse_env(value: &str) -> anyhow::Result<(String, String)> {
    value
        .split_once('=')
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .context("expected KEY=VALUE")
}

/// A free loopback port (bound, then let go).
///
/// # Errors
///
/// When no port can be bound.
pub fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// Resident memory of process `pid`, in MiB.
///
/// # Errors
///
/// When `/proc/<pid>/status` cannot be read or has no `VmRSS` line.
pub fn rss_mib(pid: u32) -> anyhow::Result<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let kib: f64 = status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .context("no VmRSS")?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()?;
    Ok(kib / 1024.0)
}
