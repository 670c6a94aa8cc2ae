//! The sandbox's in-memory store: payments, e-mails and counters.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use chrono::{SecondsFormat, Utc};
use serde::Serialize;
use serde_json::Value;

use crate::{KeyCounts, LedgerEntry};

/// A payment as the API shows it.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Payment {
    /// `pay_` followed by 32 lowercase hex digits.
    pub id: String,
    /// Always `"succeeded"`.
    pub status: &'static str,
    /// Amount in minor units (cents), > 0.
    pub amount_minor: u64,
    /// Currency as sent by the client.
    pub currency: String,
    /// The `Idempotency-Key` header the payment was created with.
    pub idempotency_key: String,
    /// Creation time, RFC 3339 UTC.
    pub created_at: String,
    /// The request body's other members, echoed back the way real providers echo metadata
    /// and payment-method details (card numbers included, if a client sends them): the
    /// journal must keep only what its policy keeps.
    #[serde(flatten)]
    pub echoed: serde_json::Map<String, Value>,
}

/// Members of a payment that the echo of the request never overrides.
const PAYMENT_FIELDS: &[&str] = &[
    "id",
    "status",
    "amount_minor",
    "currency",
    "idempotency_key",
    "created_at",
];

/// An e-mail as the API shows it (no recipient, subject or body: personal data).
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Email {
    /// `em_` followed by 32 lowercase hex digits.
    pub id: String,
    /// Always `"sent"`.
    pub status: &'static str,
    /// The client's `external_reference`.
    pub external_reference: String,
    /// Creation time, RFC 3339 UTC.
    pub created_at: String,
}

/// A stored payment with the parsed request body it was created from.
struct StoredPayment {
    payment: Payment,
    request: Value,
    stored_at: Instant,
}

/// A stored e-mail.
struct StoredEmail {
    email: Email,
    stored_at: Instant,
}

/// What `POST /v1/payments` did with a well-formed request.
pub(crate) enum PaymentOutcome {
    /// A new payment was stored.
    Created(Payment),
    /// The key was known with an equal body: nothing new stored.
    Replayed(Payment),
    /// The key was known with another body: nothing stored.
    KeyReused,
}

/// All sandbox data; lives behind the [`crate::Sandbox`] mutex.
pub(crate) struct Store {
    lookup_lag: Duration,
    payments_by_key: HashMap<String, StoredPayment>,
    payment_keys_by_id: HashMap<String, String>,
    emails_by_reference: HashMap<String, Vec<StoredEmail>>,
    counts: HashMap<String, KeyCounts>,
    totals: KeyCounts,
    lookup_traceparents: HashMap<String, Vec<String>>,
    /// Per key: the ids of its stored effects, oldest first.
    effect_ids: HashMap<String, Vec<String>>,
    /// Per key: POSTs answered with an effect stored earlier.
    replays: HashMap<String, u64>,
}

fn payment_id() -> String {
    format!("pay_{}", uuid::Uuid::new_v4().simple())
}

fn now_rfc3339() -> String {
    Utc::now().to_rfc3339_opts(SecondsFormat::Micros, true)
}

impl Store {
    /// An empty store with the given lookup lag.
    pub fn new(lookup_lag: Duration) -> Self {
        Self {
            lookup_lag,
            payments_by_key: HashMap::new(),
            payment_keys_by_id: HashMap::new(),
            emails_by_reference: HashMap::new(),
            counts: HashMap::new(),
            totals: KeyCounts::default(),
            lookup_traceparents: HashMap::new(),
            effect_ids: HashMap::new(),
            replays: HashMap::new(),
        }
    }

    /// Remembers the W3C `traceparent` a lookup of `key` carried (only valid values).
    pub fn note_lookup_traceparent(&mut self, key: &str, traceparent: &str) {
        if let Some(valid) = opjournal_traceparent::normalize(traceparent) {
            self.lookup_traceparents
                .entry(key.to_owned())
                .or_default()
                .push(valid);
        }
    }

    /// The `traceparent` values lookups of `key` carried, oldest first.
    pub fn lookup_traceparents(&self, key: &str) -> Vec<String> {
        self.lookup_traceparents
            .get(key)
            .cloned()
            .unwrap_or_default()
    }

    /// Changes the lookup lag.
    pub fn set_lookup_lag(&mut self, lag: Duration) {
        self.lookup_lag = lag;
    }

    /// Counters of one key; zeros when unknown.
    pub fn counts(&self, key: &str) -> KeyCounts {
        self.counts.get(key).copied().unwrap_or_default()
    }

    /// Totals over all keys (`requests` counts every effect POST received).
    pub fn totals(&self) -> KeyCounts {
        self.totals
    }

    /// Counts one POST received on an effect endpoint, before validation.
    pub fn note_post(&mut self) {
        self.totals.requests += 1;
    }

