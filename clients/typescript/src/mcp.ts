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
 *    `params._meta.idempotencyKey` — scoped by the server's code to the tool (default
 *    `mcp:<tool>:<key>`, see {@link JournaledToolOptions.clientKey});
 * 2. else the key the server's code derives from the arguments and the request context
 *    ({@link JournaledToolOptions.deriveKey}).
 *
 * The SDK's `McpServer` drops unknown `tools/call` params before a tool sees them, so a
 * top-level `params.idempotencyKey` reaches the tool only through a transport wrapped with
 * {@link withIdempotencyKeys}; `params._meta.idempotencyKey` works with any transport.
 *
 * A retried call with the same key and arguments gets the stored result without calling
 * the provider again; a key reused with other arguments, an unknown outcome, a rejection,
 * another holder's live lease and a suspected duplicate come back as tool errors
 * (`isError: true`) whose text tells the model what happened and what to do
 * ({@link TOOL_ERROR_TEXT}).
 *
 * @module
 */

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
import { IdempotencyKeyReusedError, InvalidArgumentError, LeaseLostError, OpjournalError } from "./errors.js";
import { execute, type Outcome } from "./execute.js";
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

/** The texts of the tool errors, for the model that reads them (no keys, no arguments). */
export const TOOL_ERROR_TEXT = {
  verificationRequired: (tool: string) =>
    `verification required: the outcome of this ${tool} call is not known yet and it may ` +
    `have taken effect. Do not call this tool again for it with another idempotency key or ` +
    `changed arguments, and do not tell the user it failed: it is being verified. Call it ` +
    `again later with the same idempotencyKey and the same arguments to get the verified result.`,
  conflict: (tool: string) =>
    `conflict: this idempotency key was already used for a ${tool} call with other ` +
    `arguments; nothing was done now. To repeat the earlier call, send its original ` +
    `arguments; for a new, different request use a new idempotencyKey.`,
  failed: (tool: string, errorCode: string) =>
    `failed: the provider rejected this ${tool} call (${errorCode}); nothing happened. ` +
    `Repeating the same request gives the same answer; change what caused the rejection ` +
    `and use a new idempotencyKey.`,
  inProgress: (tool: string, retryAfterMs: number) =>
    `in progress: this ${tool} call is still running. Call it again in about ` +
    `${Math.max(1, Math.ceil(retryAfterMs / 1000))} s with the same idempotencyKey and the ` +
    `same arguments to get its result; do not use another key.`,
  duplicate: (tool: string) =>
    `duplicate suspected: a ${tool} call with the same arguments was already made under ` +
    `another idempotency key; nothing was done. Do not repeat it; if this really is a new, ` +
    `separate request, ask the user to confirm.`,
  noKey: (tool: string) =>
    `missing idempotency key: ${tool} has a side effect and needs an idempotencyKey with ` +
    `the call (a new unique value for a new request, the same value when repeating it).`,
  twoKeys: (tool: string) =>
    `invalid request: this ${tool} call carries two different idempotency keys; send one.`,
  invalid: (tool: string, reason: string) =>
    `invalid request: the journal refused this ${tool} call (${reason || "INVALID_ARGUMENT"}); ` +
    `nothing was done.`,
  leaseLost: (tool: string) =>
    `interrupted: this ${tool} call was taken over by another worker before its outcome ` +
    `was recorded. Call it again with the same idempotencyKey and the same arguments to get ` +
    `the recorded result; do not use another key.`,
  unavailable: (tool: string) =>
    `unavailable: the operation journal could not record this ${tool} call right now; it ` +
    `may or may not have taken effect. Call it again later with the same idempotencyKey ` +
    `and the same arguments; do not use another key.`,
} as const;

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
   * Turns the client's idempotency key into the journal's key; default
   * `` (key) => `mcp:${tool}:${key}` ``. Scope it further with what the server knows of the
   * caller (the authenticated user in `extra.authInfo`), so that two users' keys never
   * meet. `false`: ignore keys sent by clients.
   */
  clientKey?: false | ((idempotencyKey: string, extra: ToolExtra) => string);
  /**
   * The key the server's code derives when the client sent none (e.g. from an order id in
   * the arguments, or a run id the server holds); undefined: the call is refused with a
   * tool error asking for an idempotencyKey.
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
   * The tool result of a success, from the stored (sanitized) result; default: the result
   * as JSON text, and as `structuredContent` when it is an object.
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
 * (send it to the provider as its idempotency key) and the lease's signal.
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

function toolError(text: string): CallToolResult {
  return { content: [{ type: "text", text }], isError: true };
}

function keyOf<Args, R>(
  tool: string,
  options: JournaledToolOptions<Args, R>,
  args: Args,
  extra: ToolExtra,
): { key: string } | { error: CallToolResult } {
  const meta = (extra._meta ?? {}) as Record<string, unknown>;
  const sent = [meta[LIFTED_KEY_META], meta.idempotencyKey].filter(
    (value): value is string => typeof value === "string" && value !== "",
  );
  if (sent.length === 2 && sent[0] !== sent[1]) {
    return { error: toolError(TOOL_ERROR_TEXT.twoKeys(tool)) };
  }
  const clientKey = options.clientKey ?? ((key: string) => `mcp:${tool}:${key}`);
  if (sent[0] !== undefined && clientKey !== false) {
    return { key: clientKey(sent[0], extra) };
  }
  const derived = options.deriveKey?.(args, extra);
  if (derived !== undefined && derived !== "") {
    return { key: derived };
  }
  return { error: toolError(TOOL_ERROR_TEXT.noKey(tool)) };
}

function successResult(result: unknown): CallToolResult {
  const text = result === undefined ? "done" : JSON.stringify(result);
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
          return { externalId: options.externalId?.(result), result };
        }),
      {
        inProgressWaitMs: options.inProgressWaitMs,
        settleWaitMs: options.settleWaitMs,
        ...classifierOptions(options.classify),
      },
    );
  } catch (error) {
    if (error instanceof IdempotencyKeyReusedError) {
      return toolError(TOOL_ERROR_TEXT.conflict(tool));
    }
    if (error instanceof LeaseLostError) {
      return toolError(TOOL_ERROR_TEXT.leaseLost(tool));
    }
    if (error instanceof InvalidArgumentError) {
      return toolError(TOOL_ERROR_TEXT.invalid(tool, error.reason));
    }
    if (error instanceof OpjournalError) {
      return toolError(TOOL_ERROR_TEXT.unavailable(tool));
    }
    throw error;
  }
  switch (outcome.kind) {
    case "succeeded":
      return (options.toResult ?? successResult)(outcome.result, outcome);
    case "failed_final":
      return toolError(TOOL_ERROR_TEXT.failed(tool, outcome.errorCode ?? "rejected"));
    case "verification_required":
      return toolError(TOOL_ERROR_TEXT.verificationRequired(tool));
    case "in_progress":
      return toolError(TOOL_ERROR_TEXT.inProgress(tool, outcome.retryAfterMs));
    case "duplicate_intent_suspected":
      return toolError(TOOL_ERROR_TEXT.duplicate(tool));
  }
}
