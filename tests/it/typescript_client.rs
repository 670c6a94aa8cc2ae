//! The TypeScript client (clients/typescript) against the real server and sandbox: its own
//! `node --test` files run as a child process, then these tests check the journal rows and
//! the provider's effect counts from Rust. `./scripts/test` runs `npm ci` and the build.

use crate::common;

use std::path::PathBuf;

use common::client_suites::{
    assert_outcomes_recorded, assert_transitions, check_stale_and_taken_over_leases, repo, row,
    run_suite, spawn_with_client_token,
};
use common::seven_steps::check_exactly_one_effect_and_the_conflict;
use common::*;
use opjournal_sandbox::SandboxConfig;
use sqlx::PgPool;

const SETUP: &str = "./scripts/test prepares it with scripts/client-envs typescript \
     (npm ci and npm run build in clients/typescript and examples/agents/typescript)";

/// Node.js: `OPJOURNAL_TEST_NODE`, or `node` on the PATH.
fn node() -> PathBuf {
    std::env::var_os("OPJOURNAL_TEST_NODE").map_or_else(|| "node".into(), PathBuf::from)
}

/// Runs compiled test files with node's test runner; asserts every test ran and passed.
async fn node_test(app: &TestApp, file: &str) -> String {
    let dir = repo().join("clients/typescript");
    let compiled = format!("dist/test/{file}");
    assert!(
        dir.join(&compiled).exists(),
        "{compiled} is missing; {SETUP}"
    );
    let args = ["--test", "--test-reporter=spec", &compiled];
    let stdout = run_suite(app, &node(), &args, &dir, SETUP).await;
    assert!(stdout.contains("ℹ pass "), "{stdout}");
    for line in ["ℹ fail 0", "ℹ skipped 0", "ℹ todo 0", "ℹ cancelled 0"] {
        assert!(
            stdout.contains(line),
            "node --test did not say '{line}':\n{stdout}"
        );
    }
    stdout
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn the_typescript_client_runs_the_seven_step_check(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    node_test(&app, "seven_step_check.test.js").await;

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
    // Exactly one effect; Begin replays; another payload is IDEMPOTENCY_KEY_REUSED.
    check_exactly_one_effect_and_the_conflict(&app).await;
    assert_eq!(app.counts(PAYMENT_KEY).lookups, 1);
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn the_typescript_client_classifies_provider_outcomes(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    node_test(&app, "outcomes.test.js").await;

    assert_outcomes_recorded(&app, "ts").await;
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn the_typescript_client_surfaces_lease_lost_and_renews_leases(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    node_test(&app, "leases.test.js").await;

    check_stale_and_taken_over_leases(&app, "ts").await;
    let renewed = row(&app, "ts:leases:renewed").await.unwrap();
    assert_eq!(
        (renewed.status.as_str(), renewed.attempt_count),
        ("succeeded", 1)
    );
    assert_eq!(app.counts("ts:leases:renewed").effects, 1);
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn the_typescript_client_sends_its_bearer_token(pool: PgPool) {
    let app = spawn_with_client_token(pool).await;
    node_test(&app, "auth.test.js").await;

    common::client_suites::assert_paid_once_in_tenant_a(&app, "ts").await;
}

/// `(status, attempt_count, error_code)` of `key`'s row.
async fn state(app: &TestApp, key: &str) -> (String, i32, Option<String>) {
    let row = row(app, key)
        .await
        .unwrap_or_else(|| panic!("no row for {key}"));
    (row.status, row.attempt_count, row.error_code)
}

fn is(status: &str, attempts: i32, code: Option<&str>) -> (String, i32, Option<String>) {
    (status.to_owned(), attempts, code.map(str::to_owned))
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn the_typescript_idempotent_wrapper_runs_each_intent_once(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    node_test(&app, "idempotent.test.js").await;

    let paid = [
        "ts:idem:order-idem-1",
        "ts:idem:run-7:payment",
        "ts:idem:held",
        "ts:idem:settled",
        "ts:idem:hold-1",
        "ts:idem:abandoned",
    ];
    for key in paid {
        assert_eq!(state(&app, key).await, is("succeeded", 1, None), "{key}");
        let counts = app.counts(key);
        assert_eq!((counts.requests, counts.effects), (1, 1), "{key}");
    }
    assert_eq!(
        state(&app, "ts:idem:declined").await,
        is("failed_final", 1, Some("card_declined"))
    );
    assert_eq!(app.counts("ts:idem:declined").effects, 0);
    for (key, code) in [
        ("ts:idem:unexpected", "exception"),
        ("ts:idem:http-503", "http_503"),
        ("ts:idem:lease-lost", "lease_expired"),
    ] {
        assert_eq!(
            state(&app, key).await,
            is("unknown", 1, Some(code)),
            "{key}"
        );
    }
    assert_eq!(app.counts("ts:idem:unexpected").requests, 0);
    // A classifier hook that throws or names a malformed code: the payment the function
    // made is recorded unknown at once, never as a rejection, never left in progress.
    for (key, code) in [
        ("ts:idem:classify-throws", "classifier_failed"),
        ("ts:idem:classify-bad-rejection", "invalid_error_code"),
        ("ts:idem:classify-bad-unknown", "invalid_error_code"),
        ("ts:idem:classify-not-a-verdict", "invalid_error_code"),
        // The caller aborted the provider call after the payment was taken.
        ("ts:idem:cancelled", "exception"),
    ] {
        assert_eq!(
            state(&app, key).await,
            is("unknown", 1, Some(code)),
            "{key}"
        );
        let counts = app.counts(key);
        assert_eq!((counts.requests, counts.effects), (1, 1), "{key}");
    }
    assert_eq!(
        app.rows_for("ts:idem:hold-2").await,
        0,
        "the duplicate was held"
    );
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn journaled_mcp_tools_pay_once_when_the_client_retries(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    let example = repo().join("examples/agents/typescript/dist/main.js");
    assert!(
        example.exists(),
        "{} is missing; {SETUP}",
        example.display()
    );
    node_test(&app, "mcp.test.js").await;

    let lost = "mcp:create_payment:9b2f0c6e-lost-answer";
    let row_of_lost = row(&app, lost).await.unwrap();
    assert_eq!(
        (row_of_lost.status.as_str(), row_of_lost.attempt_count),
        ("succeeded", 1)
    );
    let counts = app.counts(lost);
    assert_eq!((counts.requests, counts.effects), (1, 1), "one payment");
    assert_eq!(
        state(&app, "mcp:create_payment:9b2f0c6e-unknown").await,
        is("unknown", 1, Some("timeout"))
    );
    assert_eq!(
        state(&app, "mcp:create_payment:9b2f0c6e-declined").await,
        is("failed_final", 1, Some("card_declined"))
    );
    for key in [
        "mcp:create_payment:9b2f0c6e-meta",
        "payment:order-mcp-derived",
        "mcp:create_payment:9b2f0c6e-top-level",
    ] {
        assert_eq!(state(&app, key).await, is("succeeded", 1, None), "{key}");
        assert_eq!(app.counts(key).effects, 1, "{key}");
    }
    // Refused keys (non-ASCII, control or invisible characters, over 128 characters, a
    // journal key over 200 characters after scoping or derivation) reached neither the
    // journal nor the provider; the one call whose scoped key is exactly 200 characters paid.
    let scope = format!("tenant-{}", "t".repeat(70));
    let refused = [
        "mcp:create_payment:ключ-1".to_owned(),
        "mcp:create_payment:clé".to_owned(),
        format!("mcp:create_payment:{}", "k".repeat(129)),
        format!("{scope}:{}", "k".repeat(128)),
        format!("payment:{}", "d".repeat(200)),
    ];
    for key in &refused {
        assert_eq!(app.rows_for(key).await, 0, "{key}");
        assert_eq!(app.counts(key).requests, 0, "{key}");
    }
    let longest = format!("{scope}:{}", "f".repeat(200 - scope.len() - 1));
    assert_eq!(longest.chars().count(), 200);
    assert_eq!(state(&app, &longest).await, is("succeeded", 1, None));
    assert_eq!(app.counts(&longest).effects, 1);
    let strays: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM agent_operations WHERE operation_key LIKE 'mcp:create_payment:%'
         AND operation_key !~ '^mcp:create_payment:[A-Za-z0-9._:-]{1,128}$'",
    )
    .fetch_one(app.pool())
    .await
    .unwrap();
    assert_eq!(strays, 0, "no row under a malformed client key");
    // Two users of one server, one key, the same arguments: a row and a payment each, under
    // keys scoped by who calls; the unscoped key was never used.
    let scoped: Vec<(String,)> = sqlx::query_as(
        "SELECT operation_key FROM agent_operations
         WHERE operation_key ~ '^mcp:pay_order:u-[0-9a-f]{24}:order-840$'
           AND status = 'succeeded' AND attempt_count = 1",
    )
    .fetch_all(app.pool())
    .await
    .unwrap();
    assert_eq!(scoped.len(), 2, "{scoped:?}");
    for (key,) in &scoped {
        assert_eq!(app.counts(key).effects, 1, "{key}");
    }
    assert_eq!(app.rows_for("mcp:pay_order:order-840").await, 0);
}

/// `(status, attempt_count, requests, effects)` of each key: one row, one payment each.
async fn paid_once(app: &TestApp, keys: &[&str]) {
    for key in keys {
        assert_eq!(state(app, key).await, is("succeeded", 1, None), "{key}");
        let counts = app.counts(key);
        assert_eq!((counts.requests, counts.effects), (1, 1), "{key}");
    }
}

/// The test policy with `create_payment_small_result`, whose stored result may be at most
/// 256 bytes (`result.max_bytes`).
fn small_result_policy(sandbox_url: &str) -> String {
    policy_yaml(sandbox_url, 60).replacen(
        "actions:\n",
        "actions:\n  create_payment_small_result:\n    result: { max_bytes: 256 }\n    \
         reconcile: { adapter: sandbox_payments }\n",
        1,
    )
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn the_typescript_wrappers_store_what_functions_return_as_values(pool: PgPool) {
    let app =
        TestApp::spawn_with_policy(pool, SandboxConfig::default(), small_result_policy, None).await;
    node_test(&app, "values.test.js").await;

    // Strings (plain, JSON-looking), null, undefined, numbers, arrays and objects: each
    // recorded as a success with one effect, never as an unknown outcome.
    paid_once(
        &app,
        &[
            "ts:values:plain-string",
            "ts:values:json-looking-string",
            "ts:values:number-looking-string",
            "ts:values:null",
            "ts:values:undefined",
            "ts:values:number",
            "ts:values:array",
            "ts:values:object",
            "mcp:send:tool-plain-string",
            "mcp:send:tool-json-looking-string",
            "mcp:send:tool-number",
        ],
    )
    .await;
    let stored: Option<String> = sqlx::query_scalar(
        "SELECT result_json::text FROM agent_operations WHERE operation_key = 'ts:values:plain-string'",
    )
    .fetch_one(app.pool())
    .await
    .unwrap();
    assert_eq!(
        stored.as_deref(),
        Some("\"sent\""),
        "stored as a JSON string"
    );

    // The provider acted but the journal refused the success report (or the result was not
    // JSON): unknown at once, one effect, the function not called again.
    for (key, code) in [
        ("ts:values:refused-too-large", "result_refused"),
        ("ts:values:refused-bad-external-id", "result_refused"),
        ("ts:values:refused-long-external-id", "result_refused"),
        (
            "ts:values:refused-not-serializable",
            "result_not_serializable",
        ),
        ("mcp:send:tool-too-large", "result_refused"),
    ] {
        assert_eq!(
            state(&app, key).await,
            is("unknown", 1, Some(code)),
            "{key}"
        );
        let counts = app.counts(key);
        assert_eq!((counts.requests, counts.effects), (1, 1), "{key}");
    }

    // A payload JSON would write lossily (a Map, a Set, a BigInt, undefined in an array…)
    // was refused before Begin: no row, no provider call.
    for name in [
        "map",
        "set",
        "function",
        "symbol",
        "bigint",
        "nan",
        "infinity",
        "class-instance",
        "class-instance-with-field",
        "undefined-in-array",
        "hole-in-array",
        "undefined-between-arguments",
        "nested-map",
        "symbol-key",
        "circular",
        "function-map",
        "begin-map",
        "two-maps",
    ] {
        let key = format!("ts:values:payload-{name}");
        assert_eq!(app.rows_for(&key).await, 0, "{key}");
        assert_eq!(app.counts(&key).requests, 0, "{key}");
    }
    // f(1) and f(1, undefined) are one intent; a Date is its ISO text.
    paid_once(
        &app,
        &["ts:values:trailing-undefined", "ts:values:payload-date"],
    )
    .await;
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn the_typescript_client_repeats_what_the_transport_refused_and_applies_the_service_config(
    pool: PgPool,
) {
    let app = TestApp::spawn(pool).await;
    // A bare CANCELLED and a shed call are safe to repeat; the retry interceptor repeats
    // UNAVAILABLE as proto/opjournal/v1/service_config.json says, at most maxAttempts times.
    node_test(&app, "transport.test.js").await;
}
