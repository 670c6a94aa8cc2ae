"""Journaled tools for MCP servers built with the ``mcp`` SDK's ``MCPServer`` (the server
class that ``mcp`` 1.x called ``FastMCP``; this module needs ``mcp`` 2.x).

Mark a side-effecting tool with :func:`journaled_tool` instead of ``@server.tool()``::

    server = MCPServer("payments")

    @journaled_tool(server, client=journal, action_type="create_payment", subject="payment")
    def create_payment(order_id: str, amount_minor: int, currency: str) -> dict:
        return pay(current_call().provider_key, order_id, amount_minor, currency)

Where the key comes from, first match wins:

1. the key the MCP client application sends with ``tools/call`` (never the model): the
   ``idempotencyKey`` member of the request's params, as the MCP request-idempotency
   proposal (SEP-3182) shapes it, or ``params._meta.idempotencyKey``. ``mcp`` 2.x parses
   ``tools/call`` params into a model that drops unknown members, but the raw params stay
   on the request context, where this module reads both places. The key must be 1-128
   characters of ``[A-Za-z0-9._:-]`` and is namespaced by the tool's name and by who
   calls: ``mcp:{tool}:{key}``, or ``mcp:{tool}:u-{scope}:{key}`` when the caller's
   identity is known (``caller_identity``, below), so that two users of one server who
   send the same key never replay each other's results. Both places with different keys:
   refused (``invalid_key``);
2. ``key(arguments, ctx)``, the server's own function of the validated arguments and the
   request :class:`~mcp.server.mcpserver.Context` (e.g. an order id, or a session-bound
   intent id); its key is used as it is;
3. neither: the call is refused with the ``key_required`` text.

The caller's identity comes from ``caller_identity(ctx)``: by default
:func:`authenticated_caller`, the principal of the OAuth access token the server's HTTP
transport verified (client id, issuer and subject, as the SDK's session binding names it);
``None`` when the transport authenticated nobody (stdio: one user per server process). A
server that knows its users otherwise (a header, a session it issued) passes its own
function. The identity is never put in the key as it is: ``{scope}`` is the first 96 bits
of its SHA-256 in hex (:func:`caller_scope`), so keys stay free of e-mail addresses and
names. A key from ``key(arguments, ctx)`` is the server's own and is used as it is: scope it
by the user there.

A retried call gets the stored result; the other outcomes come back as tool errors
(``isError: true``) whose text is one of :mod:`~opjournal_client.integrations.messages`,
with ``_meta["opjournal.dev/outcome"]`` naming the kind.

The tool's body and its report run to their end even when the client gives up on the call
(a read timeout sends ``notifications/cancelled``): the body runs in a worker thread that
cancellation does not interrupt, so the journal records the real outcome and a retry gets
it instead of an unknown.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import typing
from typing import Any, Callable, Mapping, Optional, TypeVar, cast

import anyio
import anyio.from_thread
import anyio.to_thread
from mcp.client.session import ClientSession
from mcp.server.auth.middleware.auth_context import get_access_token
from mcp.server.mcpserver import Context, MCPServer
from mcp.types import (
    CallToolRequest,
    CallToolRequestParams,
    CallToolResult,
    RequestParamsMeta,
    TextContent,
)
from pydantic_core import to_jsonable_python

from ..client import JournalClient
from .core import Journaled, JournaledToolError, PayloadSpec, namespaced_client_key, tool_error

#: The ``tools/call`` params member (and ``_meta`` member) that carries the client's key.
IDEMPOTENCY_KEY_PARAM = "idempotencyKey"

#: The ``_meta`` member of an error result that names its kind (see ``messages.KINDS``).
OUTCOME_META_KEY = "opjournal.dev/outcome"

_CONTEXT_PARAM = "opjournal_mcp_context"

F = TypeVar("F", bound=Callable[..., Any])

#: The server's key for a call without a client key: a function of the validated arguments
#: (JSON values) and the request context.
KeyFunction = Callable[[Mapping[str, Any], Context], str]


#: Who calls a tool, for the key scope: a function of the request context answering an
#: identity (any string that names one user), or ``None`` when nobody is known.
CallerIdentity = Callable[[Context], Optional[str]]


def authenticated_caller(ctx: Context) -> Optional[str]:
    """The principal of the access token the server's HTTP transport verified for this
    request (``mcp.server.auth``): its client id, issuer (claim ``iss``) and subject, as
    JSON; ``None`` without one (stdio, or a server without auth). The default
    ``caller_identity`` of :func:`journaled_tool`, and the same text as the TypeScript
    integration's ``authenticatedCaller``."""
    token = get_access_token()
    if token is None:
        return None
    issuer = (token.claims or {}).get("iss")
    return json.dumps(
        [token.client_id, None if issuer is None else str(issuer), token.subject],
        separators=(",", ":"),
        ensure_ascii=False,
    )


