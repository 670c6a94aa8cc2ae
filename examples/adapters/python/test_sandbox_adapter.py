"""End-to-end test of sandbox_adapter.py against a fake sandbox.

Run from this directory:

    python3 -m unittest test_sandbox_adapter.py

A tiny HTTP server in a thread plays the sandbox; the adapter runs as a subprocess on a free
port, and a generated client stub calls LookupOperation on it.
"""

from __future__ import annotations

import functools
import json
import os
import queue
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import unittest
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import IO, Any, ClassVar, Optional

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.dont_write_bytecode = True  # keep __pycache__ out of the source tree

import grpc  # noqa: E402

import sandbox_adapter  # noqa: E402

#: Generous limits for a slow, busy 2-core machine; polling returns as soon as ready.
START_TIMEOUT_SECONDS = 120.0
CALL_TIMEOUT_SECONDS = 30.0
STOP_TIMEOUT_SECONDS = 60.0

#: A key with a space and a slash: it must reach the sandbox as one encoded path segment.
SUCCEEDED_KEY = "order 42/pay"
FAILED_KEY = "key-failed"
PENDING_KEY = "key-pending"
MISSING_KEY = "key-missing"
ERROR_KEY = "key-500"
FOREIGN_404_KEY = "key-html-404"
MISMATCH_KEY = "key-mismatch"

SUCCEEDED_ID = "pay_" + "a" * 32
SECRET_CARD = "4242424242424242"
PREFIX = "/v1/payments/by-idempotency-key/"


@functools.cache
def client_stubs() -> sandbox_adapter.Stubs:
    """The client stubs, generated once per test run the way the adapter does."""
    return sandbox_adapter.load_stubs(sandbox_adapter.default_proto_dir())


def payment(key: str, status: str) -> dict[str, Any]:
    """A sandbox payment, with fields the adapter must not pass on."""
    return {
        "id": SUCCEEDED_ID if status == "succeeded" else "pay_" + "b" * 32,
        "status": status,
        "amount_minor": 490000,
        "currency": "RUB",
        "idempotency_key": key,
        "created_at": "2024-05-01T12:00:00Z",
        "card_number": SECRET_CARD,
    }


#: Encoded path segment -> (HTTP status, content type, body).
ROUTES: dict[str, tuple[int, str, bytes]] = {
    urllib.parse.quote(SUCCEEDED_KEY, safe=""): (
        200, "application/json", json.dumps(payment(SUCCEEDED_KEY, "succeeded")).encode()
    ),
    FAILED_KEY: (200, "application/json", json.dumps(payment(FAILED_KEY, "failed")).encode()),
    PENDING_KEY: (200, "application/json", json.dumps(payment(PENDING_KEY, "processing")).encode()),
    ERROR_KEY: (500, "application/json", b'{"error":"internal","message":"boom"}'),
    FOREIGN_404_KEY: (404, "text/html", b"<html><body>Not Found</body></html>"),
    MISMATCH_KEY: (200, "application/json", json.dumps(payment("another-key", "succeeded")).encode()),
}
NOT_FOUND = (404, "application/json", b'{"error":"not_found","message":"no payment with this key"}')


class FakeSandbox(BaseHTTPRequestHandler):
    """Answers GET /v1/payments/by-idempotency-key/{key} from ROUTES."""

    seen_paths: ClassVar[list[str]] = []

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        """Serves one lookup; the raw path is recorded to check the key's encoding."""
        self.seen_paths.append(self.path)
        segment = self.path[len(PREFIX):] if self.path.startswith(PREFIX) else None
        status, content_type, body = ROUTES.get(segment or "", NOT_FOUND)
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        """Keeps the test output quiet."""


