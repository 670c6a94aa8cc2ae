//! Result sanitizing: what of a result may enter the journal.
//!
//! A stored result is replayed to every later Begin with the same key and kept for the whole
//! retention period, so it must be the article's "cleaned result" (step 3): no secrets, no full
//! card data, no more personal data than the caller needs to replay. One mechanism applies to
//! every result that enters the journal, whoever reports it — the lease holder
//! (`CompleteOperation`), a provider adapter (http or grpc) or a reviewer (`ResolveOperation`):
//!
//! 1. **Deny-list.** Members whose name is on the deny-list are removed at any depth, in
//!    objects nested in objects and arrays alike. Names are compared case-insensitively,
//!    ignoring `_` and `-`, so `card_number`, `cardNumber` and `CARD-NUMBER` are one name. The
//!    list is [`BUILTIN_DENY_FIELDS`] plus the policy's `defaults.result_deny_fields`; the
//!    built-in names cannot be switched off. This runs first, so nothing under a denied
//!    member can be kept by a pointer either.
//! 2. **Keep.** With the action's `result.keep` (JSON Pointers, RFC 6901), the stored result
//!    is an object holding only those fields, each under its pointer's last segment
//!    (`/card/last4` is stored as `last4`); pointers that find nothing are left out. An empty
//!    list stores no result at all. Without `result.keep` the whole (deny-listed) result is
//!    stored.
//! 3. **Size.** The stored canonical (RFC 8785) text may be at most `result.max_bytes`.
//!
//! Payloads are never stored at all: only their hash.

use std::collections::HashSet;
use std::sync::LazyLock;

use serde_json::{Map, Value};

use super::canonical::{self, Limits};
use super::error::{FieldViolation, JournalError};
use opjournal_reasons::ErrorReason;

/// Field names removed from every result at any depth, whatever the policy says.
pub const BUILTIN_DENY_FIELDS: &[&str] = &[
    "card_number",
    "pan",
    "primary_account_number",
    "cvv",
    "cvv2",
    "cvc",
    "cvc2",
    "security_code",
    "card_security_code",
    "track_data",
    "track1",
    "track2",
    "pin",
    "pin_block",
    "token",
    "access_token",
    "refresh_token",
    "id_token",
    "auth_token",
    "session_token",
    "bearer_token",
    "api_token",
    "password",
    "passwd",
    "passphrase",
    "secret",
    "client_secret",
    "api_secret",
    "secret_key",
    "private_key",
    "api_key",
    "authorization",
    "cookie",
    "set_cookie",
    "otp",
];

/// Default largest stored result, in bytes of canonical JSON.
pub const DEFAULT_RESULT_MAX_BYTES: usize = 64 * 1024;

/// A field name as compared with the deny-list: lower case, without `_` and `-`.
pub fn normalize_field_name(name: &str) -> String {
    name.chars()
        .filter(|c| !matches!(c, '_' | '-'))
        .flat_map(char::to_lowercase)
        .collect()
}

static BUILTIN: LazyLock<HashSet<String>> = LazyLock::new(|| {
    BUILTIN_DENY_FIELDS
        .iter()
        .map(|n| normalize_field_name(n))
        .collect()
});

/// The name a kept field is stored under: the pointer's last segment, unescaped
/// (`~1` is `/`, `~0` is `~`).
pub fn kept_field_name(pointer: &str) -> String {
    pointer
        .rsplit('/')
        .next()
        .unwrap_or(pointer)
        .replace("~1", "/")
        .replace("~0", "~")
}

/// The rules for the results of one action.
#[derive(Debug, Clone, Copy)]
pub struct ResultRules<'a> {
    /// JSON Pointers of the fields to keep; `None` keeps the whole result.
    pub keep: Option<&'a [String]>,
    /// Field names denied on top of [`BUILTIN_DENY_FIELDS`].
    pub deny: &'a [String],
    /// Largest stored result, in bytes of canonical JSON.
    pub max_bytes: usize,
}

impl Default for ResultRules<'_> {
    fn default() -> Self {
        Self {
            keep: None,
            deny: &[],
            max_bytes: DEFAULT_RESULT_MAX_BYTES,
        }
    }
}

/// A sanitized result larger than the action's `result.max_bytes`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the sanitized result is larger than {max_bytes} bytes")]
pub struct ResultTooLarge {
    /// The limit, in bytes.
    pub max_bytes: usize,
}