def caller_scope(identity: str) -> str:
    """The part of the key that stands for ``identity``: ``u-`` and the first 96 bits of
    its SHA-256 in hex (26 characters)."""
    return "u-" + hashlib.sha256(identity.encode()).hexdigest()[:24]


class TwoKeysError(ValueError):
    """The client sent two different keys (``params.idempotencyKey`` and
    ``params._meta.idempotencyKey``)."""


def client_idempotency_key(ctx: Context) -> Optional[Any]:
    """The key the client sent with this ``tools/call``: ``params.idempotencyKey`` or
    ``params._meta.idempotencyKey``; ``None`` when it sent neither. Not validated.

    Raises:
        TwoKeysError: both were sent, with different values.
    """
    request = ctx.request_context
    params = request.params or {}
    meta = params.get("_meta")
    if not isinstance(meta, Mapping):
        meta = request.meta if isinstance(request.meta, Mapping) else {}
    sent = [v for v in (params.get(IDEMPOTENCY_KEY_PARAM), meta.get(IDEMPOTENCY_KEY_PARAM)) if v is not None]
    if len(sent) == 2 and sent[0] != sent[1]:
        raise TwoKeysError("two different idempotency keys")
    return sent[0] if sent else None


def error_result(error: JournaledToolError) -> CallToolResult:
    """The MCP tool error (``isError: true``) for ``error``: its text, and its kind in
    ``_meta["opjournal.dev/outcome"]``."""
    return CallToolResult(
        content=[TextContent(type="text", text=error.text)],
        is_error=True,
        _meta={OUTCOME_META_KEY: error.kind},
    )


def _context_param(hints: Mapping[str, Any]) -> Optional[str]:
    for name, annotation in hints.items():
        candidates = (annotation, *typing.get_args(annotation))
        if any(inspect.isclass(c) and issubclass(c, Context) for c in candidates):
            return name
    return None


