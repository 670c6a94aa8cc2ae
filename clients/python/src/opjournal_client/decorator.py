"""``@idempotent``: turns a function with a side effect into one that runs at most once per
intent, through the journal.

    journal = JournalClient.connect("127.0.0.1:50051")

    @idempotent(journal, action_type="create_payment",
                key=lambda order_id, **_: f"payment:{order_id}")
    def create_payment(order_id: str, amount_minor: int, currency: str) -> dict:
        call = current_call()                      # the provider key of this intent
        return sandbox.pay(call.provider_key, ...)

The same with ``async def`` and an :class:`~opjournal_client.aio.AsyncJournalClient`. The
key comes from the orchestrator's code -- a function of the arguments or a fixed string --
never from a model; the payload is the function's arguments (or a declared subset).

What a call answers (``returns="value"``, the default):

* a fresh success: what the function returned;
* a replay: the stored result (the JSON the journal kept, as the action's policy sanitized
  it), without calling the function;
* anything else raises an :class:`OutcomeError` subclass carrying the :data:`Outcome`:
  :class:`FailedFinalError`, :class:`VerificationRequiredError`, :class:`InProgressError`,
  :class:`DuplicateIntentSuspectedError`; and, as from ``execute``,
  :class:`IdempotencyKeyReusedError` (the same key with other arguments), :class:`LeaseLostError`,
  :class:`JournalUnavailableError` and the other :mod:`opjournal_client.errors`.

With ``returns="outcome"`` a call answers the :data:`Outcome` itself (``Succeeded``,
``FailedFinal``, ``VerificationRequired``, ``InProgress``, ``DuplicateIntentSuspected``;
each has ``to_dict()`` for an agent), and raises only the errors of ``execute``.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
from dataclasses import dataclass
from typing import (
    TYPE_CHECKING,
    Any,
    Awaitable,
    Callable,
    Literal,
    Mapping,
    Optional,
    ParamSpec,
    Sequence,
    TypeVar,
    Union,
    cast,
    overload,
)

from . import _core
from .client import JournalClient
from .outcomes import (
    Classifier,
    DuplicateIntentSuspected,
    FailedFinal,
    InProgress,
    Outcome,
    ProviderCall,
    ProviderResult,
    Succeeded,
    VerificationRequired,
)

if TYPE_CHECKING:
    from .aio import AsyncJournalClient

P = ParamSpec("P")
R = TypeVar("R")

__all__ = [
    "DuplicateIntentSuspectedError",
    "FailedFinalError",
    "IdempotentSpec",
    "InProgressError",
    "OutcomeError",
    "VerificationRequiredError",
    "current_call",
    "idempotent",
    "raise_for_outcome",
]

_CURRENT: contextvars.ContextVar[ProviderCall] = contextvars.ContextVar("opjournal_current_call")


def current_call() -> ProviderCall:
    """The :class:`ProviderCall` of the running ``@idempotent`` function: ``provider_key``
    (send it to the provider as its idempotency key), ``operation`` (the IN_PROGRESS
    record) and ``lease_lost`` (set when another holder may now call the provider). Works
    in sync functions and in ``async def`` functions (a context variable).

    Raises:
        LookupError: not inside a call of an ``@idempotent`` function.
    """
    try:
        return _CURRENT.get()
    except LookupError:
        raise LookupError("current_call() is only set inside an @idempotent function") from None


class OutcomeError(Exception):
    """The call did not end in a success (``returns="value"``). ``outcome`` is the
    :data:`Outcome`; ``to_dict()`` its JSON-serializable summary."""

    outcome: Outcome

    def __init__(self, outcome: Outcome, message: str) -> None:
        super().__init__(message)
        self.outcome = outcome

    def to_dict(self) -> dict[str, Any]:
        """The outcome's summary (``Outcome.to_dict()``)."""
        return self.outcome.to_dict()


class FailedFinalError(OutcomeError):
    """The provider proved no effect happened (a confirmed rejection, now or stored):
    ``error_code``, ``replayed``. On a fresh call the function's exception is the
    ``__cause__``."""

    outcome: FailedFinal

    def __init__(self, outcome: FailedFinal) -> None:
        super().__init__(outcome, f"failed_final: {outcome.error_code}")
        self.error_code = outcome.error_code
        self.replayed = outcome.replayed


