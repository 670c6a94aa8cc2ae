//! Sandbox provider: a fake HTTP payment and e-mail provider with its own
//! isolated in-memory store, for tests, demos and local stands.
//!
//! It behaves like the two kinds of third-party API that the journal must
//! make safe to retry:
//!
//! * **Payments** (`POST /v1/payments`) deduplicate by an `Idempotency-Key`
//!   header, the way Stripe does: the same key with the same body replays the
//!   stored payment (200, `Idempotent-Replayed: true`), the same key with a
//!   different body is refused (422 `idempotency_key_reused`).
//! * **E-mails** (`POST /v1/emails`) have no idempotency at all: every accepted
//!   request is a new e-mail, even with a repeated `external_reference`.
//!
//! Both can be looked up afterwards (`GET /v1/payments/by-idempotency-key/{key}`,
//! `GET /v1/payments/{id}`, `GET /v1/emails/by-reference/{reference}`), but a
//! configurable *lookup lag* hides objects younger than the lag (404), as an
//! eventually consistent search index would.
//!
//! Faults are injected per request with the `X-Sandbox-Fault` header:
//! `commit-then-timeout` (store the effect, then stall the answer for the
//! configured hang so the client times out), `fail-before-store` (503, nothing
//! stored), `reject` (402 `card_declined` / 422 `recipient_rejected`,
//! nothing stored) and `slow` (take the configured slow delay, then store and
//! answer as normal; whether a client that gives up during the delay still
//! gets its effect stored is up to the HTTP server noticing the disconnect:
//! treat it as unknown).
//!
//! Fault order: a request is first validated (400s), then `fail-before-store`
//! and `reject` answer without looking at the store; `slow` waits, then runs
//! the normal logic; `commit-then-timeout` runs the normal logic (create,
//! replay or 422) and stalls before answering.
//!
//! Counters prove "exactly one effect": `GET /v1/effects/{key}` gives
//! [`KeyCounts`] for one key, `GET /v1/stats` the totals, and
//! [`Sandbox::counts`] reads the same numbers in-process. In the totals,
//! `requests` counts every POST to `/v1/payments` or `/v1/emails`, even one
//! refused before its key was read; lookups by payment id are not counted. The lag can be changed
//! at run time with `PUT /v1/admin/lookup-lag` or [`Sandbox::set_lookup_lag`].
//! `GET /v1/admin/ledger` (and [`Sandbox::ledger`]) lists every key with its
//! counters and the ids of the effects stored under it, for a checker that
//! compares a whole run against the journal.
//!
//! [`Defect`] makes the sandbox a deliberately broken provider, to prove that
//! such a checker notices: with [`Defect::StorePaymentsTwice`] every new
//! payment is stored twice. Never on by default.
//! Every error body is `{"error": "<snake_case_code>", "message": "<text>"}`.
//!
//! Request bodies are never logged: each request is logged with its method,
//! route template and status only. Lookups by key remember the W3C
//! `traceparent` they carried ([`Sandbox::lookup_traceparents`]).

mod admin;
mod emails;
mod error;
mod fault;
mod payments;
mod routes;
mod store;
#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests;

use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::store::Store;

/// Start-up settings of a [`Sandbox`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SandboxConfig {
    /// How long a newly stored payment or e-mail stays invisible to the
    /// lookup endpoints (404 `not_found`), like a lagging search index.
    /// Default: zero (visible at once). Can be changed later with
    /// [`Sandbox::set_lookup_lag`].
    pub lookup_lag: Duration,
    /// How long a request carrying `X-Sandbox-Fault: commit-then-timeout`
    /// stalls after storing its effect before it answers. Default: 30 s.
    pub hang: Duration,
    /// How long a request carrying `X-Sandbox-Fault: slow` waits before it
    /// stores its effect and answers. Default: 2 s.
    pub slow: Duration,
    /// A deliberate defect, for testing a checker; `None` (the default) is a
    /// correct provider.
    pub defect: Option<Defect>,
}

impl Default for SandboxConfig {
    fn default() -> Self {
        Self {
            lookup_lag: Duration::ZERO,
            hang: Duration::from_secs(30),
            slow: Duration::from_secs(2),
            defect: None,
        }
    }
}

/// A deliberately broken behaviour of the sandbox: a provider bug that a
/// fault-injection suite must catch. Never use one outside such a test.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Defect {
    /// Every new payment is stored twice, under two payment ids, and counted
    /// as two effects of its key (replays and lookups show the first). The
    /// opposite of what an idempotent provider promises.
    StorePaymentsTwice,
}

/// One key in the [`Sandbox::ledger`]: its counters and what was stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LedgerEntry {
    /// A payment's idempotency key or an e-mail's external reference.
    pub key: String,
    /// The same counters as `GET /v1/effects/{key}`.
    #[serde(flatten)]
    pub counts: KeyCounts,
    /// POSTs answered with an effect stored earlier under this key (a payment
    /// replayed by its idempotency key): calls that would have been duplicate
    /// effects at a provider without idempotency.
    pub replays: u64,
    /// The provider's ids of the stored effects (`pay_…`, `em_…`), oldest
    /// first; as many as `counts.effects`.
    pub effect_ids: Vec<String>,
}

