//! The policy layer over real gRPC and Postgres: a policy file's problems stop the server with
//! their lines, recorded operations keep the rules they were registered under, duplicate
//! intent under a new key, and retention with purge.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::Ordering;

use common::*;
use opjournal::domain::policy::Policy;
use opjournal::journal::{BeginOutcome, Journal, ReportUnknown, RequestLimits};
use opjournal::proto::{BeginOperationRequest, Decision, OperationStatus};
use opjournal::store::{JournalStore, PgStore};
use sqlx::PgPool;

#[tokio::test]
async fn a_policy_file_with_problems_stops_the_server_naming_each_with_its_line() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("policy.yaml");
    std::fs::write(
        &file,
        include_str!("../../crates/opjournal-domain/testdata/policy_with_problems.yaml"),
    )
    .unwrap();
    for command in [
        vec!["serve", "--listen", "127.0.0.1:0"],
        vec!["check-config"],
    ] {
        let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_opjournal"))
            .args(&command)
            .arg("--policy")
            .arg(&file)
            .output()
            .await
            .unwrap();
        assert!(!output.status.success(), "{command:?} must refuse the file");
        let stderr = String::from_utf8_lossy(&output.stderr);
        let name = file.display().to_string();
        for expected in [
            format!("{name}:3: actions.create_payment.lease_seconds: invalid type"),
            format!(
                "{name}:5: actions.create_payment.reconcile.adapter: no adapter named 'nowhere'"
            ),
            format!("{name}:10: adapters.payments: missing field `url`"),
        ] {
            assert!(
                stderr.contains(&expected),
                "{command:?}: {expected}\n{stderr}"
            );
        }
    }
}

