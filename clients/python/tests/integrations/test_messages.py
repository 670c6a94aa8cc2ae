"""The model-facing texts: one per kind, free of placeholders once filled, and quoted word
for word in docs/agent-tools.md (the page must change with them)."""

from __future__ import annotations

import re
from pathlib import Path

from opjournal_client.integrations import messages, namespaced_client_key
from opjournal_client.integrations.core import JournaledToolError

DOC = Path(__file__).resolve().parents[4] / "docs/agent-tools.md"
VALUES = {"subject": "payment", "retry_after": 5, "error_code": "card_declined"}


def test_every_text_is_in_the_docs_table_word_for_word():
    table = {}
    for line in DOC.read_text().splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) == 3 and re.fullmatch(r"`[a-z_]+`", cells[0]):
            table[cells[0].strip("`")] = cells[2]
    assert set(table) == set(messages.KINDS)
    for kind, text in messages.KINDS.items():
        filled = text.format(**VALUES)
        assert "{" not in filled
        assert table[kind] == filled, kind


def test_client_keys_are_scoped_to_the_tool_and_checked():
    assert namespaced_client_key("mcp:create_payment", "order-817.a:b_c") == (
        "mcp:create_payment:order-817.a:b_c"
    )
    for bad in ["", "k" * 129, "with space", "ключ", "a/b", None, 817]:
        try:
            namespaced_client_key("mcp:create_payment", bad)
        except JournaledToolError as error:
            assert error.kind == "invalid_key"
        else:
            raise AssertionError(f"{bad!r} was accepted")
