"""Checked by ``python -m mypy`` (pyproject.toml): the public API used as documented
type-checks under ``--strict``."""

from __future__ import annotations

from opjournal_client import (
    AsyncJournalClient,
    JournalClient,
    Outcome,
    ProviderCall,
    ProviderResult,
    current_call,
    idempotent,
)

journal = JournalClient.connect("127.0.0.1:50051")


def pay(call: ProviderCall) -> ProviderResult:
    return ProviderResult(external_id="pay_1", result={"id": "pay_1"})


outcome: Outcome = journal.execute(
    "payment:817", "create_payment", {"order_id": "817"}, pay, lease_seconds=5, settle_wait=2.5
)


@idempotent(journal, action_type="create_payment", key=lambda order_id, **_: f"payment:{order_id}")
def create_payment(order_id: str, amount_minor: int) -> dict[str, str]:
    return {"id": current_call().provider_key}


paid: dict[str, str] = create_payment("817", 490000)


async def main(client: AsyncJournalClient) -> str:
    @idempotent(client, action_type="create_payment", key="payment:818")
    async def charge(order_id: str) -> str:
        return current_call().provider_key

    async def call(provider_call: ProviderCall) -> ProviderResult:
        return ProviderResult()

    await client.execute("payment:819", "create_payment", {}, call, in_progress_wait=1.0)
    return await charge("818")
