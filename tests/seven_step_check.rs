//! The source article's reproducible check, step by step, over real gRPC, Postgres and the
//! sandbox provider. The proof is the provider's effect count, not any response text.

#![allow(clippy::unwrap_used, missing_docs)]

mod common;

use common::*;
use opjournal::proto::{
    self, Decision, OperationStatus, ReconcileAction, ReconcileOperationRequest,
    ReportUnknownOutcomeRequest,
};
use sqlx::PgPool;

/// Steps 1-4: begin, the provider stores the payment and the answer is lost, the operation
/// becomes unknown, and a retry with the same key is told to verify instead of calling.
async fn lose_the_response(app: &TestApp) {
    // 1. Create the operation with the key payment:order-817:intent-01.
    let begin = app
        .begin(PAYMENT_KEY, "create_payment", PAY_817)
        .await
        .unwrap();
    assert_eq!(decision(&begin), Decision::Execute);
    assert!(!begin.lease_token.is_empty());
    // 2-3. The provider commits, then never answers in time.
    let answer = app
        .pay(PAYMENT_KEY, PAY_817, Some("commit-then-timeout"))
        .await;
    assert!(answer.is_none(), "the provider answer must be lost");
    let unknown = app
        .journal
        .clone()
        .report_unknown_outcome(ReportUnknownOutcomeRequest {
            lease_token: begin.lease_token.clone(),
            error_code: "timeout".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        op_status(unknown.operation.as_ref().unwrap()),
        OperationStatus::Unknown
    );
    let status: String =
        sqlx::query_scalar("SELECT status FROM agent_operations WHERE operation_key = $1")
            .bind(PAYMENT_KEY)
            .fetch_one(&app.pool)
            .await
            .unwrap();
    assert_eq!(status, "unknown");
    // 4. Retry with the same key and parameters: verify first, no provider call.
    let retry = app
        .begin(PAYMENT_KEY, "create_payment", PAY_817)
        .await
        .unwrap();
    assert_eq!(decision(&retry), Decision::VerificationRequired);
    assert!(retry.lease_token.is_empty());
    assert_eq!(app.counts(PAYMENT_KEY).requests, 1);
}

/// Steps 5-7 after reconciliation made the operation succeeded.
async fn check_exactly_one_effect_and_the_conflict(app: &TestApp) {
    let stored = app
        .journal
        .clone()
        .get_operation(proto::GetOperationRequest {
            namespace: String::new(),
            operation_key: PAYMENT_KEY.into(),
        })
        .await
        .unwrap()
        .into_inner()
        .operation
        .unwrap();
    assert_eq!(op_status(&stored), OperationStatus::Succeeded);
    let external_id = stored.external_id.clone().unwrap();
    assert!(external_id.starts_with("pay_"), "{external_id}");
    // The kept result fields only, canonical JSON.
    let result: serde_json::Value =
        serde_json::from_str(stored.result_json.as_deref().unwrap()).unwrap();
    assert_eq!(result["id"], external_id.as_str());
    assert_eq!(result["amount_minor"], 490000);

    // 6. Exactly one effect at the provider.
    let counts = app.counts(PAYMENT_KEY);
    assert_eq!(counts.effects, 1);
    assert_eq!(counts.requests, 1);

    // A retry now replays the stored outcome.
    let replay = app
        .begin(PAYMENT_KEY, "create_payment", PAY_817)
        .await
        .unwrap();
    assert_eq!(decision(&replay), Decision::Replay);
    assert_eq!(
        replay.operation.unwrap().external_id.as_deref(),
        Some(external_id.as_str())
    );

    // 7. Same key, another amount: a conflict, and the provider receives nothing.
    let conflict = app
        .begin(PAYMENT_KEY, "create_payment", PAY_817_OTHER_AMOUNT)
        .await
        .unwrap_err();
    assert_eq!(conflict.code(), tonic::Code::AlreadyExists);
    assert_eq!(reason(&conflict), "IDEMPOTENCY_KEY_REUSED");
    assert_eq!(
        app.counts(PAYMENT_KEY),
        opjournal::sandbox::KeyCounts {
            requests: 1,
            effects: 1,
            lookups: counts.lookups
        }
    );

    // The article's audit queries, as written.
    let (key, status, attempts, ext): (String, String, i32, Option<String>) = sqlx::query_as(
        "SELECT operation_key, status, attempt_count, external_id
         FROM agent_operations
         WHERE operation_key = 'payment:order-817:intent-01'",
    )
    .fetch_one(&app.pool)
    .await
    .unwrap();
    assert_eq!(
        (key.as_str(), status.as_str(), attempts),
        (PAYMENT_KEY, "succeeded", 1)
    );
    assert_eq!(ext.as_deref(), Some(external_id.as_str()));
    let duplicates: Vec<(String, i64)> = sqlx::query_as(
        "SELECT operation_key, COUNT(*) AS rows_per_key
         FROM agent_operations
         GROUP BY operation_key
         HAVING COUNT(*) > 1",
    )
    .fetch_all(&app.pool)
    .await
    .unwrap();
    assert!(duplicates.is_empty());
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn the_seven_step_check_holds_with_reconcile_operation(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    lose_the_response(&app).await;

    // 5. Reconcile on request: the adapter finds the payment by key.
    let reconciled = app
        .reconciler
        .clone()
        .reconcile_operation(ReconcileOperationRequest {
            namespace: String::new(),
            operation_key: PAYMENT_KEY.into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        ReconcileAction::try_from(reconciled.action).unwrap(),
        ReconcileAction::MarkedSucceeded
    );
    assert_eq!(
        proto::ObservationOutcome::try_from(reconciled.observation.unwrap().outcome).unwrap(),
        proto::ObservationOutcome::Succeeded
    );
    assert_eq!(
        op_status(reconciled.operation.as_ref().unwrap()),
        OperationStatus::Succeeded
    );
    assert_eq!(app.counts(PAYMENT_KEY).lookups, 1);

    check_exactly_one_effect_and_the_conflict(&app).await;
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn the_seven_step_check_holds_with_the_reconcile_worker_binary(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    lose_the_response(&app).await;

    // 5. The worker binary, on its own, against the same database and provider.
    let dir = tempfile::tempdir().unwrap();
    let policy = dir.path().join("policy.yaml");
    std::fs::write(&policy, &app.policy_yaml).unwrap();
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_opjournal-reconciler"))
        .arg("--once")
        .arg("--database-url")
        .arg(app.database_url())
        .arg("--policy")
        .arg(&policy)
        .env("RUST_LOG", "warn")
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "worker failed: {stdout} {}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(stdout.contains("looked_up=1 settled=1"), "{stdout}");

    check_exactly_one_effect_and_the_conflict(&app).await;
}
