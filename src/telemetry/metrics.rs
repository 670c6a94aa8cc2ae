//! The journal's metrics: OpenTelemetry instruments, exported over OTLP and as a Prometheus
//! scrape endpoint (see docs/observability.md for the catalogue).
//!
//! Names follow the OpenTelemetry conventions (dotted names, UCUM units); the Prometheus
//! exporter turns them into Prometheus names with base-unit suffixes and `_total` on counters
//! (`rpc.server.call.duration` in `s` becomes `rpc_server_call_duration_seconds`). No
//! attribute ever carries an idempotency key, namespace, payload or any other per-operation
//! value: every attribute has a small, fixed set of values (statuses, reasons, RPC methods,
//! adapter names from the policy file).

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use opentelemetry::KeyValue;
use opentelemetry::metrics::{
    AsyncInstrumentBuilder, Counter, Histogram, Meter, MeterProvider as _, ObservableGauge,
    UpDownCounter,
};
use tokio_util::sync::CancellationToken;

use crate::domain::error::JournalError;
use crate::domain::model::Status;

/// The instrumentation scope name of every instrument.
pub const SCOPE: &str = "opjournal";

/// Histogram buckets for durations in seconds: the RPC semantic conventions' recommendation.
pub const DURATION_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
];

/// The journal's instruments; cheap to clone (all clones record into the same instruments).
#[derive(Clone)]
pub struct Metrics {
    inner: Arc<Instruments>,
}

struct Instruments {
    rpc_duration: Histogram<f64>,
    begin_decisions: Counter<u64>,
    conflicts: Counter<u64>,
    transitions: Counter<u64>,
    lease_expiries: Counter<u64>,
    duplicate_intents: Counter<u64>,
    reconcile_outcomes: Counter<u64>,
    lookup_duration: Histogram<f64>,
    store_errors: Counter<u64>,
    backlog: BacklogGauges,
    webhook_deliveries: Counter<u64>,
    outbox: OutboxGauges,
    admission: AdmissionInstruments,
}

/// The admission queue's instruments.
struct AdmissionInstruments {
    queued: UpDownCounter<i64>,
    wait: Histogram<f64>,
}

impl AdmissionInstruments {
    fn new(meter: &Meter) -> Self {
        Self {
            queued: meter
                .i64_up_down_counter("opjournal.admission.queued")
                .with_unit("{call}")
                .with_description("Calls waiting in the admission queue for a place in flight")
                .build(),
            wait: duration_histogram(
                meter,
                "opjournal.admission.queue.wait",
                "Time calls waited in the admission queue, by outcome (admitted, refused, \
                 abandoned)",
            ),
        }
    }
}

/// A call waiting in the admission queue, counted in `opjournal.admission.queued` until it
/// is dropped; its wait is recorded then, under the outcome [`QueuedCall::admitted`] or
/// [`QueuedCall::refused`] set (`abandoned` when neither: the caller went away).
pub struct QueuedCall {
    metrics: Metrics,
    since: Instant,
    outcome: &'static str,
}

impl QueuedCall {
    /// The call got a place.
    pub fn admitted(mut self) {
        self.outcome = "admitted";
    }

    /// The call was refused (the wait ended without a place).
    pub fn refused(mut self) {
        self.outcome = "refused";
    }
}

impl Drop for QueuedCall {
    fn drop(&mut self) {
        let admission = &self.metrics.inner.admission;
        admission.queued.add(-1, &[]);
        admission.wait.record(
            self.since.elapsed().as_secs_f64(),
            &[KeyValue::new("outcome", self.outcome)],
        );
    }
}

/// The latest outbox sample and the gauges reading it (kept alive so their callbacks stay
/// registered).
struct OutboxGauges {
    sample: OutboxCell,
    _pending: ObservableGauge<u64>,
    _oldest: ObservableGauge<f64>,
    _dead: ObservableGauge<u64>,
}

/// The latest backlog sample and the gauges reading it (kept alive so their callbacks stay
/// registered).
struct BacklogGauges {
    sample: BacklogCell,
    _unknown: ObservableGauge<u64>,
    _oldest_unknown: ObservableGauge<f64>,
    _review_queue: ObservableGauge<u64>,
    _oldest_review: ObservableGauge<f64>,
    _overdue: ObservableGauge<u64>,
    _most_overdue: ObservableGauge<f64>,
}

/// The latest outbox reading and when it was taken.
type OutboxCell = Arc<Mutex<Option<(OutboxStats, Instant)>>>;
/// The latest backlog reading.
type BacklogCell = Arc<Mutex<Option<BacklogSample>>>;

