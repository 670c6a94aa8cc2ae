//! Page tokens: an opaque keyset position bound to the filters it was made for.

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use chrono::{DateTime, Utc};

use crate::domain::error::{ErrorReason, FieldViolation, JournalError};
use crate::domain::model::OperationKey;

/// An opaque keyset position bound to the filters it was made for.
pub(crate) struct PageToken;

impl PageToken {
    fn fingerprint(filters: &str) -> String {
        use sha2::Digest as _;
        hex::encode(&sha2::Sha256::digest(filters.as_bytes())[..8])
    }

    /// A token for the (time, key) position of a keyset ordered by time and key.
    pub(crate) fn encode(created_at: DateTime<Utc>, key: &str, filters: &str) -> String {
        Self::encode_position(created_at.timestamp_micros(), key, filters)
    }

    /// Reads a token made by [`PageToken::encode`] for the same filters.
    pub(crate) fn decode(
        token: &str,
        filters: &str,
    ) -> Result<(DateTime<Utc>, String), JournalError> {
        let (micros, key) = Self::decode_position(token, filters)?;
        let created_at =
            DateTime::<Utc>::from_timestamp_micros(micros).ok_or_else(Self::invalid)?;
        Ok((created_at, key))
    }

    /// A token for a position given by a number (such as an event id) and a key (may be empty).
    pub(crate) fn encode_position(position: i64, key: &str, filters: &str) -> String {
        let body = serde_json::json!({
            "c": position,
            "k": key,
            "f": Self::fingerprint(filters),
        });
        URL_SAFE_NO_PAD.encode(body.to_string())
    }

    fn invalid() -> JournalError {
        JournalError::invalid(
            ErrorReason::InvalidPageToken,
            FieldViolation::new(
                "page_token",
                "is not a next_page_token of a call with the same filters",
            ),
        )
    }

    /// Reads a token made by [`PageToken::encode_position`] for the same filters.
    pub(crate) fn decode_position(
        token: &str,
        filters: &str,
    ) -> Result<(i64, String), JournalError> {
        let invalid = Self::invalid;
        let bytes = URL_SAFE_NO_PAD.decode(token).map_err(|_| invalid())?;
        let body: serde_json::Value = serde_json::from_slice(&bytes).map_err(|_| invalid())?;
        if body.get("f").and_then(serde_json::Value::as_str) != Some(&Self::fingerprint(filters)) {
            return Err(invalid());
        }
        let position = body
            .get("c")
            .and_then(serde_json::Value::as_i64)
            .ok_or_else(invalid)?;
        let key = body
            .get("k")
            .and_then(serde_json::Value::as_str)
            .ok_or_else(invalid)?;
        if !key.is_empty() && OperationKey::parse(key).is_err() {
            return Err(invalid());
        }
        Ok((position, key.to_owned()))
    }
}