    /// Counts one POST that carried `key`.
    pub fn note_key_request(&mut self, key: &str) {
        self.counts.entry(key.to_owned()).or_default().requests += 1;
    }

    fn note_effect(&mut self, key: &str, id: &str) {
        self.counts.entry(key.to_owned()).or_default().effects += 1;
        self.totals.effects += 1;
        self.effect_ids
            .entry(key.to_owned())
            .or_default()
            .push(id.to_owned());
    }

    /// Every key seen, sorted, with its counters, replays and effect ids.
    pub fn ledger(&self) -> Vec<LedgerEntry> {
        let mut entries: Vec<LedgerEntry> = self
            .counts
            .iter()
            .map(|(key, counts)| LedgerEntry {
                key: key.clone(),
                counts: *counts,
                replays: self.replays.get(key).copied().unwrap_or(0),
                effect_ids: self.effect_ids.get(key).cloned().unwrap_or_default(),
            })
            .collect();
        entries.sort_by(|a, b| a.key.cmp(&b.key));
        entries
    }

    fn note_lookup(&mut self, key: &str) {
        self.counts.entry(key.to_owned()).or_default().lookups += 1;
        self.totals.lookups += 1;
    }

    fn visible(&self, stored_at: Instant) -> bool {
        stored_at.elapsed() >= self.lookup_lag
    }

    /// Creates a payment for `key`, or replays or refuses it if the key is known.
    /// `twice` is the deliberate defect [`crate::Defect::StorePaymentsTwice`]:
    /// a new payment is stored a second time under another id.
    pub fn create_payment(
        &mut self,
        key: &str,
        request: Value,
        amount_minor: u64,
        currency: String,
        twice: bool,
    ) -> PaymentOutcome {
        if let Some(stored) = self.payments_by_key.get(key) {
            return if stored.request == request {
                *self.replays.entry(key.to_owned()).or_default() += 1;
                PaymentOutcome::Replayed(stored.payment.clone())
            } else {
                PaymentOutcome::KeyReused
            };
        }
        let payment = Payment {
            id: payment_id(),
            status: "succeeded",
            amount_minor,
            currency,
            idempotency_key: key.to_owned(),
            created_at: now_rfc3339(),
            echoed: request
                .as_object()
                .into_iter()
                .flatten()
                .filter(|(name, _)| !PAYMENT_FIELDS.contains(&name.as_str()))
                .map(|(name, value)| (name.clone(), value.clone()))
                .collect(),
        };
        self.payment_keys_by_id
            .insert(payment.id.clone(), key.to_owned());
        self.payments_by_key.insert(
            key.to_owned(),
            StoredPayment {
                payment: payment.clone(),
                request,
                stored_at: Instant::now(),
            },
        );
        self.note_effect(key, &payment.id);
        if twice {
            let copy = payment_id();
            self.payment_keys_by_id.insert(copy.clone(), key.to_owned());
            self.note_effect(key, &copy);
        }
        PaymentOutcome::Created(payment)
    }

    /// Looks a payment up by idempotency key (counted as a lookup of `key`);
    /// `None` when unknown or younger than the lookup lag.
    pub fn payment_by_key(&mut self, key: &str) -> Option<Payment> {
        self.note_lookup(key);
        let stored = self.payments_by_key.get(key)?;
        self.visible(stored.stored_at)
            .then(|| stored.payment.clone())
    }

    /// Looks a payment up by id (not counted); `None` when unknown or younger
    /// than the lookup lag.
    pub fn payment_by_id(&self, id: &str) -> Option<Payment> {
        let key = self.payment_keys_by_id.get(id)?;
        let stored = self.payments_by_key.get(key)?;
        self.visible(stored.stored_at)
            .then(|| stored.payment.clone())
    }

    /// Stores a new e-mail under `reference`; never deduplicates.
    pub fn send_email(&mut self, reference: &str) -> Email {
        let email = Email {
            id: format!("em_{}", uuid::Uuid::new_v4().simple()),
            status: "sent",
            external_reference: reference.to_owned(),
            created_at: now_rfc3339(),
        };
        self.emails_by_reference
            .entry(reference.to_owned())
            .or_default()
            .push(StoredEmail {
                email: email.clone(),
                stored_at: Instant::now(),
            });
        self.note_effect(reference, &email.id);
        email
    }

    /// The first visible e-mail with `reference` and the number of visible
    /// e-mails with it (counted as a lookup of `reference`); `None` when none
    /// is visible.
    pub fn email_by_reference(&mut self, reference: &str) -> Option<(Email, u64)> {
        self.note_lookup(reference);
        let emails = self.emails_by_reference.get(reference)?;
        let mut visible = emails.iter().filter(|e| self.visible(e.stored_at));
        let first = visible.next()?.email.clone();
        let count = 1 + visible.count() as u64;
        Some((first, count))
    }
}
