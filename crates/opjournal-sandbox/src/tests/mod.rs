//! End-to-end tests of the sandbox over real HTTP on 127.0.0.1:0.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::{KeyCounts, Sandbox, SandboxConfig, spawn};

mod faults;
mod ledger;
mod lookups;
mod payments;

pub(super) const FAULT: &str = "X-Sandbox-Fault";

/// reqwest is built with `rustls-no-provider`: a crypto provider must be
/// installed before any client is built, even for plain HTTP.
pub(super) fn install_crypto_provider() {
    // Err only means another test (or the library) installed one already.
    let _ = rustls::crypto::ring::default_provider().install_default();
}

pub(super) fn builder() -> reqwest::ClientBuilder {
    install_crypto_provider();
    reqwest::Client::builder()
}

pub(super) fn client() -> reqwest::Client {
    builder().timeout(Duration::from_secs(20)).build().unwrap()
}

/// Percent-encodes one path segment (everything but RFC 3986 unreserved and `:`).
pub(super) fn segment(raw: &str) -> String {
    raw.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-._~:".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

pub(super) async fn start(lag: Duration, hang: Duration) -> (String, Sandbox) {
    spawn(SandboxConfig {
        lookup_lag: lag,
        hang,
        ..SandboxConfig::default()
    })
    .await
    .unwrap()
}

pub(super) async fn pay(
    client: &reqwest::Client,
    base: &str,
    key: &str,
    body: &Value,
    fault: Option<&str>,
) -> reqwest::Response {
    let mut request = client
        .post(format!("{base}/v1/payments"))
        .header("Idempotency-Key", key)
        .json(body);
    if let Some(fault) = fault {
        request = request.header(FAULT, fault);
    }
    request.send().await.unwrap()
}

pub(super) async fn email(
    client: &reqwest::Client,
    base: &str,
    body: &Value,
    fault: Option<&str>,
) -> reqwest::Response {
    let mut request = client.post(format!("{base}/v1/emails")).json(body);
    if let Some(fault) = fault {
        request = request.header(FAULT, fault);
    }
    request.send().await.unwrap()
}

pub(super) async fn get(client: &reqwest::Client, url: String) -> (StatusCode, Value) {
    let response = client.get(url).send().await.unwrap();
    let status = response.status();
    (status, response.json().await.unwrap())
}

pub(super) async fn effects_over_http(client: &reqwest::Client, base: &str, key: &str) -> Value {
    let (status, body) = get(client, format!("{base}/v1/effects/{}", segment(key))).await;
    assert_eq!(status, StatusCode::OK);
    body
}

pub(super) fn assert_error(body: &Value, code: &str) {
    assert_eq!(body["error"], code, "body: {body}");
    assert!(body["message"].as_str().is_some_and(|m| !m.is_empty()));
}

pub(super) fn payment_body(order: &str) -> Value {
    json!({"amount_minor": 1250, "currency": "EUR", "order_id": order})
}

/// Asserts what the sandbox counted for `key`: `(requests, effects, lookups)`.
#[track_caller]
pub(super) fn assert_counts(
    sandbox: &Sandbox,
    key: &str,
    (requests, effects, lookups): (u64, u64, u64),
) {
    assert_eq!(
        sandbox.counts(key),
        KeyCounts {
            requests,
            effects,
            lookups
        },
        "the sandbox's counts for {key}"
    );
}
