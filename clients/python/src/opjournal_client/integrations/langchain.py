"""Journaled tools for LangChain (``langchain-core``) and LangGraph's ``ToolNode``.

:func:`journaled_tool` makes a ``StructuredTool`` from a side-effecting function::

    pay_tool = journaled_tool(
        create_payment,
        client=journal,
        action_type="create_payment",
        key=lambda config, arguments: f"{config['configurable']['intent_id']}:pay",
        subject="payment",
    )
    graph_node = ToolNode([pay_tool])

``key(config, arguments)`` runs in the application's code with the call's
``RunnableConfig`` (``config["configurable"]`` holds e.g. the LangGraph ``thread_id`` or
the business intent's id the application put there) and the validated arguments; the
model only chooses the arguments. The tool's output is the stored result, the same on
every replay; every other outcome is raised as a ``ToolException`` carrying the
:mod:`~opjournal_client.integrations.messages` text, which the tool turns into its output
(a ``ToolMessage`` with ``status="error"`` when called with a tool call, as ``ToolNode``
does).
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import typing
from typing import Any, Callable, Mapping, Optional

from langchain_core.runnables import RunnableConfig
from langchain_core.tools import StructuredTool, ToolException
from langchain_core.tools.base import create_schema_from_function
from pydantic_core import to_jsonable_python

from ..client import JournalClient
from .core import Journaled, JournaledToolError, PayloadSpec

#: The application's key for one call: a function of the call's ``RunnableConfig`` and the
#: validated arguments (JSON values).
KeyFunction = Callable[[RunnableConfig, Mapping[str, Any]], str]


def journaled_tool(
    fn: Callable[..., Any],
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
    name: Optional[str] = None,
    description: Optional[str] = None,
    **tool_options: Any,
) -> StructuredTool:
    """A ``StructuredTool`` that runs ``fn`` at most once per key.

    Args:
        fn: the tool's function, sync or async; it may take ``config: RunnableConfig``
            like any LangChain tool function. Inside it,
            :func:`opjournal_client.current_call` gives the provider key.
        client: the journal client (sync; async tools run it in a worker thread).
        action_type: the action in the journal's policy.
        key: the application's key (see :data:`KeyFunction`); required: the model never
            supplies it.
        payload: which arguments are hashed: all (``None``), names, or a function.
        namespace, subject, in_progress_wait, settle_wait, options: as
            :class:`~opjournal_client.integrations.Journaled`.
        name, description: the tool's (the function's name and docstring by default).
        tool_options: passed to ``StructuredTool.from_function`` (``return_direct``, ...).
            ``handle_tool_error`` is ``True``: a ``ToolException`` becomes the output.
    """
    hints = typing.get_type_hints(fn, include_extras=True)
    own_config = next((n for n, h in hints.items() if h is RunnableConfig), None)
    tool_name = name or fn.__name__
    schema = create_schema_from_function(
        tool_name, fn, filter_args=[own_config] if own_config else None
    )
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
    is_async = inspect.iscoroutinefunction(fn)

    def prepare(config: RunnableConfig, kwargs: dict[str, Any]) -> tuple[str, Any, Callable[[], Any]]:
        arguments = to_jsonable_python(kwargs)
        operation_key = key(config, arguments)
        values = dict(kwargs)
        if own_config:
            values[own_config] = config
        return operation_key, arguments, functools.partial(fn, **values)

    def run(config: RunnableConfig, **kwargs: Any) -> Any:
        operation_key, arguments, call = prepare(config, kwargs)
        try:
            return spec.run(operation_key, arguments, call)
        except JournaledToolError as error:
            raise ToolException(error.text) from error

    async def arun(config: RunnableConfig, **kwargs: Any) -> Any:
        operation_key, arguments, call = prepare(config, kwargs)
        if is_async:
            loop = asyncio.get_running_loop()

            def body() -> Any:
                return asyncio.run_coroutine_threadsafe(call(), loop).result()

        else:
            body = call
        try:
            return await asyncio.to_thread(spec.run, operation_key, arguments, body)
        except JournaledToolError as error:
            raise ToolException(error.text) from error

    for wrapper in (run, arun):
        wrapper.__annotations__ = {"config": RunnableConfig, "return": Any}
    tool_options.setdefault("handle_tool_error", True)
    return StructuredTool.from_function(
        func=None if is_async else run,
        coroutine=arun,
        name=tool_name,
        description=description or inspect.getdoc(fn) or tool_name,
        args_schema=schema,
        infer_schema=False,
        **tool_options,
    )
