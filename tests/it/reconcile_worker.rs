//! The reconcile worker over real gRPC, Postgres and the sandbox provider: sweeping expired
//! leases, lookup lag and the absence grace window, replicas, races with the lease holder,
//! escalation and human review.

use crate::common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use common::*;
use opjournal::domain::policy::Policy;
use opjournal::proto::{
    ActorKind, CompleteOperationRequest, Decision, GetOperationHistoryRequest,
    ListOperationsForReviewRequest, OperationStatus, ResolveOperationRequest, ResolveSucceeded,
    resolve_operation_request::Resolution,
};
use opjournal::reconcile::worker::{Worker, WorkerConfig};
use opjournal::reconcile::{AdapterSet, LookupRequest, Observation, ProviderAdapter, Reconciler};
use opjournal::store::{JournalStore, PgStore};
use opjournal_sandbox::SandboxConfig;
use sqlx::PgPool;
use tokio::sync::Notify;
use tonic::Code;

/// Begins a payment and loses the provider's answer after the provider committed it.
async fn unknown_payment(app: &TestApp, key: &str, action: &str, fault: &str) -> String {
    let begin = app.begin(key, action, PAY_817).await.unwrap();
    assert_eq!(decision(&begin), Decision::Execute);
    assert!(
        app.pay(key, PAY_817, Some(fault))
            .await
            .is_none_or(|(s, _)| s >= 500)
    );
    app.report_unknown(&begin.lease_token).await;
    begin.lease_token
}

/// Begins the payment `PAYMENT_KEY` under `action` whose request never reaches the
/// provider's store (`fail-before-store`), and reports the outcome unknown.
async fn unreached_payment(app: &TestApp, action: &str) {
    unknown_payment(app, PAYMENT_KEY, action, "fail-before-store").await;
}

