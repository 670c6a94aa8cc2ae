"""A journaled ``create_payment`` function tool for the OpenAI Agents SDK.

The key comes from the run context, never from the model: the orchestrator mints one
intent id per business intent ("pay order 817") and passes it to ``Runner.run(...,
context=...)``; every attempt of that intent -- a rerun after a crash, a model that calls
the tool twice -- uses the same key, so the payment is made once.

    python openai_agents_tool.py [INTENT_ID]

runs the tool twice through the SDK's own invocation path (``FunctionTool.on_invoke_tool``
with a ``ToolContext``, as the runner calls it) without a model, and prints both outputs:
the same payment. With a model, hand ``cashier`` to ``Runner.run(cashier, "...",
context=Intent(...))``.
"""

from __future__ import annotations

import json
import sys
import uuid
from dataclasses import dataclass
from typing import Any

import anyio
from agents import Agent, RunContextWrapper
from agents.tool_context import ToolContext

from opjournal_client.integrations.openai_agents import journaled_function_tool
from payments import JOURNAL_OPTIONS, connect_journal, pay


@dataclass
class Intent:
    """The run context: which business intent this run serves."""

    intent_id: str


journal = connect_journal()


@journaled_function_tool(
    client=journal,
    action_type="create_payment",
    key=lambda ctx, arguments: f"payment:{ctx.context.intent_id}",
    subject="payment",
    options=JOURNAL_OPTIONS,
)
def create_payment(
    ctx: RunContextWrapper[Intent], order_id: str, amount_minor: int, currency: str
) -> dict[str, Any]:
    """Charges the customer for an order.

    Args:
        order_id: the order to pay.
        amount_minor: the amount in minor units (cents).
        currency: the ISO 4217 currency code.
    """
    return pay(order_id, amount_minor, currency)


cashier = Agent[Intent](
    name="cashier",
    instructions="Pay the order the user names, once. Report what the tool answers.",
    tools=[create_payment],
)


async def main(intent_id: str) -> None:
    arguments = json.dumps({"order_id": "817", "amount_minor": 490000, "currency": "RUB"})
    for attempt, call_id in enumerate(["call_1", "call_2"], start=1):
        context = ToolContext(
            context=Intent(intent_id),
            tool_name=create_payment.name,
            tool_call_id=call_id,
            tool_arguments=arguments,
        )
        output = await create_payment.on_invoke_tool(context, arguments)
        print(f"attempt {attempt}: {json.dumps(output, ensure_ascii=False)}")


if __name__ == "__main__":
    anyio.run(main, sys.argv[1] if len(sys.argv) > 1 else f"intent-{uuid.uuid4().hex[:12]}")
