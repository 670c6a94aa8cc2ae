/**
 * What the wrappers send to the journal: what a function wrapped by `idempotent` (or a
 * journaled MCP tool) returns is a value — a string is stored as a JSON string, never read as
 * JSON text — and a replay gives back an equal value. Every function here pays at the
 * sandbox first, so that `tests/it/typescript_client.rs` can check afterwards that each row
 * holds exactly one effect.
 */

import assert from "node:assert/strict";
import { after, test } from "node:test";

import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { InMemoryTransport } from "@modelcontextprotocol/sdk/inMemory.js";
import { McpServer } from "@modelcontextprotocol/sdk/server/mcp.js";
import type { CallToolResult } from "@modelcontextprotocol/sdk/types.js";
import { z } from "zod";

import {
  currentCall,
  IdempotencyKeyReusedError,
  idempotent,
  InvalidArgumentError,
  OperationNotFoundError,
  RESULT_NOT_SERIALIZABLE,
  RESULT_REFUSED,
  v1,
  VerificationRequiredError,
} from "../src/index.js";
import { OUTCOME_META_KEY, registerJournaledTool, toolErrorText, type JournaledToolOptions } from "../src/mcp.js";
import { connect, PAY_817, Sandbox } from "./harness.js";

const journal = connect();
const sandbox = new Sandbox();
after(() => journal.close());

/** Pays at the sandbox under the current provider key (one effect per key). */
async function payOnce(): Promise<void> {
  await sandbox.pay(currentCall().providerKey, PAY_817);
}

/** What the wrapped functions return: the review's cases, each under its own key. */
const RETURNED: [string, unknown][] = [
  ["plain-string", "sent"],
  ["json-looking-string", '{"id":"pay_1","status":"succeeded"}'],
  ["number-looking-string", "42"],
  ["null", null],
  ["undefined", undefined],
  ["number", 42],
  ["array", [1, "two", { three: 3 }, null]],
  ["object", { id: "pay_1", nested: { list: ["a"] } }],
];

test("what a wrapped function returns comes back equal, fresh and replayed", async () => {
  for (const [name, value] of RETURNED) {
    let calls = 0;
    const key = `ts:values:${name}`;
    const send = idempotent(
      async (_to: string) => {
        calls += 1;
        await payOnce();
        return value;
      },
      { journal, actionType: "create_payment", key },
    );
    assert.deepEqual(await send("someone"), value, `${name}: fresh`);
    assert.deepEqual(await send("someone"), value, `${name}: replayed`);
    const replayed = await send.outcome("someone");
    assert.ok(replayed.kind === "succeeded", `${name}: ${replayed.kind}`);
    assert.equal(replayed.replayed, true);
    assert.deepEqual(replayed.result, value, `${name}: the outcome's result`);
    assert.equal(calls, 1, name);
    const row = await journal.get(key);
    assert.equal(row.status, v1.OperationStatus.SUCCEEDED, name);
    assert.deepEqual(await sandbox.effects(key), { requests: 1, effects: 1, lookups: 0 }, name);
  }
});

/** An in-process MCP server with one journaled tool `send` whose handler is `handler`. */
async function mcpTool(
  handler: () => Promise<unknown>,
  options: Partial<JournaledToolOptions<{ to: string }, unknown>> = {},
): Promise<Client> {
  const server = new McpServer({ name: "values", version: "0.2.0" });
  registerJournaledTool(
    server,
    "send",
    { inputSchema: { to: z.string() } },
    { journal, actionType: "create_payment", subject: "message", ...options },
    handler,
  );
  const [clientSide, serverSide] = InMemoryTransport.createLinkedPair();
  await server.connect(serverSide);
  const client = new Client({ name: "opjournal-test", version: "0.2.0" });
  await client.connect(clientSide);
  return client;
}

async function callSend(client: Client, idempotencyKey: string): Promise<CallToolResult> {
  const params = { name: "send", arguments: { to: "someone" }, _meta: { idempotencyKey } };
  return (await client.callTool(params)) as CallToolResult;
}

function text(result: CallToolResult): string {
  const first = result.content[0];
  assert.ok(first?.type === "text");
  return first.text;
}