/// Begins `count` operations `payment:<name>-<i>` of `create_payment_bulk` that never call
/// the provider and reports each unknown; their keys.
async fn unknown_without_effect(app: &TestApp, name: &str, count: usize) -> Vec<String> {
    let mut keys = Vec::new();
    for i in 0..count {
        let key = format!("payment:{name}-{i}");
        let begin = app
            .begin(&key, "create_payment_bulk", PAY_817)
            .await
            .unwrap();
        app.report_unknown(&begin.lease_token).await;
        keys.push(key);
    }
    keys
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn a_holder_that_dies_after_the_effect_is_swept_to_unknown_and_settled_by_lookup(
    pool: PgPool,
) {
    let app = TestApp::spawn(pool).await;
    // The holder claims with a 1 s lease, the provider stores the effect, the holder dies.
    let begin = app
        .begin_in("", PAYMENT_KEY, "create_payment", PAY_817, 1)
        .await
        .unwrap();
    assert_eq!(decision(&begin), Decision::Execute);
    let (status, payment) = app.pay(PAYMENT_KEY, PAY_817, None).await.unwrap();
    assert_eq!(status, 201);
    // Another holder's live lease must never be swept.
    let live = app
        .begin_in("", "payment:live", "create_payment", PAY_817, 30)
        .await
        .unwrap();
    assert_eq!(decision(&live), Decision::Execute);

    let worker = app.worker("worker-a");
    let early = worker.tick().await.unwrap();
    assert_eq!(
        (early.swept, early.looked_up),
        (0, 0),
        "a live lease is left alone"
    );
    app.clock.advance(Duration::from_millis(1300));
    let stats = worker.tick().await.unwrap();
    assert_eq!((stats.swept, stats.looked_up, stats.settled), (1, 1, 1));

    let op = app.get(PAYMENT_KEY).await;
    assert_eq!(op_status(&op), OperationStatus::Succeeded);
    assert_eq!(op.external_id.as_deref(), payment["id"].as_str());
    assert_eq!(
        op_status(&app.get("payment:live").await),
        OperationStatus::InProgress
    );
    assert_eq!(app.counts(PAYMENT_KEY).effects, 1);
    let replay = app
        .begin(PAYMENT_KEY, "create_payment", PAY_817)
        .await
        .unwrap();
    assert_eq!(decision(&replay), Decision::Replay);

    // The history names each step and actor.
    let history = history(&app, PAYMENT_KEY).await;
    let steps: Vec<_> = history
        .iter()
        .map(|e| (e.to_status, e.actor_kind, e.reason.as_str()))
        .collect();
    assert_eq!(
        steps,
        vec![
            (
                OperationStatus::InProgress as i32,
                ActorKind::Client as i32,
                "registered"
            ),
            (
                OperationStatus::Unknown as i32,
                ActorKind::Worker as i32,
                "lease_expired"
            ),
            (
                OperationStatus::Succeeded as i32,
                ActorKind::Worker as i32,
                "found_succeeded"
            ),
        ]
    );
    assert_eq!(history[1].actor, "worker-a");
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn lookup_lag_keeps_the_operation_unknown_until_the_object_appears(pool: PgPool) {
    let config = SandboxConfig {
        lookup_lag: Duration::from_secs(3),
        ..SandboxConfig::default()
    };
    let app = TestApp::spawn_with(pool, config, 30).await;
    unknown_payment(&app, PAYMENT_KEY, "create_payment", "commit-then-timeout").await;
    let worker = app.worker("worker-a");
    let started = Instant::now();
    let mut not_found_checks = 0;
    loop {
        let stats = worker.tick().await.unwrap();
        let op = app.get(PAYMENT_KEY).await;
        let status = op_status(&op);
        assert_ne!(
            status,
            OperationStatus::Pending,
            "released while absence could change"
        );
        if status == OperationStatus::Succeeded {
            break;
        }
        assert_eq!(status, OperationStatus::Unknown);
        not_found_checks += stats.looked_up;
        assert!(started.elapsed() < Duration::from_secs(20), "never settled");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(
        not_found_checks >= 1,
        "the first check must have come before the object appeared"
    );
    let counts = app.counts(PAYMENT_KEY);
    assert_eq!(counts.effects, 1);
    assert_eq!(counts.lookups, not_found_checks + 1);
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn definitive_absence_after_the_grace_window_releases_the_key_for_retry(pool: PgPool) {
    let app = TestApp::spawn_with(pool, SandboxConfig::default(), 1).await;
    // The provider failed before storing anything, but the caller cannot know that.
    unknown_payment(&app, PAYMENT_KEY, "create_payment", "fail-before-store").await;
    let worker = app.worker("worker-a");
    let first = worker.tick().await.unwrap();
    assert_eq!(
        (first.looked_up, first.released),
        (1, 0),
        "inside the grace window"
    );
    assert_eq!(
        op_status(&app.get(PAYMENT_KEY).await),
        OperationStatus::Unknown
    );

    let started = Instant::now();
    while op_status(&app.get(PAYMENT_KEY).await) != OperationStatus::Pending {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "never released"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
        worker.tick().await.unwrap();
    }
    let again = app
        .begin(PAYMENT_KEY, "create_payment", PAY_817)
        .await
        .unwrap();
    assert_eq!(decision(&again), Decision::Execute);
    assert_eq!(again.operation.as_ref().unwrap().attempt_count, 2);
    let (status, payment) = app.pay(PAYMENT_KEY, PAY_817, None).await.unwrap();
    assert_eq!(status, 201);
    app.journal
        .clone()
        .complete_operation(CompleteOperationRequest {
            lease_token: again.lease_token,
            external_id: payment["id"].as_str().unwrap().into(),
            result_json: String::new(),
        })
        .await
        .unwrap();
    assert_eq!(app.counts(PAYMENT_KEY).effects, 1);
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn two_replicas_look_each_due_operation_up_exactly_once(pool: PgPool) {
    let app = TestApp::spawn_with(pool, SandboxConfig::default(), 3600).await;
    let keys = unknown_without_effect(&app, "bulk", 200).await;
    let drain = |worker: Worker| async move {
        let mut looked_up = 0;
        loop {
            let stats = worker.tick().await.unwrap();
            if stats.looked_up == 0 {
                return looked_up;
            }
            looked_up += stats.looked_up;
        }
    };
    let (a, b) = tokio::join!(
        drain(app.worker("replica-a")),
        drain(app.worker("replica-b"))
    );
    assert_eq!(a + b, 200);
    for key in &keys {
        assert_eq!(
            app.counts(key).lookups,
            1,
            "{key} was looked up more than once"
        );
        assert_eq!(app.get(key).await.reconcile_attempts, 1);
    }
}

/// The real HTTP adapter, held at the door until the test opens it.
struct GatedAdapter {
    inner: Arc<dyn ProviderAdapter>,
    entered: Arc<Notify>,
    gate: Arc<Notify>,
}

#[async_trait]
impl ProviderAdapter for GatedAdapter {
    async fn lookup(&self, request: &LookupRequest) -> Observation {
        self.entered.notify_one();
        self.gate.notified().await;
        self.inner.lookup(request).await
    }
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn a_completion_by_the_holder_during_a_reconcile_stands(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    // The holder's call is slow: its 1 s lease ends before the provider answers.
    let begin = app
        .begin_in("", PAYMENT_KEY, "create_payment", PAY_817, 1)
        .await
        .unwrap();
    let token = begin.lease_token;
    assert!(
        app.pay(PAYMENT_KEY, PAY_817, Some("commit-then-timeout"))
            .await
            .is_none()
    );
    app.clock.advance(Duration::from_millis(1300));

    let policy = Arc::new(Policy::parse(&app.policy_yaml, "test-policy.yaml").unwrap());
    let mut adapters = AdapterSet::from_policy(&policy).unwrap();
    let (entered, gate) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    adapters.insert(
        "sandbox_payments",
        Arc::new(GatedAdapter {
            inner: adapters.get("sandbox_payments").unwrap().clone(),
            entered: entered.clone(),
            gate: gate.clone(),
        }),
    );
    let store: Arc<dyn JournalStore> =
        Arc::new(PgStore::new(app.pool().clone()).with_clock(app.clock.clone()));
    let worker = Worker::new(
        Reconciler::new(store, policy, adapters, "worker-a"),
        WorkerConfig::default(),
    );
    let tick = tokio::spawn(async move { worker.tick().await.unwrap() });
    entered.notified().await;

    // The worker swept the lease and is looking the operation up when the late answer
    // reaches the holder, which completes with its token: no later attempt exists.
    let done = app
        .journal
        .clone()
        .complete_operation(CompleteOperationRequest {
            lease_token: token,
            external_id: "pay_from_holder".into(),
            result_json: r#"{"by":"holder"}"#.into(),
        })
        .await
        .unwrap()
        .into_inner()
        .operation
        .unwrap();
    gate.notify_one();
    let stats = tick.await.unwrap();
    assert_eq!(
        (stats.looked_up, stats.superseded, stats.settled),
        (1, 1, 0)
    );
    let op = app.get(PAYMENT_KEY).await;
    assert_eq!(op, done, "the holder's completion stands");
    assert_eq!(op.external_id.as_deref(), Some("pay_from_holder"));
}

async fn history(app: &TestApp, key: &str) -> Vec<opjournal::proto::OperationEvent> {
    app.reconciler
        .clone()
        .get_operation_history(GetOperationHistoryRequest {
            operation_key: key.into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .events
}

async fn review_keys(app: &TestApp) -> Vec<String> {
    app.reconciler
        .clone()
        .list_operations_for_review(ListOperationsForReviewRequest::default())
        .await
        .unwrap()
        .into_inner()
        .operations
        .into_iter()
        .map(|o| o.operation_key)
        .collect()
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn an_email_without_lookup_goes_to_review_and_is_never_resent(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    let key = "email:case-442:confirmation-v1";
    let payload = r#"{"case":"442","template":"confirmation-v1"}"#;
    let begin = app.begin(key, "send_email", payload).await.unwrap();
    assert_eq!(decision(&begin), Decision::Execute);
    assert_eq!(app.send_email(key, Some("commit-then-timeout")).await, None);
    app.report_unknown(&begin.lease_token).await;

    let worker = app.worker("worker-a");
    let stats = worker.tick().await.unwrap();
    assert_eq!(stats.escalated, 1);
    assert_eq!(review_keys(&app).await, vec![key.to_owned()]);
    for _ in 0..3 {
        let again = app.begin(key, "send_email", payload).await.unwrap();
        assert_eq!(decision(&again), Decision::VerificationRequired);
        let idle = worker.tick().await.unwrap();
        assert_eq!(
            idle.looked_up, 0,
            "no automatic work on an operation under review"
        );
    }
    let op = app.get(key).await;
    assert_eq!(op.review_reason, "no_provider_lookup");
    assert_eq!(op.reconcile_attempts, 0);
    assert_eq!(app.counts(key).effects, 1);

    // A person checks the provider's dashboard and resolves it.
    let stale = app
        .reconciler
        .clone()
        .resolve_operation(ResolveOperationRequest {
            operation_key: key.into(),
            expected_attempt_count: 2,
            reviewer: "alice".into(),
            reason: "seen in the provider's log".into(),
            resolution: Some(Resolution::Succeeded(ResolveSucceeded::default())),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(
        (stale.code(), reason(&stale).as_str()),
        (Code::FailedPrecondition, "OPERATION_CHANGED")
    );
    let resolved = app.resolve_as_sent(key).await;
    assert_eq!(op_status(&resolved), OperationStatus::Succeeded);
    assert!(resolved.review_required_at.is_none());
    assert!(review_keys(&app).await.is_empty());
    let replay = app.begin(key, "send_email", payload).await.unwrap();
    assert_eq!(decision(&replay), Decision::Replay);
    assert_eq!(app.counts(key).effects, 1, "never re-sent");

    let steps: Vec<_> = history(&app, key)
        .await
        .iter()
        .map(|e| {
            (
                e.to_status,
                e.review_required,
                e.actor_kind,
                e.actor.clone(),
                e.reason.clone(),
            )
        })
        .collect();
    let client = ActorKind::Client as i32;
    assert_eq!(
        steps,
        vec![
            (
                OperationStatus::InProgress as i32,
                false,
                client,
                String::new(),
                "registered".into()
            ),
            (
                OperationStatus::Unknown as i32,
                false,
                client,
                String::new(),
                "timeout".into()
            ),
            (
                OperationStatus::Unknown as i32,
                true,
                ActorKind::Worker as i32,
                "worker-a".into(),
                "no_lookup; escalated:no_provider_lookup".into()
            ),
            (
                OperationStatus::Succeeded as i32,
                false,
                ActorKind::Reviewer as i32,
                "alice".into(),
                "seen in the provider's log".into()
            ),
        ]
    );
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn an_operation_unknown_past_its_deadline_is_escalated_and_lookups_stop(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    // Nothing reaches the provider, so every lookup says "not found" inside the grace window.
    unreached_payment(&app, "create_payment_deadline").await;
    let worker = app.worker("worker-a");
    let first = worker.tick().await.unwrap();
    assert_eq!((first.looked_up, first.escalated), (1, 0));
    assert!(review_keys(&app).await.is_empty());

    let started = Instant::now();
    while review_keys(&app).await.is_empty() {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "never escalated"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
        worker.tick().await.unwrap();
    }
    let op = app.get(PAYMENT_KEY).await;
    assert_eq!(op_status(&op), OperationStatus::Unknown);
    assert_eq!(op.review_reason, "unresolved_after_deadline");
    assert!(op.next_check_at.is_none());
    let lookups = app.counts(PAYMENT_KEY).lookups;
    app.clock.advance(Duration::from_millis(1200));
    for _ in 0..3 {
        assert_eq!(worker.tick().await.unwrap().looked_up, 0);
    }
    assert_eq!(
        app.counts(PAYMENT_KEY).lookups,
        lookups,
        "automatic lookups stopped"
    );
}

/// The real HTTP adapter, slowed down.
struct SlowAdapter {
    inner: Arc<dyn ProviderAdapter>,
    delay: Duration,
}

#[async_trait]
impl ProviderAdapter for SlowAdapter {
    async fn lookup(&self, request: &LookupRequest) -> Observation {
        tokio::time::sleep(self.delay).await;
        self.inner.lookup(request).await
    }
}

fn worker_with_adapter(
    app: &TestApp,
    name: &str,
    wrap: impl FnOnce(Arc<dyn ProviderAdapter>) -> Arc<dyn ProviderAdapter>,
    config: WorkerConfig,
) -> Worker {
    let policy = Arc::new(Policy::parse(&app.policy_yaml, "test-policy.yaml").unwrap());
    let mut adapters = AdapterSet::from_policy(&policy).unwrap();
    let inner = adapters.get("sandbox_payments").unwrap().clone();
    adapters.insert("sandbox_payments", wrap(inner));
    let store: Arc<dyn JournalStore> = Arc::new(PgStore::new(app.pool().clone()));
    Worker::new(Reconciler::new(store, policy, adapters, name), config)
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn slow_lookups_are_never_repeated_by_another_replica(pool: PgPool) {
    let app = TestApp::spawn_with(pool, SandboxConfig::default(), 3600).await;
    let keys = unknown_without_effect(&app, "slow", 16).await;
    // Each lookup takes 0.7 s; the claim hold is 1.5 s; a batch of 16 at 4 at a time takes
    // about 3 s, so a batch claimed at once would be claimed again by the other replica.
    let config = WorkerConfig {
        batch_size: 50,
        concurrency: 4,
        claim_hold: Duration::from_millis(1500),
        ..WorkerConfig::default()
    };
    let slow = |inner| -> Arc<dyn ProviderAdapter> {
        Arc::new(SlowAdapter {
            inner,
            delay: Duration::from_millis(700),
        })
    };
    let a = worker_with_adapter(&app, "replica-a", slow, config.clone());
    let b = worker_with_adapter(&app, "replica-b", slow, config);
    // Replica B polls all the while replica A works through its batch.
    let done = Arc::new(Notify::new());
    let a_done = done.clone();
    let (ra, rb) = tokio::join!(
        async move {
            let stats = a.tick().await.unwrap();
            a_done.notify_one();
            stats
        },
        async {
            let mut looked_up = 0;
            loop {
                tokio::select! {
                    () = done.notified() => return looked_up,
                    () = tokio::time::sleep(Duration::from_millis(200)) => {
                        looked_up += b.tick().await.unwrap().looked_up;
                    }
                }
            }
        }
    );
    assert_eq!(ra.looked_up + rb, 16);
    for key in &keys {
        assert_eq!(app.counts(key).lookups, 1, "{key} was looked up twice");
    }
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn escalation_happens_at_the_deadline_not_at_the_next_scheduled_check(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    // The schedule says every 30 s; the deadline is 1 s.
    unreached_payment(&app, "create_payment_deadline_slow").await;
    let worker = app.worker("worker-a");
    assert_eq!(worker.tick().await.unwrap().looked_up, 1);
    let op = app.get(PAYMENT_KEY).await;
    let next = op.next_check_at.unwrap().seconds - op.updated_at.unwrap().seconds;
    assert!(
        next <= 2,
        "the next check waits for the deadline, not 30 s: {next} s"
    );
    let started = Instant::now();
    while review_keys(&app).await.is_empty() {
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "escalation came late"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
        worker.tick().await.unwrap();
    }
    // An operator's reconcile of an escalated operation keeps it out of automatic lookups.
    let reconciled = app
        .reconcile("", PAYMENT_KEY)
        .await
        .unwrap()
        .operation
        .unwrap();
    assert!(reconciled.review_required_at.is_some());
    assert!(
        reconciled.next_check_at.is_none(),
        "back in automatic lookups"
    );
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn an_operators_reconcile_never_runs_beside_a_workers_lookup(pool: PgPool) {
    let app = TestApp::spawn_with(pool, SandboxConfig::default(), 3600).await;
    unknown_payment(&app, PAYMENT_KEY, "create_payment", "commit-then-timeout").await;
    let (entered, gate) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let (e, g) = (entered.clone(), gate.clone());
    let worker = worker_with_adapter(
        &app,
        "worker-a",
        move |inner| {
            Arc::new(GatedAdapter {
                inner,
                entered: e,
                gate: g,
            })
        },
        WorkerConfig::default(),
    );
    let tick = tokio::spawn(async move { worker.tick().await.unwrap() });
    entered.notified().await;
    let err = app.reconcile("", PAYMENT_KEY).await.unwrap_err();
    assert_eq!(
        (err.code(), reason(&err).as_str()),
        (Code::FailedPrecondition, "RECONCILE_IN_PROGRESS")
    );
    gate.notify_one();
    assert_eq!(tick.await.unwrap().settled, 1);
    assert_eq!(app.counts(PAYMENT_KEY).lookups, 1);
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn not_found_from_an_incomplete_search_never_releases(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    unreached_payment(&app, "create_payment_incomplete").await;
    let worker = app.worker("worker-a");
    let stats = worker.tick().await.unwrap();
    assert_eq!((stats.looked_up, stats.released), (1, 0));
    assert_eq!(
        op_status(&app.get(PAYMENT_KEY).await),
        OperationStatus::Unknown
    );
}
