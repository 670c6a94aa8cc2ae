//! Lookup lag, e-mails without idempotency, counters and odd keys.

use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::tests::*;

#[tokio::test]
async fn lookup_lag_hides_then_shows() {
    let lag = Duration::from_millis(500);
    let (base, sandbox) = start(lag, Duration::from_secs(2)).await;
    let client = client();
    let key = "payment:order-5:intent-01";
    let url = format!("{base}/v1/payments/by-idempotency-key/{key}");

    let before_post = Instant::now();
    let created = pay(&client, &base, key, &payment_body("5"), None).await;
    assert_eq!(created.status(), StatusCode::CREATED);
    let id = created.json::<Value>().await.unwrap()["id"]
        .as_str()
        .unwrap()
        .to_owned();

    let (status, body) = get(&client, url.clone()).await;
    // Stored after `before_post`, so certainly hidden while less than the lag
    // has passed since then; a very slow machine may skip this check.
    if before_post.elapsed() < lag {
        assert_eq!(status, StatusCode::NOT_FOUND);
        assert_error(&body, "not_found");
    }
    let (status, _) = get(&client, format!("{base}/v1/payments/{id}")).await;
    if before_post.elapsed() < lag {
        assert_eq!(status, StatusCode::NOT_FOUND);
    }

    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (status, body) = get(&client, url.clone()).await;
        if status == StatusCode::OK {
            assert!(
                before_post.elapsed() >= lag,
                "visible before the lag passed"
            );
            assert_eq!(body["id"], id.as_str());
            break;
        }
        assert!(Instant::now() < deadline, "never became visible");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (status, _) = get(&client, format!("{base}/v1/payments/{id}")).await;
    assert_eq!(status, StatusCode::OK);
    assert!(sandbox.counts(key).lookups >= 2);

    // The lag changes at run time, over HTTP and in-process.
    let put = client
        .put(format!("{base}/v1/admin/lookup-lag"))
        .json(&json!({"seconds": 3600.0}))
        .send()
        .await
        .unwrap();
    assert_eq!(put.status(), StatusCode::NO_CONTENT);
    assert_eq!(get(&client, url.clone()).await.0, StatusCode::NOT_FOUND);
    sandbox.set_lookup_lag(Duration::ZERO);
    assert_eq!(get(&client, url.clone()).await.0, StatusCode::OK);

    let bad = client
        .put(format!("{base}/v1/admin/lookup-lag"))
        .json(&json!({"seconds": -1.0}))
        .send()
        .await
        .unwrap();
    assert_eq!(bad.status(), StatusCode::BAD_REQUEST);
    assert_error(&bad.json().await.unwrap(), "invalid_request");
}

#[tokio::test]
async fn emails_are_never_deduplicated() {
    let (base, sandbox) = start(Duration::ZERO, Duration::from_secs(2)).await;
    let client = client();
    let reference = "email:order-817:receipt";
    let body = json!({
        "to": "someone@example.test",
        "subject": "Your receipt",
        "body": "Thanks!",
        "external_reference": reference,
    });

    let (status, missing) = get(
        &client,
        format!("{base}/v1/emails/by-reference/{reference}"),
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_error(&missing, "not_found");

    let first = email(&client, &base, &body, None).await;
    assert_eq!(first.status(), StatusCode::ACCEPTED);
    let first: Value = first.json().await.unwrap();
    let second: Value = email(&client, &base, &body, None)
        .await
        .json()
        .await
        .unwrap();
    for sent in [&first, &second] {
        assert_eq!(sent["status"], "sent");
        assert_eq!(sent["external_reference"], reference);
        assert!(sent["id"].as_str().unwrap().starts_with("em_"));
        assert!(
            sent.get("to").is_none() && sent.get("subject").is_none() && sent.get("body").is_none()
        );
    }
    assert_ne!(first["id"], second["id"]);

    assert_counts(&sandbox, reference, (2, 2, 1));
    let (status, found) = get(
        &client,
        format!("{base}/v1/emails/by-reference/{reference}"),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(found["id"], first["id"]);
    assert_eq!(found["count"], 2);
    assert_eq!(sandbox.counts(reference).lookups, 2);

    let no_reference = email(
        &client,
        &base,
        &json!({"to": "x@example.test", "subject": "s"}),
        None,
    )
    .await;
    assert_eq!(no_reference.status(), StatusCode::BAD_REQUEST);
    let no_subject = email(
        &client,
        &base,
        &json!({"to": "x@example.test", "external_reference": "r2"}),
        None,
    )
    .await;
    assert_eq!(no_subject.status(), StatusCode::BAD_REQUEST);
    assert_error(&no_subject.json().await.unwrap(), "invalid_request");
    assert_counts(&sandbox, "r2", (1, 0, 0));
}

#[tokio::test]
async fn counters_and_odd_keys() {
    let (base, sandbox) = start(Duration::ZERO, Duration::from_secs(2)).await;
    let client = client();

    let unknown = effects_over_http(&client, &base, "never:seen").await;
    assert_eq!(
        unknown,
        json!({"key": "never:seen", "requests": 0, "effects": 0, "lookups": 0})
    );

    let spaced = "payment:order 42:intent-01";
    let created = pay(&client, &base, spaced, &payment_body("42"), None).await;
    assert_eq!(created.status(), StatusCode::CREATED);
    let url = format!("{base}/v1/payments/by-idempotency-key/{}", segment(spaced));
    assert!(url.contains("order%2042"));
    let (status, found) = get(&client, url).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(found["idempotency_key"], spaced);
    let counted = effects_over_http(&client, &base, spaced).await;
    assert_eq!(
        counted,
        json!({"key": spaced, "requests": 1, "effects": 1, "lookups": 1})
    );

    let body = json!({"to": "x@example.test", "subject": "s", "external_reference": "ref 1"});
    assert_eq!(
        email(&client, &base, &body, None).await.status(),
        StatusCode::ACCEPTED
    );
    let (status, _) = get(
        &client,
        format!("{base}/v1/emails/by-reference/{}", segment("ref 1")),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        get(
            &client,
            format!("{base}/v1/payments/by-idempotency-key/nope")
        )
        .await
        .0,
        StatusCode::NOT_FOUND
    );

    let (status, stats) = get(&client, format!("{base}/v1/stats")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(stats, json!({"requests": 2, "effects": 2, "lookups": 3}));
    assert_counts(&sandbox, "nope", (0, 0, 1));

    let (status, health) = get(&client, format!("{base}/healthz")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(health, json!({"status": "ok"}));
    let (status, body) = get(&client, format!("{base}/v1/nothing-here")).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_error(&body, "no_such_route");
    let wrong_method = client
        .delete(format!("{base}/v1/stats"))
        .send()
        .await
        .unwrap();
    assert_eq!(wrong_method.status(), StatusCode::METHOD_NOT_ALLOWED);
    assert_error(&wrong_method.json().await.unwrap(), "method_not_allowed");
}
