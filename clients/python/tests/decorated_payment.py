"""The payment that ``test_decorator.py`` protects with ``@idempotent``, shared by its two
processes (pytest itself and ``decorated_worker.py``).

``charge`` is the sync function (with a :class:`JournalClient`), ``charge_async`` the same
payment as an ``async def`` (with an :class:`AsyncJournalClient`, made inside the running
loop and handed to the decorator through a function). The key comes from the order id, the
payload is the declared subset of the arguments (``fault`` only steers the sandbox), and
the provider key comes from :func:`current_call`. ``CALLS`` counts the function bodies that
ran in this process.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
import urllib.request
import weakref
from typing import Any, Optional

from opjournal_client import AsyncJournalClient, JournalClient, current_call, idempotent

SERVER = os.environ["OPJOURNAL_TEST_SERVER"]
SANDBOX = os.environ["OPJOURNAL_TEST_SANDBOX_URL"].rstrip("/")

#: The provider keys the function bodies of this process were called with.
CALLS: list[str] = []

journal = JournalClient.connect(SERVER)
_async_clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, AsyncJournalClient] = (
    weakref.WeakKeyDictionary()
)


def async_journal() -> AsyncJournalClient:
    """One asyncio client per running event loop (``grpc.aio`` channels belong to one)."""
    loop = asyncio.get_running_loop()
    if loop not in _async_clients:
        _async_clients[loop] = AsyncJournalClient.connect(SERVER)
    return _async_clients[loop]


def pay(order_id: str, amount_minor: int, currency: str, fault: Optional[str]) -> dict[str, Any]:
    """POST /v1/payments with the journal's provider key; the sandbox's answer."""
    provider_key = current_call().provider_key
    CALLS.append(provider_key)
    # Long enough that every concurrent caller meets the lease of the first.
    time.sleep(0.3)
    headers = {"Idempotency-Key": provider_key, "Content-Type": "application/json"}
    if fault:
        headers["X-Sandbox-Fault"] = fault
    body = {"order_id": order_id, "amount_minor": amount_minor, "currency": currency}
    request = urllib.request.Request(
        f"{SANDBOX}/v1/payments", data=json.dumps(body).encode(), headers=headers, method="POST"
    )
    with urllib.request.urlopen(request, timeout=1.0) as response:
        payment: dict[str, Any] = json.load(response)
    return payment


PROTECTION: dict[str, Any] = dict(
    action_type="create_payment",
    key=lambda order_id, **_: f"py:decorator:{order_id}",
    payload=["order_id", "amount_minor", "currency"],
    external_id=lambda payment: payment["id"],
    in_progress_wait=30.0,
)


@idempotent(journal, **PROTECTION)
def charge(
    order_id: str, amount_minor: int, currency: str, fault: Optional[str] = None
) -> dict[str, Any]:
    """Charges the order once per intent (sync)."""
    return pay(order_id, amount_minor, currency, fault)


@idempotent(async_journal, **PROTECTION)
async def charge_async(
    order_id: str, amount_minor: int, currency: str, fault: Optional[str] = None
) -> dict[str, Any]:
    """Charges the order once per intent (asyncio)."""
    assert current_call().provider_key.startswith("py:decorator:")
    return await asyncio.to_thread(pay, order_id, amount_minor, currency, fault)


async def burst(order_id: str, tasks: int, calls_per_task: int, start_at: float) -> list[Any]:
    """``tasks`` asyncio tasks, each calling ``charge_async`` ``calls_per_task`` times for
    the same intent, all starting at the wall-clock time ``start_at``; their answers (the
    payment, or the exception raised)."""
    await asyncio.sleep(max(0.0, start_at - time.time()))

    async def task() -> list[Any]:
        answers: list[Any] = []
        for _ in range(calls_per_task):
            try:
                answers.append(await charge_async(order_id, 490000, "RUB"))
            except Exception as error:  # noqa: BLE001 - the test reports what it got
                answers.append(error)
        return answers

    per_task = await asyncio.gather(*(task() for _ in range(tasks)))
    return [answer for answers in per_task for answer in answers]
