/**
 * Journaled MCP tools through the real `@modelcontextprotocol/sdk` client and server.
 *
 * The example server `examples/agents/typescript` runs as a child process over stdio (as an
 * MCP host starts it) against the journal under test; its provider is the sandbox, reached
 * through a small HTTP relay in this process that can hold an answer back (a slow provider)
 * or add a sandbox fault header for one idempotency key. No language model: the client's
 * calls are the ones a model's host would send. `tests/it/typescript_client.rs` then checks
 * the journal rows and the sandbox's counts.
 *
 * The texts the model reads are checked word for word against the table of
 * `docs/agent-tools.md`, which the Python integrations' texts are checked against too.
 */

import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import http from "node:http";
import type { AddressInfo } from "node:net";
import { after, before, test } from "node:test";
import { fileURLToPath } from "node:url";

import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { InMemoryTransport } from "@modelcontextprotocol/sdk/inMemory.js";
import type { AuthInfo } from "@modelcontextprotocol/sdk/server/auth/types.js";
import { McpServer } from "@modelcontextprotocol/sdk/server/mcp.js";
import type { Transport } from "@modelcontextprotocol/sdk/shared/transport.js";
import { ErrorCode, McpError, type CallToolResult } from "@modelcontextprotocol/sdk/types.js";
import { z } from "zod";

import { Code } from "@connectrpc/connect";

import {
  InvalidArgumentError,
  JournalClient,
  JournalUnavailableError,
  OperationNotFoundError,
  v1,
} from "../src/index.js";
import {
  callerScope,
  currentCall,
  OUTCOME_META_KEY,
  registerJournaledTool,
  retryAfterSeconds,
  TOOL_ERROR_TEXT,
  toolErrorText,
  withIdempotencyKeys,
  type JournaledToolOptions,
  type ToolErrorKind,
  type ToolErrorValues,
} from "../src/mcp.js";
import { connect, Sandbox, waitFor } from "./harness.js";

const sandbox = new Sandbox();
const journal = connect();

/** What the relay does to the requests of one provider idempotency key. */
interface Rule {
  /** Hold the provider's answer back this long. */
  delayMs?: number;
  /** Send this `X-Sandbox-Fault`. */
  fault?: string;
}

const rules = new Map<string, Rule>();
const relayed = new AbortController();

/** Relays POST /v1/payments to the sandbox, applying the rule of its Idempotency-Key. */
const relay = http.createServer((request, response) => {
  const chunks: Buffer[] = [];
  request.on("data", (chunk: Buffer) => chunks.push(chunk));
  request.on("end", async () => {
    const key = String(request.headers["idempotency-key"] ?? "");
    const rule = rules.get(key) ?? {};
    const headers: Record<string, string> = {
      "Content-Type": "application/json",
      "Idempotency-Key": key,
    };
    if (rule.fault) {
      headers["X-Sandbox-Fault"] = rule.fault;
    }
    try {
      const answer = await fetch(`${sandbox.baseUrl}${request.url}`, {
        method: request.method,
        headers,
        body: Buffer.concat(chunks),
        signal: relayed.signal,
      });
      const body = await answer.text();
      await new Promise((resolve) => setTimeout(resolve, rule.delayMs ?? 0));
      response.writeHead(answer.status, { "Content-Type": "application/json" }).end(body);
    } catch {
      response.destroy();
    }
  });
});

let client: Client;

before(async () => {
  await new Promise<void>((resolve) => relay.listen(0, "127.0.0.1", resolve));
  const port = (relay.address() as AddressInfo).port;
  const example =
    process.env.OPJOURNAL_MCP_EXAMPLE ??
    fileURLToPath(new URL("../../../../examples/agents/typescript/dist/main.js", import.meta.url));
  const transport = new StdioClientTransport({
    command: process.execPath,
    args: [example],
    env: {
      OPJOURNAL_SERVER: `http://${process.env.OPJOURNAL_TEST_SERVER}`,
      PAYMENT_PROVIDER_URL: `http://127.0.0.1:${port}`,
      PAYMENT_PROVIDER_TIMEOUT_MS: "3000",
    },
    stderr: "ignore",
  });
  client = new Client({ name: "opjournal-test", version: "0.2.0" });
  await client.connect(transport);
});

