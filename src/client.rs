//! A typed Rust client of the journal, and [`JournalClient::execute`]: the source article's
//! `executeOperation` (step 6) done once, correctly, for every orchestrator written in Rust.
//!
//! ```no_run
//! # async fn example() -> Result<(), opjournal::client::ClientError> {
//! use opjournal::client::{Executed, Intent, JournalClient, ProviderOutcome};
//!
//! let client = JournalClient::connect("http://127.0.0.1:50051").await?;
//! let intent = Intent::new(
//!     "payment:order-817:intent-01",
//!     "create_payment",
//!     serde_json::json!({"amount_minor": 1000, "currency": "EUR", "order_id": "817"}),
//! );
//! let executed = client
//!     .execute(intent, |call| async move {
//!         // Call the provider with call.provider_key as its idempotency key, then say
//!         // what is *known*: a timeout is never a rejection.
//!         ProviderOutcome::Uncertain { error_code: Some("timeout".into()) }
//!     })
//!     .await?;
//! match executed {
//!     Executed::Succeeded { operation, .. } => println!("paid: {:?}", operation.external_id),
//!     Executed::VerificationRequired { .. } => println!("unknown: reconcile before any retry"),
//!     other => println!("{other:?}"),
//! }
//! # Ok(())
//! # }
//! ```

use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::str::FromStr;
use std::time::Duration;

use backon::{ExponentialBuilder, Retryable as _};
use futures::FutureExt as _;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Status};
use tonic_types::StatusExt as _;

use crate::api::auth::{BearerToken, InvalidToken};
use crate::proto;
use crate::proto::operation_journal_client::OperationJournalClient;
use crate::proto::reconciler_client::ReconcilerClient;

pub use crate::proto::Operation;

type Authorized = InterceptedService<Channel, BearerToken>;

/// How often a lease is renewed while the provider call runs, as a fraction of its length.
const RENEW_FRACTION: u32 = 3;
/// How long a report (complete, fail, unknown) is retried while the server is unreachable.
const REPORT_RETRY_FOR: Duration = Duration::from_secs(10);

/// A client of the `OperationJournal` and `Reconciler` services on one channel.
///
/// Cheap to clone; clones share the channel.
#[derive(Debug, Clone)]
pub struct JournalClient {
    journal: OperationJournalClient<Authorized>,
    reconciler: ReconcilerClient<Authorized>,
}

impl JournalClient {
    /// Connects to `url` (`http://host:port`, or `https://` with the system's roots).
    ///
    /// Errors: an invalid URL (`INVALID_ARGUMENT`) or an unreachable server (`UNAVAILABLE`),
    /// both with reason [`ErrorReason::Transport`].
    pub async fn connect(url: &str) -> Result<Self, ClientError> {
        let endpoint = Endpoint::from_shared(url.to_owned())
            .map_err(|err| ClientError::transport(Code::InvalidArgument, err))?
            .connect_timeout(Duration::from_secs(5));
        let channel = endpoint
            .connect()
            .await
            .map_err(|err| ClientError::transport(Code::Unavailable, err))?;
        Ok(Self::new(channel))
    }

    /// A client over an existing channel (TLS, timeouts and load balancing are the
    /// channel's), without a token.
    pub fn new(channel: Channel) -> Self {
        Self::over(channel, BearerToken::none())
    }

    /// A client over `channel` that sends `authorization: Bearer <token>` with every call.
    ///
    /// Errors: [`InvalidToken`] for an empty token or one a header cannot carry.
    pub fn with_token(channel: Channel, token: &str) -> Result<Self, InvalidToken> {
        Ok(Self::over(channel, BearerToken::new(token)?))
    }

    fn over(channel: Channel, token: BearerToken) -> Self {
        Self {
            journal: OperationJournalClient::with_interceptor(channel.clone(), token.clone()),
            reconciler: ReconcilerClient::with_interceptor(channel, token),
        }
    }

