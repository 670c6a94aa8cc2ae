"""What a provider call gets and returns, what ``execute`` answers, and how exceptions of the
provider call are classified. Shared by the sync and the asyncio client."""

from __future__ import annotations

import math
import re
import threading
import time
import urllib.error
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Union

from opjournal.v1 import journal_pb2 as pb

#: The journal's rule for error codes: 1-100 characters of ``[A-Za-z0-9._:-]``.
ERROR_CODE_PATTERN = re.compile(r"[A-Za-z0-9._:-]{1,100}")


def _checked_code(error_code: str) -> str:
    if not ERROR_CODE_PATTERN.fullmatch(error_code):
        raise ValueError("error codes are 1-100 characters of [A-Za-z0-9._:-]")
    return error_code


class ProviderRejected(Exception):
    """Raise from the provider function when the provider *proved* that no effect happened
    and none will (a declined card, a validation error before anything was stored).

    Only definitive answers qualify: a timeout, a reset connection, a 5xx or a proxy's odd
    answer are not rejections. ``error_code`` is a short machine code such as
    ``"card_declined"`` (1-100 characters of ``[A-Za-z0-9._:-]``, else ``ValueError``).
    """

    def __init__(self, error_code: str) -> None:
        super().__init__(error_code)
        self.error_code = _checked_code(error_code)


class ProviderOutcomeUnknown(Exception):
    """Raise from the provider function to report an uncertain outcome with your own code
    (e.g. ``"http_502"``); any other exception is reported as unknown too."""

    def __init__(self, error_code: str) -> None:
        super().__init__(error_code)
        self.error_code = _checked_code(error_code)


@dataclass(frozen=True)
class Rejection:
    """A classifier's verdict: the provider proved no effect happened (``FailOperation``
    with ``error_code``, 1-100 characters of ``[A-Za-z0-9._:-]``)."""

    error_code: str


@dataclass(frozen=True)
class UnknownOutcome:
    """A classifier's verdict: the effect may have happened (``ReportUnknownOutcome`` with
    ``error_code``, 1-100 characters of ``[A-Za-z0-9._:-]``)."""

    error_code: str


#: A classifier: maps an exception of the provider call to a :class:`Rejection` or an
#: :class:`UnknownOutcome`; ``None`` leaves it to :func:`default_classify`.
Classifier = Callable[[BaseException], Union[Rejection, UnknownOutcome, None]]


class LeaseDeadline:
    """When the lease of a provider call ends unless it is renewed, on ``time.monotonic()``'s
    clock: Begin's send time plus the length granted, moved on by each renewal (to when it
    was sent plus the length granted). No clock sync is needed: both lengths come from the
    journal's database clock, the instants from this process's monotonic clock."""

    def __init__(self, ends_at: float = math.inf) -> None:
        self._ends_at = ends_at
        self._lock = threading.Lock()

    @property
    def ends_at(self) -> float:
        """The instant, in ``time.monotonic()`` seconds (``inf`` when unknown)."""
        with self._lock:
            return self._ends_at

    def remaining(self) -> float:
        """Seconds until the lease ends (0 when it has; ``inf`` when unknown): give the
        provider request a timeout no longer than this."""
        return max(0.0, self.ends_at - time.monotonic())

    def move_to(self, ends_at: float) -> None:
        """Moves the end (a renewal)."""
        with self._lock:
            self._ends_at = ends_at


@dataclass(frozen=True)
class ProviderCall:
    """What the provider function gets (and what :func:`opjournal_client.current_call`
    answers inside a function decorated with :func:`opjournal_client.idempotent`).

    Attributes:
        provider_key: the idempotency key to send to the provider (``Operation.provider_key``:
            the key itself in the ``default`` namespace, ``namespace/key`` elsewhere).
        operation: the journal record as Begin left it (IN_PROGRESS).
        lease_lost: set when a lease renewal was refused with ``LEASE_LOST``: another holder
            may now call the provider, so a long call should stop as soon as it safely can.
            A ``threading.Event`` in the sync and the asyncio client alike (check it with
            ``is_set()``; the asyncio client sets it from its renewal task).
        lease_deadline: when the lease ends unless renewed (:class:`LeaseDeadline`). Bound
            the provider request by ``lease_deadline.remaining()``: the sync client cannot
            cut a running function short; the asyncio client cancels the call when the
            lease ends unrenewed (the outcome is then unknown, ``lease_expired``).
    """

    provider_key: str
    operation: pb.Operation
    lease_lost: threading.Event
    lease_deadline: LeaseDeadline = field(default_factory=LeaseDeadline)


@dataclass(frozen=True)
class ProviderResult:
    """What the provider function returns on a confirmed success.

    Attributes:
        external_id: the provider's id of the effect (payment id, message id); up to 200
            characters; may be empty.
        result: the provider's answer to keep and replay: for ``execute``, JSON text (a
            ``str`` is sent as it is) or a JSON-serializable value, ``None`` for no result
            body. Returned from an ``@idempotent`` function or an agent tool it is always a
            value (a ``str`` is stored as a JSON string). The journal keeps only what the action's
            policy allows (``result.keep``) and never card numbers, tokens or secrets.
    """

    external_id: str = ""
    result: Any = None


def _status_name(operation: pb.Operation) -> str:
    return pb.OperationStatus.Name(operation.status).removeprefix("OPERATION_STATUS_").lower()