class Adapter:
    """The adapter subprocess, its port and its captured stderr."""

    def __init__(self, sandbox_url: str, *extra_args: str) -> None:
        self.stderr: IO[str] = tempfile.TemporaryFile("w+", encoding="utf-8")
        env = dict(os.environ, NO_PROXY="127.0.0.1,localhost", no_proxy="127.0.0.1,localhost")
        self.process = subprocess.Popen(
            [
                sys.executable,
                str(HERE / "sandbox_adapter.py"),
                "--listen", "127.0.0.1:0",
                "--sandbox-url", sandbox_url,
                "--timeout-seconds", "10",
                *extra_args,
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=self.stderr,
            text=True,
            env=env,
        )
        self.port = 0

    def wait_listening(self) -> int:
        """Waits for the one "listening" line and returns the port."""
        assert self.process.stdout is not None
        lines: queue.Queue[str] = queue.Queue()
        stdout = self.process.stdout
        threading.Thread(target=lambda: lines.put(stdout.readline()), daemon=True).start()
        try:
            line = lines.get(timeout=START_TIMEOUT_SECONDS)
        except queue.Empty:
            raise AssertionError(f"adapter did not start; stderr:\n{self.logs()}") from None
        prefix = "sandbox-adapter listening on 127.0.0.1:"
        if not line.startswith(prefix):
            raise AssertionError(f"unexpected line {line!r}; stderr:\n{self.logs()}")
        self.port = int(line[len(prefix):].strip())
        return self.port

    def stop(self) -> Optional[int]:
        """Sends SIGTERM and returns the exit code (None when it had to be killed)."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout=STOP_TIMEOUT_SECONDS)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            return None
        finally:
            if self.process.stdout is not None:
                self.process.stdout.close()

    def logs(self) -> str:
        """The adapter's stderr so far."""
        self.stderr.seek(0)
        return self.stderr.read()


class SandboxAdapterTest(unittest.TestCase):
    """Each sandbox answer maps to the right LookupOperation response."""

    stubs: ClassVar[sandbox_adapter.Stubs]
    sandbox: ClassVar[ThreadingHTTPServer]
    adapter: ClassVar[Adapter]
    incomplete_adapter: ClassVar[Adapter]
    channels: ClassVar[list[grpc.Channel]]

    @classmethod
    def setUpClass(cls) -> None:
        cls.stubs = client_stubs()
        cls.sandbox = ThreadingHTTPServer(("127.0.0.1", 0), FakeSandbox)
        threading.Thread(target=cls.sandbox.serve_forever, daemon=True).start()
        url = f"http://127.0.0.1:{cls.sandbox.server_address[1]}"
        cls.channels = []
        # Both start at once; each generates its stubs and binds a free port.
        cls.adapter = Adapter(url)
        cls.incomplete_adapter = Adapter(url, "--no-search-complete")
        try:
            cls.adapter.wait_listening()
            cls.incomplete_adapter.wait_listening()
        except BaseException:
            cls.tearDownClass()
            raise

    @classmethod
    def tearDownClass(cls) -> None:
        for channel in cls.channels:
            channel.close()
        for adapter in (cls.adapter, cls.incomplete_adapter):
            adapter.stop()
            adapter.stderr.close()
        cls.sandbox.shutdown()
        cls.sandbox.server_close()

    def lookup(self, key: str, adapter: Optional[Adapter] = None) -> Any:
        """Calls LookupOperation on ``adapter`` (default: the search-complete one)."""
        port = (adapter or self.adapter).port
        channel = grpc.insecure_channel(f"127.0.0.1:{port}", options=[("grpc.enable_http_proxy", 0)])
        self.channels.append(channel)
        grpc.channel_ready_future(channel).result(timeout=CALL_TIMEOUT_SECONDS)
        stub = self.stubs.pb2_grpc.ProviderAdapterStub(channel)
        request = self.stubs.pb2.LookupOperationRequest(
            namespace="shop",
            operation_key="journal-key-not-sent-to-the-provider",
            provider_key=key,
            action_type="create_payment",
            references={"order_id": "42"},
        )
        return stub.LookupOperation(request, timeout=CALL_TIMEOUT_SECONDS)

    def test_succeeded_payment_is_succeeded_with_a_sanitized_result(self) -> None:
        pb2 = self.stubs.pb2
        response = self.lookup(SUCCEEDED_KEY)
        self.assertEqual(response.outcome, pb2.LOOKUP_OUTCOME_SUCCEEDED)
        self.assertEqual(response.external_id, SUCCEEDED_ID)
        self.assertEqual(
            json.loads(response.result_json),
            {"id": SUCCEEDED_ID, "status": "succeeded", "amount_minor": 490000, "currency": "RUB"},
        )
        self.assertNotIn(SECRET_CARD, response.result_json)
        self.assertEqual(response.error_code, "")
        self.assertIn(PREFIX + "order%2042%2Fpay", FakeSandbox.seen_paths)

    def test_failed_payment_is_failed(self) -> None:
        pb2 = self.stubs.pb2
        response = self.lookup(FAILED_KEY)
        self.assertEqual(response.outcome, pb2.LOOKUP_OUTCOME_FAILED)
        self.assertEqual(response.error_code, "payment_failed")
        self.assertEqual(response.result_json, "")

    def test_other_status_is_pending(self) -> None:
        response = self.lookup(PENDING_KEY)
        self.assertEqual(response.outcome, self.stubs.pb2.LOOKUP_OUTCOME_PENDING)
        self.assertEqual(response.result_json, "")

    def test_404_is_not_found_with_search_complete(self) -> None:
        pb2 = self.stubs.pb2
        response = self.lookup(MISSING_KEY)
        self.assertEqual(response.outcome, pb2.LOOKUP_OUTCOME_NOT_FOUND)
        self.assertTrue(response.search_complete)
        self.assertEqual(response.external_id, "")
        self.assertEqual(response.result_json, "")

    def test_404_follows_the_search_complete_flag(self) -> None:
        response = self.lookup(MISSING_KEY, self.incomplete_adapter)
        self.assertEqual(response.outcome, self.stubs.pb2.LOOKUP_OUTCOME_NOT_FOUND)
        self.assertFalse(response.search_complete)

    def test_500_aborts_with_unavailable(self) -> None:
        with self.assertRaises(grpc.RpcError) as raised:
            self.lookup(ERROR_KEY)
        self.assertEqual(raised.exception.code(), grpc.StatusCode.UNAVAILABLE)

    def test_404_that_is_not_the_sandboxs_aborts_with_unavailable(self) -> None:
        with self.assertRaises(grpc.RpcError) as raised:
            self.lookup(FOREIGN_404_KEY)
        self.assertEqual(raised.exception.code(), grpc.StatusCode.UNAVAILABLE)

    def test_payment_for_another_key_aborts_with_unavailable(self) -> None:
        with self.assertRaises(grpc.RpcError) as raised:
            self.lookup(MISMATCH_KEY)
        self.assertEqual(raised.exception.code(), grpc.StatusCode.UNAVAILABLE)

    def test_unreachable_sandbox_aborts_with_unavailable(self) -> None:
        closed = ThreadingHTTPServer(("127.0.0.1", 0), FakeSandbox)
        url = f"http://127.0.0.1:{closed.server_address[1]}"
        closed.server_close()  # nothing listens on that port now
        settings = sandbox_adapter.Settings(url, timeout_seconds=5.0, search_complete=True)
        with self.assertRaises(sandbox_adapter.LookupFailed) as raised:
            sandbox_adapter.fetch_payment(settings, MISSING_KEY)
        self.assertEqual(raised.exception.reason, "unreachable")

    def test_silent_sandbox_times_out(self) -> None:
        # The kernel completes the connection from the backlog; nothing ever answers.
        with socket.socket() as silent:
            silent.bind(("127.0.0.1", 0))
            silent.listen(8)
            url = f"http://127.0.0.1:{silent.getsockname()[1]}"
            settings = sandbox_adapter.Settings(url, timeout_seconds=0.5, search_complete=True)
            with self.assertRaises(sandbox_adapter.LookupFailed) as raised:
                sandbox_adapter.fetch_payment(settings, MISSING_KEY)
        self.assertEqual(raised.exception.reason, "timeout")


class ShutdownTest(unittest.TestCase):
    """SIGTERM stops the adapter gracefully, and its logs carry no payloads."""

    def test_sigterm_exits_zero_and_logs_no_payload(self) -> None:
        sandbox = ThreadingHTTPServer(("127.0.0.1", 0), FakeSandbox)
        threading.Thread(target=sandbox.serve_forever, daemon=True).start()
        self.addCleanup(sandbox.server_close)
        self.addCleanup(sandbox.shutdown)
        adapter = Adapter(f"http://127.0.0.1:{sandbox.server_address[1]}")
        self.addCleanup(adapter.stderr.close)
        try:
            port = adapter.wait_listening()
            pb = client_stubs()
            with grpc.insecure_channel(
                f"127.0.0.1:{port}", options=[("grpc.enable_http_proxy", 0)]
            ) as channel:
                stub = pb.pb2_grpc.ProviderAdapterStub(channel)
                request = pb.pb2.LookupOperationRequest(operation_key=SUCCEEDED_KEY)
                response = stub.LookupOperation(
                    request, timeout=CALL_TIMEOUT_SECONDS, wait_for_ready=True
                )
                self.assertEqual(response.outcome, pb.pb2.LOOKUP_OUTCOME_SUCCEEDED)
        finally:
            code = adapter.stop()
        logs = adapter.logs()
        self.assertEqual(code, 0, logs)
        self.assertIn("LookupOperation outcome=LOOKUP_OUTCOME_SUCCEEDED", logs)
        for secret in (SUCCEEDED_ID, SECRET_CARD, "490000", SUCCEEDED_KEY):
            self.assertNotIn(secret, logs)


if __name__ == "__main__":
    unittest.main()