after(async () => {
  await client.close();
  relayed.abort();
  relay.closeAllConnections();
  relay.close();
  journal.close();
});

/** Calls create_payment with the SEP-3182 `idempotencyKey` param (or none). */
function pay(
  args: Record<string, unknown>,
  idempotencyKey: string | undefined,
  timeout = 30_000,
): Promise<CallToolResult> {
  const params = { name: "create_payment", arguments: args, ...(idempotencyKey ? { idempotencyKey } : {}) };
  return client.callTool(params, undefined, { timeout }) as Promise<CallToolResult>;
}

function text(result: CallToolResult): string {
  const first = result.content[0];
  assert.ok(first?.type === "text");
  return first.text;
}

/** Asserts that `result` is the tool error of `kind`: that text alone, the kind in `_meta`. */
function assertToolError(result: CallToolResult, kind: ToolErrorKind, values: ToolErrorValues): void {
  assert.equal(result.isError, true, text(result));
  assert.equal(result.content.length, 1);
  assert.equal(text(result), toolErrorText(kind, values));
  assert.equal(result._meta?.[OUTCOME_META_KEY], kind);
}

/** docs/agent-tools.md, from the repository root. */
const DOC = fileURLToPath(new URL("../../../../docs/agent-tools.md", import.meta.url));
/** The values the docs table fills in, as the Python test fills them. */
const DOC_VALUES = { subject: "payment", retry_after: 5, error_code: "card_declined" };

test("every text is the docs table's, word for word, as the Python texts are", () => {
  const table = new Map<string, string>();
  for (const line of readFileSync(DOC, "utf8").split("\n")) {
    const cells = line.trim().replace(/^\|+|\|+$/g, "").split("|").map((cell) => cell.trim());
    if (cells.length === 3 && /^`[a-z_]+`$/.test(cells[0] ?? "")) {
      table.set((cells[0] ?? "").replaceAll("`", ""), cells[2] ?? "");
    }
  }
  assert.deepEqual([...table.keys()].sort(), Object.keys(TOOL_ERROR_TEXT).sort());
  for (const kind of Object.keys(TOOL_ERROR_TEXT) as ToolErrorKind[]) {
    const filled = toolErrorText(kind, DOC_VALUES);
    assert.ok(!filled.includes("{"), kind);
    assert.equal(filled, table.get(kind), kind);
  }
  // The default subject, and a placeholder without a value is a bug, not a text.
  assert.match(toolErrorText("verification_required"), /^verification required: the outcome of this operation /);
  assert.equal(toolErrorText("conflict", { subject: undefined }), toolErrorText("conflict", { subject: "operation" }));
  assert.throws(() => toolErrorText("in_progress", { subject: "payment" }), RangeError);
});

test("an unknown outcome's text tells the model not to call again", () => {
  const unknown = TOOL_ERROR_TEXT.verification_required;
  assert.match(unknown, /Do not call this tool again for it, not even with other arguments/);
  assert.doesNotMatch(unknown, /call (it|this tool) again (later|with|in)/);
});

test("retry_after is whole seconds, at least 1, rounded as Python rounds", () => {
  const cases: [number, number][] = [[0, 1], [400, 1], [1500, 2], [2500, 2], [3500, 4], [29_600, 30], [30_000, 30]];
  for (const [ms, seconds] of cases) {
    assert.equal(retryAfterSeconds(ms), seconds, `${ms} ms`);
  }
});

const ORDER = { order_id: "mcp-1", amount_minor: 4900, currency: "EUR" };

