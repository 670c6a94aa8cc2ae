"""Typed errors decoded from the ``google.rpc.ErrorInfo`` that every opjournal error carries.

Every non-OK status from opjournal carries exactly one ``ErrorInfo`` (domain
``opjournal.dev``) with a stable UPPER_SNAKE ``reason``; field errors add a ``BadRequest``
and retry hints a ``RetryInfo`` (AIP-193). :func:`decode_error` turns a ``grpc.RpcError``
into the :class:`OpjournalError` subclass named by that reason, so callers write
``except LeaseLostError`` instead of comparing strings. The catalog of reasons is
``docs/errors.md`` in the opjournal repository.

Messages are for people; match on the class or on :attr:`OpjournalError.reason`, never on
the message text.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Mapping, Optional

import grpc
from google.rpc import error_details_pb2
from grpc_status import rpc_status

#: The ErrorInfo domain of every error the opjournal server produces.
DOMAIN = "opjournal.dev"


@dataclass(frozen=True)
class FieldViolation:
    """One ``google.rpc.BadRequest.FieldViolation``: which request field is wrong."""

    field: str
    description: str


class OpjournalError(Exception):
    """A failed opjournal call.

    Attributes:
        code: the gRPC status code.
        reason: ``ErrorInfo.reason`` (e.g. ``"LEASE_LOST"``); empty when the status carried
            no ErrorInfo (a transport failure, or a message refused before any handler ran).
        domain: ``ErrorInfo.domain``, ``"opjournal.dev"`` for the server's own errors.
        metadata: ``ErrorInfo.metadata`` (e.g. ``{"status": "succeeded"}``).
        field_violations: the ``BadRequest`` field violations, if any.
        retry_delay: seconds from ``RetryInfo.retry_delay``, or ``None``.
        message: the status message (for people, never for matching).
    """

    def __init__(
        self,
        code: grpc.StatusCode,
        message: str,
        *,
        reason: str = "",
        domain: str = "",
        metadata: Optional[Mapping[str, str]] = None,
        field_violations: tuple[FieldViolation, ...] = (),
        retry_delay: Optional[float] = None,
    ) -> None:
        label = f"{code.name}/{reason}" if reason else code.name
        super().__init__(f"{label}: {message}" if message else label)
        self.code = code
        self.message = message
        self.reason = reason
        self.domain = domain
        self.metadata: Mapping[str, str] = MappingProxyType(dict(metadata or {}))
        self.field_violations = field_violations
        self.retry_delay = retry_delay


class IdempotencyKeyReusedError(OpjournalError):
    """``ALREADY_EXISTS`` / ``IDEMPOTENCY_KEY_REUSED``: the key is bound to another request
    hash or action type. Never call the provider: a changed request is a new intent and
    needs a new key."""


class LeaseLostError(OpjournalError):
    """``ABORTED`` / ``LEASE_LOST``: this lease was taken over (or, for RenewLease, it has
    ended). Stop calling the provider for this attempt; Begin again to see the current
    state."""


class LeaseExpiredBeforeCallError(OpjournalError):
    """``ABORTED`` / ``LEASE_EXPIRED_BEFORE_CALL``, raised by ``execute`` on this side (the
    journal never sends it): Begin's EXECUTE answer arrived after the lease it granted had
    ended, measured on this side's monotonic clock from when that Begin was sent. Another
    holder may already hold the operation, so the provider was not called and nothing was
    reported. Begin the same intent again (same key): it replays, asks for verification, or
    grants a new lease."""

    def __init__(self, lease_seconds: float) -> None:
        super().__init__(
            grpc.StatusCode.ABORTED,
            f"the Begin answer arrived after its lease of {lease_seconds:.3f} s had ended; "
            "the provider was not called: begin the same intent again to see where it stands",
            reason="LEASE_EXPIRED_BEFORE_CALL",
            domain=DOMAIN,
        )


class ConcurrentModificationError(OpjournalError):
    """``ABORTED`` / ``CONCURRENT_MODIFICATION``: the row kept changing under concurrent
    claims; repeat the same call (see :attr:`retry_delay`)."""


class OutcomeAlreadyRecordedError(OpjournalError):
    """``FAILED_PRECONDITION`` / ``OUTCOME_ALREADY_RECORDED``: this lease token already
    recorded a different outcome (``metadata["status"]``); the stored one is the truth."""


class OperationNotFoundError(OpjournalError):
    """``NOT_FOUND`` / ``OPERATION_NOT_FOUND``: no such key in the namespace."""


class OperationNotReconcilableError(OpjournalError):
    """``FAILED_PRECONDITION`` / ``OPERATION_NOT_RECONCILABLE``: pending, terminal or under
    a live lease (``metadata["status"]``); nothing to reconcile now."""


class ReconcileInProgressError(OpjournalError):
    """``FAILED_PRECONDITION`` / ``RECONCILE_IN_PROGRESS``: someone is looking the operation
    up right now; read it again shortly."""


class NoProviderAdapterError(OpjournalError):
    """``FAILED_PRECONDITION`` / ``NO_PROVIDER_ADAPTER``: the action has no lookup; a person
    must settle the operation."""


class OperationChangedError(OpjournalError):
    """``FAILED_PRECONDITION`` / ``OPERATION_CHANGED``: ResolveOperation saw another state
    than the reviewer did."""


class KeyDerivationDisabledError(OpjournalError):
    """``FAILED_PRECONDITION`` / ``KEY_DERIVATION_DISABLED``: the server has no
    ``key_derivation_secret``."""


class InvalidArgumentError(OpjournalError):
    """``INVALID_ARGUMENT``: a malformed request (``reason`` names what, e.g.
    ``INVALID_PAYLOAD``, ``KEY_CONTAINS_SENSITIVE_DATA``, ``RESULT_TOO_LARGE``); fix it,
    repeating will not help."""


class UnauthenticatedError(OpjournalError):
    """``UNAUTHENTICATED``: missing or invalid bearer token."""


class PermissionDeniedError(OpjournalError):
    """``PERMISSION_DENIED``: the token lacks the role or the namespace."""


class JournalUnavailableError(OpjournalError):
    """The journal could not be reached or did not answer in time (``UNAVAILABLE``,
    ``DEADLINE_EXCEEDED``, ``CANCELLED``: the server's transport ends a call whose deadline
    passed with a bare ``CANCELLED``, without ``ErrorInfo``). The call may or may not have
    taken effect; every opjournal call, Begin and the reports included, is safe to repeat
    with the same request and backoff."""


class StoreUnavailableError(JournalUnavailableError):
    """``UNAVAILABLE`` / ``STORE_UNAVAILABLE``: the server cannot reach its database."""


class ServerOverloadedError(JournalUnavailableError):
    """``RESOURCE_EXHAUSTED`` / ``SERVER_OVERLOADED``: the server is serving as many calls as
    it allows (``max_in_flight_requests``) and its admission queue is full, or this call
    waited in it without a place; nothing was done with it. Repeat it after
    :attr:`retry_delay`."""


_BY_REASON: dict[str, type[OpjournalError]] = {
    "IDEMPOTENCY_KEY_REUSED": IdempotencyKeyReusedError,
    "LEASE_LOST": LeaseLostError,
    "LEASE_EXPIRED_BEFORE_CALL": LeaseExpiredBeforeCallError,
    "CONCURRENT_MODIFICATION": ConcurrentModificationError,
    "OUTCOME_ALREADY_RECORDED": OutcomeAlreadyRecordedError,
    "OPERATION_NOT_FOUND": OperationNotFoundError,
    "OPERATION_NOT_RECONCILABLE": OperationNotReconcilableError,
    "RECONCILE_IN_PROGRESS": ReconcileInProgressError,
    "NO_PROVIDER_ADAPTER": NoProviderAdapterError,
    "OPERATION_CHANGED": OperationChangedError,
    "KEY_DERIVATION_DISABLED": KeyDerivationDisabledError,
    "STORE_UNAVAILABLE": StoreUnavailableError,
    "SERVER_OVERLOADED": ServerOverloadedError,
}

_BY_CODE: dict[grpc.StatusCode, type[OpjournalError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgumentError,
    grpc.StatusCode.UNAUTHENTICATED: UnauthenticatedError,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDeniedError,
    grpc.StatusCode.UNAVAILABLE: JournalUnavailableError,
    grpc.StatusCode.DEADLINE_EXCEEDED: JournalUnavailableError,
    grpc.StatusCode.CANCELLED: JournalUnavailableError,
}


def decode_error(error: grpc.RpcError) -> OpjournalError:
    """Decodes a failed call (sync or asyncio) into the :class:`OpjournalError` subclass for its reason.

    The class is chosen by ``ErrorInfo.reason`` (``opjournal.dev`` domain) first, then by
    the status code, falling back to :class:`OpjournalError`. ``BadRequest`` and
    ``RetryInfo`` details are decoded into :attr:`~OpjournalError.field_violations` and
    :attr:`~OpjournalError.retry_delay`.
    """
    # A sync call's error is a grpc.Call; an asyncio call's (grpc.aio.AioRpcError) has the
    # same code(), details() and trailing_metadata() without being one.
    call: Any = error if callable(getattr(error, "code", None)) else None
    code = call.code() if call is not None else grpc.StatusCode.UNKNOWN
    message = (call.details() if call is not None else None) or ""
    reason = domain = ""
    metadata: dict[str, str] = {}
    violations: list[FieldViolation] = []
    retry_delay: Optional[float] = None
    try:
        status = rpc_status.from_call(call) if call is not None else None
    except ValueError:  # a status proto that disagrees with the call's code: ignore it
        status = None
    for detail in status.details if status is not None else ():
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            reason, domain, metadata = info.reason, info.domain, dict(info.metadata)
        elif detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
            bad = error_details_pb2.BadRequest()
            detail.Unpack(bad)
            violations.extend(
                FieldViolation(v.field, v.description) for v in bad.field_violations
            )
        elif detail.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
            retry = error_details_pb2.RetryInfo()
            detail.Unpack(retry)
            retry_delay = retry.retry_delay.ToTimedelta().total_seconds()
    cls = _BY_REASON.get(reason) if domain == DOMAIN else None
    cls = cls or _BY_CODE.get(code, OpjournalError)
    return cls(
        code,
        message,
        reason=reason,
        domain=domain,
        metadata=metadata,
        field_violations=tuple(violations),
        retry_delay=retry_delay,
    )
