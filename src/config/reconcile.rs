//! `[reconcile]`: the reconcile worker's polls, its probes and metrics, and retention purges.

use std::net::SocketAddr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{ConfigError, duration, positive};

/// `[reconcile]` settings, read by `opjournal-reconciler` (and `opjournal purge`).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default)]
pub struct ReconcileSettings {
    /// Time between polls when idle.
    #[serde(with = "duration")]
    pub poll_interval: Duration,
    /// Operations claimed per poll.
    pub batch_size: i64,
    /// Lookups running at once.
    pub concurrency: usize,
    /// Time a claimed operation stays hidden from other replicas.
    #[serde(with = "duration")]
    pub claim_hold: Duration,
    /// gRPC health listen address (`liveness`, `readiness`; `--health-listen`).
    pub health_listen: SocketAddr,
    /// The admin HTTP address serving Prometheus metrics at `/metrics`
    /// (`--metrics-listen`).
    pub metrics_listen: SocketAddr,
    /// Time between samples of the backlog gauges (unknown operations, the oldest one's age,
    /// those past their deadline, the review queue and its longest wait); one indexed query
    /// per sample.
    #[serde(with = "duration")]
    pub backlog_sample_interval: Duration,
    /// Time between purges of operations past retention.
    #[serde(with = "duration")]
    pub purge_interval: Duration,
    /// Operations deleted per purge statement.
    pub purge_batch_size: i64,
}

impl Default for ReconcileSettings {
    fn default() -> Self {
        Self {
            poll_interval: Duration::from_secs(1),
            batch_size: 50,
            concurrency: 8,
            claim_hold: Duration::from_secs(60),
            health_listen: SocketAddr::from(([127, 0, 0, 1], 50052)),
            metrics_listen: SocketAddr::from(([127, 0, 0, 1], 9465)),
            backlog_sample_interval: Duration::from_secs(10),
            purge_interval: Duration::from_secs(300),
            purge_batch_size: 1000,
        }
    }
}

impl ReconcileSettings {
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        if self.batch_size < 1 || self.concurrency == 0 {
            return Err(ConfigError(
                "reconcile.batch_size, reconcile.concurrency: must be at least 1".into(),
            ));
        }
        if self.purge_batch_size < 1 {
            return Err(ConfigError(
                "reconcile.purge_batch_size: must be at least 1".into(),
            ));
        }
        positive("reconcile.poll_interval", self.poll_interval)?;
        positive("reconcile.claim_hold", self.claim_hold)?;
        positive("reconcile.purge_interval", self.purge_interval)?;
        positive(
            "reconcile.backlog_sample_interval",
            self.backlog_sample_interval,
        )
    }
}
