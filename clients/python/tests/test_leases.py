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
    VerificationRequired,
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


def test_async_execute_cuts_a_call_off_at_its_lease_end_and_raises_lease_lost_for_the_report(
    client: JournalClient, sandbox: Sandbox
) -> None:
    key = "py:leases:async-lost"
    taken: list[pb.BeginOperationResponse] = []
    cut_off: list[float] = []

    async def main() -> None:
        async with AsyncJournalClient.connect(os.environ["OPJOURNAL_TEST_SERVER"]) as journal:

            async def call(provider_call: ProviderCall) -> ProviderResult:
                payment = sandbox.pay(provider_call.provider_key, PAY_817)
                # Blocks the event loop past the 1 s lease, so the renewal task cannot run
                # until another worker holds a new lease.
                taken.append(take_over(client, key))
                # The lease has ended unrenewed: the client cancels the call at once.
                try:
                    await asyncio.sleep(30)
                except asyncio.CancelledError:
                    cut_off.append(provider_call.lease_deadline.remaining())
                    raise
                return ProviderResult(external_id=payment["id"], result=payment)

            with pytest.raises(LeaseLostError) as lost:
                await journal.execute(key, "create_payment_dedup", PAY_817, call, lease_seconds=1)
            assert (lost.value.code, lost.value.reason) == (grpc.StatusCode.ABORTED, "LEASE_LOST")

    asyncio.run(main())
    assert cut_off == [0.0], "the call was cancelled once its lease had ended"
    [second] = taken
    payment = sandbox.pay(second.operation.provider_key, PAY_817)
    client.complete(second.lease_token, external_id=payment["id"], result=payment)
    assert sandbox.effects(key) == {"requests": 2, "effects": 1, "lookups": 0}


def test_async_execute_cuts_off_a_call_that_outlives_its_unrenewed_lease(
    sandbox: Sandbox,
) -> None:
    key = "py:leases:async-cut-off"

    async def main() -> VerificationRequired:
        async with AsyncJournalClient.connect(os.environ["OPJOURNAL_TEST_SERVER"]) as journal:

            async def never_answers(provider_call: ProviderCall) -> ProviderResult:
                assert 0 < provider_call.lease_deadline.remaining() <= 1
                await asyncio.sleep(60)
                raise AssertionError("not cut off")

            started = time.monotonic()
            outcome = await journal.execute(
                key, "create_payment", PAY_817, never_answers, lease_seconds=1, renew_lease=False
            )
            assert time.monotonic() - started < 10
            assert isinstance(outcome, VerificationRequired)
            return outcome

    outcome = asyncio.run(main())
    assert (outcome.reported, outcome.error_code) == (True, "lease_expired")
    assert outcome.operation.status == pb.OPERATION_STATUS_UNKNOWN
    assert sandbox.effects(key)["requests"] == 0


def test_a_sync_call_sees_when_its_lease_ends_and_renewals_move_it(
    client: JournalClient, sandbox: Sandbox
) -> None:
    key = "py:leases:deadline"
    seen: list[float] = []

    def call(provider_call: ProviderCall) -> ProviderResult:
        first = provider_call.lease_deadline.ends_at
        assert 0 < provider_call.lease_deadline.remaining() <= 3
        wait_for(
            "a renewal to move the lease's end",
            lambda: True if provider_call.lease_deadline.ends_at > first else None,
        )
        seen.append(provider_call.lease_deadline.remaining())
        # Bound the provider request by what is left of the lease.
        payment = sandbox.pay(
            provider_call.provider_key, PAY_817, timeout=provider_call.lease_deadline.remaining()
        )
        return ProviderResult(external_id=payment["id"], result=payment)

    done = client.execute(key, "create_payment", PAY_817, call, lease_seconds=3)
    assert isinstance(done, Succeeded)
    [left] = seen
    assert 2 < left <= 3
