//! A provider adapter written in Python (examples/adapters/python), started by the test as
//! its own process, settles an unknown operation for the reconcile worker over gRPC.

use crate::common;

use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use common::*;
use opjournal::domain::policy::Policy;
use opjournal::proto::{Decision, OperationStatus};
use opjournal::reconcile::worker::{Worker, WorkerConfig};
use opjournal::reconcile::{AdapterSet, Reconciler};
use opjournal::store::{JournalStore, PgStore};
use sqlx::PgPool;
use tokio::io::{AsyncBufReadExt, BufReader};

/// The interpreter with the adapter's requirements installed: `OPJOURNAL_TEST_PYTHON`, or the
/// virtual environment `./scripts/test` prepares, or `python3`.
fn python() -> PathBuf {
    if let Ok(path) = std::env::var("OPJOURNAL_TEST_PYTHON") {
        return path.into();
    }
    let venv = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/python-venv/bin/python");
    if venv.exists() {
        venv
    } else {
        "python3".into()
    }
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn a_python_grpc_adapter_settles_an_unknown_payment_for_the_worker(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("examples/adapters/python/sandbox_adapter.py");
    let mut adapter = tokio::process::Command::new(python())
        .arg(&script)
        .args(["--listen", "127.0.0.1:0", "--sandbox-url", &app.sandbox_url])
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect(
            "python3 with examples/adapters/python/requirements.txt (./scripts/test installs them)",
        );
    let mut lines = BufReader::new(adapter.stdout.take().unwrap()).lines();
    let line = tokio::time::timeout(Duration::from_secs(120), lines.next_line())
        .await
        .expect("the adapter started")
        .unwrap()
        .expect("the adapter printed its address (are its requirements installed?)");
    let address = line.rsplit(' ').next().unwrap().to_owned();

    // The payment's answer is lost after the provider committed it.
    let begin = app
        .begin(PAYMENT_KEY, "create_payment", PAY_817)
        .await
        .unwrap();
    assert_eq!(decision(&begin), Decision::Execute);
    assert!(
        app.pay(PAYMENT_KEY, PAY_817, Some("commit-then-timeout"))
            .await
            .is_none()
    );
    app.report_unknown(&begin.lease_token).await;

    let policy = Policy::parse(
        &format!(
            r#"
actions:
  create_payment:
    reconcile:
      adapter: payments_py
      first_check_after_seconds: 0
adapters:
  payments_py:
    kind: grpc
    endpoint: "http://{address}"
    timeout_seconds: 10
"#
        ),
        "python-adapter.yaml",
    )
    .unwrap();
    let policy = Arc::new(policy);
    let adapters = AdapterSet::from_policy(&policy).unwrap();
    let store: Arc<dyn JournalStore> = Arc::new(PgStore::new(app.pool().clone()));
    let worker = Worker::new(
        Reconciler::new(store, policy, adapters, "worker-py"),
        WorkerConfig::default(),
    );
    let stats = worker.tick().await.unwrap();
    let history = sqlx::query_scalar::<_, Option<String>>(
        "SELECT reason FROM operation_events ORDER BY event_id",
    )
    .fetch_all(app.pool())
    .await
    .unwrap();
    assert_eq!(
        (stats.looked_up, stats.settled, stats.errors),
        (1, 1, 0),
        "{history:?}"
    );

    let op = app.get(PAYMENT_KEY).await;
    assert_eq!(op_status(&op), OperationStatus::Succeeded);
    assert!(op.external_id.as_deref().unwrap().starts_with("pay_"));
    let result: serde_json::Value =
        serde_json::from_str(op.result_json.as_deref().unwrap()).unwrap();
    assert_eq!(result["amount_minor"], 490000);
    let counts = app.counts(PAYMENT_KEY);
    assert_eq!(
        (counts.effects, counts.lookups),
        (1, 1),
        "the adapter asked the provider once"
    );
    let replay = app
        .begin(PAYMENT_KEY, "create_payment", PAY_817)
        .await
        .unwrap();
    assert_eq!(decision(&replay), Decision::Replay);
    adapter.kill().await.unwrap();
}
