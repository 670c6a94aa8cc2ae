"""Journaled function tools for the OpenAI Agents SDK (``openai-agents``).

:func:`journaled_function_tool` is ``agents.function_tool`` for a side-effecting function::

    @journaled_function_tool(
        client=journal,
        action_type="create_payment",
        key=lambda ctx, arguments: f"{ctx.context.intent_id}:pay",
        subject="payment",
    )
    def create_payment(order_id: str, amount_minor: int, currency: str) -> dict:
        return pay(current_call().provider_key, order_id, amount_minor, currency)

``key(ctx, arguments)`` runs in the application's code with the run context
(``ctx.context`` is what was given to ``Runner.run(..., context=...)``, e.g. the business
intent's id) and the validated arguments; the model only chooses the arguments. The tool's
output is the stored result, the same on every replay; every other outcome is returned to
the model as the :mod:`~opjournal_client.integrations.messages` text of its kind (the
SDK's ``failure_error_function`` path), and any other exception as the SDK's default text.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import typing
from typing import Any, Callable, Mapping, Optional, TypeVar, Union

from agents import FunctionTool, RunContextWrapper, function_tool
from agents.tool import default_tool_error_function
from agents.tool_context import ToolContext
from pydantic_core import to_jsonable_python

from ..client import JournalClient
from .core import Journaled, JournaledToolError, PayloadSpec

F = TypeVar("F", bound=Callable[..., Any])

#: The application's key for one call: a function of the run context and the validated
#: arguments (JSON values).
KeyFunction = Callable[[RunContextWrapper[Any], Mapping[str, Any]], str]


def tool_error_text(ctx: RunContextWrapper[Any], error: Exception) -> str:
    """A ``failure_error_function``: the journal's text for a :class:`JournaledToolError`,
    the SDK's default text for anything else (which never quotes the exception)."""
    if isinstance(error, JournaledToolError):
        return error.text
    return default_tool_error_function(ctx, error)


def _takes_context(hints: Mapping[str, Any], signature: inspect.Signature) -> bool:
    params = list(signature.parameters)
    if not params:
        return False
    annotation = hints.get(params[0])
    origin = typing.get_origin(annotation) or annotation
    return inspect.isclass(origin) and issubclass(origin, RunContextWrapper)


def journaled_function_tool(
    fn: Optional[F] = None,
    *,
    client: JournalClient,
    action_type: str,
    key: KeyFunction,
    payload: PayloadSpec = None,
    namespace: str = "",
    subject: str = "operation",
    in_progress_wait: float = 30.0,
    settle_wait: float = 0.0,
    options: Optional[Mapping[str, Any]] = None,
    **function_tool_options: Any,
) -> Union[FunctionTool, Callable[[F], FunctionTool]]:
    """A ``FunctionTool`` that runs ``fn`` at most once per key.

    Args:
        fn: the tool's function, sync or async; it may take the run context as its first
            parameter (``ctx: RunContextWrapper[...]``) like any function tool. Inside it,
            :func:`opjournal_client.current_call` gives the provider key.
        client: the journal client (sync; the call runs in a worker thread).
        action_type: the action in the journal's policy.
        key: the application's key (see :data:`KeyFunction`); required: the model never
            supplies it.
        payload: which arguments are hashed: all (``None``), names, or a function.
        namespace, subject, in_progress_wait, settle_wait, options: as
            :class:`~opjournal_client.integrations.Journaled`.
        function_tool_options: passed to ``agents.function_tool`` (``name_override``,
            ``description_override``, ...). ``failure_error_function`` defaults to
            :func:`tool_error_text`.

    Returns:
        The ``FunctionTool`` (or a decorator making one when ``fn`` is omitted).
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
    function_tool_options.setdefault("failure_error_function", tool_error_text)

    def build(fn: F) -> FunctionTool:
        hints = typing.get_type_hints(fn, include_extras=True)
        signature = inspect.signature(fn)
        takes_context = _takes_context(hints, signature)
        own = list(signature.parameters.values())[1 if takes_context else 0 :]
        arguments_signature = signature.replace(parameters=own)
        is_async = inspect.iscoroutinefunction(fn)

        async def wrapper(ctx: RunContextWrapper[Any], *args: Any, **kwargs: Any) -> Any:
            bound = arguments_signature.bind(*args, **kwargs)
            bound.apply_defaults()
            values = dict(bound.arguments)
            arguments = to_jsonable_python(values)
            operation_key = key(ctx, arguments)
            call = functools.partial(fn, ctx, **values) if takes_context else functools.partial(fn, **values)
            if is_async:
                loop = asyncio.get_running_loop()

                def body() -> Any:
                    return asyncio.run_coroutine_threadsafe(call(), loop).result()

            else:
                body = call
            return await asyncio.to_thread(spec.run, operation_key, arguments, body)

        context_param = inspect.Parameter(
            "ctx", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=ToolContext[Any]
        )
        annotations = {p.name: hints.get(p.name, p.annotation) for p in own}
        wrapper.__signature__ = signature.replace(  # type: ignore[attr-defined]
            parameters=[context_param, *(p.replace(annotation=annotations[p.name]) for p in own)]
        )
        if "return" in hints:
            annotations["return"] = hints["return"]
        wrapper.__annotations__ = {"ctx": ToolContext[Any], **annotations}
        wrapper.__name__ = fn.__name__
        wrapper.__qualname__ = fn.__qualname__
        wrapper.__doc__ = fn.__doc__
        wrapper.__module__ = fn.__module__
        return function_tool(wrapper, **function_tool_options)

    return build(fn) if fn is not None else build