test("a call whose answer the client lost is repeated with its idempotency key and pays once", async () => {
  const key = "9b2f0c6e-lost-answer";
  rules.set(`mcp:create_payment:${key}`, { delayMs: 1200 });

  // The client gives up after 300 ms while the provider is still answering.
  await assert.rejects(pay(ORDER, key, 300), (error: unknown) => {
    assert.ok(error instanceof McpError);
    assert.equal(error.code, ErrorCode.RequestTimeout);
    return true;
  });
  // The retry arrives while the first call runs: it waits for it and gets its payment.
  const retried = await pay(ORDER, key);
  assert.equal(retried.isError, undefined, text(retried));
  const payment = retried.structuredContent as { id: string; status: string };
  assert.equal(payment.status, "succeeded");
  // Later repeats replay the same payment.
  const again = await pay(ORDER, key);
  assert.deepEqual(again.structuredContent, payment);

  assert.deepEqual(await sandbox.effects(`mcp:create_payment:${key}`), { requests: 1, effects: 1, lookups: 0 });
  const row = await journal.get(`mcp:create_payment:${key}`);
  assert.equal(row.externalId, payment.id);
});

test("the key may also come in _meta.idempotencyKey", async () => {
  const key = "9b2f0c6e-meta";
  const params = { name: "create_payment", arguments: { ...ORDER, order_id: "mcp-meta" }, _meta: { idempotencyKey: key } };
  const first = (await client.callTool(params)) as CallToolResult;
  const second = (await client.callTool(params)) as CallToolResult;
  assert.equal(first.isError, undefined, text(first));
  assert.deepEqual(second.structuredContent, first.structuredContent);
  assert.deepEqual(await sandbox.effects(`mcp:create_payment:${key}`), { requests: 1, effects: 1, lookups: 0 });
});

test("a key reused with other arguments is a tool error that says so", async () => {
  const key = "9b2f0c6e-lost-answer";
  const conflict = await pay({ ...ORDER, amount_minor: 9900 }, key);
  assertToolError(conflict, "conflict", { subject: "payment" });
  assert.deepEqual(await sandbox.effects(`mcp:create_payment:${key}`), { requests: 1, effects: 1, lookups: 0 });
});

test("an unknown outcome is a tool error telling the model not to call again", async () => {
  const key = "9b2f0c6e-unknown";
  rules.set(`mcp:create_payment:${key}`, { fault: "commit-then-timeout" });
  const args = { ...ORDER, order_id: "mcp-unknown" };

  const unknown = await pay(args, key);
  assertToolError(unknown, "verification_required", { subject: "payment" });
  // Repeated anyway: the provider is not called again until the outcome is reconciled.
  const repeated = await pay(args, key);
  assertToolError(repeated, "verification_required", { subject: "payment" });
  assert.deepEqual(await sandbox.effects(`mcp:create_payment:${key}`), { requests: 1, effects: 1, lookups: 0 });
});

test("a confirmed rejection is a tool error naming its code", async () => {
  const key = "9b2f0c6e-declined";
  rules.set(`mcp:create_payment:${key}`, { fault: "reject" });
  const declined = await pay({ ...ORDER, order_id: "mcp-declined" }, key);
  assertToolError(declined, "rejected", { subject: "payment", error_code: "card_declined" });
  assert.deepEqual(await sandbox.effects(`mcp:create_payment:${key}`), { requests: 1, effects: 0, lookups: 0 });
});

test("without a key from the client the server's derived key holds", async () => {
  const args = { ...ORDER, order_id: "mcp-derived" };
  const first = await pay(args, undefined);
  const second = await pay(args, undefined);
  assert.equal(first.isError, undefined, text(first));
  assert.deepEqual(second.structuredContent, first.structuredContent);
  assert.deepEqual(await sandbox.effects("payment:order-mcp-derived"), { requests: 1, effects: 1, lookups: 0 });
});

/** The tool's arguments. */
type Order = { order_id: string; amount_minor: number; currency: string };

/**
 * An in-process server with one journaled tool, `create_payment` of action type
 * `create_payment` (unless `options` say otherwise), without a derived key and without a
 * subject (unless `options` give them); the handler pays at the sandbox.
 */
