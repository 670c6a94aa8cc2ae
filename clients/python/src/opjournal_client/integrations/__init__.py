"""Journaled tools for agent frameworks: a side-effecting tool runs at most once per
business intent, and every other outcome reaches the model as a text it can act on.

Each framework has its own module, an optional extra that imports the framework only when
it is imported itself:

* :mod:`opjournal_client.integrations.mcp` -- MCP servers (``mcp`` SDK, ``MCPServer``).
* :mod:`opjournal_client.integrations.openai_agents` -- OpenAI Agents SDK function tools.
* :mod:`opjournal_client.integrations.langchain` -- LangChain tools and LangGraph's ToolNode.

The key always comes from the application's code (a run or intent id from the framework's
context, a function of the arguments, or for MCP the key the client application sends),
never from the model. Inside a tool's body, :func:`opjournal_client.current_call` (also
importable from here) gives the provider key. :mod:`~opjournal_client.integrations.messages`
holds the texts.
"""

from .. import current_call
from .core import (
    CLIENT_KEY_PATTERN,
    Journaled,
    JournaledToolError,
    namespaced_client_key,
    run_journaled,
    select_payload,
    tool_error,
)

__all__ = [
    "CLIENT_KEY_PATTERN",
    "Journaled",
    "JournaledToolError",
    "current_call",
    "namespaced_client_key",
    "run_journaled",
    "select_payload",
    "tool_error",
]
