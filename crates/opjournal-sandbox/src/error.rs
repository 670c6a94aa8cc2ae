//! The sandbox's error answers: `{"error": "<snake_case_code>", "message": "<text>"}`.

use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;

/// An HTTP error answer: status, snake_case code and human message.
#[derive(Debug, thiserror::Error)]
#[error("{status} {code}: {message}")]
pub(crate) struct ApiError {
    /// HTTP status of the answer.
    pub status: StatusCode,
    /// Machine-readable snake_case code, the body's `error` member.
    pub code: &'static str,
    /// Human-readable explanation, the body's `message` member.
    pub message: String,
    /// One more member naming what the answer is about, e.g. `("idempotency_key", key)`.
    pub about: Option<(&'static str, String)>,
}

impl ApiError {
    /// An error with the given status, code and message.
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            code,
            message: message.into(),
            about: None,
        }
    }

    /// The same answer naming what it is about in the member `name` (a lookup's "not found"
    /// names the key it looked up, so a wrong route's answer cannot pass for it).
    pub fn naming(mut self, name: &'static str, value: String) -> Self {
        self.about = Some((name, value));
        self
    }

    /// 400 `invalid_request`.
    pub fn invalid_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_request", message)
    }

    /// 404 `not_found`: no such object.
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "not_found", message)
    }

    /// 404 `no_such_route`: the path names no endpoint (distinct from "no such object", so a
    /// wrong lookup URL is never mistaken for proof of absence).
    pub fn no_such_route() -> Self {
        Self::new(StatusCode::NOT_FOUND, "no_such_route", "no such route")
    }

    /// 503 `unavailable`, for the `fail-before-store` fault.
    pub fn unavailable() -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            "the provider is unavailable; nothing was stored (injected fault)",
        )
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut body = json!({ "error": self.code, "message": self.message });
        if let Some((name, value)) = self.about {
            body[name] = serde_json::Value::String(value);
        }
        (self.status, Json(body)).into_response()
    }
}

/// Unwraps a request body, turning axum's rejection (too large, unreadable)
/// into a JSON error: 413 `payload_too_large` or `invalid_request`.
pub(crate) fn body_bytes(body: Result<Bytes, BytesRejection>) -> Result<Bytes, ApiError> {
    body.map_err(|rejection| {
        let status = rejection.status();
        if status == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::new(status, "payload_too_large", "the request body is too large")
        } else {
            ApiError::new(
                status,
                "invalid_request",
                "the request body could not be read",
            )
        }
    })
}

/// Parses a request body as a JSON object, or answers 400 `invalid_request`.
/// The error message never quotes the body.
pub(crate) fn parse_object(body: &[u8]) -> Result<serde_json::Value, ApiError> {
    let value: serde_json::Value = serde_json::from_slice(body).map_err(|err| {
        ApiError::invalid_request(format!(
            "the body is not valid JSON (line {}, column {})",
            err.line(),
            err.column()
        ))
    })?;
    if value.is_object() {
        Ok(value)
    } else {
        Err(ApiError::invalid_request("the body must be a JSON object"))
    }
}

/// Reads a required, non-empty string member of a JSON object.
pub(crate) fn required_str<'a>(
    object: &'a serde_json::Value,
    member: &str,
) -> Result<&'a str, ApiError> {
    match object.get(member).and_then(serde_json::Value::as_str) {
        Some(s) if !s.is_empty() => Ok(s),
        _ => Err(ApiError::invalid_request(format!(
            "`{member}` is required and must be a non-empty string"
        ))),
    }
}