fn journal_with(pool: &PgPool, yaml: &str) -> Journal {
    let policy = Arc::new(Policy::parse(yaml, "policy.yaml").unwrap());
    let store: Arc<dyn JournalStore> = Arc::new(PgStore::new(pool.clone()));
    Journal::new(store, policy, RequestLimits::default())
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn a_recorded_operation_keeps_the_rules_it_was_registered_under(pool: PgPool) {
    let before = journal_with(
        &pool,
        "actions:\n  charge: {retry: {on_timeout: reconcile_before_retry}}\n",
    );
    let command = before
        .parse_begin("", "charge:1", "charge", "{}", 1, Vec::new())
        .unwrap();
    let BeginOutcome::Execute { token, .. } = before.begin(command.clone()).await.unwrap() else {
        panic!("expected EXECUTE");
    };
    before
        .report_unknown(ReportUnknown::new(&token.encode(), "timeout").unwrap())
        .await
        .unwrap();

    // The file now says the provider deduplicates; the recorded operation still must be
    // reconciled first, while a new operation follows the new rule.
    let after = journal_with(
        &pool,
        "actions:\n  charge: {retry: {on_timeout: retry_with_same_key}}\n",
    );
    let outcome = after.begin(command).await.unwrap();
    assert!(
        matches!(outcome, BeginOutcome::VerificationRequired(_)),
        "{outcome:?}"
    );
    let new = after
        .parse_begin("", "charge:2", "charge", "{}", 1, Vec::new())
        .unwrap();
    let BeginOutcome::Execute { token, .. } = after.begin(new.clone()).await.unwrap() else {
        panic!("expected EXECUTE");
    };
    after
        .report_unknown(ReportUnknown::new(&token.encode(), "timeout").unwrap())
        .await
        .unwrap();
    assert!(matches!(
        after.begin(new).await.unwrap(),
        BeginOutcome::Execute { .. }
    ));
}

async fn begin_confirmed(
    app: &TestApp,
    key: &str,
    action: &str,
    confirm: bool,
) -> opjournal::proto::BeginOperationResponse {
    app.journal
        .clone()
        .begin_operation(BeginOperationRequest {
            operation_key: key.into(),
            action_type: action.into(),
            payload_json: PAY_817.into(),
            confirm_duplicate_intent: confirm,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn a_new_key_for_the_same_request_is_held_confirmed_or_counted(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    let counters = app.parts.journal.counters();

    // hold: the first key's outcome is unknown; a second key for the same request is held.
    let first = app
        .begin("pay:hold-1", "create_payment_hold", PAY_817)
        .await
        .unwrap();
    app.report_unknown(&first.lease_token).await;
    let held = begin_confirmed(&app, "pay:hold-2", "create_payment_hold", false).await;
    assert_eq!(decision(&held), Decision::DuplicateIntentSuspected);
    assert_eq!(held.duplicate_of_operation_key, "pay:hold-1");
    assert!(held.operation.is_none() && held.lease_token.is_empty());
    assert_eq!(
        app.rows_for("pay:hold-2").await,
        0,
        "nothing registered while held"
    );
    assert_eq!(counters.duplicate_intent_held.load(Ordering::Relaxed), 1);
    // The same payload under the first key is an ordinary retry, not a duplicate intent.
    let retry = app
        .begin("pay:hold-1", "create_payment_hold", PAY_817)
        .await
        .unwrap();
    assert_eq!(decision(&retry), Decision::VerificationRequired);
    // Confirmed: proceeds.
    let confirmed = begin_confirmed(&app, "pay:hold-2", "create_payment_hold", true).await;
    assert_eq!(decision(&confirmed), Decision::Execute);
    assert_eq!(counters.duplicate_intent_warned.load(Ordering::Relaxed), 1);

    // warn: proceeds and is counted.
    let first = app
        .begin("pay:warn-1", "create_payment_warn", PAY_817)
        .await
        .unwrap();
    app.report_unknown(&first.lease_token).await;
    let second = begin_confirmed(&app, "pay:warn-2", "create_payment_warn", false).await;
    assert_eq!(decision(&second), Decision::Execute);
    assert_eq!(counters.duplicate_intent_warned.load(Ordering::Relaxed), 2);
    // allow (the default): nothing is looked at.
    app.begin("pay:allow-1", "create_payment", PAY_817)
        .await
        .unwrap();
    let allowed = app
        .begin("pay:allow-2", "create_payment", PAY_817)
        .await
        .unwrap();
    assert_eq!(decision(&allowed), Decision::Execute);
    assert_eq!(counters.duplicate_intent_warned.load(Ordering::Relaxed), 2);
    assert_eq!(counters.duplicate_intent_held.load(Ordering::Relaxed), 1);
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn purge_deletes_only_terminal_operations_past_retention(pool: PgPool) {
    let app = TestApp::spawn_with(pool, opjournal_sandbox::SandboxConfig::default(), 3600).await;
    // One operation in every status, each once young and once 60 days old.
    for age in ["young", "old"] {
        let done = app
            .begin(&format!("{age}:succeeded"), "create_payment", "{}")
            .await
            .unwrap();
        app.journal
            .clone()
            .complete_operation(opjournal::proto::CompleteOperationRequest {
                lease_token: done.lease_token,
                external_id: "pay_1".into(),
                result_json: String::new(),
            })
            .await
            .unwrap();
        let failed = app
            .begin(&format!("{age}:failed"), "create_payment", "{}")
            .await
            .unwrap();
        app.fail_declined(&failed.lease_token).await;
        let unknown = app
            .begin(&format!("{age}:unknown"), "create_payment", "{}")
            .await
            .unwrap();
        app.report_unknown(&unknown.lease_token).await;
        app.begin(&format!("{age}:in_progress"), "create_payment", "{}")
            .await
            .unwrap();
    }
    let pending = app
        .begin("old:pending", "create_payment", "{}")
        .await
        .unwrap();
    sqlx::query("UPDATE agent_operations SET status = 'pending', lease_until = NULL WHERE operation_key = 'old:pending'")
        .execute(app.pool())
        .await
        .unwrap();
    drop(pending);
    // Age the old ones by 60 days (their retention is the default 35).
    sqlx::query(
        "UPDATE agent_operations SET created_at = created_at - interval '60 days', \
             updated_at = updated_at - interval '60 days', \
             purge_after = purge_after - interval '60 days' \
         WHERE operation_key LIKE 'old:%'",
    )
    .execute(app.pool())
    .await
    .unwrap();

    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_opjournal"))
        .args([
            "purge",
            "--batch-size",
            "1",
            "--database-url",
            &app.database_url(),
        ])
        .env("RUST_LOG", "warn")
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}");
    assert!(stdout.contains("purged 2 operations"), "{stdout}");

    let mut left: Vec<String> = sqlx::query_scalar("SELECT operation_key FROM agent_operations")
        .fetch_all(app.pool())
        .await
        .unwrap();
    left.sort();
    assert_eq!(
        left,
        [
            "old:in_progress",
            "old:pending",
            "old:unknown",
            "young:failed",
            "young:in_progress",
            "young:succeeded",
            "young:unknown",
        ]
    );
    let orphan_events: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM operation_events WHERE operation_key IN ('old:succeeded', 'old:failed')",
    )
    .fetch_one(app.pool())
    .await
    .unwrap();
    assert_eq!(orphan_events, 0, "the history goes with the operation");

    // The 60-day-old unknown operation still demands verification.
    let old_unknown = app
        .begin("old:unknown", "create_payment", "{}")
        .await
        .unwrap();
    assert_eq!(decision(&old_unknown), Decision::VerificationRequired);
    // A purged key is forgotten: a Begin with it registers a new operation.
    let reborn = app
        .begin("old:succeeded", "create_payment", "{}")
        .await
        .unwrap();
    assert_eq!(decision(&reborn), Decision::Execute);
    assert_eq!(reborn.operation.as_ref().unwrap().attempt_count, 1);
    assert_eq!(
        op_status(reborn.operation.as_ref().unwrap()),
        OperationStatus::InProgress
    );
    // The worker purges too (nothing left to purge now).
    assert_eq!(app.worker("w").purge(10).await.unwrap(), 0);
}
