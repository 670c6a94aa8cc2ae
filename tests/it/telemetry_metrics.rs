//! The Prometheus scrape endpoint after a scenario that produces every metric: names, units,
//! types, labels and values.

use crate::common;

use common::observe::{PgProxy, metric_type, samples, value, wait_health};
use common::*;
use opjournal::proto::{CompleteOperationRequest, Decision};
use opjournal::store::PgStore;
use opjournal::telemetry::{Telemetry, TelemetryOptions};
use opjournal_sandbox::SandboxConfig;
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;
use tonic::Code;
use tonic_health::pb::health_check_response::ServingStatus;

const BEGIN: &str = "opjournal.v1.OperationJournal/BeginOperation";
const COMPLETE: &str = "opjournal.v1.OperationJournal/CompleteOperation";
const REPORT: &str = "opjournal.v1.OperationJournal/ReportUnknownOutcome";

async fn complete(app: &TestApp, token: &str) -> Result<(), tonic::Status> {
    app.journal
        .clone()
        .complete_operation(CompleteOperationRequest {
            lease_token: token.into(),
            external_id: "pay_1".into(),
            result_json: String::new(),
        })
        .await
        .map(|_| ())
}

async fn expire_lease(app: &TestApp, key: &str) {
    sqlx::query(
        "UPDATE agent_operations SET lease_until = now() - interval '1 second' \
         WHERE operation_key = $1",
    )
    .bind(key)
    .execute(app.pool())
    .await
    .unwrap();
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn the_scrape_endpoint_exposes_every_metric_with_its_unit_and_labels(pool: PgPool) {
    let telemetry = Telemetry::new(&TelemetryOptions::local("opjournal-test")).unwrap();
    let proxy = PgProxy::start().await;
    let database_url = TestDb::Postgres(pool.clone()).url();
    let store = PgStore::connect_lazy(&proxy.url_for(&database_url), 5).unwrap();
    let options = SpawnOptions {
        metrics: telemetry.metrics().clone(),
        store: Some(store),
        ..SpawnOptions::default()
    };
    let app = TestApp::spawn_full(pool, SandboxConfig::default(), 0, options).await;
    let stop = CancellationToken::new();
    let (metrics_address, _) =
        opjournal::app::serve_metrics(&telemetry, "127.0.0.1:0".parse().unwrap(), stop.clone())
            .await
            .unwrap()
            .unwrap();
    wait_health(app.addr, "readiness", ServingStatus::Serving as i32).await;

    // Execute, complete, replay, and a conflicting payload under the same key.
    let first = app
        .begin("metric-key-01", "create_payment", PAY_817)
        .await
        .unwrap();
    complete(&app, &first.lease_token).await.unwrap();
    assert_eq!(
        app.begin_decision("metric-key-01", "create_payment", PAY_817)
            .await,
        Decision::Replay
    );
    assert_eq!(
        app.begin_refusal("metric-key-01", "create_payment", PAY_817_OTHER_AMOUNT)
            .await,
        "IDEMPOTENCY_KEY_REUSED"
    );
    // A live lease answers in_progress.
    app.begin("metric-key-02", "create_payment", PAY_817)
        .await
        .unwrap();
    let busy = app
        .begin("metric-key-02", "create_payment", PAY_817)
        .await
        .unwrap();
    assert_eq!(decision(&busy), Decision::InProgress);
    // An ended lease taken over by a Begin; the old holder's report is refused.
    let stale = app
        .begin("metric-key-03", "create_payment_dedup", PAY_817)
        .await
        .unwrap();
    expire_lease(&app, "metric-key-03").await;
    let takeover = app
        .begin("metric-key-03", "create_payment_dedup", PAY_817)
        .await
        .unwrap();
    assert_eq!(decision(&takeover), Decision::Execute);
    let lost = complete(&app, &stale.lease_token).await.unwrap_err();
    assert_eq!(
        (lost.code(), reason(&lost).as_str()),
        (Code::Aborted, "LEASE_LOST")
    );
    // A lost answer after the provider committed: unknown, then verification_required.
    let lost_answer = app
        .begin("metric-key-04", "create_payment", PAY_817)
        .await
        .unwrap();
    assert!(
        app.pay("metric-key-04", PAY_817, Some("commit-then-timeout"))
            .await
            .is_none()
    );
    app.report_unknown(&lost_answer.lease_token).await;
    let verify = app
        .begin("metric-key-04", "create_payment", PAY_817)
        .await
        .unwrap();
    assert_eq!(decision(&verify), Decision::VerificationRequired);
    // A holder that dies: its lease is swept.
    app.begin("metric-key-05", "create_payment", PAY_817)
        .await
        .unwrap();
    expire_lease(&app, "metric-key-05").await;
    // An e-mail without lookup (escalated) and a payment still not found (kept unknown).
    let email = app
        .begin("metric-key-06", "send_email", r#"{"to":"x"}"#)
        .await
        .unwrap();
    app.report_unknown(&email.lease_token).await;
    let bulk = app
        .begin("metric-key-07", "create_payment_bulk", PAY_817)
        .await
        .unwrap();
    app.report_unknown(&bulk.lease_token).await;
    // The same request under a new key is held.
    app.begin("metric-key-08", "create_payment_hold", PAY_817)
        .await
        .unwrap();
    let held = app
        .begin("metric-key-09", "create_payment_hold", PAY_817)
        .await
        .unwrap();
    assert_eq!(decision(&held), Decision::DuplicateIntentSuspected);

    // One worker poll: sweep 05, then look 04, 05, 06 and 07 up.
    let stats = app.worker("metrics-worker").tick().await.unwrap();
    assert_eq!(
        (
            stats.swept,
            stats.looked_up,
            stats.settled,
            stats.released,
            stats.escalated
        ),
        (1, 4, 1, 1, 1)
    );
    app.metrics
        .sample_backlog(&PgStore::new(app.pool().clone()))
        .await
        .unwrap();

    // The database goes away: a Begin is refused with STORE_UNAVAILABLE.
    proxy.cut();
    wait_health(app.addr, "readiness", ServingStatus::NotServing as i32).await;
    let down = app
        .begin("metric-key-10", "create_payment", PAY_817)
        .await
        .unwrap_err();
    assert_eq!(
        (down.code(), reason(&down).as_str()),
        (Code::Unavailable, "STORE_UNAVAILABLE")
    );
    proxy.restore();
    wait_health(app.addr, "readiness", ServingStatus::Serving as i32).await;

    let text = reqwest::get(format!("http://{metrics_address}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let s = samples(&text);
    let get = |name: &str, labels: &[(&str, &str)]| {
        value(&s, name, labels).unwrap_or_else(|| panic!("no {name} {labels:?} in\n{text}"))
    };

    // Types and units: base units in the name, counters end in _total.
    for (family, kind) in [
        ("rpc_server_call_duration_seconds", "histogram"),
        ("opjournal_reconcile_lookup_duration_seconds", "histogram"),
        ("opjournal_begin_decisions_total", "counter"),
        ("opjournal_conflicts_total", "counter"),
        ("opjournal_operation_transitions_total", "counter"),
        ("opjournal_lease_expiries_total", "counter"),
        ("opjournal_duplicate_intents_total", "counter"),
        ("opjournal_reconcile_outcomes_total", "counter"),
        ("opjournal_store_errors_total", "counter"),
        ("opjournal_unknown_operations", "gauge"),
        ("opjournal_unknown_oldest_age_seconds", "gauge"),
        ("opjournal_review_queue_size", "gauge"),
        ("opjournal_review_oldest_age_seconds", "gauge"),
        ("opjournal_unknown_overdue_operations", "gauge"),
        ("opjournal_unknown_overdue_max_seconds", "gauge"),
    ] {
        assert_eq!(
            metric_type(&text, family).as_deref(),
            Some(kind),
            "{family}\n{text}"
        );
    }

    // RPC durations, by method and status code.
    let rpc = |method: &str, code: &str| {
        get(
            "rpc_server_call_duration_seconds_count",
            &[
                ("rpc_system_name", "grpc"),
                ("rpc_method", method),
                ("rpc_response_status_code", code),
            ],
        )
    };
    assert_eq!(rpc(BEGIN, "OK"), 13.0);
    assert_eq!(rpc(BEGIN, "ALREADY_EXISTS"), 1.0);
    assert_eq!(rpc(BEGIN, "UNAVAILABLE"), 1.0);
    assert_eq!(rpc(COMPLETE, "OK"), 1.0);
    assert_eq!(rpc(COMPLETE, "ABORTED"), 1.0);
    assert_eq!(rpc(REPORT, "OK"), 3.0);
    let bucket = s
        .iter()
        .find(|x| {
            x.name == "rpc_server_call_duration_seconds_bucket"
                && x.labels.get("rpc_method").map(String::as_str) == Some(BEGIN)
                && x.labels.get("le").map(String::as_str) == Some("+Inf")
                && x.labels.get("rpc_response_status_code").map(String::as_str) == Some("OK")
        })
        .unwrap();
    assert_eq!(bucket.value, 13.0);
    assert!(
        get(
            "rpc_server_call_duration_seconds_sum",
            &[
                ("rpc_system_name", "grpc"),
                ("rpc_method", BEGIN),
                ("rpc_response_status_code", "OK"),
            ],
        ) > 0.0
    );

    // Begin decisions.
    let decisions = |d: &str| get("opjournal_begin_decisions_total", &[("decision", d)]);
    assert_eq!(decisions("execute"), 9.0);
    assert_eq!(decisions("replay"), 1.0);
    assert_eq!(decisions("in_progress"), 1.0);
    assert_eq!(decisions("verification_required"), 1.0);
    assert_eq!(decisions("duplicate_intent_suspected"), 1.0);

    // Conflicts, by ErrorInfo reason.
    let conflicts = |r: &str| get("opjournal_conflicts_total", &[("reason", r)]);
    assert_eq!(conflicts("IDEMPOTENCY_KEY_REUSED"), 1.0);
    assert_eq!(conflicts("LEASE_LOST"), 1.0);

    // Transitions by from and to status.
    let moved = |from: &str, to: &str| {
        get(
            "opjournal_operation_transitions_total",
            &[("from", from), ("to", to)],
        )
    };
    assert_eq!(moved("none", "in_progress"), 8.0);
    assert_eq!(moved("in_progress", "succeeded"), 1.0);
    assert_eq!(moved("in_progress", "unknown"), 4.0);
    assert_eq!(moved("unknown", "succeeded"), 1.0);
    assert_eq!(moved("unknown", "pending"), 1.0);

    // Lease expiries and duplicate intents.
    assert_eq!(
        get(
            "opjournal_lease_expiries_total",
            &[("detected_by", "begin")]
        ),
        1.0
    );
    assert_eq!(
        get(
            "opjournal_lease_expiries_total",
            &[("detected_by", "sweep")]
        ),
        1.0
    );
    assert_eq!(
        get("opjournal_duplicate_intents_total", &[("action", "held")]),
        1.0
    );

    // Reconcile outcomes and lookup latency, by adapter.
    let outcome = |adapter: &str, o: &str| {
        get(
            "opjournal_reconcile_outcomes_total",
            &[("adapter", adapter), ("outcome", o)],
        )
    };
    assert_eq!(outcome("sandbox_payments", "marked_succeeded"), 1.0);
    assert_eq!(outcome("sandbox_payments", "released_for_retry"), 1.0);
    assert_eq!(outcome("sandbox_payments", "kept_unknown"), 1.0);
    assert_eq!(outcome("none", "escalated"), 1.0);
    let lookups = |o: &str| {
        get(
            "opjournal_reconcile_lookup_duration_seconds_count",
            &[("adapter", "sandbox_payments"), ("observation", o)],
        )
    };
    assert_eq!(lookups("succeeded"), 1.0);
    assert_eq!(lookups("not_found"), 2.0);

    // The backlog: the e-mail (under review) and the bulk payment are unknown.
    assert_eq!(get("opjournal_unknown_operations", &[]), 2.0);
    assert_eq!(get("opjournal_review_queue_size", &[]), 1.0);
    assert!(get("opjournal_unknown_oldest_age_seconds", &[]) >= 0.0);
    assert!(get("opjournal_review_oldest_age_seconds", &[]) >= 0.0);
    // Neither action has an unknown_after_seconds: nothing is past a deadline.
    assert_eq!(get("opjournal_unknown_overdue_operations", &[]), 0.0);
    assert_eq!(get("opjournal_unknown_overdue_max_seconds", &[]), 0.0);

    // Store errors, by operation and error type.
    assert_eq!(
        get(
            "opjournal_store_errors_total",
            &[("operation", "register"), ("error_type", "unavailable")],
        ),
        1.0
    );

    // No label carries a key, a payload or a namespace value.
    // (Only label sets are searched: a sample value such as 0.0247744900 may hold any digits.)
    let labels: Vec<&str> = text
        .lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| Some(&line[line.find('{')?..=line.rfind('}')?]))
        .collect();
    assert!(!labels.is_empty(), "{text}");
    for label_set in labels {
        assert!(!label_set.contains("metric-key-"), "{label_set}");
        assert!(!label_set.contains("490000"), "{label_set}");
    }

    // A backlog that cannot be read is not shown stale: the gauges go away.
    proxy.cut();
    assert!(
        app.metrics
            .sample_backlog(app.parts.store.as_ref())
            .await
            .is_err()
    );
    let text = reqwest::get(format!("http://{metrics_address}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let s = samples(&text);
    for gauge in [
        "opjournal_unknown_operations",
        "opjournal_unknown_oldest_age_seconds",
        "opjournal_review_queue_size",
        "opjournal_review_oldest_age_seconds",
        "opjournal_unknown_overdue_operations",
        "opjournal_unknown_overdue_max_seconds",
    ] {
        assert_eq!(value(&s, gauge, &[]), None, "{gauge}\n{text}");
    }
    proxy.restore();
    stop.cancel();
    telemetry.shutdown().await;
}
