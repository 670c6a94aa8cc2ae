//! The poll loop the reconcile worker and the webhook delivery share: a round, then a pause
//! (none after a full batch, the poll interval after a partial one, at least a second after
//! a store outage, which is logged and waited out), until shutdown.

use std::future::Future;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::store::StoreError;

/// One kind of background work, polled in rounds.
pub(crate) trait Rounds {
    /// Does one round; `Ok(true)` when it took a full batch, so that the next one starts at
    /// once. Errors: the store is unavailable.
    fn round(&mut self) -> impl Future<Output = Result<bool, StoreError>> + Send;
}

/// Runs `rounds` every `interval` until `shutdown` is cancelled; the round in progress
/// finishes first. A failed round is logged, naming the `work` (`reconcile`, `webhook
/// delivery`) and carrying the database's message and SQLSTATE in `error`, and retried after
/// at least a second: a warning while the store is unavailable, an error for anything else
/// (a missing table, a refused statement), which waiting alone will not mend.
pub(crate) async fn poll_until(
    shutdown: &CancellationToken,
    interval: Duration,
    work: &'static str,
    mut rounds: impl Rounds,
) {
    while !shutdown.is_cancelled() {
        let pause = match rounds.round().await {
            Ok(true) => Duration::ZERO,
            Ok(false) => interval,
            Err(error @ StoreError::Unavailable(_)) => {
                tracing::warn!(error = %error, "store unavailable for {work}; retrying");
                interval.max(Duration::from_secs(1))
            }
            Err(error @ StoreError::Other(_)) => {
                tracing::error!(error = %error, "database error in {work}; retrying");
                interval.max(Duration::from_secs(1))
            }
        };
        tokio::select! {
            () = shutdown.cancelled() => break,
            () = tokio::time::sleep(pause) => {}
        }
    }
}
