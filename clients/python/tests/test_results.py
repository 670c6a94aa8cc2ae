"""What a protected function returns, and what the journal refuses to record, against the real
server and sandbox: a returned value is a value (a ``str`` is never read as JSON text), a
refused success report is an unknown outcome (never an error as if nothing had happened),
and decorations that could only go wrong are refused up front. ``tests/it/python_client.rs``
checks the rows and the sandbox's counts of the ``py:results:*`` keys afterwards.
"""

from __future__ import annotations

import asyncio
from typing import Any, AsyncIterator, Iterator

import pytest

from conftest import Sandbox
from opjournal.v1 import journal_pb2 as pb
from opjournal_client import (
    JournalClient,
    ProviderResult,
    VerificationRequired,
    VerificationRequiredError,
    current_call,
    idempotent,
)
from opjournal_client.aio import AsyncJournalClient
from opjournal_client.integrations.core import (
    Journaled,
    JournaledToolError,
    namespaced_client_key,
    run_journaled,
)

#: The values a protected function returns, fresh and replayed; the JSON-looking string
#: above all must come back as the same string, not as the object it spells.
VALUES: list[tuple[str, Any]] = [
    ("plain-str", "msg_123"),
    ("json-str", '{"a": 1}'),
    ("quoted-str", '"quoted"'),
    ("none", None),
    ("number", 42),
    ("float", 1.5),
    ("list", [1, "two", {"three": 3}]),
    ("object", {"id": "msg_1", "nested": ["x"]}),
]


def pay(sandbox: Sandbox, order_id: str) -> dict[str, Any]:
    return sandbox.pay(
        current_call().provider_key,
        {"order_id": order_id, "amount_minor": 1000, "currency": "EUR"},
    )


def status(client: JournalClient, key: str) -> str:
    return pb.OperationStatus.Name(client.get(key).status)


@pytest.mark.parametrize(("label", "value"), VALUES, ids=[label for label, _ in VALUES])
def test_a_returned_value_is_stored_as_a_value_and_replayed_equal(
    client: JournalClient, sandbox: Sandbox, label: str, value: Any
) -> None:
    key = f"py:results:value-{label}"
    calls: list[str] = []

    @idempotent(client, action_type="create_payment", key=key)
    def send(order_id: str) -> Any:
        calls.append(order_id)
        pay(sandbox, order_id)
        return value

    fresh = send(label)
    replayed = send(label)
    assert fresh == value and type(fresh) is type(value)
    assert replayed == value and type(replayed) is type(value)
    assert calls == [label], "the replay does not call the function"
    assert status(client, key) == "OPERATION_STATUS_SUCCEEDED"
    assert sandbox.effects(key) == {"requests": 1, "effects": 1, "lookups": 0}


def test_an_async_function_returning_a_string_is_replayed_equal(
    client: JournalClient, sandbox: Sandbox
) -> None:
    key = "py:results:value-async-str"

    async def scenario() -> tuple[Any, Any]:
        async with AsyncJournalClient.connect(target_of(client)) as journal:

            @idempotent(journal, action_type="create_payment", key=key)
            async def send(order_id: str) -> str:
                pay(sandbox, order_id)
                return '{"a": 1}'

            return await send("a"), await send("a")

    fresh, replayed = asyncio.run(scenario())
    assert fresh == replayed == '{"a": 1}'
    assert status(client, key) == "OPERATION_STATUS_SUCCEEDED"
    assert sandbox.effects(key) == {"requests": 1, "effects": 1, "lookups": 0}


def test_a_tool_returning_a_string_answers_the_same_string_on_replay(
    client: JournalClient, sandbox: Sandbox
) -> None:
    key = "py:results:tool-str"
    spec = Journaled(client, action_type="create_payment", subject="message")

    def body() -> str:
        pay(sandbox, "tool")
        return "msg_123"

    assert run_journaled(spec, key, {"order_id": "tool"}, body) == "msg_123"
    assert run_journaled(spec, key, {"order_id": "tool"}, body) == "msg_123"
    assert status(client, key) == "OPERATION_STATUS_SUCCEEDED"
    assert sandbox.effects(key) == {"requests": 1, "effects": 1, "lookups": 0}


def target_of(client: JournalClient) -> str:
    import os

    return os.environ["OPJOURNAL_TEST_SERVER"]


# A success report the journal refuses: the provider acted, so the outcome is unknown.


def test_a_refused_external_id_is_an_unknown_outcome_and_not_called_again(
    client: JournalClient, sandbox: Sandbox
) -> None:
    # send_email has no lookup: the row stays unknown for these checks.
    key = "py:results:refused-external-id"
    calls: list[str] = []

    @idempotent(
        client,
        action_type="send_email",
        key=key,
        external_id=lambda _: "x" * 201,  # longer than the journal takes (200)
    )
    def send(order_id: str) -> dict[str, Any]:
        calls.append(order_id)
        return pay(sandbox, order_id)

    with pytest.raises(VerificationRequiredError) as first:
        send("1")
    assert first.value.reported is True
    assert first.value.error_code == "result_refused"
    assert getattr(first.value.__cause__, "reason", None) == "INVALID_FIELD_LENGTH"
    with pytest.raises(VerificationRequiredError) as again:
        send("1")
    assert again.value.reported is False
    assert calls == ["1"]
    operation = client.get(key)
    assert operation.status == pb.OPERATION_STATUS_UNKNOWN
    assert operation.error_code == "result_refused"
    assert sandbox.effects(key) == {"requests": 1, "effects": 1, "lookups": 0}


