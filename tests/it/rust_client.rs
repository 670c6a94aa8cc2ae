//! The typed Rust client and its `execute` helper (the article's `executeOperation`), over
//! the real gRPC server, Postgres and the HTTP sandbox provider. The proof is the count of
//! effects at the provider.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::*;
use opjournal::proto::OperationStatus;
use opjournal_client::{
    Begun, ErrorReason, Executed, Intent, JournalClient, Protected, ProviderCall, ProviderError,
    ProviderOutcome, ProviderSuccess,
};
use serde_json::json;
use sqlx::PgPool;
use tonic::Code;

fn client(app: &TestApp) -> JournalClient {
    JournalClient::new(app.channel.clone())
}

fn payment(key: &str, amount_minor: u64) -> Intent {
    Intent::new(
        key,
        "create_payment",
        json!({"amount_minor": amount_minor, "currency": "EUR", "order_id": "817"}),
    )
    .with_reference("order_id", "817")
}

/// Charges through the sandbox and classifies the answer the way the article asks: only a
/// confirmed decline is a rejection; a timeout or a 5xx is uncertain.
async fn charge(
    sandbox_url: &str,
    call: &ProviderCall,
    amount_minor: u64,
    fault: Option<&str>,
) -> ProviderOutcome {
    opjournal::app::install_crypto_provider();
    let http = reqwest::Client::builder()
        .timeout(Duration::from_millis(500))
        .build()
        .unwrap();
    let mut request = http
        .post(format!("{sandbox_url}/v1/payments"))
        .header("Idempotency-Key", &call.provider_key)
        .json(&json!({"amount_minor": amount_minor, "currency": "EUR", "order_id": "817"}));
    if let Some(fault) = fault {
        request = request.header("X-Sandbox-Fault", fault);
    }
    let Ok(response) = request.send().await else {
        return ProviderOutcome::Uncertain {
            error_code: Some("timeout".into()),
        };
    };
    match response.status().as_u16() {
        200 | 201 => {
            let body: serde_json::Value = response.json().await.unwrap();
            ProviderOutcome::Succeeded {
                external_id: body["id"].as_str().map(str::to_owned),
                result: Some(body),
            }
        }
        402 => ProviderOutcome::Rejected {
            error_code: "card_declined".into(),
        },
        _ => ProviderOutcome::Uncertain {
            error_code: Some("provider_error".into()),
        },
    }
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn execute_calls_once_then_replays_without_calling(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    let client = client(&app);
    let calls = Arc::new(AtomicUsize::new(0));
    let run = || {
        let calls = calls.clone();
        let url = app.sandbox_url.clone();
        client.execute(payment(PAYMENT_KEY, 1000), move |call| async move {
            calls.fetch_add(1, Ordering::SeqCst);
            charge(&url, &call, 1000, None).await
        })
    };

    let first = run().await.unwrap();
    let Executed::Succeeded {
        operation,
        replayed: false,
    } = first
    else {
        panic!("expected a fresh success, got {first:?}");
    };
    assert!(
        operation
            .external_id
            .as_deref()
            .unwrap()
            .starts_with("pay_")
    );

    let second = run().await.unwrap();
    let Executed::Succeeded {
        operation: replayed,
        replayed: true,
    } = second
    else {
        panic!("expected a replay, got {second:?}");
    };
    assert_eq!(replayed.external_id, operation.external_id);
    assert_eq!(replayed.result_json, operation.result_json);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert_eq!(app.counts(PAYMENT_KEY).effects, 1);
    assert_eq!(app.counts(PAYMENT_KEY).requests, 1);
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn a_lost_answer_becomes_verification_required_and_is_never_sent_again(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    let client = client(&app);
    let calls = Arc::new(AtomicUsize::new(0));
    let run = |fault: Option<&'static str>| {
        let calls = calls.clone();
        let url = app.sandbox_url.clone();
        client.execute(payment(PAYMENT_KEY, 1000), move |call| async move {
            calls.fetch_add(1, Ordering::SeqCst);
            charge(&url, &call, 1000, fault).await
        })
    };

    let first = run(Some("commit-then-timeout")).await.unwrap();
    let Executed::VerificationRequired { operation } = first else {
        panic!("expected verification required, got {first:?}");
    };
    assert_eq!(operation.status, OperationStatus::Unknown as i32);
    assert_eq!(operation.error_code.as_deref(), Some("timeout"));

    // The retry does not call: the journal says verify first.
    let again = run(None).await.unwrap();
    assert!(
        matches!(again, Executed::VerificationRequired { .. }),
        "{again:?}"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert_eq!(app.counts(PAYMENT_KEY).requests, 1);

    // Reconcile finds the effect; now the same execute replays it.
    let reconciled = client.reconcile("", PAYMENT_KEY).await.unwrap();
    assert_eq!(
        reconciled.operation.unwrap().status,
        OperationStatus::Succeeded as i32
    );
    let replay = run(None).await.unwrap();
    assert!(
        matches!(replay, Executed::Succeeded { replayed: true, .. }),
        "{replay:?}"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert_eq!(app.counts(PAYMENT_KEY).effects, 1);
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn a_confirmed_decline_is_final_and_replays_as_failed(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    let client = client(&app);
    let url = app.sandbox_url.clone();
    let first = client
        .execute(payment(PAYMENT_KEY, 1000), |call| async move {
            charge(&url, &call, 1000, Some("reject")).await
        })
        .await
        .unwrap();
    let Executed::FailedFinal {
        operation,
        replayed: false,
    } = first
    else {
        panic!("expected failed_final, got {first:?}");
    };
    assert_eq!(operation.error_code.as_deref(), Some("card_declined"));

    let second = client
        .execute(payment(PAYMENT_KEY, 1000), |_| async {
            panic!("a replay must not call the provider")
        })
        .await
        .unwrap();
    assert!(
        matches!(second, Executed::FailedFinal { replayed: true, .. }),
        "{second:?}"
    );
    assert_eq!(app.counts(PAYMENT_KEY).effects, 0);
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn another_payload_under_the_key_is_a_typed_conflict_without_a_call(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    let client = client(&app);
    let url = app.sandbox_url.clone();
    client
        .execute(payment(PAYMENT_KEY, 1000), |call| async move {
            charge(&url, &call, 1000, None).await
        })
        .await
        .unwrap();

    let error = client
        .execute(payment(PAYMENT_KEY, 9999), |_| async {
            panic!("a conflict must not call the provider")
        })
        .await
        .unwrap_err();
    assert_eq!(error.code, Code::AlreadyExists);
    assert_eq!(error.reason, ErrorReason::IdempotencyKeyReused);
    assert_eq!(app.counts(PAYMENT_KEY).requests, 1);
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn a_stale_holder_gets_a_typed_lease_lost(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    let client = client(&app);
    let intent = Intent::new(
        PAYMENT_KEY,
        "create_payment_dedup",
        json!({"amount_minor": 1000, "currency": "EUR"}),
    )
    .with_lease(Duration::from_secs(1));
    let Begun::Execute { lease: stale, .. } = client.begin(&intent).await.unwrap() else {
        panic!("expected execute");
    };
    app.clock.advance(Duration::from_millis(1500));
    // The provider deduplicates by key, so the action may be claimed again: attempt 2.
    let Begun::Execute { operation, .. } = client.begin(&intent).await.unwrap() else {
        panic!("expected a second lease");
    };
    assert_eq!(operation.attempt_count, 2);

    let error = client
        .complete(&stale, Some("pay_stale"), None)
        .await
        .unwrap_err();
    assert_eq!(error.code, Code::Aborted);
    assert_eq!(error.reason, ErrorReason::LeaseLost);
    let row = app.get(PAYMENT_KEY).await;
    assert_eq!(row.status, OperationStatus::InProgress as i32);
    assert_eq!(row.external_id, None);
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn the_lease_is_renewed_while_a_long_call_runs(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    let client = client(&app);
    let intent = payment(PAYMENT_KEY, 1000).with_lease(Duration::from_secs(3));
    let url = app.sandbox_url.clone();
    let (started_tx, started_rx) = tokio::sync::oneshot::channel();
    let (release_tx, release_rx) = tokio::sync::oneshot::channel::<()>();
    let long_call = client.execute(intent.clone(), |call| async move {
        started_tx.send(()).unwrap();
        release_rx.await.unwrap();
        charge(&url, &call, 1000, None).await
    });
    let observer = async {
        started_rx.await.unwrap();
        // Twice the lease length: without renewal the lease would have ended long ago.
        tokio::time::sleep(Duration::from_secs(6)).await;
        let seen = client.begin(&intent).await.unwrap();
        release_tx.send(()).unwrap();
        seen
    };
    let (executed, seen) = tokio::join!(long_call, observer);
    assert!(matches!(seen, Begun::InProgress { .. }), "{seen:?}");
    assert!(
        matches!(
            executed.unwrap(),
            Executed::Succeeded {
                replayed: false,
                ..
            }
        ),
        "the holder could still report"
    );
    assert_eq!(app.counts(PAYMENT_KEY).effects, 1);
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn a_panicking_call_is_reported_unknown(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    let client = client(&app);
    let outcome = tokio::spawn(async move {
        client
            .execute(payment(PAYMENT_KEY, 1000), |_| async {
                panic!("the provider SDK blew up")
            })
            .await
    })
    .await;
    assert!(outcome.unwrap_err().is_panic());
    let row = app.get(PAYMENT_KEY).await;
    assert_eq!(row.status, OperationStatus::Unknown as i32);
    assert_eq!(row.error_code.as_deref(), Some("client_panic"));
}

/// The arguments of a protected charge: the key comes from the order and the intent number,
/// both set by the orchestrator's code.
#[derive(Clone, serde::Serialize)]
struct Charge {
    order_id: String,
    intent: u32,
    amount_minor: u64,
}

fn charge_key(args: &Charge) -> String {
    format!("payment:order-{}:intent-{:02}", args.order_id, args.intent)
}

/// A fallible provider function in the wrapper's shape: any error is left to the
/// classifier; only a decline is said to be a confirmed rejection.
async fn charge_fallibly(
    sandbox_url: String,
    fault: Option<&'static str>,
    args: Charge,
    call: ProviderCall,
) -> Result<ProviderSuccess, ProviderError> {
    opjournal::app::install_crypto_provider();
    let mut request = reqwest::Client::new()
        .post(format!("{sandbox_url}/v1/payments"))
        .header("Idempotency-Key", &call.provider_key)
        .json(&json!({"amount_minor": args.amount_minor, "currency": "EUR", "order_id": args.order_id}));
    if let Some(fault) = fault {
        request = request.header("X-Sandbox-Fault", fault);
    }
    let response = tokio::time::timeout(Duration::from_millis(500), request.send()).await??;
    match response.status() {
        status if status.is_success() => {
            let body: serde_json::Value = response.json().await?;
            let id = body["id"].as_str().unwrap_or_default().to_owned();
            Ok(ProviderSuccess::new(id).with_result(body))
        }
        reqwest::StatusCode::PAYMENT_REQUIRED => Err(ProviderError::rejected("card_declined")),
        status => Err(ProviderError::Status(status)),
    }
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn a_protected_function_runs_once_and_then_replays_its_stored_result(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    let calls = Arc::new(AtomicUsize::new(0));
    let url = app.sandbox_url.clone();
    let counted = calls.clone();
    let pay = Protected::with_args_as_payload(client(&app), "create_payment", charge_key, {
        move |args: Charge, call: ProviderCall| {
            counted.fetch_add(1, Ordering::SeqCst);
            charge_fallibly(url.clone(), None, args, call)
        }
    });
    let args = Charge {
        order_id: "817".into(),
        intent: 1,
        amount_minor: 1000,
    };

    let first = pay.call(args.clone()).await.unwrap();
    let Executed::Succeeded {
        operation,
        replayed: false,
    } = &first
    else {
        panic!("expected a fresh success, got {first:?}");
    };
    assert_eq!(operation.operation_key, PAYMENT_KEY);
    let second = pay.clone().call(args.clone()).await.unwrap();
    assert!(
        matches!(second, Executed::Succeeded { replayed: true, .. }),
        "{second:?}"
    );
    assert_eq!(second.result(), first.result());
    assert_eq!(second.to_json()["outcome"], "succeeded");
    assert_eq!(second.to_json()["replayed"], true);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert_eq!(app.counts(PAYMENT_KEY).requests, 1);
    assert_eq!(app.counts(PAYMENT_KEY).effects, 1);

    // The arguments are the payload: the same key with another amount is a conflict, and
    // the function is not called.
    let error = pay
        .call(Charge {
            amount_minor: 9999,
            ..args
        })
        .await
        .unwrap_err();
    assert_eq!(error.reason, ErrorReason::IdempotencyKeyReused);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert_eq!(app.counts(PAYMENT_KEY).requests, 1);
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn the_wrappers_default_classifier_makes_a_timeout_unknown_and_only_a_decline_final(
    pool: PgPool,
) {
    let app = TestApp::spawn(pool).await;
    let protect = |fault: &'static str| {
        let url = app.sandbox_url.clone();
        Protected::new(
            client(&app),
            "create_payment",
            charge_key,
            // A declared subset of the arguments is the payload.
            |args: &Charge| json!({"order_id": args.order_id, "amount_minor": args.amount_minor}),
            move |args, call| charge_fallibly(url.clone(), Some(fault), args, call),
        )
    };
    let charge = |intent| Charge {
        order_id: "817".into(),
        intent,
        amount_minor: 1000,
    };

    let timed_out = protect("commit-then-timeout")
        .call(charge(1))
        .await
        .unwrap();
    let Executed::VerificationRequired { operation } = &timed_out else {
        panic!("expected verification required, got {timed_out:?}");
    };
    assert_eq!(operation.status, OperationStatus::Unknown as i32);
    assert_eq!(operation.error_code.as_deref(), Some("timeout"));
    assert_eq!(app.counts(PAYMENT_KEY).effects, 1, "the payment did happen");

    let server_error = protect("fail-before-store").call(charge(2)).await.unwrap();
    let key_2 = "payment:order-817:intent-02";
    assert_eq!(app.get(key_2).await.status, OperationStatus::Unknown as i32);
    assert_eq!(app.get(key_2).await.error_code.as_deref(), Some("http_503"));
    assert_eq!(server_error.to_json()["outcome"], "verification_required");

    let declined = protect("reject").call(charge(3)).await.unwrap();
    assert!(
        matches!(
            declined,
            Executed::FailedFinal {
                replayed: false,
                ..
            }
        ),
        "{declined:?}"
    );
    assert_eq!(
        app.get("payment:order-817:intent-03")
            .await
            .error_code
            .as_deref(),
        Some("card_declined")
    );

    // A hook may name what the provider documents as a definitive refusal.
    let classified = protect("fail-before-store")
        .classify(|error| match error {
            ProviderError::Status(status) if status.as_u16() == 503 => ProviderOutcome::Rejected {
                error_code: "provider_closed".into(),
            },
            other => other.outcome(),
        })
        .call(charge(4))
        .await
        .unwrap();
    assert!(
        matches!(classified, Executed::FailedFinal { .. }),
        "{classified:?}"
    );
    assert_eq!(
        app.get("payment:order-817:intent-04")
            .await
            .error_code
            .as_deref(),
        Some("provider_closed")
    );
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn the_provider_call_sees_the_lease_lost_signal_and_the_report_is_a_typed_lease_lost(
    pool: PgPool,
) {
    let app = TestApp::spawn(pool).await;
    let client = client(&app);
    let intent = Intent::new(
        PAYMENT_KEY,
        "create_payment_dedup",
        json!({"amount_minor": 1000, "currency": "EUR"}),
    )
    .with_lease(Duration::from_secs(3));
    let (started_tx, started_rx) = tokio::sync::oneshot::channel();
    let holder = client.execute(intent.clone(), |call| async move {
        started_tx.send(()).unwrap();
        tokio::select! {
            () = call.lease_lost() => {}
            () = tokio::time::sleep(Duration::from_secs(20)) => panic!("no lease-lost signal"),
        }
        assert!(call.is_lease_lost());
        // Stopped before the provider was called: nothing happened.
        ProviderOutcome::Rejected {
            error_code: "stopped".into(),
        }
    });
    let usurper = async {
        started_rx.await.unwrap();
        // The lease ends early (as after a long pause of the holder) and another holder
        // claims the operation: attempt 2.
        sqlx::query(
            "UPDATE agent_operations SET lease_until = now() - interval '1 second'
             WHERE operation_key = $1",
        )
        .bind(PAYMENT_KEY)
        .execute(app.pool())
        .await
        .unwrap();
        client.begin(&intent).await.unwrap()
    };
    let (held, claimed) = tokio::join!(holder, usurper);
    assert!(matches!(claimed, Begun::Execute { .. }), "{claimed:?}");
    let error = held.unwrap_err();
    assert_eq!(error.code, Code::Aborted);
    assert_eq!(error.reason, ErrorReason::LeaseLost);
    let row = app.get(PAYMENT_KEY).await;
    assert_eq!(row.status, OperationStatus::InProgress as i32);
    assert_eq!(row.attempt_count, 2);
    assert_eq!(
        row.error_code, None,
        "the stale holder's report was refused"
    );
    assert_eq!(app.counts(PAYMENT_KEY).requests, 0);
}

#[tokio::test]
async fn every_call_has_a_deadline() {
    // A server that accepts connections and never answers.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let silent = tokio::spawn(async move {
        let mut held = Vec::new();
        loop {
            let (socket, _) = listener.accept().await.unwrap();
            held.push(socket);
        }
    });
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect_lazy();
    let client = JournalClient::new(channel).with_call_timeout(Duration::from_millis(300));
    assert_eq!(client.call_timeout(), Duration::from_millis(300));
    let started = std::time::Instant::now();
    let error = client.get("", PAYMENT_KEY).await.unwrap_err();
    assert_eq!(error.code, Code::DeadlineExceeded);
    assert_eq!(error.reason, ErrorReason::Transport);
    assert!(error.is_transient());
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(
        opjournal_client::DEFAULT_CALL_TIMEOUT,
        Duration::from_secs(10)
    );
    silent.abort();
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn a_protected_function_can_key_its_intent_by_a_server_derived_key(pool: PgPool) {
    let app = TestApp::spawn_with_options(
        pool,
        SpawnOptions {
            key_secret: Some("a-test-derivation-secret-of-32-bytes!".to_owned()),
            ..SpawnOptions::default()
        },
    )
    .await;
    let calls = Arc::new(AtomicUsize::new(0));
    let url = app.sandbox_url.clone();
    let counted = calls.clone();
    // The reference names a person: it goes to DeriveOperationKey only, never into a key.
    let pay = Protected::with_args_as_payload(
        client(&app),
        "create_payment",
        |args: &Charge| {
            format!(
                "customer jane.doe@example.com/order-{}/{}",
                args.order_id, args.intent
            )
        },
        move |args: Charge, call: ProviderCall| {
            counted.fetch_add(1, Ordering::SeqCst);
            charge_fallibly(url.clone(), None, args, call)
        },
    )
    .derive_key_on_server();
    let args = Charge {
        order_id: "817".into(),
        intent: 1,
        amount_minor: 1000,
    };
    let key = pay.key(&args).await.unwrap();
    assert!(key.starts_with("ok_") && !key.contains("jane"), "{key}");

    let first = pay.call(args.clone()).await.unwrap();
    assert!(
        matches!(&first, Executed::Succeeded { operation, replayed: false } if operation.operation_key == key),
        "{first:?}"
    );
    let again = pay.call(args).await.unwrap();
    assert!(
        matches!(again, Executed::Succeeded { replayed: true, .. }),
        "{again:?}"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert_eq!(app.counts(&key).effects, 1);
    assert_eq!(app.rows_for(&key).await, 1);
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn a_success_whose_report_the_journal_refuses_is_verification_required_not_an_error(
    pool: PgPool,
) {
    let app = TestApp::spawn(pool).await;
    let client = client(&app);
    let calls = Arc::new(AtomicUsize::new(0));
    let run = || {
        let calls = calls.clone();
        let url = app.sandbox_url.clone();
        client.execute(payment(PAYMENT_KEY, 1000), move |call| async move {
            calls.fetch_add(1, Ordering::SeqCst);
            match charge(&url, &call, 1000, None).await {
                // The provider charged, but the id it gave cannot be recorded (over 200
                // characters): the journal refuses the report of the success.
                ProviderOutcome::Succeeded { result, .. } => ProviderOutcome::Succeeded {
                    external_id: Some("p".repeat(300)),
                    result,
                },
                other => other,
            }
        })
    };

    let first = run().await.unwrap();
    let Executed::VerificationRequired { operation } = first else {
        panic!("expected verification required, got {first:?}");
    };
    assert_eq!(
        operation.status(),
        opjournal_client::proto::OperationStatus::Unknown
    );
    let reason: Option<String> = sqlx::query_scalar(
        "SELECT reason FROM operation_events WHERE operation_key = $1 AND to_status = 'unknown'",
    )
    .bind(PAYMENT_KEY)
    .fetch_one(app.pool())
    .await
    .unwrap();
    assert_eq!(reason.as_deref(), Some(opjournal_client::RESULT_REFUSED));

    // The effect happened once, and the next call does not make another.
    let second = run().await.unwrap();
    assert!(
        matches!(second, Executed::VerificationRequired { .. }),
        "{second:?}"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert_eq!(app.counts(PAYMENT_KEY).effects, 1);
    assert_eq!(app.counts(PAYMENT_KEY).requests, 1);
}

/// A server shutting down refuses the streams it has not taken with an HTTP/2 GOAWAY; such a
/// call was never processed (RFC 9113 §6.8), so the client reports it `UNAVAILABLE` and
/// transient, where tonic alone says `INTERNAL`.
#[tokio::test]
async fn a_call_refused_by_a_servers_goaway_is_unavailable_and_may_be_repeated() {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    // An HTTP/2 server written frame by frame: it answers the client's SETTINGS and, on the
    // first request's HEADERS, says GOAWAY (last stream id 0, NO_ERROR) and takes nothing.
    let server = tokio::spawn(async move {
        let (mut tcp, _) = listener.accept().await.unwrap();
        let mut preface = [0_u8; 24];
        tcp.read_exact(&mut preface).await.unwrap();
        tcp.write_all(&[0, 0, 0, 4, 0, 0, 0, 0, 0]).await.unwrap();
        let mut headers_seen = 0;
        loop {
            let mut header = [0_u8; 9];
            if tcp.read_exact(&mut header).await.is_err() {
                return headers_seen;
            }
            let length = u32::from_be_bytes([0, header[0], header[1], header[2]]);
            let mut payload = vec![0_u8; length as usize];
            tcp.read_exact(&mut payload).await.unwrap();
            match (header[3], header[4] & 1) {
                // SETTINGS, not an acknowledgement: acknowledge it.
                (4, 0) => tcp.write_all(&[0, 0, 0, 4, 1, 0, 0, 0, 0]).await.unwrap(),
                // HEADERS: go away without taking the stream.
                (1, _) => {
                    headers_seen += 1;
                    let go_away = [0, 0, 8, 7, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
                    tcp.write_all(&go_away).await.unwrap();
                }
                _ => {}
            }
        }
    });
    let channel = tonic::transport::Channel::from_shared(format!("http://{address}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let client = JournalClient::new(channel).with_begin_retry(Duration::ZERO);
    let error = client
        .begin(&payment("goaway-1", 100))
        .await
        .expect_err("the server took nothing");
    assert_eq!(error.code, Code::Unavailable, "{error}");
    assert_eq!(error.reason, ErrorReason::Transport);
    assert!(error.is_transient());
    drop(client);
    let headers_seen = tokio::time::timeout(Duration::from_secs(10), server)
        .await
        .expect("the connection closes")
        .unwrap();
    assert_eq!(headers_seen, 1);
}
