//! The embedded SQLite journal as a user meets it: `opjournal serve` with no configuration at
//! all keeps its journal in a local file; the reconcile worker, `migrate`, `purge` and
//! `check-config` work on that file; processes share it safely; a writer that holds the file
//! too long makes Begin retryable, never half-done. Behaviour shared with Postgres is in
//! tests/store_conformance.rs.

use crate::common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::process::terminate;
use common::*;
use opjournal::proto::operation_journal_client::OperationJournalClient;
use opjournal::proto::{BeginOperationRequest, Decision};
use opjournal::store::{JournalMaintenance, StoreError};
use sqlx::Connection as _;
use tokio::process::{Child, Command};
use tonic::Code;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

/// A command of one of the binaries, run in `dir` with no `OPJOURNAL_*` setting inherited.
fn binary(name: &str, dir: &Path) -> Command {
    let mut command = Command::new(process::binary(name));
    command.current_dir(dir).env("RUST_LOG", "warn");
    for (variable, _) in std::env::vars() {
        if variable.starts_with("OPJOURNAL_") {
            command.env_remove(variable);
        }
    }
    // Tests run side by side: never the fixed default metrics ports.
    command
        .env("OPJOURNAL_SERVER__METRICS_LISTEN", "127.0.0.1:0")
        .env("OPJOURNAL_RECONCILE__METRICS_LISTEN", "127.0.0.1:0");
    command
}

/// Runs a binary to completion: (success, stdout, stderr).
async fn run(name: &str, dir: &Path, args: &[&str]) -> (bool, String, String) {
    let output = binary(name, dir).args(args).output().await.unwrap();
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// `opjournal serve` in `dir` on port 0, with nothing but `args`; returns it and its address.
async fn serve(dir: &Path, args: &[&str]) -> (Child, String) {
    let (child, address) = process::spawn_announcing(
        binary("opjournal", dir)
            .args(["serve", "--listen", "127.0.0.1:0"])
            .args(args),
        "opjournal listening on",
    )
    .await;
    let started = Instant::now();
    loop {
        let channel = tonic::transport::Channel::from_shared(format!("http://{address}"))
            .unwrap()
            .connect()
            .await
            .unwrap();
        let status = HealthClient::new(channel)
            .check(HealthCheckRequest {
                service: "readiness".into(),
            })
            .await
            .unwrap()
            .into_inner()
            .status;
        if status == ServingStatus::Serving as i32 {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(15), "never ready");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    (child, address)
}

async fn begin(address: &str, key: &str) -> Result<Decision, tonic::Status> {
    let mut client = OperationJournalClient::connect(format!("http://{address}"))
        .await
        .unwrap();
    client
        .begin_operation(BeginOperationRequest {
            operation_key: key.into(),
            action_type: "create_payment".into(),
            payload_json: PAY_817.into(),
            ..Default::default()
        })
        .await
        .map(|r| decision(r.get_ref()))
}

#[tokio::test]
async fn serve_with_no_configuration_keeps_its_journal_in_a_local_file() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("opjournal-data/journal.db");
    assert!(!file.exists());

    let (server, address) = serve(dir.path(), &[]).await;
    assert!(
        file.exists(),
        "the default journal file was created with its directory"
    );
    assert_eq!(
        begin(&address, PAYMENT_KEY).await.unwrap(),
        Decision::Execute
    );
    terminate(server).await;

    // A restart finds the operation: its lease (30 s) is still live.
    let (server, address) = serve(dir.path(), &[]).await;
    assert_eq!(
        begin(&address, PAYMENT_KEY).await.unwrap(),
        Decision::InProgress
    );

    // The other commands find the same file by default, while the server runs.
    let (ok, stdout, stderr) = run("opjournal-reconciler", dir.path(), &["--once"]).await;
    assert!(ok, "{stdout} {stderr}");
    assert!(stdout.contains("swept=0"), "{stdout}");
    let (ok, stdout, stderr) = run("opjournal", dir.path(), &["purge"]).await;
    assert!(ok, "{stdout} {stderr}");
    assert!(stdout.contains("purged 0 operations"), "{stdout}");
    let (ok, stdout, stderr) = run("opjournal", dir.path(), &["migrate"]).await;
    assert!(ok, "{stdout} {stderr}");
    assert!(stdout.contains("migrations applied (sqlite)"), "{stdout}");
    let (ok, stdout, stderr) = run("opjournal", dir.path(), &["check-config"]).await;
    assert!(ok, "{stdout} {stderr}");
    terminate(server).await;

    let store =
        opjournal::app::database::sqlite(&format!("sqlite://{}", file.display()), 1).unwrap();
    let rows: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM agent_operations")
        .fetch_one(store.pool())
        .await
        .unwrap();
    assert_eq!(rows, 1);
}

#[tokio::test]
async fn the_worker_prepares_the_file_and_shares_it_with_the_server() {
    // The worker started first, on a file that does not exist yet.
    let dir = tempfile::tempdir().unwrap();
    let (ok, stdout, stderr) = run("opjournal-reconciler", dir.path(), &["--once"]).await;
    assert!(ok, "{stdout} {stderr}");
    assert!(dir.path().join("opjournal-data/journal.db").exists());
    let (server, address) = serve(dir.path(), &[]).await;
    assert_eq!(begin(&address, "k").await.unwrap(), Decision::Execute);
    terminate(server).await;
}

#[tokio::test]
async fn migrate_creates_the_file_and_processes_may_prepare_one_file_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("a/b/journal.db").display());
    let mut runs = Vec::new();
    for _ in 0..4 {
        let url = url.clone();
        let dir = dir.path().to_owned();
        runs.push(tokio::spawn(async move {
            run("opjournal", &dir, &["migrate", "--database-url", &url]).await
        }));
    }
    for task in runs {
        let (ok, stdout, stderr) = task.await.unwrap();
        assert!(ok, "{stdout} {stderr}");
        assert!(stdout.contains("migrations applied (sqlite)"), "{stdout}");
    }
    let store = opjournal::app::database::sqlite(&url, 1).unwrap();
    let applied: Vec<i64> = sqlx::query_scalar("SELECT version FROM _sqlx_migrations")
        .fetch_all(store.pool())
        .await
        .unwrap();
    let known: Vec<i64> = opjournal::store::sqlite::SQLITE_MIGRATOR
        .iter()
        .map(|m| m.version)
        .collect();
    assert_eq!(applied, known, "each migration applied once");
}

