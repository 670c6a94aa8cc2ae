"""Python client for opjournal, the operation journal that makes side-effecting calls safe to
retry.

* :func:`idempotent` turns a function (sync or ``async def``) with a side effect into one
  that runs at most once per intent; :func:`current_call` gives it the provider key.
* :class:`JournalClient` (sync) and :class:`AsyncJournalClient` (``grpc.aio``) wrap the
  generated gRPC stubs (``opjournal.v1.journal_pb2`` and ``journal_pb2_grpc``, also
  importable directly) and raise typed errors.
* :func:`execute` (and ``JournalClient.execute`` / ``AsyncJournalClient.execute``) is the
  source article's ``executeOperation``: Begin, call the provider only on
  ``DECISION_EXECUTE`` with ``operation.provider_key``, renew the lease meanwhile, and
  record the outcome -- success, confirmed rejection, or unknown (never "failed" for a
  timeout) -- repeating a report whose answer was lost.
* :mod:`opjournal_client.errors` maps every ``ErrorInfo.reason`` to an exception class.
"""

from ._core import (
    DEFAULT_BEGIN_RETRY_SECONDS,
    DEFAULT_REPORT_RETRY_SECONDS,
    DEFAULT_TIMEOUT_SECONDS,
    to_json_text,
)
from .aio import AsyncJournalClient
from .client import JournalClient
from .decorator import (
    DuplicateIntentSuspectedError,
    FailedFinalError,
    IdempotentSpec,
    InProgressError,
    OutcomeError,
    VerificationRequiredError,
    current_call,
    idempotent,
    raise_for_outcome,
)
from .errors import (
    DOMAIN,
    ConcurrentModificationError,
    FieldViolation,
    IdempotencyKeyReusedError,
    InvalidArgumentError,
    JournalUnavailableError,
    KeyDerivationDisabledError,
    LeaseExpiredBeforeCallError,
    LeaseLostError,
    NoProviderAdapterError,
    OperationChangedError,
    OperationNotFoundError,
    OperationNotReconcilableError,
    OpjournalError,
    OutcomeAlreadyRecordedError,
    PermissionDeniedError,
    ReconcileInProgressError,
    ServerOverloadedError,
    StoreUnavailableError,
    UnauthenticatedError,
    decode_error,
)
from .execute import execute
from .outcomes import (
    Classifier,
    DuplicateIntentSuspected,
    FailedFinal,
    InProgress,
    Outcome,
    ProviderCall,
    ProviderOutcomeUnknown,
    ProviderRejected,
    ProviderResult,
    Rejection,
    Succeeded,
    UnexpectedDecisionError,
    UnknownOutcome,
    VerificationRequired,
    confirmed_rejection_code,
    default_classify,
    unknown_outcome_code,
)

__version__ = "0.2.0"

__all__ = [
    "DEFAULT_BEGIN_RETRY_SECONDS",
    "DEFAULT_REPORT_RETRY_SECONDS",
    "DEFAULT_TIMEOUT_SECONDS",
    "DOMAIN",
    "AsyncJournalClient",
    "Classifier",
    "ConcurrentModificationError",
    "DuplicateIntentSuspected",
    "DuplicateIntentSuspectedError",
    "FailedFinal",
    "FailedFinalError",
    "FieldViolation",
    "IdempotencyKeyReusedError",
    "IdempotentSpec",
    "InProgress",
    "InProgressError",
    "InvalidArgumentError",
    "JournalClient",
    "JournalUnavailableError",
    "KeyDerivationDisabledError",
    "LeaseExpiredBeforeCallError",
    "LeaseLostError",
    "NoProviderAdapterError",
    "OperationChangedError",
    "OperationNotFoundError",
    "OperationNotReconcilableError",
    "OpjournalError",
    "Outcome",
    "OutcomeAlreadyRecordedError",
    "OutcomeError",
    "PermissionDeniedError",
    "ProviderCall",
    "ProviderOutcomeUnknown",
    "ProviderRejected",
    "ProviderResult",
    "ReconcileInProgressError",
    "ServerOverloadedError",
    "Rejection",
    "StoreUnavailableError",
    "Succeeded",
    "UnauthenticatedError",
    "UnexpectedDecisionError",
    "UnknownOutcome",
    "VerificationRequired",
    "VerificationRequiredError",
    "__version__",
    "confirmed_rejection_code",
    "current_call",
    "decode_error",
    "default_classify",
    "execute",
    "idempotent",
    "raise_for_outcome",
    "to_json_text",
    "unknown_outcome_code",
]