def journaled_tool(
    server: MCPServer,
    *,
    client: JournalClient,
    action_type: str,
    key: Optional[KeyFunction] = None,
    accept_client_key: bool = True,
    caller_identity: Optional[CallerIdentity] = authenticated_caller,
    payload: PayloadSpec = None,
    namespace: str = "",
    subject: str = "operation",
    in_progress_wait: float = 30.0,
    settle_wait: float = 0.0,
    options: Optional[Mapping[str, Any]] = None,
    name: Optional[str] = None,
    **tool_options: Any,
) -> Callable[[F], F]:
    """Registers the decorated function on ``server`` as a journaled tool.

    Args:
        server: the ``MCPServer``.
        client: the journal client (sync; the call runs in a worker thread).
        action_type: the action in the journal's policy, e.g. ``"create_payment"``.
        key: the server's key for a call without a client key: a function of the
            validated arguments (JSON values) and the request context. ``None``: the
            client's key is required.
        accept_client_key: read the client's ``idempotencyKey`` (see the module doc).
        caller_identity: who calls, for the scope of a client's key: a function of the
            request context answering a string that names one user, or ``None`` when
            nobody is known; by default :func:`authenticated_caller` (the verified access
            token's principal). ``None`` here: keys are scoped by the tool only (one user
            per server). A function that raises refuses the call (``invalid_key``).
        payload: which arguments are hashed: all (``None``), a list of names, or a
            function of the arguments.
        namespace: the journal namespace (empty: ``default``).
        subject: the noun of the model-facing texts ("payment").
        in_progress_wait: seconds a retry waits for the first call with the same key to
            finish before answering ``in_progress``.
        settle_wait: seconds a call waits for the reconciler to settle an outcome that is
            already unknown before answering ``verification_required``.
        options: more keyword arguments for :func:`opjournal_client.idempotent`
            (``classify``, ``lease_seconds``, ``references``, ``external_id``, ...).
        name: the tool's name (the function's name by default).
        tool_options: passed to ``server.add_tool`` (``description``, ``annotations``, ...).

    The function may be sync or async and may take the ``Context`` as usual; inside it,
    :func:`opjournal_client.current_call` gives the provider key. It
    returns the result (JSON values) or a :class:`~opjournal_client.ProviderResult`, and
    raises :class:`~opjournal_client.ProviderRejected` for a confirmed rejection.
    """
    spec = Journaled(
        client=client,
        action_type=action_type,
        payload=payload,
        namespace=namespace,
        subject=subject,
        in_progress_wait=in_progress_wait,
        settle_wait=settle_wait,
        options=options,
    )

    def decorate(fn: F) -> F:
        tool_name = name or fn.__name__
        hints = typing.get_type_hints(fn, include_extras=True)
        own_context = _context_param(hints)
        signature = inspect.signature(fn)
        is_async = inspect.iscoroutinefunction(fn)

        def find_key(arguments: Mapping[str, Any], ctx: Context) -> str:
            try:
                sent = client_idempotency_key(ctx) if accept_client_key else None
            except TwoKeysError:
                raise tool_error("invalid_key", subject=subject) from None
            if sent is not None:
                scope = f"mcp:{tool_name}"
                if caller_identity is not None:
                    try:
                        identity = caller_identity(ctx)
                    except Exception:  # noqa: BLE001 - an unknown caller must not share keys
                        raise tool_error("invalid_key", subject=subject) from None
                    if identity is not None:
                        scope = f"{scope}:{caller_scope(identity)}"
                return namespaced_client_key(scope, sent, subject=subject)
            if key is not None:
                return key(arguments, ctx)
            raise tool_error("key_required", subject=subject)

        async def wrapper(**kwargs: Any) -> Any:
            ctx: Context = kwargs.pop(_CONTEXT_PARAM)
            arguments = to_jsonable_python(kwargs)
            call_kwargs = dict(kwargs)
            if own_context is not None:
                call_kwargs[own_context] = ctx
            try:
                operation_key = find_key(arguments, ctx)
            except JournaledToolError as error:
                return error_result(error)

            def body() -> Any:
                if is_async:
                    return anyio.from_thread.run(functools.partial(fn, **call_kwargs))
                return fn(**call_kwargs)

            try:
                # Not cancellable: once Begin has run, the body and the report finish even
                # when the client abandons the request, so the journal holds the outcome.
                with anyio.CancelScope(shield=True):
                    return await anyio.to_thread.run_sync(spec.run, operation_key, arguments, body)
            except JournaledToolError as error:
                return error_result(error)

        parameters = [p for n, p in signature.parameters.items() if n != own_context]
        parameters.append(
            inspect.Parameter(_CONTEXT_PARAM, inspect.Parameter.KEYWORD_ONLY, annotation=Context)
        )
        annotations = {n: h for n, h in hints.items() if n != own_context}
        annotations[_CONTEXT_PARAM] = Context
        wrapper.__signature__ = signature.replace(  # type: ignore[attr-defined]
            parameters=[
                p.replace(annotation=annotations.get(p.name, p.annotation)) for p in parameters
            ]
        )
        wrapper.__annotations__ = annotations
        wrapper.__name__ = fn.__name__
        wrapper.__qualname__ = fn.__qualname__
        wrapper.__doc__ = fn.__doc__
        wrapper.__module__ = fn.__module__
        server.add_tool(wrapper, name=tool_name, **tool_options)
        return fn

    return decorate


class _KeyedCallToolParams(CallToolRequestParams):
    idempotency_key: Optional[str] = None  # on the wire: idempotencyKey


class _KeyedCallToolRequest(CallToolRequest):
    params: _KeyedCallToolParams


async def call_tool_with_key(
    session: ClientSession,
    name: str,
    arguments: Optional[Mapping[str, Any]],
    idempotency_key: str,
    *,
    read_timeout_seconds: Optional[float] = None,
    in_meta: bool = False,
) -> CallToolResult:
    """The client side: ``tools/call`` with the application's ``idempotency_key``.

    ``ClientSession.call_tool`` has no place for it, so this sends the request itself:
    as ``params.idempotencyKey`` (the SEP-3182 shape), or with ``in_meta`` as
    ``params._meta.idempotencyKey`` (which ``call_tool(..., meta=...)`` can send too).
    Repeat a call whose answer was lost with the same key.

    Raises:
        mcp.MCPError: a protocol error, e.g. ``REQUEST_TIMEOUT`` after
            ``read_timeout_seconds``.
    """
    if in_meta:
        return await session.call_tool(
            name,
            dict(arguments or {}),
            read_timeout_seconds=read_timeout_seconds,
            meta=cast(RequestParamsMeta, {IDEMPOTENCY_KEY_PARAM: idempotency_key}),
        )
    request = _KeyedCallToolRequest(
        params=_KeyedCallToolParams(
            name=name, arguments=dict(arguments or {}), idempotency_key=idempotency_key
        )
    )
    return await session.send_request(
        request, CallToolResult, request_read_timeout_seconds=read_timeout_seconds
    )
