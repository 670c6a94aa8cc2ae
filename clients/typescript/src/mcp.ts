/**
 * `@opjournal/client/mcp`: MCP tools whose side effects run at most once per intent.
 *
 * {@link registerJournaledTool} registers a tool on an `McpServer` of
 * `@modelcontextprotocol/sdk` (an optional peer dependency: this module imports only its
 * types) whose handler runs through {@link execute}. The key of each call comes, in this
 * order, from:
 *
 * 1. the idempotency key the MCP client sent with the call — `params.idempotencyKey` of
 *    `tools/call`, the shape of the MCP request-idempotency proposal (SEP-3182), or
 *    `params._meta.idempotencyKey` — scoped by the server's code to the tool and to who
 *    calls (default `mcp:<tool>:<key>`, or `mcp:<tool>:u-<caller scope>:<key>` when the
 *    transport authenticated the caller: {@link JournaledToolOptions.callerIdentity},
 *    {@link JournaledToolOptions.clientKey});
 * 2. else the key the server's code derives from the arguments and the request context
 *    ({@link JournaledToolOptions.deriveKey}).
 *
 * The SDK's `McpServer` drops unknown `tools/call` params before a tool sees them, so a
 * top-level `params.idempotencyKey` reaches the tool only through a transport wrapped with
 * {@link withIdempotencyKeys}; `params._meta.idempotencyKey` works with any transport.
 *
 * A retried call with the same key and arguments gets the stored result without calling
 * the provider again. Every other outcome — a key reused with other arguments, an unknown
 * outcome, a rejection, another holder's live lease, a suspected duplicate, a missing,
 * malformed or refused key, an unreachable journal, a lease taken over — comes back as a
 * tool error (`isError: true`) whose only content is the text that tells the model what
 * happened and what to do ({@link TOOL_ERROR_TEXT}, the same texts as the Python
 * integrations), with its kind in `_meta["opjournal.dev/outcome"]`. Other errors (a
 * malformed request, a refused token) are thrown, and the SDK answers them as it answers
 * any failing tool.
 *
 * @module
 */

import { createHash } from "node:crypto";

import type { McpServer, RegisteredTool } from "@modelcontextprotocol/sdk/server/mcp.js";
import type { ShapeOutput, ZodRawShapeCompat } from "@modelcontextprotocol/sdk/server/zod-compat.js";
import type { RequestHandlerExtra } from "@modelcontextprotocol/sdk/shared/protocol.js";
import type { Transport } from "@modelcontextprotocol/sdk/shared/transport.js";
import type {
  CallToolResult,
  JSONRPCMessage,
  ServerNotification,
  ServerRequest,
  ToolAnnotations,
} from "@modelcontextprotocol/sdk/types.js";

import type { JournalClient } from "./client.js";
import {
  IdempotencyKeyReusedError,
  InvalidArgumentError,
  JournalUnavailableError,
  LeaseExpiredBeforeCallError,
  LeaseLostError,
} from "./errors.js";
import { execute, type Outcome } from "./execute.js";
import { JsonValue } from "./json.js";
import {
  classifierOptions,
  currentCall,
  withCurrentCall,
  type Classification,
  type CurrentCall,
} from "./current.js";

export { currentCall, type Classification, type CurrentCall };

/** The request context the SDK passes to a tool handler. */
export type ToolExtra = RequestHandlerExtra<ServerRequest, ServerNotification>;

/**
 * The `_meta` member under which {@link withIdempotencyKeys} passes a top-level
 * `params.idempotencyKey` on to the tool.
 */
export const LIFTED_KEY_META = "dev.opjournal/idempotencyKey";

/**
 * Wraps a server transport so that the top-level `params.idempotencyKey` of a `tools/call`
 * request (SEP-3182), which the SDK's `McpServer` would drop, reaches journaled tools (it is
 * copied to `params._meta["dev.opjournal/idempotencyKey"]`). Everything else passes
 * through unchanged. Use it as `server.connect(withIdempotencyKeys(transport))`.
 */
