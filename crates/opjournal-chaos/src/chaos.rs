//! The process and network faults, injected one after another while the agents run: every
//! kind once per cycle, in a shuffled order, with a short pause between two.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::seq::SliceRandom as _;
use rand::{Rng as _, SeedableRng as _};
use serde::Serialize;

use crate::stand::{Stand, restart};

/// A process or network fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Chaos {
    /// SIGKILL a server replica, start it again a second later.
    KillServer,
    /// SIGTERM a server replica (graceful drain), start it again.
    StopServer,
    /// SIGKILL a reconcile worker, start it again a second later.
    KillWorker,
    /// SIGTERM a reconcile worker, start it again.
    StopWorker,
    /// Stop Postgres cleanly (`pg_ctl stop -m fast`) for two seconds.
    StopPostgres,
    /// SIGKILL the postmaster; start Postgres again (crash recovery) a second later.
    KillPostmaster,
    /// 200 ms on every chunk between the clients and one replica, for three seconds.
    ClientLatency,
    /// Nothing moves between the clients and one replica for two seconds.
    ClientStall,
    /// Every connection between the clients and one replica is reset.
    ClientReset,
    /// 50 ms on every chunk between one replica and Postgres, for three seconds.
    DbLatency,
    /// Nothing moves between one replica and Postgres for two seconds.
    DbStall,
    /// Every connection between one replica and Postgres is reset.
    DbReset,
    /// One replica is cut off from the clients and from Postgres for four seconds.
    Partition,
}

impl Chaos {
    /// Every kind.
    pub const ALL: [Self; 13] = [
        Self::KillServer,
        Self::StopServer,
        Self::KillWorker,
        Self::StopWorker,
        Self::StopPostgres,
        Self::KillPostmaster,
        Self::ClientLatency,
        Self::ClientStall,
        Self::ClientReset,
        Self::DbLatency,
        Self::DbStall,
        Self::DbReset,
        Self::Partition,
    ];
}

/// Injects faults until `until` has passed and at least one full cycle is done; every fault
/// is lifted before the next. Returns how many of each were injected.
///
/// Errors: a process that does not come back.
pub async fn run(
    stand: &mut Stand,
    until: Instant,
    seed: u64,
) -> anyhow::Result<BTreeMap<Chaos, u64>> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut counts = BTreeMap::new();
    let mut cycle_done = false;
    loop {
        let mut order = Chaos::ALL.to_vec();
        order.shuffle(&mut rng);
        for kind in order {
            if cycle_done && Instant::now() >= until {
                return Ok(counts);
            }
            let replica = rng.random_range(0..stand.servers.len());
            inject(stand, kind, replica).await?;
            *counts.entry(kind).or_default() += 1;
            tokio::time::sleep(Duration::from_millis(rng.random_range(300..1000))).await;
        }
        cycle_done = true;
        if Instant::now() >= until {
            return Ok(counts);
        }
    }
}

async fn inject(stand: &mut Stand, kind: Chaos, replica: usize) -> anyhow::Result<()> {
    tracing::info!(?kind, replica, "injecting");
    let seconds = Duration::from_secs;
    match kind {
        Chaos::KillServer | Chaos::StopServer => {
            let server = &mut stand.servers[replica];
            if kind == Chaos::KillServer {
                server.kill().await;
                tokio::time::sleep(seconds(1)).await;
            } else {
                server.terminate().await;
            }
            restart(server).await?;
        }
        Chaos::KillWorker | Chaos::StopWorker => {
            let count = stand.workers.len();
            let worker = &mut stand.workers[replica % count];
            if kind == Chaos::KillWorker {
                worker.kill().await;
                tokio::time::sleep(seconds(1)).await;
            } else {
                worker.terminate().await;
            }
            restart(worker).await?;
        }
        Chaos::StopPostgres | Chaos::KillPostmaster => {
            let Some(postgres) = &stand.postgres else {
                return Ok(());
            };
            if kind == Chaos::StopPostgres {
                postgres.stop().await?;
                tokio::time::sleep(seconds(2)).await;
            } else {
                postgres.kill_postmaster()?;
                tokio::time::sleep(seconds(1)).await;
            }
            postgres.start().await?;
        }
        Chaos::ClientLatency | Chaos::DbLatency => {
            let (proxy, latency) = if kind == Chaos::ClientLatency {
                (&stand.client_proxies[replica], Duration::from_millis(200))
            } else {
                (&stand.db_proxies[replica], Duration::from_millis(50))
            };
            proxy.set_latency(latency);
            tokio::time::sleep(seconds(3)).await;
            proxy.set_latency(Duration::ZERO);
        }
        Chaos::ClientStall | Chaos::DbStall => {
            let proxy = if kind == Chaos::ClientStall {
                &stand.client_proxies[replica]
            } else {
                &stand.db_proxies[replica]
            };
            proxy.set_stalled(true);
            tokio::time::sleep(seconds(2)).await;
            proxy.set_stalled(false);
        }
        Chaos::ClientReset => stand.client_proxies[replica].reset(),
        Chaos::DbReset => stand.db_proxies[replica].reset(),
        Chaos::Partition => {
            let (clients, db) = (&stand.client_proxies[replica], &stand.db_proxies[replica]);
            clients.set_stalled(true);
            db.set_stalled(true);
            tokio::time::sleep(seconds(4)).await;
            clients.set_stalled(false);
            db.set_stalled(false);
        }
    }
    Ok(())
}
