//! Escalation events: what a configured webhook receives when an operation enters the review
//! queue and when its review ends, how each event is signed, and when a failed delivery is
//! tried again or given up.
//!
//! Which transitions emit which event is one rule, [`event_for`]: an operation whose
//! `review_required_at` goes from unset to set emits `operation.review_required`, and one whose
//! `review_required_at` goes from set to unset emits `operation.review_resolved`, whoever makes
//! the change (the worker's escalation, a reviewer's resolution, a late holder's report).
//! Storage enforces it with a trigger on the journal table (migrations `…_escalation_outbox`),
//! which writes the event into the outbox in the same transaction as the change, so that no
//! escalation can commit without its event and no event survives a change that rolled back.
//!
//! Delivery is at least once: a worker that dies after the receiver answered but before it
//! recorded the answer sends the event again. The event id never changes across attempts, so
//! a receiver that de-duplicates by it sees every event exactly once.
//!
//! Signatures follow the Standard Webhooks specification
//! (<https://github.com/standard-webhooks/standard-webhooks/blob/main/spec/standard-webhooks.md>):
//! `webhook-signature: v1,<base64 HMAC-SHA256 of "{webhook-id}.{webhook-timestamp}.{body}">`
//! with a `whsec_`-prefixed base64 secret, so receivers can verify with that project's
//! libraries or a few lines of their own (docs/webhooks.md).

use std::collections::BTreeMap;
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use chrono::{DateTime, SecondsFormat, Utc};
use hmac::{KeyInit as _, Mac as _};
use serde::Serialize;
use uuid::Uuid;

use crate::model::{ActorKind, Status};

/// The kind of an escalation event, its `type` in the body.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EventType {
    /// The operation entered the review queue: `operation.review_required`.
    ReviewRequired,
    /// The operation left the review queue: `operation.review_resolved`.
    ReviewResolved,
}

impl EventType {
    /// The wire and stored name: `operation.review_required`, `operation.review_resolved`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ReviewRequired => "operation.review_required",
            Self::ReviewResolved => "operation.review_resolved",
        }
    }

    /// Parses the stored name.
    pub fn from_db(value: &str) -> Option<Self> {
        Some(match value {
            "operation.review_required" => Self::ReviewRequired,
            "operation.review_resolved" => Self::ReviewResolved,
            _ => return None,
        })
    }
}

/// The event a transition emits: whether the operation waited for review before it
/// (`was_under_review`) and after it (`is_under_review`). A change that keeps the review
/// state (another lookup, a repeated escalation) emits nothing.
pub fn event_for(was_under_review: bool, is_under_review: bool) -> Option<EventType> {
    match (was_under_review, is_under_review) {
        (false, true) => Some(EventType::ReviewRequired),
        (true, false) => Some(EventType::ReviewResolved),
        _ => None,
    }
}

/// One escalation event as the outbox keeps it: a snapshot of what the journal stores about
/// the operation right after the change, never its payload or result.
#[derive(Debug, Clone, PartialEq)]
pub struct EscalationEvent {
    /// Random, stable across delivery attempts: the receivers' de-duplication key.
    pub event_id: Uuid,
    /// Which event.
    pub event_type: EventType,
    /// When the change committed, by the database clock.
    pub occurred_at: DateTime<Utc>,
    /// Tenant namespace.
    pub namespace: String,
    /// The idempotency key.
    pub operation_key: String,
    /// The action type.
    pub action_type: String,
    /// The status right after the change (`unknown` on entering review).
    pub status: Status,
    /// The attempt count right after the change.
    pub attempt_count: i32,
    /// Entering review: the escalation reason (`no_provider_lookup`,
    /// `unresolved_after_deadline`); leaving it: the reviewer's (or reporter's) reason.
    pub reason: Option<String>,
    /// Who made the change.
    pub actor_kind: ActorKind,
    /// Their name (a reviewer's name, the worker's instance name; empty for a client).
    pub actor: String,
    /// The operation's business references.
    pub references: BTreeMap<String, String>,
}

/// The JSON body of a delivery (docs/webhooks.md), in the Standard Webhooks shape:
/// `type`, `timestamp`, `data`.
#[derive(Debug, Serialize)]
struct Body<'a> {
    r#type: &'static str,
    timestamp: String,
    data: Data<'a>,
}

#[derive(Debug, Serialize)]
struct Data<'a> {
    event_id: String,
    occurred_at: String,
    namespace: &'a str,
    operation_key: &'a str,
    action_type: &'a str,
    status: &'static str,
    attempt: i32,
    reason: Option<&'a str>,
    resolution: Option<&'static str>,
    resolved_by: Option<&'static str>,
    reviewer: Option<&'a str>,
    business_references: &'a BTreeMap<String, String>,
}

