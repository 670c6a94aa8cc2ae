//! Escalation webhooks: the reconcile worker's delivery loop for the escalation outbox.
//!
//! The journal writes an event into the outbox in the same transaction as each escalation
//! and resolution (`domain::escalation`), so an event exists as soon as its change is
//! visible, whether or not a worker runs. This loop claims due events with a short claim
//! lease, POSTs each with a timeout, signed the Standard Webhooks way, and records the
//! answer on the attempt it claimed: delivered on a 2xx, otherwise tried again after an
//! exponential backoff with jitter, or marked dead once the event is older than its max age.
//!
//! Delivery is at least once: a worker killed after the receiver's answer but before the
//! record sends the event again once its claim lease ends. Every attempt carries the same
//! event id (`webhook-id`) and body, so a receiver that de-duplicates by the id sees each
//! event exactly once. Nothing here logs the URL (an incoming-webhook URL is often itself a
//! secret), the secret or the operation's key.

use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use tokio_util::sync::CancellationToken;

use super::adapter::SetupError;
use super::poll::{Rounds, poll_until};
use crate::domain::escalation::{AfterFailure, RetrySchedule, WebhookSecret};
use crate::store::{DeliveryOutcome, JournalStore, OutboxEntry, StoreError};
use crate::telemetry::Metrics;

/// Where and how the events are sent.
#[derive(Debug, Clone)]
pub struct WebhookConfig {
    /// The receiver's URL (`http` or `https`); never logged.
    pub url: reqwest::Url,
    /// The signing secret.
    pub secret: WebhookSecret,
    /// Longest wait for one answer.
    pub timeout: Duration,
    /// How long a claimed event stays hidden from other workers; longer than `timeout`.
    pub claim_lease: Duration,
    /// Backoff, cap and max age of failed events.
    pub schedule: RetrySchedule,
    /// Pause between polls when nothing was due.
    pub poll_interval: Duration,
    /// Most events claimed (and sent at once) per poll.
    pub batch_size: i64,
    /// How often the outbox gauges are sampled.
    pub sample_interval: Duration,
}

/// Counts from one poll.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DeliveryStats {
    /// Events answered with a 2xx.
    pub delivered: u64,
    /// Events that failed and will be tried again.
    pub failed: u64,
    /// Events that failed past their max age.
    pub dead: u64,
    /// Answers not recorded because the claim had passed to another worker.
    pub superseded: u64,
}

impl DeliveryStats {
    fn attempts(&self) -> u64 {
        self.delivered + self.failed + self.dead + self.superseded
    }
}

/// The delivery loop.
pub struct WebhookDelivery {
    store: Arc<dyn JournalStore>,
    client: reqwest::Client,
    config: WebhookConfig,
    metrics: Metrics,
}