test("an MCP tool that returns a string answers that string, fresh and replayed", async () => {
  for (const [name, value, shown] of [
    ["tool-plain-string", "sent", "sent"],
    ["tool-json-looking-string", '{"id":"msg_1"}', '{"id":"msg_1"}'],
    ["tool-number", 42, "42"],
  ] as const) {
    let calls = 0;
    const client = await mcpTool(async () => {
      calls += 1;
      await payOnce();
      return value;
    });
    const fresh = await callSend(client, name);
    const replayed = await callSend(client, name);
    for (const result of [fresh, replayed]) {
      assert.equal(result.isError, undefined, text(result));
      assert.equal(text(result), shown, name);
      assert.equal(result.structuredContent, undefined, name);
    }
    assert.equal(calls, 1, name);
    assert.deepEqual(await sandbox.effects(`mcp:send:${name}`), { requests: 1, effects: 1, lookups: 0 }, name);
    await client.close();
  }
});

/**
 * The action of `tests/it/typescript_client.rs`'s policy for these tests whose stored result
 * may be at most 256 bytes (`result.max_bytes`).
 */
const SMALL_RESULT = "create_payment_small_result";
const TOO_LARGE = { id: "pay_large", note: "x".repeat(1000) };

test("a success the journal refuses to record is verification required, and the function is not called again", async () => {
  const cases: [string, Partial<{ actionType: string; externalId: string }>, unknown, string, string | undefined][] = [
    ["too-large", { actionType: SMALL_RESULT }, TOO_LARGE, RESULT_REFUSED, "RESULT_TOO_LARGE"],
    ["bad-external-id", { externalId: "pay\n1" }, { id: "pay_1" }, RESULT_REFUSED, "INVALID_EXTERNAL_ID"],
    ["long-external-id", { externalId: "e".repeat(300) }, { id: "pay_1" }, RESULT_REFUSED, "INVALID_FIELD_LENGTH"],
    ["not-serializable", {}, new Map([["id", "pay_1"]]), RESULT_NOT_SERIALIZABLE, undefined],
  ];
  for (const [name, options, value, code, reason] of cases) {
    let calls = 0;
    const key = `ts:values:refused-${name}`;
    const pay = idempotent(
      async (_order: string) => {
        calls += 1;
        await payOnce();
        return value;
      },
      {
        journal,
        actionType: options.actionType ?? "create_payment",
        key,
        externalId: options.externalId === undefined ? undefined : () => options.externalId,
      },
    );
    await assert.rejects(pay("817"), (error: unknown) => {
      assert.ok(error instanceof VerificationRequiredError, `${name}: ${String(error)}`);
      assert.equal(error.reported, true);
      assert.equal(error.errorCode, code);
      if (reason === undefined) {
        assert.ok(error.cause instanceof TypeError, name);
      } else {
        assert.ok(error.cause instanceof InvalidArgumentError, name);
        assert.equal(error.cause.reason, reason);
      }
      return true;
    });
    // Repeated: Begin answers VERIFICATION_REQUIRED and the function is not called again.
    const again = await pay.outcome("817");
    assert.ok(again.kind === "verification_required", `${name}: ${again.kind}`);
    assert.equal(again.reported, false);
    assert.equal(calls, 1, name);
    const row = await journal.get(key);
    assert.equal(row.status, v1.OperationStatus.UNKNOWN, name);
    assert.equal(row.errorCode, code, name);
    assert.deepEqual(await sandbox.effects(key), { requests: 1, effects: 1, lookups: 0 }, name);
  }
});

test("an MCP tool whose result the journal refuses answers verification_required, not an error", async () => {
  let calls = 0;
  const client = await mcpTool(
    async () => {
      calls += 1;
      await payOnce();
      return TOO_LARGE;
    },
    { actionType: SMALL_RESULT },
  );
  for (let attempt = 0; attempt < 2; attempt++) {
    const result = await callSend(client, "tool-too-large");
    assert.equal(result.isError, true, text(result));
    assert.equal(text(result), toolErrorText("verification_required", { subject: "message" }));
    assert.equal(result._meta?.[OUTCOME_META_KEY], "verification_required");
  }
  assert.equal(calls, 1);
  const row = await journal.get("mcp:send:tool-too-large");
  assert.equal(row.status, v1.OperationStatus.UNKNOWN);
  assert.equal(row.errorCode, RESULT_REFUSED);
  assert.deepEqual(await sandbox.effects("mcp:send:tool-too-large"), { requests: 1, effects: 1, lookups: 0 });
  await client.close();
});

