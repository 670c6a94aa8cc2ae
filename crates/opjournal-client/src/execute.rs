//! [`JournalClient::execute`]: the source article's `executeOperation` (step 6), done once,
//! correctly, for every orchestrator written in Rust.
//!
//! Why each step is the way it is:
//! - Only `EXECUTE` allows the provider call. A replay returns the stored outcome; another
//!   holder's live lease and an unknown outcome are answers, not errors, and call nothing.
//!   Both may be waited out up to a caller's deadline ([`ExecuteOptions`]).
//! - The lease is renewed while the provider call runs, so a long call is not taken over.
//!   If a renewal is refused with `LEASE_LOST`, someone else now holds the operation: the
//!   call sees it through [`ProviderCall::lease_lost`] and should stop if it still can.
//! - A Begin whose answer was lost is sent again with the same attempt id (one random id per
//!   `execute` call): the journal answers the repeat with the lease it already granted, so
//!   the call still runs at that attempt instead of meeting its own lease as `IN_PROGRESS`
//!   and, once it ended, needing verification of a call that never happened.
//! - The provider is called only inside the lease: the lease's end is measured on this
//!   side's monotonic clock from the moment the Begin that got it was sent (the granted
//!   length, `lease_until - updated_at` on the database clock, needs no clock sync). A Begin
//!   answer that arrives after that end calls nothing and is the typed
//!   [`ErrorReason::LeaseExpiredBeforeCall`]; otherwise the call is cut off at the lease's
//!   end, pushed back by each renewal, and its outcome is unknown (`lease_expired`).
//! - A report whose answer was lost (unreachable server, `CANCELLED`, a missed deadline) is
//!   repeated with the same fencing token and the same outcome: the server answers a repeat
//!   with the record it already holds, so repeating is safe, and giving up would leave an
//!   effect the journal does not know of.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::time::{Duration, Instant};

use backon::Retryable as _;
use futures::FutureExt as _;
use tokio::sync::watch;
use tonic::Code;

use crate::client::{JournalClient, repeat_backoff};
use crate::error::{ClientError, ErrorReason};
use crate::executed::Executed;
use crate::intent::{AttemptId, Begun, Intent, Lease};
use crate::proto::Operation;
use crate::provider::ProviderOutcome;

/// How often a lease is renewed while the provider call runs, as a fraction of its length.
const RENEW_FRACTION: u32 = 3;
/// The error code recorded when the journal refused the report of a success (the effect
/// happened; reconciliation settles it).
pub const RESULT_REFUSED: &str = "result_refused";
/// The error code recorded when the provider call was cut off at the end of its lease.
pub const LEASE_EXPIRED: &str = "lease_expired";
/// The first and the longest pause between two Begins while waiting.
const FIRST_POLL: Duration = Duration::from_millis(200);
const LONGEST_POLL: Duration = Duration::from_secs(2);

/// How [`JournalClient::execute_with`] treats answers that call nothing. The default waits
/// for nothing: `IN_PROGRESS` and `VERIFICATION_REQUIRED` are returned at once. While
/// waiting, a Begin that gets no answer (a transient error) does not end the wait; the last
/// answer stands.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ExecuteOptions {
    /// How long to wait, from the start of the call, while another holder's lease is live:
    /// Begin is asked again with backoff (200 ms doubling to 2 s), never later than the
    /// `retry_after` the server gave, until another decision or the deadline. Then
    /// [`Executed::InProgress`].
    pub in_progress_wait: Duration,
    /// How long to wait, from the start of the call, for the reconciler to settle an
    /// `unknown` operation: Begin is asked again with the same backoff until it replays the
    /// settled outcome, allows a new attempt (the effect was proven absent), or the
    /// deadline passes. Then [`Executed::VerificationRequired`].
    pub settle_wait: Duration,
}

impl ExecuteOptions {
    /// Options that wait for nothing.
    pub fn new() -> Self {
        Self::default()
    }

    /// The same options waiting up to `deadline` for another holder's lease.
    #[must_use]
    pub fn wait_in_progress(mut self, deadline: Duration) -> Self {
        self.in_progress_wait = deadline;
        self
    }

    /// The same options waiting up to `deadline` for an unknown outcome to be settled.
    #[must_use]
    pub fn wait_settled(mut self, deadline: Duration) -> Self {
        self.settle_wait = deadline;
        self
    }
}

/// What [`JournalClient::execute`] hands the provider call.
#[derive(Debug, Clone)]
pub struct ProviderCall {
    /// The idempotency key to send to the provider (the operation key, prefixed by the
    /// namespace outside `default`).
    pub provider_key: String,
    /// The journal's idempotency key.
    pub operation_key: String,
    /// The lease number (1 for the first attempt).
    pub attempt: i32,
    lease_lost: watch::Receiver<bool>,
    lease_end: watch::Receiver<Instant>,
}

