"""Journaled MCP tools through the ``mcp`` SDK's real client session and ``tools/call``.

The server is an ``MCPServer`` connected to a ``mcp.Client`` in memory (JSON-RPC messages
over memory streams, the SDK's own dispatcher on both sides, read timeouts and
``notifications/cancelled`` included). ``tests/it/python_agents.rs`` checks the rows of the
``mcp:*`` and ``mcp-derived:*`` keys afterwards.
"""

from __future__ import annotations

import json
import time

import anyio
import pytest
from mcp import Client, MCPError
from mcp.server.auth.middleware.auth_context import auth_context_var
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.provider import AccessToken
from mcp.server.mcpserver import Context, MCPServer
from mcp.types import CallToolResult

from opjournal_client.integrations import messages
from opjournal_client.integrations.mcp import (
    OUTCOME_META_KEY,
    _KeyedCallToolParams,
    _KeyedCallToolRequest,
    call_tool_with_key,
    caller_scope,
    journaled_tool,
)

pytestmark = pytest.mark.anyio

PAY = {"order_id": "817", "amount_minor": 490000, "currency": "RUB"}

#: How long the slow tool works before it pays: longer than the first call's read timeout.
SLOW_SECONDS = 1.5


def text_of(result) -> str:
    assert len(result.content) == 1
    return result.content[0].text


def build_server(journal, provider) -> MCPServer:
    server = MCPServer("payments")

    @journaled_tool(server, client=journal, action_type="create_payment", subject="payment")
    def create_payment(order_id: str, amount_minor: int, currency: str) -> dict:
        """Pays an order; slow on purpose, so that the client gives up before it ends."""
        time.sleep(SLOW_SECONDS)
        return provider.pay(order_id, amount_minor, currency)

    @journaled_tool(
        server,
        client=journal,
        action_type="create_payment",
        subject="payment",
        key=lambda arguments, ctx: f"mcp-derived:{arguments['order_id']}",
    )
    async def create_payment_lost_answer(
        order_id: str, amount_minor: int, currency: str, ctx: Context
    ) -> dict:
        """The provider stores the payment but its answer never arrives (timeout)."""
        assert ctx.request_id is not None, "the tool's own Context is passed through"
        return provider.pay(order_id, amount_minor, currency, fault="commit-then-timeout", timeout=0.3)

    @journaled_tool(
        server, client=journal, action_type="create_payment", subject="payment", name="create_payment_async"
    )
    async def create_payment_async(order_id: str, amount_minor: int, currency: str) -> dict:
        """An async tool: it awaits before it pays, where a cancellation would strike."""
        await anyio.sleep(SLOW_SECONDS)
        return provider.pay(order_id, amount_minor, currency)

    @journaled_tool(
        server,
        client=journal,
        action_type="create_payment",
        subject="payment",
        in_progress_wait=0,
        name="create_payment_no_wait",
    )
    def create_payment_slow(order_id: str, amount_minor: int, currency: str) -> dict:
        """Like create_payment, but a retry does not wait for a call still running."""
        time.sleep(SLOW_SECONDS)
        return provider.pay(order_id, amount_minor, currency)

    return server


@pytest.fixture
def server(journal, provider) -> MCPServer:
    return build_server(journal, provider)


async def test_a_lost_answer_is_retried_with_the_same_key_and_pays_once(server, provider):
    key = "mcp:create_payment:order-817-payment"
    async with Client(server, mode="legacy") as client:
        # The client gives up while the tool is still working: the answer is lost.
        with pytest.raises(MCPError) as lost:
            await call_tool_with_key(
                client.session, "create_payment", PAY, "order-817-payment", read_timeout_seconds=0.5
            )
        assert "timed out" in str(lost.value)
        assert provider.effects(key)["requests"] == 0, "the first call is still working"

        # The retry waits for the first call (IN_PROGRESS), then gets its stored result.
        retried = await call_tool_with_key(
            client.session, "create_payment", PAY, "order-817-payment", read_timeout_seconds=30
        )
        assert not retried.is_error, text_of(retried)
        payment = retried.structured_content["result"]
        assert payment["status"] == "succeeded" and payment["id"].startswith("pay_")
        assert payment["amount_minor"] == 490000

        # The same key in params._meta names the same operation: the stored result again.
        again = await call_tool_with_key(
            client.session, "create_payment", PAY, "order-817-payment", in_meta=True
        )
        assert not again.is_error, text_of(again)
        assert again.structured_content["result"] == payment

    assert provider.effects(key) == {"requests": 1, "effects": 1, "lookups": 0}


