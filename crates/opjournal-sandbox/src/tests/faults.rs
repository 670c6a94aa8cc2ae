//! Injected faults and graceful shutdown.

use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::json;

use crate::tests::*;
use crate::{Sandbox, SandboxConfig};

#[tokio::test]
async fn commit_then_timeout_stores_the_effect() {
    let (base, sandbox) = start(Duration::ZERO, Duration::from_secs(2)).await;
    let key = "payment:order-817:intent-02";
    let impatient = builder()
        .timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    let outcome = impatient
        .post(format!("{base}/v1/payments"))
        .header("Idempotency-Key", key)
        .header(FAULT, "commit-then-timeout")
        .json(&payment_body("817"))
        .send()
        .await;
    let err = outcome.expect_err("the answer must stall past the client timeout");
    assert!(err.is_timeout(), "error: {err}");

    // The effect happened even though the answer was lost. (Poll: on a very
    // slow machine the request may still be in flight.)
    let deadline = Instant::now() + Duration::from_secs(10);
    while sandbox.counts(key).effects == 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_counts(&sandbox, key, (1, 1, 0));

    // A patient retry with the same key replays; still one effect.
    let client = client();
    let retry = pay(&client, &base, key, &payment_body("817"), None).await;
    assert_eq!(retry.status(), StatusCode::OK);
    assert_eq!(retry.headers()["idempotent-replayed"], "true");
    assert_eq!(sandbox.counts(key).effects, 1);

    // E-mail variant: the stall ends with a normal 202 for a patient client.
    let started = Instant::now();
    let sent = email(
        &client,
        &base,
        &json!({"to": "a@example.test", "subject": "hi", "external_reference": "em-ctt"}),
        Some("commit-then-timeout"),
    )
    .await;
    assert_eq!(sent.status(), StatusCode::ACCEPTED);
    assert!(started.elapsed() >= Duration::from_secs(2));
    assert_eq!(sandbox.counts("em-ctt").effects, 1);
}

#[tokio::test]
async fn fail_before_store_and_reject_store_nothing() {
    let (base, sandbox) = start(Duration::ZERO, Duration::from_secs(2)).await;
    let client = client();

    let failed = pay(
        &client,
        &base,
        "k-fail",
        &payment_body("1"),
        Some("fail-before-store"),
    )
    .await;
    assert_eq!(failed.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_error(&failed.json().await.unwrap(), "unavailable");
    let rejected = pay(
        &client,
        &base,
        "k-reject",
        &payment_body("2"),
        Some("reject"),
    )
    .await;
    assert_eq!(rejected.status(), StatusCode::PAYMENT_REQUIRED);
    assert_error(&rejected.json().await.unwrap(), "card_declined");

    let body = json!({"to": "a@example.test", "subject": "hi", "external_reference": "em-f"});
    let failed = email(&client, &base, &body, Some("fail-before-store")).await;
    assert_eq!(failed.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_error(&failed.json().await.unwrap(), "unavailable");
    let rejected = email(&client, &base, &body, Some("reject")).await;
    assert_eq!(rejected.status(), StatusCode::UNPROCESSABLE_ENTITY);
    assert_error(&rejected.json().await.unwrap(), "recipient_rejected");

    for key in ["k-fail", "k-reject"] {
        assert_counts(&sandbox, key, (1, 0, 0));
        let (status, body) = get(
            &client,
            format!("{base}/v1/payments/by-idempotency-key/{key}"),
        )
        .await;
        assert_eq!(status, StatusCode::NOT_FOUND);
        assert_error(&body, "not_found");
    }
    assert_counts(&sandbox, "em-f", (2, 0, 0));

    // After the failure, a clean retry creates exactly one payment.
    let created = pay(&client, &base, "k-fail", &payment_body("1"), None).await;
    assert_eq!(created.status(), StatusCode::CREATED);
    assert_counts(&sandbox, "k-fail", (2, 1, 1));
}

#[tokio::test]
async fn shutdown_cuts_a_stall_short() {
    let sandbox = Sandbox::new(SandboxConfig {
        lookup_lag: Duration::ZERO,
        hang: Duration::from_secs(600),
        ..SandboxConfig::default()
    });
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0))
        .await
        .unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(sandbox.clone().serve(listener, async move {
        let _ = stopped.await;
    }));

    let client = builder().timeout(Duration::from_secs(60)).build().unwrap();
    let stalled = tokio::spawn({
        let base = base.clone();
        async move {
            pay(
                &client,
                &base,
                "k-stall",
                &payment_body("1"),
                Some("commit-then-timeout"),
            )
            .await
            .status()
        }
    });
    let deadline = Instant::now() + Duration::from_secs(10);
    while sandbox.counts("k-stall").effects == 0 {
        assert!(Instant::now() < deadline, "request never arrived");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop.send(()).unwrap();
    let served = tokio::time::timeout(Duration::from_secs(20), server)
        .await
        .unwrap();
    assert!(served.unwrap().is_ok());
    assert_eq!(stalled.await.unwrap(), StatusCode::CREATED);
    assert_eq!(sandbox.counts("k-stall").effects, 1);
}
