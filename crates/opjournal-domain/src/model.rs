//! Journal vocabulary as types: each parsing constructor rejects bad input once, at the edge.

use std::fmt;

use chrono::{DateTime, Utc};

use super::canonical::RequestHash;
use super::error::{FieldViolation, JournalError};
use opjournal_reasons::ErrorReason;

/// Maximum length of an idempotency key, in characters (the article's `VARCHAR(200)`).
pub const MAX_KEY_CHARS: usize = 200;
/// Maximum length of a namespace, in characters.
pub const MAX_NAMESPACE_CHARS: usize = 100;
/// Maximum length of an action type, in characters (the article's `VARCHAR(80)`).
pub const MAX_ACTION_TYPE_CHARS: usize = 80;
/// Maximum length of a provider's external id, in characters.
pub const MAX_EXTERNAL_ID_CHARS: usize = 200;
/// Maximum length of an error code, in characters.
pub const MAX_ERROR_CODE_CHARS: usize = 100;
/// The namespace used when a request leaves it empty.
pub const DEFAULT_NAMESPACE: &str = "default";

fn is_identifier_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | ':')
}

/// One checked text field: `value` when it is 1 to `max` characters long and every
/// character is `allowed`.
///
/// Errors: `INVALID_ARGUMENT` with a violation of `field`: reason `INVALID_FIELD_LENGTH`,
/// or `reason` with `description` for a character not allowed.
fn text_field(
    field: &'static str,
    value: &str,
    max: usize,
    allowed: impl Fn(char) -> bool,
    (reason, description): (ErrorReason, &'static str),
) -> Result<String, JournalError> {
    let chars = value.chars().count();
    if chars == 0 || chars > max {
        return Err(JournalError::invalid(
            ErrorReason::InvalidFieldLength,
            FieldViolation::new(field, format!("must be 1 to {max} characters long")),
        ));
    }
    if !value.chars().all(allowed) {
        return Err(JournalError::invalid(
            reason,
            FieldViolation::new(field, description),
        ));
    }
    Ok(value.to_owned())
}

/// What an identifier-like field (action type, error code) may hold.
const IDENTIFIER: &str = "may hold only letters, digits, '.', '_', ':' and '-'";

/// `as_str` and `Display` of a checked text newtype: its text, as parsed.
macro_rules! text_newtype {
    ($($name:ident),+) => {
        $(impl $name {
            /// The text, as parsed.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        })+
    };
}

text_newtype!(Namespace, OperationKey, ActionType, ErrorCode, ExternalId);

/// A tenant namespace: 1–100 characters of `[A-Za-z0-9._-]`; empty input means `default`.
///
/// Errors: `INVALID_ARGUMENT`, reason `INVALID_FIELD_LENGTH` or `INVALID_NAMESPACE`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Namespace(String);

impl Default for Namespace {
    /// The `default` namespace, what an empty `namespace` field means.
    fn default() -> Self {
        Self(DEFAULT_NAMESPACE.to_owned())
    }
}

impl Namespace {
    /// Parses the request's `namespace` field.
    pub fn parse(value: &str) -> Result<Self, JournalError> {
        if value.is_empty() {
            return Ok(Self::default());
        }
        let allowed = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-');
        let refused = "may hold only letters, digits, '.', '_' and '-'";
        text_field(
            "namespace",
            value,
            MAX_NAMESPACE_CHARS,
            allowed,
            (ErrorReason::InvalidNamespace, refused),
        )
        .map(Self)
    }
}

/// An idempotency key: names one business intent, not a network attempt.
/// 1–200 characters, no control characters.
///
/// Errors: `INVALID_ARGUMENT`, reason `INVALID_FIELD_LENGTH` or `INVALID_OPERATION_KEY`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct OperationKey(String);

/// Characters that render as nothing or reorder text: allowed in no key, so that two keys
/// that look identical are identical (zero-width, bidirectional controls, BOM, separators).
fn is_invisible(c: char) -> bool {
    matches!(c,
        '\u{00AD}' | '\u{061C}' | '\u{180E}' | '\u{200B}'..='\u{200F}' | '\u{2028}'..='\u{202E}'
        | '\u{2060}'..='\u{2064}' | '\u{2066}'..='\u{206F}' | '\u{FEFF}' | '\u{FFF9}'..='\u{FFFB}')
}

impl OperationKey {
    /// Parses the request's `operation_key` field.
    pub fn parse(value: &str) -> Result<Self, JournalError> {
        let refused = "must not contain control or invisible formatting characters";
        text_field(
            "operation_key",
            value,
            MAX_KEY_CHARS,
            |c| !c.is_control() && !is_invisible(c),
            (ErrorReason::InvalidOperationKey, refused),
        )
        .map(Self)
    }
}

/// An action type as named in the policy file: 1–80 characters of `[A-Za-z0-9._:-]`.
///
/// Errors: `INVALID_ARGUMENT`, reason `INVALID_FIELD_LENGTH` or `INVALID_ACTION_TYPE`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ActionType(String);

impl ActionType {
    /// Parses the request's `action_type` field.
    pub fn parse(value: &str) -> Result<Self, JournalError> {
        let refused = (ErrorReason::InvalidActionType, IDENTIFIER);
        text_field(
            "action_type",
            value,
            MAX_ACTION_TYPE_CHARS,
            is_identifier_char,
            refused,
        )
        .map(Self)
    }
}

/// A short machine code for a failure or an unknown outcome, such as `card_declined`:
/// 1–100 characters of `[A-Za-z0-9._:-]`. Never free text, so it cannot carry personal data.
///
/// Errors: `INVALID_ARGUMENT`, reason `INVALID_FIELD_LENGTH` or `INVALID_ERROR_CODE`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ErrorCode(String);

impl ErrorCode {
    /// Parses an `error_code` field; empty input is `None`.
    pub fn parse_optional(value: &str) -> Result<Option<Self>, JournalError> {
        if value.is_empty() {
            return Ok(None);
        }
        let refused = (ErrorReason::InvalidErrorCode, IDENTIFIER);
        text_field(
            "error_code",
            value,
            MAX_ERROR_CODE_CHARS,
            is_identifier_char,
            refused,
        )
        .map(|code| Some(Self(code)))
    }

    /// A code set by the journal itself.
    pub fn internal(code: &'static str) -> Self {
        Self(code.to_owned())
    }
}

/// The provider's identifier of an effect (payment id, message id): 1–200 characters,
/// no control characters.
///
/// Errors: `INVALID_ARGUMENT`, reason `INVALID_FIELD_LENGTH` or `INVALID_EXTERNAL_ID`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExternalId(String);

impl ExternalId {
    /// Parses an `external_id` field; empty input is `None`.
    pub fn parse_optional(value: &str) -> Result<Option<Self>, JournalError> {
        if value.is_empty() {
            return Ok(None);
        }
        let refused = (
            ErrorReason::InvalidExternalId,
            "must not contain control characters",
        );
        text_field(
            "external_id",
            value,
            MAX_EXTERNAL_ID_CHARS,
            |c| !c.is_control(),
            refused,
        )
        .map(|id| Some(Self(id)))
    }
}

/// The state machine of the source article (step 3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Status {
    /// Registered; no provider call has started, or it was released for retry.
    Pending,
    /// A lease holder may be calling the provider now.
    InProgress,
    /// No answer was received; the effect may have happened.
    Unknown,
    /// The effect is confirmed. Terminal.
    Succeeded,
    /// Confirmed that no effect happened and none will automatically. Terminal.
    FailedFinal,
}

impl Status {
    /// The value stored in the `status` column.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::InProgress => "in_progress",
            Self::Unknown => "unknown",
            Self::Succeeded => "succeeded",
            Self::FailedFinal => "failed_final",
        }
    }

    /// Parses the `status` column.
    pub fn from_db(value: &str) -> Option<Self> {
        Some(match value {
            "pending" => Self::Pending,
            "in_progress" => Self::InProgress,
            "unknown" => Self::Unknown,
            "succeeded" => Self::Succeeded,
            "failed_final" => Self::FailedFinal,
            _ => return None,
        })
    }

    /// Whether the status never changes again.
    pub fn is_terminal(self) -> bool {
        matches!(self, Self::Succeeded | Self::FailedFinal)
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One journal row as read from the store, with the database clock at the time of reading.
#[derive(Debug, Clone, PartialEq)]
pub struct OperationRecord {
    /// Tenant namespace.
    pub namespace: Namespace,
    /// The idempotency key.
    pub operation_key: OperationKey,
    /// The action type the key was registered under.
    pub action_type: ActionType,
    /// The request hash the key is bound to.
    pub request_hash: RequestHash,
    /// Current status.
    pub status: Status,
    /// Leases granted so far; the fencing counter.
    pub attempt_count: i32,
    /// Random part of the current (or last) lease's fencing token.
    pub lease_id: Option<uuid::Uuid>,
    /// End of the current lease (database clock).
    pub lease_until: Option<DateTime<Utc>>,
    /// SHA-256 of the attempt id the current (or last) lease was granted to, when that Begin
    /// sent one (see [`crate::lease::AttemptId`]).
    pub lease_attempt: Option<crate::lease::AttemptDigest>,
    /// Provider's id of the effect.
    pub external_id: Option<String>,
    /// Stored result, canonical JSON text.
    pub result_json: Option<String>,
    /// Last failure or unknown-outcome code.
    pub error_code: Option<String>,
    /// Business links; not hashed.
    pub references: std::collections::BTreeMap<String, String>,
    /// When the outcome became unknown; the absence grace window counts from here.
    pub unknown_since: Option<DateTime<Utc>>,
    /// When the reconcile path next looks the operation up.
    pub next_check_at: Option<DateTime<Utc>>,
    /// Provider lookups made so far.
    pub reconcile_attempts: i32,
    /// When the operation was escalated to human review, if it waits for one.
    pub review_required_at: Option<DateTime<Utc>>,
    /// Why it was escalated.
    pub review_reason: Option<String>,
    /// Who made the last recorded transition.
    pub last_actor_kind: ActorKind,
    /// The action policy the operation was registered under; `None` for operations
    /// registered before policies were recorded (the current policy applies to them).
    pub action_policy: Option<crate::policy::ActionPolicy>,
    /// The W3C `traceparent` of the request that registered the operation (see
    /// `opjournal::telemetry::propagation`); reconcile attempts link their spans to it. `None`
    /// when that request carried no trace context and tracing was off.
    pub trace_context: Option<String>,
    /// First registration (database clock).
    pub created_at: DateTime<Utc>,
    /// Last change (database clock).
    pub updated_at: DateTime<Utc>,
    /// The database clock when this row was read.
    pub observed_at: DateTime<Utc>,
}

/// The idempotency key to send to the provider for (`namespace`, `key`): the key itself in
/// the `default` namespace (single-tenant deployments see exactly the key they chose), and
/// `<namespace>/<key>` elsewhere, so that tenants sharing one provider account never collide
/// there. A `default` key containing `/` is sent as `default/<key>`; since namespaces cannot
/// contain `/`, the mapping is one-to-one.
pub fn provider_key(namespace: &Namespace, key: &OperationKey) -> String {
    if namespace.as_str() == DEFAULT_NAMESPACE && !key.as_str().contains('/') {
        key.as_str().to_owned()
    } else {
        format!("{}/{}", namespace.as_str(), key.as_str())
    }
}

impl OperationRecord {
    /// The idempotency key to send to the provider (see [`provider_key`]).
    pub fn provider_key(&self) -> String {
        provider_key(&self.namespace, &self.operation_key)
    }

    /// Whether the row holds a lease that has not yet ended, by the database clock.
    pub fn has_live_lease(&self) -> bool {
        self.status == Status::InProgress
            && self
                .lease_until
                .is_some_and(|until| until > self.observed_at)
    }

    /// Whether the row is `in_progress` with a lease that has ended: the holder may have
    /// called the provider, so this counts as unknown (never as permission to run again).
    pub fn has_expired_lease(&self) -> bool {
        self.status == Status::InProgress && !self.has_live_lease()
    }
}

/// Who caused a transition, as recorded in the history.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ActorKind {
    /// An orchestrator calling the journal.
    Client,
    /// The reconcile path.
    Worker,
    /// A person resolving a review.
    Reviewer,
}

impl ActorKind {
    /// The value stored in `last_actor_kind` / `operation_events.actor_kind`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Client => "client",
            Self::Worker => "worker",
            Self::Reviewer => "reviewer",
        }
    }

    /// Parses the stored value.
    pub fn from_db(value: &str) -> Option<Self> {
        Some(match value {
            "client" => Self::Client,
            "worker" => Self::Worker,
            "reviewer" => Self::Reviewer,
            _ => return None,
        })
    }
}