export function withIdempotencyKeys<T extends Transport>(transport: T): T {
  const handlers = new Set<PropertyKey>(["onmessage", "onclose", "onerror"]);
  return new Proxy(transport, {
    // Methods run on the transport itself (so that its own private state works).
    get(target, property) {
      const value: unknown = Reflect.get(target, property, target);
      return typeof value === "function" && !handlers.has(property) ? value.bind(target) : value;
    },
    set(target, property, value) {
      if (property === "onmessage" && typeof value === "function") {
        const deliver = value as NonNullable<Transport["onmessage"]>;
        const lifting: Transport["onmessage"] = (message, extra) => deliver(lift(message), extra);
        return Reflect.set(target, property, lifting);
      }
      return Reflect.set(target, property, value);
    },
  });
}

function lift(message: JSONRPCMessage): JSONRPCMessage {
  if (!("method" in message) || message.method !== "tools/call" || !("id" in message)) {
    return message;
  }
  const params = message.params as Record<string, unknown> | undefined;
  const key = params?.idempotencyKey;
  if (params === undefined || key === undefined) {
    return message;
  }
  const meta = (params._meta ?? {}) as Record<string, unknown>;
  return { ...message, params: { ...params, _meta: { ...meta, [LIFTED_KEY_META]: key } } };
}

/**
 * What the model reads when a journaled tool did not simply run, by kind: the same
 * templates, word for word, as the Python integrations' `opjournal_client.integrations.messages`
 * (both are checked against the table of `docs/agent-tools.md`).
 *
 * Each text starts with a short label (`verification required:`, `conflict:` …) that a
 * program can match, then tells the model what to do. Placeholders: `{subject}` the tool's
 * noun for its effect ({@link JournaledToolOptions.subject}, "operation" by default),
 * `{retry_after}` whole seconds, `{error_code}` the provider's short code; fill them with
 * {@link toolErrorText}. The texts never quote arguments, keys or results.
 */
export const TOOL_ERROR_TEXT = {
  /**
   * Begin answered VERIFICATION_REQUIRED, or this call's provider outcome was unknown (a
   * timeout, a reset, a 5xx): the effect may have happened. The reconcile worker asks the
   * provider; when no lookup can prove the outcome, a person settles it in the review queue.
   */
  verification_required:
    "verification required: the outcome of this {subject} is not known yet (the provider " +
    "may or may not have carried it out). Do not call this tool again for it, not even with " +
    "other arguments; it is being checked with the provider, and if that cannot settle it a " +
    "person will review it. Tell the user the {subject} is being verified.",
  /** The key is bound to other arguments (`IDEMPOTENCY_KEY_REUSED`); the provider was not called. */
  conflict:
    "conflict: this idempotency key was already used with other arguments, so the tool did " +
    "not run. Do not retry it with changed arguments under the same request; if the user " +
    "wants a different {subject}, that is a new request and needs a new key from the " +
    "application.",
  /** Another call with the same key holds the lease and did not finish within the wait. */
  in_progress:
    "in progress: an earlier call for this {subject} is still running, so the tool did not " +
    "run again. Do not start another {subject}; call this tool again with the same " +
    "arguments in about {retry_after} seconds to get its result.",
  /** The provider proved that nothing happened (a `ProviderRejected`); replays answer the same. */
  rejected:
    "rejected: the provider declined this {subject} ({error_code}) and nothing was carried " +
    "out. Do not retry it with the same arguments; tell the user why it was declined.",
  /**
   * The action's duplicate-intent policy held the call: the same request already exists
   * under another key; nothing was registered.
   */
  duplicate_intent:
    "possible duplicate: the same {subject} was already requested recently under another " +
    "request, so the tool did not run. Do not call it again; tell the user a {subject} like " +
    "this was already made or is being made, and ask whether a second one is really wanted " +
    "(the application has to confirm it as a new request).",
  /** No key could be found: the client sent none and the server derives none. */
  key_required:
    "idempotency key required: this tool only runs with an idempotency key from the " +
    "application, so it did not run. This is not something you can fix by changing the " +
    "arguments; tell the user the {subject} could not be started.",
  /**
   * The client's key is malformed (not 1-128 characters of `[A-Za-z0-9._:-]`), the call
   * carries two different keys, the journal's key (after `clientKey`, or from `deriveKey`)
   * is empty or over 200 characters, or the journal refused the key
   * (`KEY_CONTAINS_SENSITIVE_DATA`, `KEY_PATTERN_MISMATCH`, `INVALID_OPERATION_KEY`,
   * `INVALID_FIELD_LENGTH` on `operation_key`); nothing was written or called.
   */
  invalid_key:
    "invalid idempotency key: the application's key for this call is malformed or not " +
    "allowed, so the tool did not run. Changing the arguments will not help; tell the user " +
    "the {subject} could not be started.",
  /**
   * The journal could not be reached before anything was registered, or could not record
   * the outcome (`UNAVAILABLE`, `DEADLINE_EXCEEDED`), or Begin's answer arrived after the
   * lease it granted had ended (`LEASE_EXPIRED_BEFORE_CALL`: nothing was called). Calling
   * again with the same key is safe.
   */
  journal_unavailable:
    "temporarily unavailable: the operation journal could not be reached, so this {subject} " +
    "was not confirmed. It is safe to call this tool again with the same arguments in a few " +
    "seconds; it will not be carried out twice.",
  /**
   * The call's lease was taken over by another holder before its outcome was recorded
   * (`LEASE_LOST`): that holder's outcome counts.
   */
  lease_lost:
    "interrupted: this {subject} was taken over by another worker before its outcome was " +
    "recorded. Do not start another {subject}; call this tool again with the same arguments " +
    "in a few seconds to get the recorded result.",
} as const;

