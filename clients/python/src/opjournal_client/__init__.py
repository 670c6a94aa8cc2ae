"""Python client for opjournal, the operation journal that makes side-effecting calls safe to
retry.

* :class:`JournalClient` wraps the generated gRPC stubs (``opjournal.v1.journal_pb2`` and
  ``journal_pb2_grpc``, also importable directly) and raises typed errors.
* :func:`execute` is the source article's ``executeOperation``: Begin, call the provider
  only on ``DECISION_EXECUTE`` with ``operation.provider_key``, renew the lease meanwhile,
  and record the outcome -- success, confirmed rejection, or unknown (never "failed" for a
  timeout).
* :mod:`opjournal_client.errors` maps every ``ErrorInfo.reason`` to an exception class.
"""

from .client import DEFAULT_TIMEOUT_SECONDS, JournalClient, to_json_text
from .errors import (
    DOMAIN,
    ConcurrentModificationError,
    FieldViolation,
    IdempotencyKeyReusedError,
    InvalidArgumentError,
    JournalUnavailableError,
    KeyDerivationDisabledError,
    LeaseLostError,
    NoProviderAdapterError,
    OperationChangedError,
    OperationNotFoundError,
    OperationNotReconcilableError,
    OpjournalError,
    OutcomeAlreadyRecordedError,
    PermissionDeniedError,
    ReconcileInProgressError,
    StoreUnavailableError,
    UnauthenticatedError,
    decode_error,
)
from .execute import (
    DuplicateIntentSuspected,
    FailedFinal,
    InProgress,
    Outcome,
    ProviderCall,
    ProviderOutcomeUnknown,
    ProviderRejected,
    ProviderResult,
    Succeeded,
    UnexpectedDecisionError,
    VerificationRequired,
    confirmed_rejection_code,
    execute,
    unknown_outcome_code,
)

__all__ = [
    "DEFAULT_TIMEOUT_SECONDS",
    "DOMAIN",
    "ConcurrentModificationError",
    "DuplicateIntentSuspected",
    "FailedFinal",
    "FieldViolation",
    "IdempotencyKeyReusedError",
    "InProgress",
    "InvalidArgumentError",
    "JournalClient",
    "JournalUnavailableError",
    "KeyDerivationDisabledError",
    "LeaseLostError",
    "NoProviderAdapterError",
    "OperationChangedError",
    "OperationNotFoundError",
    "OperationNotReconcilableError",
    "OpjournalError",
    "OutcomeAlreadyRecordedError",
    "Outcome",
    "PermissionDeniedError",
    "ProviderCall",
    "ProviderOutcomeUnknown",
    "ProviderRejected",
    "ProviderResult",
    "ReconcileInProgressError",
    "StoreUnavailableError",
    "Succeeded",
    "UnauthenticatedError",
    "UnexpectedDecisionError",
    "VerificationRequired",
    "confirmed_rejection_code",
    "decode_error",
    "execute",
    "to_json_text",
    "unknown_outcome_code",
]
