//! Leases, fencing tokens and the Begin decision.
//!
//! A lease is a row state (`status = 'in_progress'`, `lease_until`, `lease_id`), never an open
//! transaction: nothing is held across the provider call. The database clock is the only
//! clock; every read carries `observed_at = now()` from the database.
//!
//! The fencing token names one grant: (namespace, key, attempt, random lease id). Each grant
//! increments `attempt_count`, so a holder whose lease was taken over presents an older
//! attempt and is refused (`LEASE_LOST`) however late its report arrives.
//!
//! Lease expiry is not permission to run again: the holder may have reached the provider
//! before it vanished. An expired lease is treated exactly like `unknown`. Only an action
//! whose provider deduplicates by our key (`on_timeout: retry_with_same_key`) may be claimed
//! again from `unknown` or an expired lease.
//!
//! A Begin whose answer is lost (a mesh retrying after `UNAVAILABLE`, a client deadline) is
//! sent again by the same caller. Without more, the repeat meets its own live lease and gets
//! `IN_PROGRESS`, and once the lease ends the operation needs verification although nobody
//! called the provider. So a caller may name each Begin intent with an [`AttemptId`]: a
//! repeat with the same id, key and request hash while that lease is live is answered with
//! the same lease again ([`decide`]'s `Reissue`). Only the id's SHA-256 is stored with the
//! lease, and the token is rebuilt from the row (attempt and lease id), so nothing new that
//! would let its holder report is kept in clear. A repeat after the lease ended gets the
//! lease back never: its first answer may have arrived after all.

use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use sha2::{Digest as _, Sha256};
use uuid::Uuid;

use super::error::{FieldViolation, JournalError};
use super::model::{Namespace, OperationKey};
use opjournal_reasons::ErrorReason;

/// Shortest lease the journal grants, in seconds.
pub const MIN_LEASE_SECONDS: u32 = 1;

/// Turns a requested lease length (seconds; 0 = the action's default) into the one granted:
/// 0 takes `default`, anything below [`MIN_LEASE_SECONDS`] takes the minimum, anything above
/// `max` takes `max`.
pub fn lease_duration(requested_seconds: i32, default: u32, max: u32) -> Duration {
    let seconds = match requested_seconds {
        0 => default,
        n if n < 0 => MIN_LEASE_SECONDS,
        n => n.unsigned_abs(),
    };
    Duration::from_secs(u64::from(
        seconds.clamp(MIN_LEASE_SECONDS, max.max(MIN_LEASE_SECONDS)),
    ))
}

/// The same, for `RenewLease`: 0 or less gets the minimum.
pub fn renewal_duration(requested_seconds: i32, max: u32) -> Duration {
    lease_duration(requested_seconds.max(-1), MIN_LEASE_SECONDS, max)
}

/// A fencing token: proves that its bearer holds (or last held) a given lease.
///
/// Wire form: unpadded base64url of `0x01 | attempt (u32 BE) | lease id (16 bytes) |
/// namespace length (u8) | namespace | key`. It is opaque to clients.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseToken {
    /// Namespace of the operation.
    pub namespace: Namespace,
    /// Idempotency key of the operation.
    pub operation_key: OperationKey,
    /// The attempt this lease was granted for.
    pub attempt: i32,
    /// The random id of this grant.
    pub lease_id: Uuid,
}

const TOKEN_VERSION: u8 = 1;

impl LeaseToken {
    /// Encodes the token for the wire.
    pub fn encode(&self) -> String {
        let ns = self.namespace.as_str().as_bytes();
        let mut bytes = Vec::with_capacity(22 + ns.len() + self.operation_key.as_str().len());
        bytes.push(TOKEN_VERSION);
        bytes.extend_from_slice(&self.attempt.to_be_bytes());
        bytes.extend_from_slice(self.lease_id.as_bytes());
        // Namespaces are at most 100 ASCII characters, so the length fits in one byte.
        bytes.push(u8::try_from(ns.len()).unwrap_or(u8::MAX));
        bytes.extend_from_slice(ns);
        bytes.extend_from_slice(self.operation_key.as_str().as_bytes());
        URL_SAFE_NO_PAD.encode(bytes)
    }