/// Who did a transition and why, written with it into the history.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attribution {
    /// The kind of actor.
    pub kind: ActorKind,
    /// Which worker or reviewer (empty for anonymous clients), at most 200 characters.
    pub actor: String,
    /// Why: an error code, an observation, or a reviewer's reason; at most 500 characters.
    pub reason: Option<String>,
}

impl Attribution {
    /// A transition caused by a client.
    pub fn client(reason: impl Into<String>) -> Self {
        Self {
            kind: ActorKind::Client,
            actor: String::new(),
            reason: Some(reason.into()),
        }
    }

    /// A transition caused by the reconcile path `worker`.
    pub fn worker(worker: impl Into<String>, reason: impl Into<String>) -> Self {
        Self {
            kind: ActorKind::Worker,
            actor: worker.into(),
            reason: Some(reason.into()),
        }
    }

    /// A reviewer's decision: who decided (1-200 characters) and why (1-500), neither with
    /// control characters.
    ///
    /// Errors: `INVALID_ARGUMENT`/`INVALID_REVIEW` naming the field.
    pub fn reviewer(reviewer: &str, reason: &str) -> Result<Self, JournalError> {
        let check = |field: &'static str, value: &str, max: usize| {
            let chars = value.chars().count();
            if chars == 0 || chars > max || value.chars().any(char::is_control) {
                Err(JournalError::invalid(
                    ErrorReason::InvalidReview,
                    FieldViolation::new(
                        field,
                        format!("is required: 1 to {max} characters without control characters"),
                    ),
                ))
            } else {
                Ok(())
            }
        };
        check("reviewer", reviewer, 200)?;
        check("reason", reason, 500)?;
        Ok(Self {
            kind: ActorKind::Reviewer,
            actor: reviewer.to_owned(),
            reason: Some(reason.to_owned()),
        })
    }
}

/// One entry of an operation's append-only history.
#[derive(Debug, Clone, PartialEq)]
pub struct OperationEvent {
    /// Increasing id.
    pub event_id: i64,
    /// Status before; `None` for the registration.
    pub from_status: Option<Status>,
    /// Status after.
    pub to_status: Status,
    /// Attempt count after.
    pub attempt_count: i32,
    /// Whether the operation waits for review after this event.
    pub review_required: bool,
    /// Who.
    pub actor_kind: ActorKind,
    /// Which worker or reviewer.
    pub actor: String,
    /// Why.
    pub reason: Option<String>,
    /// When (database clock).
    pub occurred_at: DateTime<Utc>,
}
