//! Group commit on Postgres: calls queued behind a busy lane go to the database as one
//! statement and one commit (rows written by one transaction share its `xmin`), and each is
//! answered as it would have been alone: the same rows, the same history, a key repeated in a
//! batch executed once, a bad item failing alone.
//!
//! A lane is made busy by a transaction of the test that holds what its first call needs (an
//! uncommitted insert of the same key, a locked row); every call made meanwhile queues.

use crate::common;

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use common::a_statement_waits_for_a_lock;
use opjournal::domain::canonical::RequestHash;
use opjournal::domain::lease::LeaseToken;
use opjournal::domain::model::{
    ActionType, ErrorCode, ExternalId, Namespace, OperationKey, OperationRecord, Status,
};
use opjournal::store::{
    GroupCommit, JournalStore, NewOperation, PgStore, Registration, Settled, Settlement, StoreError,
};
use sqlx::PgPool;
use uuid::Uuid;

/// One lane: everything queued while it is busy goes in its next batch.
fn one_lane(pool: &PgPool) -> PgStore {
    let group = GroupCommit {
        lanes: 1,
        max_batch: 128,
    };
    PgStore::new(pool.clone()).with_group_commit(Some(group))
}

fn new_operation(key: &str) -> NewOperation {
    NewOperation {
        namespace: Namespace::parse("").unwrap(),
        operation_key: OperationKey::parse(key).unwrap(),
        action_type: ActionType::parse("create_payment").unwrap(),
        request_hash: RequestHash::from_hex(&"a".repeat(64)).unwrap(),
        references: BTreeMap::from([("order_id".to_owned(), key.to_owned())]),
        lease: Duration::from_secs(60),
        lease_id: Uuid::new_v4(),
        attempt: None,
        action_policy: serde_json::json!({}),
        trace_context: Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".into()),
    }
}

fn token(record: &OperationRecord) -> LeaseToken {
    LeaseToken {
        namespace: record.namespace.clone(),
        operation_key: record.operation_key.clone(),
        attempt: record.attempt_count,
        lease_id: record.lease_id.unwrap(),
    }
}

/// The three kinds of report, by index.
fn report(kind: usize, key: &str) -> Settlement {
    match kind {
        0 => Settlement::Succeeded {
            external_id: ExternalId::parse_optional(&format!("ch_{key}")).unwrap(),
            result_json: Some(format!(r#"{{"id":"ch_{key}"}}"#)),
        },
        1 => Settlement::FailedFinal {
            error_code: ErrorCode::parse_optional("card_declined").unwrap().unwrap(),
        },
        _ => Settlement::Unknown {
            error_code: ErrorCode::parse_optional("timeout").unwrap(),
            first_check_after: Duration::from_secs(30),
        },
    }
}

type Call<'a, T> = Pin<Box<dyn Future<Output = Result<T, StoreError>> + Send + 'a>>;

/// Polls each call once (which queues it) and answers them all once `release` has run.
async fn queued_then_released<'a, T>(
    mut calls: Vec<Call<'a, T>>,
    release: impl Future<Output = ()>,
) -> Vec<Result<T, StoreError>> {
    for call in &mut calls {
        assert!(futures::poll!(call.as_mut()).is_pending());
    }
    release.await;
    futures::future::join_all(calls).await
}

/// How many transactions wrote the rows of `keys` (their distinct `xmin`).
async fn commits_of(pool: &PgPool, keys: &[String]) -> i64 {
    sqlx::query_scalar(
        "SELECT count(DISTINCT xmin::text) FROM agent_operations WHERE operation_key = ANY($1)",
    )
    .bind(keys)
    .fetch_one(pool)
    .await
    .unwrap()
}

/// The history of `key` as (from, to, reason).
async fn history(pool: &PgPool, key: &str) -> Vec<(Option<String>, String, Option<String>)> {
    sqlx::query_as(
        "SELECT from_status, to_status, reason FROM operation_events \
         WHERE operation_key = $1 ORDER BY event_id",
    )
    .bind(key)
    .fetch_all(pool)
    .await
    .unwrap()
}

/// Holds `key` busy: an uncommitted registration of it, which a registration of the same key
/// waits for.
async fn uncommitted_insert(
    pool: &PgPool,
    key: &str,
) -> sqlx::Transaction<'static, sqlx::Postgres> {
    let mut tx = pool.begin().await.unwrap();
    sqlx::query(
        "INSERT INTO agent_operations (operation_key, action_type, request_hash, status, \
         attempt_count, lease_until, lease_id, created_at, updated_at) \
         VALUES ($1, 'create_payment', repeat('a', 64), 'in_progress', 1, \
                 now() + interval '1 minute', gen_random_uuid(), now(), now())",
    )
    .bind(key)
    .execute(&mut *tx)
    .await
    .unwrap();
    tx
}

