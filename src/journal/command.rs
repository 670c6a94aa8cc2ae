//! The journal's commands: each request as its use case takes it, its fields already parsed
//! into domain types. The transport makes them from protobuf at the edge (`api::convert`, one
//! `TryFrom` per request); other callers use their `new`. What depends on the configured
//! limits (the size and depth of a payload or a result, the number of references, a page's
//! size) the use case checks.

use crate::domain::error::ErrorReason;
use crate::domain::error::{FieldViolation, JournalError};
use crate::domain::lease::{AsLeaseToken, LeaseToken};
use crate::domain::model::{ActionType, ErrorCode, ExternalId, Namespace, OperationKey, Status};

/// One operation, by its key (`GetOperation`, `ReconcileOperation`, the review and history
/// of one operation).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OperationRef {
    /// Tenant namespace.
    pub namespace: Namespace,
    /// The idempotency key.
    pub operation_key: OperationKey,
}

impl OperationRef {
    /// Parses the `namespace` ("" = the default) and `operation_key` fields.
    ///
    /// Errors: `INVALID_ARGUMENT` with a field violation.
    pub fn new(namespace: &str, operation_key: &str) -> Result<Self, JournalError> {
        Ok(Self {
            namespace: Namespace::parse(namespace)?,
            operation_key: OperationKey::parse(operation_key)?,
        })
    }
}

/// A lease holder's command (a report or a renewal): made under the lease its token names,
/// so the token's namespace is the one the caller must be allowed.
pub trait UnderLease {
    /// The lease the command is made under.
    fn token(&self) -> &LeaseToken;
}

macro_rules! under_lease {
    ($($command:ty),+) => {
        $(impl UnderLease for $command {
            fn token(&self) -> &LeaseToken {
                &self.token
            }
        })+
    };
}

under_lease!(Complete, Fail, ReportUnknown, Renew);

/// A lease holder's report of a confirmed success (`CompleteOperation`).
#[derive(Debug, Clone)]
pub struct Complete {
    /// The lease the report is made under.
    pub token: LeaseToken,
    /// The provider's id of the effect, when it gave one.
    pub external_id: Option<ExternalId>,
    /// The result, any JSON value as text ("" = none); [`super::Journal::complete`] checks
    /// it within the configured limits.
    pub result_json: String,
}

impl Complete {
    /// Parses the report's fields.
    ///
    /// Errors: `INVALID_ARGUMENT`/`INVALID_LEASE_TOKEN`; `INVALID_ARGUMENT` for a malformed
    /// external id.
    pub fn new(
        lease_token: &(impl AsLeaseToken + ?Sized),
        external_id: &str,
        result_json: impl Into<String>,
    ) -> Result<Self, JournalError> {
        Ok(Self {
            token: lease_token.as_lease_token()?.into_owned(),
            external_id: ExternalId::parse_optional(external_id)?,
            result_json: result_json.into(),
        })
    }
}

/// A lease holder's report of a definitive rejection that proves no effect
/// (`FailOperation`).
#[derive(Debug, Clone)]
pub struct Fail {
    /// The lease the report is made under.
    pub token: LeaseToken,
    /// Why, as a short machine code.
    pub error_code: ErrorCode,
}

impl Fail {
    /// Parses the report's fields; `error_code` is required.
    ///
    /// Errors: `INVALID_ARGUMENT`/`INVALID_LEASE_TOKEN`; `INVALID_ARGUMENT` for a missing
    /// or malformed error code.
    pub fn new(
        lease_token: &(impl AsLeaseToken + ?Sized),
        error_code: &str,
    ) -> Result<Self, JournalError> {
        let token = lease_token.as_lease_token()?.into_owned();
        let error_code = ErrorCode::parse_optional(error_code)?.ok_or_else(|| {
            JournalError::invalid(
                ErrorReason::InvalidFieldLength,
                FieldViolation::new("error_code", "is required for a definitive failure"),
            )
        })?;
        Ok(Self { token, error_code })
    }
}

/// A lease holder's report that the outcome is not known (`ReportUnknownOutcome`).
#[derive(Debug, Clone)]
pub struct ReportUnknown {
    /// The lease the report is made under.
    pub token: LeaseToken,
    /// Why, as a short machine code; `None` records `unknown_outcome`.
    pub error_code: Option<ErrorCode>,
}

impl ReportUnknown {
    /// Parses the report's fields.
    ///
    /// Errors: `INVALID_ARGUMENT`/`INVALID_LEASE_TOKEN`; `INVALID_ARGUMENT` for a malformed
    /// error code.
    pub fn new(
        lease_token: &(impl AsLeaseToken + ?Sized),
        error_code: &str,
    ) -> Result<Self, JournalError> {
        Ok(Self {
            token: lease_token.as_lease_token()?.into_owned(),
            error_code: ErrorCode::parse_optional(error_code)?,
        })
    }
}

/// A lease holder's renewal (`RenewLease`).
#[derive(Debug, Clone)]
pub struct Renew {
    /// The lease to extend.
    pub token: LeaseToken,
    /// The new lease length from now, seconds (0 or less gets the minimum).
    pub lease_seconds: i32,
}

impl Renew {
    /// Parses the renewal's token.
    ///
    /// Errors: `INVALID_ARGUMENT`/`INVALID_LEASE_TOKEN`.
    pub fn new(
        lease_token: &(impl AsLeaseToken + ?Sized),
        lease_seconds: i32,
    ) -> Result<Self, JournalError> {
        let token = lease_token.as_lease_token()?.into_owned();
        Ok(Self {
            token,
            lease_seconds,
        })
    }
}

/// The opaque key of an intent (`DeriveOperationKey`).
#[derive(Debug, Clone)]
pub struct DeriveKey {
    /// Tenant namespace.
    pub namespace: Namespace,
    /// The action type.
    pub action_type: ActionType,
    /// The caller's reference of the intent; never stored (the key derivation checks its
    /// length).
    pub intent_reference: String,
}

/// A page of a listing.
#[derive(Debug, Clone, Default)]
pub struct Page {
    /// At most this many entries (0 = the listing's default); the use case caps it.
    pub size: i32,
    /// The `next_page_token` of the previous page ("" = the first page).
    pub token: String,
}

/// A page of a namespace's operations, newest first (`ListOperations`).
#[derive(Debug, Clone)]
pub struct ListOperations {
    /// Tenant namespace.
    pub namespace: Namespace,
    /// Only this status.
    pub status: Option<Status>,
    /// Only this action type.
    pub action_type: Option<ActionType>,
    /// The page.
    pub page: Page,
}
