#!/usr/bin/env python3
"""A ProviderAdapter for the opjournal sandbox payment provider.

The reconcile worker calls ``opjournal.v1.ProviderAdapter/LookupOperation`` to learn what
happened to an operation whose outcome is unknown. This adapter answers by looking the
payment up by its idempotency key:

    GET {sandbox_url}/v1/payments/by-idempotency-key/{key}

It only reads: it never creates, repeats or cancels a payment.

Usage:
    python3 sandbox_adapter.py --listen 127.0.0.1:0 --sandbox-url http://127.0.0.1:8081

Once bound it prints exactly one line, ``sandbox-adapter listening on HOST:PORT``, to stdout
and serves until SIGTERM or SIGINT. Logs go to stderr and name the method and outcome only,
never a key or a result body.

The gRPC stubs are generated at start-up from the repository's ``proto/`` directory with
``grpc_tools.protoc``; no generated code is committed.
"""

from __future__ import annotations

import argparse
import http.client
import importlib
import importlib.resources
import json
import logging
import signal
import sys
import tempfile
import threading
import urllib.error
import urllib.parse
import urllib.request
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path
from types import FrameType, ModuleType
from typing import Any, NamedTuple, Optional

try:
    import grpc
    from grpc_tools import protoc
except ImportError as missing:  # pragma: no cover - depends on the environment
    raise SystemExit(
        f"sandbox-adapter: the Python package {missing.name!r} is missing; "
        "run: pip install -r requirements.txt"
    ) from missing

LOG = logging.getLogger("sandbox-adapter")

#: The contract, relative to the proto include directory.
PROTO_FILE = "opjournal/v1/provider_adapter.proto"
#: Largest sandbox response body read, in bytes.
MAX_BODY_BYTES = 1024 * 1024
#: The only payment fields stored as the result (nothing else leaves the adapter).
RESULT_FIELDS = ("id", "status", "amount_minor", "currency")
#: Seconds in-flight lookups get to finish after SIGTERM/SIGINT.
SHUTDOWN_GRACE_SECONDS = 5.0


class Stubs(NamedTuple):
    """The generated modules for the ProviderAdapter contract."""

    pb2: ModuleType
    pb2_grpc: ModuleType


class LookupFailed(Exception):
    """The lookup itself failed; ``reason`` is a short code, safe to log."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class Settings:
    """How the adapter reaches the sandbox and what it declares."""

    sandbox_url: str
    timeout_seconds: float
    search_complete: bool


# --------------------------------------------------------------------------------------
# Stub generation


def default_proto_dir() -> Path:
    """Returns the repository's ``proto/`` directory (this file is examples/adapters/python/)."""
    return Path(__file__).resolve().parents[3] / "proto"


def load_stubs(proto_dir: Path) -> Stubs:
    """Generates the ProviderAdapter stubs from ``proto_dir`` and imports them.

    Raises:
        RuntimeError: the proto file is missing or protoc failed.
    """
    proto_file = proto_dir / PROTO_FILE
    if not proto_file.is_file():
        raise RuntimeError(f"{proto_file} not found; pass --proto-dir pointing at the repo's proto/")
    with tempfile.TemporaryDirectory(prefix="opjournal-stubs-") as out_dir:
        _run_protoc(proto_dir, proto_file, Path(out_dir))
        sys.path.insert(0, out_dir)
        try:
            pb2 = importlib.import_module("opjournal.v1.provider_adapter_pb2")
            pb2_grpc = importlib.import_module("opjournal.v1.provider_adapter_pb2_grpc")
        finally:
            sys.path.remove(out_dir)
    return Stubs(pb2=pb2, pb2_grpc=pb2_grpc)


def _run_protoc(proto_dir: Path, proto_file: Path, out_dir: Path) -> None:
    """Runs grpc_tools' bundled protoc, with its well-known protos on the include path."""
    well_known = importlib.resources.files("grpc_tools") / "_proto"
    with importlib.resources.as_file(well_known) as well_known_dir:
        args = [
            "grpc_tools.protoc",
            f"--proto_path={proto_dir}",
            f"--proto_path={well_known_dir}",
            f"--python_out={out_dir}",
            f"--grpc_python_out={out_dir}",
            str(proto_file),
        ]
        code = protoc.main(args)
    if code != 0:
        raise RuntimeError(f"protoc failed on {proto_file} (exit {code})")


