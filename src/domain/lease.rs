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

use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use uuid::Uuid;

use super::error::{FieldViolation, JournalError};
use super::model::{Namespace, OperationKey};
use opjournal_client::ErrorReason;

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
    use crate::domain::canonical::RequestHash;
    use crate::domain::model::{ActionType, OperationRecord, Status};
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
            external_id: None,
            result_json: None,
            error_code: None,
            references: Default::default(),
            unknown_since: None,
            next_check_at: None,
            reconcile_attempts: 0,
            review_required_at: None,
            review_reason: None,
            last_actor_kind: crate::domain::model::ActorKind::Client,
            action_policy: None,
            trace_context: None,
            created_at: now,
            updated_at: now,
            observed_at: now,
        }
    }

    fn verdict(r: &OperationRecord, dedup: bool) -> BeginVerdict {
        decide(r, &r.action_type.clone(), &r.request_hash.clone(), dedup)
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
                decide(&r, &r.action_type, &other, true),
                BeginVerdict::Conflict
            );
            let action = ActionType::parse("send_email").unwrap();
            assert_eq!(
                decide(&r, &action, &r.request_hash, true),
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
}
