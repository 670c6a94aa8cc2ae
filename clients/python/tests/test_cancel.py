"""A caller cancelled (asyncio) or interrupted (``KeyboardInterrupt``) while Begin is in
flight, against the real server and sandbox: the granted lease is not lost but reported
unknown at once (``cancelled_before_call``), the provider is never called, and a
reconciliation proves the absence and releases the key, so the next call executes.
``tests/it/python_client.rs`` checks the rows and the sandbox's counts afterwards.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import grpc
import grpc.aio
import pytest

from conftest import Sandbox
from opjournal.v1 import journal_pb2 as pb
from opjournal_client import JournalClient, current_call, idempotent
from opjournal_client.aio import AsyncJournalClient

PAY = {"amount_minor": 1000, "currency": "EUR"}


class SlowBeginAnswer(grpc.aio.UnaryUnaryClientInterceptor):  # type: ignore[misc]
    """Delivers BeginOperation's answer ``seconds`` late: the journal has answered, the
    caller has not read it yet (a slow network)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    async def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        call = await continuation(details, request)
        method = details.method
        if (method.decode() if isinstance(method, bytes) else method).endswith("/BeginOperation"):
            await call
            await asyncio.sleep(self.seconds)
        return call


def released_then_executed(client: JournalClient, sandbox: Sandbox, key: str, pay: Any) -> None:
    """The row is unknown (``cancelled_before_call``), nothing reached the provider, a
    reconciliation releases it, and the next call executes once."""
    operation = client.get(key)
    assert operation.status == pb.OPERATION_STATUS_UNKNOWN
    assert operation.error_code == "cancelled_before_call"
    assert sandbox.effects(key)["requests"] == 0
    # The lookup proves the absence (the test policy's grace window is 0): released.
    client.reconcile(key)
    assert client.get(key).status == pb.OPERATION_STATUS_PENDING
    assert pay()["status"] == "succeeded"
    assert client.get(key).status == pb.OPERATION_STATUS_SUCCEEDED
    assert sandbox.effects(key) == {"requests": 1, "effects": 1, "lookups": 1}


def test_a_task_cancelled_while_begin_is_in_flight_reports_its_lease_unknown(
    client: JournalClient, sandbox: Sandbox
) -> None:
    key = "py:cancel:async"
    calls: list[str] = []

    async def scenario() -> None:
        channel = grpc.aio.insecure_channel(
            os.environ["OPJOURNAL_TEST_SERVER"], interceptors=[SlowBeginAnswer(0.5)]
        )
        async with AsyncJournalClient(channel) as journal:

            @idempotent(journal, action_type="create_payment", key=key)
            async def create_payment(order_id: str) -> dict[str, Any]:
                calls.append(order_id)
                return sandbox.pay(current_call().provider_key, PAY)

            task = asyncio.ensure_future(create_payment("c1"))
            await asyncio.sleep(0.2)  # Begin is answered, its answer still on the way
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

    asyncio.run(scenario())
    assert calls == []

    @idempotent(client, action_type="create_payment", key=key)
    def create_payment(order_id: str) -> dict[str, Any]:
        calls.append(order_id)
        return sandbox.pay(current_call().provider_key, PAY)

    released_then_executed(client, sandbox, key, lambda: create_payment("c1"))
    assert calls == ["c1"]


class _InterruptedOnce:
    """A real BeginOperation future whose first wait is interrupted, as Ctrl-C would."""

    def __init__(self, future: Any) -> None:
        self._future = future
        self._interrupted = False

    def result(self, timeout: Any = None) -> Any:
        if not self._interrupted:
            self._interrupted = True
            raise KeyboardInterrupt
        return self._future.result(timeout)


class _FirstBeginInterrupted:
    """BeginOperation whose first call's wait is interrupted; later calls are untouched."""

    def __init__(self, method: Any) -> None:
        self._method = method
        self._first = True

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._method(*args, **kwargs)

    def future(self, *args: Any, **kwargs: Any) -> Any:
        future = self._method.future(*args, **kwargs)
        if self._first:
            self._first = False
            return _InterruptedOnce(future)
        return future


def test_a_keyboard_interrupt_while_begin_is_in_flight_reports_its_lease_unknown(
    sandbox: Sandbox,
) -> None:
    key = "py:cancel:sync"
    calls: list[str] = []
    with JournalClient.connect(os.environ["OPJOURNAL_TEST_SERVER"]) as journal:
        journal.journal.BeginOperation = _FirstBeginInterrupted(journal.journal.BeginOperation)

        @idempotent(journal, action_type="create_payment", key=key)
        def create_payment(order_id: str) -> dict[str, Any]:
            calls.append(order_id)
            return sandbox.pay(current_call().provider_key, PAY)

        with pytest.raises(KeyboardInterrupt):
            create_payment("s1")
        assert calls == []
        released_then_executed(journal, sandbox, key, lambda: create_payment("s1"))
    assert calls == ["s1"]