impl WebhookDelivery {
    /// A loop delivering `store`'s outbox as `config` says, counting in `metrics`.
    ///
    /// Errors: the HTTP client cannot be built (no TLS roots).
    pub fn new(
        store: Arc<dyn JournalStore>,
        config: WebhookConfig,
        metrics: Metrics,
    ) -> Result<Self, SetupError> {
        super::adapter::install_crypto_provider();
        let client = reqwest::Client::builder()
            .timeout(config.timeout)
            // A redirect is a failed attempt: the configured URL is the only receiver.
            .redirect(reqwest::redirect::Policy::none())
            .user_agent(concat!("opjournal/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| SetupError(format!("cannot build the webhook HTTP client: {e}")))?;
        Ok(Self {
            store,
            client,
            config,
            metrics,
        })
    }

    /// One poll: claims due events (up to the batch size), sends them at once, records each
    /// answer. Errors only when the store cannot be reached.
    pub async fn deliver_due(&self) -> Result<DeliveryStats, StoreError> {
        let claimed = self
            .store
            .claim_deliveries(self.config.batch_size, self.config.claim_lease)
            .await?;
        let sent = futures::future::join_all(claimed.iter().map(|entry| self.send(entry))).await;
        let mut stats = DeliveryStats::default();
        for (entry, outcome) in claimed.iter().zip(sent) {
            let name = match &outcome {
                DeliveryOutcome::Delivered { .. } => "delivered",
                DeliveryOutcome::Failed { .. } => "failed",
                DeliveryOutcome::Dead { .. } => "dead",
            };
            let event_id = entry.event.event_id;
            let recorded = self
                .store
                .record_delivery(event_id, entry.attempts, &outcome)
                .await?;
            if !recorded {
                stats.superseded += 1;
                tracing::warn!(%event_id, "webhook claim passed to another worker before the answer was recorded");
                continue;
            }
            self.metrics.webhook_delivery(name);
            match outcome {
                DeliveryOutcome::Delivered { .. } => stats.delivered += 1,
                DeliveryOutcome::Failed { error, .. } => {
                    stats.failed += 1;
                    tracing::info!(%event_id, attempt = entry.attempts, %error, "webhook delivery failed; will retry");
                }
                DeliveryOutcome::Dead { error, .. } => {
                    stats.dead += 1;
                    tracing::warn!(%event_id, attempt = entry.attempts, %error, "webhook event dead after its max age");
                }
            }
        }
        Ok(stats)
    }

    /// Sends one claimed event and says how it went.
    async fn send(&self, entry: &OutboxEntry) -> DeliveryOutcome {
        let event_id = entry.event.event_id.hyphenated().to_string();
        let body = entry.event.body();
        let timestamp = Utc::now().timestamp();
        let signature = self.config.secret.sign(&event_id, timestamp, &body);
        let answer = self
            .client
            .post(self.config.url.clone())
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .header("webhook-id", &event_id)
            .header("webhook-timestamp", timestamp.to_string())
            .header("webhook-signature", signature)
            .body(body)
            .send()
            .await;
        let (status_code, error) = match answer {
            Ok(response) if response.status().is_success() => {
                return DeliveryOutcome::Delivered {
                    status_code: response.status().as_u16(),
                };
            }
            Ok(response) => {
                let code = response.status().as_u16();
                (Some(code), format!("http_{code}"))
            }
            Err(e) if e.is_timeout() => (None, "timeout".to_owned()),
            Err(e) if e.is_connect() => (None, "connect".to_owned()),
            Err(_) => (None, "request".to_owned()),
        };
        let age = (entry.observed_at - entry.event.occurred_at)
            .to_std()
            .unwrap_or_default();
        let attempts = u32::try_from(entry.attempts).unwrap_or(1);
        match self
            .config
            .schedule
            .after_failure(attempts, age, rand::random::<f64>())
        {
            AfterFailure::RetryAfter(retry_after) => DeliveryOutcome::Failed {
                status_code,
                error,
                retry_after,
            },
            AfterFailure::Dead => DeliveryOutcome::Dead { status_code, error },
        }
    }

    /// Samples the outbox gauges once; a failed read clears them and is returned.
    ///
    /// Errors: the store's.
    pub async fn sample(&self) -> Result<(), StoreError> {
        let stats = self.store.outbox_stats().await;
        match stats {
            Ok(stats) => {
                self.metrics.outbox_sampled(Some(stats));
                Ok(())
            }
            Err(error) => {
                self.metrics.outbox_sampled(None);
                Err(error)
            }
        }
    }

    /// Polls until `shutdown` is cancelled; the poll in progress finishes first (each
    /// attempt is bounded by the timeout). A database outage is logged and waited out.
    pub async fn run(&self, shutdown: CancellationToken) {
        let rounds = DeliveryRounds {
            delivery: self,
            last_sample: None,
            sampling_fails: false,
        };
        poll_until(
            &shutdown,
            self.config.poll_interval,
            "webhook delivery",
            rounds,
        )
        .await;
    }
}

/// The delivery loop's rounds: the outbox gauges when due, then the due events.
struct DeliveryRounds<'a> {
    delivery: &'a WebhookDelivery,
    last_sample: Option<std::time::Instant>,
    sampling_fails: bool,
}

impl Rounds for DeliveryRounds<'_> {
    async fn round(&mut self) -> Result<bool, StoreError> {
        let delivery = self.delivery;
        let sample_due = |at: std::time::Instant| at.elapsed() >= delivery.config.sample_interval;
        if self.last_sample.is_none_or(sample_due) {
            match delivery.sample().await {
                Ok(()) => self.sampling_fails = false,
                Err(error) if !self.sampling_fails => {
                    tracing::warn!(error = %error, "cannot sample the webhook outbox; gauges cleared");
                    self.sampling_fails = true;
                }
                Err(_) => {}
            }
            self.last_sample = Some(std::time::Instant::now());
        }
        let stats = delivery.deliver_due().await?;
        Ok(stats.attempts() >= delivery.config.batch_size.unsigned_abs())
    }
}