async function inMemory(
  wrap: boolean,
  options: Partial<JournaledToolOptions<Order, unknown>> = {},
  handler: (args: Order) => Promise<unknown> = async (args) => sandbox.pay(currentCall().providerKey, args),
): Promise<Client> {
  const server = new McpServer({ name: "in-memory", version: "0.2.0" });
  registerJournaledTool(
    server,
    "create_payment",
    { inputSchema: { order_id: z.string(), amount_minor: z.number(), currency: z.string() } },
    { journal, actionType: "create_payment", ...options },
    handler,
  );
  const [clientSide, serverSide] = InMemoryTransport.createLinkedPair();
  await server.connect(wrap ? withIdempotencyKeys(serverSide) : serverSide);
  const local = new Client({ name: "opjournal-test", version: "0.2.0" });
  await local.connect(clientSide);
  return local;
}

function call(local: Client, params: Record<string, unknown>): Promise<CallToolResult> {
  return local.callTool(params as { name: string }) as Promise<CallToolResult>;
}

test("the SDK drops a top-level idempotencyKey unless the transport is wrapped", async () => {
  const args = { ...ORDER, order_id: "mcp-in-memory" };
  const params = { name: "create_payment", arguments: args, idempotencyKey: "9b2f0c6e-top-level" };

  const plain = await inMemory(false);
  // No key reached the tool and it derives none; the subject defaults to "operation".
  assertToolError(await call(plain, params), "key_required", {});
  await plain.close();

  const wrapped = await inMemory(true);
  const paid = await call(wrapped, params);
  assert.equal(paid.isError, undefined, text(paid));
  const twoKeys = await call(wrapped, { ...params, _meta: { idempotencyKey: "other" } });
  assertToolError(twoKeys, "invalid_key", {});
  await wrapped.close();

  assert.deepEqual(await sandbox.effects("mcp:create_payment:9b2f0c6e-top-level"), {
    requests: 1,
    effects: 1,
    lookups: 0,
  });
});

test("a malformed client key or a key the journal refuses is invalid_key, and nothing runs", async () => {
  let calls = 0;
  const local = await inMemory(
    false,
    { subject: "payment", deriveKey: (args) => `payment:${args.order_id}` },
    async () => {
      calls += 1;
      return {};
    },
  );
  const args = { ...ORDER, order_id: "mcp-bad-key" };
  for (const idempotencyKey of ["with space", "k".repeat(129), "", "a/b", 817]) {
    const refused = await call(local, { name: "create_payment", arguments: args, _meta: { idempotencyKey } });
    assertToolError(refused, "invalid_key", { subject: "payment" });
  }
  // A key of 128 characters is accepted (and scoped to the tool).
  const longest = "k".repeat(128);
  const accepted = await call(local, { name: "create_payment", arguments: args, _meta: { idempotencyKey: longest } });
  assert.equal(accepted.isError, undefined, text(accepted));
  assert.equal(calls, 1);
  // The server's own key holds an e-mail address: the journal refuses it
  // (KEY_CONTAINS_SENSITIVE_DATA) before anything is written.
  const sensitive = await call(local, {
    name: "create_payment",
    arguments: { ...args, order_id: "alice@example.com" },
  });
  assertToolError(sensitive, "invalid_key", { subject: "payment" });
  assert.equal(calls, 1);
  await assert.rejects(journal.get("payment:alice@example.com"), OperationNotFoundError);
  await local.close();
});

/** No row for `key`: not found, or a key the journal could never have stored. */
async function assertNoRow(key: string): Promise<void> {
  await assert.rejects(journal.get(key), (error: unknown) => {
    assert.ok(error instanceof OperationNotFoundError || error instanceof InvalidArgumentError, String(error));
    return true;
  });
}