impl ProviderCall {
    /// Whether a lease renewal was refused with `LEASE_LOST`: another holder now owns the
    /// operation, and this call's report will be refused.
    pub fn is_lease_lost(&self) -> bool {
        *self.lease_lost.borrow()
    }

    /// How long until the lease ends unless it is renewed (zero once it has): the Begin's
    /// send time plus the length granted, moved on by each renewal. The call is dropped at
    /// that end; give the provider request a timeout no longer than this.
    pub fn lease_remaining(&self) -> Duration {
        self.lease_end
            .borrow()
            .saturating_duration_since(Instant::now())
    }

    /// Resolves when a lease renewal is refused with `LEASE_LOST` (never, if the lease
    /// holds). Race it against the provider call (`tokio::select!`) to stop work that has
    /// not reached the provider yet. The future owns what it needs: it may be spawned.
    pub fn lease_lost(&self) -> impl Future<Output = ()> + Send + 'static {
        let mut lost = self.lease_lost.clone();
        async move {
            if lost.wait_for(|lost| *lost).await.is_err() {
                // The call is over and the lease never got lost.
                std::future::pending::<()>().await;
            }
        }
    }
}

impl JournalClient {
    /// The source article's `executeOperation` with [`ExecuteOptions::default`]: waits for
    /// nothing. See [`Self::execute_with`].
    pub async fn execute<F, Fut>(&self, intent: Intent, call: F) -> Result<Executed, ClientError>
    where
        F: FnOnce(ProviderCall) -> Fut,
        Fut: Future<Output = ProviderOutcome>,
    {
        self.execute_with(intent, &ExecuteOptions::default(), call)
            .await
    }

    /// Begins the intent; on `EXECUTE` runs `call` with the key the provider must receive,
    /// renewing the lease every third of its length while the call runs, and records what
    /// `call` says happened; on `REPLAY` returns the stored outcome without calling;
    /// `IN_PROGRESS` and `VERIFICATION_REQUIRED` are waited out as `options` say.
    ///
    /// `call` must classify honestly: [`ProviderOutcome::Rejected`] only when the provider
    /// confirmed that nothing happened; a timeout, a reset, a 5xx or an answer it cannot
    /// read is [`ProviderOutcome::Uncertain`] (a `Result<ProviderSuccess, ProviderError>`
    /// converts with `.into()` under the safe default). A panic inside `call` is reported
    /// as uncertain (`error_code` `client_panic`) and then resumed. If the `execute` future
    /// is dropped mid-call nothing is reported: the lease ends and the operation needs
    /// verification, exactly as after a crash.
    ///
    /// A report whose answer is lost is repeated with the same token and outcome, with
    /// backoff, for up to [`Self::with_report_retry`]'s bound (30 s by default).
    ///
    /// Errors: those of [`Self::begin`]; `ABORTED`/[`ErrorReason::LeaseLost`] when the lease
    /// was taken over while `call` ran (this holder's outcome is not recorded; the effect,
    /// if any, is settled by whoever holds the operation now or by reconciliation; begin
    /// the same intent again to see where it stands); a report still unanswered at the
    /// bound (its transient error).
    ///
    /// [`ProviderSuccess`]: crate::ProviderSuccess
    /// [`ProviderError`]: crate::ProviderError
    pub async fn execute_with<F, Fut>(
        &self,
        intent: Intent,
        options: &ExecuteOptions,
        call: F,
    ) -> Result<Executed, ClientError>
    where
        F: FnOnce(ProviderCall) -> Fut,
        Fut: Future<Output = ProviderOutcome>,
    {
        let (begun, sent_at) = self.begin_waiting(&intent, options).await?;
        let (operation, lease) = match begun {
            Begun::Execute { operation, lease } => (operation, lease),
            Begun::Replay(operation) => return Ok(Executed::from_terminal(operation, true)),
            Begun::InProgress {
                operation,
                retry_after,
            } => {
                return Ok(Executed::InProgress {
                    operation,
                    retry_after,
                });
            }
            Begun::VerificationRequired(operation) => {
                return Ok(Executed::VerificationRequired { operation });
            }
            Begun::DuplicateIntentSuspected {
                duplicate_of_operation_key,
            } => {
                return Ok(Executed::DuplicateIntentSuspected {
                    duplicate_of_operation_key,
                });
            }
        };
        let length = lease_length(&operation);
        let lease_end = sent_at + length;
        if Instant::now() >= lease_end {
            // The answer came after the lease it grants had ended: another holder may
            // already have it, so the provider is not called and nothing is reported.
            return Err(ClientError::lease_expired_before_call(length));
        }
        let (end_tx, end_rx) = watch::channel(lease_end);
        let (lost_tx, lost_rx) = watch::channel(false);
        let provider_call = ProviderCall {
            provider_key: operation.provider_key.clone(),
            operation_key: operation.operation_key.clone(),
            attempt: operation.attempt_count,
            lease_lost: lost_rx,
            lease_end: end_rx.clone(),
        };
        let outcome = {
            let call = AssertUnwindSafe(call(provider_call)).catch_unwind();
            let renewals = self.renew_until_dropped(&lease, length, &lost_tx, &end_tx);
            let expiry = lease_expiry(end_rx);
            futures::pin_mut!(call, renewals, expiry);
            tokio::select! {
                outcome = &mut call => outcome,
                // Renewing never ends by itself.
                () = &mut renewals => (&mut call).await,
                () = &mut expiry => {
                    tracing::warn!("the provider call outlived its lease; cut off as unknown");
                    Ok(ProviderOutcome::Uncertain {
                        error_code: Some(LEASE_EXPIRED.to_owned()),
                    })
                }
            }
        };
        let outcome = match outcome {
            Ok(outcome) => outcome,
            Err(panic) => {
                // The provider may have acted before the panic: that is an unknown outcome.
                let _ = self
                    .report_with_retry(|| self.report_unknown(&lease, Some("client_panic")))
                    .await;
                std::panic::resume_unwind(panic);
            }
        };
        self.report(&lease, outcome).await
    }

