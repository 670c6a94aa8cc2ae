"""What a language model reads when a journaled tool did not simply run: one text per
outcome, shared by every integration (MCP, OpenAI Agents SDK, LangChain/LangGraph).

Each text starts with a short label (``verification required:``, ``conflict:`` ...) that a
program can match, then tells the model what to do. ``{subject}`` is the tool's noun for
its effect ("payment", "e-mail"; "operation" by default), ``{retry_after}`` whole seconds,
``{error_code}`` the provider's short code. The texts never quote arguments, keys or
results.
"""

from __future__ import annotations

from typing import Final

#: Begin answered VERIFICATION_REQUIRED, or this call's provider outcome was unknown (a
#: timeout, a reset, a 5xx): the effect may have happened. The reconcile worker asks the
#: provider; when no lookup can prove the outcome, a person settles it in the review queue.
VERIFICATION_REQUIRED: Final = (
    "verification required: the outcome of this {subject} is not known yet (the provider "
    "may or may not have carried it out). Do not call this tool again for it, not even with "
    "other arguments; it is being checked with the provider, and if that cannot settle it a "
    "person will review it. Tell the user the {subject} is being verified."
)

#: The key is bound to other arguments (``IDEMPOTENCY_KEY_REUSED``); the provider was not
#: called.
CONFLICT: Final = (
    "conflict: this idempotency key was already used with other arguments, so the tool did "
    "not run. Do not retry it with changed arguments under the same request; if the user "
    "wants a different {subject}, that is a new request and needs a new key from the "
    "application."
)

#: Another call with the same key holds the lease and did not finish within the wait.
IN_PROGRESS: Final = (
    "in progress: an earlier call for this {subject} is still running, so the tool did not "
    "run again. Do not start another {subject}; call this tool again with the same "
    "arguments in about {retry_after} seconds to get its result."
)

#: The provider proved that nothing happened (FailOperation); replays answer the same.
REJECTED: Final = (
    "rejected: the provider declined this {subject} ({error_code}) and nothing was carried "
    "out. Do not retry it with the same arguments; tell the user why it was declined."
)

#: The action's duplicate-intent policy held the call: the same request already exists
#: under another key; nothing was registered.
DUPLICATE_INTENT: Final = (
    "possible duplicate: the same {subject} was already requested recently under another "
    "request, so the tool did not run. Do not call it again; tell the user a {subject} like "
    "this was already made or is being made, and ask whether a second one is really wanted "
    "(the application has to confirm it as a new request)."
)

#: No key could be found: the client sent none and the server derives none.
KEY_REQUIRED: Final = (
    "idempotency key required: this tool only runs with an idempotency key from the "
    "application, so it did not run. This is not something you can fix by changing the "
    "arguments; tell the user the {subject} could not be started."
)

#: The key is malformed (a client's key: 1-128 characters of ``[A-Za-z0-9._:-]``) or the
#: journal refused it (``KEY_CONTAINS_SENSITIVE_DATA``, ``KEY_PATTERN_MISMATCH``,
#: ``INVALID_OPERATION_KEY``); nothing was written.
INVALID_KEY: Final = (
    "invalid idempotency key: the application's key for this call is malformed or not "
    "allowed, so the tool did not run. Changing the arguments will not help; tell the user "
    "the {subject} could not be started."
)

#: The journal could not be reached before anything was registered, or could not record
#: the outcome. Calling again with the same key is safe.
JOURNAL_UNAVAILABLE: Final = (
    "temporarily unavailable: the operation journal could not be reached, so this {subject} "
    "was not confirmed. It is safe to call this tool again with the same arguments in a few "
    "seconds; it will not be carried out twice."
)

#: The call's lease was taken over by another holder before its outcome was recorded
#: (``LEASE_LOST``): that holder's outcome counts.
LEASE_LOST: Final = (
    "interrupted: this {subject} was taken over by another worker before its outcome was "
    "recorded. Do not start another {subject}; call this tool again with the same arguments "
    "in a few seconds to get the recorded result."
)

#: Outcome kinds, as put in :attr:`JournaledToolError.kind` and in MCP results' ``_meta``.
KINDS: Final = {
    "verification_required": VERIFICATION_REQUIRED,
    "conflict": CONFLICT,
    "in_progress": IN_PROGRESS,
    "rejected": REJECTED,
    "duplicate_intent": DUPLICATE_INTENT,
    "key_required": KEY_REQUIRED,
    "invalid_key": INVALID_KEY,
    "journal_unavailable": JOURNAL_UNAVAILABLE,
    "lease_lost": LEASE_LOST,
}
