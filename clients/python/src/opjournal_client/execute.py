"""``execute``: one side-effecting provider call, made safe to retry through the journal.

The source article's ``executeOperation``. Begin registers the intent; only
``DECISION_EXECUTE`` lets the provider be called, with ``operation.provider_key`` as its
idempotency key, while a background thread renews the lease. The outcome is then classified
the only safe way:

* the function returned a :class:`ProviderResult` -> CompleteOperation -> :class:`Succeeded`;
* it raised :class:`ProviderRejected` (or ``is_confirmed_rejection`` named an error code):
  the provider proved that no effect happened -> FailOperation -> :class:`FailedFinal`;
* anything else -- a timeout, a reset connection, a 5xx, an unexpected exception -- may have
  happened at the provider: ReportUnknownOutcome -> :class:`VerificationRequired`. It is
  never treated as a failure, and the provider is not called again until the operation has
  been reconciled.

The other decisions are answers too, never exceptions: a replay returns the stored outcome
(:class:`Succeeded` or :class:`FailedFinal` with ``replayed=True``), and
:class:`InProgress`, :class:`VerificationRequired` and :class:`DuplicateIntentSuspected`
say why the provider was not called. Errors (a reused key, a lost lease, a bad request, an
unreachable journal) raise the :mod:`opjournal_client.errors` classes.
"""

from __future__ import annotations

import json
import logging
import math
import re
import threading
import urllib.error
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Mapping, Optional, Union

from opjournal.v1 import journal_pb2 as pb

from .errors import InvalidArgumentError, LeaseLostError, OpjournalError

if TYPE_CHECKING:
    from .client import JournalClient

LOG = logging.getLogger("opjournal_client")

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
class ProviderCall:
    """What the provider function gets.

    Attributes:
        provider_key: the idempotency key to send to the provider (``Operation.provider_key``:
            the key itself in the ``default`` namespace, ``namespace/key`` elsewhere).
        operation: the journal record as Begin left it (IN_PROGRESS).
        lease_lost: set when a lease renewal was refused with ``LEASE_LOST``: another holder
            may now call the provider, so a long call should stop as soon as it safely can.
    """

    provider_key: str
    operation: pb.Operation
    lease_lost: threading.Event


@dataclass(frozen=True)
class ProviderResult:
    """What the provider function returns on a confirmed success.

    Attributes:
        external_id: the provider's id of the effect (payment id, message id); up to 200
            characters; may be empty.
        result: the provider's answer to keep and replay: JSON text or a JSON-serializable
            value, ``None`` for no result body. The journal keeps only what the action's
            policy allows (``result.keep``) and never card numbers, tokens or secrets.
    """

    external_id: str = ""
    result: Any = None


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


@dataclass(frozen=True)
class FailedFinal:
    """The provider proved no effect happened; the operation is terminal. ``cause`` is the
    :class:`ProviderRejected` (or classified exception) of this call, ``None`` on a replay."""

    operation: pb.Operation
    error_code: Optional[str]
    replayed: bool
    cause: Optional[BaseException] = field(default=None, compare=False)


@dataclass(frozen=True)
class VerificationRequired:
    """The outcome is unknown: the provider must not be called until the operation is
    reconciled (by the reconcile worker, ``JournalClient.reconcile`` or a reviewer). Calling
    ``execute`` again with the same key is always safe.

    ``reported`` is true when this call reported the unknown outcome itself (``error_code``
    and ``cause`` say why); false when Begin already found the operation unknown."""

    operation: pb.Operation
    reported: bool
    error_code: Optional[str] = None
    cause: Optional[BaseException] = field(default=None, compare=False)


@dataclass(frozen=True)
class InProgress:
    """Another holder's lease is live; the provider was not called. Try again after
    ``retry_after`` seconds."""

    operation: pb.Operation
    retry_after: float