async def test_an_async_tool_is_not_cancelled_by_a_client_that_gave_up(server, provider):
    key = "mcp:create_payment_async:order-821-payment"
    pay = dict(PAY, order_id="821")
    async with Client(server, mode="legacy") as client:
        with pytest.raises(MCPError):
            await call_tool_with_key(
                client.session, "create_payment_async", pay, "order-821-payment", read_timeout_seconds=0.3
            )
        retried = await call_tool_with_key(
            client.session, "create_payment_async", pay, "order-821-payment", read_timeout_seconds=30
        )
        assert not retried.is_error, text_of(retried)
        assert retried.structured_content["result"]["status"] == "succeeded"
    assert provider.effects(key) == {"requests": 1, "effects": 1, "lookups": 0}


async def test_a_retry_while_the_first_call_runs_is_told_to_come_back(server, provider):
    key = "mcp:create_payment_no_wait:order-819-payment"
    pay = dict(PAY, order_id="819")
    async with Client(server, mode="legacy") as client:
        with pytest.raises(MCPError):
            await call_tool_with_key(
                client.session, "create_payment_no_wait", pay, "order-819-payment", read_timeout_seconds=0.3
            )
        busy = await call_tool_with_key(client.session, "create_payment_no_wait", pay, "order-819-payment")
        assert busy.is_error
        assert busy.meta[OUTCOME_META_KEY] == "in_progress"
        assert text_of(busy).startswith("in progress: an earlier call for this payment is still running")
        assert "Do not start another payment" in text_of(busy)
        # Once the first call has paid, the same call gets its result.
        deadline = time.monotonic() + 10
        while provider.effects(key)["effects"] == 0 and time.monotonic() < deadline:
            await anyio.sleep(0.1)
        done = None
        while time.monotonic() < deadline:
            done = await call_tool_with_key(client.session, "create_payment_no_wait", pay, "order-819-payment")
            if not done.is_error:
                break
            await anyio.sleep(0.1)
        assert done is not None and not done.is_error, text_of(done)
        assert done.structured_content["result"]["status"] == "succeeded"
    assert provider.effects(key) == {"requests": 1, "effects": 1, "lookups": 0}


async def test_a_key_reused_with_other_arguments_is_a_conflict(server, provider):
    key = "mcp:create_payment:order-818-payment"
    first = {"order_id": "818", "amount_minor": 1000, "currency": "EUR"}
    async with Client(server, mode="legacy") as client:
        paid = await call_tool_with_key(client.session, "create_payment", first, "order-818-payment")
        assert not paid.is_error, text_of(paid)
        other = dict(first, amount_minor=2000)
        conflict = await call_tool_with_key(client.session, "create_payment", other, "order-818-payment")
    assert conflict.is_error
    assert text_of(conflict).endswith(messages.CONFLICT.format(subject="payment"))
    assert text_of(conflict).startswith("conflict: this idempotency key was already used")
    assert conflict.meta[OUTCOME_META_KEY] == "conflict"
    assert provider.effects(key) == {"requests": 1, "effects": 1, "lookups": 0}


async def test_an_unknown_outcome_is_a_tool_error_and_is_not_called_again(server, provider):
    async with Client(server, mode="legacy") as client:
        first = await client.call_tool("create_payment_lost_answer", PAY)
        again = await client.call_tool("create_payment_lost_answer", PAY)
    expected = messages.VERIFICATION_REQUIRED.format(subject="payment")
    for result in (first, again):
        assert result.is_error
        assert text_of(result) == expected
        assert result.meta[OUTCOME_META_KEY] == "verification_required"
    assert "do not call this tool again" in expected.lower()
    # The effect happened once; the retry did not reach the provider.
    assert provider.effects("mcp-derived:817") == {"requests": 1, "effects": 1, "lookups": 0}


async def test_a_call_without_a_key_or_with_a_malformed_key_does_not_run(server, provider):
    async with Client(server, mode="legacy") as client:
        missing = await client.call_tool("create_payment", PAY)
        malformed = await call_tool_with_key(client.session, "create_payment", PAY, "bad key!")
        too_long = await call_tool_with_key(client.session, "create_payment", PAY, "k" * 129)
        # Well-formed, but the journal refuses it: it looks like a card number.
        card = await call_tool_with_key(client.session, "create_payment", PAY, "4111111111111111")
        # Two different keys, one in params and one in params._meta.
        two = _KeyedCallToolRequest(
            params=_KeyedCallToolParams(
                name="create_payment",
                arguments=PAY,
                idempotency_key="order-820-a",
                meta={"idempotencyKey": "order-820-b"},
            )
        )
        two_keys = await client.session.send_request(two, CallToolResult)
    assert missing.is_error
    assert text_of(missing) == messages.KEY_REQUIRED.format(subject="payment")
    for result in (malformed, too_long, card, two_keys):
        assert result.is_error
        assert text_of(result) == messages.INVALID_KEY.format(subject="payment")
    assert provider.effects("mcp:create_payment:bad key!")["requests"] == 0
    assert provider.effects("mcp:create_payment:4111111111111111")["requests"] == 0
    assert provider.effects("mcp:create_payment:order-820-a")["requests"] == 0


