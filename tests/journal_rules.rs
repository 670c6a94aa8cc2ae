//! The journal's rules over real gRPC and Postgres: concurrency, conflicts, fencing tokens,
//! lease expiry and retried reports.

#![allow(clippy::unwrap_used, missing_docs)]

mod common;

use std::time::Duration;

use common::*;
use opjournal::domain::lease::LeaseToken;
use opjournal::domain::model::{Namespace, OperationKey};
use opjournal::proto::{
    CompleteOperationRequest, Decision, FailOperationRequest, GetOperationRequest, Operation,
    OperationStatus, RenewLeaseRequest, ReportUnknownOutcomeRequest,
};
use sqlx::PgPool;
use tonic::Code;

const KEY: &str = "payment:order-900:intent-01";
const PAY: &str = r#"{"order_id":"900","amount_minor":1000,"currency":"EUR"}"#;
const PAY_OTHER: &str = r#"{"order_id":"900","amount_minor":2000,"currency":"EUR"}"#;

async fn get(app: &TestApp, key: &str) -> Operation {
    app.journal
        .clone()
        .get_operation(GetOperationRequest {
            namespace: String::new(),
            operation_key: key.into(),
        })
        .await
        .unwrap()
        .into_inner()
        .operation
        .unwrap()
}

async fn complete(
    app: &TestApp,
    token: &str,
    external_id: &str,
    result: &str,
) -> Result<Operation, tonic::Status> {
    app.journal
        .clone()
        .complete_operation(CompleteOperationRequest {
            lease_token: token.into(),
            external_id: external_id.into(),
            result_json: result.into(),
        })
        .await
        .map(|r| r.into_inner().operation.unwrap())
}

async fn fail(app: &TestApp, token: &str, code: &str) -> Result<Operation, tonic::Status> {
    app.journal
        .clone()
        .fail_operation(FailOperationRequest {
            lease_token: token.into(),
            error_code: code.into(),
        })
        .await
        .map(|r| r.into_inner().operation.unwrap())
}

