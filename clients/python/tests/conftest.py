"""Fixtures for the tests that run against a real opjournal server and sandbox provider.

The Rust integration tests ``tests/it/python_client.rs`` start both on port 0 over a fresh
Postgres database and run this suite with their addresses in ``OPJOURNAL_TEST_SERVER``
(``host:port``) and ``OPJOURNAL_TEST_SANDBOX_URL``; afterwards they check the journal rows
and the provider's effect counts themselves. The server's test policy
(``tests/it/common/mod.rs``) defines the action types used here.
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Callable, Iterator, Optional, TypeVar

import pytest

from opjournal_client import JournalClient

#: The source article's payment and the same key's payload with another amount.
PAY_817 = {"order_id": "817", "amount_minor": 490000, "currency": "RUB"}
PAY_817_OTHER_AMOUNT = {"order_id": "817", "amount_minor": 590000, "currency": "RUB"}

T = TypeVar("T")


def _required_env(name: str) -> str:
    value = os.environ.get(name)
    if not value:
        raise RuntimeError(
            f"{name} is not set: these tests need a running opjournal server and sandbox; "
            "run them through `cargo test --test python_client` (./scripts/test)"
        )
    return value


class Sandbox:
    """The sandbox payment provider (docs/sandbox.md), called the way an orchestrator would."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url.rstrip("/")

    def pay(
        self,
        idempotency_key: str,
        body: dict[str, Any],
        *,
        fault: Optional[str] = None,
        timeout: float = 5.0,
    ) -> dict[str, Any]:
        """POST /v1/payments; raises ``TimeoutError`` or ``urllib.error.HTTPError``."""
        headers = {"Idempotency-Key": idempotency_key, "Content-Type": "application/json"}
        if fault:
            headers["X-Sandbox-Fault"] = fault
        request = urllib.request.Request(
            f"{self.base_url}/v1/payments",
            data=json.dumps(body).encode(),
            headers=headers,
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return json.load(response)

    def effects(self, key: str) -> dict[str, int]:
        """GET /v1/effects/{key}: requests, effects and lookups for one key."""
        quoted = urllib.parse.quote(key, safe="")
        with urllib.request.urlopen(f"{self.base_url}/v1/effects/{quoted}", timeout=5) as r:
            counts = json.load(r)
        return {name: counts[name] for name in ("requests", "effects", "lookups")}


def wait_for(what: str, probe: Callable[[], Optional[T]], *, seconds: float = 30.0) -> T:
    """Polls ``probe`` until it returns something other than ``None``; fails after
    ``seconds`` (a bound against hanging, not a timing assertion)."""
    deadline = time.monotonic() + seconds
    while True:
        value = probe()
        if value is not None:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"gave up waiting for {what}")
        time.sleep(0.05)


@pytest.fixture(scope="session")
def client() -> Iterator[JournalClient]:
    with JournalClient.connect(_required_env("OPJOURNAL_TEST_SERVER")) as journal:
        yield journal


@pytest.fixture(scope="session")
def sandbox() -> Sandbox:
    return Sandbox(_required_env("OPJOURNAL_TEST_SANDBOX_URL"))
