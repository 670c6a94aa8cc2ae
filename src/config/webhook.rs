//! `[webhook]`: where the reconcile worker POSTs escalation events, signed, and how it
//! retries (docs/webhooks.md).

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{ConfigError, Secret, duration, positive};

/// The environment variable holding `[webhook] secret`, one of its two sources.
pub const WEBHOOK_SECRET_VARIABLE: &str = "OPJOURNAL_WEBHOOK__SECRET";
/// The old name of [`WEBHOOK_SECRET_VARIABLE`], still read, with a deprecation warning.
pub const LEGACY_WEBHOOK_SECRET_VARIABLE: &str = "OPJOURNAL_WEBHOOK_SECRET";

/// `[webhook]` settings.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default)]
pub struct WebhookSettings {
    /// Where escalation events are POSTed (`http://` or `https://`); unset, events wait in
    /// the outbox. A secret: incoming-webhook URLs often carry a token, so it is never
    /// logged or printed.
    pub url: Option<Secret>,
    /// The signing secret, `whsec_` and the base64 of at least 32 random bytes, read only
    /// from the environment ([`WEBHOOK_SECRET_VARIABLE`]; a file's value is ignored); never
    /// logged or printed. Required with `url`.
    #[serde(skip_deserializing)]
    pub secret: Option<Secret>,
    /// Time to wait for the receiver's answer to one delivery.
    #[serde(with = "duration")]
    pub timeout: Duration,
    /// Time a claimed event stays hidden from other workers; at least twice `timeout`.
    #[serde(with = "duration")]
    pub claim_hold: Duration,
    /// Wait before the first retry of a failed event; doubled per attempt.
    #[serde(with = "duration")]
    pub retry_base: Duration,
    /// Longest wait between two attempts.
    #[serde(with = "duration")]
    pub retry_cap: Duration,
    /// Age after which a failed event is marked dead (kept, counted) instead of tried again.
    #[serde(with = "duration")]
    pub max_age: Duration,
    /// Time between polls of the outbox when nothing was due.
    #[serde(with = "duration")]
    pub poll_interval: Duration,
    /// Most events claimed and sent at once per poll.
    pub batch_size: i64,
}

impl Default for WebhookSettings {
    fn default() -> Self {
        Self {
            url: None,
            secret: None,
            timeout: Duration::from_secs(10),
            claim_hold: Duration::from_secs(60),
            retry_base: Duration::from_secs(5),
            retry_cap: Duration::from_secs(600),
            max_age: Duration::from_secs(259_200),
            poll_interval: Duration::from_secs(1),
            batch_size: 20,
        }
    }
}

impl WebhookSettings {
    /// The messages never repeat the URL or the secret.
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        for (name, value) in [
            ("webhook.timeout", self.timeout),
            ("webhook.claim_hold", self.claim_hold),
            ("webhook.retry_base", self.retry_base),
            ("webhook.retry_cap", self.retry_cap),
            ("webhook.max_age", self.max_age),
            ("webhook.poll_interval", self.poll_interval),
        ] {
            positive(name, value)?;
        }
        if self.claim_hold < 2 * self.timeout {
            return Err(ConfigError(
                "webhook.claim_hold: must be at least twice webhook.timeout".into(),
            ));
        }
        if self.batch_size < 1 {
            return Err(ConfigError("webhook.batch_size: must be at least 1".into()));
        }
        if let Some(secret) = &self.secret {
            crate::domain::escalation::WebhookSecret::parse(secret.expose()).map_err(|e| {
                ConfigError(format!("webhook.secret ({WEBHOOK_SECRET_VARIABLE}): {e}"))
            })?;
        }
        let Some(url) = &self.url else {
            return Ok(());
        };
        match reqwest::Url::parse(url.expose()) {
            Ok(url) if matches!(url.scheme(), "http" | "https") && url.has_host() => {}
            _ => {
                return Err(ConfigError(
                    "webhook.url: must be an http:// or https:// URL".into(),
                ));
            }
        }
        if self.secret.is_none() {
            return Err(ConfigError(format!(
                "webhook.secret: {WEBHOOK_SECRET_VARIABLE} must be set with webhook.url"
            )));
        }
        Ok(())
    }
}
