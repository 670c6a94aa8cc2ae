"""The logic of ``execute`` that the sync and the asyncio client share.

Request building, Begin's decisions, the classification of the provider call, the waits
(``in_progress_wait``, ``settle_wait``) and the repetition of reports whose answer was lost
live here once, as a generator (:func:`plan`) that yields what to do next -- an RPC, a sleep,
the provider call -- and gets the answer sent back (or the error thrown in). The sync client
(:mod:`opjournal_client.execute`) and the asyncio client (:mod:`opjournal_client.aio`) only
perform those steps, with a thread or an asyncio task renewing the lease.
"""

from __future__ import annotations

import json
import logging
import math
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Generator, Mapping, Optional, Union

import grpc

from opjournal.v1 import journal_pb2 as pb

from .errors import InvalidArgumentError, LeaseExpiredBeforeCallError, OpjournalError
from .outcomes import (
    ERROR_CODE_PATTERN,
    Classifier,
    DuplicateIntentSuspected,
    FailedFinal,
    InProgress,
    Outcome,
    ProviderResult,
    Rejection,
    Succeeded,
    UnexpectedDecisionError,
    UnknownOutcome,
    VerificationRequired,
    default_classify,
    unknown_outcome_code,
)

LOG = logging.getLogger("opjournal_client")

#: Seconds each call may take before it fails with ``DEADLINE_EXCEEDED``.
DEFAULT_TIMEOUT_SECONDS = 10.0

#: Seconds a report (Complete, Fail, ReportUnknown) whose answer was lost is repeated for.
DEFAULT_REPORT_RETRY_SECONDS = 30.0

#: Seconds ``execute`` repeats a Begin whose answer was lost, with the same attempt id.
DEFAULT_BEGIN_RETRY_SECONDS = 10.0

#: The status codes after which a report (or a Begin) may or may not have landed: it is
#: repeated with the same token and outcome (the journal answers a repeated report with the
#: same record), or, for a Begin, with the same attempt id (the journal answers it with the
#: lease it granted to the first). A connection that cannot be made is ``UNAVAILABLE`` too.
RETRIED_REPORT_CODES = frozenset(
    {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED, grpc.StatusCode.DEADLINE_EXCEEDED}
)

#: The error code of the unknown outcome reported when the journal refused the success
#: report of a provider call that acted (``INVALID_ARGUMENT``: ``INVALID_RESULT``,
#: ``RESULT_TOO_LARGE``, ``INVALID_EXTERNAL_ID``, ...).
RESULT_REFUSED = "result_refused"

#: The error code of the unknown outcome reported when the provider's result cannot be
#: serialized as JSON.
RESULT_NOT_SERIALIZABLE = "result_not_serializable"

_FIRST_DELAY = 0.05
_MAX_DELAY = 1.0


def to_json_text(value: Any) -> str:
    """``value`` as JSON text: a ``str`` is taken as JSON text already; anything else is
    serialized with :func:`json.dumps` (NaN and infinities refused, as I-JSON requires).

    Raises:
        TypeError / ValueError: when the value cannot be serialized.
    """
    if isinstance(value, str):
        return value
    return json.dumps(value, allow_nan=False, ensure_ascii=False, separators=(",", ":"))


@dataclass(frozen=True)
class JsonValue:
    """A result that is a value, never JSON text: ``value`` is always serialized with the JSON
    encoder (a ``str`` becomes a JSON string), so a replay gives back an equal value.
    ``@idempotent`` and the agent integrations wrap what the protected function returned in
    it; the low-level ``result=`` arguments keep reading a ``str`` as JSON text."""

    value: Any


