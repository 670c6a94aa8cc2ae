//! The ledger, the `slow` fault and the deliberate defect.

use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::json;

use crate::tests::*;
use crate::{Defect, SandboxConfig, spawn};

#[tokio::test]
async fn the_ledger_lists_each_key_with_its_effect_ids_and_replays() {
    let (base, sandbox) = start(Duration::ZERO, Duration::from_secs(2)).await;
    let client = client();
    let created = pay(&client, &base, "k-led", &payment_body("1"), None).await;
    assert_eq!(created.status(), StatusCode::CREATED);
    let id = created.json::<serde_json::Value>().await.unwrap()["id"].clone();
    let replayed = pay(&client, &base, "k-led", &payment_body("1"), None).await;
    assert_eq!(replayed.status(), StatusCode::OK);
    let body = json!({"to": "r", "subject": "s", "external_reference": "em-led"});
    for _ in 0..2 {
        let sent = email(&client, &base, &body, None).await;
        assert_eq!(sent.status(), StatusCode::ACCEPTED);
    }

    let (status, ledger) = get(&client, format!("{base}/v1/admin/ledger")).await;
    assert_eq!(status, StatusCode::OK);
    let keys = ledger["keys"].as_array().unwrap();
    assert_eq!(keys.len(), 2, "ledger: {ledger}");
    assert_eq!(keys[0]["key"], "em-led");
    assert_eq!(keys[0]["effects"], 2);
    assert_eq!(keys[0]["effect_ids"].as_array().unwrap().len(), 2);
    assert_eq!(keys[0]["replays"], 0);
    assert_eq!(keys[1]["key"], "k-led");
    assert_eq!(keys[1]["requests"], 2);
    assert_eq!(keys[1]["effects"], 1);
    assert_eq!(keys[1]["replays"], 1);
    assert_eq!(keys[1]["effect_ids"], json!([id]));
    assert_eq!(sandbox.ledger()[1].effect_ids, vec![id.as_str().unwrap()]);
}

#[tokio::test]
async fn a_slow_request_waits_then_stores_once_and_answers() {
    let (base, sandbox) = spawn(SandboxConfig {
        slow: Duration::from_millis(600),
        ..SandboxConfig::default()
    })
    .await
    .unwrap();
    let client = client();
    let started = Instant::now();
    let created = pay(&client, &base, "k-slow", &payment_body("1"), Some("slow")).await;
    assert_eq!(created.status(), StatusCode::CREATED);
    assert!(started.elapsed() >= Duration::from_millis(600));
    assert_counts(&sandbox, "k-slow", (1, 1, 0));
}

#[tokio::test]
async fn the_deliberately_broken_mode_stores_a_payment_twice() {
    let (base, sandbox) = spawn(SandboxConfig {
        defect: Some(Defect::StorePaymentsTwice),
        ..SandboxConfig::default()
    })
    .await
    .unwrap();
    let client = client();
    let created = pay(&client, &base, "k-twice", &payment_body("1"), None).await;
    assert_eq!(created.status(), StatusCode::CREATED);
    assert_eq!(sandbox.counts("k-twice").effects, 2);
    let ledger = sandbox.ledger();
    assert_eq!(ledger[0].effect_ids.len(), 2);
    assert_ne!(ledger[0].effect_ids[0], ledger[0].effect_ids[1]);
    // E-mails are not affected: one send, one e-mail.
    let body = json!({"to": "r", "subject": "s", "external_reference": "em-once"});
    let sent = email(&client, &base, &body, None).await;
    assert_eq!(sent.status(), StatusCode::ACCEPTED);
    assert_eq!(sandbox.counts("em-once").effects, 1);
}
