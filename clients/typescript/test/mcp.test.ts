/**
 * Journaled MCP tools through the real `@modelcontextprotocol/sdk` client and server.
 *
 * The example server `examples/agents/typescript` runs as a child process over stdio (as an
 * MCP host starts it) against the journal under test; its provider is the sandbox, reached
 * through a small HTTP relay in this process that can hold an answer back (a slow provider)
 * or add a sandbox fault header for one idempotency key. No language model: the client's
 * calls are the ones a model's host would send. `tests/typescript_client.rs` then checks
 * the journal rows and the sandbox's counts.
 */

import assert from "node:assert/strict";
import http from "node:http";
import type { AddressInfo } from "node:net";
import { after, before, test } from "node:test";
import { fileURLToPath } from "node:url";

import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { InMemoryTransport } from "@modelcontextprotocol/sdk/inMemory.js";
import { McpServer } from "@modelcontextprotocol/sdk/server/mcp.js";
import { ErrorCode, McpError, type CallToolResult } from "@modelcontextprotocol/sdk/types.js";
import { z } from "zod";

import { currentCall, registerJournaledTool, TOOL_ERROR_TEXT, withIdempotencyKeys } from "../src/mcp.js";
import { connect, Sandbox } from "./harness.js";

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
  assert.equal(conflict.isError, true);
  assert.equal(text(conflict), TOOL_ERROR_TEXT.conflict("create_payment"));
  assert.match(text(conflict), /^conflict: this idempotency key was already used .* with other arguments/);
  assert.deepEqual(await sandbox.effects(`mcp:create_payment:${key}`), { requests: 1, effects: 1, lookups: 0 });
});

test("an unknown outcome is a tool error telling the model not to call again", async () => {
  const key = "9b2f0c6e-unknown";
  rules.set(`mcp:create_payment:${key}`, { fault: "commit-then-timeout" });
  const args = { ...ORDER, order_id: "mcp-unknown" };

  const unknown = await pay(args, key);
  assert.equal(unknown.isError, true);
  assert.match(text(unknown), /^verification required: the outcome of this create_payment call is not known yet/);
  assert.match(text(unknown), /Do not call this tool again for it with another idempotency key/);
  // Repeated: the provider is not called again until the outcome is reconciled.
  const repeated = await pay(args, key);
  assert.equal(text(repeated), text(unknown));
  assert.deepEqual(await sandbox.effects(`mcp:create_payment:${key}`), { requests: 1, effects: 1, lookups: 0 });
});

test("a confirmed rejection is a tool error naming its code", async () => {
  const key = "9b2f0c6e-declined";
  rules.set(`mcp:create_payment:${key}`, { fault: "reject" });
  const declined = await pay({ ...ORDER, order_id: "mcp-declined" }, key);
  assert.equal(declined.isError, true);
  assert.equal(text(declined), TOOL_ERROR_TEXT.failed("create_payment", "card_declined"));
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

/** An in-process server with one journaled tool, without a derived key. */
async function inMemory(wrap: boolean): Promise<Client> {
  const server = new McpServer({ name: "in-memory", version: "0.2.0" });
  registerJournaledTool(
    server,
    "create_payment",
    { inputSchema: { order_id: z.string(), amount_minor: z.number(), currency: z.string() } },
    { journal, actionType: "create_payment" },
    async (args) => sandbox.pay(currentCall().providerKey, args),
  );
  const [clientSide, serverSide] = InMemoryTransport.createLinkedPair();
  await server.connect(wrap ? withIdempotencyKeys(serverSide) : serverSide);
  const local = new Client({ name: "opjournal-test", version: "0.2.0" });
  await local.connect(clientSide);
  return local;
}

test("the SDK drops a top-level idempotencyKey unless the transport is wrapped", async () => {
  const args = { ...ORDER, order_id: "mcp-in-memory" };
  const params = { name: "create_payment", arguments: args, idempotencyKey: "9b2f0c6e-top-level" };

  const plain = await inMemory(false);
  const refused = (await plain.callTool(params)) as CallToolResult;
  assert.equal(refused.isError, true);
  assert.equal(text(refused), TOOL_ERROR_TEXT.noKey("create_payment"));
  await plain.close();

  const wrapped = await inMemory(true);
  const paid = (await wrapped.callTool(params)) as CallToolResult;
  assert.equal(paid.isError, undefined, text(paid));
  const twoKeys = (await wrapped.callTool({ ...params, _meta: { idempotencyKey: "other" } })) as CallToolResult;
  assert.equal(text(twoKeys), TOOL_ERROR_TEXT.twoKeys("create_payment"));
  await wrapped.close();

  assert.deepEqual(await sandbox.effects("mcp:create_payment:9b2f0c6e-top-level"), {
    requests: 1,
    effects: 1,
    lookups: 0,
  });
});