    /// Parses a token from the wire.
    ///
    /// Errors: `INVALID_ARGUMENT`, reason `INVALID_LEASE_TOKEN`, field `lease_token`.
    pub fn parse(text: &str) -> Result<Self, JournalError> {
        let invalid = || {
            JournalError::invalid(
                ErrorReason::InvalidLeaseToken,
                FieldViolation::new(
                    "lease_token",
                    "is not a lease token issued by BeginOperation",
                ),
            )
        };
        if text.is_empty() || text.len() > 2048 {
            return Err(invalid());
        }
        let bytes = URL_SAFE_NO_PAD.decode(text).map_err(|_| invalid())?;
        if bytes.len() < 22 || bytes[0] != TOKEN_VERSION {
            return Err(invalid());
        }
        let attempt = i32::from_be_bytes(bytes[1..5].try_into().map_err(|_| invalid())?);
        let lease_id = Uuid::from_slice(&bytes[5..21]).map_err(|_| invalid())?;
        let ns_len = usize::from(bytes[21]);
        let rest = &bytes[22..];
        if rest.len() <= ns_len || attempt < 1 {
            return Err(invalid());
        }
        let namespace = std::str::from_utf8(&rest[..ns_len]).map_err(|_| invalid())?;
        let key = std::str::from_utf8(&rest[ns_len..]).map_err(|_| invalid())?;
        Ok(Self {
            namespace: Namespace::parse(namespace).map_err(|_| invalid())?,
            operation_key: OperationKey::parse(key).map_err(|_| invalid())?,
            attempt,
            lease_id,
        })
    }
}

pub use super::transition::{BeginVerdict, decide};

/// The caller's name for one Begin intent (`BeginOperationRequest.attempt_id`): 16-64
/// characters of `[A-Za-z0-9_-]` that look random ([`MIN_ATTEMPT_ID_BITS`]), such as a UUID
/// v4 or 128 random bits in hex. A client draws a new one for each intent (each `execute`
/// call) and sends it again on its own transport retries of that Begin. Never logged, never
/// stored (only [`AttemptId::digest`]), never part of the request hash.
///
/// The id, the key and the request give back a live lease token, so a guessable id (sixteen
/// zeros, `test-attempt-1`) is refused rather than trusted.
#[derive(Clone, PartialEq, Eq)]
pub struct AttemptId(String);

/// Shortest attempt id, in characters: shorter ones are too easy to share by accident.
pub const MIN_ATTEMPT_ID_CHARS: usize = 16;
/// Longest attempt id, in characters.
pub const MAX_ATTEMPT_ID_CHARS: usize = 64;
/// Smallest estimated entropy of an attempt id, in bits (see [`attempt_id_entropy_bits`]).
///
/// A random UUID v4 or 32 random hex digits estimate at 90 bits or more (in 200,000 draws of
/// each, the lowest was 109 and 92), 192 random bits in base64url (32 characters) alike;
/// sixteen zeros estimate at 0, `0123456789abcdef` repeated at 17, a UUID of zeros at 18.
/// Shorter random ids carry too little to show it: 16 random bytes in base64url (22
/// characters) estimate at 72-100 and fall under 64 a few times in a billion.
pub const MIN_ATTEMPT_ID_BITS: f64 = 64.0;

/// The estimated entropy of an attempt id, in bits: the smaller of
/// - its length times the Shannon entropy of its character frequencies (bits per
///   character), which is low when few characters repeat (`0000…`, `abab…`), and
/// - the number of steps between successive characters times the Shannon entropy of the
///   frequencies of those steps (differences of the ASCII codes), which is low for runs and
///   simple sequences (`0123…`, `aabbcc…`).
///
/// Both are estimates from the id alone: they never exceed what the id could carry and
/// stay far above [`MIN_ATTEMPT_ID_BITS`] for ids drawn at random from 128 bits.
pub fn attempt_id_entropy_bits(id: &str) -> f64 {
    let bytes = id.as_bytes();
    let steps: Vec<i16> = bytes
        .windows(2)
        .map(|pair| i16::from(pair[1]) - i16::from(pair[0]))
        .collect();
    shannon_bits(bytes).min(shannon_bits(&steps))
}

/// `values.len()` times the Shannon entropy of the values' frequencies, in bits.
fn shannon_bits<T: Ord + Copy>(values: &[T]) -> f64 {
    let mut counts = std::collections::BTreeMap::<T, u32>::new();
    for value in values {
        *counts.entry(*value).or_default() += 1;
    }
    let total = f64::from(u32::try_from(values.len()).unwrap_or(u32::MAX));
    counts
        .values()
        .map(|&count| {
            let count = f64::from(count);
            -count * (count / total).log2()
        })
        .sum()
}