/**
 * The kind of a tool error, as in the Python integrations' `JournaledToolError.kind` and in
 * the result's `_meta["opjournal.dev/outcome"]` ({@link OUTCOME_META_KEY}).
 */
export type ToolErrorKind = keyof typeof TOOL_ERROR_TEXT;

/** The `_meta` member of a tool error result that names its {@link ToolErrorKind}. */
export const OUTCOME_META_KEY = "opjournal.dev/outcome";

/** What fills the placeholders of {@link TOOL_ERROR_TEXT} (named as the placeholders). */
export interface ToolErrorValues {
  /** The tool's noun for its effect; default "operation". */
  subject?: string;
  /** Whole seconds (`in_progress`). */
  retry_after?: number;
  /** The provider's short code (`rejected`). */
  error_code?: string;
}

/**
 * The text of `kind` with its placeholders filled.
 *
 * @throws {RangeError} the template has a placeholder that `values` does not give (a bug).
 */
export function toolErrorText(kind: ToolErrorKind, values: ToolErrorValues = {}): string {
  const filled: Record<string, string | number | undefined> = {
    ...values,
    subject: values.subject ?? "operation",
  };
  return TOOL_ERROR_TEXT[kind].replace(/\{([a-z_]+)\}/g, (_, name: string) => {
    const value = filled[name];
    if (value === undefined) {
      throw new RangeError(`no value for {${name}} in the ${kind} text`);
    }
    return String(value);
  });
}

/**
 * Whole seconds of a `retry_after` for the `in_progress` text: at least 1, rounded half to
 * even as the Python integrations round it.
 */
export function retryAfterSeconds(retryAfterMs: number): number {
  const seconds = retryAfterMs / 1000;
  let rounded = Math.round(seconds);
  if (rounded - seconds === 0.5 && rounded % 2 !== 0) {
    rounded -= 1;
  }
  return Math.max(1, rounded);
}

/**
 * The default {@link JournaledToolOptions.callerIdentity}: the principal of the access token
 * the server's transport verified (`extra.authInfo`): its client id, and the issuer and
 * subject its verifier put in `authInfo.extra` (`iss`; `sub` or `subject`), as JSON —
 * the same text as the Python integration's `authenticated_caller`. Undefined when the
 * transport authenticated nobody (stdio, or a server without auth).
 */