test("a non-ASCII or over-long client key, or a journal key over 200 characters, is invalid_key before anything is sent", async () => {
  let calls = 0;
  const handler = async (args: Order) => {
    calls += 1;
    return sandbox.pay(currentCall().providerKey, args);
  };
  const args = { ...ORDER, order_id: "mcp-key-checks" };
  const local = await inMemory(false, { subject: "payment" }, handler);
  const refused = ["ключ-1", "clé", "key\n", "key\u200b", "k".repeat(129), "k".repeat(300), " k"];
  for (const idempotencyKey of refused) {
    const result = await call(local, { name: "create_payment", arguments: args, _meta: { idempotencyKey } });
    assertToolError(result, "invalid_key", { subject: "payment" });
    const journalKey = `mcp:create_payment:${idempotencyKey}`;
    await assertNoRow(journalKey);
    assert.deepEqual(await sandbox.effects(journalKey), { requests: 0, effects: 0, lookups: 0 });
  }
  await local.close();

  // The client's key is fine, but the server's scoping makes a journal key over 200 characters.
  const scope = `tenant-${"t".repeat(70)}`;
  const scoped = await inMemory(false, { subject: "payment", clientKey: (key) => `${scope}:${key}` }, handler);
  const longKey = "k".repeat(128);
  const overLong = await call(scoped, { name: "create_payment", arguments: args, _meta: { idempotencyKey: longKey } });
  assertToolError(overLong, "invalid_key", { subject: "payment" });
  await assertNoRow(`${scope}:${longKey}`);
  // A key of exactly 200 characters runs.
  const fits = "f".repeat(200 - scope.length - 1);
  const paid = await call(scoped, { name: "create_payment", arguments: args, _meta: { idempotencyKey: fits } });
  assert.equal(paid.isError, undefined, text(paid));
  await scoped.close();

  // The server's own derived key over 200 characters.
  const derived = await inMemory(false, { subject: "payment", deriveKey: () => `payment:${"d".repeat(200)}` }, handler);
  assertToolError(await call(derived, { name: "create_payment", arguments: args }), "invalid_key", {
    subject: "payment",
  });
  await derived.close();

  assert.equal(calls, 1);
  assert.deepEqual(await sandbox.effects(`${scope}:${fits}`), { requests: 1, effects: 1, lookups: 0 });
});

test("an unreachable journal is journal_unavailable, and the provider is not called", async () => {
  const unreachable = JournalClient.connect("http://127.0.0.1:1", { timeoutMs: 2000 });
  await assert.rejects(unreachable.get("anything"), JournalUnavailableError);
  const local = await inMemory(false, { journal: unreachable, subject: "payment" });
  const key = "9b2f0c6e-unreachable";
  const result = await call(local, {
    name: "create_payment",
    arguments: { ...ORDER, order_id: "mcp-unreachable" },
    _meta: { idempotencyKey: key },
  });
  assertToolError(result, "journal_unavailable", { subject: "payment" });
  assert.deepEqual(await sandbox.effects(`mcp:create_payment:${key}`), { requests: 0, effects: 0, lookups: 0 });
  await local.close();
  unreachable.close();
});

test("a call while another holds the key is in_progress with the lease's seconds; the first pays once", async () => {
  let release: () => void = () => {};
  const gate = new Promise<void>((resolve) => (release = resolve));
  let started = 0;
  const local = await inMemory(false, { subject: "payment" }, async (args) => {
    started += 1;
    await gate;
    return sandbox.pay(currentCall().providerKey, args);
  });
  const key = "9b2f0c6e-in-progress";
  const params = { name: "create_payment", arguments: { ...ORDER, order_id: "mcp-busy" }, _meta: { idempotencyKey: key } };
  const first = call(local, params);
  await waitFor("the first call to start", async () => (started === 1 ? true : undefined));

  const busy = await call(local, params);
  const seconds = Number(/in about (\d+) seconds/.exec(text(busy))?.[1]);
  assert.ok(seconds >= 1 && seconds <= 30, text(busy)); // the test policy's lease is 30 s
  assertToolError(busy, "in_progress", { subject: "payment", retry_after: seconds });

  release();
  const paid = await first;
  assert.equal(paid.isError, undefined, text(paid));
  assert.equal(started, 1);
  assert.deepEqual(await sandbox.effects(`mcp:create_payment:${key}`), { requests: 1, effects: 1, lookups: 0 });
  await local.close();
});

