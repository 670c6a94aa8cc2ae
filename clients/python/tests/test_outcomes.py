"""How ``execute`` classifies each outcome of the provider call, against the real server and
sandbox: success, confirmed rejection, an uncertain 5xx, and the decisions that keep the
provider from being called (in progress, duplicate intent)."""

from __future__ import annotations

import urllib.error

import pytest

from conftest import PAY_817, Sandbox
from opjournal.v1 import journal_pb2 as pb
from opjournal_client import (
    DuplicateIntentSuspected,
    FailedFinal,
    InProgress,
    InvalidArgumentError,
    JournalClient,
    ProviderCall,
    ProviderRejected,
    ProviderResult,
    Succeeded,
    VerificationRequired,
)


def pay(sandbox: Sandbox, fault: str | None = None):
    """A provider call that classifies the sandbox's answers the way a real one would."""

    def call(provider_call: ProviderCall) -> ProviderResult:
        try:
            payment = sandbox.pay(provider_call.provider_key, PAY_817, fault=fault)
        except urllib.error.HTTPError as error:
            if error.code == 402:  # a declined card: the provider stored nothing
                raise ProviderRejected("card_declined") from error
            raise  # 5xx and anything else: the outcome is unknown
        return ProviderResult(external_id=payment["id"], result=payment)

    return call


def test_a_confirmed_success_is_completed_and_replayed(
    client: JournalClient, sandbox: Sandbox
) -> None:
    key = "py:outcomes:success"
    done = client.execute(key, "create_payment", PAY_817, pay(sandbox), references={"order_id": "817"})
    assert isinstance(done, Succeeded) and not done.replayed
    assert done.operation.status == pb.OPERATION_STATUS_SUCCEEDED
    assert done.external_id == done.provider_result["id"]
    assert done.result["amount_minor"] == 490000
    assert dict(done.operation.references) == {"order_id": "817"}

    replay = client.execute(key, "create_payment", PAY_817, pay(sandbox))
    assert isinstance(replay, Succeeded) and replay.replayed
    assert (replay.external_id, replay.result) == (done.external_id, done.result)
    assert sandbox.effects(key) == {"requests": 1, "effects": 1, "lookups": 0}


def test_a_confirmed_rejection_fails_the_operation_for_good(
    client: JournalClient, sandbox: Sandbox
) -> None:
    key = "py:outcomes:declined"
    failed = client.execute(key, "create_payment", PAY_817, pay(sandbox, fault="reject"))
    assert isinstance(failed, FailedFinal) and not failed.replayed
    assert failed.error_code == "card_declined"
    assert isinstance(failed.cause, ProviderRejected)
    assert failed.operation.status == pb.OPERATION_STATUS_FAILED_FINAL

    replay = client.execute(key, "create_payment", PAY_817, pay(sandbox))
    assert isinstance(replay, FailedFinal) and replay.replayed
    assert replay.error_code == "card_declined"
    assert sandbox.effects(key)["effects"] == 0
    assert sandbox.effects(key)["requests"] == 1, "a failed_final operation is never retried"


def test_a_5xx_is_unknown_and_runs_again_only_after_reconciliation_proves_absence(
    client: JournalClient, sandbox: Sandbox
) -> None:
    key = "py:outcomes:unavailable"
    unknown = client.execute(key, "create_payment", PAY_817, pay(sandbox, fault="fail-before-store"))
    assert isinstance(unknown, VerificationRequired) and unknown.reported
    assert unknown.error_code == "http_503"
    assert unknown.operation.status == pb.OPERATION_STATUS_UNKNOWN

    blocked = client.execute(key, "create_payment", PAY_817, pay(sandbox))
    assert isinstance(blocked, VerificationRequired) and not blocked.reported
    assert sandbox.effects(key)["requests"] == 1

    # The sandbox's lookup is complete and the grace window is 0 s: absence is proof.
    reconciled = client.reconcile(key)
    assert reconciled.action == pb.RECONCILE_ACTION_RELEASED_FOR_RETRY
    assert reconciled.operation.status == pb.OPERATION_STATUS_PENDING

    retried = client.execute(key, "create_payment", PAY_817, pay(sandbox))
    assert isinstance(retried, Succeeded) and not retried.replayed
    assert retried.operation.attempt_count == 2
    assert sandbox.effects(key) == {"requests": 2, "effects": 1, "lookups": 1}


def test_a_begin_while_the_lease_is_held_is_in_progress_and_calls_nothing(
    client: JournalClient, sandbox: Sandbox
) -> None:
    key = "py:outcomes:in-progress"
    seen: list[object] = []

    def call_while_another_begin_arrives(call: ProviderCall) -> ProviderResult:
        seen.append(client.execute(key, "create_payment", PAY_817, pay(sandbox)))
        return pay(sandbox)(call)

    done = client.execute(key, "create_payment", PAY_817, call_while_another_begin_arrives)
    assert isinstance(done, Succeeded)
    [inner] = seen
    assert isinstance(inner, InProgress)
    assert inner.retry_after > 0
    assert sandbox.effects(key)["requests"] == 1


def test_the_same_request_under_a_new_key_is_held_as_a_suspected_duplicate(
    client: JournalClient, sandbox: Sandbox
) -> None:
    first = client.execute("py:outcomes:hold-1", "create_payment_hold", PAY_817, pay(sandbox))
    assert isinstance(first, Succeeded)
    held = client.execute("py:outcomes:hold-2", "create_payment_hold", PAY_817, pay(sandbox))
    assert isinstance(held, DuplicateIntentSuspected)
    assert held.duplicate_of_operation_key == "py:outcomes:hold-1"
    assert sandbox.effects("py:outcomes:hold-2")["requests"] == 0

    confirmed = client.execute(
        "py:outcomes:hold-2", "create_payment_hold", PAY_817, pay(sandbox),
        confirm_duplicate_intent=True,
    )
    assert isinstance(confirmed, Succeeded)
    assert sandbox.effects("py:outcomes:hold-2")["effects"] == 1


def test_a_malformed_payload_is_an_invalid_argument_with_its_reason(client: JournalClient) -> None:
    with pytest.raises(InvalidArgumentError) as invalid:
        client.begin("py:outcomes:bad-json", "create_payment", '{"amount_minor": 1, "amount_minor": 2}')
    assert invalid.value.reason == "INVALID_PAYLOAD"
    assert invalid.value.metadata["rule"] == "duplicate_member"
