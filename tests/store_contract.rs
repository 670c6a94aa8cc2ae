//! The storage contract, statement by statement: every change is compare-and-set on the state
//! the caller read, and the database itself refuses what no code path may do.

#![allow(clippy::unwrap_used, missing_docs)]

use std::collections::BTreeMap;
use std::time::Duration;

use opjournal::domain::canonical::RequestHash;
use opjournal::domain::model::{
    ActionType, Attribution, Namespace, OperationKey, OperationRecord, Status,
};
use opjournal::store::{JournalStore, NewOperation, PgStore, Resolution};
use sqlx::PgPool;
use uuid::Uuid;

fn new_operation(key: &str, lease: Duration) -> NewOperation {
    NewOperation {
        namespace: Namespace::parse("").unwrap(),
        operation_key: OperationKey::parse(key).unwrap(),
        action_type: ActionType::parse("create_payment").unwrap(),
        request_hash: RequestHash::from_hex(&"a".repeat(64)).unwrap(),
        references: BTreeMap::new(),
        lease,
        lease_id: Uuid::new_v4(),
        action_policy: serde_json::json!({}),
    }
}

async fn unknown(store: &PgStore, key: &str) -> OperationRecord {
    store
        .insert_and_claim(&new_operation(key, Duration::from_secs(30)))
        .await
        .unwrap()
        .unwrap();
    sqlx::query(
        "UPDATE agent_operations SET status = 'unknown', lease_until = NULL, \
         next_check_at = now() WHERE operation_key = $1",
    )
    .bind(key)
    .execute(store.pool())
    .await
    .unwrap();
    store
        .get(
            &Namespace::parse("").unwrap(),
            &OperationKey::parse(key).unwrap(),
        )
        .await
        .unwrap()
        .unwrap()
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn a_second_insert_of_a_key_changes_nothing(pool: PgPool) {
    let store = PgStore::new(pool);
    let first = store
        .insert_and_claim(&new_operation("k", Duration::from_secs(30)))
        .await
        .unwrap()
        .unwrap();
    assert_eq!((first.status, first.attempt_count), (Status::InProgress, 1));
    assert!(
        store
            .insert_and_claim(&new_operation("k", Duration::from_secs(30)))
            .await
            .unwrap()
            .is_none()
    );
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn claims_and_resolutions_apply_only_to_the_attempt_that_was_read(pool: PgPool) {
    let store = PgStore::new(pool);
    let read = unknown(&store, "k").await;
    let (ns, key) = (read.namespace.clone(), read.operation_key.clone());
    let lease = Duration::from_secs(30);

    // A stale attempt claims nothing.
    let stale = store
        .claim(&ns, &key, Status::Unknown, 7, lease, Uuid::new_v4())
        .await
        .unwrap();
    assert!(stale.is_none());
    // The right one does, once.
    let claimed = store
        .claim(&ns, &key, Status::Unknown, 1, lease, Uuid::new_v4())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(claimed.attempt_count, 2);
    assert!(
        store
            .claim(&ns, &key, Status::Unknown, 1, lease, Uuid::new_v4())
            .await
            .unwrap()
            .is_none()
    );

    // Back to unknown at attempt 2: a resolution computed from attempt 1 must not apply.
    sqlx::query("UPDATE agent_operations SET status = 'unknown', lease_until = NULL")
        .execute(store.pool())
        .await
        .unwrap();
    let worker = Attribution::worker("w", "found_succeeded");
    let resolution = Resolution::Succeeded {
        external_id: Some("pay_1".into()),
        result_json: None,
    };
    assert!(
        store
            .resolve(&read, &resolution, &worker, true)
            .await
            .unwrap()
            .is_none()
    );
    let current = store.get(&ns, &key).await.unwrap().unwrap();
    assert_eq!(
        (current.status, current.attempt_count),
        (Status::Unknown, 2)
    );
    let settled = store
        .resolve(&current, &resolution, &worker, true)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(settled.status, Status::Succeeded);
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn terminal_rows_and_the_history_cannot_be_rewritten(pool: PgPool) {
    let store = PgStore::new(pool);
    let read = unknown(&store, "k").await;
    store
        .resolve(
            &read,
            &Resolution::FailedFinal {
                error_code: "card_declined".into(),
            },
            &Attribution::worker("w", "found_failed"),
            true,
        )
        .await
        .unwrap()
        .unwrap();
    for sql in [
        "UPDATE agent_operations SET status = 'succeeded'",
        "UPDATE agent_operations SET error_code = 'other'",
        "UPDATE operation_events SET reason = 'rewritten'",
    ] {
        assert!(
            sqlx::query(sql).execute(store.pool()).await.is_err(),
            "{sql}"
        );
    }
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn a_claimed_due_operation_is_hidden_from_other_claims(pool: PgPool) {
    let store = PgStore::new(pool);
    unknown(&store, "k").await;
    let hold = Duration::from_secs(60);
    assert_eq!(store.claim_due(10, hold).await.unwrap().len(), 1);
    assert!(store.claim_due(10, hold).await.unwrap().is_empty());
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn the_sweep_takes_only_ended_leases(pool: PgPool) {
    let store = PgStore::new(pool);
    store
        .insert_and_claim(&new_operation("live", Duration::from_secs(2)))
        .await
        .unwrap();
    store
        .insert_and_claim(&new_operation("ended", Duration::from_millis(200)))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(store.sweep_expired_leases(10, "w").await.unwrap(), 1);
    let ns = Namespace::parse("").unwrap();
    let status = |key: &'static str| {
        let store = store.clone();
        let ns = ns.clone();
        async move {
            store
                .get(&ns, &OperationKey::parse(key).unwrap())
                .await
                .unwrap()
                .unwrap()
                .status
        }
    };
    assert_eq!(status("live").await, Status::InProgress);
    assert_eq!(status("ended").await, Status::Unknown);
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn an_operation_under_review_is_never_claimed(pool: PgPool) {
    let store = PgStore::new(pool);
    let read = unknown(&store, "k").await;
    let escalated = store
        .resolve(
            &read,
            &Resolution::Escalate {
                reason: "no_provider_lookup".into(),
            },
            &Attribution::worker("w", "escalated"),
            false,
        )
        .await
        .unwrap()
        .unwrap();
    assert!(escalated.review_required_at.is_some());
    let claimed = store
        .claim(
            &read.namespace,
            &read.operation_key,
            Status::Unknown,
            1,
            Duration::from_secs(30),
            Uuid::new_v4(),
        )
        .await
        .unwrap();
    assert!(claimed.is_none());
    assert!(
        store
            .claim_due(10, Duration::from_secs(60))
            .await
            .unwrap()
            .is_empty()
    );
}