@dataclass(frozen=True)
class DuplicateIntentSuspected:
    """The action's duplicate-intent policy held the request: the same payload is already
    registered under ``duplicate_of_operation_key``. Nothing was registered and the
    provider was not called. Retry under that key; pass ``confirm_duplicate_intent=True``
    only for a genuinely new intent."""

    operation: pb.Operation
    duplicate_of_operation_key: str


#: What :func:`execute` answers.
Outcome = Union[Succeeded, FailedFinal, VerificationRequired, InProgress, DuplicateIntentSuspected]


class UnexpectedDecisionError(RuntimeError):
    """Begin answered a decision this client does not know (a newer server?)."""


def confirmed_rejection_code(error: BaseException) -> Optional[str]:
    """The default ``is_confirmed_rejection``: the error code of a :class:`ProviderRejected`,
    ``None`` (not a rejection) for every other exception."""
    return error.error_code if isinstance(error, ProviderRejected) else None


def unknown_outcome_code(error: BaseException) -> str:
    """The default ``unknown_error_code``: a short code for an uncertain outcome, never the
    exception's message (which may quote payloads)."""
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


class _LeaseRenewer:
    """Renews a lease in the background every third of its length until stopped."""

    def __init__(self, client: JournalClient, lease_token: str, lease_seconds: int) -> None:
        self._client = client
        self._token = lease_token
        self._seconds = lease_seconds
        self._stop = threading.Event()
        self.lost = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name="opjournal-lease-renewal", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._seconds / 3):
            try:
                self._client.renew_lease(self._token, self._seconds)
            except LeaseLostError:
                LOG.warning("lease lost while the provider call was running")
                self.lost.set()
                return
            except OpjournalError as error:
                # Transient (journal unreachable): the lease may still be live; try again.
                LOG.warning("lease renewal failed: %s", error.code.name)

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()


def _granted_lease_seconds(operation: pb.Operation) -> int:
    """The length of the lease Begin granted, by the server's clock (at least 1 s)."""
    granted = (
        operation.lease_until.ToNanoseconds() - operation.updated_at.ToNanoseconds()
    ) / 1e9
    return max(1, math.ceil(granted))


def _succeeded(operation: pb.Operation, replayed: bool, provider_result: Any = None) -> Succeeded:
    external_id = operation.external_id if operation.HasField("external_id") else None
    result = json.loads(operation.result_json) if operation.HasField("result_json") else None
    return Succeeded(operation, external_id, result, replayed, provider_result)


def _terminal(operation: pb.Operation, replayed: bool) -> Outcome:
    if operation.status == pb.OPERATION_STATUS_SUCCEEDED:
        return _succeeded(operation, replayed)
    if operation.status == pb.OPERATION_STATUS_FAILED_FINAL:
        error_code = operation.error_code if operation.HasField("error_code") else None
        return FailedFinal(operation, error_code, replayed)
    raise UnexpectedDecisionError(
        f"replay of a non-terminal operation ({pb.OperationStatus.Name(operation.status)})"
    )