/// The latest backlog reading and when it was taken.
#[derive(Debug, Clone, Copy)]
struct BacklogSample {
    stats: BacklogStats,
    taken: Instant,
}

impl BacklogSample {
    /// `age` as read, advanced by the process's clock since the sample, in seconds; 0 for
    /// `None` (nothing to age).
    fn age(&self, age: Option<Duration>) -> f64 {
        age.map(|age| age + self.taken.elapsed())
            .unwrap_or_default()
            .as_secs_f64()
    }
}

/// A `u64` counter named `name` with `unit` and `description`.
fn counter(
    meter: &Meter,
    name: &'static str,
    unit: &'static str,
    description: &'static str,
) -> Counter<u64> {
    meter
        .u64_counter(name)
        .with_unit(unit)
        .with_description(description)
        .build()
}

/// A histogram of durations in seconds over [`DURATION_BUCKETS`].
fn duration_histogram(
    meter: &Meter,
    name: &'static str,
    description: &'static str,
) -> Histogram<f64> {
    meter
        .f64_histogram(name)
        .with_unit("s")
        .with_description(description)
        .with_boundaries(DURATION_BUCKETS.to_vec())
        .build()
}

impl OutboxGauges {
    /// Registers the outbox gauges, each reading the latest sample.
    fn new(meter: &Meter) -> Self {
        let outbox = OutboxCell::default();
        let read = || {
            let outbox = outbox.clone();
            move || *outbox.lock().unwrap_or_else(PoisonError::into_inner)
        };
        let (pending, oldest_pending, dead) = (read(), read(), read());
        Self {
            sample: outbox,
            _pending: meter
                .u64_observable_gauge("opjournal.webhook.outbox.pending")
                .with_unit("{event}")
                .with_description("Escalation events not yet delivered (sampled)")
                .with_callback(move |gauge| {
                    if let Some((stats, _)) = pending() {
                        gauge.observe(stats.pending, &[]);
                    }
                })
                .build(),
            _oldest: meter
                .f64_observable_gauge("opjournal.webhook.outbox.oldest_age")
                .with_unit("s")
                .with_description(
                    "How long the oldest undelivered escalation event has waited; 0 when \
                     none does",
                )
                .with_callback(move |gauge| {
                    if let Some((stats, taken)) = oldest_pending() {
                        let age = stats
                            .oldest_pending_age
                            .map(|age| age + taken.elapsed())
                            .unwrap_or_default();
                        gauge.observe(age.as_secs_f64(), &[]);
                    }
                })
                .build(),
            _dead: meter
                .u64_observable_gauge("opjournal.webhook.outbox.dead")
                .with_unit("{event}")
                .with_description(
                    "Escalation events given up on after their max age, still kept (sampled)",
                )
                .with_callback(move |gauge| {
                    if let Some((stats, _)) = dead() {
                        gauge.observe(stats.dead, &[]);
                    }
                })
                .build(),
        }
    }
}

impl BacklogGauges {
    /// Registers the backlog gauges, each reading one figure of the latest sample.
    fn new(meter: &Meter) -> Self {
        let backlog = BacklogCell::default();
        let read = |figure: fn(&BacklogSample) -> u64| {
            let backlog = backlog.clone();
            move || (*backlog.lock().unwrap_or_else(PoisonError::into_inner)).map(|s| figure(&s))
        };
        let age = |figure: fn(&BacklogSample) -> f64| {
            let backlog = backlog.clone();
            move || (*backlog.lock().unwrap_or_else(PoisonError::into_inner)).map(|s| figure(&s))
        };
        Self {
            _unknown: count_gauge(
                meter,
                "opjournal.unknown.operations",
                "Operations whose outcome is unknown, those waiting for review included \
                 (sampled)",
                read(|s| s.stats.unknown),
            ),
            _oldest_unknown: age_gauge(
                meter,
                "opjournal.unknown.oldest_age",
                "How long the oldest unknown operation has been unknown; 0 when none is",
                age(|s| s.age(s.stats.oldest_unknown_age)),
            ),
            _review_queue: count_gauge(
                meter,
                "opjournal.review.queue.size",
                "Operations waiting for human review (sampled)",
                read(|s| s.stats.review_queue),
            ),
            _oldest_review: age_gauge(
                meter,
                "opjournal.review.oldest_age",
                "How long the operation longest in the review queue has waited for a \
                 reviewer; 0 when the queue is empty",
                age(|s| s.age(s.stats.oldest_review_age)),
            ),
            _overdue: count_gauge(
                meter,
                "opjournal.unknown.overdue.operations",
                "Unknown operations not waiting for review whose action's \
                 unknown_after_seconds has passed (sampled)",
                read(|s| s.stats.overdue),
            ),
            _most_overdue: age_gauge(
                meter,
                "opjournal.unknown.overdue.max",
                "How far past its action's unknown_after_seconds the most overdue \
                 unknown operation not waiting for review is; 0 when none is",
                age(|s| s.age(s.stats.most_overdue)),
            ),
            sample: backlog,
        }
    }
}

