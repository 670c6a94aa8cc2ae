//! Opaque, stable idempotency keys derived from an intent with a server secret.
//!
//! The source article (step 1) suggests keeping the key an opaque identifier and the business
//! links in separate fields. A caller that only has a natural reference for its intent
//! (`alice@example.com/order-817/attempt-1`) asks the journal for a key instead of putting the
//! reference in it:
//!
//! ```text
//! key = "ok_" + base32_lower_nopad(HMAC-SHA256(secret, LP(CONTEXT) | LP(namespace) | LP(action_type) | LP(intent_reference)))
//! ```
//!
//! where `LP(x)` is the 4-byte big-endian length of `x` in bytes followed by its UTF-8 bytes (so
//! no two different triples share an input), `CONTEXT` is `opjournal/operation-key/v1`, and
//! base32 is RFC 4648's alphabet in lower case without padding (52 characters; its digits are
//! 2–7, so a key never looks like a card or phone number). The same secret gives the same key
//! for the same triple on every server and after every restart; without the secret the key
//! reveals nothing of the reference, and the reference is never stored or logged. Rotating
//! the secret changes every derived key, so it must not be rotated while retries of existing
//! intents may still come.

use hmac::{Hmac, KeyInit as _, Mac as _};
use sha2::Sha256;

use super::error::{FieldViolation, JournalError};
use super::model::{ActionType, Namespace, OperationKey};
use opjournal_reasons::ErrorReason;

/// Prefix of every derived key.
pub const DERIVED_KEY_PREFIX: &str = "ok_";
/// Shortest accepted secret, in bytes.
pub const MIN_SECRET_BYTES: usize = 32;
/// Longest accepted intent reference, in bytes of UTF-8.
pub const MAX_INTENT_REFERENCE_BYTES: usize = 1024;
/// Domain separation: the first input of every derivation, naming its purpose and version.
const CONTEXT: &str = "opjournal/operation-key/v1";

/// Derives opaque idempotency keys with a server secret. Its `Debug` output hides the secret.
#[derive(Clone)]
pub struct KeyDeriver {
    secret: Vec<u8>,
}

impl std::fmt::Debug for KeyDeriver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("KeyDeriver { secret: [redacted] }")
    }
}

/// A secret shorter than [`MIN_SECRET_BYTES`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("must be at least {MIN_SECRET_BYTES} bytes long")]
pub struct SecretTooShort;

impl KeyDeriver {
    /// A deriver keyed with `secret`.
    ///
    /// Errors: the secret is shorter than [`MIN_SECRET_BYTES`].
    pub fn new(secret: &[u8]) -> Result<Self, SecretTooShort> {
        if secret.len() < MIN_SECRET_BYTES {
            return Err(SecretTooShort);
        }
        Ok(Self {
            secret: secret.to_vec(),
        })
    }

    /// The key for (`namespace`, `action_type`, `intent_reference`).
    ///
    /// Errors: `INVALID_ARGUMENT`, reason `INVALID_FIELD_LENGTH`, when the intent reference is
    /// empty or longer than [`MAX_INTENT_REFERENCE_BYTES`].
    pub fn derive(
        &self,
        namespace: &Namespace,
        action_type: &ActionType,
        intent_reference: &str,
    ) -> Result<OperationKey, JournalError> {
        if intent_reference.is_empty() || intent_reference.len() > MAX_INTENT_REFERENCE_BYTES {
            return Err(JournalError::invalid(
                ErrorReason::InvalidFieldLength,
                FieldViolation::new(
                    "intent_reference",
                    format!("must be 1 to {MAX_INTENT_REFERENCE_BYTES} bytes long"),
                ),
            ));
        }
        let mut mac = <Hmac<Sha256>>::new_from_slice(&self.secret)
            .map_err(|_| JournalError::internal("HMAC rejected its key"))?;
        for part in [
            CONTEXT,
            namespace.as_str(),
            action_type.as_str(),
            intent_reference,
        ] {
            let length = u32::try_from(part.len())
                .map_err(|_| JournalError::internal("derivation input too long"))?;
            mac.update(&length.to_be_bytes());
            mac.update(part.as_bytes());
        }
        let digest = mac.finalize().into_bytes();
        OperationKey::parse(&format!("{DERIVED_KEY_PREFIX}{}", base32_lower(&digest)))
    }
}

