//! Protects one payment with the journal: the source article's `executeOperation` through
//! [`JournalClient::execute`]. Run the server and the sandbox provider first (see
//! docs/quickstart.md), then run this twice: the first run charges, the second replays.
//!
//! ```sh
//! cargo run --example protect_payment -- payment:order-817:intent-01 1000
//! ```
//!
//! Environment: `OPJOURNAL_URL` (default `http://127.0.0.1:50051`), `PROVIDER_URL` (default
//! `http://127.0.0.1:8081`, the sandbox), `PROVIDER_FAULT` (an `X-Sandbox-Fault` value such
//! as `commit-then-timeout`, to see a lost answer handled).

use std::time::Duration;

use opjournal::client::{
    ErrorReason, Executed, Intent, JournalClient, ProviderCall, ProviderOutcome,
};
use serde_json::json;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let key = args
        .next()
        .unwrap_or_else(|| "payment:order-817:intent-01".into());
    let amount_minor: u64 = args.next().map_or(Ok(1000), |a| a.parse())?;
    let journal_url =
        std::env::var("OPJOURNAL_URL").unwrap_or_else(|_| "http://127.0.0.1:50051".into());
    let provider_url =
        std::env::var("PROVIDER_URL").unwrap_or_else(|_| "http://127.0.0.1:8081".into());
    let fault = std::env::var("PROVIDER_FAULT").ok();
    // reqwest is built on rustls without a default crypto provider: install ring's.
    opjournal::app::install_crypto_provider();

    let client = JournalClient::connect(&journal_url).await?;
    // The payload is what the key is bound to: the same key with another amount is refused.
    let payload = json!({"amount_minor": amount_minor, "currency": "EUR", "order_id": "817"});
    let intent =
        Intent::new(key, "create_payment", payload.clone()).with_reference("order_id", "817");

    let executed = match client
        .execute(intent, |call| charge(provider_url, call, payload, fault))
        .await
    {
        Ok(executed) => executed,
        Err(err) if err.reason == ErrorReason::IdempotencyKeyReused => {
            println!(
                "refused: this key already names another request; use a new key for a new intent"
            );
            return Ok(());
        }
        Err(err) => return Err(err.into()),
    };
    match executed {
        Executed::Succeeded {
            operation,
            replayed,
        } => println!(
            "succeeded{}: payment {}",
            if replayed {
                " (replayed, provider not called)"
            } else {
                ""
            },
            operation.external_id.unwrap_or_default()
        ),
        Executed::FailedFinal { operation, .. } => {
            println!("declined: {}", operation.error_code.unwrap_or_default());
        }
        Executed::VerificationRequired { .. } => println!(
            "outcome unknown: the reconcile worker will ask the provider; do not retry yet"
        ),
        Executed::InProgress { retry_after, .. } => {
            println!("another worker holds the lease; ask again in {retry_after:?}");
        }
        Executed::DuplicateIntentSuspected {
            duplicate_of_operation_key,
        } => println!("the same payment is already registered as {duplicate_of_operation_key}"),
    }
    Ok(())
}

/// Calls the provider with the journal's key as its idempotency key and says what is known:
/// only a confirmed decline is a rejection; a timeout, a reset or a 5xx is uncertain.
async fn charge(
    provider_url: String,
    call: ProviderCall,
    payload: serde_json::Value,
    fault: Option<String>,
) -> ProviderOutcome {
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(2))
        .build()
        .expect("an HTTP client");
    let mut request = http
        .post(format!("{provider_url}/v1/payments"))
        .header("Idempotency-Key", &call.provider_key)
        .json(&payload);
    if let Some(fault) = fault {
        request = request.header("X-Sandbox-Fault", fault);
    }
    let uncertain = |code: &str| ProviderOutcome::Uncertain {
        error_code: Some(code.to_owned()),
    };
    let response = match request.send().await {
        Ok(response) => response,
        Err(err) if err.is_timeout() => return uncertain("timeout"),
        Err(_) => return uncertain("connection_error"),
    };
    match response.status().as_u16() {
        200 | 201 => match response.json::<serde_json::Value>().await {
            Ok(body) => ProviderOutcome::Succeeded {
                external_id: body["id"].as_str().map(str::to_owned),
                // Keep only what a replay needs; the journal sanitizes the rest anyway.
                result: Some(json!({"id": body["id"], "status": body["status"]})),
            },
            // The payment exists but its answer is unreadable: still uncertain.
            Err(_) => uncertain("unreadable_response"),
        },
        402 => ProviderOutcome::Rejected {
            error_code: "card_declined".into(),
        },
        // The provider knows this key with another request: something else used it, so
        // whether an effect exists for *this* intent is not known.
        422 => uncertain("provider_key_conflict"),
        _ => uncertain("provider_error"),
    }
}