class VerificationRequiredError(OutcomeError):
    """The outcome is unknown (the provider may have acted): do not retry by other means;
    calling again with the same arguments is safe and answers once the operation has been
    reconciled. ``reported`` and ``error_code`` as in :class:`VerificationRequired`; on a
    fresh call the function's exception is the ``__cause__``."""

    outcome: VerificationRequired

    def __init__(self, outcome: VerificationRequired) -> None:
        super().__init__(outcome, "verification_required")
        self.reported = outcome.reported
        self.error_code = outcome.error_code


class InProgressError(OutcomeError):
    """Another holder is calling the provider for this intent; ``retry_after`` seconds."""

    outcome: InProgress

    def __init__(self, outcome: InProgress) -> None:
        super().__init__(outcome, "in_progress")
        self.retry_after = outcome.retry_after


class DuplicateIntentSuspectedError(OutcomeError):
    """The same payload is registered under ``duplicate_of_operation_key``; nothing was
    registered, the function was not called."""

    outcome: DuplicateIntentSuspected

    def __init__(self, outcome: DuplicateIntentSuspected) -> None:
        super().__init__(outcome, "duplicate_intent_suspected")
        self.duplicate_of_operation_key = outcome.duplicate_of_operation_key


def raise_for_outcome(outcome: Outcome) -> Succeeded:
    """``outcome`` when it is :class:`Succeeded`; otherwise raises its
    :class:`OutcomeError` (with the provider's exception as ``__cause__`` when there is
    one)."""
    if isinstance(outcome, Succeeded):
        return outcome
    error: OutcomeError
    cause: Optional[BaseException] = None
    if isinstance(outcome, FailedFinal):
        error, cause = FailedFinalError(outcome), outcome.cause
    elif isinstance(outcome, VerificationRequired):
        error, cause = VerificationRequiredError(outcome), outcome.cause
    elif isinstance(outcome, InProgress):
        error = InProgressError(outcome)
    else:
        error = DuplicateIntentSuspectedError(outcome)
    raise error from cause


@dataclass(frozen=True)
class IdempotentSpec:
    """How an ``@idempotent`` function is protected (``decorated.__opjournal__``)."""

    action_type: str
    key: Union[str, Callable[..., str]]
    payload: Union[None, Sequence[str], Callable[..., Any]]
    namespace: str
    returns: Literal["value", "outcome"]