export function authenticatedCaller(extra: ToolExtra): string | undefined {
  const auth = extra.authInfo;
  if (auth === undefined) {
    return undefined;
  }
  const claims = auth.extra ?? {};
  const text = (value: unknown): string | null => (typeof value === "string" ? value : null);
  return JSON.stringify([auth.clientId, text(claims.iss), text(claims.sub) ?? text(claims.subject)]);
}

/**
 * The part of a journal key that stands for a caller's `identity`: `u-` and the first 96
 * bits of its SHA-256 in hex (26 characters), so that keys never hold an e-mail address or
 * a name.
 */
export function callerScope(identity: string): string {
  return `u-${createHash("sha256").update(identity, "utf8").digest("hex").slice(0, 24)}`;
}

/** A client's idempotency key: 1-128 characters of `[A-Za-z0-9._:-]`. */
export const CLIENT_KEY_PATTERN = /^[A-Za-z0-9._:-]{1,128}$/;

/**
 * The journal's longest operation key, in characters (Unicode code points): a longer key
 * (after `clientKey`, or from `deriveKey`) is `invalid_key` before anything is sent.
 */
export const MAX_OPERATION_KEY_CHARS = 200;

/** Whether the journal can take `key` as an operation key by its length (1-200 characters). */
function fitsJournal(key: unknown): key is string {
  if (typeof key !== "string" || key === "") {
    return false;
  }
  let chars = 0;
  for (const _ of key) {
    chars += 1;
  }
  return chars <= MAX_OPERATION_KEY_CHARS;
}

/** The journal's reasons for refusing a key (nothing is written); answered `invalid_key`. */
const KEY_REFUSED_REASONS: ReadonlySet<string> = new Set([
  "KEY_CONTAINS_SENSITIVE_DATA",
  "KEY_PATTERN_MISMATCH",
  "INVALID_OPERATION_KEY",
]);

/** Whether the journal refused the operation key (nothing was written). */
function isKeyRefusal(error: InvalidArgumentError): boolean {
  return (
    KEY_REFUSED_REASONS.has(error.reason) ||
    (error.reason === "INVALID_FIELD_LENGTH" && error.fieldViolations.some((v) => v.field === "operation_key"))
  );
}

/**
 * How a journaled tool runs; `Args` are the tool's validated arguments, `R` the provider
 * call's result.
 */
export interface JournaledToolOptions<Args, R> {
  /** The journal client. */
  journal: JournalClient;
  /** The action as named in the server's policy, e.g. `"create_payment"`. */
  actionType: string;
  /** The tenant namespace; absent means `default`. */
  namespace?: string;
  /**
   * The tool's noun for its effect in the texts the model reads ({@link TOOL_ERROR_TEXT}),
   * e.g. `"payment"`; default `"operation"`.
   */
  subject?: string;
  /**
   * Who calls, for the scope of a client's key: a function of the request context
   * answering a string that names one user, or undefined when nobody is known. Default
   * {@link authenticatedCaller} (the principal of the access token in `extra.authInfo`):
   * over an authenticating HTTP transport two users who send the same key never replay
   * each other's results. A verifier that sets no subject leaves only the OAuth client id,
   * which all users of one client share: give such a server its own function. A function
   * that throws refuses the call (`invalid_key`). `false`: keys are scoped by the tool
   * only (one user per server). Not used when {@link clientKey} is given.
   */
  callerIdentity?: false | ((extra: ToolExtra) => string | undefined);
  /**
   * Turns the client's idempotency key (checked first: 1-128 characters of
   * `[A-Za-z0-9._:-]`, else `invalid_key`) into the journal's key; default
   * `` `mcp:${tool}:${key}` ``, or `` `mcp:${tool}:${callerScope(identity)}:${key}` `` when
   * {@link callerIdentity} names the caller. A function given here makes the whole key
   * itself: scope it by the caller (`extra.authInfo`) so that two users' keys never meet;
   * the key it makes must be 1-200 characters ({@link MAX_OPERATION_KEY_CHARS}), else the
   * call is `invalid_key` and nothing is sent. `false`: ignore keys sent by clients.
   */
  clientKey?: false | ((idempotencyKey: string, extra: ToolExtra) => string);
  /**
   * The key the server's code derives when the client sent none (e.g. from an order id in
   * the arguments, or a run id the server holds); undefined: the call is refused with the
   * `key_required` tool error; over 200 characters: `invalid_key`.
   */
  deriveKey?: (args: Args, extra: ToolExtra) => string | undefined;
  /** What is hashed as the payload: default the arguments. */
  payload?: (args: Args) => unknown;
  /** The lease to ask for, in seconds; absent means the action's default. */
  leaseSeconds?: number;
  /** The provider's id of the effect, from the handler's result (e.g. `(r) => r.id`). */
  externalId?: (result: R) => string | undefined;
  /** Classifies an error thrown by the handler (see `IdempotentOptions.classify`). */
  classify?: (error: unknown) => Classification | undefined;
  /**
   * Wait for another holder's live lease up to this long (a retry that arrives while the
   * first call still runs then gets its result); default 0.
   */
  inProgressWaitMs?: number;
  /** Wait for an unknown outcome to be settled up to this long; default 0. */
  settleWaitMs?: number;
  /**
   * The tool result of a success, from the stored (sanitized) result; default: a string
   * result as its text, any other as JSON text, and as `structuredContent` when it is an
   * object.
   */
  toResult?: (result: unknown, outcome: Outcome & { kind: "succeeded" }) => CallToolResult;
}

