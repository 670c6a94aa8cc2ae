"""Journaled function tools through the OpenAI Agents SDK's own runner, with no model.

A scripted ``Model`` stands in for the language model: each turn returns the tool call (or
final message) the test wrote, and records the input the runner sent, so the tests read
exactly what a model would have read back from the tool. Everything between -- the
``Runner`` loop, argument parsing and validation, the run context, the function tool, its
error handling -- is the SDK's own code. ``tests/it/python_agents.rs`` checks the rows of
the ``oa:*`` keys afterwards.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, AsyncIterator, Optional

import pytest
from agents import Agent, RunContextWrapper, Runner, set_tracing_disabled
from agents.items import ModelResponse
from agents.models.interface import Model
from agents.tool_context import ToolContext
from agents.usage import Usage
from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)

from opjournal_client.integrations import messages
from opjournal_client.integrations.openai_agents import journaled_function_tool

pytestmark = pytest.mark.anyio

set_tracing_disabled(True)


@dataclass
class Intent:
    """The application's run context: the business intent this run serves."""

    intent_id: str


def tool_call(name: str, arguments: dict[str, Any], call_id: str) -> ResponseFunctionToolCall:
    return ResponseFunctionToolCall(
        type="function_call",
        id=f"fc_{call_id}",
        call_id=call_id,
        name=name,
        arguments=json.dumps(arguments),
        status="completed",
    )


def final_message(text: str) -> ResponseOutputMessage:
    return ResponseOutputMessage(
        id="msg_final",
        type="message",
        role="assistant",
        status="completed",
        content=[ResponseOutputText(type="output_text", text=text, annotations=[])],
    )


class ScriptedModel(Model):
    """Answers each turn from a script; a turn that is an exception is raised (a lost model
    connection). Records every input it is sent."""

    def __init__(self, *turns: Any) -> None:
        self.turns = list(turns)
        self.inputs: list[Any] = []

    async def get_response(self, system_instructions, input, *args: Any, **kwargs: Any) -> ModelResponse:
        self.inputs.append(input)
        turn = self.turns.pop(0)
        if isinstance(turn, BaseException):
            raise turn
        return ModelResponse(output=turn, usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        raise NotImplementedError("the tests run the agent without streaming")

    def tool_output(self, call_id: str) -> Optional[str]:
        """The output the runner sent back for ``call_id`` (what the model reads)."""
        for items in self.inputs:
            for item in items if isinstance(items, list) else ():
                if item.get("type") == "function_call_output" and item.get("call_id") == call_id:
                    return item["output"]
        return None


def payment_tool(journal, provider, *, fault: Optional[str] = None, name: str = "create_payment"):
    @journaled_function_tool(
        client=journal,
        action_type="create_payment",
        key=lambda ctx, arguments: f"oa:{ctx.context.intent_id}:pay",
        subject="payment",
        name_override=name,
    )
    def create_payment(
        ctx: RunContextWrapper[Intent], order_id: str, amount_minor: int, currency: str
    ) -> dict:
        """Pays an order.

        Args:
            order_id: the order to pay.
            amount_minor: the amount in minor units.
            currency: ISO 4217 code.
        """
        assert isinstance(ctx.context, Intent)
        return provider.pay(order_id, amount_minor, currency, fault=fault, timeout=0.3 if fault else 5.0)

    return create_payment


PAY = {"order_id": "900", "amount_minor": 12500, "currency": "EUR"}


async def test_a_run_that_lost_its_answer_is_run_again_and_pays_once(journal, provider):
    tool = payment_tool(journal, provider)
    # The first run pays, then loses the model's connection before it could answer.
    first = ScriptedModel([tool_call("create_payment", PAY, "call_1")], ConnectionError("model gone"))
    agent = Agent(name="cashier", instructions="Pay the order.", tools=[tool], model=first)
    with pytest.raises(ConnectionError):
        await Runner.run(agent, "pay order 900", context=Intent("intent-900"))
    paid = first.tool_output("call_1")
    assert paid is not None and "pay_" in paid

    # The orchestrator runs the same intent again; the model calls the tool again.
    second = ScriptedModel(
        [tool_call("create_payment", PAY, "call_2")], [final_message("Order 900 is paid.")]
    )
    agent = agent.clone(model=second)
    result = await Runner.run(agent, "pay order 900", context=Intent("intent-900"))
    assert result.final_output == "Order 900 is paid."
    assert second.tool_output("call_2") == paid, "the stored result, word for word"
    assert provider.effects("oa:intent-900:pay") == {"requests": 1, "effects": 1, "lookups": 0}


async def test_other_arguments_for_the_same_intent_read_as_a_conflict(journal, provider):
    tool = payment_tool(journal, provider)
    pay = dict(PAY, order_id="901")
    model = ScriptedModel(
        [tool_call("create_payment", pay, "call_1")],
        [tool_call("create_payment", dict(pay, amount_minor=99900), "call_2")],
        [final_message("done")],
    )
    agent = Agent(name="cashier", instructions="Pay the order.", tools=[tool], model=model)
    await Runner.run(agent, "pay order 901", context=Intent("intent-901"))
    assert "pay_" in model.tool_output("call_1")
    assert model.tool_output("call_2") == messages.CONFLICT.format(subject="payment")
    assert provider.effects("oa:intent-901:pay") == {"requests": 1, "effects": 1, "lookups": 0}


async def test_an_unknown_outcome_reads_as_verification_required(journal, provider):
    tool = payment_tool(journal, provider, fault="commit-then-timeout")
    pay = dict(PAY, order_id="902")
    model = ScriptedModel(
        [tool_call("create_payment", pay, "call_1")],
        [tool_call("create_payment", pay, "call_2")],
        [final_message("The payment is being verified.")],
    )
    agent = Agent(name="cashier", instructions="Pay the order.", tools=[tool], model=model)
    await Runner.run(agent, "pay order 902", context=Intent("intent-902"))
    expected = messages.VERIFICATION_REQUIRED.format(subject="payment")
    assert model.tool_output("call_1") == expected
    assert model.tool_output("call_2") == expected
    assert provider.effects("oa:intent-902:pay") == {"requests": 1, "effects": 1, "lookups": 0}


async def test_on_invoke_tool_with_a_real_tool_context_replays(journal, provider):
    tool = payment_tool(journal, provider)
    pay = json.dumps(dict(PAY, order_id="903"))

    def context(call_id: str) -> ToolContext:
        return ToolContext(
            context=Intent("intent-903"),
            tool_name="create_payment",
            tool_call_id=call_id,
            tool_arguments=pay,
        )

    first = await tool.on_invoke_tool(context("call_1"), pay)
    again = await tool.on_invoke_tool(context("call_2"), pay)
    assert first == again and first["status"] == "succeeded"
    assert provider.effects("oa:intent-903:pay") == {"requests": 1, "effects": 1, "lookups": 0}