def _common(operation: pb.Operation) -> dict[str, Any]:
    return {
        "operation_key": operation.operation_key,
        "namespace": operation.namespace,
        "status": _status_name(operation),
        "attempt_count": operation.attempt_count,
    }


@dataclass(frozen=True)
class Succeeded:
    """The effect happened. ``result`` is the stored (sanitized) result parsed from JSON, the
    same on every replay; ``provider_result`` is what the function returned this time
    (``None`` on a replay). ``replayed`` is true when the provider was not called now."""

    operation: pb.Operation
    external_id: Optional[str]
    result: Any
    replayed: bool
    provider_result: Any = None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serializable summary for a program or an agent: ``{"outcome":
        "succeeded", "replayed", "external_id", "result", "operation_key", "namespace",
        "status", "attempt_count"}`` (``result`` is the stored result)."""
        return {
            "outcome": "succeeded",
            "replayed": self.replayed,
            "external_id": self.external_id,
            "result": self.result,
            **_common(self.operation),
        }


@dataclass(frozen=True)
class FailedFinal:
    """The provider proved no effect happened; the operation is terminal. ``cause`` is the
    :class:`ProviderRejected` (or classified exception) of this call, ``None`` on a replay."""

    operation: pb.Operation
    error_code: Optional[str]
    replayed: bool
    cause: Optional[BaseException] = field(default=None, compare=False)

    def to_dict(self) -> dict[str, Any]:
        """``{"outcome": "failed_final", "replayed", "error_code", ...}`` (see
        :meth:`Succeeded.to_dict`)."""
        return {
            "outcome": "failed_final",
            "replayed": self.replayed,
            "error_code": self.error_code,
            **_common(self.operation),
        }


@dataclass(frozen=True)
class VerificationRequired:
    """The outcome is unknown: the provider must not be called until the operation is
    reconciled (by the reconcile worker, ``JournalClient.reconcile`` or a reviewer). Calling
    ``execute`` again with the same key is always safe.

    ``reported`` is true when this call reported the unknown outcome itself (``error_code``
    and ``cause`` say why); false when Begin found the operation unknown."""

    operation: pb.Operation
    reported: bool
    error_code: Optional[str] = None
    cause: Optional[BaseException] = field(default=None, compare=False)

    def to_dict(self) -> dict[str, Any]:
        """``{"outcome": "verification_required", "reported", "error_code", ...}``."""
        return {
            "outcome": "verification_required",
            "reported": self.reported,
            "error_code": self.error_code,
            **_common(self.operation),
        }


@dataclass(frozen=True)
class InProgress:
    """Another holder's lease is live; the provider was not called. Try again after
    ``retry_after`` seconds."""

    operation: pb.Operation
    retry_after: float

    def to_dict(self) -> dict[str, Any]:
        """``{"outcome": "in_progress", "retry_after" (seconds), ...}``."""
        return {"outcome": "in_progress", "retry_after": self.retry_after, **_common(self.operation)}


@dataclass(frozen=True)
class DuplicateIntentSuspected:
    """The action's duplicate-intent policy held the request: the same payload is already
    registered under ``duplicate_of_operation_key``. Nothing was registered and the
    provider was not called. Retry under that key; pass ``confirm_duplicate_intent=True``
    only for a genuinely new intent."""

    operation: pb.Operation
    duplicate_of_operation_key: str

    def to_dict(self) -> dict[str, Any]:
        """``{"outcome": "duplicate_intent_suspected", "duplicate_of_operation_key"}``."""
        return {
            "outcome": "duplicate_intent_suspected",
            "duplicate_of_operation_key": self.duplicate_of_operation_key,
        }


#: What ``execute`` answers.
Outcome = Union[Succeeded, FailedFinal, VerificationRequired, InProgress, DuplicateIntentSuspected]


class UnexpectedDecisionError(RuntimeError):
    """Begin answered a decision this client does not know (a newer server?)."""


def confirmed_rejection_code(error: BaseException) -> Optional[str]:
    """The default ``is_confirmed_rejection``: the error code of a :class:`ProviderRejected`,
    ``None`` (not a rejection) for every other exception."""
    return error.error_code if isinstance(error, ProviderRejected) else None


def unknown_outcome_code(error: BaseException) -> str:
    """The default ``unknown_error_code``: a short code for an uncertain outcome, never the
    exception's message (which may quote payloads): ``timeout``, ``connection_reset``,
    ``connection_error``, ``http_<status>``, ``interrupted`` (``KeyboardInterrupt``,
    ``SystemExit``, a cancelled task) or ``exception``."""
    if isinstance(error, ProviderOutcomeUnknown):
        return error.error_code
    cause: Any = error.reason if isinstance(error, urllib.error.URLError) else error
    if isinstance(cause, TimeoutError):
        return "timeout"
    if isinstance(cause, ConnectionResetError):
        return "connection_reset"
    if isinstance(cause, ConnectionError):
        return "connection_error"
    if isinstance(error, urllib.error.HTTPError):
        return f"http_{error.code}"
    if not isinstance(error, Exception):
        return "interrupted"
    return "exception"


def default_classify(error: BaseException) -> Union[Rejection, UnknownOutcome]:
    """The safe default: a :class:`ProviderRejected` is a :class:`Rejection`; everything
    else is an :class:`UnknownOutcome` with :func:`unknown_outcome_code`'s code."""
    code = confirmed_rejection_code(error)
    if code is not None and isinstance(error, Exception):
        return Rejection(code)
    return UnknownOutcome(unknown_outcome_code(error))