    /// Records `outcome` with `lease`, repeating a report whose answer was lost.
    async fn report(
        &self,
        lease: &Lease,
        outcome: ProviderOutcome,
    ) -> Result<Executed, ClientError> {
        match outcome {
            ProviderOutcome::Succeeded {
                external_id,
                result,
            } => {
                let completed = self
                    .report_with_retry(|| {
                        self.complete(lease, external_id.as_deref(), result.as_ref())
                    })
                    .await;
                match completed {
                    Ok(operation) => Ok(Executed::Succeeded {
                        operation,
                        replayed: false,
                    }),
                    // The effect happened, but the journal refused this report of it (a
                    // result over the action's limit, a malformed external id): what is
                    // known is that the outcome must be verified, never that nothing ran.
                    Err(refused) if refused.code == Code::InvalidArgument => {
                        tracing::warn!(
                            reason = %refused.reason,
                            "the journal refused the report of a success; reporting it unknown"
                        );
                        let operation = self
                            .report_with_retry(|| self.report_unknown(lease, Some(RESULT_REFUSED)))
                            .await?;
                        Ok(Executed::VerificationRequired { operation })
                    }
                    Err(error) => Err(error),
                }
            }
            ProviderOutcome::Rejected { error_code } => {
                let operation = self
                    .report_with_retry(|| self.fail(lease, &error_code))
                    .await?;
                Ok(Executed::FailedFinal {
                    operation,
                    replayed: false,
                })
            }
            ProviderOutcome::Uncertain { error_code } => {
                let operation = self
                    .report_with_retry(|| self.report_unknown(lease, error_code.as_deref()))
                    .await?;
                Ok(Executed::VerificationRequired { operation })
            }
        }
    }

    /// Begins `intent`, asking again while the answer is one `options` wait for. Every
    /// Begin of this call carries the same attempt id: the call runs the provider at most
    /// once, after the one `EXECUTE` it receives, so a repeat that gets a lease back only
    /// ever replaces an answer that never arrived.
    ///
    /// Also returns when the Begin that may have been granted the answer's lease was sent:
    /// the first Begin sent since the last one answered (a repeat after a lost answer gets
    /// the lease granted to the first).
    async fn begin_waiting(
        &self,
        intent: &Intent,
        options: &ExecuteOptions,
    ) -> Result<(Begun, Instant), ClientError> {
        let started = Instant::now();
        let attempt = AttemptId::random();
        let mut poll = FIRST_POLL;
        let mut previous = None;
        let mut unanswered_since = None;
        loop {
            let sent_at = *unanswered_since.get_or_insert_with(Instant::now);
            let begun = match (self.begin_as(intent, &attempt).await, previous.take()) {
                (Ok(begun), _) => {
                    unanswered_since = None;
                    begun
                }
                // While waiting, a Begin without an answer leaves the last answer standing.
                (Err(err), Some(previous)) if err.is_transient() => previous,
                (Err(err), _) => return Err(err),
            };
            let (deadline, retry_after) = match &begun {
                Begun::InProgress { retry_after, .. } => {
                    (options.in_progress_wait, Some(*retry_after))
                }
                Begun::VerificationRequired(_) => (options.settle_wait, None),
                _ => return Ok((begun, sent_at)),
            };
            let left = deadline.saturating_sub(started.elapsed());
            if left.is_zero() {
                return Ok((begun, sent_at));
            }
            let mut pause = poll.min(left);
            if let Some(retry_after) = retry_after {
                pause = pause.min(retry_after.max(Duration::from_millis(50)));
            }
            tokio::time::sleep(pause).await;
            poll = (poll * 2).min(LONGEST_POLL);
            previous = Some(begun);
        }
    }

