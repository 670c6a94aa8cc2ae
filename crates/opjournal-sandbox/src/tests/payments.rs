//! Payment creation, replay, key reuse and validation.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::KeyCounts;
use crate::tests::*;

#[tokio::test]
async fn create_then_replay_keeps_one_effect() {
    let (base, sandbox) = start(Duration::ZERO, Duration::from_secs(2)).await;
    let client = client();
    let key = "payment:order-817:intent-01";

    let first = pay(&client, &base, key, &payment_body("817"), None).await;
    assert_eq!(first.status(), StatusCode::CREATED);
    assert!(first.headers().get("idempotent-replayed").is_none());
    let created: Value = first.json().await.unwrap();
    let id = created["id"].as_str().unwrap().to_owned();
    assert!(id.starts_with("pay_") && id.len() == 4 + 32, "id: {id}");
    assert!(id[4..].bytes().all(|b| b.is_ascii_hexdigit()));
    assert_eq!(created["status"], "succeeded");
    assert_eq!(created["amount_minor"], 1250);
    assert_eq!(created["currency"], "EUR");
    assert_eq!(created["idempotency_key"], key);
    let at = created["created_at"].as_str().unwrap();
    assert!(
        chrono::DateTime::parse_from_rfc3339(at).is_ok(),
        "created_at: {at}"
    );

    // Same members in another order: same parsed JSON, so a replay.
    let reordered = json!({"order_id": "817", "currency": "EUR", "amount_minor": 1250});
    let replay = pay(&client, &base, key, &reordered, None).await;
    assert_eq!(replay.status(), StatusCode::OK);
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    let replayed: Value = replay.json().await.unwrap();
    assert_eq!(replayed, created);

    let expected = KeyCounts {
        requests: 2,
        effects: 1,
        lookups: 0,
    };
    assert_eq!(sandbox.counts(key), expected);
    let over_http = effects_over_http(&client, &base, key).await;
    assert_eq!(
        over_http,
        json!({"key": key, "requests": 2, "effects": 1, "lookups": 0})
    );

    let (status, by_key) = get(
        &client,
        format!("{base}/v1/payments/by-idempotency-key/{key}"),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(by_key, created);
    let (status, by_id) = get(&client, format!("{base}/v1/payments/{id}")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(by_id, created);
    // Only the by-key lookup counts for the key.
    assert_eq!(sandbox.counts(key).lookups, 1);
}

#[tokio::test]
async fn a_payment_echoes_the_other_members_of_its_request() {
    let (base, _sandbox) = start(Duration::ZERO, Duration::from_secs(2)).await;
    let client = client();
    let body = json!({
        "amount_minor": 1250,
        "currency": "EUR",
        "order_id": "817",
        "card": {"number": "4111111111111111", "cvv": "123"},
        "id": "not-the-id",
        "status": "not-the-status"
    });
    let created: Value = pay(&client, &base, "echo-1", &body, None)
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(created["order_id"], "817");
    assert_eq!(created["card"]["number"], "4111111111111111");
    assert!(created["id"].as_str().unwrap().starts_with("pay_"));
    assert_eq!(created["status"], "succeeded");
    let (_, by_key) = get(
        &client,
        format!("{base}/v1/payments/by-idempotency-key/echo-1"),
    )
    .await;
    assert_eq!(by_key, created);
}

#[tokio::test]
async fn reused_key_with_other_body_is_refused() {
    let (base, sandbox) = start(Duration::ZERO, Duration::from_secs(2)).await;
    let client = client();
    let key = "payment:order-9:intent-01";
    let first = pay(&client, &base, key, &payment_body("9"), None).await;
    assert_eq!(first.status(), StatusCode::CREATED);
    let created: Value = first.json().await.unwrap();

    let other = json!({"amount_minor": 9999, "currency": "EUR", "order_id": "9"});
    let reused = pay(&client, &base, key, &other, None).await;
    assert_eq!(reused.status(), StatusCode::UNPROCESSABLE_ENTITY);
    assert_error(&reused.json().await.unwrap(), "idempotency_key_reused");

    assert_counts(&sandbox, key, (2, 1, 0));
    let (_, stored) = get(
        &client,
        format!("{base}/v1/payments/by-idempotency-key/{key}"),
    )
    .await;
    assert_eq!(stored["amount_minor"], 1250);
    assert_eq!(stored["id"], created["id"]);
}

#[tokio::test]
async fn invalid_payment_requests_store_nothing() {
    let (base, sandbox) = start(Duration::ZERO, Duration::from_secs(2)).await;
    let client = client();

    let no_key = client
        .post(format!("{base}/v1/payments"))
        .json(&payment_body("1"))
        .send()
        .await
        .unwrap();
    assert_eq!(no_key.status(), StatusCode::BAD_REQUEST);
    assert_error(&no_key.json().await.unwrap(), "idempotency_key_required");

    let bad_bodies = [
        json!({"amount_minor": 0, "currency": "EUR"}),
        json!({"amount_minor": -5, "currency": "EUR"}),
        json!({"amount_minor": 12.5, "currency": "EUR"}),
        json!({"amount_minor": 100}),
        json!({"currency": "EUR"}),
        json!([1, 2]),
    ];
    for body in &bad_bodies {
        let response = pay(&client, &base, "bad", body, None).await;
        assert_eq!(response.status(), StatusCode::BAD_REQUEST, "body: {body}");
        assert_error(&response.json().await.unwrap(), "invalid_request");
    }
    let not_json = client
        .post(format!("{base}/v1/payments"))
        .header("Idempotency-Key", "bad")
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(not_json.status(), StatusCode::BAD_REQUEST);
    assert_error(&not_json.json().await.unwrap(), "invalid_request");

    let bad_fault = pay(&client, &base, "bad", &payment_body("1"), Some("explode")).await;
    assert_eq!(bad_fault.status(), StatusCode::BAD_REQUEST);
    assert_error(&bad_fault.json().await.unwrap(), "invalid_fault");

    let counts = sandbox.counts("bad");
    assert_eq!(counts.effects, 0);
    assert_eq!(counts.requests, bad_bodies.len() as u64 + 2);
    let (status, stats) = get(&client, format!("{base}/v1/stats")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(stats["effects"], 0);
    assert_eq!(stats["requests"], bad_bodies.len() as u64 + 3);
}

#[tokio::test]
async fn oversized_body_is_a_json_error() {
    let (base, sandbox) = start(Duration::ZERO, Duration::from_secs(2)).await;
    let client = client();
    let huge = format!(
        "{{\"amount_minor\": 1, \"currency\": \"EUR\", \"pad\": \"{}\"}}",
        "x".repeat(3 * 1024 * 1024)
    );
    let response = client
        .post(format!("{base}/v1/payments"))
        .header("Idempotency-Key", "k-huge")
        .body(huge)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::PAYLOAD_TOO_LARGE);
    assert_error(&response.json().await.unwrap(), "payload_too_large");
    assert_eq!(sandbox.counts("k-huge").effects, 0);
}