#[tokio::test]
async fn the_file_is_in_wal_mode_with_full_sync_and_a_busy_timeout() {
    let db = TestDb::sqlite().await;
    let TestDb::Sqlite { store, .. } = &db else {
        unreachable!()
    };
    let mut conn = store.pool().acquire().await.unwrap();
    let journal_mode: String = sqlx::query_scalar("PRAGMA journal_mode")
        .fetch_one(&mut *conn)
        .await
        .unwrap();
    let synchronous: i64 = sqlx::query_scalar("PRAGMA synchronous")
        .fetch_one(&mut *conn)
        .await
        .unwrap();
    let foreign_keys: i64 = sqlx::query_scalar("PRAGMA foreign_keys")
        .fetch_one(&mut *conn)
        .await
        .unwrap();
    let busy_timeout: i64 = sqlx::query_scalar("PRAGMA busy_timeout")
        .fetch_one(&mut *conn)
        .await
        .unwrap();
    assert_eq!(journal_mode, "wal");
    assert_eq!(synchronous, 2, "FULL");
    assert_eq!(foreign_keys, 1);
    assert_eq!(busy_timeout, 5000);
}

#[tokio::test]
async fn a_missing_file_is_not_ready_and_is_not_created_by_reads() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("journal.db");
    let store =
        opjournal::app::database::sqlite(&format!("sqlite://{}", file.display()), 2).unwrap();
    assert!(matches!(
        store.ping().await,
        Err(StoreError::Unavailable(_))
    ));
    assert!(!file.exists());
    store.prepare().await.unwrap();
    store.ping().await.unwrap();
}

