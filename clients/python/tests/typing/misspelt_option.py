"""Must FAIL ``mypy --strict``: a misspelt option of ``execute`` is a type error (and a
``TypeError`` at run time), not silently ignored. Checked by the command in README.md."""

from __future__ import annotations

from opjournal_client import JournalClient, ProviderCall, ProviderResult

journal = JournalClient.connect("127.0.0.1:50051")


def pay(call: ProviderCall) -> ProviderResult:
    return ProviderResult()


journal.execute("payment:817", "create_payment", {"order_id": "817"}, pay, lease_secondz=5)