    /// `BeginOperation`: registers the intent or reads where it stands.
    ///
    /// Errors: `ALREADY_EXISTS`/[`ErrorReason::IdempotencyKeyReused`] for the same key with
    /// another payload or action type; `INVALID_ARGUMENT` with field violations for a bad
    /// key, namespace, action type or payload; `UNAVAILABLE`/`STORE_UNAVAILABLE`.
    pub async fn begin(&self, intent: &Intent) -> Result<Begun, ClientError> {
        let request = proto::BeginOperationRequest {
            namespace: intent.namespace.clone(),
            operation_key: intent.operation_key.clone(),
            action_type: intent.action_type.clone(),
            payload_json: intent.payload.to_string(),
            lease_seconds: intent.lease.map_or(0, |lease| {
                i32::try_from(lease.as_secs()).unwrap_or(i32::MAX)
            }),
            references: intent.references.clone().into_iter().collect(),
            confirm_duplicate_intent: intent.confirm_duplicate_intent,
        };
        let response = self.journal.clone().begin_operation(request).await?;
        Begun::from_response(response.into_inner())
    }

    /// `CompleteOperation`: the provider confirmed the effect.
    ///
    /// `result` is stored as canonical JSON after the action's result policy sanitized it.
    /// Errors: `ABORTED`/[`ErrorReason::LeaseLost`] when a later lease exists;
    /// `FAILED_PRECONDITION`/`OUTCOME_ALREADY_RECORDED` when another outcome was recorded.
    pub async fn complete(
        &self,
        lease: &Lease,
        external_id: Option<&str>,
        result: Option<&serde_json::Value>,
    ) -> Result<Operation, ClientError> {
        let request = proto::CompleteOperationRequest {
            lease_token: lease.token.clone(),
            external_id: external_id.unwrap_or_default().to_owned(),
            result_json: result.map(ToString::to_string).unwrap_or_default(),
        };
        let response = self.journal.clone().complete_operation(request).await?;
        required(response.into_inner().operation)
    }

    /// `FailOperation`: the provider confirmed that nothing happened (`failed_final`).
    ///
    /// `error_code`: 1–100 characters of `[A-Za-z0-9._:-]`. Errors as [`Self::complete`].
    pub async fn fail(&self, lease: &Lease, error_code: &str) -> Result<Operation, ClientError> {
        let request = proto::FailOperationRequest {
            lease_token: lease.token.clone(),
            error_code: error_code.to_owned(),
        };
        let response = self.journal.clone().fail_operation(request).await?;
        required(response.into_inner().operation)
    }

    /// `ReportUnknownOutcome`: the effect may or may not have happened (`unknown`); the
    /// reconcile worker will ask the provider. Errors as [`Self::complete`].
    pub async fn report_unknown(
        &self,
        lease: &Lease,
        error_code: Option<&str>,
    ) -> Result<Operation, ClientError> {
        let request = proto::ReportUnknownOutcomeRequest {
            lease_token: lease.token.clone(),
            error_code: error_code.unwrap_or_default().to_owned(),
        };
        let response = self.journal.clone().report_unknown_outcome(request).await?;
        required(response.into_inner().operation)
    }

    /// `RenewLease`: extends the lease to `length` from now (database clock; whole seconds,
    /// at least the server's minimum). Errors: `ABORTED`/[`ErrorReason::LeaseLost`].
    pub async fn renew(&self, lease: &Lease, length: Duration) -> Result<Operation, ClientError> {
        let request = proto::RenewLeaseRequest {
            lease_token: lease.token.clone(),
            lease_seconds: i32::try_from(length.as_secs()).unwrap_or(i32::MAX),
        };
        let response = self.journal.clone().renew_lease(request).await?;
        required(response.into_inner().operation)
    }

    /// `GetOperation`: the record, or `NOT_FOUND`/[`ErrorReason::OperationNotFound`].
    /// An empty `namespace` means `default`.
    pub async fn get(
        &self,
        namespace: &str,
        operation_key: &str,
    ) -> Result<Operation, ClientError> {
        let request = proto::GetOperationRequest {
            namespace: namespace.to_owned(),
            operation_key: operation_key.to_owned(),
        };
        let response = self.journal.clone().get_operation(request).await?;
        required(response.into_inner().operation)
    }

    /// `ReconcileOperation`: asks the provider now what happened to an `unknown` operation
    /// and applies the answer (needs the `reviewer` or `admin` role when tokens are on).
    ///
    /// Errors: `FAILED_PRECONDITION` with `OPERATION_NOT_RECONCILABLE`,
    /// `RECONCILE_IN_PROGRESS` or `NO_PROVIDER_ADAPTER`.
    pub async fn reconcile(
        &self,
        namespace: &str,
        operation_key: &str,
    ) -> Result<proto::ReconcileOperationResponse, ClientError> {
        let request = proto::ReconcileOperationRequest {
            namespace: namespace.to_owned(),
            operation_key: operation_key.to_owned(),
        };
        let response = self.reconciler.clone().reconcile_operation(request).await?;
        Ok(response.into_inner())
    }