test("the same payment under another key, held by the duplicate-intent policy, is duplicate_intent", async () => {
  const local = await inMemory(false, { actionType: "create_payment_hold", subject: "payment" });
  const args = { ...ORDER, order_id: "mcp-held" };
  const first = await call(local, { name: "create_payment", arguments: args, _meta: { idempotencyKey: "9b2f0c6e-hold-1" } });
  assert.equal(first.isError, undefined, text(first));
  const held = await call(local, { name: "create_payment", arguments: args, _meta: { idempotencyKey: "9b2f0c6e-hold-2" } });
  assertToolError(held, "duplicate_intent", { subject: "payment" });
  assert.deepEqual(await sandbox.effects("mcp:create_payment:9b2f0c6e-hold-1"), { requests: 1, effects: 1, lookups: 0 });
  assert.deepEqual(await sandbox.effects("mcp:create_payment:9b2f0c6e-hold-2"), { requests: 0, effects: 0, lookups: 0 });
  await local.close();
});

test("a lease taken over before the report is lease_lost; the retry gets the new holder's payment", async () => {
  const key = "9b2f0c6e-taken-over";
  const journalKey = `mcp:create_payment:${key}`;
  const args = { ...ORDER, order_id: "mcp-taken-over" };
  let taken: v1.BeginOperationResponse | undefined;
  // A worker whose lease renewals do not get through (the journal is unreachable for
  // them) and whose success report arrives late, after its 1 s lease ended and another
  // worker holds a new one: everything else goes to the real journal.
  const stalled = new Proxy(journal, {
    get(target, property) {
      if (property === "renewLease") {
        return () =>
          Promise.reject(new JournalUnavailableError({ code: Code.Unavailable, rawMessage: "renewal held back" }));
      }
      if (property === "complete") {
        return async (...report: Parameters<JournalClient["complete"]>) => {
          taken = await waitFor("the lease to be taken over", async () => {
            const begin = await journal.begin({ operationKey: journalKey, actionType: "create_payment_dedup", payload: args });
            return begin.decision === v1.Decision.EXECUTE ? begin : undefined;
          });
          return journal.complete(...report);
        };
      }
      const value: unknown = Reflect.get(target, property, target);
      return typeof value === "function" ? value.bind(target) : value;
    },
  });
  const local = await inMemory(
    false,
    { journal: stalled, actionType: "create_payment_dedup", leaseSeconds: 1, subject: "payment" },
    async (body) => sandbox.pay(currentCall().providerKey, body),
  );
  const params = { name: "create_payment", arguments: args, _meta: { idempotencyKey: key } };
  assertToolError(await call(local, params), "lease_lost", { subject: "payment" });

  // The new holder calls the provider with the same key (which deduplicates) and records it.
  assert.ok(taken);
  const payment = await sandbox.pay(taken.operation?.providerKey ?? "", args);
  await journal.complete(taken.leaseToken, { externalId: payment.id, result: payment });
  const retried = await call(local, params);
  assert.equal(retried.isError, undefined, text(retried));
  assert.equal((retried.structuredContent as { id: string }).id, payment.id);
  assert.deepEqual(await sandbox.effects(journalKey), { requests: 2, effects: 1, lookups: 0 });
  await local.close();
});

/**
 * A server transport that delivers each message as the server's HTTP transport delivers an
 * authenticated request: with the verified token's `authInfo` (here: of the user the test
 * names in `params._meta["test/user"]`; one OAuth client, several users).
 */
function authenticating<T extends Transport>(transport: T): T {
  return new Proxy(transport, {
    get(target, property) {
      const value: unknown = Reflect.get(target, property, target);
      return typeof value === "function" && property !== "onmessage" ? value.bind(target) : value;
    },
    set(target, property, value) {
      if (property === "onmessage" && typeof value === "function") {
        const deliver = value as NonNullable<Transport["onmessage"]>;
        const signedIn: Transport["onmessage"] = (message, extra) => {
          const params = "params" in message ? (message.params as Record<string, unknown> | undefined) : undefined;
          const user = (params?._meta as Record<string, unknown> | undefined)?.["test/user"];
          const authInfo: AuthInfo | undefined =
            typeof user === "string"
              ? {
                  token: `token-of-${user}`,
                  clientId: "payments-assistant",
                  scopes: ["payments"],
                  extra: { iss: "https://id.example.test", sub: user },
                }
              : undefined;
          deliver(message, { ...extra, authInfo });
        };
        return Reflect.set(target, property, signedIn);
      }
      return Reflect.set(target, property, value);
    },
  });
}

