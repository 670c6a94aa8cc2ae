//! The intent a caller registers, the lease it may be granted, and Begin's decision.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

#[cfg(doc)]
use crate::JournalClient;
use crate::error::ClientError;
use crate::proto::{self, Operation};

/// One business intent: what [`JournalClient::begin`] and [`JournalClient::execute`] take.
#[derive(Debug, Clone, PartialEq)]
pub struct Intent {
    /// Tenant namespace; empty means `default`.
    pub namespace: String,
    /// The idempotency key: names the intent, stays the same across retries.
    pub operation_key: String,
    /// The action type, as named in the server's policy file.
    pub action_type: String,
    /// The request parameters (a JSON object). Its RFC 8785 canonical form is hashed; the
    /// payload itself is not stored.
    pub payload: serde_json::Value,
    /// Business links kept with the record; not hashed.
    pub references: BTreeMap<String, String>,
    /// Requested lease length (whole seconds); `None` takes the action's default.
    pub lease: Option<Duration>,
    /// Proceed after [`Begun::DuplicateIntentSuspected`]: this really is a new intent.
    pub confirm_duplicate_intent: bool,
}

impl Intent {
    /// An intent in the `default` namespace with no references.
    pub fn new(
        operation_key: impl Into<String>,
        action_type: impl Into<String>,
        payload: serde_json::Value,
    ) -> Self {
        Self {
            namespace: String::new(),
            operation_key: operation_key.into(),
            action_type: action_type.into(),
            payload,
            references: BTreeMap::new(),
            lease: None,
            confirm_duplicate_intent: false,
        }
    }

    /// The same intent in `namespace`.
    #[must_use]
    pub fn in_namespace(mut self, namespace: impl Into<String>) -> Self {
        self.namespace = namespace.into();
        self
    }

    /// The same intent with a business link such as `order_id`.
    #[must_use]
    pub fn with_reference(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.references.insert(name.into(), value.into());
        self
    }

    /// The same intent asking for a lease of `length` (whole seconds).
    #[must_use]
    pub fn with_lease(mut self, length: Duration) -> Self {
        self.lease = Some(length);
        self
    }
}

/// The id of one Begin intent (`BeginOperationRequest.attempt_id`): a random UUID v4 (128
/// bits, 122 of them random). Sent with the Begin and again, unchanged, on this client's own
/// repeats of that Begin after its answer was lost, so that the journal answers the repeat
/// with the lease it granted to the first one instead of `IN_PROGRESS` against it. Draw a new
/// one for each intent: [`JournalClient::execute`] draws one per call. Like a lease token it
/// is never shown in `Debug` output.
#[derive(Clone, PartialEq, Eq)]
pub struct AttemptId(String);

impl AttemptId {
    /// A new random attempt id.
    pub fn random() -> Self {
        Self(uuid::Uuid::new_v4().to_string())
    }

    /// The id as sent.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for AttemptId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("AttemptId(<redacted>)")
    }
}

/// A granted lease: the fencing token to report with, and the key for the provider.
#[derive(Clone, PartialEq, Eq)]
pub struct Lease {
    /// The fencing token (opaque; a secret while the lease lives).
    pub token: String,
    /// The idempotency key to send to the provider.
    pub provider_key: String,
}

impl fmt::Debug for Lease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lease")
            .field("token", &"<redacted>")
            .field("provider_key", &self.provider_key)
            .finish()
    }
}

/// What `BeginOperation` decided.
#[derive(Debug, Clone, PartialEq)]
pub enum Begun {
    /// You hold the lease: call the provider with `lease.provider_key`, then report.
    Execute {
        /// The record, `in_progress`.
        operation: Operation,
        /// The lease to report with.
        lease: Lease,
    },
    /// Terminal (`succeeded` or `failed_final`): return the stored outcome; do not call.
    Replay(Operation),
    /// Another holder's lease is live: do not call; ask again after `retry_after`.
    InProgress {
        /// The record.
        operation: Operation,
        /// Until the current lease ends.
        retry_after: Duration,
    },
    /// The outcome is unknown: do not call; it must be reconciled first.
    VerificationRequired(Operation),
    /// The same request is registered under another key; nothing was registered.
    DuplicateIntentSuspected {
        /// The key to retry under (or confirm a truly new intent).
        duplicate_of_operation_key: String,
    },
}

impl Begun {
    pub(crate) fn from_response(
        response: proto::BeginOperationResponse,
    ) -> Result<Self, ClientError> {
        let decision = proto::Decision::try_from(response.decision)
            .map_err(|_| ClientError::malformed("unknown decision"))?;
        if decision == proto::Decision::DuplicateIntentSuspected {
            return Ok(Self::DuplicateIntentSuspected {
                duplicate_of_operation_key: response.duplicate_of_operation_key,
            });
        }
        let operation = required(response.operation)?;
        Ok(match decision {
            proto::Decision::Execute => Self::Execute {
                lease: Lease {
                    token: response.lease_token,
                    provider_key: operation.provider_key.clone(),
                },
                operation,
            },
            proto::Decision::Replay => Self::Replay(operation),
            proto::Decision::InProgress => Self::InProgress {
                operation,
                retry_after: response
                    .retry_after
                    .and_then(|d| Duration::try_from(d).ok())
                    .unwrap_or(Duration::from_secs(1)),
            },
            proto::Decision::VerificationRequired => Self::VerificationRequired(operation),
            proto::Decision::DuplicateIntentSuspected | proto::Decision::Unspecified => {
                return Err(ClientError::malformed("unspecified decision"));
            }
        })
    }
}

/// The operation an answer must carry.
pub(crate) fn required(operation: Option<Operation>) -> Result<Operation, ClientError> {
    operation.ok_or_else(|| ClientError::malformed("the answer carries no operation"))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn attempt_ids_are_fresh_well_formed_and_never_shown() {
        let (a, b) = (AttemptId::random(), AttemptId::random());
        assert_ne!(a, b);
        assert_eq!(a.as_str().len(), 36);
        assert!(
            a.as_str()
                .bytes()
                .all(|c| c.is_ascii_hexdigit() || c == b'-')
        );
        assert!(!format!("{a:?}").contains(a.as_str()));
    }

    #[test]
    fn the_lease_token_never_shows_in_debug_output() {
        let lease = Lease {
            token: "secret-token".into(),
            provider_key: "k".into(),
        };
        assert!(!format!("{lease:?}").contains("secret-token"));
    }
}
