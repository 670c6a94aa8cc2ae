//! The Python client (clients/python) against the real server and sandbox: its own pytest
//! suite runs as a child process, then these tests check the journal rows and the provider's
//! effect counts from Rust. `./scripts/test` prepares `target/python-client-venv`.

use crate::common;

use std::path::PathBuf;

use common::client_suites::{
    Row, assert_outcomes_recorded, assert_transitions, check_stale_and_taken_over_leases, repo,
    row, run_suite, spawn_with_client_token, tool, transitions,
};
use common::seven_steps::check_exactly_one_effect_and_the_conflict;
use common::*;
use sqlx::PgPool;

const SETUP: &str = "./scripts/test prepares it with scripts/client-envs python";

/// The interpreter with clients/python installed: `OPJOURNAL_TEST_CLIENT_PYTHON`, or the
/// virtual environment `scripts/client-envs` prepares.
fn python() -> PathBuf {
    tool(
        "OPJOURNAL_TEST_CLIENT_PYTHON",
        "target/python-client-venv/bin/python",
        "python3",
    )
}

/// Runs the pytest files and asserts that every test ran and passed.
async fn pytest(app: &TestApp, files: &[&str]) -> String {
    let mut args = vec!["-m", "pytest", "-q", "-rA"];
    args.extend_from_slice(files);
    let stdout = run_suite(app, &python(), &args, &repo().join("clients/python"), SETUP).await;
    // The summary line names only passed tests: nothing skipped, deselected or xfailed.
    let summary = stdout.lines().rev().find(|line| !line.trim().is_empty());
    let counts = summary.and_then(|line| line.split_once(" passed in "));
    assert!(
        counts.is_some_and(|(passed, _)| passed.parse::<u32>().is_ok_and(|n| n > 0)),
        "pytest did not pass every test:\n{stdout}"
    );
    stdout
}

