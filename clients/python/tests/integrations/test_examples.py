"""The OpenAI Agents SDK and LangChain examples of examples/agents/python, run as a reader
runs them (``python openai_agents_tool.py INTENT``), against the real server and sandbox.
The MCP example is driven over stdio by ``test_mcp_stdio.py``. ``tests/it/python_agents.rs``
checks the rows of ``payment:intent-example-*`` afterwards."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from opjournal_client.integrations import messages

EXAMPLE = Path(__file__).resolve().parents[4] / "examples/agents/python"


def run_example(script: str, intent_id: str, provider) -> str:
    env = dict(os.environ)
    env["OPJOURNAL_SERVER"] = os.environ["OPJOURNAL_TEST_SERVER"]
    env["PAYMENT_PROVIDER_URL"] = provider.base_url
    done = subprocess.run(
        [sys.executable, script, intent_id],
        cwd=EXAMPLE,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_openai_agents_example_pays_once(provider):
    out = run_example("openai_agents_tool.py", "intent-example-oa", provider)
    outputs = [json.loads(line.split(": ", 1)[1]) for line in out.splitlines()]
    assert len(outputs) == 2 and outputs[0] == outputs[1]
    assert outputs[0]["status"] == "succeeded"
    counts = provider.effects("payment:intent-example-oa")
    assert (counts["requests"], counts["effects"]) == (1, 1)


def test_the_langchain_example_pays_once_and_shows_the_conflict(provider):
    out = run_example("langchain_tool.py", "intent-example-lc", provider)
    lines = dict(re.match(r"(call_\d) \[(\w+)\]: (.*)", line).group(1, 0) for line in out.splitlines())
    first, second, third = (lines[f"call_{n}"].split(": ", 1) for n in (1, 2, 3))
    assert first[0].endswith("[success]") and second[0].endswith("[success]")
    assert json.loads(first[1]) == json.loads(second[1])
    assert third[0].endswith("[error]")
    assert third[1] == messages.CONFLICT.format(subject="payment")
    counts = provider.effects("payment:intent-example-lc")
    assert (counts["requests"], counts["effects"]) == (1, 1)
