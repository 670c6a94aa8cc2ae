"""``execute``: one side-effecting provider call, made safe to retry through the journal.

The source article's ``executeOperation``. Begin registers the intent; only
``DECISION_EXECUTE`` lets the provider be called, with ``operation.provider_key`` as its
idempotency key, while a background thread renews the lease. (The asyncio twin is
:func:`opjournal_client.aio.execute`; both run the steps of :mod:`opjournal_client._core`.) The outcome is then classified
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

import threading
import time
from typing import TYPE_CHECKING, Any, Callable, Mapping, Optional

import grpc

from opjournal.v1 import journal_pb2 as pb

from . import _core
from .errors import LeaseLostError, OpjournalError, decode_error
from .outcomes import (
    ERROR_CODE_PATTERN,
    Classifier,
    DuplicateIntentSuspected,
    FailedFinal,
    InProgress,
    LeaseDeadline,
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

if TYPE_CHECKING:
    from .client import JournalClient

LOG = _core.LOG

__all__ = [
    "ERROR_CODE_PATTERN",
    "DuplicateIntentSuspected",
    "FailedFinal",
    "InProgress",
    "Outcome",
    "ProviderCall",
    "ProviderOutcomeUnknown",
    "ProviderRejected",
    "ProviderResult",
    "Succeeded",
    "UnexpectedDecisionError",
    "VerificationRequired",
    "confirmed_rejection_code",
    "execute",
    "unknown_outcome_code",
]


class _LeaseRenewer:
    """Renews a lease in the background every third of its length until stopped."""

    def __init__(
        self,
        client: JournalClient,
        lease_token: str,
        lease_seconds: int,
        deadline: Optional[LeaseDeadline] = None,
    ) -> None:
        self._client = client
        self._token = lease_token
        self._seconds = lease_seconds
        self.deadline = deadline if deadline is not None else LeaseDeadline()
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
                sent_at = time.monotonic()
                renewed = self._client.renew_lease(self._token, self._seconds)
                self.deadline.move_to(sent_at + _core.granted_lease_length(renewed))
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


def _legacy_classifier(
    is_confirmed_rejection: Optional[Callable[[BaseException], Optional[str]]],
    unknown_error_code: Optional[Callable[[BaseException], str]],
    classify: Optional[Classifier],
) -> Classifier:
    """One classifier from the options: ``classify`` wins; the older pair of hooks is
    turned into one."""
    if classify is not None:
        return classify
    if is_confirmed_rejection is None and unknown_error_code is None:
        return default_classify
    rejection = is_confirmed_rejection or confirmed_rejection_code
    unknown = unknown_error_code or unknown_outcome_code

    def classifier(error: BaseException) -> Rejection | UnknownOutcome:
        code = rejection(error)
        return Rejection(code) if code is not None else UnknownOutcome(unknown(error))

    return classifier


#: The error code of the unknown outcome reported when the caller was interrupted
#: (``KeyboardInterrupt``) while Begin was in flight and Begin granted a lease: the provider
#: was not called.
INTERRUPTED_BEFORE_CALL = "cancelled_before_call"


def _outcome_of(future: Any) -> Any:
    try:
        return future.result()
    except grpc.RpcError as error:
        raise decode_error(error) from error


def _begin_interruptible(client: JournalClient, request: Any) -> Any:
    """BeginOperation as a gRPC future, so that a ``KeyboardInterrupt`` while it is in
    flight does not lose a granted lease: the answer is still awaited (within the call's
    deadline) and, if Begin granted a lease, the outcome is reported unknown at once
    (``cancelled_before_call``: the provider was not called, and the reconcile worker's
    lookup releases the key), then the interrupt is re-raised."""
    future = client.journal.BeginOperation.future(
        request, timeout=client._timeout, metadata=client._metadata
    )
    try:
        return _outcome_of(future)
    except KeyboardInterrupt:
        _release_after_interrupt(client, future)
        raise


def _release_after_interrupt(client: JournalClient, future: Any) -> None:
    while True:
        try:
            answer = _outcome_of(future)
            break
        except KeyboardInterrupt:
            continue  # the call has a deadline
        except Exception:  # noqa: BLE001 - Begin failed: no lease was granted
            return
    if answer.decision != pb.DECISION_EXECUTE:
        return
    LOG.warning(
        "interrupted while BeginOperation was in flight; reporting the outcome unknown "
        "(the provider was not called)"
    )
    try:
        client.report_unknown(answer.lease_token, INTERRUPTED_BEFORE_CALL)
    except OpjournalError as error:
        # The lease then ends unreported; the reconcile worker's sweep finds it.
        LOG.warning("the unknown outcome was not recorded: %s", error.code.name)


def run_plan(
    client: JournalClient,
    steps: _core.Plan,
    call: Callable[[ProviderCall], Any],
) -> Outcome:
    """Performs the steps of :func:`opjournal_client._core.plan` with the sync client."""
    answer: Any = None
    failure: Optional[BaseException] = None
    while True:
        try:
            step = steps.throw(failure) if failure is not None else steps.send(answer)
        except StopIteration as stop:
            outcome: Outcome = stop.value
            return outcome
        answer, failure = None, None
        if isinstance(step, _core.CallProvider):
            renewer = _LeaseRenewer(
                client, step.token, step.lease_seconds, LeaseDeadline(step.lease_ends_at)
            )
            if step.renew:
                renewer.start()
            try:
                answer = _core.Returned(
                    call(
                        ProviderCall(
                            step.operation.provider_key,
                            step.operation,
                            renewer.lost,
                            renewer.deadline,
                        )
                    )
                )
            except BaseException as error:  # noqa: BLE001 - every outcome must be recorded
                answer = _core.Raised(error)
            finally:
                renewer.stop()
            continue
        try:
            if isinstance(step, _core.Sleep):
                time.sleep(step.seconds)
            elif step.method == "BeginOperation":
                answer = _begin_interruptible(client, step.request)
            else:
                answer = client._invoke(step.method, step.request)
        except Exception as error:  # noqa: BLE001 - the plan decides
            failure = error


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
    classify: Optional[Classifier] = None,
    in_progress_wait: float = 0.0,
    settle_wait: float = 0.0,
    is_confirmed_rejection: Optional[Callable[[BaseException], Optional[str]]] = None,
    unknown_error_code: Optional[Callable[[BaseException], str]] = None,
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
        classify: maps an exception from ``call`` to a :class:`Rejection` (confirmed: no
            effect) or an :class:`UnknownOutcome`; ``None`` from it, or no hook, means
            :func:`default_classify` (only :class:`ProviderRejected` is a rejection).
        in_progress_wait: seconds to wait while another holder's lease is live: Begin is
            asked again no later than its ``retry_after`` says (and at least every second)
            until another decision or the deadline, then :class:`InProgress` is returned.
            0: answer at once.
        settle_wait: seconds to wait when Begin answers ``VERIFICATION_REQUIRED``: Begin is
            asked again with backoff (0.1 s doubling to 1 s) until the reconciler settled
            the operation -- its stored outcome is returned (``replayed=True``), or, when
            the lookup proved the effect absent, the provider is called -- or the deadline,
            then :class:`VerificationRequired` is returned. An unknown outcome reported by
            this call itself is returned at once. 0: answer at once.
        is_confirmed_rejection: the older form of ``classify``: an exception to the error
            code of a confirmed rejection, or ``None``.
        unknown_error_code: the older form of ``classify``: an exception to a short code.

    Returns:
        One of :class:`Succeeded`, :class:`FailedFinal`, :class:`VerificationRequired`,
        :class:`InProgress`, :class:`DuplicateIntentSuspected`. When the provider acted
        but the journal refused the success report (``INVALID_ARGUMENT``: e.g.
        ``INVALID_RESULT``, ``RESULT_TOO_LARGE``, ``INVALID_EXTERNAL_ID``), the outcome is
        reported unknown and ``VerificationRequired(reported=True,
        error_code="result_refused", cause=<the InvalidArgumentError>)`` is returned (a
        warning names the reason, never the result); a result that cannot be serialized
        likewise gives ``error_code="result_not_serializable"``. ``ProviderResult.result``
        here may be JSON text (a ``str`` is sent as it is) or a value.

    Reports whose answer is lost (``UNAVAILABLE``, ``CANCELLED``, ``DEADLINE_EXCEEDED``,
    a connection that cannot be made) are repeated with the same token and outcome, with
    backoff, for up to the client's ``report_retry_seconds`` (30 s by default). A Begin
    whose answer is lost is repeated the same way with the same attempt id (one random id
    per ``execute`` call), for up to ``begin_retry_seconds`` (10 s): the journal answers
    the repeat with the lease it granted, so the provider is called once, at that attempt.

    Raises:
        IdempotencyKeyReusedError: the key is bound to another payload or action type; the
            provider was not called.
        LeaseLostError: another holder took the lease over before this call's report; the
            report was not recorded (that holder's outcome counts). ``ProviderCall.lease_lost``
            was set meanwhile if a renewal saw it first.
        InvalidArgumentError: a malformed request (Begin's: nothing was registered). A
            refused success report is not raised: see Returns.
        JournalUnavailableError: the journal could not be reached (for a report: not within
            ``report_retry_seconds``). Calling ``execute`` again with the same key is safe:
            an unreported lease ends and the operation is reconciled.
        BaseException: ``KeyboardInterrupt`` and the like from ``call`` are re-raised after
            the outcome was reported unknown. A ``KeyboardInterrupt`` while Begin is in
            flight waits for Begin's answer (within the call's deadline); a granted lease
            is reported unknown (``cancelled_before_call``: the provider was not called),
            then the interrupt is re-raised.
    """
    options = _core.ExecuteOptions(
        namespace=namespace,
        lease_seconds=lease_seconds,
        references=references,
        confirm_duplicate_intent=confirm_duplicate_intent,
        renew_lease=renew_lease,
        classify=_legacy_classifier(is_confirmed_rejection, unknown_error_code, classify),
        in_progress_wait=in_progress_wait,
        settle_wait=settle_wait,
    )
    begin = _core.begin_request(
        operation_key,
        action_type,
        payload,
        namespace=namespace,
        lease_seconds=lease_seconds,
        references=references,
        confirm_duplicate_intent=confirm_duplicate_intent,
    )
    steps = _core.plan(begin, options, client.report_retry_seconds)
    return run_plan(client, steps, call)
