"""The framework-neutral part of the agent integrations: run one tool call through the
journal and turn every outcome into either the tool's result or a
:class:`JournaledToolError` whose text the model can act on.

The integrations (``opjournal_client.integrations.mcp``, ``.openai_agents``,
``.langchain``) only find the key and the arguments in their framework's call and hand
them to :func:`run_journaled`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Mapping, Optional, Sequence, Union

from .. import (
    DuplicateIntentSuspected,
    InvalidArgumentError,
    FailedFinal,
    IdempotencyKeyReusedError,
    InProgress,
    JournalUnavailableError,
    LeaseExpiredBeforeCallError,
    LeaseLostError,
    Succeeded,
    VerificationRequired,
    idempotent,
)
from . import messages

if TYPE_CHECKING:
    from ..client import JournalClient

#: What a client-supplied key may look like: 1-128 characters of ``[A-Za-z0-9._:-]``.
CLIENT_KEY_PATTERN = re.compile(r"[A-Za-z0-9._:-]{1,128}")

#: The journal's reasons for refusing a key (nothing is written); answered ``invalid_key``.
KEY_REFUSED_REASONS = frozenset(
    {"KEY_CONTAINS_SENSITIVE_DATA", "KEY_PATTERN_MISMATCH", "INVALID_OPERATION_KEY"}
)

#: The journal's longest operation key, in characters (``INVALID_FIELD_LENGTH`` over it).
MAX_OPERATION_KEY_CHARS = 200

#: Which arguments form the payload: all of them (``None``), a list of names, or a function
#: of the arguments (a mapping of JSON values) returning the payload.
PayloadSpec = Union[None, Sequence[str], Callable[[Mapping[str, Any]], Any]]


class JournaledToolError(Exception):
    """A journaled tool did not produce a result; ``text`` (also ``str(error)``) is what the
    model should read, one of the :mod:`~opjournal_client.integrations.messages` texts.

    Attributes:
        kind: one of :data:`messages.KINDS` (``"verification_required"``, ``"conflict"``,
            ``"in_progress"``, ``"rejected"``, ``"duplicate_intent"``, ``"key_required"``,
            ``"invalid_key"``, ``"journal_unavailable"``, ``"lease_lost"``).
        text: the model-facing text.
        outcome: the :func:`opjournal_client.execute` answer behind it, when there was one.
    """

    def __init__(self, kind: str, text: str, outcome: Any = None) -> None:
        super().__init__(text)
        self.kind = kind
        self.text = text
        self.outcome = outcome


def tool_error(kind: str, *, subject: str = "operation", outcome: Any = None, **values: Any) -> JournaledToolError:
    """The :class:`JournaledToolError` of ``kind`` with its text filled in."""
    text = messages.KINDS[kind].format(subject=subject, **values)
    return JournaledToolError(kind, text, outcome)


def namespaced_client_key(scope: str, client_key: Any, *, subject: str = "operation") -> str:
    """The journal key for a key a client sent: ``{scope}:{client_key}``.

    The client's key is never used as the journal key alone: prefixing it with the tool's
    scope (e.g. ``mcp:create_payment``) keeps one client's key for one tool from naming
    another tool's operation.

    Raises:
        JournaledToolError: ``invalid_key`` when the key is not a string of 1-128
            characters of ``[A-Za-z0-9._:-]``, or when the journal key would be longer than
            :data:`MAX_OPERATION_KEY_CHARS` (a long scope).
    """
    if not isinstance(client_key, str) or not CLIENT_KEY_PATTERN.fullmatch(client_key):
        raise tool_error("invalid_key", subject=subject)
    key = f"{scope}:{client_key}"
    if len(key) > MAX_OPERATION_KEY_CHARS:
        raise tool_error("invalid_key", subject=subject)
    return key


def select_payload(arguments: Mapping[str, Any], payload: PayloadSpec) -> Any:
    """The journal payload for ``arguments``: all of them, the named subset, or what the
    function returns."""
    if payload is None:
        return dict(arguments)
    if callable(payload):
        return payload(arguments)
    return {name: arguments[name] for name in payload if name in arguments}


@dataclass(frozen=True)
class Journaled:
    """How one tool is journaled (framework-neutral).

    Attributes:
        client: the journal client.
        action_type: the action as named in the server's policy, e.g. ``"create_payment"``.
        payload: which arguments are hashed (see :data:`PayloadSpec`).
        namespace: the tenant namespace (empty: ``default``).
        subject: the noun the model-facing texts use ("payment").
        in_progress_wait: seconds to wait for another holder of the same key to finish
            before answering ``in_progress`` (0: answer at once).
        settle_wait: seconds to wait, when the outcome is already unknown at Begin, for the
            reconciler to settle it before answering ``verification_required`` (0: answer
            at once). An unknown outcome of this very call is answered at once.
        options: more keyword arguments for :func:`opjournal_client.idempotent`
            (``classify``, ``lease_seconds``, ``references``, ``external_id``,
            ``to_result``, ``renew_lease``).
    """

    client: "JournalClient"
    action_type: str
    payload: PayloadSpec = None
    namespace: str = ""
    subject: str = "operation"
    in_progress_wait: float = 0.0
    settle_wait: float = 0.0
    options: Optional[Mapping[str, Any]] = None

    def run(self, operation_key: str, arguments: Mapping[str, Any], body: Callable[[], Any]) -> Any:
        """:func:`run_journaled` with this configuration."""
        return run_journaled(self, operation_key, arguments, body)


def run_journaled(
    spec: Journaled, operation_key: str, arguments: Mapping[str, Any], body: Callable[[], Any]
) -> Any:
    """Runs ``body`` at most once for ``operation_key`` and returns the tool's result.

    ``body`` is the tool's own code (the provider call), run through
    :func:`opjournal_client.idempotent` with the sync client: only on
    ``DECISION_EXECUTE``, with :func:`opjournal_client.current_call` giving the provider
    key. It returns the result (JSON values) or a :class:`~opjournal_client.ProviderResult`
    (to record an ``external_id``), and raises :class:`~opjournal_client.ProviderRejected`
    for a confirmed rejection; any other exception is an unknown outcome.

    Returns:
        The stored result (as the action's policy keeps it), the same on the first run and
        on every replay, so the model reads one answer for one intent.

    Raises:
        JournaledToolError: every other outcome, with the text the model should read.
        opjournal_client.InvalidArgumentError: a malformed request other than a refused
            key (a bug, not a tool outcome), and the other errors of ``execute`` that no
            text covers (``LeaseLostError``).
    """
    payload = select_payload(arguments, spec.payload)

    def call() -> Any:  # no parameters: the key and the payload are already chosen
        return body()

    journaled = idempotent(
        spec.client,
        action_type=spec.action_type,
        key=operation_key,
        payload=lambda: payload,
        namespace=spec.namespace,
        in_progress_wait=spec.in_progress_wait,
        settle_wait=spec.settle_wait,
        returns="outcome",
        **dict(spec.options or {}),
    )(call)
    subject = spec.subject
    try:
        outcome = journaled()
    except IdempotencyKeyReusedError as error:
        raise tool_error("conflict", subject=subject) from error
    except (JournalUnavailableError, LeaseExpiredBeforeCallError) as error:
        # Nothing was called or recorded by this call: calling again is safe.
        raise tool_error("journal_unavailable", subject=subject) from error
    except LeaseLostError as error:
        raise tool_error("lease_lost", subject=subject) from error
    except InvalidArgumentError as error:
        if error.reason in KEY_REFUSED_REASONS or (
            error.reason == "INVALID_FIELD_LENGTH"
            and any(v.field == "operation_key" for v in error.field_violations)
        ):
            raise tool_error("invalid_key", subject=subject) from error
        raise
    if isinstance(outcome, Succeeded):
        return outcome.result if outcome.result is not None else outcome.provider_result
    if isinstance(outcome, InProgress):
        wait = max(1, round(outcome.retry_after))
        raise tool_error("in_progress", subject=subject, outcome=outcome, retry_after=wait)
    if isinstance(outcome, VerificationRequired):
        raise tool_error("verification_required", subject=subject, outcome=outcome)
    if isinstance(outcome, FailedFinal):
        code = outcome.error_code or "rejected"
        raise tool_error("rejected", subject=subject, outcome=outcome, error_code=code)
    if isinstance(outcome, DuplicateIntentSuspected):
        raise tool_error("duplicate_intent", subject=subject, outcome=outcome)
    raise TypeError(f"unexpected outcome {type(outcome).__name__}")