# --------------------------------------------------------------------------------------
# The sandbox lookup


def payment_url(sandbox_url: str, operation_key: str) -> str:
    """Returns the lookup URL, the key percent-encoded as a single path segment."""
    segment = urllib.parse.quote(operation_key, safe="")
    return f"{sandbox_url.rstrip('/')}/v1/payments/by-idempotency-key/{segment}"


def fetch_payment(settings: Settings, operation_key: str) -> Optional[dict[str, Any]]:
    """Fetches the payment made with ``operation_key``; ``None`` when the sandbox has none.

    Raises:
        LookupFailed: any answer other than 200 with a payment or the sandbox's JSON 404,
            a timeout, or a connection error.
    """
    url = payment_url(settings.sandbox_url, operation_key)
    try:
        status, body = _http_get(url, settings.timeout_seconds)
    except TimeoutError:
        raise LookupFailed("timeout") from None
    except urllib.error.URLError as error:
        timed_out = isinstance(error.reason, TimeoutError)
        raise LookupFailed("timeout" if timed_out else "unreachable") from None
    except (OSError, http.client.HTTPException):
        raise LookupFailed("unreachable") from None
    if status == 404 and _is_not_found_body(body):
        return None
    if status != 200:
        raise LookupFailed(f"http_{status}")
    payment = _parse_payment(body)
    if payment.get("idempotency_key", operation_key) != operation_key:
        raise LookupFailed("key_mismatch")
    return payment


def _http_get(url: str, timeout: float) -> tuple[int, bytes]:
    """GETs ``url``; returns the status and at most MAX_BODY_BYTES + 1 bytes of the body."""
    request = urllib.request.Request(url, headers={"Accept": "application/json"}, method="GET")
    try:
        response = urllib.request.urlopen(request, timeout=timeout)
    except urllib.error.HTTPError as error:
        response = error  # a non-2xx answer: still read its status and body
    with response:
        return response.getcode(), response.read(MAX_BODY_BYTES + 1)


def _parse_payment(body: bytes) -> dict[str, Any]:
    """Parses a 200 body; it must be a JSON object with a string id and status."""
    payment = _json_object(body)
    if payment is None or not all(isinstance(payment.get(k), str) for k in ("id", "status")):
        raise LookupFailed("invalid_response")
    return payment


def _is_not_found_body(body: bytes) -> bool:
    """Tells whether a 404 body is the sandbox's own ``{"error": "not_found"}``.

    A 404 from anything else (a proxy, a wrong base URL on another server) proves nothing
    about the payment, so it is a failed lookup rather than "not found".
    """
    error = _json_object(body)
    return error is not None and error.get("error") == "not_found"


def _json_object(body: bytes) -> Optional[dict[str, Any]]:
    """Decodes a bounded JSON object; ``None`` for anything else."""
    if len(body) > MAX_BODY_BYTES:
        return None
    try:
        value = json.loads(body)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


# --------------------------------------------------------------------------------------
# The gRPC service


def sanitized_result(payment: dict[str, Any]) -> str:
    """Returns the result to store: only :data:`RESULT_FIELDS`, as compact JSON text."""
    kept = {field: payment[field] for field in RESULT_FIELDS if field in payment}
    return json.dumps(kept, separators=(",", ":"), ensure_ascii=False)


def to_response(pb2: ModuleType, payment: Optional[dict[str, Any]], search_complete: bool) -> Any:
    """Maps the sandbox's answer to a LookupOperationResponse."""
    if payment is None:
        return pb2.LookupOperationResponse(
            outcome=pb2.LOOKUP_OUTCOME_NOT_FOUND, search_complete=search_complete
        )
    status = payment["status"]
    if status == "succeeded":
        return pb2.LookupOperationResponse(
            outcome=pb2.LOOKUP_OUTCOME_SUCCEEDED,
            external_id=payment["id"],
            result_json=sanitized_result(payment),
        )
    if status == "failed":
        return pb2.LookupOperationResponse(
            outcome=pb2.LOOKUP_OUTCOME_FAILED, error_code="payment_failed"
        )
    return pb2.LookupOperationResponse(outcome=pb2.LOOKUP_OUTCOME_PENDING)