/// RFC 4648 base32 in lower case, without padding.
fn base32_lower(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 32] = b"abcdefghijklmnopqrstuvwxyz234567";
    let mut out = String::with_capacity(bytes.len().div_ceil(5) * 8);
    let mut buffer = 0u32;
    let mut bits = 0u32;
    for &byte in bytes {
        buffer = (buffer << 8) | u32::from(byte);
        bits += 8;
        while bits >= 5 {
            bits -= 5;
            out.push(char::from(ALPHABET[((buffer >> bits) & 31) as usize]));
        }
    }
    if bits > 0 {
        out.push(char::from(ALPHABET[((buffer << (5 - bits)) & 31) as usize]));
    }
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn deriver(secret: &str) -> KeyDeriver {
        KeyDeriver::new(secret.as_bytes()).unwrap()
    }

    fn derive(d: &KeyDeriver, ns: &str, action: &str, reference: &str) -> String {
        d.derive(
            &Namespace::parse(ns).unwrap(),
            &ActionType::parse(action).unwrap(),
            reference,
        )
        .unwrap()
        .to_string()
    }

    const SECRET: &str = "0123456789abcdef0123456789abcdef";

    #[test]
    fn base32_matches_the_rfc_4648_vectors() {
        for (input, expected) in [
            ("", ""),
            ("f", "my"),
            ("fo", "mzxq"),
            ("foo", "mzxw6"),
            ("foob", "mzxw6yq"),
            ("fooba", "mzxw6ytb"),
            ("foobar", "mzxw6ytboi"),
        ] {
            assert_eq!(base32_lower(input.as_bytes()), expected, "{input}");
        }
    }

    #[test]
    fn the_key_is_the_documented_hmac() {
        // Computed independently:
        //   lp = lambda s: struct.pack('>I', len(s.encode())) + s.encode()
        //   msg = b''.join(map(lp, ['opjournal/operation-key/v1', 'default',
        //                           'create_payment', 'order-817']))
        //   d = hmac.new(SECRET.encode(), msg, hashlib.sha256).digest()
        //   'ok_' + base64.b32encode(d).decode().rstrip('=').lower()
        let key = derive(&deriver(SECRET), "default", "create_payment", "order-817");
        assert_eq!(
            key,
            "ok_yz4e66vfuvbh75aavszioigvi7j42zfg7pbzbyuwfvltwfa63y4a"
        );
    }

    #[test]
    fn the_same_intent_gets_the_same_key_and_any_change_another() {
        let d = deriver(SECRET);
        let key = derive(&d, "default", "create_payment", "alice@example.com/817");
        assert_eq!(
            key,
            derive(
                &deriver(SECRET),
                "default",
                "create_payment",
                "alice@example.com/817"
            )
        );
        assert!(key.starts_with("ok_") && key.len() == 3 + 52, "{key}");
        assert!(!key.contains("alice"));
        for other in [
            derive(&d, "tenant-b", "create_payment", "alice@example.com/817"),
            derive(&d, "default", "refund_payment", "alice@example.com/817"),
            derive(&d, "default", "create_payment", "alice@example.com/818"),
            derive(
                &deriver("another-secret-of-at-least-32-bytes"),
                "default",
                "create_payment",
                "alice@example.com/817",
            ),
        ] {
            assert_ne!(key, other);
        }
        // Length prefixes: moving a boundary between the parts changes the key.
        assert_ne!(
            derive(&d, "ab", "c", "d"),
            derive(&d, "a", "bc", "d"),
            "boundaries are part of the input"
        );
    }

    #[test]
    fn a_short_secret_and_a_bad_reference_are_refused() {
        assert_eq!(KeyDeriver::new(b"short").unwrap_err(), SecretTooShort);
        let d = deriver(SECRET);
        let ns = Namespace::parse("").unwrap();
        let action = ActionType::parse("create_payment").unwrap();
        assert!(d.derive(&ns, &action, "").is_err());
        assert!(d.derive(&ns, &action, &"x".repeat(1025)).is_err());
        assert!(d.derive(&ns, &action, &"x".repeat(1024)).is_ok());
        assert!(!format!("{d:?}").contains(SECRET));
    }
}
