//! The shipped binaries as processes: health endpoints, working against the journal, and a
//! clean stop on SIGTERM.

#![allow(clippy::unwrap_used, missing_docs)]

mod common;

use std::process::Stdio;
use std::time::{Duration, Instant};

use common::*;
use opjournal::proto::OperationStatus;
use sqlx::PgPool;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

/// Starts `binary` with `args` and returns it with the address it printed after `marker`.
async fn start(binary: &str, args: &[String], marker: &str) -> (Child, String) {
    let mut child = Command::new(binary)
        .args(args)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let line = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
        .await
        .expect("the binary printed its address")
        .unwrap()
        .unwrap();
    let address = line.rsplit(' ').next().unwrap().to_owned();
    assert!(line.contains(marker), "{line}");
    (child, address)
}

async fn health(address: &str, service: &str) -> i32 {
    let channel = tonic::transport::Channel::from_shared(format!("http://{address}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut client = HealthClient::new(channel);
    client
        .check(HealthCheckRequest {
            service: service.into(),
        })
        .await
        .unwrap()
        .into_inner()
        .status
}

async fn wait_serving(address: &str, service: &str) {
    let started = Instant::now();
    while health(address, service).await != ServingStatus::Serving as i32 {
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "{service} never SERVING"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn terminate(mut child: Child) {
    let pid = child.id().unwrap().to_string();
    let killed = Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .await
        .unwrap();
    assert!(killed.success());
    let status = tokio::time::timeout(Duration::from_secs(15), child.wait())
        .await
        .expect("the process stops on SIGTERM")
        .unwrap();
    assert!(status.success(), "exit status {status}");
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn the_reconcile_worker_serves_health_settles_work_and_stops_on_sigterm(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    let dir = tempfile::tempdir().unwrap();
    let policy = dir.path().join("policy.yaml");
    std::fs::write(&policy, &app.policy_yaml).unwrap();
    let args = [
        "--database-url".to_owned(),
        app.database_url(),
        "--policy".to_owned(),
        policy.display().to_string(),
        "--health-listen".to_owned(),
        "127.0.0.1:0".to_owned(),
        "--metrics-listen".to_owned(),
        "127.0.0.1:0".to_owned(),
    ];
    let (child, address) = start(
        env!("CARGO_BIN_EXE_opjournal-reconciler"),
        &args,
        "opjournal-reconciler health on",
    )
    .await;
    assert_eq!(
        health(&address, "liveness").await,
        ServingStatus::Serving as i32
    );
    wait_serving(&address, "readiness").await;

    // The running worker settles an unknown payment on its own.
    let begin = app
        .begin(PAYMENT_KEY, "create_payment", PAY_817)
        .await
        .unwrap();
    assert!(
        app.pay(PAYMENT_KEY, PAY_817, Some("commit-then-timeout"))
            .await
            .is_none()
    );
    app.report_unknown(&begin.lease_token).await;
    let started = Instant::now();
    while op_status(&app.get(PAYMENT_KEY).await) != OperationStatus::Succeeded {
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "the worker never settled it"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(app.counts(PAYMENT_KEY).effects, 1);
    terminate(child).await;
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn the_server_binary_serves_and_stops_on_sigterm(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    let args = [
        "serve".to_owned(),
        "--listen".to_owned(),
        "127.0.0.1:0".to_owned(),
        "--metrics-listen".to_owned(),
        "127.0.0.1:0".to_owned(),
        "--database-url".to_owned(),
        app.database_url(),
    ];
    let (child, address) = start(
        env!("CARGO_BIN_EXE_opjournal"),
        &args,
        "opjournal listening on",
    )
    .await;
    wait_serving(&address, "readiness").await;
    let mut client = opjournal::proto::operation_journal_client::OperationJournalClient::connect(
        format!("http://{address}"),
    )
    .await
    .unwrap();
    let begin = client
        .begin_operation(opjournal::proto::BeginOperationRequest {
            operation_key: "k".into(),
            action_type: "anything".into(),
            payload_json: "{}".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(decision(&begin), opjournal::proto::Decision::Execute);
    terminate(child).await;
}