def result_json(result: Any) -> str:
    """The ``result_json`` of a report: ``""`` (no result body) for ``None`` or a
    :class:`JsonValue` of ``None``; a :class:`JsonValue` serialized as a value; anything
    else through :func:`to_json_text`.

    Raises:
        TypeError / ValueError: when the value cannot be serialized.
    """
    if isinstance(result, JsonValue):
        if result.value is None:
            return ""
        return json.dumps(result.value, allow_nan=False, ensure_ascii=False, separators=(",", ":"))
    return "" if result is None else to_json_text(result)


def plain_result(result: Any) -> Any:
    """``result`` without its :class:`JsonValue` wrapper."""
    return result.value if isinstance(result, JsonValue) else result


# Requests, built once for both clients.


def new_attempt_id() -> str:
    """A new random attempt id for one Begin intent: a UUID v4 (36 characters)."""
    return str(uuid.uuid4())


def begin_request(
    operation_key: str,
    action_type: str,
    payload: Any,
    *,
    namespace: str = "",
    lease_seconds: int = 0,
    references: Optional[Mapping[str, str]] = None,
    confirm_duplicate_intent: bool = False,
    attempt_id: Optional[str] = None,
) -> pb.BeginOperationRequest:
    """The BeginOperation request (``payload`` through :func:`to_json_text`), under
    ``attempt_id`` (a new :func:`new_attempt_id` when ``None``)."""
    return pb.BeginOperationRequest(
        namespace=namespace,
        operation_key=operation_key,
        action_type=action_type,
        payload_json=to_json_text(payload),
        lease_seconds=lease_seconds,
        references=dict(references or {}),
        confirm_duplicate_intent=confirm_duplicate_intent,
        attempt_id=new_attempt_id() if attempt_id is None else attempt_id,
    )


def complete_request(
    lease_token: str, *, external_id: str = "", result: Any = None
) -> pb.CompleteOperationRequest:
    """The CompleteOperation request (``result`` through :func:`result_json`; ``None``: no
    result body)."""
    return pb.CompleteOperationRequest(
        lease_token=lease_token,
        external_id=external_id,
        result_json=result_json(result),
    )


def fail_request(lease_token: str, error_code: str) -> pb.FailOperationRequest:
    """The FailOperation request."""
    return pb.FailOperationRequest(lease_token=lease_token, error_code=error_code)


def report_unknown_request(
    lease_token: str, error_code: str = ""
) -> pb.ReportUnknownOutcomeRequest:
    """The ReportUnknownOutcome request."""
    return pb.ReportUnknownOutcomeRequest(lease_token=lease_token, error_code=error_code)


def renew_request(lease_token: str, lease_seconds: int) -> pb.RenewLeaseRequest:
    """The RenewLease request."""
    return pb.RenewLeaseRequest(lease_token=lease_token, lease_seconds=lease_seconds)


def get_request(operation_key: str, namespace: str = "") -> pb.GetOperationRequest:
    """The GetOperation request."""
    return pb.GetOperationRequest(namespace=namespace, operation_key=operation_key)


def derive_request(
    action_type: str, intent_reference: str, namespace: str = ""
) -> pb.DeriveOperationKeyRequest:
    """The DeriveOperationKey request."""
    return pb.DeriveOperationKeyRequest(
        namespace=namespace, action_type=action_type, intent_reference=intent_reference
    )


def reconcile_request(operation_key: str, namespace: str = "") -> pb.ReconcileOperationRequest:
    """The ReconcileOperation request."""
    return pb.ReconcileOperationRequest(namespace=namespace, operation_key=operation_key)


# Outcomes of records.


def granted_lease_seconds(operation: pb.Operation) -> int:
    """The length of the lease Begin granted, by the server's clock (at least 1 s)."""
    granted = (
        operation.lease_until.ToNanoseconds() - operation.updated_at.ToNanoseconds()
    ) / 1e9
    return max(1, math.ceil(granted))