    /// The source article's `executeOperation`: begins the intent; on `EXECUTE` runs `call`
    /// with the key the provider must receive, renewing the lease every third of its length
    /// while the call runs, and records what `call` says happened; on `REPLAY` returns the
    /// stored outcome without calling.
    ///
    /// `call` must classify honestly: [`ProviderOutcome::Rejected`] only when the provider
    /// confirmed that nothing happened; a timeout, a reset, a 5xx or an answer it cannot
    /// read is [`ProviderOutcome::Uncertain`]. A panic inside `call` is reported as
    /// uncertain (`error_code` `client_panic`) and then resumed. If the `execute` future is
    /// dropped mid-call nothing is reported: the lease ends and the operation needs
    /// verification, exactly as after a crash.
    ///
    /// Reports are retried for up to 10 seconds while the server is unreachable (a repeated
    /// report of the same outcome is answered OK by the server).
    ///
    /// Errors: those of [`Self::begin`]; `ABORTED`/[`ErrorReason::LeaseLost`] when the lease
    /// was taken over while `call` ran (the effect, if any, is then settled by whoever holds
    /// the operation now or by reconciliation); a report the server never acknowledged.
    pub async fn execute<F, Fut>(&self, intent: Intent, call: F) -> Result<Executed, ClientError>
    where
        F: FnOnce(ProviderCall) -> Fut,
        Fut: Future<Output = ProviderOutcome>,
    {
        let (operation, lease) = match self.begin(&intent).await? {
            Begun::Execute { operation, lease } => (operation, lease),
            Begun::Replay(operation) => return Ok(Executed::from_terminal(operation, true)),
            Begun::InProgress {
                operation,
                retry_after,
            } => {
                return Ok(Executed::InProgress {
                    operation,
                    retry_after,
                });
            }
            Begun::VerificationRequired(operation) => {
                return Ok(Executed::VerificationRequired { operation });
            }
            Begun::DuplicateIntentSuspected {
                duplicate_of_operation_key,
            } => {
                return Ok(Executed::DuplicateIntentSuspected {
                    duplicate_of_operation_key,
                });
            }
        };
        let provider_call = ProviderCall {
            provider_key: operation.provider_key.clone(),
            operation_key: operation.operation_key.clone(),
            attempt: operation.attempt_count,
        };
        let length = lease_length(&operation);
        let outcome = {
            let call = AssertUnwindSafe(call(provider_call)).catch_unwind();
            let renewals = self.renew_until_dropped(&lease, length);
            futures::pin_mut!(call, renewals);
            match futures::future::select(call, renewals).await {
                futures::future::Either::Left((outcome, _)) => outcome,
                // Renewing never ends by itself.
                futures::future::Either::Right(((), call)) => call.await,
            }
        };
        let outcome = match outcome {
            Ok(outcome) => outcome,
            Err(panic) => {
                // The provider may have acted before the panic: that is an unknown outcome.
                let _ = self
                    .report_with_retry(|| self.report_unknown(&lease, Some("client_panic")))
                    .await;
                std::panic::resume_unwind(panic);
            }
        };
        match outcome {
            ProviderOutcome::Succeeded {
                external_id,
                result,
            } => {
                let operation = self
                    .report_with_retry(|| {
                        self.complete(&lease, external_id.as_deref(), result.as_ref())
                    })
                    .await?;
                Ok(Executed::Succeeded {
                    operation,
                    replayed: false,
                })
            }
            ProviderOutcome::Rejected { error_code } => {
                let operation = self
                    .report_with_retry(|| self.fail(&lease, &error_code))
                    .await?;
                Ok(Executed::FailedFinal {
                    operation,
                    replayed: false,
                })
            }
            ProviderOutcome::Uncertain { error_code } => {
                let operation = self
                    .report_with_retry(|| self.report_unknown(&lease, error_code.as_deref()))
                    .await?;
                Ok(Executed::VerificationRequired { operation })
            }
        }
    }

