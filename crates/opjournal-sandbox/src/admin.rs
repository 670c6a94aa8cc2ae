//! Counter, admin and health endpoints.

use std::time::Duration;

use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, PathRejection};
use axum::extract::{Path, State};
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::error::{ApiError, body_bytes};
use crate::payments::path_param;
use crate::{KeyCounts, LedgerEntry, Sandbox};

/// Answer of `GET /v1/effects/{key}`.
#[derive(Serialize)]
pub(crate) struct KeyEffects {
    key: String,
    #[serde(flatten)]
    counts: KeyCounts,
}

/// Body of `PUT /v1/admin/lookup-lag`.
#[derive(Deserialize)]
struct LagBody {
    /// New lag in seconds, finite and >= 0.
    seconds: f64,
}

/// `GET /v1/effects/{key}`: counters of one key (zeros when unknown).
pub(crate) async fn effects(
    State(sandbox): State<Sandbox>,
    key: Result<Path<String>, PathRejection>,
) -> Result<Json<KeyEffects>, ApiError> {
    let key = path_param(key)?;
    let counts = sandbox.counts(&key);
    Ok(Json(KeyEffects { key, counts }))
}

/// `GET /v1/stats`: totals over all keys.
pub(crate) async fn stats(State(sandbox): State<Sandbox>) -> Json<KeyCounts> {
    Json(sandbox.lock().totals())
}

/// Answer of `GET /v1/admin/ledger`.
#[derive(Serialize)]
pub(crate) struct Ledger {
    keys: Vec<LedgerEntry>,
}

/// `GET /v1/admin/ledger`: every key with its counters and effect ids.
pub(crate) async fn ledger(State(sandbox): State<Sandbox>) -> Json<Ledger> {
    Json(Ledger {
        keys: sandbox.ledger(),
    })
}

/// `PUT /v1/admin/lookup-lag` with `{"seconds": f64}`: 204.
pub(crate) async fn set_lookup_lag(
    State(sandbox): State<Sandbox>,
    body: Result<Bytes, BytesRejection>,
) -> Result<StatusCode, ApiError> {
    let body = body_bytes(body)?;
    let parsed: LagBody = serde_json::from_slice(&body).map_err(|_| {
        ApiError::invalid_request("the body must be {\"seconds\": <non-negative number>}")
    })?;
    let lag = Duration::try_from_secs_f64(parsed.seconds).map_err(|_| {
        ApiError::invalid_request("`seconds` must be a finite, non-negative number")
    })?;
    sandbox.set_lookup_lag(lag);
    Ok(StatusCode::NO_CONTENT)
}

/// `GET /healthz`: `{"status":"ok"}`.
pub(crate) async fn healthz() -> Json<Value> {
    Json(json!({ "status": "ok" }))
}