def granted_lease_length(operation: pb.Operation) -> float:
    """The exact length of the lease Begin (or a renewal) granted, in seconds, from two
    database-clock timestamps (``lease_until - updated_at``); 0 when either is missing."""
    if not operation.HasField("lease_until") or not operation.HasField("updated_at"):
        return 0.0
    granted = operation.lease_until.ToNanoseconds() - operation.updated_at.ToNanoseconds()
    return max(0.0, granted / 1e9)


def succeeded(operation: pb.Operation, replayed: bool, provider_result: Any = None) -> Succeeded:
    """The :class:`Succeeded` of a SUCCEEDED record."""
    external_id = operation.external_id if operation.HasField("external_id") else None
    result = json.loads(operation.result_json) if operation.HasField("result_json") else None
    return Succeeded(operation, external_id, result, replayed, provider_result)


def terminal(operation: pb.Operation, replayed: bool) -> Outcome:
    """The outcome of a SUCCEEDED or FAILED_FINAL record."""
    if operation.status == pb.OPERATION_STATUS_SUCCEEDED:
        return succeeded(operation, replayed)
    if operation.status == pb.OPERATION_STATUS_FAILED_FINAL:
        error_code = operation.error_code if operation.HasField("error_code") else None
        return FailedFinal(operation, error_code, replayed)
    raise UnexpectedDecisionError(
        f"replay of a non-terminal operation ({pb.OperationStatus.Name(operation.status)})"
    )


def classify(error: BaseException, classifier: Classifier) -> Union[Rejection, UnknownOutcome]:
    """The verdict on an exception of the provider call. Safe in every corner: only an
    ``Exception`` can be a rejection (``KeyboardInterrupt``, ``SystemExit`` and a cancelled
    task are ``interrupted``), a classifier that raises or answers ``None`` leaves it to
    :func:`default_classify`, and a verdict with a malformed code is an unknown outcome
    (``invalid_error_code``): an unproven rejection is no rejection."""
    if not isinstance(error, Exception):
        return UnknownOutcome(unknown_outcome_code(error))
    try:
        verdict = classifier(error)
    except Exception:  # noqa: BLE001 - a broken hook must not lose the report
        LOG.warning("the exception classifier raised; reporting the outcome unknown")
        verdict = None
    if verdict is None:
        verdict = default_classify(error)
    if not isinstance(verdict, (Rejection, UnknownOutcome)) or not ERROR_CODE_PATTERN.fullmatch(
        verdict.error_code
    ):
        return UnknownOutcome("invalid_error_code")
    return verdict


# What a driver performs for the plan.


@dataclass(frozen=True)
class Rpc:
    """Call ``method`` (an ``OperationJournal`` method name) once; send back its response,
    or throw its exception in."""

    method: str
    request: Any


@dataclass(frozen=True)
class Sleep:
    """Sleep ``seconds``; send back ``None``."""

    seconds: float


@dataclass(frozen=True)
class CallProvider:
    """Call the provider function with a :class:`ProviderCall` for ``operation`` while
    renewing the lease ``token`` (``lease_seconds`` long) when ``renew``; send back a
    :class:`Returned` or a :class:`Raised`, never throw. ``lease_ends_at`` is when the lease
    ends unless renewed, on ``time.monotonic()``'s clock: a driver that can cut the call
    off there (each renewal moves it to when the renewal was sent plus the length granted)
    sends back a :class:`Raised` of :class:`LeaseExpired`."""

    operation: pb.Operation
    token: str
    lease_seconds: int
    renew: bool
    lease_ends_at: float = math.inf


class LeaseExpired(Exception):
    """The provider call was cut off when its lease ended unrenewed: an unknown outcome,
    recorded as :data:`LEASE_EXPIRED`."""


#: The error code of the unknown outcome of a provider call cut off at its lease's end.
LEASE_EXPIRED = "lease_expired"


@dataclass(frozen=True)
class Returned:
    """The provider function returned ``value``."""

    value: Any


@dataclass(frozen=True)
class Raised:
    """The provider function raised ``error``."""

    error: BaseException


