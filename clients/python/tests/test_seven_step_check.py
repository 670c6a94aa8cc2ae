"""The source article's reproducible check, through ``execute`` and ``JournalClient``: the
provider's answer is lost after it stored the payment, and the journal still ends with
exactly one effect. ``tests/it/python_client.rs`` then checks the rows and counts from Rust."""

from __future__ import annotations

import grpc
import pytest

from conftest import PAY_817, PAY_817_OTHER_AMOUNT, Sandbox
from opjournal.v1 import journal_pb2 as pb
from opjournal_client import (
    IdempotencyKeyReusedError,
    JournalClient,
    ProviderCall,
    ProviderResult,
    Succeeded,
    VerificationRequired,
)

KEY = "payment:order-817:intent-01"


def test_the_seven_step_check_ends_with_exactly_one_effect(
    client: JournalClient, sandbox: Sandbox
) -> None:
    provider_keys: list[str] = []

    def pay_and_lose_the_answer(call: ProviderCall) -> ProviderResult:
        provider_keys.append(call.provider_key)
        # The sandbox stores the payment, then answers only after the client gave up.
        sandbox.pay(call.provider_key, PAY_817, fault="commit-then-timeout", timeout=0.4)
        raise AssertionError("the sandbox answered a commit-then-timeout request in time")

    # 1-3. A new key; Begin grants the lease; the provider call times out after the effect
    # happened, and the helper reports the outcome unknown instead of failing it.
    lost = client.execute(KEY, "create_payment", PAY_817, pay_and_lose_the_answer)
    assert isinstance(lost, VerificationRequired)
    assert lost.reported and lost.error_code == "timeout"
    assert lost.cause is not None
    assert lost.operation.status == pb.OPERATION_STATUS_UNKNOWN
    assert provider_keys == [KEY], "called once, with operation.provider_key"
    assert sandbox.effects(KEY)["effects"] == 1

    # 4. The same intent again: verify first, the provider is not called.
    again = client.execute(KEY, "create_payment", PAY_817, pay_and_lose_the_answer)
    assert isinstance(again, VerificationRequired) and not again.reported
    assert provider_keys == [KEY]
    assert sandbox.effects(KEY)["requests"] == 1

    # 5. Reconcile: the provider adapter finds the payment by its key.
    reconciled = client.reconcile(KEY)
    assert reconciled.action == pb.RECONCILE_ACTION_MARKED_SUCCEEDED
    assert reconciled.observation.outcome == pb.OBSERVATION_OUTCOME_SUCCEEDED
    assert reconciled.operation.status == pb.OPERATION_STATUS_SUCCEEDED

    # 6. Begin replays the stored outcome; exactly one effect at the provider.
    replay = client.execute(KEY, "create_payment", PAY_817, pay_and_lose_the_answer)
    assert isinstance(replay, Succeeded) and replay.replayed
    assert replay.external_id is not None and replay.external_id.startswith("pay_")
    assert replay.external_id == reconciled.operation.external_id
    assert replay.result["id"] == replay.external_id
    assert replay.result["amount_minor"] == 490000
    assert replay.provider_result is None

    # 7. The same key with another amount is refused as a typed error; nothing is called.
    with pytest.raises(IdempotencyKeyReusedError) as conflict:
        client.execute(KEY, "create_payment", PAY_817_OTHER_AMOUNT, pay_and_lose_the_answer)
    assert conflict.value.code == grpc.StatusCode.ALREADY_EXISTS
    assert conflict.value.reason == "IDEMPOTENCY_KEY_REUSED"
    assert conflict.value.domain == "opjournal.dev"
    assert provider_keys == [KEY]
    counts = sandbox.effects(KEY)
    assert (counts["requests"], counts["effects"]) == (1, 1)