    /// Renews `lease` every third of `length`; never returns. A lost lease stops renewing
    /// (the report will then say `LEASE_LOST`); a transient failure is tried again at the
    /// next tick.
    async fn renew_until_dropped(&self, lease: &Lease, length: Duration) {
        let every = (length / RENEW_FRACTION).max(Duration::from_millis(500));
        loop {
            tokio::time::sleep(every).await;
            match self.renew(lease, length).await {
                Ok(_) => {}
                Err(err) if err.reason == ErrorReason::LeaseLost => {
                    tracing::warn!(reason = %err.reason, "lease lost while the provider call ran");
                    std::future::pending::<()>().await;
                }
                Err(err) => {
                    tracing::warn!(code = ?err.code, reason = %err.reason, "lease renewal failed; will try again")
                }
            }
        }
    }

    async fn report_with_retry<'a, Fut>(
        &'a self,
        report: impl FnMut() -> Fut,
    ) -> Result<Operation, ClientError>
    where
        Fut: Future<Output = Result<Operation, ClientError>> + 'a,
    {
        report
            .retry(
                ExponentialBuilder::default()
                    .with_min_delay(Duration::from_millis(100))
                    .with_max_delay(Duration::from_secs(2))
                    .with_total_delay(Some(REPORT_RETRY_FOR))
                    .without_max_times()
                    .with_jitter(),
            )
            .when(ClientError::is_transient)
            .await
    }
}

/// The lease length the server granted, from two database-clock timestamps.
fn lease_length(operation: &Operation) -> Duration {
    match (&operation.lease_until, &operation.updated_at) {
        (Some(until), Some(from)) => {
            let millis = (until.seconds - from.seconds) * 1000
                + i64::from(until.nanos - from.nanos) / 1_000_000;
            Duration::from_millis(u64::try_from(millis).unwrap_or(0)).max(Duration::from_secs(1))
        }
        _ => Duration::from_secs(30),
    }
}

fn required(operation: Option<Operation>) -> Result<Operation, ClientError> {
    operation.ok_or_else(|| ClientError::malformed("the answer carries no operation"))
}

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
    fn from_response(response: proto::BeginOperationResponse) -> Result<Self, ClientError> {
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

/// What [`JournalClient::execute`] hands the provider call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProviderCall {
    /// The idempotency key to send to the provider (the operation key, prefixed by the
    /// namespace outside `default`).
    pub provider_key: String,
    /// The journal's idempotency key.
    pub operation_key: String,
    /// The lease number (1 for the first attempt).
    pub attempt: i32,
}

/// What the provider call knows happened: the article's classification.
#[derive(Debug, Clone, PartialEq)]
pub enum ProviderOutcome {
    /// The provider confirmed the effect.
    Succeeded {
        /// The provider's id of the effect (payment id, message id).
        external_id: Option<String>,
        /// The result to keep for replays; sanitized by the action's result policy.
        result: Option<serde_json::Value>,
    },
    /// The provider confirmed that nothing happened (a decline, a validation error).
    Rejected {
        /// A short machine code such as `card_declined`.
        error_code: String,
    },
    /// Anything else: timeout, connection reset, 5xx, an unreadable answer.
    Uncertain {
        /// A short machine code such as `timeout`, if known.
        error_code: Option<String>,
    },
}

/// Where an [`JournalClient::execute`] ended.
#[derive(Debug, Clone, PartialEq)]
pub enum Executed {
    /// Succeeded; the stored result is `operation.result_json`.
    Succeeded {
        /// The record.
        operation: Operation,
        /// Whether this is a replay of an earlier execution (no provider call now).
        replayed: bool,
    },
    /// Confirmed rejection; `operation.error_code` says why.
    FailedFinal {
        /// The record.
        operation: Operation,
        /// Whether this is a replay of an earlier execution.
        replayed: bool,
    },
    /// The outcome is unknown; do not retry until reconciliation settles it.
    VerificationRequired {
        /// The record, `unknown` (or `in_progress` with an ended lease).
        operation: Operation,
    },
    /// Another caller holds the lease; ask again after `retry_after`.
    InProgress {
        /// The record.
        operation: Operation,
        /// Until the current lease ends.
        retry_after: Duration,
    },
    /// Held by the duplicate-intent policy; nothing was registered or called.
    DuplicateIntentSuspected {
        /// The key the same request is registered under.
        duplicate_of_operation_key: String,
    },
}