/// Effect counters for one key (a payment's idempotency key or an e-mail's
/// external reference), as served by `GET /v1/effects/{key}`; the same shape
/// (without the key) is used for the totals of `GET /v1/stats`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct KeyCounts {
    /// POST requests received that carried this key, whatever their outcome
    /// (replayed, refused, faulted), except those that failed validation
    /// before the key could be read.
    pub requests: u64,
    /// Effects actually stored for this key: payments created, e-mails sent.
    pub effects: u64,
    /// GET lookups of this key (`/v1/payments/by-idempotency-key/{key}` or
    /// `/v1/emails/by-reference/{reference}`), whether they answered 200 or 404.
    pub lookups: u64,
}

/// A running sandbox provider's shared state: cheap to clone, every clone
/// sees the same in-memory store.
#[derive(Clone)]
pub struct Sandbox {
    store: Arc<Mutex<Store>>,
    hang: Duration,
    slow: Duration,
    defect: Option<Defect>,
    /// Flips to `true` when a [`Sandbox::serve`] call is shutting down, so
    /// that stalled `commit-then-timeout` requests stop waiting.
    shutting_down: Arc<watch::Sender<bool>>,
}

impl Sandbox {
    /// Creates a sandbox with an empty store and the given settings.
    pub fn new(config: SandboxConfig) -> Self {
        let (shutting_down, _) = watch::channel(false);
        Self {
            store: Arc::new(Mutex::new(Store::new(config.lookup_lag))),
            hang: config.hang,
            slow: config.slow,
            defect: config.defect,
            shutting_down: Arc::new(shutting_down),
        }
    }

    /// The HTTP API of this sandbox as an axum router (state already bound),
    /// with request logging (method, route template, status).
    pub fn router(&self) -> axum::Router {
        crate::routes::router(self.clone())
    }

    /// Binds nothing itself: serves on the given listener until `shutdown`
    /// resolves, then stops accepting, cuts short any `commit-then-timeout`
    /// stall (those requests then answer normally) and waits for in-flight
    /// requests to finish.
    pub async fn serve(
        self,
        listener: TcpListener,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> std::io::Result<()> {
        self.shutting_down.send_replace(false);
        let signal = Arc::clone(&self.shutting_down);
        let router = self.router();
        axum::serve(listener, router)
            .with_graceful_shutdown(async move {
                shutdown.await;
                signal.send_replace(true);
            })
            .await
    }

    /// Effect counters for one key (idempotency key of a payment, or external
    /// reference of an e-mail). An unknown key gives all zeros.
    pub fn counts(&self, key: &str) -> KeyCounts {
        self.lock().counts(key)
    }

    /// Every key seen by an effect POST or a lookup, sorted by key, with its
    /// counters and the ids of its stored effects (served as
    /// `GET /v1/admin/ledger`).
    pub fn ledger(&self) -> Vec<LedgerEntry> {
        self.lock().ledger()
    }

    /// The W3C `traceparent` header values that lookups of `key` (a payment's idempotency
    /// key or an e-mail's external reference) carried, oldest first: how a test sees that a
    /// reconcile lookup continued the journal's trace.
    pub fn lookup_traceparents(&self, key: &str) -> Vec<String> {
        self.lock().lookup_traceparents(key)
    }

    /// Changes the lookup lag at run time; applies to lookups made from now
    /// on, including for objects stored earlier.
    pub fn set_lookup_lag(&self, lag: Duration) {
        self.lock().set_lookup_lag(lag);
    }

    /// Locks the store; a poisoned lock is taken over, since every store
    /// mutation is a single consistent step.
    pub(crate) fn lock(&self) -> MutexGuard<'_, Store> {
        self.store.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The deliberate defect this sandbox runs with, if any.
    pub(crate) fn defect(&self) -> Option<Defect> {
        self.defect
    }

    /// Stalls for the configured hang, or less if the server shuts down.
    pub(crate) async fn hang(&self) {
        self.stall(self.hang).await;
    }

    /// Waits for the configured slow delay, or less if the server shuts down.
    pub(crate) async fn slow(&self) {
        self.stall(self.slow).await;
    }

    async fn stall(&self, length: Duration) {
        let mut rx = self.shutting_down.subscribe();
        tokio::select! {
            () = tokio::time::sleep(length) => {}
            _ = rx.wait_for(|down| *down) => {}
        }
    }
}

/// Starts a sandbox on 127.0.0.1:0 in a background task; returns its base URL
/// like `"http://127.0.0.1:PORT"` and the [`Sandbox`] handle. (For tests.)
/// The server runs until the Tokio runtime that called this shuts down.
pub async fn spawn(config: SandboxConfig) -> std::io::Result<(String, Sandbox)> {
    let listener = TcpListener::bind(("127.0.0.1", 0)).await?;
    let addr = listener.local_addr()?;
    let sandbox = Sandbox::new(config);
    let server = sandbox.clone();
    tokio::spawn(async move {
        if let Err(err) = server.serve(listener, std::future::pending()).await {
            tracing::error!(error = %err, "sandbox server stopped");
        }
    });
    Ok((format!("http://{addr}"), sandbox))
}
