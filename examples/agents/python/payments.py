"""What the three examples share: the journal client and the payment provider call.

Environment: ``OPJOURNAL_SERVER`` (``host:port``, default ``127.0.0.1:50051``),
``OPJOURNAL_TOKEN`` (a bearer token, if the server wants one), ``PAYMENT_PROVIDER_URL``
(default ``http://127.0.0.1:8081``, the sandbox provider), ``PAYMENT_PROVIDER_TIMEOUT``
(seconds, default 10).
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from typing import Any

from opjournal_client import JournalClient, ProviderRejected, current_call

PROVIDER_URL = os.environ.get("PAYMENT_PROVIDER_URL", "http://127.0.0.1:8081").rstrip("/")
PROVIDER_TIMEOUT = float(os.environ.get("PAYMENT_PROVIDER_TIMEOUT", "10"))


def connect_journal() -> JournalClient:
    """The journal client for ``OPJOURNAL_SERVER`` (and ``OPJOURNAL_TOKEN``)."""
    return JournalClient.connect(
        os.environ.get("OPJOURNAL_SERVER", "127.0.0.1:50051"),
        token=os.environ.get("OPJOURNAL_TOKEN") or None,
    )


def pay(order_id: str, amount_minor: int, currency: str) -> dict[str, Any]:
    """Creates the payment at the provider, inside a journaled tool's body.

    The provider's idempotency key is ``current_call().provider_key``: the journal's key for
    this intent. A 402 is a confirmed rejection (nothing was charged); a timeout, a reset
    connection or a 5xx propagate and are recorded as an unknown outcome.
    """
    request = urllib.request.Request(
        f"{PROVIDER_URL}/v1/payments",
        data=json.dumps(
            {"order_id": order_id, "amount_minor": amount_minor, "currency": currency}
        ).encode(),
        headers={
            "Idempotency-Key": current_call().provider_key,
            "Content-Type": "application/json",
        },
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=PROVIDER_TIMEOUT) as response:
            payment: dict[str, Any] = json.load(response)
    except urllib.error.HTTPError as error:
        if error.code == 402:
            raise ProviderRejected("card_declined") from error
        raise
    return payment


#: Options for every journaled payment tool: record the provider's payment id.
JOURNAL_OPTIONS = {"external_id": lambda payment: payment["id"]}
