//! A database outage and its end, without a restart: readiness follows the database, calls
//! are refused with UNAVAILABLE / STORE_UNAVAILABLE and change nothing, and every call
//! acknowledged before, during or after the outage is in the journal. The outage is a TCP
//! proxy between the server and Postgres that the test cuts and restores (the machine's
//! Postgres is never stopped).

use crate::common;

use std::collections::BTreeMap;

use common::observe::{PgProxy, wait_health};
use common::*;
use opjournal::proto::{CompleteOperationRequest, Decision};
use opjournal::store::PgStore;
use sqlx::PgPool;
use tonic::Code;
use tonic_health::pb::health_check_response::ServingStatus;

async fn complete(app: &TestApp, token: &str) -> Result<(), tonic::Status> {
    app.journal
        .clone()
        .complete_operation(CompleteOperationRequest {
            lease_token: token.into(),
            external_id: "pay_1".into(),
            result_json: String::new(),
        })
        .await
        .map(|_| ())
}

/// Every row's status, by key, read directly from Postgres.
async fn journal(app: &TestApp) -> BTreeMap<String, String> {
    sqlx::query_as::<_, (String, String)>("SELECT operation_key, status FROM agent_operations")
        .fetch_all(app.pool())
        .await
        .unwrap()
        .into_iter()
        .collect()
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn readiness_and_calls_follow_the_database_and_recover_without_a_restart(pool: PgPool) {
    let proxy = PgProxy::start().await;
    let direct = TestDb::Postgres(pool.clone()).url();
    let store = PgStore::connect_lazy(&proxy.url_for(&direct), 5).unwrap();
    let app = TestApp::spawn_with_options(
        pool,
        SpawnOptions {
            store: Some(store),
            ..SpawnOptions::default()
        },
    )
    .await;
    wait_health(app.addr, "readiness", ServingStatus::Serving as i32).await;

    // Before: three completed operations and one still held.
    let mut expected = BTreeMap::new();
    for i in 0..3 {
        let key = format!("before-{i}");
        let begin = app.begin(&key, "create_payment", PAY_817).await.unwrap();
        assert_eq!(decision(&begin), Decision::Execute);
        complete(&app, &begin.lease_token).await.unwrap();
        expected.insert(key, "succeeded".to_owned());
    }
    let held = app
        .begin("held-across", "create_payment", PAY_817)
        .await
        .unwrap();
    expected.insert("held-across".to_owned(), "in_progress".to_owned());

    // The database goes away: readiness turns NOT_SERVING, liveness stays SERVING.
    proxy.cut();
    wait_health(app.addr, "readiness", ServingStatus::NotServing as i32).await;
    wait_health(
        app.addr,
        "opjournal.v1.OperationJournal",
        ServingStatus::NotServing as i32,
    )
    .await;
    assert_eq!(
        common::observe::health_status(app.addr, "liveness").await,
        ServingStatus::Serving as i32
    );
    // Calls are refused as retryable, and change nothing.
    let refused = app
        .begin("during-outage", "create_payment", PAY_817)
        .await
        .unwrap_err();
    assert_eq!(
        (refused.code(), reason(&refused).as_str()),
        (Code::Unavailable, "STORE_UNAVAILABLE")
    );
    let refused = complete(&app, &held.lease_token).await.unwrap_err();
    assert_eq!(
        (refused.code(), reason(&refused).as_str()),
        (Code::Unavailable, "STORE_UNAVAILABLE")
    );
    assert_eq!(
        journal(&app).await,
        expected,
        "nothing changed during the outage"
    );

    // The database is back: readiness and calls recover in the same process.
    proxy.restore();
    wait_health(app.addr, "readiness", ServingStatus::Serving as i32).await;
    wait_health(
        app.addr,
        "opjournal.v1.OperationJournal",
        ServingStatus::Serving as i32,
    )
    .await;
    let retried = app
        .begin("during-outage", "create_payment", PAY_817)
        .await
        .unwrap();
    assert_eq!(decision(&retried), Decision::Execute);
    assert_eq!(retried.operation.as_ref().unwrap().attempt_count, 1);
    complete(&app, &retried.lease_token).await.unwrap();
    complete(&app, &held.lease_token).await.unwrap();
    expected.insert("during-outage".to_owned(), "succeeded".to_owned());
    expected.insert("held-across".to_owned(), "succeeded".to_owned());
    for i in 0..3 {
        let replay = app
            .begin(&format!("before-{i}"), "create_payment", PAY_817)
            .await
            .unwrap();
        assert_eq!(decision(&replay), Decision::Replay);
    }

    // No acknowledged operation was lost, and nothing unacknowledged was written.
    assert_eq!(journal(&app).await, expected);
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn the_reconcile_workers_readiness_and_polls_recover_without_a_restart(pool: PgPool) {
    use std::sync::Arc;

    use opjournal::domain::policy::Policy;
    use opjournal::proto::OperationStatus;
    use opjournal::reconcile::worker::{Worker, WorkerConfig};
    use opjournal::reconcile::{AdapterSet, Reconciler};
    use opjournal::store::JournalStore;
    use tokio_util::sync::CancellationToken;

    let app = TestApp::spawn(pool).await;
    let proxy = PgProxy::start().await;
    let store: Arc<dyn JournalStore> =
        Arc::new(PgStore::connect_lazy(&proxy.url_for(&app.database_url()), 5).unwrap());
    // The worker and its health server, as opjournal-reconciler wires them, over the proxy.
    let policy = Arc::new(Policy::parse(&app.policy_yaml, "test-policy.yaml").unwrap());
    let adapters = AdapterSet::from_policy(&policy).unwrap();
    let worker = Worker::new(
        Reconciler::new(store.clone(), policy, adapters, "outage-worker"),
        WorkerConfig::default(),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let health = listener.local_addr().unwrap();
    let shutdown = CancellationToken::new();
    tokio::spawn(opjournal::api::serve_health(
        store,
        listener,
        std::time::Duration::from_millis(200),
        opjournal::api::TransportLimits::default(),
        shutdown.clone(),
    ));
    wait_health(health, "readiness", ServingStatus::Serving as i32).await;

    // An unknown payment whose effect the provider has.
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

    proxy.cut();
    wait_health(health, "readiness", ServingStatus::NotServing as i32).await;
    assert_eq!(
        common::observe::health_status(health, "liveness").await,
        ServingStatus::Serving as i32
    );
    assert!(matches!(
        worker.tick().await,
        Err(opjournal::store::StoreError::Unavailable(_))
    ));
    assert_eq!(
        app.counts(PAYMENT_KEY).lookups,
        0,
        "no lookup without the journal"
    );
    assert_eq!(
        op_status(&app.get(PAYMENT_KEY).await),
        OperationStatus::Unknown
    );

    proxy.restore();
    wait_health(health, "readiness", ServingStatus::Serving as i32).await;
    let stats = worker.tick().await.unwrap();
    assert_eq!((stats.looked_up, stats.settled), (1, 1));
    assert_eq!(
        op_status(&app.get(PAYMENT_KEY).await),
        OperationStatus::Succeeded
    );
    assert_eq!(app.counts(PAYMENT_KEY).effects, 1);
    shutdown.cancel();
}

/// A Postgres error as a log line carries its message and SQLSTATE, and not the input a
/// message would quote.
#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn a_postgres_error_is_logged_with_its_message_and_sqlstate_and_no_input(pool: PgPool) {
    let cause =
        |error: sqlx::Error| opjournal::store::StoreError::Other(Box::new(error)).to_string();
    let missing = sqlx::query("SELECT * FROM agent_operations_elsewhere")
        .execute(&pool)
        .await
        .unwrap_err();
    assert_eq!(
        cause(missing),
        r#"database error: relation "agent_operations_elsewhere" does not exist (SQLSTATE 42P01)"#
    );
    let quoted = sqlx::query("SELECT 'payment:secret-7731'::uuid")
        .execute(&pool)
        .await
        .unwrap_err();
    assert_eq!(
        cause(quoted),
        r#"database error: invalid input syntax for type uuid: "…" (SQLSTATE 22P02)"#
    );
    let check = sqlx::query(
        "INSERT INTO agent_operations (namespace, operation_key, action_type, request_hash, \
         status, created_at, updated_at) VALUES ('default', 'payment:secret-7731', \
         'create_payment', 'not-a-hash', 'pending', now(), now())",
    )
    .execute(&pool)
    .await
    .unwrap_err();
    let line = cause(check);
    assert!(
        line.contains("(SQLSTATE 23")
            && line.contains("constraint agent_operations_request_hash_hex")
            && line.contains("table agent_operations"),
        "{line}"
    );
    assert!(!line.contains("secret-7731"), "{line}");
}
