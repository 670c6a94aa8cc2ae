//! Fault injection by the `X-Sandbox-Fault` request header.

use axum::http::{HeaderMap, StatusCode};

use crate::Sandbox;
use crate::error::ApiError;

/// Name of the fault-injection header.
pub(crate) const FAULT_HEADER: &str = "x-sandbox-fault";

/// A fault requested for one POST.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fault {
    /// Store the effect as normal, then stall the answer for the hang.
    CommitThenTimeout,
    /// Store nothing, answer 503 `unavailable`.
    FailBeforeStore,
    /// Definitive rejection: store nothing, answer 402 / 422.
    Reject,
    /// Take the configured slow delay, then store and answer as normal.
    Slow,
}

impl Fault {
    /// Reads the fault header: `Ok(None)` when absent, 400 `invalid_fault`
    /// when present with an unknown value.
    pub fn from_headers(headers: &HeaderMap) -> Result<Option<Self>, ApiError> {
        let Some(raw) = headers.get(FAULT_HEADER) else {
            return Ok(None);
        };
        match raw.to_str().map(str::trim) {
            Ok("commit-then-timeout") => Ok(Some(Self::CommitThenTimeout)),
            Ok("fail-before-store") => Ok(Some(Self::FailBeforeStore)),
            Ok("reject") => Ok(Some(Self::Reject)),
            Ok("slow") => Ok(Some(Self::Slow)),
            _ => Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                "invalid_fault",
                "X-Sandbox-Fault must be one of: commit-then-timeout, fail-before-store, reject, slow",
            )),
        }
    }

    /// Plays the part of `fault` that comes before the effect is stored: `FailBeforeStore`
    /// answers 503 `unavailable`, `Reject` answers `rejection` (the provider's own definitive
    /// refusal, e.g. 402 `card_declined`), `Slow` waits the configured delay. `Ok` means: go
    /// on and store the effect (for `CommitThenTimeout`, then stall the answer).
    pub async fn before_store(
        fault: Option<Self>,
        sandbox: &Sandbox,
        rejection: (StatusCode, &'static str, &'static str),
    ) -> Result<(), ApiError> {
        match fault {
            Some(Self::FailBeforeStore) => Err(ApiError::unavailable()),
            Some(Self::Reject) => Err(ApiError::new(rejection.0, rejection.1, rejection.2)),
            Some(Self::Slow) => {
                sandbox.slow().await;
                Ok(())
            }
            Some(Self::CommitThenTimeout) | None => Ok(()),
        }
    }
}