/** The MCP part of a tool's registration (passed to `McpServer.registerTool`). */
export interface JournaledToolConfig<Shape extends ZodRawShapeCompat> {
  title?: string;
  description?: string;
  /** The tool's arguments as a zod raw shape. */
  inputSchema: Shape;
  annotations?: ToolAnnotations;
  _meta?: Record<string, unknown>;
}

/**
 * Registers `name` on `server` as a tool whose `handler` — the provider call — runs at most
 * once per idempotency key. Inside the handler {@link currentCall} gives the provider key
 * (send it to the provider as its idempotency key) and the lease's signal. What the handler
 * resolves to is a value, never JSON text (a string is stored as a JSON string and comes
 * back as the same string); it must be plain data (see `jsonText`), or the call is
 * recorded unknown (`result_not_serializable`) and answered `verification_required`.
 *
 * The handler is not cut short when the MCP client cancels the request or its request
 * timeout fires: the call is finished and recorded, so that the client's retry with the
 * same key gets the stored result. Pass `currentCall().signal` to the provider, not
 * `extra.signal`.
 *
 * @returns the SDK's registered tool (to disable, update or remove it).
 */
export function registerJournaledTool<Shape extends ZodRawShapeCompat, R>(
  server: McpServer,
  name: string,
  config: JournaledToolConfig<Shape>,
  options: JournaledToolOptions<ShapeOutput<Shape>, R>,
  handler: (args: ShapeOutput<Shape>, extra: ToolExtra) => Promise<R>,
): RegisteredTool {
  const run = (args: ShapeOutput<Shape>, extra: ToolExtra) =>
    runJournaled(name, options, handler, args, extra);
  // The SDK's callback type is conditional on the schema type; this is its shape branch.
  return server.registerTool(name, config, run as never);
}

/** The tool error of `kind`: its text as the only content, its kind in `_meta`. */
function toolError(kind: ToolErrorKind, values: ToolErrorValues): CallToolResult {
  return {
    content: [{ type: "text", text: toolErrorText(kind, values) }],
    isError: true,
    _meta: { [OUTCOME_META_KEY]: kind },
  };
}