impl EscalationEvent {
    /// The body every delivery attempt of this event sends, byte for byte the same.
    ///
    /// `resolution` names how the review ended (`succeeded`, `failed_final`,
    /// `released_for_retry`), `resolved_by` who ended it (`reviewer`, `worker`, `client`), and
    /// `reviewer` the reviewer's name; all three are `null` on `operation.review_required`.
    pub fn body(&self) -> Vec<u8> {
        let resolved = self.event_type == EventType::ReviewResolved;
        let occurred_at = self
            .occurred_at
            .to_rfc3339_opts(SecondsFormat::Millis, true);
        let body = Body {
            r#type: self.event_type.as_str(),
            timestamp: occurred_at.clone(),
            data: Data {
                event_id: self.event_id.hyphenated().to_string(),
                occurred_at,
                namespace: &self.namespace,
                operation_key: &self.operation_key,
                action_type: &self.action_type,
                status: self.status.as_str(),
                attempt: self.attempt_count,
                reason: self.reason.as_deref(),
                resolution: resolved.then(|| match self.status {
                    Status::Pending => "released_for_retry",
                    other => other.as_str(),
                }),
                resolved_by: resolved.then(|| self.actor_kind.as_str()),
                reviewer: (resolved && self.actor_kind == ActorKind::Reviewer)
                    .then_some(self.actor.as_str()),
                business_references: &self.references,
            },
        };
        // Serializing plain strings, numbers and a string map cannot fail.
        serde_json::to_vec(&body).unwrap_or_default()
    }
}

/// Shortest signing secret accepted, in bytes (after base64 decoding).
pub const MIN_SECRET_BYTES: usize = 32;

/// The webhook signing secret, `whsec_` followed by the base64 of at least
/// [`MIN_SECRET_BYTES`] random bytes (the Standard Webhooks form). Its `Debug` output is
/// `[redacted]`.
#[derive(Clone)]
pub struct WebhookSecret(Vec<u8>);

impl std::fmt::Debug for WebhookSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("[redacted]")
    }
}

/// Why a webhook signing secret is refused. No message repeats the value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum WebhookSecretError {
    /// The text does not start with `whsec_`.
    #[error("must start with whsec_ followed by base64")]
    MissingPrefix,
    /// What follows `whsec_` is not base64.
    #[error("the part after whsec_ must be base64")]
    NotBase64,
    /// The decoded secret is shorter than [`MIN_SECRET_BYTES`] bytes.
    #[error(
        "must hold at least {MIN_SECRET_BYTES} bytes (base64 of {MIN_SECRET_BYTES} random \
         bytes after whsec_)"
    )]
    TooShort,
}

impl WebhookSecret {
    /// Parses `whsec_<base64>`.
    ///
    /// Errors: a missing prefix, a part after it that is not base64, or a secret shorter
    /// than [`MIN_SECRET_BYTES`] bytes; no message repeats the value.
    pub fn parse(text: &str) -> Result<Self, WebhookSecretError> {
        let encoded = text
            .strip_prefix("whsec_")
            .ok_or(WebhookSecretError::MissingPrefix)?;
        let key = BASE64
            .decode(encoded.trim())
            .map_err(|_| WebhookSecretError::NotBase64)?;
        if key.len() < MIN_SECRET_BYTES {
            return Err(WebhookSecretError::TooShort);
        }
        Ok(Self(key))
    }

    /// The `webhook-signature` value for a delivery of `body` as event `event_id` at
    /// `timestamp` (Unix seconds): `v1,` and the base64 HMAC-SHA256 of
    /// `"{event_id}.{timestamp}.{body}"`.
    pub fn sign(&self, event_id: &str, timestamp: i64, body: &[u8]) -> String {
        let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(&self.0)
            .unwrap_or_else(|_| unreachable!("HMAC takes a key of any length"));
        mac.update(format!("{event_id}.{timestamp}.").as_bytes());
        mac.update(body);
        format!("v1,{}", BASE64.encode(mac.finalize().into_bytes()))
    }
}

/// When failed deliveries are tried again: exponential backoff from `base`, doubled per
/// attempt up to `cap`, spread by jitter, and given up once the event is `max_age` old.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RetrySchedule {
    /// Delay after the first failed attempt.
    pub base: Duration,
    /// Longest delay between two attempts.
    pub cap: Duration,
    /// Age after which a failed event is marked dead instead of tried again.
    pub max_age: Duration,
}

/// What follows a failed delivery attempt.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum AfterFailure {
    /// Try again after this delay.
    RetryAfter(Duration),
    /// Give up: the event is kept, marked dead, and counted.
    Dead,
}

