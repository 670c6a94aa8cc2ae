//! The journal's rules over real gRPC and Postgres: concurrency, conflicts, fencing tokens,
//! lease expiry and retried reports. The concurrent Begins run on the embedded SQLite journal
//! as well.

use crate::common;

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
    fifty_concurrent_begins(&TestApp::spawn(pool).await).await;
}

#[tokio::test]
async fn fifty_concurrent_begins_on_the_embedded_journal_grant_exactly_one_lease() {
    fifty_concurrent_begins(&TestApp::spawn_sqlite().await).await;
}

/// 50 Begins of one new key at once over gRPC: one EXECUTE, 49 IN_PROGRESS, one row.
async fn fifty_concurrent_begins(app: &TestApp) {
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
    assert_eq!(get(app, KEY).await.attempt_count, 1);
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
    app.clock.advance(Duration::from_millis(1500));
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
    app.clock.advance(Duration::from_millis(1500));
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
            .execute(app.pool())
            .await;
    assert!(broken.is_err());
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn a_token_reports_once_and_a_contradicting_report_is_refused(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    let begin = app.begin(KEY, "create_payment", PAY).await.unwrap();
    report_unknown(&app, &begin.lease_token).await.unwrap();
    // Repeating the same report is fine; contradicting it is not.
    report_unknown(&app, &begin.lease_token).await.unwrap();
    for err in [
        fail(&app, &begin.lease_token, "card_declined")
            .await
            .unwrap_err(),
        complete(&app, &begin.lease_token, "pay_1", "")
            .await
            .unwrap_err(),
    ] {
        assert_eq!(
            (err.code(), reason(&err).as_str()),
            (Code::FailedPrecondition, "OUTCOME_ALREADY_RECORDED")
        );
    }
    assert_eq!(op_status(&get(&app, KEY).await), OperationStatus::Unknown);
    // A retried Complete with another result is not the same outcome either.
    let begin = app.begin("k2", "create_payment", PAY).await.unwrap();
    complete(&app, &begin.lease_token, "pay_2", r#"{"a":1}"#)
        .await
        .unwrap();
    let err = complete(&app, &begin.lease_token, "pay_2", r#"{"a":2}"#)
        .await
        .unwrap_err();
    assert_eq!(reason(&err), "OUTCOME_ALREADY_RECORDED");
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn a_holder_reports_after_the_sweep_with_its_own_error_code(pool: PgPool) {
    let app = TestApp::spawn_with(pool, opjournal_sandbox::SandboxConfig::default(), 3600).await;
    let begin = app
        .begin_in("", KEY, "create_payment", PAY, 1)
        .await
        .unwrap();
    app.clock.advance(Duration::from_millis(1300));
    assert_eq!(app.worker("w").tick().await.unwrap().swept, 1);
    let op = get(&app, KEY).await;
    assert_eq!(op.error_code.as_deref(), Some("lease_expired"));
    let reported = app
        .journal
        .clone()
        .report_unknown_outcome(ReportUnknownOutcomeRequest {
            lease_token: begin.lease_token.clone(),
            error_code: "provider_timeout".into(),
        })
        .await
        .unwrap()
        .into_inner()
        .operation
        .unwrap();
    assert_eq!(reported.error_code.as_deref(), Some("provider_timeout"));
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn a_late_success_after_a_release_is_kept_and_nothing_runs_again(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    // The lease ends unreported; the provider has nothing yet; the grace window is 0 here.
    let begin = app
        .begin_in("", KEY, "create_payment", PAY, 1)
        .await
        .unwrap();
    app.clock.advance(Duration::from_millis(1300));
    let stats = app.worker("w").tick().await.unwrap();
    assert_eq!(stats.released, 1);
    assert_eq!(op_status(&get(&app, KEY).await), OperationStatus::Pending);
    // The holder's very slow call did go through after all; its report is accepted because
    // no later attempt exists.
    let done = complete(&app, &begin.lease_token, "pay_late", "")
        .await
        .unwrap();
    assert_eq!(op_status(&done), OperationStatus::Succeeded);
    let replay = app.begin(KEY, "create_payment", PAY).await.unwrap();
    assert_eq!(decision(&replay), Decision::Replay);
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn malformed_report_fields_and_references_are_invalid_arguments(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    let begin = app.begin(KEY, "create_payment", PAY).await.unwrap();
    let cases = [
        (
            complete(&app, &begin.lease_token, "pay\u{0}1", "").await,
            "external_id",
        ),
        (
            complete(&app, &begin.lease_token, &"x".repeat(201), "").await,
            "external_id",
        ),
        (
            fail(&app, &begin.lease_token, "card declined!").await,
            "error_code",
        ),
        (fail(&app, &begin.lease_token, "").await, "error_code"),
    ];
    for (result, field) in cases {
        let err = result.unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{field}");
        assert_eq!(violated_field(&err), field);
    }
    for references in [
        vec![("order_id".to_owned(), "8\u{0}17".to_owned())],
        vec![("bad key".to_owned(), "817".to_owned())],
        (0..17).map(|i| (format!("r{i}"), "v".to_owned())).collect(),
    ] {
        let err = app
            .journal
            .clone()
            .begin_operation(opjournal::proto::BeginOperationRequest {
                operation_key: "k-refs".into(),
                action_type: "create_payment".into(),
                payload_json: PAY.into(),
                references: references.into_iter().collect(),
                ..Default::default()
            })
            .await
            .unwrap_err();
        assert_eq!(
            (err.code(), reason(&err).as_str()),
            (Code::InvalidArgument, "INVALID_REFERENCES")
        );
    }
    for key in ["zero\u{200B}width", "bidi\u{202E}", "\u{FEFF}bom"] {
        let err = app.begin(key, "create_payment", PAY).await.unwrap_err();
        assert_eq!(reason(&err), "INVALID_OPERATION_KEY");
    }
    let err = app
        .journal
        .clone()
        .list_operations(opjournal::proto::ListOperationsRequest {
            page_size: -1,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(reason(&err), "INVALID_PAGE_SIZE");
    // A forged page token naming an impossible key is refused, not an internal error.
    use base64::Engine as _;
    let forged = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .encode(r#"{"c":0,"k":"a\u0000b","f":"0000000000000000"}"#);
    let err = app
        .journal
        .clone()
        .list_operations(opjournal::proto::ListOperationsRequest {
            page_token: forged,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(
        (err.code(), reason(&err).as_str()),
        (Code::InvalidArgument, "INVALID_PAGE_TOKEN")
    );
    assert_eq!(app.rows_for("k-refs").await, 0);
    // The holder's lease was untouched by all of it.
    complete(&app, &begin.lease_token, "pay_1", "")
        .await
        .unwrap();
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn tenants_sharing_a_provider_never_see_each_others_effects(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    // Tenant "default" pays with the key; tenant-b registers the same key for another amount.
    let a = app
        .begin(PAYMENT_KEY, "create_payment", PAY_817)
        .await
        .unwrap();
    assert_eq!(a.operation.as_ref().unwrap().provider_key, PAYMENT_KEY);
    let (status, payment) = app.pay(PAYMENT_KEY, PAY_817, None).await.unwrap();
    assert_eq!(status, 201);
    complete(&app, &a.lease_token, payment["id"].as_str().unwrap(), "")
        .await
        .unwrap();
    let b = app
        .begin_in(
            "tenant-b",
            PAYMENT_KEY,
            "create_payment",
            PAY_817_OTHER_AMOUNT,
            0,
        )
        .await
        .unwrap();
    assert_eq!(decision(&b), Decision::Execute);
    let provider_key = b.operation.as_ref().unwrap().provider_key.clone();
    assert_eq!(provider_key, format!("tenant-b/{PAYMENT_KEY}"));
    // tenant-b's call never reached the provider; reconciling must not find tenant A's payment.
    report_unknown(&app, &b.lease_token).await.unwrap();
    let reconciled = app.reconcile("tenant-b", PAYMENT_KEY).await.unwrap();
    let op = reconciled.operation.unwrap();
    assert_ne!(op_status(&op), OperationStatus::Succeeded);
    assert_eq!(op.external_id, None);
    assert_eq!(app.counts(&provider_key).lookups, 1);
    // Its own payment goes through at the provider under its own key.
    let again = app
        .begin_in(
            "tenant-b",
            PAYMENT_KEY,
            "create_payment",
            PAY_817_OTHER_AMOUNT,
            0,
        )
        .await
        .unwrap();
    assert_eq!(decision(&again), Decision::Execute);
    let (status, _) = app
        .pay(&provider_key, PAY_817_OTHER_AMOUNT, None)
        .await
        .unwrap();
    assert_eq!(status, 201);
    assert_eq!(app.counts(PAYMENT_KEY).effects, 1);
    assert_eq!(app.counts(&provider_key).effects, 1);
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn a_key_the_lookup_url_cannot_address_is_never_taken_as_absent(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    for key in [".", ".."] {
        let begin = app.begin(key, "create_payment", PAY).await.unwrap();
        report_unknown(&app, &begin.lease_token).await.unwrap();
        let reconciled = app.reconcile("", key).await.unwrap();
        assert_eq!(
            op_status(reconciled.operation.as_ref().unwrap()),
            OperationStatus::Unknown,
            "{key}"
        );
        assert_eq!(
            opjournal::proto::ObservationOutcome::try_from(reconciled.observation.unwrap().outcome)
                .unwrap(),
            opjournal::proto::ObservationOutcome::LookupFailed
        );
    }
}
