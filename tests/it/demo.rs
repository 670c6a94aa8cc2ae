//! `opjournal demo` runs the seven-step check against real processes and its exit code
//! says whether every step held.

use sqlx::PgPool;

fn database_url(pool: &PgPool) -> String {
    let options = pool.connect_options();
    format!(
        "postgres://{}@{}:{}/{}",
        options.get_username(),
        options.get_host(),
        options.get_port(),
        options.get_database().unwrap()
    )
}

async fn demo(args: &[&str]) -> (bool, String) {
    // A failed demo keeps its working directory for the logs: keep it out of /tmp.
    let scratch = tempfile::tempdir().unwrap();
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_opjournal"))
        .arg("demo")
        .args(args)
        .env("TMPDIR", scratch.path())
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    (output.status.success(), stdout)
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn the_demo_ends_with_exactly_one_effect(pool: PgPool) {
    let url = database_url(&pool);
    let (success, stdout) = demo(&["--database-url", &url]).await;
    assert!(success, "{stdout}");
    for step in 1..=7 {
        assert!(
            stdout.contains(&format!("\n{step}. ")),
            "step {step}: {stdout}"
        );
    }
    assert!(stdout.contains("effects: 1, requests: 1"), "{stdout}");
    assert!(stdout.contains("Verdict: exactly one effect."), "{stdout}");
    assert!(!stdout.contains("FAILED"), "{stdout}");

    // The demo's own operation is in the journal, in a namespace of its own, succeeded once.
    let rows: Vec<(String, String, i32)> = sqlx::query_as(
        "SELECT namespace, status, attempt_count FROM agent_operations
         WHERE operation_key = 'payment:order-817:intent-01'",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(rows.len(), 1);
    assert!(rows[0].0.starts_with("demo-"));
    assert_eq!((rows[0].1.as_str(), rows[0].2), ("succeeded", 1));
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn the_demo_fails_loudly_when_a_step_does_not_hold(pool: PgPool) {
    // The provider's search lags far behind the time step 5 may wait: the reconciler cannot
    // prove the payment, so the operation stays unknown and the demo must not pass.
    let url = database_url(&pool);
    let (success, stdout) = demo(&[
        "--database-url",
        &url,
        "--lookup-lag-seconds",
        "120",
        "--reconcile-wait-seconds",
        "2",
    ])
    .await;
    assert!(!success, "{stdout}");
    assert!(stdout.contains("Verdict: FAILED — step 5"), "{stdout}");
    assert!(!stdout.contains("exactly one effect"), "{stdout}");
    let status: String = sqlx::query_scalar(
        "SELECT status FROM agent_operations WHERE operation_key = 'payment:order-817:intent-01'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(status, "unknown");
}

#[tokio::test]
async fn the_demo_runs_on_the_embedded_journal_with_no_setup() {
    let (success, stdout) = demo(&[]).await;
    assert!(success, "{stdout}");
    assert!(stdout.contains("journal: embedded SQLite"), "{stdout}");
    assert!(stdout.contains("effects: 1, requests: 1"), "{stdout}");
    assert!(stdout.contains("Verdict: exactly one effect."), "{stdout}");
}