async def test_a_key_too_long_for_a_long_tool_name_is_an_invalid_key(journal, provider):
    # mcp:<80 characters>:<128 characters> is longer than the journal's 200-character keys.
    name = "create_payment_" + "x" * 65
    server = MCPServer("payments")

    @journaled_tool(server, client=journal, action_type="create_payment", subject="payment", name=name)
    def create_payment(order_id: str, amount_minor: int, currency: str) -> dict:
        """Pays an order."""
        return provider.pay(order_id, amount_minor, currency)

    async with Client(server, mode="legacy") as client:
        too_long = await call_tool_with_key(client.session, name, PAY, "k" * 128)
    assert too_long.is_error
    assert text_of(too_long) == messages.INVALID_KEY.format(subject="payment")
    assert too_long.meta[OUTCOME_META_KEY] == "invalid_key"


def build_shared_server(journal, provider, **options) -> MCPServer:
    """One server for several users: a fast payment tool."""
    server = MCPServer("shared-payments")

    @journaled_tool(
        server, client=journal, action_type="create_payment", subject="payment", **options
    )
    def pay_order(order_id: str, amount_minor: int, currency: str) -> dict:
        return provider.pay(order_id, amount_minor, currency)

    return server


def signed_in(subject: str):
    """What the server's HTTP transport leaves for a request whose bearer token it verified:
    the access token of ``subject`` in the auth context (one OAuth client, two users)."""
    token = AccessToken(
        token=f"token-of-{subject}",
        client_id="payments-assistant",
        scopes=["payments"],
        subject=subject,
        claims={"iss": "https://id.example.test"},
    )
    return auth_context_var.set(AuthenticatedUser(token))


async def test_two_users_of_one_server_never_replay_each_others_results(journal, provider):
    server = build_shared_server(journal, provider)
    body = {"order_id": "840", "amount_minor": 1200, "currency": "EUR"}
    paid = {}
    for user in ("alice", "bob"):
        # Each user's session is served in the context its transport authenticated.
        signed = signed_in(user)
        try:
            async with Client(server, mode="legacy") as client:
                first = await call_tool_with_key(client.session, "pay_order", body, "order-840")
                again = await call_tool_with_key(client.session, "pay_order", body, "order-840")
        finally:
            auth_context_var.reset(signed)
        assert not first.is_error and not again.is_error, (text_of(first), text_of(again))
        # The user's own second call replays the user's own first result.
        assert again.structured_content["result"] == first.structured_content["result"]
        paid[user] = first.structured_content["result"]["id"]
    assert paid["alice"] != paid["bob"], "bob's call did not replay alice's payment"

    for user in ("alice", "bob"):
        identity = json.dumps(
            ["payments-assistant", "https://id.example.test", user],
            separators=(",", ":"),
            ensure_ascii=False,
        )
        key = f"mcp:pay_order:{caller_scope(identity)}:order-840"
        assert provider.effects(key) == {"requests": 1, "effects": 1, "lookups": 0}, user
    assert provider.effects("mcp:pay_order:order-840")["requests"] == 0


async def test_a_servers_own_caller_identity_scopes_the_keys(journal, provider):
    # A server that knows its users otherwise (here: a header its proxy sets, carried in
    # the request's _meta for the test) says who calls.
    def from_meta(ctx: Context) -> str | None:
        meta = ctx.request_context.meta
        user = meta.get("user") if isinstance(meta, dict) else getattr(meta, "user", None)
        if user == "nobody-knows":
            raise LookupError("the gateway sent no user")
        return None if user is None else str(user)

    server = build_shared_server(journal, provider, caller_identity=from_meta)
    body = {"order_id": "841", "amount_minor": 1300, "currency": "EUR"}
    ids = []
    async with Client(server, mode="legacy") as client:
        for user in ("carol", "dave", "carol"):
            result = await client.session.call_tool(
                "pay_order", body, meta={"idempotencyKey": "order-841", "user": user}
            )
            assert not result.is_error, text_of(result)
            ids.append(result.structured_content["result"]["id"])
        # A caller the hook cannot name is refused rather than given a shared key.
        refused = await client.session.call_tool(
            "pay_order", body, meta={"idempotencyKey": "order-841", "user": "nobody-knows"}
        )
        assert refused.is_error and refused.meta[OUTCOME_META_KEY] == "invalid_key"
    assert ids[0] == ids[2] != ids[1]
    for user in ("carol", "dave"):
        key = f"mcp:pay_order:{caller_scope(user)}:order-841"
        assert provider.effects(key)["effects"] == 1, user