impl RetrySchedule {
    /// What follows the `attempts`-th failed attempt of an event `age` old (by the database
    /// clock); `jitter_unit` is a random draw in [0, 1). The delay is `base * 2^(attempts-1)`
    /// capped at `cap`, then scaled into its upper half by the jitter (so replicas and events
    /// that failed together spread out), and never later than the event's max age: the last
    /// attempt happens at it.
    pub fn after_failure(&self, attempts: u32, age: Duration, jitter_unit: f64) -> AfterFailure {
        if age >= self.max_age {
            return AfterFailure::Dead;
        }
        let doublings = attempts.saturating_sub(1).min(32);
        let delay = self
            .base
            .saturating_mul(2u32.saturating_pow(doublings))
            .min(self.cap);
        let delay = delay.mul_f64(0.5 + 0.5 * jitter_unit.clamp(0.0, 1.0));
        AfterFailure::RetryAfter(delay.min(self.max_age - age))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn only_entering_and_leaving_review_emit_events() {
        assert_eq!(event_for(false, true), Some(EventType::ReviewRequired));
        assert_eq!(event_for(true, false), Some(EventType::ReviewResolved));
        assert_eq!(event_for(false, false), None);
        assert_eq!(event_for(true, true), None);
        for t in [EventType::ReviewRequired, EventType::ReviewResolved] {
            assert_eq!(EventType::from_db(t.as_str()), Some(t));
        }
    }

    fn event(event_type: EventType, status: Status, actor_kind: ActorKind) -> EscalationEvent {
        EscalationEvent {
            event_id: Uuid::nil(),
            event_type,
            occurred_at: DateTime::parse_from_rfc3339("2026-12-01T10:00:00.123Z")
                .unwrap()
                .with_timezone(&Utc),
            namespace: "default".into(),
            operation_key: "email:case-442".into(),
            action_type: "send_email".into(),
            status,
            attempt_count: 1,
            reason: Some("seen in the provider's log".into()),
            actor_kind,
            actor: "alice".into(),
            references: BTreeMap::from([("case_id".into(), "442".into())]),
        }
    }

    #[test]
    fn a_resolution_names_its_outcome_and_reviewer() {
        let body = event(
            EventType::ReviewResolved,
            Status::Pending,
            ActorKind::Reviewer,
        )
        .body();
        let json: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(json["type"], "operation.review_resolved");
        assert_eq!(json["timestamp"], "2026-12-01T10:00:00.123Z");
        let data = &json["data"];
        assert_eq!(data["event_id"], Uuid::nil().to_string());
        assert_eq!(data["resolution"], "released_for_retry");
        assert_eq!(data["resolved_by"], "reviewer");
        assert_eq!(data["reviewer"], "alice");
        assert_eq!(data["business_references"]["case_id"], "442");
    }

    #[test]
    fn an_escalation_names_no_resolution_and_no_worker_as_reviewer() {
        let escalated = event(
            EventType::ReviewRequired,
            Status::Unknown,
            ActorKind::Worker,
        );
        let json: serde_json::Value = serde_json::from_slice(&escalated.body()).unwrap();
        assert!(json["data"]["resolution"].is_null());
        assert!(json["data"]["reviewer"].is_null());
        let by_worker = event(
            EventType::ReviewResolved,
            Status::Succeeded,
            ActorKind::Worker,
        );
        let json: serde_json::Value = serde_json::from_slice(&by_worker.body()).unwrap();
        assert_eq!(json["data"]["resolution"], "succeeded");
        assert!(json["data"]["reviewer"].is_null());
        assert_eq!(
            escalated.body(),
            escalated.body(),
            "the same bytes every time"
        );
    }

    #[test]
    fn the_signature_is_the_standard_webhooks_one() {
        // A 24-byte secret (the specification allows it) is refused: 32 bytes at least.
        let short = WebhookSecret::parse("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
            .unwrap_err()
            .to_string();
        assert!(short.contains("32 bytes"), "{short}");
        let key = BASE64.encode([7u8; 32]);
        let secret = WebhookSecret::parse(&format!("whsec_{key}")).unwrap();
        let signature = secret.sign("msg_1", 1_674_087_231, b"{\"a\":1}");
        let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(&[7u8; 32]).unwrap();
        mac.update(b"msg_1.1674087231.{\"a\":1}");
        let expected = format!("v1,{}", BASE64.encode(mac.finalize().into_bytes()));
        assert_eq!(signature, expected);
        assert_eq!(format!("{secret:?}"), "[redacted]");
        assert!(
            WebhookSecret::parse(&key).is_err(),
            "the prefix is required"
        );
        assert!(WebhookSecret::parse("whsec_not base64!").is_err());
    }

    #[test]
    fn failed_deliveries_back_off_to_the_cap_and_die_at_the_max_age() {
        let schedule = RetrySchedule {
            base: Duration::from_secs(1),
            cap: Duration::from_secs(60),
            max_age: Duration::from_secs(3600),
        };
        let young = Duration::from_secs(10);
        let delay = |attempts, unit| match schedule.after_failure(attempts, young, unit) {
            AfterFailure::RetryAfter(delay) => delay,
            AfterFailure::Dead => panic!("dead too early"),
        };
        assert_eq!(delay(1, 1.0), Duration::from_secs(1));
        assert_eq!(delay(4, 1.0), Duration::from_secs(8));
        assert_eq!(delay(4, 0.0), Duration::from_secs(4));
        assert_eq!(delay(40, 1.0), Duration::from_secs(60));
        let near_the_end = Duration::from_secs(3590);
        assert_eq!(
            schedule.after_failure(40, near_the_end, 1.0),
            AfterFailure::RetryAfter(Duration::from_secs(10))
        );
        assert_eq!(
            schedule.after_failure(2, Duration::from_secs(3600), 0.5),
            AfterFailure::Dead
        );
    }
}
