//! [`JournalClient`]: one typed method per RPC, each with a deadline.

use std::future::Future;
use std::time::{Duration, Instant};

use backon::{ExponentialBuilder, Retryable as _};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Request, Response, Status};

use crate::auth::{BearerToken, InvalidToken};
use crate::error::ClientError;
use crate::intent::{AttemptId, Begun, Intent, Lease, required};
use crate::proto::operation_journal_client::OperationJournalClient;
use crate::proto::reconciler_client::ReconcilerClient;
use crate::proto::{self, Operation};

type Authorized = InterceptedService<Channel, BearerToken>;

/// How long one call waits for its answer unless [`JournalClient::with_call_timeout`] says
/// otherwise: 10 seconds.
pub const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// How long [`JournalClient::execute`] repeats a report whose answer was lost unless
/// [`JournalClient::with_report_retry`] says otherwise: 30 seconds.
pub const DEFAULT_REPORT_RETRY: Duration = Duration::from_secs(30);

/// How long [`JournalClient::begin`] repeats a Begin whose answer was lost unless
/// [`JournalClient::with_begin_retry`] says otherwise: 10 seconds.
pub const DEFAULT_BEGIN_RETRY: Duration = Duration::from_secs(10);

/// A client of the `OperationJournal` and `Reconciler` services on one channel.
///
/// Every call carries a deadline (sent as `grpc-timeout`, and enforced here): without an
/// answer in time it fails with `DEADLINE_EXCEEDED`/[`crate::ErrorReason::Transport`].
/// Cheap to clone; clones share the channel.
#[derive(Debug, Clone)]
pub struct JournalClient {
    pub(crate) journal: OperationJournalClient<Authorized>,
    pub(crate) reconciler: ReconcilerClient<Authorized>,
    pub(crate) call_timeout: Duration,
    pub(crate) report_retry_for: Duration,
    pub(crate) begin_retry_for: Duration,
}

impl JournalClient {
    /// Connects to `url` (`http://host:port`, or `https://` with the system's roots).
    ///
    /// Errors: an invalid URL (`INVALID_ARGUMENT`) or an unreachable server (`UNAVAILABLE`),
    /// both with reason [`crate::ErrorReason::Transport`].
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