function keyOf<Args, R>(
  tool: string,
  options: JournaledToolOptions<Args, R>,
  args: Args,
  extra: ToolExtra,
): { key: string } | { error: CallToolResult } {
  const subject = { subject: options.subject };
  const clientKey = options.clientKey ?? ((key: string, callExtra: ToolExtra) => scopedKey(tool, options, key, callExtra));
  if (clientKey !== false) {
    const meta = (extra._meta ?? {}) as Record<string, unknown>;
    const sent = [meta[LIFTED_KEY_META], meta.idempotencyKey].filter(
      (value) => value !== undefined && value !== null,
    );
    if (sent.length === 2 && sent[0] !== sent[1]) {
      return { error: toolError("invalid_key", subject) };
    }
    const key = sent[0];
    if (key !== undefined) {
      if (typeof key !== "string" || !CLIENT_KEY_PATTERN.test(key)) {
        return { error: toolError("invalid_key", subject) };
      }
      let scoped: string;
      try {
        scoped = clientKey(key, extra);
      } catch {
        // Who calls is unknown: the key must not be shared with other callers.
        return { error: toolError("invalid_key", subject) };
      }
      return fitsJournal(scoped) ? { key: scoped } : { error: toolError("invalid_key", subject) };
    }
  }
  const derived = options.deriveKey?.(args, extra);
  if (derived !== undefined && derived !== "") {
    return fitsJournal(derived) ? { key: derived } : { error: toolError("invalid_key", subject) };
  }
  return { error: toolError("key_required", subject) };
}

/** The default journal key of a client's key: scoped by the tool and by who calls. */
function scopedKey<Args, R>(
  tool: string,
  options: JournaledToolOptions<Args, R>,
  key: string,
  extra: ToolExtra,
): string {
  const identify = options.callerIdentity ?? authenticatedCaller;
  const identity = identify === false ? undefined : identify(extra);
  return identity === undefined ? `mcp:${tool}:${key}` : `mcp:${tool}:${callerScope(identity)}:${key}`;
}

function successResult(result: unknown): CallToolResult {
  const text = result === undefined ? "done" : typeof result === "string" ? result : JSON.stringify(result);
  const structured =
    typeof result === "object" && result !== null && !Array.isArray(result)
      ? { structuredContent: result as Record<string, unknown> }
      : {};
  return { content: [{ type: "text", text }], ...structured };
}

async function runJournaled<Args, R>(
  tool: string,
  options: JournaledToolOptions<Args, R>,
  handler: (args: Args, extra: ToolExtra) => Promise<R>,
  args: Args,
  extra: ToolExtra,
): Promise<CallToolResult> {
  const chosen = keyOf(tool, options, args, extra);
  if ("error" in chosen) {
    return chosen.error;
  }
  let outcome: Outcome;
  try {
    outcome = await execute(
      options.journal,
      {
        operationKey: chosen.key,
        actionType: options.actionType,
        payload: options.payload ? options.payload(args) : (args ?? {}),
        namespace: options.namespace,
        leaseSeconds: options.leaseSeconds,
      },
      (call) =>
        withCurrentCall({ ...call, operationKey: chosen.key }, async () => {
          const result = await handler(args, extra);
          return { externalId: options.externalId?.(result), result: new JsonValue(result) };
        }),
      {
        inProgressWaitMs: options.inProgressWaitMs,
        settleWaitMs: options.settleWaitMs,
        ...classifierOptions(options.classify),
      },
    );
  } catch (error) {
    const subject = { subject: options.subject };
    if (error instanceof IdempotencyKeyReusedError) {
      return toolError("conflict", subject);
    }
    if (error instanceof JournalUnavailableError || error instanceof LeaseExpiredBeforeCallError) {
      // Nothing was called or recorded by this call: calling again is safe.
      return toolError("journal_unavailable", subject);
    }
    if (error instanceof LeaseLostError) {
      return toolError("lease_lost", subject);
    }
    if (error instanceof InvalidArgumentError && isKeyRefusal(error)) {
      return toolError("invalid_key", subject);
    }
    // Any other error is not a tool outcome (a malformed request, a refused token, a bug).
    throw error;
  }
  const subject = options.subject;
  switch (outcome.kind) {
    case "succeeded":
      return (options.toResult ?? successResult)(outcome.result, outcome);
    case "failed_final":
      return toolError("rejected", { subject, error_code: outcome.errorCode || "rejected" });
    case "verification_required":
      return toolError("verification_required", { subject });
    case "in_progress":
      return toolError("in_progress", { subject, retry_after: retryAfterSeconds(outcome.retryAfterMs) });
    case "duplicate_intent_suspected":
      return toolError("duplicate_intent", { subject });
  }
}