/// A gauge of operations (`{operation}`) observing what `read` returns, when it returns one.
fn count_gauge(
    meter: &Meter,
    name: &'static str,
    description: &'static str,
    read: impl Fn() -> Option<u64> + Send + Sync + 'static,
) -> ObservableGauge<u64> {
    let gauge = meter.u64_observable_gauge(name).with_unit("{operation}");
    observing(gauge, description, read).build()
}

/// A gauge of an age in seconds observing what `read` returns, when it returns one.
fn age_gauge(
    meter: &Meter,
    name: &'static str,
    description: &'static str,
    read: impl Fn() -> Option<f64> + Send + Sync + 'static,
) -> ObservableGauge<f64> {
    let gauge = meter.f64_observable_gauge(name).with_unit("s");
    observing(gauge, description, read).build()
}

/// `gauge` described and observing what `read` returns, when it returns one.
fn observing<'a, I, T: 'static>(
    gauge: AsyncInstrumentBuilder<'a, I, T>,
    description: &'static str,
    read: impl Fn() -> Option<T> + Send + Sync + 'static,
) -> AsyncInstrumentBuilder<'a, I, T> {
    gauge
        .with_description(description)
        .with_callback(move |gauge| {
            if let Some(value) = read() {
                gauge.observe(value, &[]);
            }
        })
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::disabled()
    }
}

impl Metrics {
    /// Instruments that record nothing (for embedding and tests that do not look).
    pub fn disabled() -> Self {
        Self::new(&opentelemetry::metrics::noop::NoopMeterProvider::new().meter(SCOPE))
    }

    /// Creates every instrument on `meter`.
    pub fn new(meter: &Meter) -> Self {
        Self {
            inner: Arc::new(Instruments {
                webhook_deliveries: counter(
                    meter,
                    "opjournal.webhook.deliveries",
                    "{delivery}",
                    "Escalation webhook delivery attempts, by outcome (delivered, failed, dead)",
                ),
                outbox: OutboxGauges::new(meter),
                admission: AdmissionInstruments::new(meter),
                rpc_duration: duration_histogram(
                    meter,
                    "rpc.server.call.duration",
                    "Duration of gRPC calls the server answered",
                ),
                begin_decisions: counter(
                    meter,
                    "opjournal.begin.decisions",
                    "{decision}",
                    "BeginOperation answers, by decision",
                ),
                conflicts: counter(
                    meter,
                    "opjournal.conflicts",
                    "{conflict}",
                    "Calls refused because the journal holds another state than the caller \
                     assumed, by ErrorInfo reason",
                ),
                transitions: counter(
                    meter,
                    "opjournal.operation.transitions",
                    "{transition}",
                    "Status transitions made by this process, by from and to status",
                ),
                lease_expiries: counter(
                    meter,
                    "opjournal.lease.expiries",
                    "{lease}",
                    "Leases that ended without a report: swept to unknown by the worker, \
                     or taken over by a Begin",
                ),
                duplicate_intents: counter(
                    meter,
                    "opjournal.duplicate_intents",
                    "{begin}",
                    "Begins with a new key for a request already registered, by what was done",
                ),
                reconcile_outcomes: counter(
                    meter,
                    "opjournal.reconcile.outcomes",
                    "{attempt}",
                    "Reconcile attempts, by provider adapter and outcome",
                ),
                lookup_duration: duration_histogram(
                    meter,
                    "opjournal.reconcile.lookup.duration",
                    "Duration of provider lookups, by provider adapter and observation",
                ),
                store_errors: counter(
                    meter,
                    "opjournal.store.errors",
                    "{error}",
                    "Failed store calls, by store operation and error type",
                ),
                backlog: BacklogGauges::new(meter),
            }),
        }
    }

    /// One gRPC call answered: `method` fully qualified (`opjournal.v1.OperationJournal/
    /// BeginOperation`, `_OTHER` for an unknown one), `status_code` the gRPC code's name
    /// (`OK`, `UNAVAILABLE`), `duration` until the last byte of the answer.
    pub fn rpc_call(&self, method: &'static str, status_code: &'static str, duration: Duration) {
        self.inner.rpc_duration.record(
            duration.as_secs_f64(),
            &[
                KeyValue::new("rpc.system.name", "grpc"),
                KeyValue::new("rpc.method", method),
                KeyValue::new("rpc.response.status_code", status_code),
            ],
        );
    }