Step = Union[Rpc, Sleep, CallProvider]
Plan = Generator[Step, Any, Outcome]


@dataclass(frozen=True)
class ExecuteOptions:
    """The options of ``execute``, checked once (see :func:`opjournal_client.execute`)."""

    namespace: str = ""
    lease_seconds: int = 0
    references: Optional[Mapping[str, str]] = None
    confirm_duplicate_intent: bool = False
    renew_lease: bool = True
    classify: Classifier = field(default=default_classify)
    in_progress_wait: float = 0.0
    settle_wait: float = 0.0

    def __post_init__(self) -> None:
        if self.lease_seconds < 0 or self.in_progress_wait < 0 or self.settle_wait < 0:
            raise ValueError("lease_seconds, in_progress_wait and settle_wait must be >= 0")


def _report(method: str, request: Any, retry_seconds: float) -> Generator[Step, Any, pb.Operation]:
    """Sends a report, repeating it with the same token and outcome while its answer is lost
    (:data:`RETRIED_REPORT_CODES`), with backoff, for up to ``retry_seconds``."""
    response = yield from _repeated(method, request, retry_seconds)
    operation: pb.Operation = response.operation
    return operation


def _repeated(method: str, request: Any, retry_seconds: float) -> Generator[Step, Any, Any]:
    """Sends ``request``, repeating it unchanged while its answer is lost
    (:data:`RETRIED_REPORT_CODES`), with backoff, for up to ``retry_seconds``; returns the
    response."""
    started = time.monotonic()
    delay = _FIRST_DELAY
    while True:
        try:
            return (yield Rpc(method, request))
        except OpjournalError as error:
            elapsed = time.monotonic() - started
            if error.code not in RETRIED_REPORT_CODES or elapsed + delay > retry_seconds:
                raise
            LOG.warning(
                "%s not answered (%s); repeating it in %.2f s", method, error.code.name, delay
            )
            yield Sleep(delay)
            delay = min(delay * 2, _MAX_DELAY)


def plan(
    begin: pb.BeginOperationRequest,
    options: ExecuteOptions,
    report_retry_seconds: float,
    begin_retry_seconds: float = DEFAULT_BEGIN_RETRY_SECONDS,
) -> Plan:
    """``execute`` as a sequence of steps; returns the :data:`Outcome`.

    Every Begin of the plan carries the attempt id of ``begin`` (one is drawn when it has
    none): the plan calls the provider at most once, after the one EXECUTE it receives, so a
    repeat that gets a lease back only ever stands in for an answer that never arrived. A
    Begin whose answer is lost is repeated for up to ``begin_retry_seconds``."""
    if not begin.attempt_id:
        with_attempt = pb.BeginOperationRequest()
        with_attempt.CopyFrom(begin)
        with_attempt.attempt_id = new_attempt_id()
        begin = with_attempt
    started = time.monotonic()
    in_progress_delay = settle_delay = _FIRST_DELAY * 2
    while True:
        # A repeat after a lost answer gets the lease granted to the first Begin of the
        # chain: its lease is measured from here.
        sent_at = time.monotonic()
        answer: pb.BeginOperationResponse = yield from _repeated(
            "BeginOperation", begin, begin_retry_seconds
        )
        operation = answer.operation
        decision = answer.decision
        if decision == pb.DECISION_REPLAY:
            return terminal(operation, replayed=True)
        if decision == pb.DECISION_IN_PROGRESS:
            retry_after = answer.retry_after.ToTimedelta().total_seconds()
            remaining = started + options.in_progress_wait - time.monotonic()
            if remaining <= 0:
                return InProgress(operation, retry_after)
            # Never later than retry_after says, and often enough to see an early finish.
            yield Sleep(min(max(retry_after, _FIRST_DELAY), in_progress_delay, remaining))
            in_progress_delay = min(in_progress_delay * 2, _MAX_DELAY)
            continue
        if decision == pb.DECISION_VERIFICATION_REQUIRED:
            remaining = started + options.settle_wait - time.monotonic()
            if remaining <= 0:
                return VerificationRequired(operation, reported=False)
            yield Sleep(min(settle_delay, remaining))
            settle_delay = min(settle_delay * 2, _MAX_DELAY)
            continue
        if decision == pb.DECISION_DUPLICATE_INTENT_SUSPECTED:
            return DuplicateIntentSuspected(operation, answer.duplicate_of_operation_key)
        if decision != pb.DECISION_EXECUTE:
            raise UnexpectedDecisionError(f"unknown decision {decision}")
        length = granted_lease_length(answer.operation)
        if time.monotonic() >= sent_at + length:
            # The answer came after the lease it grants had ended: another holder may have
            # it by now. Call nothing, report nothing.
            raise LeaseExpiredBeforeCallError(length)
        return (yield from _execute(answer, options, report_retry_seconds, sent_at + length))