def _bind(signature: inspect.Signature, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    bound = signature.bind(*args, **kwargs)
    bound.apply_defaults()
    return dict(bound.arguments)


def _is_async_client(journal: object) -> bool:
    from .aio import AsyncJournalClient

    return isinstance(journal, AsyncJournalClient)


JournalArg = Union[
    JournalClient,
    "AsyncJournalClient",
    Callable[[], Union[JournalClient, "AsyncJournalClient"]],
]


@overload
def idempotent(
    journal: JournalArg,
    *,
    action_type: str,
    key: Union[str, Callable[..., str]],
    payload: Union[None, Sequence[str], Callable[..., Any]] = None,
    namespace: str = "",
    classify: Optional[Classifier] = None,
    lease_seconds: int = 0,
    in_progress_wait: float = 0.0,
    settle_wait: float = 0.0,
    references: Union[None, Mapping[str, str], Callable[..., Mapping[str, str]]] = None,
    confirm_duplicate_intent: bool = False,
    renew_lease: bool = True,
    external_id: Optional[Callable[[Any], Optional[str]]] = None,
    to_result: Optional[Callable[[Any], Any]] = None,
    returns: Literal["value"] = "value",
) -> Callable[[Callable[P, R]], Callable[P, R]]: ...


@overload
def idempotent(
    journal: JournalArg,
    *,
    action_type: str,
    key: Union[str, Callable[..., str]],
    payload: Union[None, Sequence[str], Callable[..., Any]] = None,
    namespace: str = "",
    classify: Optional[Classifier] = None,
    lease_seconds: int = 0,
    in_progress_wait: float = 0.0,
    settle_wait: float = 0.0,
    references: Union[None, Mapping[str, str], Callable[..., Mapping[str, str]]] = None,
    confirm_duplicate_intent: bool = False,
    renew_lease: bool = True,
    external_id: Optional[Callable[[Any], Optional[str]]] = None,
    to_result: Optional[Callable[[Any], Any]] = None,
    returns: Literal["outcome"],
) -> Callable[[Callable[P, Any]], Callable[P, Any]]: ...


def idempotent(
    journal: JournalArg,
    *,
    action_type: str,
    key: Union[str, Callable[..., str]],
    payload: Union[None, Sequence[str], Callable[..., Any]] = None,
    namespace: str = "",
    classify: Optional[Classifier] = None,
    lease_seconds: int = 0,
    in_progress_wait: float = 0.0,
    settle_wait: float = 0.0,
    references: Union[None, Mapping[str, str], Callable[..., Mapping[str, str]]] = None,
    confirm_duplicate_intent: bool = False,
    renew_lease: bool = True,
    external_id: Optional[Callable[[Any], Optional[str]]] = None,
    to_result: Optional[Callable[[Any], Any]] = None,
    returns: Literal["value", "outcome"] = "value",
) -> Callable[[Callable[P, Any]], Callable[P, Any]]:
    """Protects a function with a side effect: each call runs it at most once per intent.

    A sync function needs a :class:`JournalClient`, an ``async def`` function an
    :class:`~opjournal_client.aio.AsyncJournalClient` (``TypeError`` at decoration
    otherwise). ``journal`` may also be a function without arguments returning the client,
    asked on every call (for clients made after the decoration).

    Args:
        journal: the client, or a function returning it.
        action_type: the action as named in the server's policy.
        key: the operation key: a fixed string (a run or intent id from the orchestrator)
            or a function called with the function's arguments **by name** (bound with
            :func:`inspect.signature`, defaults applied), e.g.
            ``lambda order_id, **_: f"payment:{order_id}"``. Never let a model choose it.
            A key function returning anything but a ``str`` raises ``TypeError`` (naming
            the function) before anything is registered.
        payload: what is hashed and bound to the key: ``None`` -- all the bound arguments
            as a JSON object (``{"name": value}``); a list of argument names -- those only;
            a function called with the arguments by name returning the payload. Another
            payload under the same key raises :class:`IdempotencyKeyReusedError`. A method
            (first parameter ``self`` or ``cls``) must declare it: ``self`` is not JSON, and
            leaving it out silently could make two instances' intents hash the same, so
            ``payload=None`` there raises ``TypeError`` at decoration.
        namespace: the tenant namespace (empty: ``default``).
        classify: the exception classifier (see ``execute``); the default makes only
            :class:`ProviderRejected` a confirmed rejection and everything else unknown.
        lease_seconds, in_progress_wait, settle_wait, confirm_duplicate_intent, renew_lease:
            as for ``execute`` (seconds; 0: the action's default lease, no waiting).
        references: business links kept with the record: a mapping, or a function of the
            arguments by name returning one.
        external_id: a function of the return value giving the provider's id of the effect;
            default: ``ProviderResult.external_id`` when the function returns one, else none.
        to_result: a function of the return value giving what the journal stores and
            replays (JSON-serializable); default: the value itself (a returned
            :class:`ProviderResult`: its ``result``).
        returns: ``"value"`` (default) -- the result, or an :class:`OutcomeError`;
            ``"outcome"`` -- the :data:`Outcome` (see the module's documentation).

    Inside the function, :func:`current_call` gives the :class:`ProviderCall` (the
    provider key to send, ``lease_lost``) without changing the function's signature.
    """
    if returns not in ("value", "outcome"):
        raise ValueError('returns must be "value" or "outcome"')
    if isinstance(payload, str):
        raise TypeError("payload is a list of argument names, not one string")

    def decorate(function: Callable[P, Any]) -> Callable[P, Any]:
        name = getattr(function, "__qualname__", "the function")
        if inspect.isgeneratorfunction(function) or inspect.isasyncgenfunction(function):
            # Calling one only makes a generator: the body would run after the report.
            raise TypeError(
                f"{name} is a generator function: @idempotent protects a function that "
                "returns its result (collect the items and return them)"
            )
        signature = inspect.signature(function)
        is_async = inspect.iscoroutinefunction(function)
        first = next(iter(signature.parameters), None)
        if payload is None and first in ("self", "cls"):
            # self is no JSON value, and leaving it out could make two instances' intents
            # hash the same: the payload of a method must be declared.
            raise TypeError(
                f"{name} looks like a method (its first argument is {first!r}): declare "
                "payload= (the argument names, or a function of them) -- "
                f"{first} is not a JSON value"
            )
        if isinstance(journal, JournalClient) or _is_async_client(journal) or not callable(journal):
            _check_client(journal, is_async, function)
        if payload is not None and not callable(payload):
            unknown = [name for name in payload if name not in signature.parameters]
            if unknown:
                raise TypeError(f"payload names arguments the function does not have: {unknown}")

        def arguments(args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
            bound = _bind(signature, args, kwargs)
            operation_key = key if isinstance(key, str) else key(**bound)
            if not isinstance(operation_key, str):
                raise TypeError(
                    f"the key function of {name} returned {type(operation_key).__name__}, "
                    "not str: the operation key is a string"
                )
            return {
                "operation_key": operation_key,
                "payload": _payload(bound),
                "references": references(**bound) if callable(references) else references,
            }

        def _payload(bound: dict[str, Any]) -> Any:
            if payload is None:
                return bound
            if callable(payload):
                return payload(**bound)
            return {name: bound[name] for name in payload}

        def provider_result(value: Any) -> ProviderResult:
            stored = to_result(value) if to_result is not None else (
                value.result if isinstance(value, ProviderResult) else value
            )
            if external_id is not None:
                ident = external_id(value) or ""
            else:
                ident = value.external_id if isinstance(value, ProviderResult) else ""
            # A value, never JSON text: a returned str is stored as a JSON string.
            return ProviderResult(external_id=ident, result=_core.JsonValue(stored))

        def answer(outcome: Outcome, fresh: list[Any]) -> Any:
            if returns == "outcome":
                return outcome
            done = raise_for_outcome(outcome)
            if fresh and not done.replayed:
                value = fresh[0]
                return value.result if isinstance(value, ProviderResult) else value
            return done.result

        options: dict[str, Any] = dict(
            namespace=namespace,
            lease_seconds=lease_seconds,
            confirm_duplicate_intent=confirm_duplicate_intent,
            renew_lease=renew_lease,
            classify=classify,
            in_progress_wait=in_progress_wait,
            settle_wait=settle_wait,
        )

        if is_async:
            async_function = cast(Callable[..., Awaitable[Any]], function)

            @functools.wraps(function)
            async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
                client = _resolve(journal, True, function)
                request = arguments(args, kwargs)
                fresh: list[Any] = []

                async def call(provider_call: ProviderCall) -> ProviderResult:
                    token = _CURRENT.set(provider_call)
                    try:
                        value = await async_function(*args, **kwargs)
                    finally:
                        _CURRENT.reset(token)
                    fresh.append(value)
                    return provider_result(value)

                outcome = await client.execute(
                    request["operation_key"],
                    action_type,
                    request["payload"],
                    call,
                    references=request["references"],
                    **options,
                )
                return answer(outcome, fresh)

            wrapper: Callable[..., Any] = async_wrapper
        else:

            @functools.wraps(function)
            def sync_wrapper(*args: Any, **kwargs: Any) -> Any:
                client = _resolve(journal, False, function)
                request = arguments(args, kwargs)
                fresh: list[Any] = []

                def call(provider_call: ProviderCall) -> ProviderResult:
                    token = _CURRENT.set(provider_call)
                    try:
                        value = function(*args, **kwargs)
                    finally:
                        _CURRENT.reset(token)
                    fresh.append(value)
                    return provider_result(value)

                outcome = client.execute(
                    request["operation_key"],
                    action_type,
                    request["payload"],
                    call,
                    references=request["references"],
                    **options,
                )
                return answer(outcome, fresh)

            wrapper = sync_wrapper

        setattr(
            wrapper,
            "__opjournal__",
            IdempotentSpec(action_type, key, payload, namespace, returns),
        )
        return cast(Callable[P, Any], wrapper)

    return decorate


def _check_client(journal: object, is_async: bool, function: Callable[..., Any]) -> None:
    name = getattr(function, "__qualname__", "the function")
    if is_async and not _is_async_client(journal):
        raise TypeError(f"{name} is an async function: it needs an AsyncJournalClient")
    if not is_async and not isinstance(journal, JournalClient):
        raise TypeError(f"{name} is a sync function: it needs a JournalClient")


def _resolve(journal: JournalArg, is_async: bool, function: Callable[..., Any]) -> Any:
    client: object = journal
    if not isinstance(journal, JournalClient) and not _is_async_client(journal):
        client = cast(Callable[[], object], journal)()
    _check_client(client, is_async, function)
    return client