    /// A call starts waiting in the admission queue: counted as queued until the returned
    /// guard is dropped, its wait recorded then by outcome.
    pub fn queued_call(&self) -> QueuedCall {
        self.inner.admission.queued.add(1, &[]);
        QueuedCall {
            metrics: self.clone(),
            since: Instant::now(),
            outcome: "abandoned",
        }
    }

    /// A BeginOperation decision (`execute`, `replay`, `in_progress`,
    /// `verification_required`, `duplicate_intent_suspected`).
    pub fn begin_decision(&self, decision: &'static str) {
        self.inner
            .begin_decisions
            .add(1, &[KeyValue::new("decision", decision)]);
    }

    /// Counts `error` if it is a conflict (the journal holds another state than the caller
    /// assumed); other errors are counted elsewhere or not at all.
    pub fn journal_error(&self, error: &JournalError) {
        if let Some(reason) = conflict_reason(error) {
            self.inner
                .conflicts
                .add(1, &[KeyValue::new("reason", reason)]);
        }
    }

    /// `count` operations moved from `from` (`None`: newly registered) to `to`.
    pub fn transitions(&self, from: Option<Status>, to: Status, count: u64) {
        if count == 0 || from == Some(to) {
            return;
        }
        self.inner.transitions.add(
            count,
            &[
                KeyValue::new("from", from.map_or("none", Status::as_str)),
                KeyValue::new("to", to.as_str()),
            ],
        );
    }

    /// `count` leases ended without a report, found by `detected_by` (`sweep` or `begin`).
    pub fn lease_expiries(&self, detected_by: &'static str, count: u64) {
        if count > 0 {
            self.inner
                .lease_expiries
                .add(count, &[KeyValue::new("detected_by", detected_by)]);
        }
    }

    /// A suspected duplicate intent, `held` or let through (`warned`).
    pub fn duplicate_intent(&self, held: bool) {
        let action = if held { "held" } else { "warned" };
        self.inner
            .duplicate_intents
            .add(1, &[KeyValue::new("action", action)]);
    }

    /// One reconcile attempt through `adapter` (`none` when the action has no lookup) and
    /// what it did (`marked_succeeded`, `kept_unknown`, ..., `error`).
    pub fn reconcile_outcome(&self, adapter: &str, outcome: &'static str) {
        self.inner.reconcile_outcomes.add(
            1,
            &[
                KeyValue::new("adapter", adapter.to_owned()),
                KeyValue::new("outcome", outcome),
            ],
        );
    }

    /// One provider lookup through `adapter` that took `duration` and saw `observation`
    /// (`succeeded`, `failed`, `pending`, `not_found`, `lookup_failed`).
    pub fn lookup(&self, adapter: &str, observation: &'static str, duration: Duration) {
        self.inner.lookup_duration.record(
            duration.as_secs_f64(),
            &[
                KeyValue::new("adapter", adapter.to_owned()),
                KeyValue::new("observation", observation),
            ],
        );
    }

    /// A failed store call: `operation` is the store method, `kind` what kind of failure
    /// (`unavailable` or `other`).
    pub fn store_error(&self, operation: &'static str, kind: &'static str) {
        self.inner.store_errors.add(
            1,
            &[
                KeyValue::new("operation", operation),
                KeyValue::new("error.type", kind),
            ],
        );
    }

    /// One escalation webhook delivery attempt ended: `delivered` (a 2xx answer), `failed`
    /// (to be tried again) or `dead` (failed, and the event is past its max age).
    pub fn webhook_delivery(&self, outcome: &'static str) {
        self.inner
            .webhook_deliveries
            .add(1, &[KeyValue::new("outcome", outcome)]);
    }

    /// Keeps `stats` for the outbox gauges (`None` clears them: a stale reading is worse
    /// than none).
    pub fn outbox_sampled(&self, stats: Option<OutboxStats>) {
        *self
            .inner
            .outbox
            .sample
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = stats.map(|s| (s, Instant::now()));
    }

    /// Reads the backlog from `store` once and keeps it for the gauges; a failed read clears
    /// them (a stale backlog is worse than none) and is returned.
    ///
    /// Errors: the store's.
    pub async fn sample_backlog<S: BacklogSource + ?Sized>(
        &self,
        store: &S,
    ) -> Result<(), S::Error> {
        let result = store.backlog().await;
        let sample = result.as_ref().ok().map(|stats| BacklogSample {
            stats: *stats,
            taken: Instant::now(),
        });
        *self
            .inner
            .backlog
            .sample
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = sample;
        result.map(|_| ())
    }