def execute(
    client: JournalClient,
    operation_key: str,
    action_type: str,
    payload: Any,
    call: Callable[[ProviderCall], ProviderResult],
    *,
    namespace: str = "",
    lease_seconds: int = 0,
    references: Optional[Mapping[str, str]] = None,
    confirm_duplicate_intent: bool = False,
    renew_lease: bool = True,
    is_confirmed_rejection: Callable[[BaseException], Optional[str]] = confirmed_rejection_code,
    unknown_error_code: Callable[[BaseException], str] = unknown_outcome_code,
) -> Outcome:
    """Runs ``call`` at most once per intent, and only when the journal says so.

    Args:
        client: the journal client.
        operation_key: the idempotency key naming the business intent (not the attempt).
        action_type: the action as named in the server's policy, e.g. ``"create_payment"``.
        payload: the provider request's parameters (JSON text or a serializable value);
            the same key with another payload raises :class:`IdempotencyKeyReusedError`.
        call: the provider call. It gets a :class:`ProviderCall` and must send
            ``provider_key`` as the provider's idempotency key. Return a
            :class:`ProviderResult` on a confirmed success, raise :class:`ProviderRejected`
            on a confirmed rejection; any other exception is an unknown outcome.
        namespace: the tenant namespace (empty: ``default``).
        lease_seconds: the lease to ask for (0: the action's default).
        references: business links kept with the record (not hashed).
        confirm_duplicate_intent: proceed after :class:`DuplicateIntentSuspected`.
        renew_lease: renew the lease every third of its length while ``call`` runs.
        is_confirmed_rejection: maps an exception from ``call`` to the error code of a
            confirmed rejection, or ``None`` when it proves nothing.
        unknown_error_code: maps any other exception to a short code for the journal.

    Returns:
        One of :class:`Succeeded`, :class:`FailedFinal`, :class:`VerificationRequired`,
        :class:`InProgress`, :class:`DuplicateIntentSuspected`.

    Raises:
        IdempotencyKeyReusedError: the key is bound to another payload or action type; the
            provider was not called.
        LeaseLostError: another holder took the lease over before this call's report; the
            report was not recorded (that holder's outcome counts).
        InvalidArgumentError: a malformed request. When the journal refuses the report of a
            call that succeeded (e.g. ``RESULT_TOO_LARGE``), the outcome is first reported
            unknown so that reconciliation settles it, then the error is raised.
        JournalUnavailableError: the journal could not be reached. Calling ``execute``
            again with the same key is safe: an unreported lease ends as unknown.
        BaseException: ``KeyboardInterrupt`` and the like from ``call`` are re-raised after
            the outcome was reported unknown.
    """
    begin = client.begin(
        operation_key,
        action_type,
        payload,
        namespace=namespace,
        lease_seconds=lease_seconds,
        references=references,
        confirm_duplicate_intent=confirm_duplicate_intent,
    )
    operation = begin.operation
    if begin.decision == pb.DECISION_REPLAY:
        return _terminal(operation, replayed=True)
    if begin.decision == pb.DECISION_IN_PROGRESS:
        return InProgress(operation, begin.retry_after.ToTimedelta().total_seconds())
    if begin.decision == pb.DECISION_VERIFICATION_REQUIRED:
        return VerificationRequired(operation, reported=False)
    if begin.decision == pb.DECISION_DUPLICATE_INTENT_SUSPECTED:
        return DuplicateIntentSuspected(operation, begin.duplicate_of_operation_key)
    if begin.decision != pb.DECISION_EXECUTE:
        raise UnexpectedDecisionError(f"unknown decision {begin.decision}")

    token = begin.lease_token
    renewer = _LeaseRenewer(client, token, _granted_lease_seconds(operation))
    if renew_lease:
        renewer.start()
    try:
        returned = call(ProviderCall(operation.provider_key, operation, renewer.lost))
    except BaseException as error:  # noqa: BLE001 - every outcome must be recorded
        renewer.stop()
        rejection = is_confirmed_rejection(error) if isinstance(error, Exception) else None
        if rejection is not None:
            return FailedFinal(client.fail(token, rejection), rejection, False, error)
        code = unknown_error_code(error)
        recorded = client.report_unknown(token, code)
        if not isinstance(error, Exception):
            raise
        return VerificationRequired(recorded, reported=True, error_code=code, cause=error)
    renewer.stop()

    if not isinstance(returned, ProviderResult):
        client.report_unknown(token, "invalid_provider_result")
        raise TypeError("the provider function must return a ProviderResult")
    try:
        done = client.complete(token, external_id=returned.external_id, result=returned.result)
    except (TypeError, ValueError):
        # The result cannot be serialized: the effect happened but cannot be recorded here.
        client.report_unknown(token, "result_not_serializable")
        raise
    except InvalidArgumentError:
        client.report_unknown(token, "report_refused")
        raise
    return _succeeded(done, replayed=False, provider_result=returned.result)
