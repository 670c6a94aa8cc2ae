//! The reconcile worker loop: sweep expired leases into `unknown`, claim due operations, look
//! each up once. Any number of replicas may run: claims use `FOR UPDATE SKIP LOCKED` and
//! push the next check past a hold time, so two replicas never look one operation up at once.

use std::time::Duration;

use futures::StreamExt as _;
use tokio_util::sync::CancellationToken;

use super::{ReconcileAction, Reconciler};
use crate::store::StoreError;

/// Worker settings.
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    /// Pause between polls when there was nothing to do.
    pub poll_interval: Duration,
    /// Most operations claimed per poll.
    pub batch_size: i64,
    /// Most lookups running at once.
    pub concurrency: usize,
    /// How long a claimed operation is hidden from other replicas (the reconcile lease);
    /// longer than the slowest lookup.
    pub claim_hold: Duration,
}

impl Default for WorkerConfig {
    fn default() -> Self {
        Self {
            poll_interval: Duration::from_secs(1),
            batch_size: 50,
            concurrency: 8,
            claim_hold: Duration::from_secs(60),
        }
    }
}

/// Counts from one poll.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TickStats {
    /// Expired leases moved to `unknown`.
    pub swept: u64,
    /// Operations looked up.
    pub looked_up: u64,
    /// Of those, settled as succeeded or failed.
    pub settled: u64,
    /// Of those, released for retry.
    pub released: u64,
    /// Of those, superseded by a concurrent change.
    pub superseded: u64,
    /// Of those, escalated to human review.
    pub escalated: u64,
    /// Of those, whose reconcile failed with an error (logged).
    pub errors: u64,
}

/// The worker.
pub struct Worker {
    reconciler: Reconciler,
    config: WorkerConfig,
}

impl Worker {
    /// A worker driving `reconciler`.
    pub fn new(reconciler: Reconciler, config: WorkerConfig) -> Self {
        Self { reconciler, config }
    }

    /// One poll: sweep, claim, look up. Errors only when the store cannot be reached.
    pub async fn tick(&self) -> Result<TickStats, StoreError> {
        let store = self.reconciler.store();
        let mut stats = TickStats {
            swept: store
                .sweep_expired_leases(self.config.batch_size, self.reconciler.actor())
                .await?,
            ..TickStats::default()
        };
        let due = store
            .claim_due(self.config.batch_size, self.config.claim_hold)
            .await?;
        let results: Vec<_> = futures::stream::iter(due)
            .map(|record| self.reconciler.reconcile_claimed(record))
            .buffer_unordered(self.config.concurrency.max(1))
            .collect()
            .await;
        for result in results {
            stats.looked_up += 1;
            match result {
                Ok(report) => match report.action {
                    ReconcileAction::MarkedSucceeded | ReconcileAction::MarkedFailed => {
                        stats.settled += 1;
                    }
                    ReconcileAction::ReleasedForRetry => stats.released += 1,
                    ReconcileAction::Superseded => stats.superseded += 1,
                    ReconcileAction::Escalated => stats.escalated += 1,
                    ReconcileAction::KeptUnknown => {}
                },
                Err(error) => {
                    stats.errors += 1;
                    tracing::warn!(error = %error, "reconcile attempt failed");
                }
            }
        }
        Ok(stats)
    }

    /// Polls until `shutdown` is cancelled; a poll in progress finishes first. A database
    /// outage is logged and waited out.
    pub async fn run(&self, shutdown: CancellationToken) {
        while !shutdown.is_cancelled() {
            let pause = match self.tick().await {
                Ok(stats) => {
                    if stats != TickStats::default() {
                        tracing::info!(
                            swept = stats.swept,
                            looked_up = stats.looked_up,
                            settled = stats.settled,
                            released = stats.released,
                            superseded = stats.superseded,
                            escalated = stats.escalated,
                            errors = stats.errors,
                            "reconcile poll"
                        );
                    }
                    if stats.looked_up as i64 >= self.config.batch_size {
                        Duration::ZERO
                    } else {
                        self.config.poll_interval
                    }
                }
                Err(error) => {
                    tracing::warn!(error = %error, "store unavailable; retrying");
                    self.config.poll_interval.max(Duration::from_secs(1))
                }
            };
            tokio::select! {
                () = shutdown.cancelled() => break,
                () = tokio::time::sleep(pause) => {}
            }
        }
    }
}