    /// Samples the backlog every `interval` until `shutdown`; failures are logged (once per
    /// outage) and retried at the next interval.
    pub async fn run_backlog_sampler<S: BacklogSource + ?Sized>(
        self,
        store: Arc<S>,
        interval: Duration,
        shutdown: CancellationToken,
    ) {
        let mut failing = false;
        loop {
            match self.sample_backlog(store.as_ref()).await {
                Ok(()) => failing = false,
                Err(error) if !failing => {
                    tracing::warn!(error = %error, "cannot sample the backlog; gauges cleared");
                    failing = true;
                }
                Err(_) => {}
            }
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep(interval) => {}
            }
        }
    }
}

/// The work waiting for the reconcile path and for people, for the backlog gauges of
/// [`crate::telemetry::metrics`].
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct BacklogStats {
    /// Operations in `unknown`, those waiting for review included.
    pub unknown: u64,
    /// How long the oldest unknown operation has been unknown (since `unknown_since`), by the
    /// database clock; `None` when no operation is unknown.
    pub oldest_unknown_age: Option<Duration>,
    /// Operations waiting for human review (`review_required_at` set).
    pub review_queue: u64,
    /// How long the operation longest in the review queue has waited (since
    /// `review_required_at`), by the database clock; `None` when the queue is empty.
    pub oldest_review_age: Option<Duration>,
    /// Unknown operations not waiting for review whose deadline has passed: they became
    /// unknown longer ago than their recorded policy's `unknown_after_seconds` (operations of
    /// actions without one never count).
    pub overdue: u64,
    /// How far past its deadline the most overdue of those is; `None` when none is.
    pub most_overdue: Option<Duration>,
}

impl BacklogStats {
    /// From the backlog statement's columns, three pairs of a count and the largest age in
    /// seconds among those counted: unknown operations and the oldest one's age, the review
    /// queue and its longest wait, overdue operations and the largest overrun. An age is
    /// `None` when nothing is counted; a clock step may make it slightly negative (read as 0).
    pub fn from_columns(
        (unknown, oldest_unknown_seconds): (i64, Option<f64>),
        (review_queue, oldest_review_seconds): (i64, Option<f64>),
        (overdue, most_overdue_seconds): (i64, Option<f64>),
    ) -> Self {
        let count = |n: i64| u64::try_from(n).unwrap_or(0);
        let age = |seconds: Option<f64>| {
            seconds
                .filter(|s| s.is_finite())
                .map(|s| Duration::from_secs_f64(s.max(0.0)))
        };
        Self {
            unknown: count(unknown),
            oldest_unknown_age: age(oldest_unknown_seconds),
            review_queue: count(review_queue),
            oldest_review_age: age(oldest_review_seconds),
            overdue: count(overdue),
            most_overdue: age(most_overdue_seconds),
        }
    }
}

/// The escalation outbox's state, for the webhook gauges.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct OutboxStats {
    /// Events not yet delivered (and not given up on).
    pub pending: u64,
    /// How long the oldest pending event has waited since it occurred, by the database
    /// clock; `None` when none is pending.
    pub oldest_pending_age: Option<Duration>,
    /// Events given up on after their max age.
    pub dead: u64,
}

impl OutboxStats {
    /// From the outbox statement's three columns (counts, and the oldest pending event's age
    /// in seconds).
    pub fn from_columns(pending: i64, oldest_pending_seconds: Option<f64>, dead: i64) -> Self {
        Self {
            pending: u64::try_from(pending).unwrap_or(0),
            oldest_pending_age: oldest_pending_seconds
                .filter(|s| s.is_finite())
                .map(|s| Duration::from_secs_f64(s.max(0.0))),
            dead: u64::try_from(dead).unwrap_or(0),
        }
    }
}

/// Where the backlog gauges read from: the journal's store.
#[async_trait::async_trait]
pub trait BacklogSource: Send + Sync {
    /// Why a read failed.
    type Error: std::fmt::Display + Send;

    /// One read of the backlog.
    async fn backlog(&self) -> Result<BacklogStats, Self::Error>;
}

/// The ErrorInfo reason of a conflict: an error that says the journal holds another state
/// than the caller assumed.
fn conflict_reason(error: &JournalError) -> Option<String> {
    match error {
        JournalError::KeyReused
        | JournalError::LeaseLost
        | JournalError::OutcomeAlreadyRecorded { .. }
        | JournalError::Contention
        | JournalError::OperationChanged { .. }
        | JournalError::ReconcileInProgress => Some(error.reason().to_string()),
        _ => None,
    }
}