/// Makes the one register lane of `store` busy: its call waits for a registration of the
/// same key that the returned transaction holds uncommitted. Rolling it back lets the call
/// insert.
async fn a_busy_register_lane(
    pool: &PgPool,
    store: &PgStore,
) -> (
    sqlx::Transaction<'static, sqlx::Postgres>,
    Call<'static, Registration>,
) {
    let blocker = uncommitted_insert(pool, "blocker").await;
    let store = store.clone();
    let mut first: Call<'static, Registration> =
        Box::pin(async move { store.register(&new_operation("blocker")).await });
    assert!(futures::poll!(first.as_mut()).is_pending());
    a_statement_waits_for_a_lock(pool).await;
    (blocker, first)
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn registrations_queued_behind_a_busy_lane_commit_once_and_answer_each(pool: PgPool) {
    let store = one_lane(&pool);
    let (blocker, first) = a_busy_register_lane(&pool, &store).await;

    let keys: Vec<String> = (0..20).map(|i| format!("batch-{i}")).collect();
    let news: Vec<NewOperation> = keys.iter().map(|key| new_operation(key)).collect();
    let repeat = new_operation("batch-0");
    let mut calls: Vec<Call<'_, Registration>> = news
        .iter()
        .map(|new| Box::pin(store.register(new)) as Call<'_, _>)
        .collect();
    calls.push(Box::pin(store.register(&repeat)));
    let answers = queued_then_released(calls, async {
        blocker.rollback().await.unwrap();
        assert!(matches!(first.await.unwrap(), Registration::Inserted(_)));
    })
    .await;

    // Each new key inserted, under its own lease; the repeat met the row the first left.
    for (new, answer) in news.iter().zip(&answers) {
        let Ok(Registration::Inserted(record)) = answer else {
            panic!("{answer:?}");
        };
        assert_eq!(record.operation_key, new.operation_key);
        assert_eq!(record.lease_id, Some(new.lease_id));
        assert_eq!(record.status, Status::InProgress);
        assert_eq!(record.references, new.references);
        assert_eq!(record.trace_context, new.trace_context);
    }
    let Ok(Registration::Existing(existing)) = answers.last().unwrap() else {
        panic!("{:?}", answers.last());
    };
    assert_eq!(existing.lease_id, Some(news[0].lease_id));

    // One statement, one commit for the twenty; each with its one registration event.
    assert_eq!(commits_of(&pool, &keys).await, 1);
    for key in &keys {
        let events = history(&pool, key).await;
        let registered = vec![(
            None,
            "in_progress".to_owned(),
            Some("registered".to_owned()),
        )];
        assert_eq!(events, registered, "{key}");
    }
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn a_bad_registration_in_a_batch_fails_alone(pool: PgPool) {
    let store = one_lane(&pool);
    let (blocker, first) = a_busy_register_lane(&pool, &store).await;

    let mut news: Vec<NewOperation> = (0..6).map(|i| new_operation(&format!("n-{i}"))).collect();
    // What the edge never lets through, and the database refuses: a malformed traceparent.
    news[3].trace_context = Some("not-a-traceparent".into());
    let calls = news
        .iter()
        .map(|new| Box::pin(store.register(new)) as Call<'_, _>);
    let answers = queued_then_released(calls.collect(), async {
        blocker.rollback().await.unwrap();
        first.await.unwrap();
    })
    .await;

    for (i, answer) in answers.iter().enumerate() {
        match i {
            3 => assert!(matches!(answer, Err(StoreError::Other(_))), "{answer:?}"),
            _ => assert!(
                matches!(answer, Ok(Registration::Inserted(_))),
                "{answer:?}"
            ),
        }
    }
    let rows: Vec<String> = sqlx::query_scalar(
        "SELECT operation_key FROM agent_operations WHERE operation_key LIKE 'n-%' ORDER BY 1",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(rows, ["n-0", "n-1", "n-2", "n-4", "n-5"]);
    assert!(history(&pool, "n-3").await.is_empty());
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn reports_queued_behind_a_busy_lane_commit_per_kind_and_match_reports_alone(pool: PgPool) {
    let store = one_lane(&pool);
    let alone = PgStore::new(pool.clone()).with_group_commit(None);
    let mut records = Vec::new();
    for i in 0..16 {
        let new = new_operation(&format!("r-{i}"));
        let Registration::Inserted(record) = alone.register(&new).await.unwrap() else {
            panic!("r-{i} existed");
        };
        records.push(record);
    }
    // r-0..r-4 succeed, r-5..r-9 fail, r-10..r-14 turn unknown, in one batch; r-15 is held.
    let kind = |i: usize| i / 5;
    let mut tx = pool.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM agent_operations WHERE operation_key = 'r-15' FOR UPDATE")
        .execute(&mut *tx)
        .await
        .unwrap();
    let held = (token(&records[15]), report(0, "r-15"));
    let mut first: Call<'_, Option<Settled>> = Box::pin(store.settle(&held.0, &held.1));
    assert!(futures::poll!(first.as_mut()).is_pending());
    a_statement_waits_for_a_lock(&pool).await;

    let reports: Vec<(LeaseToken, Settlement)> = (0..15)
        .map(|i| (token(&records[i]), report(kind(i), &format!("r-{i}"))))
        .collect();
    // The first report again, and a report under a lease that is not the row's.
    let mut stale = token(&records[1]);
    stale.lease_id = Uuid::new_v4();
    let extra = [reports[0].clone(), (stale, report(0, "r-1"))];
    let calls = reports
        .iter()
        .chain(&extra)
        .map(|(token, settlement)| Box::pin(store.settle(token, settlement)) as Call<'_, _>);
    let answers: Vec<Result<Option<Settled>, StoreError>> =
        queued_then_released(calls.collect(), async {
            tx.rollback().await.unwrap();
            assert!(first.await.unwrap().is_some());
        })
        .await;

    for (i, answer) in answers[..15].iter().enumerate() {
        let Ok(Some(settled)) = answer else {
            panic!("r-{i}: {answer:?}");
        };
        assert_eq!(settled.previous, Status::InProgress);
        let expected = [Status::Succeeded, Status::FailedFinal, Status::Unknown][kind(i)];
        assert_eq!(settled.record.status, expected, "r-{i}");
    }
    // The repeat met the row its first left; the stale lease changed nothing.
    assert!(matches!(answers[15], Ok(None)), "{:?}", answers[15]);
    assert!(matches!(answers[16], Ok(None)), "{:?}", answers[16]);

    // One commit per kind of report.
    let keys: Vec<String> = (0..15).map(|i| format!("r-{i}")).collect();
    assert_eq!(commits_of(&pool, &keys).await, 3);

    // Each row as the same report alone leaves it, and its history the same.
    for k in 0..3 {
        let key = format!("alone-{k}");
        let Registration::Inserted(record) = alone.register(&new_operation(&key)).await.unwrap()
        else {
            panic!("{key} existed");
        };
        let by_itself = alone
            .settle(&token(&record), &report(k, &format!("r-{}", k * 5)))
            .await
            .unwrap()
            .unwrap()
            .record;
        let batched = answers[k * 5].as_ref().unwrap().as_ref().unwrap();
        assert_eq!(
            comparable(&batched.record),
            comparable(&by_itself),
            "kind {k}"
        );
        let batched_history = history(&pool, &format!("r-{}", k * 5)).await;
        assert_eq!(batched_history, history(&pool, &key).await, "kind {k}");
    }
}

/// What a report decides about a row, without what differs from row to row (key, times,
/// lease id); times as seconds after the report.
fn comparable(record: &OperationRecord) -> String {
    let after = |at: Option<chrono::DateTime<chrono::Utc>>| {
        at.map(|at| (at - record.updated_at).num_seconds())
    };
    format!(
        "{:?} {} {:?} {:?} {:?} {:?} {:?} {:?} {:?}",
        record.status,
        record.attempt_count,
        record.external_id,
        record.result_json,
        record.error_code,
        record.lease_until,
        after(record.next_check_at),
        after(record.unknown_since),
        record.last_actor_kind,
    )
}

/// The batch statements find each row of a batch through the primary key whatever the size of
/// the journal: prepared with the generic plan Postgres settles on for a statement run many
/// times, on a journal of 20,000 rows.
#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn batch_statements_read_rows_through_the_primary_key(pool: PgPool) {
    sqlx::query(
        "INSERT INTO agent_operations (operation_key, action_type, request_hash, status, \
         attempt_count, lease_until, lease_id, created_at, updated_at) \
         SELECT 'k-' || i, 'create_payment', repeat('a', 64), 'in_progress', 1, \
                now() + interval '1 minute', gen_random_uuid(), now(), now() \
         FROM generate_series(1, 20000) AS i",
    )
    .execute(&pool)
    .await
    .unwrap();
    sqlx::query("ANALYZE agent_operations")
        .execute(&pool)
        .await
        .unwrap();
    let mut conn = pool.acquire().await.unwrap();
    sqlx::query("SET plan_cache_mode = force_generic_plan")
        .execute(&mut *conn)
        .await
        .unwrap();
    let store = PgStore::new(pool.clone());
    let batches: Vec<_> = store
        .explained()
        .into_iter()
        .filter(|(name, _)| name.ends_with("_many") || name.contains("_many_"))
        .collect();
    assert_eq!(batches.len(), 4);
    for (name, sql) in batches {
        sqlx::query(sqlx::AssertSqlSafe(format!("PREPARE batch AS {sql}")))
            .execute(&mut *conn)
            .await
            .unwrap();
        let parameters: i64 = sqlx::query_scalar(
            "SELECT cardinality(parameter_types)::int8 FROM pg_prepared_statements WHERE name = 'batch'",
        )
        .fetch_one(&mut *conn)
        .await
        .unwrap();
        let nulls = vec!["NULL"; usize::try_from(parameters).unwrap()].join(", ");
        let explain = format!("EXPLAIN (COSTS OFF) EXECUTE batch({nulls})");
        let plan: Vec<String> = sqlx::query_scalar(sqlx::AssertSqlSafe(explain))
            .fetch_all(&mut *conn)
            .await
            .unwrap();
        let plan = plan.join("\n");
        assert!(!plan.contains("Seq Scan"), "{name}: {plan}");
        assert!(plan.contains("agent_operations_pkey"), "{name}: {plan}");
        sqlx::query("DEALLOCATE batch")
            .execute(&mut *conn)
            .await
            .unwrap();
    }
}
