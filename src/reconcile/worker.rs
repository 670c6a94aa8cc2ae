//! The reconcile worker loop: sweep expired leases into `unknown`, claim due operations, look
//! each up once. Any number of replicas may run: a claim is one statement that pushes the
//! next check past a hold time (with `FOR UPDATE SKIP LOCKED` on Postgres; under SQLite's
//! single write lock on the embedded file), so two replicas never look one operation up at
//! once.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::adapter::SetupError;
use super::poll::{Rounds, poll_until};
use super::{ReconcileAction, Reconciler};
use crate::store::{JournalStore, StoreError};

/// Deletes terminal operations past their retention in batches of `batch_size`, at most
/// `max_batches` statements (each its own short transaction); returns how many went.
///
/// Errors: the store is unavailable.
pub async fn purge(
    store: &dyn JournalStore,
    batch_size: i64,
    max_batches: u32,
) -> Result<u64, StoreError> {
    in_batches(batch_size, max_batches, |n| store.purge(n)).await
}

/// Runs `purge` with `batch_size` until a batch comes back short, at most `max_batches`
/// times; returns the total.
async fn in_batches<F: Future<Output = Result<u64, StoreError>>>(
    batch_size: i64,
    max_batches: u32,
    mut purge: impl FnMut(i64) -> F,
) -> Result<u64, StoreError> {
    let mut total = 0;
    for _ in 0..max_batches {
        let purged = purge(batch_size).await?;
        total += purged;
        if purged < u64::try_from(batch_size).unwrap_or(0) {
            break;
        }
    }
    Ok(total)
}

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
    /// How often terminal operations past their retention are purged.
    pub purge_interval: Duration,
    /// Most operations deleted per purge statement.
    pub purge_batch_size: i64,
}

impl Default for WorkerConfig {
    fn default() -> Self {
        Self {
            poll_interval: Duration::from_secs(1),
            batch_size: 50,
            concurrency: 8,
            claim_hold: Duration::from_secs(60),
            purge_interval: Duration::from_secs(300),
            purge_batch_size: 1000,
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

    /// Checks that the claim hold outlasts the slowest lookup of `policy` (with margin), so
    /// that a claimed operation is never claimed again while its lookup runs.
    ///
    /// Errors: a message naming `reconcile_claim_hold_seconds`.
    pub fn check_claim_hold(
        &self,
        policy: &crate::domain::policy::Policy,
    ) -> Result<(), SetupError> {
        let needed = policy.longest_lookup_timeout() * 2;
        if self.config.claim_hold < needed {
            return Err(SetupError::setting(
                "reconcile_claim_hold_seconds",
                format_args!(
                    "{} s is shorter than twice the slowest adapter timeout ({} s)",
                    self.config.claim_hold.as_secs_f64(),
                    needed.as_secs_f64()
                ),
            ));
        }
        Ok(())
    }

    /// One poll: sweep, claim, look up. Errors only when the store cannot be reached.
    pub async fn tick(&self) -> Result<TickStats, StoreError> {
        let mut stats = TickStats {
            swept: self
                .reconciler
                .sweep_expired_leases(self.config.batch_size)
                .await?,
            ..TickStats::default()
        };
        // Claim only as many as run at once: a claimed operation is looked up at once, so the
        // claim hold only has to outlast one lookup, never a queue of them.
        let chunk = i64::try_from(self.config.concurrency.max(1)).unwrap_or(i64::MAX);
        let mut results = Vec::new();
        let mut claimed = 0;
        while claimed < self.config.batch_size {
            let due = self
                .reconciler
                .claim_due(
                    chunk.min(self.config.batch_size - claimed),
                    self.config.claim_hold,
                )
                .await?;
            if due.is_empty() {
                break;
            }
            claimed += i64::try_from(due.len()).unwrap_or(i64::MAX);
            let reconciled: Vec<_> = futures::future::join_all(
                due.into_iter()
                    .map(|record| self.reconciler.reconcile_claimed(record)),
            )
            .await;
            results.extend(reconciled);
        }
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

    /// Purges terminal operations past their retention, in batches of `purge_batch_size`,
    /// at most `max_batches` statements; returns how many went.
    pub async fn purge(&self, max_batches: u32) -> Result<u64, StoreError> {
        let reconciler = &self.reconciler;
        in_batches(self.config.purge_batch_size, max_batches, |n| {
            reconciler.purge(n)
        })
        .await
    }

    /// Polls until `shutdown` is cancelled; a poll in progress finishes first. A database
    /// outage is logged and waited out. Purges every `purge_interval`.
    pub async fn run(&self, shutdown: CancellationToken) {
        let rounds = WorkerRounds {
            worker: self,
            last_purge: None,
            statistics: NewJournalStatistics::default(),
        };
        let interval = self.config.poll_interval;
        poll_until(&shutdown, interval, "reconcile", rounds).await;
    }
}

/// The worker's rounds: the new journal's statistics and the purge when due, then a tick.
struct WorkerRounds<'a> {
    worker: &'a Worker,
    last_purge: Option<std::time::Instant>,
    statistics: NewJournalStatistics,
}

impl Rounds for WorkerRounds<'_> {
    async fn round(&mut self) -> Result<bool, StoreError> {
        let worker = self.worker;
        self.statistics.check(&worker.reconciler).await;
        let purge_due = |at: std::time::Instant| at.elapsed() >= worker.config.purge_interval;
        if self.last_purge.is_none_or(purge_due) {
            match worker.purge(10).await {
                Ok(0) => {}
                Ok(purged) => tracing::info!(purged, "purged operations past retention"),
                Err(error) => tracing::warn!(error = %error, "purge failed; will retry"),
            }
            self.last_purge = Some(std::time::Instant::now());
        }
        let stats = worker.tick().await?;
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
        Ok(stats.looked_up as i64 >= worker.config.batch_size)
    }
}

/// Rows of a never-analyzed journal table that must have changed before the worker
/// analyzes it.
pub const NEW_TABLE_ANALYZE_CHANGES: i64 = 200;

/// How often the worker looks for journal tables without planner statistics.
const NEW_TABLE_CHECK_INTERVAL: Duration = Duration::from_secs(2);

/// Analyzes a new journal's tables as soon as they hold [`NEW_TABLE_ANALYZE_CHANGES`]
/// changes, so that its statements stop being planned without statistics well before
/// autovacuum's first round; stops looking once every table has statistics.
#[derive(Default)]
struct NewJournalStatistics {
    last_check: Option<std::time::Instant>,
    settled: bool,
}

impl NewJournalStatistics {
    async fn check(&mut self, reconciler: &Reconciler) {
        if self.settled
            || self
                .last_check
                .is_some_and(|at| at.elapsed() < NEW_TABLE_CHECK_INTERVAL)
        {
            return;
        }
        self.last_check = Some(std::time::Instant::now());
        match reconciler
            .analyze_new_tables(NEW_TABLE_ANALYZE_CHANGES)
            .await
        {
            Ok(None) => self.settled = true,
            Ok(Some(0)) => {}
            Ok(Some(tables)) => tracing::info!(tables, "analyzed new journal tables"),
            Err(error) => tracing::warn!(error = %error, "cannot analyze new journal tables"),
        }
    }
}
