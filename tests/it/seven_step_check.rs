//! The source article's reproducible check, step by step, over real gRPC, the sandbox
//! provider and each storage backend: Postgres and the embedded SQLite journal file. The
//! proof is the provider's effect count, not any response text.

use crate::common;

use common::seven_steps::*;
use common::*;
use sqlx::PgPool;

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn the_seven_step_check_holds_with_reconcile_operation(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    run_with_reconcile_operation(&app).await;
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn the_seven_step_check_holds_with_the_reconcile_worker_binary(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    run_with_the_worker_binary(&app).await;
}

#[tokio::test]
async fn the_seven_step_check_holds_on_the_embedded_journal_with_reconcile_operation() {
    let app = TestApp::spawn_sqlite().await;
    run_with_reconcile_operation(&app).await;
}

/// The worker binary is a second process on the server's journal file.
#[tokio::test]
async fn the_seven_step_check_holds_on_the_embedded_journal_with_the_reconcile_worker_binary() {
    let app = TestApp::spawn_sqlite().await;
    run_with_the_worker_binary(&app).await;
}

/// All seven steps, settling step 5 with one poll of the `opjournal-reconciler` binary.
async fn run_with_the_worker_binary(app: &TestApp) {
    lose_the_response(app).await;

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

    check_exactly_one_effect_and_the_conflict(app).await;
}