#[tokio::test]
async fn a_file_from_a_newer_version_is_refused() {
    let db = TestDb::sqlite().await;
    let TestDb::Sqlite { store, .. } = &db else {
        unreachable!()
    };
    sqlx::query(
        "INSERT INTO _sqlx_migrations (version, description, success, checksum, \
             execution_time) VALUES (99991231000001, 'from the future', TRUE, x'00', 0)",
    )
    .execute(store.pool())
    .await
    .unwrap();
    let refused = store.prepare().await.unwrap_err();
    assert!(matches!(refused, StoreError::Other(_)), "{refused:?}");
}

#[tokio::test]
async fn check_config_accepts_both_backends_and_refuses_others() {
    let dir = tempfile::tempdir().unwrap();
    for url in [
        "sqlite://data/journal.db",
        "sqlite:///var/lib/opjournal/journal.db",
        "postgres://opjournal@db.internal:5432/opjournal",
        "postgresql://opjournal@db.internal/opjournal",
    ] {
        let (ok, stdout, stderr) = run(
            "opjournal",
            dir.path(),
            &["check-config", "--database-url", url],
        )
        .await;
        assert!(ok, "{url}: {stdout} {stderr}");
        assert!(
            stdout.contains("configuration and policy are valid"),
            "{stdout}"
        );
    }
    assert!(
        !dir.path().join("data").exists(),
        "check-config creates nothing"
    );
    for (url, says) in [
        (
            "mysql://root:hunter2@db/opjournal",
            "must start with postgres://",
        ),
        ("sqlite::memory:", "in-memory"),
    ] {
        let (ok, stdout, stderr) = run(
            "opjournal",
            dir.path(),
            &["check-config", "--database-url", url],
        )
        .await;
        assert!(!ok, "{url}: {stdout}");
        assert!(stderr.contains("database.url"), "{stderr}");
        assert!(stderr.contains(says), "{stderr}");
        assert!(!stderr.contains("hunter2"), "{stderr}");
    }
}

/// A Begin that cannot get the write lock within the busy timeout is answered UNAVAILABLE /
/// STORE_UNAVAILABLE with nothing written, and goes through once the lock is released.
#[tokio::test]
async fn a_begin_blocked_by_another_writer_is_retryable_and_writes_nothing() {
    let app = TestApp::spawn_sqlite().await;
    let TestDb::Sqlite { url, .. } = &app.db else {
        unreachable!()
    };
    // Another process holds the write lock.
    let mut other = sqlx::SqliteConnection::connect(url).await.unwrap();
    sqlx::query("BEGIN IMMEDIATE")
        .execute(&mut other)
        .await
        .unwrap();
    let refused = app
        .begin(PAYMENT_KEY, "create_payment", PAY_817)
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::Unavailable);
    assert_eq!(reason(&refused), "STORE_UNAVAILABLE");
    sqlx::query("ROLLBACK").execute(&mut other).await.unwrap();
    assert_eq!(app.rows_for(PAYMENT_KEY).await, 0);
    let begin = app
        .begin(PAYMENT_KEY, "create_payment", PAY_817)
        .await
        .unwrap();
    assert_eq!(decision(&begin), Decision::Execute);
    assert_eq!(app.rows_for(PAYMENT_KEY).await, 1);
}

