//! E-mail endpoints: no idempotency, every accepted POST is a new e-mail.

use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, PathRejection};
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use crate::Sandbox;
use crate::error::{ApiError, body_bytes, parse_object, required_str};
use crate::fault::Fault;
use crate::payments::path_param;
use crate::store::Email;

/// Answer of `GET /v1/emails/by-reference/{reference}`.
#[derive(Serialize)]
struct EmailLookup {
    #[serde(flatten)]
    email: Email,
    /// Number of visible e-mails with this reference.
    count: u64,
}

/// `POST /v1/emails`: sends (stores) a new e-mail.
pub(crate) async fn send(
    State(sandbox): State<Sandbox>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    sandbox.lock().note_post();
    let body = body_bytes(body)?;
    let request = parse_object(&body)?;
    let reference = match request
        .get("external_reference")
        .and_then(serde_json::Value::as_str)
    {
        Some(reference) if !reference.is_empty() => reference.to_owned(),
        _ => {
            return Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                "external_reference_required",
                "`external_reference` is required and must be a non-empty string",
            ));
        }
    };
    sandbox.lock().note_key_request(&reference);

    required_str(&request, "to")?;
    required_str(&request, "subject")?;
    let fault = Fault::from_headers(&headers)?;

    Fault::before_store(
        fault,
        &sandbox,
        (
            StatusCode::UNPROCESSABLE_ENTITY,
            "recipient_rejected",
            "the recipient was rejected; nothing was sent (injected fault)",
        ),
    )
    .await?;

    // Stored before any await, so a client giving up cannot undo it.
    let email = sandbox.lock().send_email(&reference);
    if fault == Some(Fault::CommitThenTimeout) {
        sandbox.hang().await;
    }
    Ok((StatusCode::ACCEPTED, Json(email)).into_response())
}

/// `GET /v1/emails/by-reference/{reference}`: the first visible e-mail with
/// this reference plus `count`, or 404.
pub(crate) async fn by_reference(
    State(sandbox): State<Sandbox>,
    headers: HeaderMap,
    reference: Result<Path<String>, PathRejection>,
) -> Result<Response, ApiError> {
    let reference = path_param(reference)?;
    let found = {
        let mut store = sandbox.lock();
        crate::payments::note_traceparent(&mut store, &reference, &headers);
        store.email_by_reference(&reference)
    };
    Ok(match found {
        Some((email, count)) => Json(EmailLookup { email, count }).into_response(),
        None => ApiError::not_found("no e-mail with this external reference")
            .naming("external_reference", reference)
            .into_response(),
    })
}