impl AttemptId {
    /// Parses the request field; an empty field means no attempt id (`None`).
    ///
    /// Errors: `INVALID_ARGUMENT`, reason `INVALID_ATTEMPT_ID`, field `attempt_id`, for a
    /// length outside 16-64, a character outside `[A-Za-z0-9_-]`, or an id that does not
    /// look random: estimated entropy ([`attempt_id_entropy_bits`]) under
    /// [`MIN_ATTEMPT_ID_BITS`] (the description says which).
    pub fn parse_optional(text: &str) -> Result<Option<Self>, JournalError> {
        if text.is_empty() {
            return Ok(None);
        }
        let well_formed = (MIN_ATTEMPT_ID_CHARS..=MAX_ATTEMPT_ID_CHARS).contains(&text.len())
            && text
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
        if !well_formed {
            return Err(Self::refused(
                "must be empty or 16-64 characters of [A-Za-z0-9_-], such as a random UUID",
            ));
        }
        if attempt_id_entropy_bits(text) < MIN_ATTEMPT_ID_BITS {
            return Err(Self::refused(
                "does not look random (too few distinct characters, a run or a simple \
                 sequence: estimated entropy under 64 bits); draw a random UUID v4 or 128 \
                 random bits in hex for each intent",
            ));
        }
        Ok(Some(Self(text.to_owned())))
    }

    fn refused(description: &'static str) -> JournalError {
        JournalError::invalid(
            ErrorReason::InvalidAttemptId,
            FieldViolation::new("attempt_id", description),
        )
    }

    /// The SHA-256 of the id: what the journal keeps with the lease it was granted for.
    pub fn digest(&self) -> AttemptDigest {
        AttemptDigest(Sha256::digest(self.0.as_bytes()).into())
    }
}

impl std::fmt::Debug for AttemptId {
    /// Never shows the id: with the key and the request it gives the lease back.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AttemptId(<redacted>)")
    }
}

/// SHA-256 of an [`AttemptId`], as stored with the lease granted to it
/// (`agent_operations.lease_attempt_sha256`, 64 lowercase hex digits).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttemptDigest([u8; 32]);

impl AttemptDigest {
    /// Lowercase hex, 64 characters.
    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }

    /// Parses 64 hex digits; `None` for anything else.
    pub fn from_hex(text: &str) -> Option<Self> {
        let mut bytes = [0u8; 32];
        hex::decode_to_slice(text, &mut bytes).ok()?;
        Some(Self(bytes))
    }
}

/// A lease token as the commands of a lease holder's calls take it (`journal::Complete::new`,
/// ...): already parsed, or as the text a client sent.
pub trait AsLeaseToken {
    /// The token, parsed if needed.
    ///
    /// Errors: `INVALID_ARGUMENT`/`INVALID_LEASE_TOKEN` when the text is not a token.
    fn as_lease_token(&self) -> Result<std::borrow::Cow<'_, LeaseToken>, JournalError>;
}

impl AsLeaseToken for LeaseToken {
    fn as_lease_token(&self) -> Result<std::borrow::Cow<'_, LeaseToken>, JournalError> {
        Ok(std::borrow::Cow::Borrowed(self))
    }
}

impl AsLeaseToken for str {
    fn as_lease_token(&self) -> Result<std::borrow::Cow<'_, LeaseToken>, JournalError> {
        LeaseToken::parse(self).map(std::borrow::Cow::Owned)
    }
}

impl AsLeaseToken for String {
    fn as_lease_token(&self) -> Result<std::borrow::Cow<'_, LeaseToken>, JournalError> {
        self.as_str().as_lease_token()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::canonical::RequestHash;
    use crate::model::{ActionType, OperationRecord, Status};
    use chrono::{TimeDelta, Utc};

