"""Journaled LangChain tools through ``tool.invoke`` with a tool call, and through a LangGraph
agent loop whose ``ToolNode`` is fed ``AIMessage`` tool calls by a scripted agent node
instead of a model. ``tests/it/python_agents.rs`` checks the rows of the ``lc:*`` keys
afterwards.
"""

from __future__ import annotations

import json
from typing import Optional

import pytest
from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.runnables import RunnableConfig
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition

from opjournal.v1 import journal_pb2 as opjournal_pb2
from opjournal_client.integrations import messages
from opjournal_client.integrations.langchain import journaled_tool

PAY = {"order_id": "700", "amount_minor": 4200, "currency": "USD"}


def payment_tool(journal, provider, *, fault: Optional[str] = None, action_type: str = "create_payment"):
    def create_payment(order_id: str, amount_minor: int, currency: str, config: RunnableConfig) -> dict:
        """Pays an order."""
        assert config["configurable"]["intent_id"], "the tool's own config is passed through"
        return provider.pay(order_id, amount_minor, currency, fault=fault, timeout=0.3 if fault else 5.0)

    return journaled_tool(
        create_payment,
        client=journal,
        action_type=action_type,
        key=lambda config, arguments: f"lc:{config['configurable']['intent_id']}:pay",
        subject="payment",
    )


def config(intent_id: str) -> RunnableConfig:
    return {"configurable": {"intent_id": intent_id, "thread_id": f"thread-{intent_id}"}}


def call(arguments: dict, call_id: str) -> dict:
    return {"type": "tool_call", "name": "create_payment", "args": arguments, "id": call_id}


def agent_graph(tools, *turns: AIMessage):
    """A LangGraph agent loop -- agent node, ``tools_condition``, ``ToolNode``, back to the
    agent -- whose agent node answers from a script instead of a model."""
    script = list(turns)

    def agent(state: MessagesState) -> dict:
        return {"messages": [script.pop(0)]}

    graph = StateGraph(MessagesState)
    graph.add_node("agent", agent)
    graph.add_node("tools", ToolNode(tools))
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", tools_condition)
    graph.add_edge("tools", "agent")
    return graph.compile()


def tool_messages(state: dict) -> dict[str, ToolMessage]:
    return {m.tool_call_id: m for m in state["messages"] if isinstance(m, ToolMessage)}


def test_the_schema_shows_only_the_models_arguments(journal, provider):
    tool = payment_tool(journal, provider)
    assert set(tool.tool_call_schema.model_json_schema()["properties"]) == {
        "order_id",
        "amount_minor",
        "currency",
    }


def test_a_tool_call_repeated_after_a_lost_answer_pays_once(journal, provider):
    tool = payment_tool(journal, provider)
    first = tool.invoke(call(PAY, "call_1"), config("intent-700"))
    assert isinstance(first, ToolMessage) and first.status == "success"
    # The answer is lost on the way back to the graph; the step runs again.
    again = tool.invoke(call(PAY, "call_2"), config("intent-700"))
    assert again.status == "success"
    assert json.loads(again.content) == json.loads(first.content)
    assert json.loads(first.content)["status"] == "succeeded"
    assert provider.effects("lc:intent-700:pay") == {"requests": 1, "effects": 1, "lookups": 0}


def test_a_graph_replays_and_reports_a_conflict(journal, provider):
    tools = [payment_tool(journal, provider)]
    pay = dict(PAY, order_id="701")
    other = dict(pay, amount_minor=9999)
    graph = agent_graph(
        tools,
        AIMessage(content="", tool_calls=[call(pay, "call_1")]),
        AIMessage(content="", tool_calls=[call(pay, "call_2")]),
        AIMessage(content="", tool_calls=[call(other, "call_3")]),
        AIMessage(content="Order 701 is paid."),
    )
    state = graph.invoke({"messages": [("user", "pay order 701")]}, config("intent-701"))
    assert state["messages"][-1].content == "Order 701 is paid."
    outputs = tool_messages(state)
    paid, replayed, refused = outputs["call_1"], outputs["call_2"], outputs["call_3"]
    assert paid.status == "success" and json.loads(paid.content)["status"] == "succeeded"
    assert replayed.status == "success" and replayed.content == paid.content
    assert refused.status == "error"
    assert refused.content == messages.CONFLICT.format(subject="payment")
    assert provider.effects("lc:intent-701:pay") == {"requests": 1, "effects": 1, "lookups": 0}


@pytest.mark.anyio
async def test_a_graph_run_async_reports_an_unknown_outcome(journal, provider):
    tools = [payment_tool(journal, provider, fault="commit-then-timeout")]
    pay = dict(PAY, order_id="702")
    graph = agent_graph(
        tools,
        AIMessage(content="", tool_calls=[call(pay, "call_1")]),
        AIMessage(content="", tool_calls=[call(pay, "call_2")]),
        AIMessage(content="The payment is being verified."),
    )
    state = await graph.ainvoke({"messages": [("user", "pay order 702")]}, config("intent-702"))
    outputs = tool_messages(state)
    for call_id in ("call_1", "call_2"):
        assert outputs[call_id].status == "error"
        assert outputs[call_id].content == messages.VERIFICATION_REQUIRED.format(subject="payment")
    assert provider.effects("lc:intent-702:pay") == {"requests": 1, "effects": 1, "lookups": 0}


def test_a_confirmed_rejection_reads_as_rejected_on_every_call(journal, provider):
    tool = payment_tool(journal, provider, fault="reject")
    pay = dict(PAY, order_id="703")
    declined = [tool.invoke(call(pay, f"call_{n}"), config("intent-703")) for n in (1, 2)]
    expected = messages.REJECTED.format(subject="payment", error_code="card_declined")
    for message in declined:
        assert message.status == "error" and message.content == expected
    # Declined at the provider once; the repeat was answered from the journal.
    assert provider.effects("lc:intent-703:pay") == {"requests": 1, "effects": 0, "lookups": 0}


def test_the_same_payment_under_a_second_intent_is_held_as_a_duplicate(journal, provider):
    # create_payment_hold: the test policy's action with duplicate_intent: hold.
    tool = payment_tool(journal, provider, action_type="create_payment_hold")
    pay = dict(PAY, order_id="704")
    first = tool.invoke(call(pay, "call_1"), config("intent-704"))
    second = tool.invoke(call(pay, "call_2"), config("intent-705"))
    assert first.status == "success"
    assert second.status == "error"
    assert second.content == messages.DUPLICATE_INTENT.format(subject="payment")
    assert provider.effects("lc:intent-704:pay")["effects"] == 1
    assert provider.effects("lc:intent-705:pay")["requests"] == 0


def test_once_the_reconciler_found_the_payment_the_same_call_returns_it(journal, provider):
    tool = payment_tool(journal, provider, fault="commit-then-timeout")
    pay = dict(PAY, order_id="706")
    unknown = tool.invoke(call(pay, "call_1"), config("intent-706"))
    assert unknown.content == messages.VERIFICATION_REQUIRED.format(subject="payment")
    # The reconciler asks the provider by the provider key and finds the payment.
    settled = journal.reconcile("lc:intent-706:pay")
    assert settled.operation.status == opjournal_pb2.OPERATION_STATUS_SUCCEEDED
    found = tool.invoke(call(pay, "call_2"), config("intent-706"))
    assert found.status == "success"
    assert json.loads(found.content)["id"] == settled.operation.external_id
    counts = provider.effects("lc:intent-706:pay")
    assert (counts["requests"], counts["effects"], counts["lookups"]) == (1, 1, 1)