impl Executed {
    fn from_terminal(operation: Operation, replayed: bool) -> Self {
        if operation.status == proto::OperationStatus::Succeeded as i32 {
            Self::Succeeded {
                operation,
                replayed,
            }
        } else {
            Self::FailedFinal {
                operation,
                replayed,
            }
        }
    }
}

/// A failed call, decoded from the status's `google.rpc.ErrorInfo` and `BadRequest`.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{code:?} {reason}: {message}")]
pub struct ClientError {
    /// The gRPC code.
    pub code: Code,
    /// The `ErrorInfo.reason`, typed.
    pub reason: ErrorReason,
    /// The server's message (never carries payloads or keys).
    pub message: String,
    /// `BadRequest` field violations as (field, description).
    pub field_violations: Vec<(String, String)>,
    /// `RetryInfo.retry_delay`, when the server suggests one.
    pub retry_after: Option<Duration>,
    /// `ErrorInfo.metadata` (e.g. `json_pointer`, `current_status`).
    pub metadata: BTreeMap<String, String>,
}

impl ClientError {
    fn transport(code: Code, err: impl fmt::Display) -> Self {
        Self {
            code,
            reason: ErrorReason::Transport,
            message: err.to_string(),
            field_violations: Vec::new(),
            retry_after: None,
            metadata: BTreeMap::new(),
        }
    }

    fn malformed(message: &str) -> Self {
        Self {
            code: Code::Internal,
            reason: ErrorReason::Other("MALFORMED_RESPONSE".into()),
            message: message.to_owned(),
            field_violations: Vec::new(),
            retry_after: None,
            metadata: BTreeMap::new(),
        }
    }

    /// Whether the same call may simply be sent again: the server was unreachable or its
    /// store was. Business answers are never transient.
    pub fn is_transient(&self) -> bool {
        matches!(
            self.reason,
            ErrorReason::StoreUnavailable | ErrorReason::Transport
        ) || (self.code == Code::Unavailable && matches!(self.reason, ErrorReason::Other(_)))
    }
}

impl From<Status> for ClientError {
    fn from(status: Status) -> Self {
        let details = status.get_error_details();
        let (reason, metadata) = match details.error_info() {
            Some(info) => (
                info.reason
                    .parse()
                    .unwrap_or_else(|_| ErrorReason::Other(info.reason.clone())),
                info.metadata.clone().into_iter().collect(),
            ),
            // No ErrorInfo: the status was made by the transport (connection refused,
            // message too large), not by the journal.
            None => (ErrorReason::Transport, BTreeMap::new()),
        };
        let field_violations = details
            .bad_request()
            .map(|bad| {
                bad.field_violations
                    .iter()
                    .map(|v| (v.field.clone(), v.description.clone()))
                    .collect()
            })
            .unwrap_or_default();
        Self {
            code: status.code(),
            reason,
            message: status.message().to_owned(),
            field_violations,
            retry_after: details.retry_info().and_then(|info| info.retry_delay),
            metadata,
        }
    }
}

/// The stable `ErrorInfo.reason` values of the journal (domain `opjournal.dev`), typed.
/// The catalog with what a client should do for each is in docs/errors.md.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorReason {
    /// `ALREADY_EXISTS`: the key is bound to another payload or action type. Stop: a bug or
    /// a new intent that needs a new key.
    IdempotencyKeyReused,
    /// `ABORTED`: a later lease exists (fencing); this holder must not report.
    LeaseLost,
    /// `FAILED_PRECONDITION`: another outcome was recorded for this attempt.
    OutcomeAlreadyRecorded,
    /// `NOT_FOUND`: no such operation.
    OperationNotFound,
    /// `UNAVAILABLE`: the journal's database is unreachable; retry the same call.
    StoreUnavailable,
    /// `INVALID_ARGUMENT`: the lease token is not one the server issued.
    InvalidLeaseToken,
    /// `INVALID_ARGUMENT`: the payload is not I-JSON.
    InvalidPayload,
    /// `INVALID_ARGUMENT`: the key looks like it carries personal data.
    KeyContainsSensitiveData,
    /// `FAILED_PRECONDITION`: the action type is not in the policy file.
    ActionTypeNotConfigured,
    /// `UNAUTHENTICATED`: no token.
    MissingCredentials,
    /// `UNAUTHENTICATED`: an unknown token.
    InvalidCredentials,
    /// `PERMISSION_DENIED`: the token may not use this namespace.
    NamespaceNotAllowed,
    /// `PERMISSION_DENIED`: the token's role may not call this RPC.
    RoleNotAllowed,
    /// No `ErrorInfo`: the call failed in transport (unreachable server, oversized message).
    Transport,
    /// Any other reason, as sent.
    Other(String),
}

