"""A journaled ``create_payment`` tool for LangChain and LangGraph.

The key comes from the call's ``RunnableConfig``, never from the model: the orchestrator
puts the business intent's id in ``config["configurable"]["intent_id"]`` (next to
LangGraph's ``thread_id``) for every run of that intent, so a rerun of the graph or a
repeated tool call pays once.

    python langchain_tool.py [INTENT_ID]

runs the tool twice the way LangGraph's ``ToolNode`` does -- ``tool.invoke`` with a tool
call -- without a model, then once more with another amount under the same intent, and
prints the three ``ToolMessage``s: the payment, the same payment, and the conflict text
(``status="error"``). In a graph: ``ToolNode([create_payment])``.
"""

from __future__ import annotations

import sys
import uuid
from typing import Any

from langchain_core.runnables import RunnableConfig

from opjournal_client.integrations.langchain import journaled_tool
from payments import JOURNAL_OPTIONS, connect_journal, pay


def pay_order(order_id: str, amount_minor: int, currency: str) -> dict[str, Any]:
    """Charges the customer for an order; amount_minor is in minor units (cents)."""
    return pay(order_id, amount_minor, currency)


create_payment = journaled_tool(
    pay_order,
    name="create_payment",
    client=connect_journal(),
    action_type="create_payment",
    key=lambda config, arguments: f"payment:{config['configurable']['intent_id']}",
    subject="payment",
    options=JOURNAL_OPTIONS,
)


def main(intent_id: str) -> None:
    config: RunnableConfig = {"configurable": {"intent_id": intent_id, "thread_id": intent_id}}
    order = {"order_id": "817", "amount_minor": 490000, "currency": "RUB"}
    for call_id, arguments in [
        ("call_1", order),
        ("call_2", order),
        ("call_3", dict(order, amount_minor=590000)),
    ]:
        call = {"type": "tool_call", "name": "create_payment", "args": arguments, "id": call_id}
        message = create_payment.invoke(call, config)
        print(f"{call_id} [{message.status}]: {message.content}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else f"intent-{uuid.uuid4().hex[:12]}")
