"""A smoke test of an installed opjournal-client (wheel or sdist) against a running server.

Run by ``scripts/smoke-install`` in a fresh virtual environment that has only the package and
its dependencies. ``OPJOURNAL_SMOKE_SERVER`` is the server's ``host:port`` (plaintext);
``OPJOURNAL_SMOKE_ACTION`` the action type to use (default ``create_payment``, whose keys in
``config/policy.example.yaml`` look like ``payment:order-N:intent-N``). No provider is
needed: the protected function is the effect, and it counts its own calls.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import os
import random
import sys
from pathlib import Path

import opjournal
import opjournal_client
from opjournal_client import (
    AsyncJournalClient,
    IdempotencyKeyReusedError,
    JournalClient,
    ProviderCall,
    ProviderResult,
    Succeeded,
    current_call,
    idempotent,
)


def main() -> None:
    server = os.environ["OPJOURNAL_SMOKE_SERVER"]
    action = os.environ.get("OPJOURNAL_SMOKE_ACTION", "create_payment")
    installed = Path(opjournal_client.__file__).resolve()
    assert "site-packages" in installed.parts, f"not the installed wheel: {installed}"
    assert importlib.metadata.version("opjournal-client") == opjournal_client.__version__ == "0.2.0"
    for package in (opjournal, opjournal_client):
        assert (Path(package.__file__).parent / "py.typed").is_file(), package.__name__

    order = random.randrange(10**5, 10**6)
    calls: list[str] = []

    with JournalClient.connect(server) as journal:

        @idempotent(journal, action_type=action, key=lambda order, **_: f"payment:order-{order}:intent-1")
        def pay(order: int, amount_minor: int) -> dict[str, object]:
            calls.append(current_call().provider_key)
            return {"id": f"smoke_{order}", "amount_minor": amount_minor}

        first = pay(order, 490000)
        again = pay(order, 490000)
        assert first["id"] == again["id"] and len(calls) == 1, "the second call replays"
        try:
            pay(order, 590000)
        except IdempotencyKeyReusedError:
            pass
        else:
            raise AssertionError("other arguments under the same key must be refused")

    async def through_asyncio() -> None:
        async with AsyncJournalClient.connect(server) as journal:

            async def never(call: ProviderCall) -> ProviderResult:
                raise AssertionError("a replay must not call the provider")

            outcome = await journal.execute(
                f"payment:order-{order}:intent-1", action, {"order": order, "amount_minor": 490000}, never
            )
            assert isinstance(outcome, Succeeded) and outcome.replayed, outcome

    asyncio.run(through_asyncio())
    print(f"smoke test passed: opjournal-client {opjournal_client.__version__} from {installed.parent}")


if __name__ == "__main__":
    sys.exit(main())