    fn row(status: Status, lease_secs: Option<i64>) -> OperationRecord {
        let now = Utc::now();
        OperationRecord {
            namespace: Namespace::parse("").unwrap(),
            operation_key: OperationKey::parse("payment:order-817:intent-01").unwrap(),
            action_type: ActionType::parse("create_payment").unwrap(),
            request_hash: RequestHash::from_hex(&"a".repeat(64)).unwrap(),
            status,
            attempt_count: 1,
            lease_id: Some(Uuid::new_v4()),
            lease_until: lease_secs.map(|s| now + TimeDelta::seconds(s)),
            lease_attempt: None,
            external_id: None,
            result_json: None,
            error_code: None,
            references: Default::default(),
            unknown_since: None,
            next_check_at: None,
            reconcile_attempts: 0,
            review_required_at: None,
            review_reason: None,
            last_actor_kind: crate::model::ActorKind::Client,
            action_policy: None,
            trace_context: None,
            created_at: now,
            updated_at: now,
            observed_at: now,
        }
    }

    fn verdict(r: &OperationRecord, dedup: bool) -> BeginVerdict {
        decide(
            r,
            &r.action_type.clone(),
            &r.request_hash.clone(),
            None,
            dedup,
        )
    }

    #[test]
    fn another_hash_or_action_type_is_a_conflict_in_every_status() {
        for status in [
            Status::Pending,
            Status::InProgress,
            Status::Unknown,
            Status::Succeeded,
            Status::FailedFinal,
        ] {
            let r = row(status, Some(30));
            let other = RequestHash::from_hex(&"b".repeat(64)).unwrap();
            assert_eq!(
                decide(&r, &r.action_type, &other, None, true),
                BeginVerdict::Conflict
            );
            let action = ActionType::parse("send_email").unwrap();
            assert_eq!(
                decide(&r, &action, &r.request_hash, None, true),
                BeginVerdict::Conflict
            );
        }
    }

    #[test]
    fn an_expired_lease_requires_verification_unless_the_provider_deduplicates() {
        let r = row(Status::InProgress, Some(-1));
        assert_eq!(verdict(&r, false), BeginVerdict::VerificationRequired);
        assert!(matches!(verdict(&r, true), BeginVerdict::Claim { .. }));
    }

    #[test]
    fn an_operation_under_review_is_never_reclaimed_even_when_the_provider_deduplicates() {
        let mut r = row(Status::Unknown, None);
        r.review_required_at = Some(Utc::now());
        assert_eq!(verdict(&r, true), BeginVerdict::VerificationRequired);
    }

