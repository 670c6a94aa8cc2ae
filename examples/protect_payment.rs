//! Protects one payment with the journal: the source article's `executeOperation` through
//! [`Protected`], which turns an async provider function into a call that is journaled
//! first, runs at most once per attempt and replays its stored outcome afterwards. Run the
//! server and the sandbox provider first (see docs/quickstart.md), then run this twice: the
//! first run charges, the second replays.
//!
//! ```sh
//! cargo run --example protect_payment -- payment:order-817:intent-01 1000
//! ```
//!
//! Arguments: the idempotency key (named by the orchestrator's code for one business intent,
//! never by a model) and the amount in minor units.
//! Environment: `OPJOURNAL_URL` (default `http://127.0.0.1:50051`), `PROVIDER_URL` (default
//! `http://127.0.0.1:8081`, the sandbox), `PROVIDER_FAULT` (an `X-Sandbox-Fault` value such
//! as `commit-then-timeout`, to see a lost answer handled).

use std::time::Duration;

use opjournal_client::{
    ErrorReason, ExecuteOptions, Executed, JournalClient, Protected, ProviderCall, ProviderError,
    ProviderSuccess,
};
use serde_json::json;

/// What the orchestrator asks for: one payment of order 817 under the intent's key.
struct Charge {
    key: String,
    amount_minor: u64,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let charge = Charge {
        key: args
            .next()
            .unwrap_or_else(|| "payment:order-817:intent-01".into()),
        amount_minor: args.next().map_or(Ok(1000), |a| a.parse())?,
    };
    let journal_url =
        std::env::var("OPJOURNAL_URL").unwrap_or_else(|_| "http://127.0.0.1:50051".into());
    let provider_url =
        std::env::var("PROVIDER_URL").unwrap_or_else(|_| "http://127.0.0.1:8081".into());
    let fault = std::env::var("PROVIDER_FAULT").ok();
    // reqwest is built on rustls without a default crypto provider: install ring's.
    opjournal::app::install_crypto_provider();

    let client = JournalClient::connect(&journal_url).await?;
    let pay = Protected::new(
        client,
        "create_payment",
        |c: &Charge| c.key.clone(),
        // The payload the key is bound to: the same key with another amount is refused.
        |c: &Charge| json!({"amount_minor": c.amount_minor, "currency": "EUR", "order_id": "817"}),
        move |c: Charge, call: ProviderCall| {
            charge_card(provider_url.clone(), fault.clone(), c, call)
        },
    )
    .with_reference("order_id", |_: &Charge| "817".to_owned())
    // Another worker holding the same payment: wait up to 5 s for its outcome.
    .with_options(ExecuteOptions::new().wait_in_progress(Duration::from_secs(5)));

    let executed = match pay.call(charge).await {
        Ok(executed) => executed,
        Err(err) if err.reason == ErrorReason::IdempotencyKeyReused => {
            println!(
                "refused: this key already names another request; use a new key for a new intent"
            );
            return Ok(());
        }
        Err(err) => return Err(err.into()),
    };
    match &executed {
        Executed::Succeeded {
            operation,
            replayed,
        } => println!(
            "succeeded{}: payment {}",
            if *replayed {
                " (replayed, provider not called)"
            } else {
                ""
            },
            operation.external_id.as_deref().unwrap_or_default()
        ),
        Executed::FailedFinal { operation, .. } => {
            println!(
                "declined: {}",
                operation.error_code.as_deref().unwrap_or_default()
            );
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
    // What an agent's tool would return.
    println!("{}", executed.to_json());
    Ok(())
}

/// Calls the provider with the journal's key as its idempotency key. A decline is the only
/// confirmed rejection; every other error (`?`) is left to the default classification:
/// a timeout is `timeout`, a 5xx `http_5xx`, anything else uncertain too.
async fn charge_card(
    provider_url: String,
    fault: Option<String>,
    charge: Charge,
    call: ProviderCall,
) -> Result<ProviderSuccess, ProviderError> {
    let mut request = reqwest::Client::new()
        .post(format!("{provider_url}/v1/payments"))
        .header("Idempotency-Key", &call.provider_key)
        .json(&json!({"amount_minor": charge.amount_minor, "currency": "EUR", "order_id": "817"}));
    if let Some(fault) = fault {
        request = request.header("X-Sandbox-Fault", fault);
    }
    // Stop early if another holder took the operation over while we were getting ready.
    if call.is_lease_lost() {
        return Err(ProviderError::uncertain("lease_lost_before_call"));
    }
    let response = tokio::time::timeout(Duration::from_secs(2), request.send()).await??;
    match response.status() {
        status if status.is_success() => {
            // The payment exists; an unreadable answer is still uncertain.
            let body: serde_json::Value = response
                .json()
                .await
                .map_err(|_| ProviderError::uncertain("unreadable_response"))?;
            let id = body["id"].as_str().unwrap_or_default().to_owned();
            // Keep only what a replay needs; the journal sanitizes the rest anyway.
            Ok(ProviderSuccess::new(id)
                .with_result(json!({"id": body["id"], "status": body["status"]})))
        }
        reqwest::StatusCode::PAYMENT_REQUIRED => Err(ProviderError::rejected("card_declined")),
        // The provider knows this key with another request: whether an effect exists for
        // *this* intent is not known.
        reqwest::StatusCode::UNPROCESSABLE_ENTITY => {
            Err(ProviderError::uncertain("provider_key_conflict"))
        }
        status => Err(ProviderError::Status(status)),
    }
}
