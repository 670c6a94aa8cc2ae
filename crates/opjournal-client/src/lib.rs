//! The Rust client of the opjournal operation journal.
//!
//! [`JournalClient`] speaks the `OperationJournal` and `Reconciler` services with a deadline
//! on every call and typed errors ([`ClientError`], [`ErrorReason`]): the calls of an
//! orchestrator (Begin, reports, reads) and of an operator (listings and histories over
//! every page, the review queue, reconcile, resolve).
//! [`JournalClient::execute`] is the whole protocol around one side-effecting call: journal
//! the intent, call the provider once under a renewed lease with the key the provider must
//! deduplicate on, and record what is *known* to have happened. [`Protected`] turns an async
//! function into such a protected call.
//!
//! ```no_run
//! # async fn example() -> Result<(), opjournal_client::ClientError> {
//! use opjournal_client::{Executed, Intent, JournalClient, ProviderOutcome};
//!
//! let client = JournalClient::connect("http://127.0.0.1:50051").await?;
//! let intent = Intent::new(
//!     "payment:order-817:intent-01",
//!     "create_payment",
//!     serde_json::json!({"amount_minor": 1000, "currency": "EUR", "order_id": "817"}),
//! );
//! let executed = client
//!     .execute(intent, |call| async move {
//!         // Call the provider with call.provider_key as its idempotency key, then say
//!         // what is *known*: a timeout is never a rejection.
//!         ProviderOutcome::Uncertain { error_code: Some("timeout".into()) }
//!     })
//!     .await?;
//! match executed {
//!     Executed::Succeeded { operation, .. } => println!("paid: {:?}", operation.external_id),
//!     Executed::VerificationRequired { .. } => println!("unknown: reconcile before any retry"),
//!     other => println!("{other:?}"),
//! }
//! # Ok(())
//! # }
//! ```
//!
//! This crate depends on the protocol only (tonic, prost); it carries no server code.

mod auth;
mod client;
mod error;
mod execute;
mod executed;
mod intent;
mod protect;
pub mod proto;
mod provider;
mod review;

pub use auth::{BearerToken, InvalidToken};
pub use client::{DEFAULT_BEGIN_RETRY, DEFAULT_CALL_TIMEOUT, DEFAULT_REPORT_RETRY, JournalClient};
pub use error::{ClientError, ErrorReason};
pub use execute::{ExecuteOptions, ProviderCall, RESULT_REFUSED};
pub use executed::Executed;
pub use intent::{AttemptId, Begun, Intent, Lease};
pub use protect::Protected;
pub use proto::Operation;
pub use provider::{ProviderError, ProviderOutcome, ProviderSuccess, default_error_code};
pub use review::{ListFilter, MAX_HISTORY_PAGE, MAX_OPERATIONS_PAGE};
