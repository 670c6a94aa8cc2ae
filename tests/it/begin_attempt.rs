//! An idempotent Begin: a Begin whose answer is lost and that its caller sends again with the
//! same attempt id gets the same lease back, while nobody else does and nobody does once the
//! lease has ended. And a holder whose lease ran out, reporting after the reconcile worker or
//! a reviewer settled the operation, is told who recorded the outcome. Real gRPC server,
//! Postgres and sandbox; the lost answer is lost for real, by a relay in front of the journal
//! that lets the Begin through and answers `UNAVAILABLE` in its place.

use crate::common;

use std::time::Duration;

use common::relay::Relay;
use common::*;
use opjournal::domain::lease::LeaseToken;
use opjournal::domain::model::{Namespace, OperationKey};
use opjournal::proto::operation_journal_client::OperationJournalClient;
use opjournal::proto::{
    BeginOperationRequest, BeginOperationResponse, CompleteOperationRequest, Decision,
    FailOperationRequest, OperationStatus, ResolveFailedFinal, ResolveOperationRequest,
    resolve_operation_request,
};
use opjournal_client::{Executed, Intent, JournalClient, ProviderOutcome};
use serde_json::json;
use sha2::{Digest as _, Sha256};
use sqlx::PgPool;
use tonic::Code;
use tonic::transport::Channel;
use tonic_types::StatusExt as _;

const KEY: &str = "payment:order-902:intent-01";
const PAY: &str = r#"{"order_id":"902","amount_minor":1000,"currency":"EUR"}"#;
const MINE: &str = "0f8fad5b-d9cb-469f-a165-70867728950e";
const OTHER: &str = "7c9e6679-7425-40de-944b-e07fc1f90ae7";

fn begin_request(key: &str, action: &str, attempt_id: &str) -> BeginOperationRequest {
    BeginOperationRequest {
        operation_key: key.into(),
        action_type: action.into(),
        payload_json: PAY.into(),
        attempt_id: attempt_id.into(),
        ..Default::default()
    }
}

async fn begin_on(
    journal: &OperationJournalClient<Channel>,
    key: &str,
    action: &str,
    attempt_id: &str,
) -> Result<BeginOperationResponse, tonic::Status> {
    journal
        .clone()
        .begin_operation(begin_request(key, action, attempt_id))
        .await
        .map(tonic::Response::into_inner)
}

async fn journal_via(relay: &Relay) -> OperationJournalClient<Channel> {
    let channel = Channel::from_shared(format!("http://{}", relay.addr))
        .unwrap()
        .connect()
        .await
        .unwrap();
    OperationJournalClient::new(channel)
}

/// The stored lease of `key`: (status, attempt_count, lease id, attempt id digest).
async fn lease_row(app: &TestApp, key: &str) -> (String, i32, uuid::Uuid, Option<String>) {
    sqlx::query_as(
        "SELECT status, attempt_count, lease_id, lease_attempt_sha256 FROM agent_operations
         WHERE namespace = 'default' AND operation_key = $1",
    )
    .bind(key)
    .fetch_one(app.pool())
    .await
    .unwrap()
}

/// The history of `key`: (from, to, attempt) per transition, oldest first.
async fn history(app: &TestApp, key: &str) -> Vec<(Option<String>, String, i32)> {
    sqlx::query_as(
        "SELECT from_status, to_status, attempt_count FROM operation_events
         WHERE namespace = 'default' AND operation_key = $1 ORDER BY event_id",
    )
    .bind(key)
    .fetch_all(app.pool())
    .await
    .unwrap()
}

/// The token of the lease the row holds now, built as the journal builds it.
fn token_of_row(key: &str, attempt: i32, lease_id: uuid::Uuid) -> String {
    LeaseToken {
        namespace: Namespace::parse("").unwrap(),
        operation_key: OperationKey::parse(key).unwrap(),
        attempt,
        lease_id,
    }
    .encode()
}

fn sha256_hex(text: &str) -> String {
    hex::encode(Sha256::digest(text.as_bytes()))
}

async fn complete(app: &TestApp, token: &str, external_id: &str) -> Result<(), tonic::Status> {
    app.journal
        .clone()
        .complete_operation(CompleteOperationRequest {
            lease_token: token.into(),
            external_id: external_id.into(),
            result_json: String::new(),
        })
        .await
        .map(drop)
}

