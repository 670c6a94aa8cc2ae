//! Request limits: the sizes of payloads and results, the number of references, page sizes.

use std::collections::BTreeMap;

use crate::domain::canonical::{self, Limits};
use crate::domain::error::{ErrorReason, FieldViolation, JournalError};

/// Limits on request fields (sizes in bytes), set from the configuration.
#[derive(Debug, Clone)]
pub struct RequestLimits {
    /// Largest `payload_json`, in bytes.
    pub max_payload_bytes: usize,
    /// Largest `result_json`, in bytes.
    pub max_result_bytes: usize,
    /// Deepest JSON nesting.
    pub max_json_depth: usize,
    /// Most entries in `references`.
    pub max_references: usize,
    /// Largest page of `ListOperations` and `ListOperationsForReview`.
    pub max_page_size: u32,
}

impl Default for RequestLimits {
    fn default() -> Self {
        Self {
            max_payload_bytes: 256 * 1024,
            max_result_bytes: 64 * 1024,
            max_json_depth: 32,
            max_references: 16,
            max_page_size: 500,
        }
    }
}

/// Page of `ListOperations` when the request asks for none (or `max_page_size`, if smaller).
pub const DEFAULT_PAGE_SIZE: i64 = 50;
/// Largest page of `ListOperations` unless configured otherwise (`max_page_size`).
pub const MAX_PAGE_SIZE: i64 = 500;

impl RequestLimits {
    /// A result as a caller gives it in `field` ("" = none), parsed as strict I-JSON within
    /// `max_result_bytes` and `max_json_depth`.
    ///
    /// Errors: `INVALID_ARGUMENT`/`INVALID_RESULT`, naming the JSON Pointer of the offending
    /// place.
    pub(crate) fn result(
        &self,
        field: &'static str,
        text: &str,
    ) -> Result<Option<serde_json::Value>, JournalError> {
        if text.is_empty() {
            return Ok(None);
        }
        let limits = Limits {
            max_bytes: self.max_result_bytes,
            max_depth: self.max_json_depth,
        };
        let value = canonical::parse_strict(text, &limits)
            .map_err(|e| JournalError::invalid_json(field, ErrorReason::InvalidResult, &e))?;
        Ok(Some(value))
    }

    /// A page size of an operations list: 0 means [`DEFAULT_PAGE_SIZE`] (at most
    /// `max_page_size`), larger than `max_page_size` means `max_page_size`.
    ///
    /// Errors: `INVALID_ARGUMENT`/`INVALID_PAGE_SIZE` for a negative size.
    pub(crate) fn page_limit(&self, page_size: i32) -> Result<i64, JournalError> {
        let max = i64::from(self.max_page_size.max(1));
        page_limit(page_size, DEFAULT_PAGE_SIZE.min(max), max)
    }
}

/// A page size: 0 means `default`, larger than `max` means `max`, negative is refused.
///
/// Errors: `INVALID_ARGUMENT`/`INVALID_PAGE_SIZE`.
pub(crate) fn page_limit(page_size: i32, default: i64, max: i64) -> Result<i64, JournalError> {
    match page_size {
        n if n < 0 => Err(JournalError::invalid(
            ErrorReason::InvalidPageSize,
            FieldViolation::new("page_size", "must not be negative"),
        )),
        0 => Ok(default),
        n => Ok(i64::from(n).min(max)),
    }
}

pub(super) fn parse_references(
    references: impl IntoIterator<Item = (String, String)>,
    max: usize,
) -> Result<BTreeMap<String, String>, JournalError> {
    let invalid = |description: &str| {
        JournalError::invalid(
            ErrorReason::InvalidReferences,
            FieldViolation::new("references", description),
        )
    };
    let map: BTreeMap<String, String> = references.into_iter().collect();
    if map.len() > max {
        return Err(invalid(&format!("at most {max} entries")));
    }
    for (name, value) in &map {
        let name_ok = !name.is_empty()
            && name.len() <= 64
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
        if !name_ok {
            return Err(invalid(
                "names must be 1-64 characters of letters, digits, '_', '-' and '.'",
            ));
        }
        if value.chars().count() > 200 || value.chars().any(char::is_control) {
            return Err(invalid(
                "values must be at most 200 characters without control characters",
            ));
        }
    }
    Ok(map)
}
