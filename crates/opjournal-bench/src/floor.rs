//! The gRPC floor: the same closed loop of lifecycles as the journal's run, against
//! `opjournal-grpc-floor`, a server of the same protocol that answers from memory (no
//! database, no tracing, no authentication, no limits). Its CPU per lifecycle is what two
//! gRPC calls cost by themselves on this machine; the journal's server's CPU per lifecycle is
//! read against it, as a ratio. See docs/performance.md, "The gRPC floor".

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use opjournal::children::Process;
use serde_json::{Value, json};

use crate::load::{self, RunResult};
use crate::{Target, cpu};

/// The bound of the target: the journal's server may spend at most this many times the
/// floor's CPU per lifecycle.
pub const TARGET_SERVER_TO_FLOOR: f64 = 2.0;

/// The floor's closed loop of lifecycles at one client count.
pub struct FloorRun {
    /// Clients, each with its own HTTP/2 connection.
    pub clients: usize,
    /// The lifecycle run, its CPU figures those of the floor's process (as `server`) and of
    /// the benchmark's clients.
    pub lifecycle: RunResult,
}

impl FloorRun {
    /// The floor's CPU milliseconds per lifecycle, if measured.
    pub fn floor_ms(&self) -> Option<f64> {
        cpu_ms(Some(&self.lifecycle), "server_ms_per_op")
    }

    /// The benchmark clients' CPU milliseconds per lifecycle in the floor run, if measured.
    pub fn clients_ms(&self) -> Option<f64> {
        cpu_ms(Some(&self.lifecycle), "clients_ms_per_op")
    }

    /// The journal's server's CPU per lifecycle (in `server`, its lifecycle run at the same
    /// client count) divided by the floor's.
    pub fn server_to_floor(&self, server: Option<&RunResult>) -> Option<f64> {
        let floor = self.floor_ms()?;
        cpu_ms(server, "server_ms_per_op").map(|server| server / floor)
    }

    /// The run for the report, with the journal's server's figure (`server`) beside it.
    pub fn to_json(&self, server: Option<&RunResult>) -> Value {
        json!({
            "clients": self.clients,
            "lifecycle": self.lifecycle.to_json(),
            "floor_cpu_ms_per_lifecycle": self.floor_ms(),
            "clients_cpu_ms_per_lifecycle": self.clients_ms(),
            "server_cpu_ms_per_lifecycle": cpu_ms(server, "server_ms_per_op"),
            "server_to_floor": self.server_to_floor(server),
        })
    }
}

/// Every floor run for the report, each with the journal's server's CPU per lifecycle at
/// the same client count: `server` at `clients`, `high` at the other.
pub fn report(
    floors: &[FloorRun],
    (clients, server): (usize, &RunResult),
    high: Option<&RunResult>,
) -> Value {
    floors
        .iter()
        .map(|floor| {
            floor.to_json(if floor.clients == clients {
                Some(server)
            } else {
                high
            })
        })
        .collect()
}

/// A positive figure `field` of a run's CPU figures.
fn cpu_ms(run: Option<&RunResult>, field: &str) -> Option<f64> {
    run.and_then(|run| run.cpu.as_ref())
        .and_then(|cpu| cpu[field].as_f64())
        .filter(|ms| *ms > 0.0)
}

/// Starts `opjournal-grpc-floor` (beside this binary, its log in `dir`), runs the closed
/// loop of new-key lifecycles from `clients` clients for `warmup + duration` and measures
/// the floor's CPU over it; stops the floor.
///
/// Errors: the floor cannot be started or connected to.
pub async fn run(
    clients: usize,
    warmup: Duration,
    duration: Duration,
    run_id: &str,
    dir: &Path,
) -> anyhow::Result<FloorRun> {
    let dir = dir.join(format!("floor-{clients}"));
    std::fs::create_dir_all(&dir)?;
    let (mut floor, address) = Process::start(
        "opjournal-grpc-floor",
        &["--listen", "127.0.0.1:0"],
        &[],
        "listening on ",
        &dir,
    )
    .await?;
    let measured = async {
        let channels = load::connect_all(&address, clients).await?;
        eprintln!("[bench] gRPC floor: lifecycle, {clients} clients");
        let pid = floor.id();
        let before = cpu::Snapshot::take(pid);
        let tag: Arc<str> = format!("{run_id}floor{clients}").into();
        let mut lifecycle = load::closed_loop(
            "lifecycle",
            &channels,
            warmup,
            duration,
            crate::new_key_lifecycles(tag, "l"),
        )
        .await;
        lifecycle.cpu = Some(before.since(&cpu::Snapshot::take(pid), lifecycle.all_calls));
        anyhow::Ok(FloorRun { clients, lifecycle })
    }
    .await;
    floor.stop().await;
    measured
}

/// The floor's rows under a journal run's (`server`, its lifecycle run at the same client
/// count): the floor's throughput and latencies, its CPU and the clients' per lifecycle, and
/// the server's CPU as a multiple of the floor's.
pub fn print(floor: &FloorRun, server: &RunResult) {
    crate::print_row(
        "gRPC floor: lifecycle, answered from memory",
        &floor.lifecycle,
        "lifecycle",
        None,
    );
    let ms = |value: Option<f64>| value.map_or_else(|| "-".to_owned(), |v| format!("{v:.3}"));
    println!(
        "  CPU ms per lifecycle on the gRPC floor: floor {}, benchmark clients {}",
        ms(floor.floor_ms()),
        ms(floor.clients_ms()),
    );
    println!(
        "  {:<42} {:>10}",
        "server / gRPC floor, CPU per lifecycle",
        crate::fmt_ms(floor.server_to_floor(Some(server)))
    );
    if let Some(error) = &floor.lifecycle.first_error {
        println!("  ! gRPC floor: {error}");
    }
}

/// The floor's targets, at `clients` and at `high_clients`: the journal's server's CPU per
/// lifecycle (`server`, `high`: its lifecycle runs there) at most
/// [`TARGET_SERVER_TO_FLOOR`] times the floor's. Unmeasured where a run was skipped.
pub fn targets(
    floors: &[FloorRun],
    (clients, server): (usize, &RunResult),
    (high_clients, high): (usize, Option<&RunResult>),
) -> Vec<Target> {
    let ratio = |count: usize, server: Option<&RunResult>| {
        floors
            .iter()
            .find(|floor| floor.clients == count)
            .and_then(|floor| floor.server_to_floor(server))
    };
    [(clients, Some(server)), (high_clients, high)]
        .into_iter()
        .map(|(count, server)| {
            Target::new(
                Some(1),
                format!("server CPU per lifecycle / gRPC floor's, {count} clients"),
                ratio(count, server),
                "<= 2",
                |v| v <= TARGET_SERVER_TO_FLOOR,
            )
        })
        .collect()
}