async fn report_unknown(app: &TestApp, token: &str) -> Result<Operation, tonic::Status> {
    app.journal
        .clone()
        .report_unknown_outcome(ReportUnknownOutcomeRequest {
            lease_token: token.into(),
            error_code: "timeout".into(),
        })
        .await
        .map(|r| r.into_inner().operation.unwrap())
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn fifty_concurrent_begins_on_one_new_key_grant_exactly_one_lease(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    let mut tasks = Vec::new();
    for _ in 0..50 {
        let mut client = app.journal.clone();
        tasks.push(tokio::spawn(async move {
            client
                .begin_operation(opjournal::proto::BeginOperationRequest {
                    operation_key: KEY.into(),
                    action_type: "create_payment".into(),
                    payload_json: PAY.into(),
                    ..Default::default()
                })
                .await
        }));
    }
    let mut execute = 0;
    let mut in_progress = 0;
    for task in tasks {
        let response = task.await.unwrap().expect("no Begin may fail").into_inner();
        match decision(&response) {
            Decision::Execute => execute += 1,
            Decision::InProgress => {
                in_progress += 1;
                assert!(response.retry_after.is_some());
                assert!(response.lease_token.is_empty());
            }
            other => panic!("unexpected decision {other:?}"),
        }
    }
    assert_eq!((execute, in_progress), (1, 49));
    assert_eq!(app.rows_for(KEY).await, 1);
    assert_eq!(get(&app, KEY).await.attempt_count, 1);
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn a_racing_begin_with_another_payload_is_a_conflict_never_a_replay(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    let mut tasks = Vec::new();
    for i in 0..20 {
        let mut client = app.journal.clone();
        let payload = if i % 2 == 0 { PAY } else { PAY_OTHER };
        tasks.push(tokio::spawn(async move {
            let result = client
                .begin_operation(opjournal::proto::BeginOperationRequest {
                    operation_key: KEY.into(),
                    action_type: "create_payment".into(),
                    payload_json: payload.into(),
                    ..Default::default()
                })
                .await;
            (payload, result)
        }));
    }
    let mut winners = Vec::new();
    let mut outcomes = Vec::new();
    for task in tasks {
        let (payload, result) = task.await.unwrap();
        match result {
            Ok(r) if decision(r.get_ref()) == Decision::Execute => winners.push(payload),
            Ok(r) => outcomes.push((payload, Ok(decision(r.get_ref())))),
            Err(status) => outcomes.push((payload, Err((status.code(), reason(&status))))),
        }
    }
    assert_eq!(winners.len(), 1, "exactly one caller wins the insert");
    let winner = winners[0];
    for (payload, outcome) in outcomes {
        if payload == winner {
            assert_eq!(outcome, Ok(Decision::InProgress));
        } else {
            assert_eq!(
                outcome,
                Err((Code::AlreadyExists, "IDEMPOTENCY_KEY_REUSED".to_owned()))
            );
        }
    }
    assert_eq!(app.rows_for(KEY).await, 1);
}

/// Asserts a conflicting Begin (other payload, and same payload under another action type)
/// is refused and leaves the row exactly as it was.
async fn assert_conflicts_leave_the_row_alone(
    app: &TestApp,
    key: &str,
    payload: &str,
    other: &str,
) {
    let before = get(app, key).await;
    for (action, body) in [("create_payment", other), ("create_payment_dedup", payload)] {
        let err = app.begin(key, action, body).await.unwrap_err();
        assert_eq!(err.code(), Code::AlreadyExists);
        assert_eq!(reason(&err), "IDEMPOTENCY_KEY_REUSED");
    }
    let after = get(app, key).await;
    assert_eq!(before, after, "a conflicting Begin must not touch the row");
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn another_payload_is_a_conflict_in_every_status(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    // in_progress
    let begin = app
        .begin("k-in-progress", "create_payment", PAY)
        .await
        .unwrap();
    assert_eq!(decision(&begin), Decision::Execute);
    assert_conflicts_leave_the_row_alone(&app, "k-in-progress", PAY, PAY_OTHER).await;
    // unknown
    let begin = app.begin("k-unknown", "create_payment", PAY).await.unwrap();
    report_unknown(&app, &begin.lease_token).await.unwrap();
    assert_conflicts_leave_the_row_alone(&app, "k-unknown", PAY, PAY_OTHER).await;
    // succeeded
    let begin = app
        .begin("k-succeeded", "create_payment", PAY)
        .await
        .unwrap();
    complete(&app, &begin.lease_token, "pay_1", r#"{"id":"pay_1"}"#)
        .await
        .unwrap();
    assert_conflicts_leave_the_row_alone(&app, "k-succeeded", PAY, PAY_OTHER).await;
    // failed_final
    let begin = app.begin("k-failed", "create_payment", PAY).await.unwrap();
    fail(&app, &begin.lease_token, "card_declined")
        .await
        .unwrap();
    assert_conflicts_leave_the_row_alone(&app, "k-failed", PAY, PAY_OTHER).await;
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn duplicates_and_stale_tokens_leave_the_holders_lease_intact(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    let begin = app.begin(KEY, "create_payment", PAY).await.unwrap();
    let held = get(&app, KEY).await;

    // A duplicate Begin and a conflicting Begin change nothing.
    let duplicate = app.begin(KEY, "create_payment", PAY).await.unwrap();
    assert_eq!(decision(&duplicate), Decision::InProgress);
    assert_conflicts_leave_the_row_alone(&app, KEY, PAY, PAY_OTHER).await;
    assert_eq!(get(&app, KEY).await, held);

    // A bogus token is refused as malformed; a well-formed token of another lease as lost.
    let bogus = complete(&app, "not-a-token", "pay_x", "{}")
        .await
        .unwrap_err();
    assert_eq!(
        (bogus.code(), reason(&bogus).as_str()),
        (Code::InvalidArgument, "INVALID_LEASE_TOKEN")
    );
    assert_eq!(violated_field(&bogus), "lease_token");
    let stale = LeaseToken {
        namespace: Namespace::parse("").unwrap(),
        operation_key: OperationKey::parse(KEY).unwrap(),
        attempt: 1,
        lease_id: uuid::Uuid::new_v4(),
    }
    .encode();
    for result in [
        complete(&app, &stale, "pay_x", "{}").await,
        fail(&app, &stale, "card_declined").await,
        report_unknown(&app, &stale).await,
    ] {
        let err = result.unwrap_err();
        assert_eq!(
            (err.code(), reason(&err).as_str()),
            (Code::Aborted, "LEASE_LOST")
        );
    }
    assert_eq!(get(&app, KEY).await, held);

    // The holder's report succeeds; a later Begin replays it.
    let done = complete(&app, &begin.lease_token, "pay_1", r#"{"id":"pay_1"}"#)
        .await
        .unwrap();
    assert_eq!(op_status(&done), OperationStatus::Succeeded);
    let replay = app.begin(KEY, "create_payment", PAY).await.unwrap();
    assert_eq!(decision(&replay), Decision::Replay);
    assert_eq!(
        replay.operation.unwrap().result_json.as_deref(),
        Some(r#"{"id":"pay_1"}"#)
    );
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn an_expired_lease_without_a_report_requires_verification(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    let begin = app
        .begin_in("", KEY, "create_payment", PAY, 1)
        .await
        .unwrap();
    assert_eq!(decision(&begin), Decision::Execute);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let again = app.begin(KEY, "create_payment", PAY).await.unwrap();
    assert_eq!(decision(&again), Decision::VerificationRequired);
    assert_eq!(
        get(&app, KEY).await.attempt_count,
        1,
        "no new attempt was granted"
    );
    // Renewal after expiry is refused; the holder may still report what it saw.
    let renew = app
        .journal
        .clone()
        .renew_lease(RenewLeaseRequest {
            lease_token: begin.lease_token.clone(),
            lease_seconds: 30,
        })
        .await
        .unwrap_err();
    assert_eq!(reason(&renew), "LEASE_LOST");
    let late = complete(&app, &begin.lease_token, "pay_late", "")
        .await
        .unwrap();
    assert_eq!(op_status(&late), OperationStatus::Succeeded);
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn a_deduplicating_provider_allows_a_new_lease_with_the_same_key(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    let first = app
        .begin_in("", KEY, "create_payment_dedup", PAY, 1)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let second = app.begin(KEY, "create_payment_dedup", PAY).await.unwrap();
    assert_eq!(decision(&second), Decision::Execute);
    assert_eq!(second.operation.as_ref().unwrap().attempt_count, 2);
    // The first holder was fenced off.
    let err = complete(&app, &first.lease_token, "pay_1", "")
        .await
        .unwrap_err();
    assert_eq!(reason(&err), "LEASE_LOST");
    complete(&app, &second.lease_token, "pay_1", "")
        .await
        .unwrap();
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn a_retried_report_answers_the_same_record_and_a_different_one_is_refused(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    let begin = app.begin(KEY, "create_payment", PAY).await.unwrap();
    let first = complete(&app, &begin.lease_token, "pay_1", r#"{"b":2,"a":1}"#)
        .await
        .unwrap();
    let again = complete(&app, &begin.lease_token, "pay_1", r#"{ "a": 1, "b": 2 }"#)
        .await
        .unwrap();
    assert_eq!(
        first, again,
        "a retried report after its commit is answered with the same record"
    );
    assert_eq!(first.result_json.as_deref(), Some(r#"{"a":1,"b":2}"#));

    let other_id = complete(&app, &begin.lease_token, "pay_2", r#"{"a":1,"b":2}"#)
        .await
        .unwrap_err();
    assert_eq!(
        (other_id.code(), reason(&other_id).as_str()),
        (Code::FailedPrecondition, "OUTCOME_ALREADY_RECORDED")
    );
    let failed = fail(&app, &begin.lease_token, "card_declined")
        .await
        .unwrap_err();
    assert_eq!(reason(&failed), "OUTCOME_ALREADY_RECORDED");
    let unknown = report_unknown(&app, &begin.lease_token).await.unwrap_err();
    assert_eq!(reason(&unknown), "OUTCOME_ALREADY_RECORDED");
    assert_eq!(get(&app, KEY).await, first, "terminal states never change");
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn an_empty_result_is_still_a_result_and_replays(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    let begin = app.begin(KEY, "create_payment", PAY).await.unwrap();
    let done = complete(&app, &begin.lease_token, "", "").await.unwrap();
    assert_eq!(op_status(&done), OperationStatus::Succeeded);
    assert_eq!(done.result_json, None);
    for _ in 0..2 {
        let replay = app.begin(KEY, "create_payment", PAY).await.unwrap();
        assert_eq!(decision(&replay), Decision::Replay);
        assert!(replay.lease_token.is_empty());
    }
    assert_eq!(get(&app, KEY).await.attempt_count, 1);
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn leases_are_clamped_and_renewed_on_the_database_clock(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    let begin = app
        .begin_in("", KEY, "create_payment", PAY, -5)
        .await
        .unwrap();
    let op = begin.operation.unwrap();
    let granted = op.lease_until.unwrap().seconds - op.updated_at.unwrap().seconds;
    assert!(
        (0..=2).contains(&granted),
        "a negative lease gets the 1 s minimum, got {granted}"
    );
    let renewed = app
        .journal
        .clone()
        .renew_lease(RenewLeaseRequest {
            lease_token: begin.lease_token.clone(),
            lease_seconds: 120,
        })
        .await
        .unwrap()
        .into_inner()
        .operation
        .unwrap();
    let left = renewed.lease_until.unwrap().seconds - renewed.updated_at.unwrap().seconds;
    assert!((119..=121).contains(&left), "{left}");
    // The check constraint: an in_progress row always has a lease.
    let broken =
        sqlx::query("UPDATE agent_operations SET lease_until = NULL WHERE operation_key = $1")
            .bind(KEY)
            .execute(&app.pool)
            .await;
    assert!(broken.is_err());
}