def _execute(
    answer: pb.BeginOperationResponse,
    options: ExecuteOptions,
    report_retry_seconds: float,
    lease_ends_at: float = math.inf,
) -> Plan:
    operation = answer.operation
    token = answer.lease_token
    called = yield CallProvider(
        operation, token, granted_lease_seconds(operation), options.renew_lease, lease_ends_at
    )
    if isinstance(called, Raised):
        error = called.error
        verdict = (
            UnknownOutcome(LEASE_EXPIRED)
            if isinstance(error, LeaseExpired)
            else classify(error, options.classify)
        )
        if isinstance(verdict, Rejection):
            failed = yield from _report(
                "FailOperation", fail_request(token, verdict.error_code), report_retry_seconds
            )
            return FailedFinal(failed, verdict.error_code, False, error)
        recorded = yield from _report(
            "ReportUnknownOutcome",
            report_unknown_request(token, verdict.error_code),
            report_retry_seconds,
        )
        if not isinstance(error, Exception):
            raise error
        return VerificationRequired(
            recorded, reported=True, error_code=verdict.error_code, cause=error
        )

    returned = called.value
    if not isinstance(returned, ProviderResult):
        yield from _report(
            "ReportUnknownOutcome",
            report_unknown_request(token, "invalid_provider_result"),
            report_retry_seconds,
        )
        raise TypeError("the provider function must return a ProviderResult")
    try:
        request = complete_request(token, external_id=returned.external_id, result=returned.result)
    except (TypeError, ValueError) as error:
        # The effect happened but its result cannot be recorded: unknown, for the
        # reconciler to settle (its lookup finds the effect), never a failure.
        LOG.warning(
            "the provider's result cannot be serialized (%s); reporting the outcome unknown",
            type(error).__name__,
        )
        recorded = yield from _report(
            "ReportUnknownOutcome",
            report_unknown_request(token, RESULT_NOT_SERIALIZABLE),
            report_retry_seconds,
        )
        return VerificationRequired(
            recorded, reported=True, error_code=RESULT_NOT_SERIALIZABLE, cause=error
        )
    try:
        done = yield from _report("CompleteOperation", request, report_retry_seconds)
    except InvalidArgumentError as error:
        # The journal refused the success report (INVALID_RESULT, RESULT_TOO_LARGE,
        # INVALID_EXTERNAL_ID, ...) after the provider acted: unknown, never raised as if
        # nothing had happened.
        LOG.warning(
            "the journal refused the success report (%s); reporting the outcome unknown",
            error.reason or error.code.name,
        )
        recorded = yield from _report(
            "ReportUnknownOutcome",
            report_unknown_request(token, RESULT_REFUSED),
            report_retry_seconds,
        )
        return VerificationRequired(
            recorded, reported=True, error_code=RESULT_REFUSED, cause=error
        )
    return succeeded(done, replayed=False, provider_result=plain_result(returned.result))