fn succeeded(attempt_count: i32, external_id: Option<String>) -> Row {
    Row {
        status: "succeeded".into(),
        attempt_count,
        external_id,
        error_code: None,
    }
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn the_python_client_runs_the_seven_step_check(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    pytest(&app, &["tests/test_seven_step_check.py"]).await;

    assert_transitions(
        &app,
        PAYMENT_KEY,
        &[
            (None, "in_progress"),
            (Some("in_progress"), "unknown"),
            (Some("unknown"), "succeeded"),
        ],
    )
    .await;
    let unknown_reason: Option<String> = sqlx::query_scalar(
        "SELECT reason FROM operation_events WHERE operation_key = $1 AND to_status = 'unknown'",
    )
    .bind(PAYMENT_KEY)
    .fetch_one(app.pool())
    .await
    .unwrap();
    assert_eq!(
        unknown_reason.as_deref(),
        Some("timeout"),
        "the helper's error code"
    );
    // Exactly one effect; Begin replays; another payload is IDEMPOTENCY_KEY_REUSED.
    check_exactly_one_effect_and_the_conflict(&app).await;
    assert_eq!(app.counts(PAYMENT_KEY).lookups, 1);
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn the_python_client_classifies_provider_outcomes(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    pytest(&app, &["tests/test_outcomes.py"]).await;

    assert_outcomes_recorded(&app, "py").await;
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn the_python_client_surfaces_lease_lost_and_renews_leases(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    pytest(&app, &["tests/test_leases.py"]).await;

    check_stale_and_taken_over_leases(&app, "py").await;
    // The asyncio client's holder saw LEASE_LOST; its report was refused too.
    let async_lost = row(&app, "py:leases:async-lost").await.unwrap();
    assert_eq!(
        (async_lost.status.as_str(), async_lost.attempt_count),
        ("succeeded", 2)
    );
    let counts = app.counts("py:leases:async-lost");
    assert_eq!((counts.requests, counts.effects), (2, 1));
    // The renewed lease was never taken over.
    let renewed = row(&app, "py:leases:renewed").await.unwrap();
    assert_eq!(renewed, succeeded(1, renewed.external_id.clone()));
    assert_eq!(app.counts("py:leases:renewed").effects, 1);
    let deadline = row(&app, "py:leases:deadline").await.unwrap();
    assert_eq!(deadline, succeeded(1, deadline.external_id.clone()));
    // The call that outlived its unrenewed lease was cut off, unknown, before any request.
    let cut_off = row(&app, "py:leases:async-cut-off").await.unwrap();
    assert_eq!(
        (cut_off.status.as_str(), cut_off.error_code.as_deref()),
        ("unknown", Some("lease_expired"))
    );
    assert_eq!(app.counts("py:leases:async-cut-off").requests, 0);
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn the_python_client_sends_its_bearer_token(pool: PgPool) {
    let app = spawn_with_client_token(pool).await;
    pytest(&app, &["tests/test_auth.py"]).await;

    common::client_suites::assert_paid_once_in_tenant_a(&app, "py").await;
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn the_python_decorator_protects_one_intent_from_sync_asyncio_and_two_processes(
    pool: PgPool,
) {
    let app = TestApp::spawn(pool).await;
    // test_plan.py: the repetition of reports whose answer was lost, step by step.
    pytest(&app, &["tests/test_decorator.py", "tests/test_plan.py"]).await;

    // 200 concurrent calls of one intent (20 asyncio tasks in two processes), then the same
    // intent from sync and asyncio code: one provider call, one effect, one attempt.
    let once = row(&app, "py:decorator:once").await.unwrap();
    assert_eq!((once.status.as_str(), once.attempt_count), ("succeeded", 1));
    assert!(
        once.external_id
            .as_deref()
            .is_some_and(|id| id.starts_with("pay_"))
    );
    let counts = app.counts("py:decorator:once");
    assert_eq!((counts.requests, counts.effects), (1, 1));
    assert_eq!(
        transitions(&app, "py:decorator:once").await.len(),
        2,
        "registered and completed, nothing else"
    );

    // A lost provider answer: unknown, and the provider was asked exactly once.
    for key in ["py:decorator:lost-sync", "py:decorator:lost-async"] {
        let lost = row(&app, key).await.unwrap();
        assert_eq!(
            (lost.status.as_str(), lost.attempt_count),
            ("unknown", 1),
            "{key}"
        );
        let counts = app.counts(key);
        assert_eq!((counts.requests, counts.effects), (1, 1), "{key}");
    }

    // Other arguments under the same key: refused; the first payment stands alone.
    for key in ["py:decorator:conflict-sync", "py:decorator:conflict-async"] {
        let first = row(&app, key).await.unwrap();
        assert_eq!(first, succeeded(1, first.external_id.clone()), "{key}");
        let counts = app.counts(key);
        assert_eq!((counts.requests, counts.effects), (1, 1), "{key}");
    }
    let outcome = row(&app, "py:decorator:outcome").await.unwrap();
    assert_eq!(outcome, succeeded(1, outcome.external_id.clone()));
    assert_eq!(app.counts("py:decorator:outcome").effects, 1);
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn the_python_decorator_stores_values_and_never_loses_an_effect_it_cannot_record(
    pool: PgPool,
) {
    let app = TestApp::spawn(pool).await;
    pytest(&app, &["tests/test_results.py"]).await;

    // A returned string, a JSON-looking string, None, a number, a list, an object: one
    // success each, and the stored result is the value as JSON (a string stays a string).
    for (label, stored) in [
        ("plain-str", Some(r#""msg_123""#)),
        ("json-str", Some(r#""{\"a\": 1}""#)),
        ("none", None),
        ("number", Some("42")),
        ("list", Some(r#"[1,"two",{"three":3}]"#)),
    ] {
        let key = format!("py:results:value-{label}");
        let done = row(&app, &key).await.unwrap();
        assert_eq!(
            (done.status.as_str(), done.attempt_count),
            ("succeeded", 1),
            "{key}"
        );
        let result: Option<String> = sqlx::query_scalar(
            "SELECT result_json::text FROM agent_operations WHERE operation_key = $1",
        )
        .bind(&key)
        .fetch_one(app.pool())
        .await
        .unwrap();
        let parse = |text: &str| serde_json::from_str::<serde_json::Value>(text).unwrap();
        assert_eq!(result.as_deref().map(parse), stored.map(parse), "{key}");
        assert_eq!(app.counts(&key).effects, 1, "{key}");
    }

    // A success report the journal refused: unknown (result_refused), one provider call.
    for key in [
        "py:results:refused-external-id",
        "py:results:too-large-sync",
        "py:results:too-large-async",
        "py:results:tool-too-large",
    ] {
        let refused = row(&app, key).await.unwrap();
        assert_eq!(
            (
                refused.status.as_str(),
                refused.attempt_count,
                refused.error_code.as_deref()
            ),
            ("unknown", 1, Some("result_refused")),
            "{key}"
        );
        let counts = app.counts(key);
        assert_eq!((counts.requests, counts.effects), (1, 1), "{key}");
    }
    // Refused decorations and keys registered nothing.
    for key in ["py:results:gen", "py:results:agen", "py:results:method"] {
        assert!(row(&app, key).await.is_none(), "{key}");
    }
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn the_python_client_reports_a_lease_granted_to_a_cancelled_caller_unknown(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    pytest(&app, &["tests/test_cancel.py"]).await;

    for key in ["py:cancel:async", "py:cancel:sync"] {
        // Registered, reported unknown before any provider call, released by the lookup,
        // then executed once.
        assert_transitions(
            &app,
            key,
            &[
                (None, "in_progress"),
                (Some("in_progress"), "unknown"),
                (Some("unknown"), "pending"),
                (Some("pending"), "in_progress"),
                (Some("in_progress"), "succeeded"),
            ],
        )
        .await;
        let counts = app.counts(key);
        assert_eq!((counts.requests, counts.effects), (1, 1), "{key}");
    }
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn the_python_client_repeats_what_the_transport_refused_and_ships_the_service_config(
    pool: PgPool,
) {
    let app = TestApp::spawn(pool).await;
    // A bare CANCELLED (a deadline that passed in the server) and a shed call are safe to
    // repeat; gRPC itself repeats UNAVAILABLE as proto/opjournal/v1/service_config.json says.
    pytest(&app, &["tests/test_transport.py"]).await;
}
