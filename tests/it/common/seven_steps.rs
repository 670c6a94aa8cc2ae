//! The source article's seven-step check, shared by the tests that run it over plaintext,
//! TLS and mutual TLS, on Postgres and on the embedded SQLite journal. The proof is the
//! provider's effect count, not any response text.

use opjournal::proto::{
    self, Decision, OperationStatus, ReconcileAction, ReconcileOperationRequest,
    ReportUnknownOutcomeRequest,
};

use super::*;

/// Steps 1-4: begin, the provider stores the payment and the answer is lost, the operation
/// becomes unknown, and a retry with the same key is told to verify instead of calling.
pub async fn lose_the_response(app: &TestApp) {
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
    let status: String = on_pool!(&app.db, |pool| {
        sqlx::query_scalar("SELECT status FROM agent_operations WHERE operation_key = $1")
            .bind(PAYMENT_KEY)
            .fetch_one(pool)
            .await
            .unwrap()
    });
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
pub async fn check_exactly_one_effect_and_the_conflict(app: &TestApp) {
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
        opjournal_sandbox::KeyCounts {
            requests: 1,
            effects: 1,
            lookups: counts.lookups
        }
    );

    // The article's audit queries, as written (the same text on Postgres and SQLite).
    let (key, status, attempts, ext): (String, String, i32, Option<String>) =
        on_pool!(&app.db, |pool| {
            sqlx::query_as(
                "SELECT operation_key, status, attempt_count, external_id
                 FROM agent_operations
                 WHERE operation_key = 'payment:order-817:intent-01'",
            )
            .fetch_one(pool)
            .await
            .unwrap()
        });
    assert_eq!(
        (key.as_str(), status.as_str(), attempts),
        (PAYMENT_KEY, "succeeded", 1)
    );
    assert_eq!(ext.as_deref(), Some(external_id.as_str()));
    let duplicates: Vec<(String, i64)> = on_pool!(&app.db, |pool| {
        sqlx::query_as(
            "SELECT operation_key, COUNT(*) AS rows_per_key
             FROM agent_operations
             GROUP BY operation_key
             HAVING COUNT(*) > 1",
        )
        .fetch_all(pool)
        .await
        .unwrap()
    });
    assert!(duplicates.is_empty());
}

/// All seven steps, settling step 5 with the `ReconcileOperation` RPC.
pub async fn run_with_reconcile_operation(app: &TestApp) {
    lose_the_response(app).await;

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

    check_exactly_one_effect_and_the_conflict(app).await;
}
