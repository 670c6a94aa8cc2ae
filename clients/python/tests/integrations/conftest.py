"""Fixtures for the agent-integration tests: a real opjournal server and sandbox provider.

``tests/it/python_agents.rs`` starts both over a fresh database and runs this folder with
their addresses in ``OPJOURNAL_TEST_SERVER`` and ``OPJOURNAL_TEST_SANDBOX_URL``, then
checks the journal rows and the provider's counts itself. The frameworks come from
``requirements-agents.txt`` (``scripts/client-envs python-agents``). No language model is
involved: each test drives its framework's own tool-calling path with a scripted call.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Iterator, Optional

import pytest

from opjournal_client import JournalClient, ProviderRejected, current_call


def _required_env(name: str) -> str:
    value = os.environ.get(name)
    if not value:
        raise RuntimeError(
            f"{name} is not set: these tests need a running opjournal server and sandbox; "
            "run them through `cargo test --test python_agents`"
        )
    return value


class Provider:
    """The sandbox payment provider, called the way a tool's body calls its provider."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url.rstrip("/")

    def pay(
        self,
        order_id: str,
        amount_minor: int,
        currency: str,
        *,
        fault: Optional[str] = None,
        timeout: float = 5.0,
    ) -> dict[str, Any]:
        """POST /v1/payments with ``current_call().provider_key`` as the Idempotency-Key.
        A 402 is a confirmed rejection; other errors propagate (unknown outcomes)."""
        headers = {
            "Idempotency-Key": current_call().provider_key,
            "Content-Type": "application/json",
        }
        if fault:
            headers["X-Sandbox-Fault"] = fault
        body = {"order_id": order_id, "amount_minor": amount_minor, "currency": currency}
        request = urllib.request.Request(
            f"{self.base_url}/v1/payments",
            data=json.dumps(body).encode(),
            headers=headers,
            method="POST",
        )
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                return json.load(response)
        except urllib.error.HTTPError as error:
            if error.code == 402:
                raise ProviderRejected("card_declined") from error
            raise

    def effects(self, key: str) -> dict[str, int]:
        """GET /v1/effects/{key}: requests, effects and lookups for one provider key."""
        quoted = urllib.parse.quote(key, safe="")
        with urllib.request.urlopen(f"{self.base_url}/v1/effects/{quoted}", timeout=5) as r:
            counts = json.load(r)
        return {name: counts[name] for name in ("requests", "effects", "lookups")}


@pytest.fixture(scope="session")
def journal() -> Iterator[JournalClient]:
    with JournalClient.connect(_required_env("OPJOURNAL_TEST_SERVER")) as client:
        yield client


@pytest.fixture(scope="session")
def provider() -> Provider:
    return Provider(_required_env("OPJOURNAL_TEST_SANDBOX_URL"))


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"
