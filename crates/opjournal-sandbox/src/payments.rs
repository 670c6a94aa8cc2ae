//! Payment endpoints: idempotency by the `Idempotency-Key` header.

use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, PathRejection};
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

use crate::error::{ApiError, body_bytes, parse_object, required_str};
use crate::fault::Fault;
use crate::store::PaymentOutcome;
use crate::{Defect, Sandbox};

/// Name of the idempotency header.
const IDEMPOTENCY_KEY: &str = "idempotency-key";

/// Remembers the `traceparent` of a lookup of `key` (see [`Sandbox::lookup_traceparents`]).
pub(crate) fn note_traceparent(store: &mut crate::store::Store, key: &str, headers: &HeaderMap) {
    if let Some(value) = headers.get("traceparent").and_then(|v| v.to_str().ok()) {
        store.note_lookup_traceparent(key, value);
    }
}

/// Reads a percent-decoded path parameter, or answers 400 `invalid_request`.
pub(crate) fn path_param(path: Result<Path<String>, PathRejection>) -> Result<String, ApiError> {
    path.map(|Path(value)| value)
        .map_err(|_| ApiError::invalid_request("the path parameter is not valid UTF-8"))
}

fn idempotency_key(headers: &HeaderMap) -> Result<String, ApiError> {
    match headers.get(IDEMPOTENCY_KEY).map(HeaderValue::to_str) {
        Some(Ok(key)) if !key.trim().is_empty() => Ok(key.to_owned()),
        _ => Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "idempotency_key_required",
            "the Idempotency-Key header is required (non-empty, printable ASCII)",
        )),
    }
}

/// `POST /v1/payments`: creates, replays or refuses a payment.
pub(crate) async fn create(
    State(sandbox): State<Sandbox>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    sandbox.lock().note_post();
    let key = idempotency_key(&headers)?;
    sandbox.lock().note_key_request(&key);

    let body = body_bytes(body)?;
    let request = parse_object(&body)?;
    let amount_minor = request
        .get("amount_minor")
        .and_then(serde_json::Value::as_u64)
        .filter(|amount| *amount > 0)
        .ok_or_else(|| {
            ApiError::invalid_request("`amount_minor` is required and must be an integer > 0")
        })?;
    let currency = required_str(&request, "currency")?.to_owned();
    let fault = Fault::from_headers(&headers)?;

    Fault::before_store(
        fault,
        &sandbox,
        (
            StatusCode::PAYMENT_REQUIRED,
            "card_declined",
            "the card was declined; nothing was charged (injected fault)",
        ),
    )
    .await?;

    // Stored synchronously, before any await: a client that gives up while
    // the answer stalls cannot undo the effect.
    let twice = sandbox.defect() == Some(Defect::StorePaymentsTwice);
    let outcome = sandbox
        .lock()
        .create_payment(&key, request, amount_minor, currency, twice);
    if fault == Some(Fault::CommitThenTimeout) {
        sandbox.hang().await;
    }

    match outcome {
        PaymentOutcome::Created(payment) => {
            Ok((StatusCode::CREATED, Json(payment)).into_response())
        }
        PaymentOutcome::Replayed(payment) => Ok((
            StatusCode::OK,
            [("idempotent-replayed", "true")],
            Json(payment),
        )
            .into_response()),
        PaymentOutcome::KeyReused => Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "idempotency_key_reused",
            "this Idempotency-Key was already used with a different request body",
        )),
    }
}

/// `GET /v1/payments/by-idempotency-key/{key}`: the payment, or 404 when
/// unknown or not yet visible (lookup lag).
pub(crate) async fn by_key(
    State(sandbox): State<Sandbox>,
    headers: HeaderMap,
    key: Result<Path<String>, PathRejection>,
) -> Result<Response, ApiError> {
    let key = path_param(key)?;
    let found = {
        let mut store = sandbox.lock();
        note_traceparent(&mut store, &key, &headers);
        store.payment_by_key(&key)
    };
    Ok(match found {
        Some(payment) => Json(payment).into_response(),
        None => ApiError::not_found("no payment with this idempotency key")
            .naming("idempotency_key", key)
            .into_response(),
    })
}

/// `GET /v1/payments/{id}`: the payment, or 404 when unknown or not yet
/// visible (lookup lag).
pub(crate) async fn by_id(
    State(sandbox): State<Sandbox>,
    id: Result<Path<String>, PathRejection>,
) -> Result<Response, ApiError> {
    let id = path_param(id)?;
    let found = sandbox.lock().payment_by_id(&id);
    found
        .map(|payment| Json(payment).into_response())
        .ok_or_else(|| ApiError::not_found("no payment with this id"))
}