test("two users of one server with the same key and arguments never replay each other's results", async () => {
  const server = new McpServer({ name: "shared", version: "0.2.0" });
  registerJournaledTool(
    server,
    "pay_order",
    { inputSchema: { order_id: z.string(), amount_minor: z.number(), currency: z.string() } },
    { journal, actionType: "create_payment", subject: "payment" },
    async (args: Order) => sandbox.pay(currentCall().providerKey, args),
  );
  const [clientSide, serverSide] = InMemoryTransport.createLinkedPair();
  await server.connect(authenticating(serverSide));
  const local = new Client({ name: "opjournal-test", version: "0.2.0" });
  await local.connect(clientSide);
  const args = { order_id: "ts-840", amount_minor: 1200, currency: "EUR" };
  const as = (user: string) =>
    call(local, { name: "pay_order", arguments: args, _meta: { idempotencyKey: "order-840", "test/user": user } });

  const paid = new Map<string, string>();
  for (const user of ["alice", "bob"]) {
    const first = await as(user);
    const again = await as(user);
    assert.equal(first.isError, undefined, text(first));
    assert.equal(again.isError, undefined, text(again));
    const id = (first.structuredContent as { id: string }).id;
    // The user's own second call replays the user's own first payment.
    assert.equal((again.structuredContent as { id: string }).id, id);
    paid.set(user, id);
  }
  assert.notEqual(paid.get("alice"), paid.get("bob"), "bob's call did not replay alice's payment");
  await local.close();

  for (const user of ["alice", "bob"]) {
    const identity = JSON.stringify(["payments-assistant", "https://id.example.test", user]);
    const key = `mcp:pay_order:${callerScope(identity)}:order-840`;
    assert.deepEqual(await sandbox.effects(key), { requests: 1, effects: 1, lookups: 0 }, user);
  }
  assert.equal((await sandbox.effects("mcp:pay_order:order-840")).requests, 0);
});

test("without an authenticated caller, or with callerIdentity false, keys are scoped by the tool only", async () => {
  const args = { ...ORDER, order_id: "ts-841" };
  for (const [options, key] of [
    [{}, "ts-841-anonymous"],
    [{ callerIdentity: false as const }, "ts-841-unscoped"],
  ] as const) {
    const local = await inMemory(false, options);
    const paid = await call(local, { name: "create_payment", arguments: args, _meta: { idempotencyKey: key } });
    assert.equal(paid.isError, undefined, text(paid));
    await local.close();
    assert.equal((await sandbox.effects(`mcp:create_payment:${key}`)).effects, 1);
  }
});

test("a server's own callerIdentity scopes the keys; a caller it cannot name is invalid_key", async () => {
  const local = await inMemory(false, {
    callerIdentity: (extra) => {
      const user = (extra._meta as Record<string, unknown> | undefined)?.["test/user"];
      if (user === "nobody-knows") {
        throw new Error("the gateway sent no user");
      }
      return typeof user === "string" ? user : undefined;
    },
  });
  const args = { ...ORDER, order_id: "ts-842" };
  const as = (user: string) =>
    call(local, { name: "create_payment", arguments: args, _meta: { idempotencyKey: "order-842", "test/user": user } });
  const ids: string[] = [];
  for (const user of ["carol", "dave", "carol"]) {
    const paid = await as(user);
    assert.equal(paid.isError, undefined, text(paid));
    ids.push((paid.structuredContent as { id: string }).id);
  }
  assert.equal(ids[0], ids[2]);
  assert.notEqual(ids[0], ids[1]);
  assertToolError(await as("nobody-knows"), "invalid_key", {});
  await local.close();
  for (const user of ["carol", "dave"]) {
    assert.equal((await sandbox.effects(`mcp:create_payment:${callerScope(user)}:order-842`)).effects, 1, user);
  }
});
