//! Where the CPU goes during a run: the server, Postgres (all its processes) and the
//! benchmark's own clients, from /proc, so a figure can be read against the machine's two
//! cores shared by all three.

use std::time::Instant;

use serde_json::{Value, json};

/// Ticks of /proc's `utime` and `stime` per second: Linux reports them in `USER_HZ`, which
/// is 100 on every architecture it exposes to user space.
const TICKS_PER_SECOND: f64 = 100.0;

/// CPU seconds used so far by process `pid` (user + system), with those of its children
/// that have exited and been waited for, if it can be read.
fn process_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces; fields are counted after its closing parenthesis.
    let after = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = after.split_whitespace().collect();
    // utime, stime, cutime and cstime are fields 14 to 17 of the line, 12 to 15 after the
    // name.
    let ticks: f64 = fields
        .get(11..15)?
        .iter()
        .map(|field| field.parse::<f64>().unwrap_or(0.0))
        .sum();
    Some(ticks / TICKS_PER_SECOND)
}

/// CPU seconds of every running `postgres` process (backends, WAL writer, checkpointer…);
/// backends that have exited are counted in the postmaster's children's time.
fn postgres_seconds() -> f64 {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return 0.0;
    };
    entries
        .filter_map(Result::ok)
        .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .is_ok_and(|name| name.trim() == "postgres")
        })
        .filter_map(process_seconds)
        .sum()
}

/// A reading of the three processes' CPU time.
pub struct Snapshot {
    at: Instant,
    server: f64,
    postgres: f64,
    bench: f64,
}

impl Snapshot {
    /// Reads the CPU time of the server `server_pid`, of Postgres and of this process (with
    /// pgbench, its child, once it has exited).
    pub fn take(server_pid: Option<u32>) -> Self {
        Self {
            at: Instant::now(),
            server: server_pid.and_then(process_seconds).unwrap_or(0.0),
            postgres: postgres_seconds(),
            bench: process_seconds(std::process::id()).unwrap_or(0.0),
        }
    }

    /// CPU used since `self`, per operation (`operations` done in between), in
    /// milliseconds, and as cores busy on average.
    pub fn since(&self, later: &Snapshot, operations: u64) -> Value {
        let wall = later.at.duration_since(self.at).as_secs_f64().max(1e-9);
        let per_op = |seconds: f64| seconds * 1000.0 / operations.max(1) as f64;
        let server = later.server - self.server;
        let postgres = later.postgres - self.postgres;
        let bench = later.bench - self.bench;
        json!({
            "server_ms_per_op": per_op(server),
            "postgres_ms_per_op": per_op(postgres),
            "clients_ms_per_op": per_op(bench),
            "server_cores": server / wall,
            "postgres_cores": postgres / wall,
            "clients_cores": bench / wall,
        })
    }
}
