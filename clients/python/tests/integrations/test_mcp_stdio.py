"""The example MCP server (examples/agents/python/mcp_payment_server.py) as an MCP host runs
it: a child process on stdio, called through the SDK's client with JSON-RPC over its pipes.

A relay in front of the sandbox holds the provider's answer back, so the client's request
times out after the payment was made: the answer is really lost, the client sends
``notifications/cancelled``, and the retry with the same ``idempotencyKey`` must get that
payment. ``tests/it/python_agents.rs`` checks the row of ``mcp:create_payment:order-830``.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Iterator

import pytest
from mcp import Client, MCPError, StdioServerParameters

from opjournal_client.integrations import messages
from opjournal_client.integrations.mcp import call_tool_with_key

pytestmark = pytest.mark.anyio

EXAMPLE = Path(__file__).resolve().parents[4] / "examples/agents/python"

#: Seconds the relay holds the provider's first answer: past the client's 0.5 s timeout.
HOLD_SECONDS = 1.5


class Relay(ThreadingHTTPServer):
    """Forwards POST /v1/payments to the sandbox and holds the answer back while
    ``hold`` is set."""

    daemon_threads = True

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.hold = 0.0
        super().__init__(("127.0.0.1", 0), _RelayHandler)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _RelayHandler(BaseHTTPRequestHandler):
    server: Relay

    def do_POST(self) -> None:  # noqa: N802 - the http.server interface
        body = self.rfile.read(int(self.headers["Content-Length"]))
        headers = {
            name: self.headers[name]
            for name in ("Idempotency-Key", "Content-Type", "X-Sandbox-Fault")
            if self.headers[name]
        }
        request = urllib.request.Request(
            self.server.upstream + self.path, data=body, headers=headers, method="POST"
        )
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                status, answer = response.status, response.read()
        except urllib.error.HTTPError as error:
            status, answer = error.code, error.read()
        time.sleep(self.server.hold)
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def relay(provider) -> Iterator[Relay]:
    server = Relay(provider.base_url)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def example_server(relay: Relay) -> StdioServerParameters:
    env = dict(os.environ)
    env["OPJOURNAL_SERVER"] = os.environ["OPJOURNAL_TEST_SERVER"]
    env["PAYMENT_PROVIDER_URL"] = relay.url
    return StdioServerParameters(
        command=sys.executable,
        args=[str(EXAMPLE / "mcp_payment_server.py")],
        env=env,
        cwd=str(EXAMPLE),
    )


async def test_the_example_server_pays_once_when_the_host_retries_a_lost_call(relay, provider):
    key = "mcp:create_payment:order-830"
    order = {"order_id": "830", "amount_minor": 15000, "currency": "EUR"}
    relay.hold = HOLD_SECONDS
    async with Client(example_server(relay)) as client:
        with pytest.raises(MCPError) as lost:
            await call_tool_with_key(
                client.session, "create_payment", order, "order-830", read_timeout_seconds=0.5
            )
        assert "timed out" in str(lost.value)
        # The provider made the payment; only its answer is missing.
        assert provider.effects(key)["effects"] == 1
        relay.hold = 0.0

        retried = await call_tool_with_key(
            client.session, "create_payment", order, "order-830", read_timeout_seconds=30
        )
        assert not retried.is_error, retried.content[0].text
        payment = retried.structured_content["result"]

        other = await call_tool_with_key(
            client.session, "create_payment", dict(order, amount_minor=16000), "order-830"
        )
        assert other.is_error
        assert other.content[0].text == messages.CONFLICT.format(subject="payment")

    with urllib.request.urlopen(
        f"{provider.base_url}/v1/payments/by-idempotency-key/{key}", timeout=5
    ) as response:
        made = json.load(response)
    assert payment["id"] == made["id"] and payment["amount_minor"] == 15000
    counts = provider.effects(key)
    assert (counts["requests"], counts["effects"]) == (1, 1)