def test_a_result_over_the_limit_is_an_unknown_outcome_for_execute_and_asyncio(
    client: JournalClient, sandbox: Sandbox
) -> None:
    # Over the journal's max_result_bytes (64 KiB by default): INVALID_RESULT.
    big = {"body": "x" * 70_000}
    sync_key = "py:results:too-large-sync"

    def call(provider_call: Any) -> ProviderResult:
        sandbox.pay(provider_call.provider_key, {"amount_minor": 1, "currency": "EUR"})
        return ProviderResult(result=big)

    outcome = client.execute(sync_key, "send_email", {"n": 1}, call)
    assert isinstance(outcome, VerificationRequired)
    assert (outcome.reported, outcome.error_code) == (True, "result_refused")
    assert getattr(outcome.cause, "reason", None) == "INVALID_RESULT"
    again = client.execute(sync_key, "send_email", {"n": 1}, call)
    assert isinstance(again, VerificationRequired) and again.reported is False
    assert status(client, sync_key) == "OPERATION_STATUS_UNKNOWN"
    assert sandbox.effects(sync_key) == {"requests": 1, "effects": 1, "lookups": 0}

    async_key = "py:results:too-large-async"

    async def scenario() -> tuple[Any, Any]:
        async with AsyncJournalClient.connect(target_of(client)) as journal:

            async def acall(provider_call: Any) -> ProviderResult:
                return call(provider_call)

            first = await journal.execute(async_key, "send_email", {"n": 2}, acall)
            second = await journal.execute(async_key, "send_email", {"n": 2}, acall)
            return first, second

    first, second = asyncio.run(scenario())
    assert isinstance(first, VerificationRequired)
    assert (first.reported, first.error_code) == (True, "result_refused")
    assert isinstance(second, VerificationRequired) and second.reported is False
    assert status(client, async_key) == "OPERATION_STATUS_UNKNOWN"
    assert sandbox.effects(async_key) == {"requests": 1, "effects": 1, "lookups": 0}


def test_a_tool_whose_result_is_refused_reads_verification_required(
    client: JournalClient, sandbox: Sandbox
) -> None:
    key = "py:results:tool-too-large"
    spec = Journaled(client, action_type="send_email", subject="message")

    def body() -> str:
        pay(sandbox, "big")
        return "x" * 70_000

    for _ in range(2):
        with pytest.raises(JournaledToolError) as refused:
            run_journaled(spec, key, {"to": "a"}, body)
        assert refused.value.kind == "verification_required"
    assert status(client, key) == "OPERATION_STATUS_UNKNOWN"
    assert sandbox.effects(key) == {"requests": 1, "effects": 1, "lookups": 0}


# Decorations and keys refused before anything is registered.


def test_generator_functions_are_refused_at_decoration(client: JournalClient) -> None:
    def generator() -> Iterator[int]:
        yield 1

    async def async_generator() -> AsyncIterator[int]:
        yield 1

    with pytest.raises(TypeError, match="generator function"):
        idempotent(client, action_type="create_payment", key="py:results:gen")(generator)
    # An async generator with a sync client: the generator is what is refused.
    with pytest.raises(TypeError, match="generator function"):
        idempotent(client, action_type="create_payment", key="py:results:agen")(async_generator)


def test_a_key_function_returning_no_string_is_refused_before_begin(
    client: JournalClient,
) -> None:
    @idempotent(client, action_type="create_payment", key=lambda order_id: 817)  # type: ignore[arg-type, return-value]
    def send(order_id: str) -> None:
        raise AssertionError("never called")

    with pytest.raises(TypeError, match="key function of .*send returned int"):
        send("817")


def test_a_method_needs_a_declared_payload(client: JournalClient, sandbox: Sandbox) -> None:
    with pytest.raises(TypeError, match="payload="):

        class Mailer:
            @idempotent(client, action_type="create_payment", key="py:results:method")
            def send(self, order_id: str) -> None:
                raise AssertionError("never called")

    key = "py:results:method-payload"

    class Payments:
        def __init__(self, calls: list[str]) -> None:
            self.calls = calls

        @idempotent(client, action_type="create_payment", key=key, payload=["order_id"])
        def pay(self, order_id: str) -> str:
            self.calls.append(order_id)
            return pay(sandbox, order_id)["id"]

    calls: list[str] = []
    first = Payments(calls).pay("m")
    assert Payments(calls).pay("m") == first
    assert calls == ["m"]
    assert sandbox.effects(key) == {"requests": 1, "effects": 1, "lookups": 0}


def test_a_client_key_too_long_for_the_scope_is_an_invalid_key() -> None:
    scope = "mcp:" + "t" * 80
    with pytest.raises(JournaledToolError) as refused:
        namespaced_client_key(scope, "k" * 128, subject="payment")
    assert refused.value.kind == "invalid_key"
    assert namespaced_client_key(scope, "k" * 115) == f"{scope}:{'k' * 115}"