class Empty {}
class WithField {
  constructor(readonly id: string) {}
}

test("a payload JSON would write lossily is a TypeError before Begin; nothing is registered or called", async () => {
  const sparse: unknown[] = [1];
  sparse[2] = 3;
  const circular: Record<string, unknown> = {};
  circular.self = circular;
  const refused: [string, unknown[]][] = [
    ["map", [new Map([["a", 1]])]],
    ["set", [new Set([1])]],
    ["function", [() => 1]],
    ["symbol", [Symbol("s")]],
    ["bigint", [10n]],
    ["nan", [Number.NaN]],
    ["infinity", [{ amount: Number.POSITIVE_INFINITY }]],
    ["class-instance", [new Empty()]],
    ["class-instance-with-field", [new WithField("a")]],
    ["undefined-in-array", [[1, undefined]]],
    ["hole-in-array", [sparse]],
    ["undefined-between-arguments", [1, undefined, 2]],
    ["nested-map", [{ items: new Map([["b", 999]]) }]],
    ["symbol-key", [{ [Symbol("k")]: 1 }]],
    ["circular", [circular]],
  ];
  for (const [name, args] of refused) {
    let calls = 0;
    const key = `ts:values:payload-${name}`;
    const pay = idempotent(
      async (..._args: unknown[]) => {
        calls += 1;
        await payOnce();
        return "paid";
      },
      { journal, actionType: "create_payment", key },
    );
    await assert.rejects(pay(...args), TypeError, name);
    assert.equal(calls, 0, name);
    await assert.rejects(journal.get(key), OperationNotFoundError, name);
  }
  // The same through a payload function, and through the client's own Begin.
  const viaPayload = idempotent(async (_order: Map<string, number>) => "paid", {
    journal,
    actionType: "create_payment",
    key: "ts:values:payload-function-map",
    payload: (order) => ({ order }),
  });
  await assert.rejects(viaPayload(new Map([["a", 1]])), TypeError);
  await assert.rejects(
    journal.begin({ operationKey: "ts:values:payload-begin-map", actionType: "create_payment", payload: new Map() }),
    TypeError,
  );
  for (const key of ["ts:values:payload-function-map", "ts:values:payload-begin-map"]) {
    await assert.rejects(journal.get(key), OperationNotFoundError, key);
  }
});

test("two different Maps under one key are refused, not replayed as one intent", async () => {
  let calls = 0;
  const pay = idempotent(
    async (items: Map<string, number>) => {
      calls += 1;
      return { n: items.size };
    },
    { journal, actionType: "create_payment", key: "ts:values:payload-two-maps" },
  );
  await assert.rejects(pay(new Map([["a", 1]])), TypeError);
  await assert.rejects(pay(new Map([["b", 999]])), TypeError);
  assert.equal(calls, 0);
});

test("trailing undefined arguments are one intent with their absence; a Date is its ISO text", async () => {
  let calls = 0;
  const pay = idempotent(
    async (_amount: number, _note?: string) => {
      calls += 1;
      await payOnce();
      return "paid";
    },
    { journal, actionType: "create_payment", key: "ts:values:trailing-undefined" },
  );
  assert.equal(await pay(1), "paid");
  assert.equal(await pay(1, undefined), "paid");
  assert.equal(calls, 1);
  await assert.rejects(pay(1, "a note"), IdempotencyKeyReusedError);
  assert.equal(calls, 1);

  let dated = 0;
  const at = idempotent(
    async (_when: Date) => {
      dated += 1;
      await payOnce();
      return "scheduled";
    },
    { journal, actionType: "create_payment", key: "ts:values:payload-date" },
  );
  assert.equal(await at(new Date(0)), "scheduled");
  assert.equal(await at(new Date(0)), "scheduled");
  await assert.rejects(at(new Date(1)), IdempotencyKeyReusedError);
  assert.equal(dated, 1);
});