impl ResultTooLarge {
    /// `INVALID_ARGUMENT`, reason `RESULT_TOO_LARGE`, on `field`, with metadata `max_bytes`.
    pub fn into_error(self, field: &'static str) -> JournalError {
        JournalError::InvalidArgument {
            reason: ErrorReason::ResultTooLarge,
            violation: FieldViolation::new(
                field,
                format!(
                    "the result to store is larger than {} bytes after sanitizing; \
                     keep fewer fields",
                    self.max_bytes
                ),
            ),
            metadata: [("max_bytes".to_owned(), self.max_bytes.to_string())].into(),
        }
    }
}

/// Why a reported result text could not be sanitized.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SanitizeError {
    /// The text is not strict JSON.
    #[error("the result is not strict JSON")]
    Invalid,
    /// Too large after sanitizing.
    #[error(transparent)]
    TooLarge(#[from] ResultTooLarge),
}

impl ResultRules<'_> {
    /// Whether a member named `name` is removed.
    pub fn is_denied(&self, name: &str) -> bool {
        let name = normalize_field_name(name);
        BUILTIN.contains(&name) || self.deny.iter().any(|d| normalize_field_name(d) == name)
    }

    /// The canonical text to store for `value`, or `None` when nothing is kept.
    ///
    /// Errors: the stored text would be larger than `max_bytes`.
    pub fn sanitize(&self, mut value: Value) -> Result<Option<String>, ResultTooLarge> {
        self.remove_denied(&mut value);
        let stored = match self.keep {
            None => value,
            Some([]) => return Ok(None),
            Some(pointers) => keep_fields(&value, pointers),
        };
        let text = canonical::canonicalize(&stored);
        if text.len() > self.max_bytes {
            return Err(ResultTooLarge {
                max_bytes: self.max_bytes,
            });
        }
        Ok(Some(text))
    }

    /// [`ResultRules::sanitize`] for a result reported as JSON text (at most 1 MiB, nested at
    /// most 128 deep: what `serde_json` and the configurable request limits ever let through).
    ///
    /// Errors: the text is not strict JSON, or the stored text would be too large.
    pub fn sanitize_text(&self, text: &str) -> Result<Option<String>, SanitizeError> {
        let limits = Limits {
            max_bytes: canonical::MAX_BYTES,
            max_depth: 128,
        };
        let value = canonical::parse_strict(text, &limits).map_err(|_| SanitizeError::Invalid)?;
        Ok(self.sanitize(value)?)
    }

    fn remove_denied(&self, value: &mut Value) {
        match value {
            Value::Object(members) => {
                members.retain(|name, _| !self.is_denied(name));
                for member in members.values_mut() {
                    self.remove_denied(member);
                }
            }
            Value::Array(items) => {
                for item in items {
                    self.remove_denied(item);
                }
            }
            _ => {}
        }
    }
}

/// An object of the fields at `pointers`, each under its pointer's last segment; pointers
/// that find nothing are left out.
pub fn keep_fields(value: &Value, pointers: &[String]) -> Value {
    let kept: Map<String, Value> = pointers
        .iter()
        .filter_map(|pointer| {
            value
                .pointer(pointer)
                .map(|v| (kept_field_name(pointer), v.clone()))
        })
        .collect();
    Value::Object(kept)
}

/// Why a keep list (`result.keep`, an http adapter's `response.keep_fields`) is refused; the
/// message names the pointer or the stored field at fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeepError {
    /// An entry that does not start with `/`.
    #[error("'{pointer}' is not a JSON Pointer (must start with '/')")]
    NotAPointer {
        /// The entry, as written.
        pointer: String,
    },
    /// A pointer whose last segment is empty, so the kept value would have no field name.
    #[error("'{pointer}' must end in a field name")]
    NoFieldName {
        /// The pointer, as written.
        pointer: String,
    },
    /// Two pointers with one last segment, whose values would be stored under one name.
    #[error(
        "two pointers would both be stored as '{name}' (the last segment names the stored field)"
    )]
    SameFieldName {
        /// The stored field's name both pointers end in.
        name: String,
    },
}