    /// Renews `lease` every third of `length`; never returns. Each renewal moves `end` to
    /// when it was sent plus the length granted; a lost lease stops renewing and raises
    /// `lost`; a transient failure is tried again at the next tick.
    async fn renew_until_dropped(
        &self,
        lease: &Lease,
        length: Duration,
        lost: &watch::Sender<bool>,
        end: &watch::Sender<Instant>,
    ) {
        let every = (length / RENEW_FRACTION).max(Duration::from_millis(500));
        loop {
            tokio::time::sleep(every).await;
            let sent_at = Instant::now();
            match self.renew(lease, length).await {
                Ok(operation) => {
                    end.send_replace(sent_at + lease_length(&operation));
                }
                Err(err) if err.reason == ErrorReason::LeaseLost => {
                    tracing::warn!(reason = %err.reason, "lease lost while the provider call ran");
                    lost.send_replace(true);
                    std::future::pending::<()>().await;
                }
                Err(err) => {
                    tracing::warn!(code = ?err.code, reason = %err.reason, "lease renewal failed; will try again")
                }
            }
        }
    }

    /// Sends `report` until it is answered, repeating it while the error is transient for
    /// up to the client's report bound (each try has the call deadline).
    async fn report_with_retry<'a, Fut>(
        &'a self,
        report: impl FnMut() -> Fut,
    ) -> Result<Operation, ClientError>
    where
        Fut: Future<Output = Result<Operation, ClientError>> + 'a,
    {
        let started = Instant::now();
        let bound = self.report_retry_for;
        report
            .retry(repeat_backoff(bound))
            // No repeat starts once the bound has passed, however long each try took.
            .when(|err| err.is_transient() && started.elapsed() < bound)
            .notify(|err, _| {
                tracing::warn!(code = ?err.code, reason = %err.reason, "report unanswered; repeating it");
            })
            .await
    }
}

/// Resolves once the instant in `end` has passed (it may move later while waiting).
async fn lease_expiry(mut end: watch::Receiver<Instant>) {
    loop {
        let at = *end.borrow_and_update();
        tokio::select! {
            () = tokio::time::sleep_until(at.into()) => {
                let moved_to = *end.borrow();
                if moved_to <= Instant::now() {
                    return;
                }
            }
            changed = end.changed() => {
                if changed.is_err() {
                    let at = *end.borrow();
                    tokio::time::sleep_until(at.into()).await;
                    return;
                }
            }
        }
    }
}

/// The lease length the server granted, from two database-clock timestamps.
fn lease_length(operation: &Operation) -> Duration {
    match (&operation.lease_until, &operation.updated_at) {
        (Some(until), Some(from)) => {
            let millis = (until.seconds - from.seconds) * 1000
                + i64::from(until.nanos - from.nanos) / 1_000_000;
            Duration::from_millis(u64::try_from(millis).unwrap_or(0)).max(Duration::from_secs(1))
        }
        _ => Duration::from_secs(30),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn the_lease_length_comes_from_database_timestamps() {
        let operation = Operation {
            updated_at: Some(prost_types::Timestamp {
                seconds: 100,
                nanos: 500_000_000,
            }),
            lease_until: Some(prost_types::Timestamp {
                seconds: 130,
                nanos: 500_000_000,
            }),
            ..Operation::default()
        };
        assert_eq!(lease_length(&operation), Duration::from_secs(30));
    }

    #[tokio::test]
    async fn the_lease_lost_signal_fires_once_raised_and_never_otherwise() {
        let (tx, rx) = watch::channel(false);
        let call = ProviderCall {
            provider_key: "k".into(),
            operation_key: "k".into(),
            attempt: 1,
            lease_lost: rx,
            lease_end: watch::channel(Instant::now()).1,
        };
        let waiting = tokio::spawn(call.lease_lost());
        assert!(!call.is_lease_lost());
        tx.send_replace(true);
        tokio::time::timeout(Duration::from_secs(1), waiting)
            .await
            .unwrap()
            .unwrap();
        assert!(call.is_lease_lost());

        let (tx, rx) = watch::channel(false);
        let call = ProviderCall {
            lease_lost: rx,
            ..call
        };
        drop(tx);
        let never = tokio::time::timeout(Duration::from_millis(50), call.lease_lost()).await;
        assert!(never.is_err(), "a lease that was not lost never signals");
    }
}
