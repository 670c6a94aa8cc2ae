"""Leases through the Python client: a holder whose lease was taken over gets
``LeaseLostError`` for its report and its renewal, and ``execute`` renews the lease while a
long provider call runs. Uses ``create_payment_dedup`` (``on_timeout: retry_with_same_key``),
whose ended lease may be claimed again by a new holder."""

from __future__ import annotations

import asyncio
import os
import time

import grpc
import pytest

from conftest import PAY_817, Sandbox, wait_for
from opjournal.v1 import journal_pb2 as pb
from opjournal_client import (
    AsyncJournalClient,
    InProgress,
    JournalClient,
    LeaseLostError,
    ProviderCall,
    ProviderResult,
    Succeeded,
)


def take_over(client: JournalClient, key: str) -> pb.BeginOperationResponse:
    """Begins until the first holder's 1 s lease has ended and a new lease is granted."""

    def probe() -> pb.BeginOperationResponse | None:
        begin = client.begin(key, "create_payment_dedup", PAY_817)
        return begin if begin.decision == pb.DECISION_EXECUTE else None

    return wait_for("the lease to be taken over", probe)


def test_a_stale_holder_gets_lease_lost_for_its_report_and_its_renewal(
    client: JournalClient, sandbox: Sandbox
) -> None:
    key = "py:leases:stale-holder"
    first = client.begin(key, "create_payment_dedup", PAY_817, lease_seconds=1)
    assert first.decision == pb.DECISION_EXECUTE
    second = take_over(client, key)
    assert second.operation.attempt_count == 2

    with pytest.raises(LeaseLostError) as lost:
        client.complete(first.lease_token, external_id="pay_stale", result={"id": "pay_stale"})
    assert (lost.value.code, lost.value.reason) == (grpc.StatusCode.ABORTED, "LEASE_LOST")
    with pytest.raises(LeaseLostError):
        client.renew_lease(first.lease_token, 30)
    with pytest.raises(LeaseLostError):
        client.report_unknown(first.lease_token, "timeout")

    payment = sandbox.pay(second.operation.provider_key, PAY_817)
    done = client.complete(second.lease_token, external_id=payment["id"], result=payment)
    assert done.status == pb.OPERATION_STATUS_SUCCEEDED
    assert done.external_id == payment["id"]


def test_execute_raises_lease_lost_when_its_lease_was_taken_over(
    client: JournalClient, sandbox: Sandbox
) -> None:
    key = "py:leases:taken-over"
    taken: list[pb.BeginOperationResponse] = []

    def slow_call(call: ProviderCall) -> ProviderResult:
        payment = sandbox.pay(call.provider_key, PAY_817)
        # Stalls past its lease (no renewal) until another worker holds a new one.
        taken.append(take_over(client, key))
        return ProviderResult(external_id=payment["id"], result=payment)

    with pytest.raises(LeaseLostError) as lost:
        client.execute(
            key, "create_payment_dedup", PAY_817, slow_call, lease_seconds=1, renew_lease=False
        )
    assert lost.value.reason == "LEASE_LOST"

    # The new holder calls the provider with the same key: the provider deduplicates.
    [second] = taken
    payment = sandbox.pay(second.operation.provider_key, PAY_817)
    client.complete(second.lease_token, external_id=payment["id"], result=payment)
    assert sandbox.effects(key) == {"requests": 2, "effects": 1, "lookups": 0}


def test_execute_renews_the_lease_while_a_long_call_runs(
    client: JournalClient, sandbox: Sandbox
) -> None:
    key = "py:leases:renewed"
    observed: list[object] = []

    def long_call(call: ProviderCall) -> ProviderResult:
        granted = call.operation.lease_until.ToNanoseconds()
        # Renewal happens every third of the 3 s lease; wait until the journal shows it.
        wait_for(
            "a lease renewal",
            lambda: True if client.get(key).lease_until.ToNanoseconds() > granted else None,
        )
        observed.append(client.execute(key, "create_payment", PAY_817, long_call))
        assert not call.lease_lost.is_set()
        payment = sandbox.pay(call.provider_key, PAY_817)
        return ProviderResult(external_id=payment["id"], result=payment)

    done = client.execute(key, "create_payment", PAY_817, long_call, lease_seconds=3)
    assert isinstance(done, Succeeded)
    assert done.operation.attempt_count == 1
    [inner] = observed
    assert isinstance(inner, InProgress)


def test_async_execute_sees_lease_lost_and_raises_it_for_the_report(
    client: JournalClient, sandbox: Sandbox
) -> None:
    key = "py:leases:async-lost"
    taken: list[pb.BeginOperationResponse] = []
    noticed: list[bool] = []

    async def main() -> None:
        async with AsyncJournalClient.connect(os.environ["OPJOURNAL_TEST_SERVER"]) as journal:

            async def call(provider_call: ProviderCall) -> ProviderResult:
                payment = sandbox.pay(provider_call.provider_key, PAY_817)
                # Blocks the event loop past the 1 s lease, so the renewal task cannot run
                # until another worker holds a new lease.
                taken.append(take_over(client, key))
                # The renewal task runs again, is refused with LEASE_LOST and says so.
                deadline = time.monotonic() + 10
                while not provider_call.lease_lost.is_set() and time.monotonic() < deadline:
                    await asyncio.sleep(0.05)
                noticed.append(provider_call.lease_lost.is_set())
                return ProviderResult(external_id=payment["id"], result=payment)

            with pytest.raises(LeaseLostError) as lost:
                await journal.execute(key, "create_payment_dedup", PAY_817, call, lease_seconds=1)
            assert (lost.value.code, lost.value.reason) == (grpc.StatusCode.ABORTED, "LEASE_LOST")

    asyncio.run(main())
    assert noticed == [True], "ProviderCall.lease_lost was set while the call ran"
    [second] = taken
    payment = sandbox.pay(second.operation.provider_key, PAY_817)
    client.complete(second.lease_token, external_id=payment["id"], result=payment)
    assert sandbox.effects(key) == {"requests": 2, "effects": 1, "lookups": 0}