impl ErrorReason {
    const NAMED: [(&'static str, ErrorReason); 13] = [
        ("IDEMPOTENCY_KEY_REUSED", Self::IdempotencyKeyReused),
        ("LEASE_LOST", Self::LeaseLost),
        ("OUTCOME_ALREADY_RECORDED", Self::OutcomeAlreadyRecorded),
        ("OPERATION_NOT_FOUND", Self::OperationNotFound),
        ("STORE_UNAVAILABLE", Self::StoreUnavailable),
        ("INVALID_LEASE_TOKEN", Self::InvalidLeaseToken),
        ("INVALID_PAYLOAD", Self::InvalidPayload),
        (
            "KEY_CONTAINS_SENSITIVE_DATA",
            Self::KeyContainsSensitiveData,
        ),
        ("ACTION_TYPE_NOT_CONFIGURED", Self::ActionTypeNotConfigured),
        ("MISSING_CREDENTIALS", Self::MissingCredentials),
        ("INVALID_CREDENTIALS", Self::InvalidCredentials),
        ("NAMESPACE_NOT_ALLOWED", Self::NamespaceNotAllowed),
        ("ROLE_NOT_ALLOWED", Self::RoleNotAllowed),
    ];

    /// The reason as sent on the wire (`TRANSPORT` when there was no `ErrorInfo`).
    pub fn as_str(&self) -> &str {
        match self {
            Self::Transport => "TRANSPORT",
            Self::Other(reason) => reason,
            known => Self::NAMED
                .iter()
                .find(|(_, reason)| reason == known)
                .map_or("", |(name, _)| name),
        }
    }
}

impl FromStr for ErrorReason {
    type Err = std::convert::Infallible;

    fn from_str(value: &str) -> Result<Self, Self::Err> {
        Ok(Self::NAMED
            .iter()
            .find(|(name, _)| *name == value)
            .map_or_else(
                || Self::Other(value.to_owned()),
                |(_, reason)| reason.clone(),
            ))
    }
}

impl fmt::Display for ErrorReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_round_trip_through_their_wire_names() {
        for (name, reason) in ErrorReason::NAMED {
            assert_eq!(name.parse::<ErrorReason>().unwrap(), reason);
            assert_eq!(reason.as_str(), name);
        }
        assert_eq!(
            "SOMETHING_NEW".parse::<ErrorReason>().unwrap(),
            ErrorReason::Other("SOMETHING_NEW".into())
        );
    }

    #[test]
    fn a_journal_status_decodes_into_a_typed_reason_with_details() {
        let mut details = tonic_types::ErrorDetails::with_error_info(
            "LEASE_LOST",
            "opjournal.dev",
            [("current_attempt".to_owned(), "2".to_owned())],
        );
        details.set_retry_info(Some(Duration::from_secs(3)));
        let status = Status::with_error_details(Code::Aborted, "lease lost", details);
        let error = ClientError::from(status);
        assert_eq!(error.code, Code::Aborted);
        assert_eq!(error.reason, ErrorReason::LeaseLost);
        assert_eq!(error.retry_after, Some(Duration::from_secs(3)));
        assert_eq!(error.metadata["current_attempt"], "2");
        assert!(!error.is_transient());
    }

    #[test]
    fn a_status_without_error_info_is_a_transport_failure() {
        let error = ClientError::from(Status::unavailable("connection refused"));
        assert_eq!(error.reason, ErrorReason::Transport);
        assert!(error.is_transient());
    }

    #[test]
    fn the_lease_length_comes_from_database_timestamps() {
        let operation = Operation {
            updated_at: Some(prost_types::Timestamp {
                seconds: 100,
                nanos: 500_000_000,
            }),
            lease_until: Some(prost_types::Timestamp {
                seconds: 130,
                nanos: 500_000_000,
            }),
            ..Operation::default()
        };
        assert_eq!(lease_length(&operation), Duration::from_secs(30));
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