/// Pays `PAY` at the sandbox under the provider key, the way a caller's closure would.
async fn pay_at_sandbox(sandbox: &str, provider_key: &str) -> serde_json::Value {
    opjournal::app::install_crypto_provider();
    reqwest::Client::new()
        .post(format!("{sandbox}/v1/payments"))
        .header("Idempotency-Key", provider_key)
        .body(PAY)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

fn metadata(status: &tonic::Status, name: &str) -> String {
    let info = status.get_details_error_info().unwrap();
    info.metadata.get(name).cloned().unwrap_or_default()
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn a_begin_whose_answer_is_lost_gets_the_same_lease_again_and_the_provider_is_called_once(
    pool: PgPool,
) {
    let app = TestApp::spawn(pool).await;
    let relay = Relay::start(app.addr).await;
    let journal = journal_via(&relay).await;

    relay.lose_next_begin_answer(KEY).await;
    let lost = begin_on(&journal, KEY, "create_payment", MINE)
        .await
        .unwrap_err();
    assert_eq!(lost.code(), Code::Unavailable);
    assert_eq!(relay.answers_lost(), 1);
    // The journal granted the lease before the answer was lost.
    let (status, attempt, lease_id, granted_to) = lease_row(&app, KEY).await;
    assert_eq!((status.as_str(), attempt), ("in_progress", 1));
    assert_eq!(
        granted_to,
        Some(sha256_hex(MINE)),
        "only the SHA-256 of the attempt id is kept"
    );

    // The caller's own retry, same attempt id: the same lease, not IN_PROGRESS against it.
    let again = begin_on(&journal, KEY, "create_payment", MINE)
        .await
        .unwrap();
    assert_eq!(decision(&again), Decision::Execute);
    assert_eq!(again.lease_token, token_of_row(KEY, 1, lease_id));
    assert_eq!(again.operation.as_ref().unwrap().attempt_count, 1);
    let third = begin_on(&journal, KEY, "create_payment", MINE)
        .await
        .unwrap();
    assert_eq!(third.lease_token, again.lease_token);
    assert_eq!(
        lease_row(&app, KEY).await,
        (status, 1, lease_id, Some(sha256_hex(MINE))),
        "a repeat writes nothing"
    );

    let (code, payment) = app.pay(KEY, PAY, None).await.unwrap();
    assert_eq!(code, 201);
    complete(&app, &again.lease_token, payment["id"].as_str().unwrap())
        .await
        .unwrap();
    let done = app.get(KEY).await;
    assert_eq!(
        (op_status(&done), done.attempt_count),
        (OperationStatus::Succeeded, 1)
    );
    assert_eq!(app.counts(KEY).effects, 1);
    assert_eq!(
        history(&app, KEY).await,
        [
            (None, "in_progress".into(), 1),
            (Some("in_progress".into()), "succeeded".into(), 1)
        ],
        "the repeated Begins are replays of one answer, not transitions"
    );
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn the_rust_client_repeats_a_lost_begin_and_executes_at_attempt_one(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    let relay = Relay::start(app.addr).await;
    let channel = Channel::from_shared(format!("http://{}", relay.addr))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let client = JournalClient::new(channel);
    relay.lose_next_begin_answer(KEY).await;

    let intent = Intent::new(KEY, "create_payment", serde_json::from_str(PAY).unwrap());
    let sandbox = app.sandbox_url.clone();
    let executed = client
        .execute(intent, |call| async move {
            let paid = pay_at_sandbox(&sandbox, &call.provider_key).await;
            ProviderOutcome::Succeeded {
                external_id: paid["id"].as_str().map(str::to_owned),
                result: Some(json!({"id": paid["id"]})),
            }
        })
        .await
        .unwrap();
    let Executed::Succeeded {
        operation,
        replayed: false,
    } = executed
    else {
        panic!("expected a first success, got {executed:?}");
    };
    assert_eq!(operation.attempt_count, 1);
    assert_eq!(relay.answers_lost(), 1, "the first Begin's answer was lost");
    assert_eq!(app.counts(KEY).effects, 1);
    assert_eq!(app.get(KEY).await.attempt_count, 1);
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn another_caller_still_gets_in_progress(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    let first = begin_on(&app.journal, KEY, "create_payment", MINE)
        .await
        .unwrap();
    assert_eq!(decision(&first), Decision::Execute);
    for other in [OTHER, ""] {
        let answer = begin_on(&app.journal, KEY, "create_payment", other)
            .await
            .unwrap();
        assert_eq!(
            decision(&answer),
            Decision::InProgress,
            "attempt id {other:?}"
        );
        assert!(answer.lease_token.is_empty());
        assert!(answer.retry_after.is_some());
    }
    // The same attempt id with another payload is no repeat: it is another request.
    let mut changed = begin_request(KEY, "create_payment", MINE);
    changed.payload_json = PAY.replace("1000", "2000");
    let conflict = app
        .journal
        .clone()
        .begin_operation(changed)
        .await
        .unwrap_err();
    assert_eq!(
        (conflict.code(), reason(&conflict).as_str()),
        (Code::AlreadyExists, "IDEMPOTENCY_KEY_REUSED")
    );
    // A Begin without an attempt id claims as before and clears the last one's digest.
    let dedup = "payment:order-902:intent-02";
    begin_on(&app.journal, dedup, "create_payment_dedup", MINE)
        .await
        .unwrap();
    app.clock.advance(Duration::from_secs(31));
    let claimed = begin_on(&app.journal, dedup, "create_payment_dedup", "")
        .await
        .unwrap();
    assert_eq!(decision(&claimed), Decision::Execute);
    let (_, attempt, _, granted_to) = lease_row(&app, dedup).await;
    assert_eq!((attempt, granted_to), (2, None));
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn a_repeat_after_the_lease_ended_does_not_get_the_lease_back(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    let first = begin_on(&app.journal, KEY, "create_payment", MINE)
        .await
        .unwrap();
    app.clock.advance(Duration::from_secs(31));
    let late = begin_on(&app.journal, KEY, "create_payment", MINE)
        .await
        .unwrap();
    assert_eq!(decision(&late), Decision::VerificationRequired);
    assert!(late.lease_token.is_empty());

    // With a provider that deduplicates, the repeat is a new claim: a new lease, attempt 2,
    // recorded under the attempt id; the ended lease stays fenced off.
    let dedup = "payment:order-902:intent-03";
    let first_dedup = begin_on(&app.journal, dedup, "create_payment_dedup", MINE)
        .await
        .unwrap();
    app.clock.advance(Duration::from_secs(31));
    let reclaimed = begin_on(&app.journal, dedup, "create_payment_dedup", MINE)
        .await
        .unwrap();
    assert_eq!(decision(&reclaimed), Decision::Execute);
    assert_ne!(reclaimed.lease_token, first_dedup.lease_token);
    assert_eq!(reclaimed.operation.as_ref().unwrap().attempt_count, 2);
    let stale = complete(&app, &first_dedup.lease_token, "pay_1")
        .await
        .unwrap_err();
    assert_eq!(reason(&stale), "LEASE_LOST");
    let (_, attempt, lease_id, granted_to) = lease_row(&app, dedup).await;
    assert_eq!(
        reclaimed.lease_token,
        token_of_row(dedup, attempt, lease_id)
    );
    assert_eq!(granted_to, Some(sha256_hex(MINE)));
    // Nothing was paid: the first holder's token was never used at the provider.
    assert_eq!(app.counts(KEY).effects, 0);
    assert!(!first.lease_token.is_empty());
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn a_malformed_attempt_id_is_refused_and_nothing_is_written(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    for bad in [
        "short",
        "0f8fad5b d9cb 469f a165 70867728950e",
        "0f8fad5b/d9cb/469f/a165/70867728950e",
        &"a".repeat(65),
    ] {
        let refused = begin_on(&app.journal, KEY, "create_payment", bad)
            .await
            .unwrap_err();
        assert_eq!(
            (refused.code(), reason(&refused).as_str()),
            (Code::InvalidArgument, "INVALID_ATTEMPT_ID"),
            "{bad}"
        );
        assert_eq!(violated_field(&refused), "attempt_id");
        assert!(!refused.message().contains(bad));
    }
    assert_eq!(app.rows_for(KEY).await, 0);
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn a_guessable_attempt_id_is_refused_saying_why_and_nothing_is_written(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    for guessable in [
        "0000000000000000",
        "00000000-0000-0000-0000-000000000000",
        "0123456789abcdef0123456789abcdef",
        "test-attempt-id-0001",
    ] {
        let refused = begin_on(&app.journal, KEY, "create_payment", guessable)
            .await
            .unwrap_err();
        assert_eq!(
            (refused.code(), reason(&refused).as_str()),
            (Code::InvalidArgument, "INVALID_ATTEMPT_ID"),
            "{guessable}"
        );
        let bad = refused.get_details_bad_request().unwrap();
        assert_eq!(bad.field_violations[0].field, "attempt_id");
        let why = &bad.field_violations[0].description;
        assert!(
            why.contains("does not look random") && why.contains("64 bits"),
            "{why}"
        );
        assert!(!refused.message().contains(guessable));
        assert!(!why.contains(guessable));
    }
    assert_eq!(app.rows_for(KEY).await, 0);
    // The ids the clients draw pass: a UUID v4 and 128 random bits in hex.
    let uuid = uuid::Uuid::new_v4();
    let first = begin_on(&app.journal, KEY, "create_payment", &uuid.to_string())
        .await
        .unwrap();
    assert_eq!(first.decision, Decision::Execute as i32);
    let again = begin_on(
        &app.journal,
        KEY,
        "create_payment",
        &uuid.simple().to_string(),
    )
    .await
    .unwrap();
    assert_eq!(again.decision, Decision::InProgress as i32);
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn a_late_holder_is_told_who_recorded_the_outcome_not_that_its_lease_did(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    // The holder pays, its lease runs out, and the reconcile worker settles the operation.
    let begun = begin_on(&app.journal, KEY, "create_payment", MINE)
        .await
        .unwrap();
    let (code, _) = app.pay(KEY, PAY, None).await.unwrap();
    assert_eq!(code, 201);
    app.clock.advance(Duration::from_secs(31));
    app.reconcile("", KEY).await.unwrap();
    assert_eq!(op_status(&app.get(KEY).await), OperationStatus::Succeeded);
    let late = app
        .journal
        .clone()
        .fail_operation(FailOperationRequest {
            lease_token: begun.lease_token.clone(),
            error_code: "card_declined".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(
        (late.code(), reason(&late).as_str()),
        (Code::FailedPrecondition, "OUTCOME_ALREADY_RECORDED")
    );
    assert_eq!(metadata(&late, "recorded_by"), "worker");
    assert_eq!(metadata(&late, "status"), "succeeded");
    assert!(
        !late.message().contains("this lease already recorded"),
        "{}",
        late.message()
    );
    assert!(
        late.message().contains("reconcile worker"),
        "{}",
        late.message()
    );

    // A reviewer settles another one after its lease ran out.
    let reviewed = "payment:order-902:intent-04";
    let begun = begin_on(&app.journal, reviewed, "create_payment", OTHER)
        .await
        .unwrap();
    app.clock.advance(Duration::from_secs(31));
    // The sweep marks the ended lease unknown; then it waits for a person.
    assert_eq!(
        app.parts
            .store
            .sweep_expired_leases(10, "sweeper")
            .await
            .unwrap(),
        1
    );
    app.reconciler
        .clone()
        .resolve_operation(ResolveOperationRequest {
            operation_key: reviewed.into(),
            expected_attempt_count: 1,
            reviewer: "ops".into(),
            reason: "the provider's dashboard shows no payment".into(),
            resolution: Some(resolve_operation_request::Resolution::FailedFinal(
                ResolveFailedFinal {
                    error_code: "not_charged".into(),
                },
            )),
            ..Default::default()
        })
        .await
        .unwrap();
    let late = complete(&app, &begun.lease_token, "pay_9")
        .await
        .unwrap_err();
    assert_eq!(reason(&late), "OUTCOME_ALREADY_RECORDED");
    assert_eq!(metadata(&late, "recorded_by"), "reviewer");
    assert_eq!(metadata(&late, "status"), "failed_final");
    assert!(late.message().contains("reviewer"), "{}", late.message());

    // The holder's own earlier report still reads as its own.
    let own = "payment:order-902:intent-05";
    let begun = begin_on(&app.journal, own, "create_payment", "")
        .await
        .unwrap();
    complete(&app, &begun.lease_token, "pay_5").await.unwrap();
    let contradicting = app
        .journal
        .clone()
        .fail_operation(FailOperationRequest {
            lease_token: begun.lease_token,
            error_code: "card_declined".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(metadata(&contradicting, "recorded_by"), "client");
    assert!(
        contradicting
            .message()
            .contains("this lease already recorded")
    );
}

/// A Rust client whose calls go through `relay`.
async fn client_via(relay: &Relay) -> JournalClient {
    let channel = Channel::from_shared(format!("http://{}", relay.addr))
        .unwrap()
        .connect()
        .await
        .unwrap();
    JournalClient::new(channel)
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn a_begin_answer_that_arrives_after_its_lease_ended_calls_nothing(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    let relay = Relay::start(app.addr).await;
    let client = client_via(&relay).await;
    // The journal grants a one-second lease; its answer reaches the client 2.5 s later.
    relay
        .delay_next_begin_answer(KEY, Duration::from_millis(2500))
        .await;
    let intent = Intent::new(
        KEY,
        "create_payment_dedup",
        serde_json::from_str(PAY).unwrap(),
    )
    .with_lease(Duration::from_secs(1));
    let called = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let seen = called.clone();
    let refused = client
        .execute(intent.clone(), |_| async move {
            seen.store(true, std::sync::atomic::Ordering::SeqCst);
            ProviderOutcome::Uncertain { error_code: None }
        })
        .await
        .unwrap_err();
    assert_eq!(relay.answers_delayed_for(KEY), 1);
    assert_eq!(
        (refused.code, refused.reason.as_str()),
        (Code::Aborted, "LEASE_EXPIRED_BEFORE_CALL")
    );
    assert!(!called.load(std::sync::atomic::Ordering::SeqCst));
    // Nothing was reported: the row still holds the ended lease of attempt 1.
    let (status, attempt, _, _) = lease_row(&app, KEY).await;
    assert_eq!((status.as_str(), attempt), ("in_progress", 1));
    assert_eq!(app.counts(KEY).requests, 0);

    // Begun again (same key), the intent runs once, under a new lease.
    let sandbox = app.sandbox_url.clone();
    let executed = client
        .execute(intent, |call| async move {
            let paid = pay_at_sandbox(&sandbox, &call.provider_key).await;
            ProviderOutcome::Succeeded {
                external_id: paid["id"].as_str().map(str::to_owned),
                result: None,
            }
        })
        .await
        .unwrap();
    assert!(
        matches!(executed, Executed::Succeeded { replayed: false, ref operation } if operation.attempt_count == 2),
        "{executed:?}"
    );
    let counts = app.counts(KEY);
    assert_eq!((counts.requests, counts.effects), (1, 1));
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn a_provider_call_is_cut_off_when_its_unrenewed_lease_ends(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    let relay = Relay::start(app.addr).await;
    let client = client_via(&relay).await;
    // The journal cannot be reached for renewals while the call runs.
    relay.refuse_renewals(true);
    let intent = Intent::new(KEY, "create_payment", serde_json::from_str(PAY).unwrap())
        .with_lease(Duration::from_secs(2));
    let executed = tokio::time::timeout(
        Duration::from_secs(20),
        client.execute(intent, |call| async move {
            let left = call.lease_remaining();
            assert!(
                !left.is_zero() && left <= Duration::from_secs(2),
                "{left:?}"
            );
            // A provider call that never answers.
            std::future::pending::<()>().await;
            ProviderOutcome::Uncertain { error_code: None }
        }),
    )
    .await
    .expect("the call is cut off at the lease's end")
    .unwrap();
    let Executed::VerificationRequired { operation } = executed else {
        panic!("expected verification required, got {executed:?}");
    };
    assert_eq!(operation.error_code.as_deref(), Some("lease_expired"));
    assert_eq!(op_status(&operation), OperationStatus::Unknown);
    assert_eq!(app.counts(KEY).requests, 0);
}