/// The move to Postgres: every operation, its whole history and its escalation webhook events
/// arrive unchanged, and a retry
/// of a completed key is answered with a replay by a server on Postgres, never executed again.
#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn copy_journal_moves_the_embedded_journal_to_postgres(pool: sqlx::PgPool) {
    let app = TestApp::spawn_sqlite().await;
    common::seven_steps::run_with_reconcile_operation(&app).await;
    app.begin_in("tenant-b", "k-open", "create_payment", PAY_817, 0)
        .await
        .unwrap();
    let failed = app
        .begin("k-failed", "create_payment", PAY_817_OTHER_AMOUNT)
        .await
        .unwrap();
    app.fail_declined(&failed.lease_token).await;
    let email = app
        .begin("k-email", "send_email", r#"{"to":"customer"}"#)
        .await
        .unwrap();
    app.report_unknown(&email.lease_token).await;
    app.worker("w").tick().await.unwrap();
    let db = app.db.clone();
    app.stop().await;

    let source = db.database().store();
    let mut expected = Vec::new();
    for namespace in ["default", "tenant-b"] {
        let namespace = opjournal::domain::model::Namespace::parse(namespace).unwrap();
        let records = source
            .list(&opjournal::store::ListQuery {
                namespace,
                status: None,
                action_type: None,
                after: None,
                limit: 100,
            })
            .await
            .unwrap();
        for record in records {
            let history = source
                .history(&opjournal::store::HistoryQuery {
                    namespace: record.namespace.clone(),
                    operation_key: record.operation_key.clone(),
                    after_event_id: 0,
                    limit: 1000,
                })
                .await
                .unwrap();
            expected.push((record, history));
        }
    }
    assert_eq!(expected.len(), 4);
    assert!(expected.iter().any(|(r, _)| r.review_required_at.is_some()));

    let dir = tempfile::tempdir().unwrap();
    let target_url = TestDb::Postgres(pool.clone()).url();
    let copy = [
        "copy-journal",
        "--database-url",
        &db.url(),
        "--to",
        &target_url,
    ];
    let (ok, stdout, stderr) = run("opjournal", dir.path(), &copy).await;
    assert!(ok, "{stdout} {stderr}");
    let events: usize = expected.iter().map(|(_, h)| h.len()).sum();
    assert!(
        stdout.contains(&format!("copied 4 operations and {events} history entries")),
        "{stdout}"
    );

    let target = TestDb::Postgres(pool.clone()).database().store();
    for (record, history) in &expected {
        let copied = target
            .get(&record.namespace, &record.operation_key)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            opjournal::domain::model::OperationRecord {
                observed_at: record.observed_at,
                ..copied
            },
            *record
        );
        let copied_history = target
            .history(&opjournal::store::HistoryQuery {
                namespace: record.namespace.clone(),
                operation_key: record.operation_key.clone(),
                after_event_id: 0,
                limit: 1000,
            })
            .await
            .unwrap();
        assert_eq!(copied_history, *history);
        // The escalation webhook's events too, with their ids and delivery state.
        let outbox = |entries: Vec<opjournal::store::OutboxEntry>| -> Vec<_> {
            let read_at = chrono::DateTime::UNIX_EPOCH;
            let at = |e: opjournal::store::OutboxEntry| opjournal::store::OutboxEntry {
                observed_at: read_at,
                ..e
            };
            entries.into_iter().map(at).collect()
        };
        let (ns, key) = (&record.namespace, &record.operation_key);
        let copied_events = outbox(target.deliveries(ns, key).await.unwrap());
        assert_eq!(
            copied_events,
            outbox(source.deliveries(ns, key).await.unwrap())
        );
        assert_eq!(
            copied_events.len(),
            usize::from(record.review_required_at.is_some()),
            "one event for the escalated operation"
        );
    }

    // A server on Postgres replays the completed payment instead of executing it again.
    let moved = TestApp::spawn(pool.clone()).await;
    let replay = moved
        .begin(PAYMENT_KEY, "create_payment", PAY_817)
        .await
        .unwrap();
    assert_eq!(decision(&replay), Decision::Replay);
    assert_eq!(moved.counts(PAYMENT_KEY).requests, 0);
    // New history entries continue after the copied ones.
    moved.begin("k-new", "create_payment", "{}").await.unwrap();
    let last_copied = expected
        .iter()
        .flat_map(|(_, h)| h.iter().map(|e| e.event_id))
        .max()
        .unwrap();
    let new_event = target
        .history(&opjournal::store::HistoryQuery {
            namespace: opjournal::domain::model::Namespace::parse("").unwrap(),
            operation_key: opjournal::domain::model::OperationKey::parse("k-new").unwrap(),
            after_event_id: 0,
            limit: 10,
        })
        .await
        .unwrap();
    assert_eq!(new_event.len(), 1);
    assert!(new_event[0].event_id > last_copied);

    // A second copy would mix two journals: refused, nothing written.
    let (ok, stdout, stderr) = run("opjournal", dir.path(), &copy).await;
    assert!(!ok, "{stdout}");
    assert!(stderr.contains("not empty"), "{stderr}");
    assert_eq!(moved.rows_for("k-failed").await, 1);
}
