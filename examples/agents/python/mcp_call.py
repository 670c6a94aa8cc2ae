"""Starts ``mcp_payment_server.py`` over stdio and calls ``create_payment`` the way an MCP
host does when it repeats a call: with the same idempotency key.

    python mcp_call.py [KEY]

Prints the first answer, the repeat's (the same payment: the tool did not pay twice) and a
call that reuses the key for another amount (a tool error telling the model what to do).
Use a new KEY for a new payment.
"""

from __future__ import annotations

import json
import os
import sys
import uuid
from pathlib import Path

import anyio
from mcp import Client, StdioServerParameters

from opjournal_client.integrations.mcp import call_tool_with_key

HERE = Path(__file__).resolve().parent


async def main(key: str) -> None:
    server = StdioServerParameters(
        command=sys.executable,
        args=[str(HERE / "mcp_payment_server.py")],
        env=dict(os.environ),
        cwd=str(HERE),
    )
    order = {"order_id": "817", "amount_minor": 490000, "currency": "RUB"}
    async with Client(server) as client:
        for label, arguments in [
            ("first call", order),
            ("repeat, same key", order),
            ("same key, other amount", dict(order, amount_minor=590000)),
        ]:
            result = await call_tool_with_key(
                client.session, "create_payment", arguments, key, read_timeout_seconds=30
            )
            shown = result.structured_content if not result.is_error else result.content[0].text
            print(f"{label}: is_error={result.is_error}")
            print(f"  {json.dumps(shown, ensure_ascii=False)}")


if __name__ == "__main__":
    anyio.run(main, sys.argv[1] if len(sys.argv) > 1 else f"demo-{uuid.uuid4().hex[:12]}")