/// Checks a keep list: JSON Pointers with a non-empty last segment, no two stored under the
/// same name.
///
/// Errors: the first entry at fault, and why.
pub fn validate_keep(pointers: &[String]) -> Result<(), KeepError> {
    let mut names = HashSet::new();
    for pointer in pointers {
        if !pointer.starts_with('/') {
            return Err(KeepError::NotAPointer {
                pointer: pointer.clone(),
            });
        }
        let name = kept_field_name(pointer);
        if name.is_empty() {
            return Err(KeepError::NoFieldName {
                pointer: pointer.clone(),
            });
        }
        if !names.insert(name.clone()) {
            return Err(KeepError::SameFieldName { name });
        }
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    fn provider_payment() -> Value {
        json!({
            "id": "pay_1",
            "status": "succeeded",
            "amount_minor": 490000,
            "card_number": "4111111111111111",
            "CVV": "123",
            "access-token": "at_secret",
            "card": {"brand": "visa", "last4": "1111", "cvc": "123", "Card_Number": "4111111111111111"},
            "attempts": [{"id": 1, "token": "t1"}, {"id": 2, "password": "p"}]
        })
    }

    #[test]
    fn denied_names_go_at_any_depth_whatever_their_spelling() {
        let rules = ResultRules::default();
        let stored = rules.sanitize(provider_payment()).unwrap().unwrap();
        let value: Value = serde_json::from_str(&stored).unwrap();
        assert_eq!(
            value,
            json!({
                "id": "pay_1",
                "status": "succeeded",
                "amount_minor": 490000,
                "card": {"brand": "visa", "last4": "1111"},
                "attempts": [{"id": 1}, {"id": 2}]
            })
        );
        for secret in ["4111111111111111", "123\"", "at_secret", "t1", "\"p\""] {
            assert!(!stored.contains(secret), "{secret} in {stored}");
        }
    }

    #[test]
    fn only_kept_fields_are_stored_and_the_deny_list_applies_inside_them() {
        let keep = vec![
            "/id".to_owned(),
            "/status".to_owned(),
            "/card".to_owned(),
            "/card_number".to_owned(),
            "/missing".to_owned(),
        ];
        let rules = ResultRules {
            keep: Some(&keep),
            ..ResultRules::default()
        };
        let stored = rules.sanitize(provider_payment()).unwrap().unwrap();
        assert_eq!(
            stored,
            r#"{"card":{"brand":"visa","last4":"1111"},"id":"pay_1","status":"succeeded"}"#
        );
    }

    #[test]
    fn a_kept_field_is_stored_under_its_last_segment() {
        let keep = vec!["/card/last4".to_owned(), "/a~1b".to_owned()];
        let rules = ResultRules {
            keep: Some(&keep),
            ..ResultRules::default()
        };
        let stored = rules
            .sanitize(json!({"card": {"last4": "1111"}, "a/b": 1}))
            .unwrap();
        assert_eq!(stored.as_deref(), Some(r#"{"a/b":1,"last4":"1111"}"#));
    }

    #[test]
    fn an_empty_keep_list_stores_nothing_and_the_policy_can_deny_more() {
        let rules = ResultRules {
            keep: Some(&[]),
            ..ResultRules::default()
        };
        assert_eq!(rules.sanitize(json!({"id": 1})).unwrap(), None);
        let deny = vec!["Customer-Email".to_owned()];
        let rules = ResultRules {
            deny: &deny,
            ..ResultRules::default()
        };
        assert_eq!(
            rules
                .sanitize(json!({"id": 1, "customer_email": "a@b.example"}))
                .unwrap()
                .as_deref(),
            Some(r#"{"id":1}"#)
        );
        assert!(rules.is_denied("CARDNUMBER"));
    }

    #[test]
    fn a_result_over_the_limit_is_refused_after_sanitizing() {
        let rules = ResultRules {
            max_bytes: 20,
            ..ResultRules::default()
        };
        let big = json!({"id": "pay_1", "note": "x".repeat(50)});
        assert_eq!(
            rules.sanitize(big).unwrap_err(),
            ResultTooLarge { max_bytes: 20 }
        );
        // The denied part does not count.
        let secret = json!({"id": "pay_1", "password": "x".repeat(50)});
        assert!(rules.sanitize(secret).is_ok());
        assert_eq!(
            rules.sanitize_text("{\"a\":1,\"a\":2}"),
            Err(SanitizeError::Invalid)
        );
    }

    #[test]
    fn keep_lists_are_checked() {
        assert!(validate_keep(&["/id".into(), "/card/last4".into()]).is_ok());
        assert!(validate_keep(&["id".into()]).is_err());
        assert!(validate_keep(&["/".into()]).is_err());
        assert!(validate_keep(&["/a/id".into(), "/b/id".into()]).is_err());
    }
}
