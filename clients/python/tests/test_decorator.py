"""``@idempotent`` against the real server and sandbox: one intent called from sync code and
from asyncio code, 200 concurrent calls across 20 asyncio tasks in two processes with one
provider effect, a lost provider answer that is never called again, and other arguments
under the same key. ``tests/it/python_client.rs`` then checks the rows and the sandbox's counts
from Rust.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import decorated_payment
from conftest import Sandbox
from decorated_payment import CALLS, burst, charge, charge_async
from opjournal.v1 import journal_pb2 as pb
from opjournal_client import (
    IdempotencyKeyReusedError,
    InProgressError,
    JournalClient,
    OutcomeError,
    ProviderCall,
    Succeeded,
    VerificationRequired,
    VerificationRequiredError,
    current_call,
    idempotent,
)

HERE = Path(__file__).resolve().parent


def calls_for(order_id: str) -> list[str]:
    return [key for key in CALLS if key == f"py:decorator:{order_id}"]


def test_one_intent_200_concurrent_calls_in_two_processes_one_effect(
    client: JournalClient, sandbox: Sandbox
) -> None:
    key = "py:decorator:once"
    start_at = time.time() + 3.0
    other = subprocess.Popen(
        [sys.executable, str(HERE / "decorated_worker.py"), "once", "10", "10", str(start_at)],
        cwd=HERE,
        env=os.environ.copy(),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        # 10 asyncio tasks here, 10 in the other process, 10 calls each, all at start_at.
        answers = asyncio.run(burst("once", 10, 10, start_at))
        out, _ = other.communicate(timeout=120)
    finally:
        other.kill()
    assert other.returncode == 0
    theirs = json.loads(out)

    errors = [repr(a) for a in answers if not isinstance(a, dict)] + theirs["errors"]
    assert errors == [], "every call answers the payment"
    ids = {a["id"] for a in answers} | set(theirs["ids"])
    assert len(answers) + len(theirs["ids"]) == 200
    assert len(ids) == 1, "one payment, answered to all 200 calls"
    # The function body ran once, in one of the two processes.
    assert len(calls_for("once")) + len(theirs["calls"]) == 1

    # The same decorated intent from sync code and from asyncio code: replays, no call.
    [payment_id] = ids
    assert charge("once", 490000, "RUB")["id"] == payment_id

    async def from_asyncio() -> Any:
        return await asyncio.to_thread(charge, "once", 490000, "RUB")

    assert asyncio.run(from_asyncio())["id"] == payment_id
    assert len(calls_for("once")) + len(theirs["calls"]) == 1

    row = client.get(key)
    assert (row.status, row.attempt_count) == (pb.OPERATION_STATUS_SUCCEEDED, 1)
    assert row.external_id == payment_id
    counts = sandbox.effects(key)
    assert (counts["requests"], counts["effects"]) == (1, 1)


@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_a_lost_provider_answer_is_verification_required_and_not_called_again(
    client: JournalClient, sandbox: Sandbox, flavour: str
) -> None:
    order = f"lost-{flavour}"
    key = f"py:decorator:{order}"

    def call(fault: str | None = None) -> Any:
        if flavour == "sync":
            return charge(order, 490000, "RUB", fault=fault)
        return asyncio.run(charge_async(order, 490000, "RUB", fault=fault))

    # The sandbox stores the payment and answers after the 1 s timeout: unknown, reported.
    with pytest.raises(VerificationRequiredError) as lost:
        call(fault="commit-then-timeout")
    assert lost.value.reported and lost.value.error_code == "timeout"
    assert isinstance(lost.value.__cause__, TimeoutError)
    assert isinstance(lost.value.outcome, VerificationRequired)
    assert lost.value.to_dict()["outcome"] == "verification_required"
    # Again: the journal says verify first; the function is not called.
    with pytest.raises(VerificationRequiredError) as again:
        call()
    assert not again.value.reported
    assert len(calls_for(order)) == 1
    counts = sandbox.effects(key)
    assert (counts["requests"], counts["effects"]) == (1, 1)
    assert client.get(key).status == pb.OPERATION_STATUS_UNKNOWN


@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_other_arguments_under_the_same_key_are_a_typed_conflict(
    client: JournalClient, sandbox: Sandbox, flavour: str
) -> None:
    order = f"conflict-{flavour}"
    key = f"py:decorator:{order}"

    def call(amount_minor: int) -> Any:
        if flavour == "sync":
            return charge(order, amount_minor, "RUB")
        return asyncio.run(charge_async(order, amount_minor, "RUB"))

    first = call(490000)
    with pytest.raises(IdempotencyKeyReusedError) as conflict:
        call(590000)
    assert conflict.value.reason == "IDEMPOTENCY_KEY_REUSED"
    # The same arguments again replay the stored result.
    assert call(490000)["id"] == first["id"]
    assert len(calls_for(order)) == 1
    counts = sandbox.effects(key)
    assert (counts["requests"], counts["effects"]) == (1, 1)
    assert client.get(key).attempt_count == 1


def test_returns_outcome_and_in_progress_without_waiting(
    client: JournalClient, sandbox: Sandbox
) -> None:
    key = "py:decorator:outcome"
    seen: list[ProviderCall] = []

    @idempotent(
        client,
        action_type="create_payment",
        key=key,
        external_id=lambda payment: payment["id"],
        returns="outcome",
    )
    def pay_once(order_id: str, amount_minor: int, currency: str) -> dict[str, Any]:
        seen.append(current_call())
        # The same intent while this call holds the lease: InProgressError, no call.
        with pytest.raises(InProgressError) as busy:
            nested(order_id, amount_minor, currency)
        assert busy.value.retry_after > 0
        body = {"order_id": order_id, "amount_minor": amount_minor, "currency": currency}
        payment = sandbox.pay(current_call().provider_key, body)
        return payment

    @idempotent(client, action_type="create_payment", key=key)
    def nested(order_id: str, amount_minor: int, currency: str) -> None:
        raise AssertionError("the lease holder is still running")

    done = pay_once("outcome", 490000, "RUB")
    assert isinstance(done, Succeeded) and not done.replayed
    assert done.external_id == done.provider_result["id"]
    assert done.to_dict()["outcome"] == "succeeded"
    replay = pay_once("outcome", 490000, "RUB")
    assert isinstance(replay, Succeeded) and replay.replayed
    assert replay.external_id == done.external_id
    [call] = seen
    assert call.provider_key == key and not call.lease_lost.is_set()
    with pytest.raises(LookupError):
        current_call()
    assert sandbox.effects(key)["effects"] == 1


def test_outcome_errors_share_a_base() -> None:
    assert issubclass(VerificationRequiredError, OutcomeError)
    assert decorated_payment.charge.__name__ == "charge"
    assert decorated_payment.charge.__opjournal__.action_type == "create_payment"  # type: ignore[attr-defined]