    /// A client over an existing channel (TLS and load balancing are the channel's),
    /// without a token.
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
            call_timeout: DEFAULT_CALL_TIMEOUT,
            report_retry_for: DEFAULT_REPORT_RETRY,
            begin_retry_for: DEFAULT_BEGIN_RETRY,
        }
    }

    /// The same client with another deadline for each call (default
    /// [`DEFAULT_CALL_TIMEOUT`]).
    #[must_use]
    pub fn with_call_timeout(mut self, timeout: Duration) -> Self {
        self.call_timeout = timeout;
        self
    }

    /// The same client repeating lost reports for up to `bound` (default
    /// [`DEFAULT_REPORT_RETRY`]; zero sends each report once).
    #[must_use]
    pub fn with_report_retry(mut self, bound: Duration) -> Self {
        self.report_retry_for = bound;
        self
    }

    /// The same client repeating a Begin whose answer was lost for up to `bound` (default
    /// [`DEFAULT_BEGIN_RETRY`]; zero sends each Begin once).
    #[must_use]
    pub fn with_begin_retry(mut self, bound: Duration) -> Self {
        self.begin_retry_for = bound;
        self
    }

    /// The deadline of each call.
    pub fn call_timeout(&self) -> Duration {
        self.call_timeout
    }

    /// `message` as a request carrying the call's deadline.
    pub(crate) fn request<T>(&self, message: T) -> Request<T> {
        let mut request = Request::new(message);
        request.set_timeout(self.call_timeout);
        request
    }

    /// Awaits `call` for at most the call's deadline.
    pub(crate) async fn answer<T>(
        &self,
        call: impl Future<Output = Result<Response<T>, Status>>,
    ) -> Result<T, ClientError> {
        let started = Instant::now();
        match tokio::time::timeout(self.call_timeout, call).await {
            Ok(Ok(response)) => Ok(response.into_inner()),
            // tonic ends a call whose `grpc-timeout` passed with a bare CANCELLED.
            Ok(Err(status))
                if status.code() == Code::Cancelled
                    && status.details().is_empty()
                    && started.elapsed() >= self.call_timeout =>
            {
                Err(ClientError::deadline(self.call_timeout))
            }
            Ok(Err(status)) => Err(status.into()),
            Err(_) => Err(ClientError::deadline(self.call_timeout)),
        }
    }

    /// `BeginOperation`: registers the intent or reads where it stands, under a new random
    /// [`AttemptId`] (see [`Self::begin_as`]).
    ///
    /// Errors: `ALREADY_EXISTS`/[`crate::ErrorReason::IdempotencyKeyReused`] for the same key
    /// with another payload or action type; `INVALID_ARGUMENT` with field violations for a
    /// bad key, namespace, action type or payload; `UNAVAILABLE`/`STORE_UNAVAILABLE` (or
    /// `DEADLINE_EXCEEDED`, `CANCELLED`) when no try was answered within the retry bound.
    pub async fn begin(&self, intent: &Intent) -> Result<Begun, ClientError> {
        self.begin_as(intent, &AttemptId::random()).await
    }

    /// `BeginOperation` under `attempt`. A Begin whose answer is lost (`UNAVAILABLE`,
    /// `DEADLINE_EXCEEDED`, `CANCELLED`: the server may have granted a lease) is sent again
    /// with the same attempt id, with backoff (100 ms doubling to 2 s, jittered), while the
    /// client's Begin bound lasts ([`Self::with_begin_retry`], 10 s by default): the journal
    /// answers such a repeat with the lease it granted to the first, so the caller still gets
    /// `EXECUTE`, at the same attempt, rather than `IN_PROGRESS` against its own lease. Use
    /// one attempt id per intent; reuse it only for repeats of the same Begin.
    ///
    /// Errors: as [`Self::begin`].
    pub async fn begin_as(
        &self,
        intent: &Intent,
        attempt: &AttemptId,
    ) -> Result<Begun, ClientError> {
        let started = Instant::now();
        let bound = self.begin_retry_for;
        (|| self.begin_once(intent, attempt))
            .retry(repeat_backoff(bound))
            // No repeat starts once the bound has passed, however long each try took.
            .when(|err| {
                matches!(
                    err.code,
                    Code::Unavailable | Code::DeadlineExceeded | Code::Cancelled
                ) && started.elapsed() < bound
            })
            .notify(|err, _| {
                tracing::warn!(code = ?err.code, reason = %err.reason, "begin unanswered; repeating it with the same attempt id");
            })
            .await
    }
    /// One `BeginOperation` call.
    async fn begin_once(&self, intent: &Intent, attempt: &AttemptId) -> Result<Begun, ClientError> {
        let request = self.request(proto::BeginOperationRequest {
            namespace: intent.namespace.clone(),
            operation_key: intent.operation_key.clone(),
            action_type: intent.action_type.clone(),
            payload_json: intent.payload.to_string(),
            lease_seconds: intent.lease.map_or(0, |lease| {
                i32::try_from(lease.as_secs()).unwrap_or(i32::MAX)
            }),
            references: intent.references.clone().into_iter().collect(),
            confirm_duplicate_intent: intent.confirm_duplicate_intent,
            attempt_id: attempt.as_str().to_owned(),
        });
        let response = self
            .answer(self.journal.clone().begin_operation(request))
            .await?;
        Begun::from_response(response)
    }

    /// `CompleteOperation`: the provider confirmed the effect.
    ///
    /// `result` is stored as canonical JSON after the action's result policy sanitized it.
    /// Errors: `ABORTED`/[`crate::ErrorReason::LeaseLost`] when a later lease exists;
    /// `FAILED_PRECONDITION`/`OUTCOME_ALREADY_RECORDED` when another outcome was recorded.
    pub async fn complete(
        &self,
        lease: &Lease,
        external_id: Option<&str>,
        result: Option<&serde_json::Value>,
    ) -> Result<Operation, ClientError> {
        let request = self.request(proto::CompleteOperationRequest {
            lease_token: lease.token.clone(),
            external_id: external_id.unwrap_or_default().to_owned(),
            result_json: result.map(ToString::to_string).unwrap_or_default(),
        });
        let response = self
            .answer(self.journal.clone().complete_operation(request))
            .await?;
        required(response.operation)
    }

    /// `FailOperation`: the provider confirmed that nothing happened (`failed_final`).
    ///
    /// `error_code`: 1–100 characters of `[A-Za-z0-9._:-]`. Errors as [`Self::complete`].
    pub async fn fail(&self, lease: &Lease, error_code: &str) -> Result<Operation, ClientError> {
        let request = self.request(proto::FailOperationRequest {
            lease_token: lease.token.clone(),
            error_code: error_code.to_owned(),
        });
        let response = self
            .answer(self.journal.clone().fail_operation(request))
            .await?;
        required(response.operation)
    }

    /// `ReportUnknownOutcome`: the effect may or may not have happened (`unknown`); the
    /// reconcile worker will ask the provider. Errors as [`Self::complete`].
    pub async fn report_unknown(
        &self,
        lease: &Lease,
        error_code: Option<&str>,
    ) -> Result<Operation, ClientError> {
        let request = self.request(proto::ReportUnknownOutcomeRequest {
            lease_token: lease.token.clone(),
            error_code: error_code.unwrap_or_default().to_owned(),
        });
        let response = self
            .answer(self.journal.clone().report_unknown_outcome(request))
            .await?;
        required(response.operation)
    }

    /// `RenewLease`: extends the lease to `length` from now (database clock; whole seconds,
    /// at least the server's minimum). Errors: `ABORTED`/[`crate::ErrorReason::LeaseLost`].
    pub async fn renew(&self, lease: &Lease, length: Duration) -> Result<Operation, ClientError> {
        let request = self.request(proto::RenewLeaseRequest {
            lease_token: lease.token.clone(),
            lease_seconds: i32::try_from(length.as_secs()).unwrap_or(i32::MAX),
        });
        let response = self
            .answer(self.journal.clone().renew_lease(request))
            .await?;
        required(response.operation)
    }

    /// `GetOperation`: the record, or `NOT_FOUND`/[`crate::ErrorReason::OperationNotFound`].
    /// An empty `namespace` means `default`.
    pub async fn get(
        &self,
        namespace: &str,
        operation_key: &str,
    ) -> Result<Operation, ClientError> {
        let request = self.request(proto::GetOperationRequest {
            namespace: namespace.to_owned(),
            operation_key: operation_key.to_owned(),
        });
        required(
            self.answer(self.journal.clone().get_operation(request))
                .await?
                .operation,
        )
    }

    /// `DeriveOperationKey`: the server's opaque, stable key (`ok_` and 52 characters of
    /// `[a-z2-7]`) for `intent_reference` (1–1024 bytes; may hold personal data: it is
    /// never stored or logged). An empty `namespace` means `default`.
    ///
    /// Errors: `FAILED_PRECONDITION`/`KEY_DERIVATION_DISABLED` when the server has no
    /// secret; `INVALID_ARGUMENT` for a bad namespace, action type or reference.
    pub async fn derive_key(
        &self,
        namespace: &str,
        action_type: &str,
        intent_reference: &str,
    ) -> Result<String, ClientError> {
        let request = self.request(proto::DeriveOperationKeyRequest {
            namespace: namespace.to_owned(),
            action_type: action_type.to_owned(),
            intent_reference: intent_reference.to_owned(),
        });
        let response = self
            .answer(self.journal.clone().derive_operation_key(request))
            .await?;
        Ok(response.operation_key)
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
        let request = self.request(proto::ReconcileOperationRequest {
            namespace: namespace.to_owned(),
            operation_key: operation_key.to_owned(),
        });
        let mut reconciler = self.reconciler.clone();
        self.answer(reconciler.reconcile_operation(request)).await
    }
}

/// The backoff of a repeated call (a Begin with its attempt id, a report with its lease
/// token): 100 ms doubling to 2 s, jittered, for at most `bound` in all.
pub(crate) fn repeat_backoff(bound: Duration) -> ExponentialBuilder {
    ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(100))
        .with_max_delay(Duration::from_secs(2))
        .with_total_delay(Some(bound))
        .without_max_times()
        .with_jitter()
}
