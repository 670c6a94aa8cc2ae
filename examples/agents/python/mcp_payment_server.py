"""An MCP server (``mcp`` 2.x ``MCPServer``, formerly FastMCP) with one journaled tool,
``create_payment``, on stdio.

    python mcp_payment_server.py

The key is the MCP client's ``idempotencyKey`` (``params.idempotencyKey`` or
``params._meta.idempotencyKey`` of ``tools/call``), scoped to the tool as
``mcp:create_payment:<key>``; a call without one gets the server's own key, one payment per
order: ``payment:order-<order_id>``. A repeat that arrives while the first call still runs
waits up to 20 s for its result.
"""

from __future__ import annotations

from typing import Any, Mapping

from mcp.server.mcpserver import Context, MCPServer

from opjournal_client.integrations.mcp import journaled_tool
from payments import JOURNAL_OPTIONS, connect_journal, pay

server = MCPServer("payments")
journal = connect_journal()


def order_key(arguments: Mapping[str, Any], ctx: Context) -> str:
    """The server's key when the client sent none: one payment per order."""
    return f"payment:order-{arguments['order_id']}"


@journaled_tool(
    server,
    client=journal,
    action_type="create_payment",
    key=order_key,
    subject="payment",
    in_progress_wait=20,
    options=JOURNAL_OPTIONS,
)
def create_payment(order_id: str, amount_minor: int, currency: str) -> dict[str, Any]:
    """Charges the customer for an order. amount_minor is in minor units (cents)."""
    return pay(order_id, amount_minor, currency)


if __name__ == "__main__":
    server.run("stdio")
