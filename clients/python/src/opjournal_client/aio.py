"""The asyncio client, on ``grpc.aio``: :class:`AsyncJournalClient` has the methods of
:class:`opjournal_client.JournalClient` as coroutines, and :func:`execute` is the async twin
of :func:`opjournal_client.execute.execute` -- the provider function is an ``async def``,
the lease is renewed by an asyncio task, and the decisions, outcomes, waits, report
repetition and errors are the same (both run :mod:`opjournal_client._core`).

Create the client inside the event loop that uses it (``grpc.aio`` channels belong to one
loop), e.g. ``async with AsyncJournalClient.connect(target) as journal: ...``.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any, Awaitable, Callable, Mapping, Optional, Sequence

import grpc
import grpc.aio

from opjournal.v1 import journal_pb2 as pb
from opjournal.v1 import journal_pb2_grpc as pb_grpc

from . import _core
from ._core import (
    DEFAULT_BEGIN_RETRY_SECONDS,
    DEFAULT_REPORT_RETRY_SECONDS,
    DEFAULT_TIMEOUT_SECONDS,
)
from .client import channel_options
from .errors import LeaseLostError, OpjournalError, decode_error
from .execute import _legacy_classifier
from .outcomes import Classifier, LeaseDeadline, Outcome, ProviderCall, ProviderResult

__all__ = ["AsyncJournalClient", "AsyncProviderFunction", "execute"]

#: An async provider function: gets the :class:`ProviderCall`, returns a
#: :class:`ProviderResult` (or raises, as for the sync client).
AsyncProviderFunction = Callable[[ProviderCall], Awaitable[ProviderResult]]


class AsyncJournalClient:
    """An asyncio client of one opjournal server (``grpc.aio``).

    The same methods as :class:`opjournal_client.JournalClient`, as coroutines, with the
    same arguments, answers and typed errors. Use it as an async context manager, or await
    :meth:`close`. Safe to share between the tasks of one event loop.

    Args:
        channel: a ``grpc.aio`` channel to the server.
        token: a bearer token, sent as ``authorization: Bearer <token>`` on every call.
        timeout: seconds each call may take (the gRPC deadline); every call has one.
        report_retry_seconds: how long :func:`execute` repeats a report whose answer was
            lost (``UNAVAILABLE``, ``CANCELLED``, ``DEADLINE_EXCEEDED``).
        begin_retry_seconds: how long :func:`execute` repeats a Begin whose answer was
            lost (the same codes), with the same attempt id.
    """

    def __init__(
        self,
        channel: grpc.aio.Channel,
        *,
        token: Optional[str] = None,
        timeout: float = DEFAULT_TIMEOUT_SECONDS,
        report_retry_seconds: float = DEFAULT_REPORT_RETRY_SECONDS,
        begin_retry_seconds: float = DEFAULT_BEGIN_RETRY_SECONDS,
    ) -> None:
        self._channel = channel
        self._metadata: tuple[tuple[str, str], ...] = (
            (("authorization", f"Bearer {token}"),) if token else ()
        )
        self._timeout = timeout
        #: Seconds :func:`execute` repeats a report whose answer was lost.
        self.report_retry_seconds = report_retry_seconds
        #: Seconds ``execute`` repeats a Begin whose answer was lost (same attempt id).
        self.begin_retry_seconds = begin_retry_seconds
        #: The generated OperationJournal stub on the asyncio channel.
        self.journal = pb_grpc.OperationJournalStub(channel)
        #: The generated Reconciler stub on the asyncio channel.
        self.reconciler = pb_grpc.ReconcilerStub(channel)

    @classmethod
    def connect(
        cls,
        target: str,
        *,
        token: Optional[str] = None,
        tls: bool = False,
        root_certificates: Optional[bytes] = None,
        private_key: Optional[bytes] = None,
        certificate_chain: Optional[bytes] = None,
        timeout: float = DEFAULT_TIMEOUT_SECONDS,
        report_retry_seconds: float = DEFAULT_REPORT_RETRY_SECONDS,
        begin_retry_seconds: float = DEFAULT_BEGIN_RETRY_SECONDS,
        options: Sequence[tuple[str, Any]] = (),
    ) -> "AsyncJournalClient":
        """Opens a ``grpc.aio`` channel to ``target`` (``host:port``); TLS as for
        :meth:`opjournal_client.JournalClient.connect`."""
        if tls or root_certificates or private_key or certificate_chain:
            credentials = grpc.ssl_channel_credentials(
                root_certificates=root_certificates,
                private_key=private_key,
                certificate_chain=certificate_chain,
            )
            channel = grpc.aio.secure_channel(
                target, credentials, options=channel_options(options)
            )
        else:
            channel = grpc.aio.insecure_channel(target, options=channel_options(options))
        return cls(
            channel,
            token=token,
            timeout=timeout,
            report_retry_seconds=report_retry_seconds,
            begin_retry_seconds=begin_retry_seconds,
        )

    async def close(self) -> None:
        """Closes the channel."""
        await self._channel.close()

    async def __aenter__(self) -> "AsyncJournalClient":
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def _call(self, method: Any, request: Any) -> Any:
        try:
            return await method(request, timeout=self._timeout, metadata=self._metadata)
        except grpc.RpcError as error:
            raise decode_error(error) from error

    async def _invoke(self, method: str, request: Any) -> Any:
        """Calls the ``OperationJournal`` method named ``method`` (``execute``'s steps)."""
        return await self._call(getattr(self.journal, method), request)

    # OperationJournal

    async def begin(
        self,
        operation_key: str,
        action_type: str,
        payload: Any,
        *,
        namespace: str = "",
        lease_seconds: int = 0,
        references: Optional[Mapping[str, str]] = None,
        confirm_duplicate_intent: bool = False,
        attempt_id: Optional[str] = None,
    ) -> pb.BeginOperationResponse:
        """BeginOperation (see :meth:`opjournal_client.JournalClient.begin`)."""
        request = _core.begin_request(
            operation_key,
            action_type,
            payload,
            namespace=namespace,
            lease_seconds=lease_seconds,
            references=references,
            confirm_duplicate_intent=confirm_duplicate_intent,
            attempt_id=attempt_id,
        )
        response: pb.BeginOperationResponse = await self._call(self.journal.BeginOperation, request)
        return response

    async def complete(
        self, lease_token: str, *, external_id: str = "", result: Any = None
    ) -> pb.Operation:
        """CompleteOperation (see :meth:`opjournal_client.JournalClient.complete`)."""
        request = _core.complete_request(lease_token, external_id=external_id, result=result)
        response = await self._call(self.journal.CompleteOperation, request)
        operation: pb.Operation = response.operation
        return operation

    async def fail(self, lease_token: str, error_code: str) -> pb.Operation:
        """FailOperation (see :meth:`opjournal_client.JournalClient.fail`)."""
        response = await self._call(
            self.journal.FailOperation, _core.fail_request(lease_token, error_code)
        )
        operation: pb.Operation = response.operation
        return operation

    async def report_unknown(self, lease_token: str, error_code: str = "") -> pb.Operation:
        """ReportUnknownOutcome (see :meth:`opjournal_client.JournalClient.report_unknown`)."""
        response = await self._call(
            self.journal.ReportUnknownOutcome,
            _core.report_unknown_request(lease_token, error_code),
        )
        operation: pb.Operation = response.operation
        return operation

    async def renew_lease(self, lease_token: str, lease_seconds: int) -> pb.Operation:
        """RenewLease (see :meth:`opjournal_client.JournalClient.renew_lease`)."""
        response = await self._call(
            self.journal.RenewLease, _core.renew_request(lease_token, lease_seconds)
        )
        operation: pb.Operation = response.operation
        return operation

    async def get(self, operation_key: str, *, namespace: str = "") -> pb.Operation:
        """GetOperation (see :meth:`opjournal_client.JournalClient.get`)."""
        response = await self._call(
            self.journal.GetOperation, _core.get_request(operation_key, namespace)
        )
        operation: pb.Operation = response.operation
        return operation

    async def derive_key(
        self, action_type: str, intent_reference: str, *, namespace: str = ""
    ) -> str:
        """DeriveOperationKey (see :meth:`opjournal_client.JournalClient.derive_key`)."""
        response = await self._call(
            self.journal.DeriveOperationKey,
            _core.derive_request(action_type, intent_reference, namespace),
        )
        key: str = response.operation_key
        return key

    # Reconciler

    async def reconcile(
        self, operation_key: str, *, namespace: str = ""
    ) -> pb.ReconcileOperationResponse:
        """ReconcileOperation (see :meth:`opjournal_client.JournalClient.reconcile`)."""
        response: pb.ReconcileOperationResponse = await self._call(
            self.reconciler.ReconcileOperation, _core.reconcile_request(operation_key, namespace)
        )
        return response

    async def execute(
        self,
        operation_key: str,
        action_type: str,
        payload: Any,
        call: AsyncProviderFunction,
        *,
        namespace: str = "",
        lease_seconds: int = 0,
        references: Optional[Mapping[str, str]] = None,
        confirm_duplicate_intent: bool = False,
        renew_lease: bool = True,
        classify: Optional[Classifier] = None,
        in_progress_wait: float = 0.0,
        settle_wait: float = 0.0,
    ) -> Outcome:
        """:func:`execute` with this client (see there)."""
        return await execute(
            self,
            operation_key,
            action_type,
            payload,
            call,
            namespace=namespace,
            lease_seconds=lease_seconds,
            references=references,
            confirm_duplicate_intent=confirm_duplicate_intent,
            renew_lease=renew_lease,
            classify=classify,
            in_progress_wait=in_progress_wait,
            settle_wait=settle_wait,
        )


async def _renew(
    client: AsyncJournalClient,
    token: str,
    seconds: int,
    lost: threading.Event,
    deadline: LeaseDeadline,
) -> None:
    """Renews a lease every third of its length until cancelled, moving ``deadline`` on
    with each renewal; sets ``lost`` on ``LEASE_LOST``."""
    while True:
        await asyncio.sleep(seconds / 3)
        try:
            sent_at = time.monotonic()
            renewed = await client.renew_lease(token, seconds)
            deadline.move_to(sent_at + _core.granted_lease_length(renewed))
        except LeaseLostError:
            _core.LOG.warning("lease lost while the provider call was running")
            lost.set()
            return
        except OpjournalError as error:
            # Transient (journal unreachable): the lease may still be live; try again.
            _core.LOG.warning("lease renewal failed: %s", error.code.name)


async def _call_provider(
    client: AsyncJournalClient, step: _core.CallProvider, call: AsyncProviderFunction
) -> _core.Returned | _core.Raised:
    lost = threading.Event()
    deadline = LeaseDeadline(step.lease_ends_at)
    renewer = (
        asyncio.ensure_future(_renew(client, step.token, step.lease_seconds, lost, deadline))
        if step.renew
        else None
    )
    provider = ProviderCall(step.operation.provider_key, step.operation, lost, deadline)
    try:
        return _core.Returned(await _within_lease(call(provider), deadline))
    except BaseException as error:  # noqa: BLE001 - every outcome must be recorded
        return _core.Raised(error)
    finally:
        if renewer is not None:
            renewer.cancel()
            try:
                await renewer
            except asyncio.CancelledError:
                pass


async def _within_lease(call: Awaitable[ProviderResult], deadline: LeaseDeadline) -> ProviderResult:
    """Awaits ``call`` until ``deadline`` (which renewals move on); cancels it there.

    Raises:
        _core.LeaseExpired: the lease ended first (the call was cancelled).
    """
    task = asyncio.ensure_future(call)
    try:
        while True:
            remaining = deadline.remaining()
            if remaining <= 0:
                break
            done, _ = await asyncio.wait({task}, timeout=min(remaining, 3600.0))
            if done:
                return task.result()
    except BaseException:
        task.cancel()
        raise
    task.cancel()
    try:
        await task
    except BaseException:  # noqa: BLE001 - cancelled: its end does not change the outcome
        pass
    raise _core.LeaseExpired()


#: The error code of the unknown outcome reported when the task was cancelled while Begin
#: was in flight and Begin granted a lease: the provider was not called.
CANCELLED_BEFORE_CALL = "cancelled_before_call"


async def _begin_shielded(client: AsyncJournalClient, request: Any) -> Any:
    """BeginOperation, shielded from the caller's cancellation so that a granted lease is
    never lost. When the caller is cancelled while Begin is in flight, its answer is still
    awaited (within the call's deadline); if it granted a lease (``DECISION_EXECUTE``), the
    provider was not called, and the outcome is reported unknown at once
    (``cancelled_before_call``) -- no protocol verb gives a lease back, and a lease left
    alone would keep the intent ``IN_PROGRESS`` until it ends. The reconcile worker's
    lookup then proves the absence and releases the key. The cancellation is re-raised."""
    begin = asyncio.ensure_future(client._invoke("BeginOperation", request))
    try:
        return await asyncio.shield(begin)
    except asyncio.CancelledError:
        await _release_after_cancel(client, begin)
        raise


async def _release_after_cancel(client: AsyncJournalClient, begin: "asyncio.Future[Any]") -> None:
    """Waits for the shielded Begin (a repeated cancellation does not stop the wait: the
    call has a deadline), then reports a granted lease unknown (``cancelled_before_call``)."""
    while not begin.done():
        try:
            await asyncio.shield(begin)
        except asyncio.CancelledError:
            continue
        except Exception:  # noqa: BLE001 - Begin failed: no lease was granted
            return
    if begin.cancelled() or begin.exception() is not None:
        return
    answer: pb.BeginOperationResponse = begin.result()
    if answer.decision != pb.DECISION_EXECUTE:
        return
    _core.LOG.warning(
        "cancelled while BeginOperation was in flight; reporting the outcome unknown "
        "(the provider was not called)"
    )
    report = asyncio.ensure_future(
        client._invoke(
            "ReportUnknownOutcome",
            _core.report_unknown_request(answer.lease_token, CANCELLED_BEFORE_CALL),
        )
    )
    while not report.done():
        try:
            await asyncio.shield(report)
        except asyncio.CancelledError:
            continue
        except OpjournalError as error:
            # The lease then ends unreported; the reconcile worker's sweep finds it.
            _core.LOG.warning("the unknown outcome was not recorded: %s", error.code.name)
            return


async def run_plan(
    client: AsyncJournalClient, steps: _core.Plan, call: AsyncProviderFunction
) -> Outcome:
    """Performs the steps of :func:`opjournal_client._core.plan` with the asyncio client."""
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
            answer = await _call_provider(client, step, call)
            continue
        try:
            if isinstance(step, _core.Rpc) and step.method == "BeginOperation":
                answer = await _begin_shielded(client, step.request)
            elif isinstance(step, _core.Sleep):
                await asyncio.sleep(step.seconds)
            else:
                answer = await client._invoke(step.method, step.request)
        except Exception as error:  # noqa: BLE001 - the plan decides
            failure = error


async def execute(
    client: AsyncJournalClient,
    operation_key: str,
    action_type: str,
    payload: Any,
    call: AsyncProviderFunction,
    *,
    namespace: str = "",
    lease_seconds: int = 0,
    references: Optional[Mapping[str, str]] = None,
    confirm_duplicate_intent: bool = False,
    renew_lease: bool = True,
    classify: Optional[Classifier] = None,
    in_progress_wait: float = 0.0,
    settle_wait: float = 0.0,
) -> Outcome:
    """Runs the ``async def`` provider function ``call`` at most once per intent, and only
    when the journal says so: :func:`opjournal_client.execute.execute` on asyncio, with the
    same arguments, waits, outcomes and errors. The lease is renewed by an asyncio task
    while ``call`` runs; ``ProviderCall.lease_lost`` is set if a renewal sees
    ``LEASE_LOST``, and the report then raises :class:`LeaseLostError`. A cancelled
    ``call`` (``asyncio.CancelledError``) is reported unknown (``interrupted``) and the
    cancellation re-raised. A task cancelled while Begin is in flight waits for Begin's
    answer (shielded, within the call's deadline): a granted lease is reported unknown
    (``cancelled_before_call``: the provider was not called), then the cancellation is
    re-raised. A refused success report returns ``VerificationRequired(reported=True,
    error_code="result_refused")`` as the sync ``execute`` does."""
    options = _core.ExecuteOptions(
        namespace=namespace,
        lease_seconds=lease_seconds,
        references=references,
        confirm_duplicate_intent=confirm_duplicate_intent,
        renew_lease=renew_lease,
        classify=_legacy_classifier(None, None, classify),
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
    steps = _core.plan(begin, options, client.report_retry_seconds, client.begin_retry_seconds)
    return await run_plan(client, steps, call)
