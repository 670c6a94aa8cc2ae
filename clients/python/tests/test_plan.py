"""The repetition of reports whose answer was lost, in the plan both clients run
(``opjournal_client._core``), driven step by step: which status codes repeat a report, that
every repetition carries the same token and outcome, and that the bound holds. A journal
that stays unreachable longer than the bound cannot be staged with the real server here;
the scenario ``report-while-the-journal-restarts`` (tests/test_scenarios.py) shows the
repetition landing on a real restarted journal.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Optional

import grpc
import pytest

from opjournal.v1 import journal_pb2 as pb
from opjournal_client import (
    JournalUnavailableError,
    LeaseLostError,
    OpjournalError,
    ProviderResult,
    Succeeded,
)
from opjournal_client import _core


def execute_answer() -> pb.BeginOperationResponse:
    answer = pb.BeginOperationResponse(decision=pb.DECISION_EXECUTE, lease_token="lt_1")
    answer.operation.operation_key = answer.operation.provider_key = "py:plan"
    answer.operation.status = pb.OPERATION_STATUS_IN_PROGRESS
    answer.operation.updated_at.FromSeconds(1_000)
    answer.operation.lease_until.FromSeconds(1_030)
    return answer


def completed() -> pb.CompleteOperationResponse:
    response = pb.CompleteOperationResponse()
    response.operation.status = pb.OPERATION_STATUS_SUCCEEDED
    response.operation.external_id = "pay_1"
    response.operation.result_json = '{"id":"pay_1"}'
    return response


def drive(
    report: Callable[[int], Any], retry_seconds: float
) -> tuple[Any, list[Any], list[float]]:
    """Runs the plan for one EXECUTE whose provider call succeeds; ``report(n)`` answers the
    n-th report (a response, or an exception to throw in). Returns the outcome (or the
    exception raised), the report requests and the sleeps."""
    begin = _core.begin_request("py:plan", "create_payment", {"order_id": "817"})
    steps = _core.plan(begin, _core.ExecuteOptions(), retry_seconds)
    reports: list[Any] = []
    sleeps: list[float] = []
    answer: Any = None
    failure: Optional[BaseException] = None
    while True:
        try:
            step = steps.throw(failure) if failure is not None else steps.send(answer)
        except StopIteration as stop:
            return stop.value, reports, sleeps
        except OpjournalError as error:
            return error, reports, sleeps
        answer, failure = None, None
        if isinstance(step, _core.Sleep):
            sleeps.append(step.seconds)
            time.sleep(step.seconds)
        elif isinstance(step, _core.CallProvider):
            answer = _core.Returned(ProviderResult(external_id="pay_1", result={"id": "pay_1"}))
        elif step.method == "BeginOperation":
            answer = execute_answer()
        else:
            reports.append((step.method, step.request))
            reply = report(len(reports))
            if isinstance(reply, BaseException):
                failure = reply
            else:
                answer = reply


def lost(code: grpc.StatusCode) -> OpjournalError:
    return JournalUnavailableError(code, "") if code != grpc.StatusCode.CANCELLED else OpjournalError(code, "")


@pytest.mark.parametrize(
    "code",
    [grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED, grpc.StatusCode.DEADLINE_EXCEEDED],
)
def test_a_report_whose_answer_was_lost_is_repeated_with_the_same_token_and_outcome(
    code: grpc.StatusCode,
) -> None:
    outcome, reports, sleeps = drive(lambda n: lost(code) if n < 4 else completed(), 30.0)
    assert isinstance(outcome, Succeeded) and outcome.external_id == "pay_1"
    assert len(reports) == 4
    assert all(report == reports[0] for report in reports), "same method, token and outcome"
    method, request = reports[0]
    assert method == "CompleteOperation" and request.lease_token == "lt_1"
    assert sleeps == [0.05, 0.1, 0.2], "backoff between the repetitions"


def test_repetition_stops_at_the_bound() -> None:
    started = time.monotonic()
    outcome, reports, _ = drive(lambda n: lost(grpc.StatusCode.UNAVAILABLE), 0.5)
    elapsed = time.monotonic() - started
    assert isinstance(outcome, JournalUnavailableError)
    assert 3 <= len(reports) <= 6
    assert elapsed < 0.5 + 0.2, "no repetition is started past the bound"


def test_an_answered_refusal_is_not_repeated() -> None:
    refused = LeaseLostError(grpc.StatusCode.ABORTED, "", reason="LEASE_LOST", domain="opjournal.dev")
    outcome, reports, sleeps = drive(lambda n: refused, 30.0)
    assert outcome is refused
    assert len(reports) == 1 and sleeps == []
