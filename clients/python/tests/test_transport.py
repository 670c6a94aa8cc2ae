"""What the client does with answers made by the transport rather than by the journal.

A call whose deadline passes in the server's transport is answered with a bare
``CANCELLED`` (no ``ErrorInfo``); a connection that cannot be used is ``UNAVAILABLE``; a shed
call is ``RESOURCE_EXHAUSTED`` / ``SERVER_OVERLOADED``. All of them are safe to repeat. And
gRPC itself retries ``UNAVAILABLE`` for the RPCs the shipped service config names: checked
here against an in-process gRPC server that refuses the first attempt.
"""

from __future__ import annotations

import json
from concurrent import futures
from pathlib import Path
from typing import Any, Optional

import grpc
import pytest
from google.protobuf import any_pb2, duration_pb2
from google.rpc import error_details_pb2, status_pb2

from opjournal.v1 import journal_pb2 as pb
from opjournal.v1 import journal_pb2_grpc as pb_grpc
from opjournal_client import (
    JournalClient,
    JournalUnavailableError,
    OpjournalError,
    ServerOverloadedError,
    decode_error,
)
from opjournal_client.client import DEFAULT_CHANNEL_OPTIONS, SERVICE_CONFIG

REPO = Path(__file__).resolve().parents[3]


class _Failed(grpc.RpcError):
    """A failed call as grpc hands it over: code, details and trailing metadata."""

    def __init__(self, code: grpc.StatusCode, trailers: tuple[tuple[str, Any], ...] = ()) -> None:
        self._code = code
        self._trailers = trailers

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> Optional[str]:
        return "Timeout expired" if self._code == grpc.StatusCode.CANCELLED else ""

    def trailing_metadata(self) -> tuple[tuple[str, Any], ...]:
        return self._trailers


def test_a_bare_cancelled_from_a_passed_deadline_is_safe_to_repeat() -> None:
    error = decode_error(_Failed(grpc.StatusCode.CANCELLED))
    assert isinstance(error, JournalUnavailableError)
    assert error.reason == ""
    assert isinstance(decode_error(_Failed(grpc.StatusCode.UNAVAILABLE)), JournalUnavailableError)


def test_a_shed_call_is_overloaded_with_its_retry_delay() -> None:
    info = error_details_pb2.ErrorInfo(
        reason="SERVER_OVERLOADED", domain="opjournal.dev", metadata={"limit": "max_in_flight_requests"}
    )
    retry = error_details_pb2.RetryInfo(retry_delay=duration_pb2.Duration(seconds=1))
    status = status_pb2.Status(code=grpc.StatusCode.RESOURCE_EXHAUSTED.value[0])
    for detail in (info, retry):
        packed = any_pb2.Any()
        packed.Pack(detail)
        status.details.append(packed)
    trailers = (("grpc-status-details-bin", status.SerializeToString()),)
    error = decode_error(_Failed(grpc.StatusCode.RESOURCE_EXHAUSTED, trailers))
    assert isinstance(error, ServerOverloadedError)
    assert isinstance(error, JournalUnavailableError)
    assert error.retry_delay == 1.0


def test_the_shipped_service_config_is_the_contracts() -> None:
    shipped = json.loads((REPO / "proto/opjournal/v1/service_config.json").read_text())
    assert json.loads(SERVICE_CONFIG) == shipped
    assert ("grpc.service_config", SERVICE_CONFIG) in DEFAULT_CHANNEL_OPTIONS


class _RefusesOnce(pb_grpc.OperationJournalServicer):
    """GetOperation: UNAVAILABLE on the first attempt, NOT_FOUND afterwards."""

    def __init__(self) -> None:
        self.attempts = 0

    def GetOperation(self, request: pb.GetOperationRequest, context: grpc.ServicerContext) -> Any:
        self.attempts += 1
        if self.attempts == 1:
            context.abort(grpc.StatusCode.UNAVAILABLE, "not yet")
        context.abort(grpc.StatusCode.NOT_FOUND, "no such operation")


@pytest.fixture
def refusing_server() -> Any:
    servicer = _RefusesOnce()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    pb_grpc.add_OperationJournalServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield servicer, f"127.0.0.1:{port}"
    server.stop(grace=None)


def test_grpc_repeats_a_call_refused_with_unavailable_by_default(refusing_server: Any) -> None:
    servicer, target = refusing_server
    with JournalClient.connect(target, timeout=5.0) as client:
        with pytest.raises(OpjournalError) as raised:
            client.get("payment:order-817:intent-01")
    assert raised.value.code == grpc.StatusCode.NOT_FOUND
    assert servicer.attempts == 2


def test_retries_can_be_turned_off(refusing_server: Any) -> None:
    servicer, target = refusing_server
    with JournalClient.connect(target, timeout=5.0, options=[("grpc.enable_retries", 0)]) as client:
        with pytest.raises(JournalUnavailableError):
            client.get("payment:order-817:intent-01")
    assert servicer.attempts == 1