    #[test]
    fn a_live_lease_answers_in_progress_with_the_time_left() {
        let r = row(Status::InProgress, Some(30));
        match verdict(&r, true) {
            BeginVerdict::InProgress(left) => assert!(left.as_secs() >= 29),
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn terminal_rows_replay_and_pending_rows_are_claimed() {
        assert_eq!(
            verdict(&row(Status::Succeeded, None), false),
            BeginVerdict::Replay
        );
        assert_eq!(
            verdict(&row(Status::FailedFinal, None), true),
            BeginVerdict::Replay
        );
        assert_eq!(
            verdict(&row(Status::Pending, None), false),
            BeginVerdict::Claim {
                expected_status: Status::Pending,
                expected_attempt: 1
            }
        );
        assert_eq!(
            verdict(&row(Status::Unknown, None), false),
            BeginVerdict::VerificationRequired
        );
    }

    #[test]
    fn lease_lengths_are_clamped() {
        assert_eq!(lease_duration(0, 30, 3600).as_secs(), 30);
        assert_eq!(lease_duration(-5, 30, 3600).as_secs(), 1);
        assert_eq!(lease_duration(7, 30, 3600).as_secs(), 7);
        assert_eq!(lease_duration(100_000, 30, 3600).as_secs(), 3600);
        assert_eq!(renewal_duration(0, 3600).as_secs(), 1);
        assert_eq!(renewal_duration(-3, 3600).as_secs(), 1);
    }

    #[test]
    fn attempt_ids_are_optional_and_well_formed_or_refused() {
        assert_eq!(AttemptId::parse_optional("").unwrap(), None);
        for good in [
            "0f8fad5b-d9cb-469f-a165-70867728950e",
            "7c9e667974250de944be07fc1f90ae7",
            "q3Zr8-Xv1LkP_0aTmWc2Yd9HsJfN4uBe",
            "AAECAwQFBgcICQoLDA0ODw",
        ] {
            assert!(AttemptId::parse_optional(good).unwrap().is_some(), "{good}");
        }
        for bad in [
            // Well formed, but one repeated letter.
            &"a".repeat(MIN_ATTEMPT_ID_CHARS),
            &"Z".repeat(MAX_ATTEMPT_ID_CHARS),
            "short",
            &"a".repeat(MIN_ATTEMPT_ID_CHARS - 1),
            &"a".repeat(MAX_ATTEMPT_ID_CHARS + 1),
            "0f8fad5b d9cb 469f a165 70867728950e",
            "0f8fad5b/d9cb/469f/a165/70867728950e",
            "ünïcödé-ünïcödé-ünïcödé",
        ] {
            let error = AttemptId::parse_optional(bad).unwrap_err();
            assert_eq!(error.reason(), ErrorReason::InvalidAttemptId, "{bad}");
        }
    }

    #[test]
    fn an_attempt_id_is_kept_only_as_its_sha256_and_never_shown() {
        let id = AttemptId::parse_optional("0f8fad5b-d9cb-469f-a165-70867728950e")
            .unwrap()
            .unwrap();
        // printf '%s' 0f8fad5b-d9cb-469f-a165-70867728950e | sha256sum
        let digest = id.digest().to_hex();
        assert_eq!(
            digest,
            "c812e1edb64417d6090dcfbaf16c21cd8e8665c04396e1edb472fecfb2797c6a"
        );
        assert_eq!(AttemptDigest::from_hex(&digest), Some(id.digest()));
        assert!(!format!("{id:?}").contains("0f8fad5b"));
        assert!(AttemptDigest::from_hex("not hex").is_none());
    }

    #[test]
    fn tokens_round_trip_and_garbage_is_refused() {
        let token = LeaseToken {
            namespace: Namespace::parse("tenant-a").unwrap(),
            operation_key: OperationKey::parse("payment:order-817:intent-01").unwrap(),
            attempt: 3,
            lease_id: Uuid::new_v4(),
        };
        assert_eq!(LeaseToken::parse(&token.encode()).unwrap(), token);
        for bad in ["", "not a token", "AAAA", &"A".repeat(5000)] {
            assert!(LeaseToken::parse(bad).is_err(), "{bad}");
        }
    }

    fn refusal(text: &str) -> Option<String> {
        match AttemptId::parse_optional(text) {
            Ok(_) => None,
            Err(JournalError::InvalidArgument {
                reason, violation, ..
            }) => {
                assert_eq!(reason, ErrorReason::InvalidAttemptId);
                assert_eq!(violation.field, "attempt_id");
                Some(violation.description)
            }
            Err(other) => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn ids_that_do_not_look_random_are_refused_with_the_reason() {
        for guessable in [
            "0000000000000000",
            "00000000-0000-0000-0000-000000000000",
            "0123456789abcdef0123456789abcdef",
            "abababababababababababab",
            "aabbccddeeff00112233445566778899",
            "11111111-2222-3333-4444-555555555555",
            "test-attempt-id-0001",
            "my-attempt-1234567890",
        ] {
            let description = refusal(guessable).unwrap_or_else(|| panic!("{guessable}"));
            assert!(
                description.contains("does not look random"),
                "{description}"
            );
            assert!(!description.contains(guessable));
        }
        assert!(refusal("short").unwrap().contains("16-64 characters"));
    }

    #[test]
    fn every_id_a_client_draws_is_accepted() {
        // The clients draw a UUID v4 (Rust, Python, TypeScript) or 128 random bits in hex
        // (Go); the doc of `MIN_ATTEMPT_ID_BITS` quotes the lowest estimates of a million.
        for _ in 0..20_000 {
            let uuid = Uuid::new_v4();
            for id in [uuid.to_string(), uuid.simple().to_string()] {
                assert!(
                    attempt_id_entropy_bits(&id) >= MIN_ATTEMPT_ID_BITS + 20.0,
                    "{id}"
                );
                assert!(refusal(&id).is_none(), "{id}");
            }
        }
        assert!(refusal(&URL_SAFE_NO_PAD.encode(b"0123456789abcdef:random")).is_none());
    }

    #[test]
    fn the_estimate_never_exceeds_what_the_characters_could_carry() {
        assert_eq!(attempt_id_entropy_bits("0000000000000000"), 0.0);
        // 16 distinct characters carry 4 bits each at most, but 15 equal steps carry nothing.
        assert_eq!(attempt_id_entropy_bits("ABCDEFGHIJKLMNOP"), 0.0);
        let id = "7c9e6679-7425-40de-944b-e07fc1f90ae7";
        assert!(attempt_id_entropy_bits(id) <= 6.0 * 36.0);
    }
}