class SandboxAdapter:
    """The ProviderAdapter servicer: read-only lookups at the sandbox."""

    def __init__(self, stubs: Stubs, settings: Settings) -> None:
        self._pb2 = stubs.pb2
        self._settings = settings

    def LookupOperation(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802
        """Looks the payment up by the key the provider was called with.

        That is ``request.provider_key`` (namespaced for tenants other than ``default``);
        older callers that do not send it get ``request.operation_key``.
        Aborts with UNAVAILABLE when the lookup itself fails.
        """
        key = request.provider_key or request.operation_key
        if not key:
            LOG.info("LookupOperation failed reason=empty_key")
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "provider_key is empty")
        try:
            payment = fetch_payment(self._settings, key)
        except LookupFailed as failure:
            LOG.info("LookupOperation failed reason=%s", failure.reason)
            context.abort(grpc.StatusCode.UNAVAILABLE, f"sandbox lookup failed: {failure.reason}")
        response = to_response(self._pb2, payment, self._settings.search_complete)
        outcome = self._pb2.LookupOutcome.Name(response.outcome)
        LOG.info("LookupOperation outcome=%s", outcome)
        return response


# --------------------------------------------------------------------------------------
# Command line


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    """Parses the command line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--listen", default="127.0.0.1:50070", help="HOST:PORT; port 0 = any free port")
    parser.add_argument("--sandbox-url", default="http://127.0.0.1:8081", help="the sandbox's base URL")
    parser.add_argument("--timeout-seconds", type=float, default=5.0, help="HTTP lookup timeout")
    parser.add_argument(
        "--search-complete",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="declare NOT_FOUND searches complete (the sandbox's lookup is; default: true)",
    )
    parser.add_argument("--proto-dir", type=Path, default=None, help="the repo's proto/ directory")
    args = parser.parse_args(argv)
    if args.timeout_seconds <= 0:
        parser.error("--timeout-seconds must be > 0")
    url = urllib.parse.urlsplit(args.sandbox_url)
    if url.scheme not in ("http", "https") or not url.netloc:
        parser.error("--sandbox-url must be an http:// or https:// URL")
    return args


def start_server(stubs: Stubs, settings: Settings, listen: str) -> tuple[grpc.Server, int]:
    """Binds and starts the gRPC server; returns it and the bound port.

    Raises:
        RuntimeError: the address could not be bound.
    """
    # Without SO_REUSEPORT a busy fixed port fails here instead of sharing traffic.
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=8), options=[("grpc.so_reuseport", 0)]
    )
    stubs.pb2_grpc.add_ProviderAdapterServicer_to_server(SandboxAdapter(stubs, settings), server)
    try:
        port = server.add_insecure_port(listen)
    except RuntimeError:
        port = 0
    if port == 0:
        raise RuntimeError(f"could not bind {listen}")
    server.start()
    return server, port


def install_stop_handlers() -> threading.Event:
    """Returns an event set by the first SIGTERM or SIGINT."""
    stop = threading.Event()

    def on_signal(signum: int, _frame: Optional[FrameType]) -> None:
        LOG.info("received %s, stopping", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    return stop


def main(argv: Optional[list[str]] = None) -> int:
    """Runs the adapter until SIGTERM/SIGINT; returns the exit code."""
    logging.basicConfig(
        stream=sys.stderr, level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s"
    )
    args = parse_args(argv)
    settings = Settings(args.sandbox_url, args.timeout_seconds, args.search_complete)
    stop = install_stop_handlers()
    try:
        stubs = load_stubs(args.proto_dir or default_proto_dir())
        server, port = start_server(stubs, settings, args.listen)
    except RuntimeError as error:
        LOG.error("%s", error)
        return 1
    host = args.listen.rsplit(":", 1)[0]
    print(f"sandbox-adapter listening on {host}:{port}", flush=True)
    while not stop.wait(timeout=1.0):
        pass
    server.stop(SHUTDOWN_GRACE_SECONDS).wait()
    LOG.info("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
