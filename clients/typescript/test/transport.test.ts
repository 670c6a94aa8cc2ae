/**
 * What the client does with answers made by the transport rather than by the journal: a
 * bare `CANCELLED` (a deadline that passed in the server) and a shed call are safe to
 * repeat, and the shipped service config's retry policy repeats `UNAVAILABLE` for the RPCs
 * it names, in an in-memory transport that refuses the first attempt.
 */

import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { test } from "node:test";

import { Code, ConnectError, createClient } from "@connectrpc/connect";
import { createRouterTransport } from "@connectrpc/connect";
import { create } from "@bufbuild/protobuf";
import { ErrorInfoSchema, RetryInfoSchema } from "../src/gen/google/rpc/error_details_pb.js";

import {
  decodeError,
  isLostAnswer,
  JournalUnavailableError,
  retryInterceptor,
  SERVICE_CONFIG,
  ServerOverloadedError,
  v1,
} from "../src/index.js";

test("a bare CANCELLED from a passed deadline is safe to repeat", () => {
  const error = decodeError(new ConnectError("Timeout expired", Code.Canceled));
  assert.ok(error instanceof JournalUnavailableError);
  assert.equal(error.reason, "");
  assert.ok(isLostAnswer(error));
});

test("a shed call is overloaded with its retry delay", () => {
  const shed = new ConnectError("busy", Code.ResourceExhausted, undefined, [
    {
      desc: ErrorInfoSchema,
      value: create(ErrorInfoSchema, {
        reason: "SERVER_OVERLOADED",
        domain: "opjournal.dev",
        metadata: { limit: "max_in_flight_requests" },
      }),
    },
    { desc: RetryInfoSchema, value: create(RetryInfoSchema, { retryDelay: { seconds: 1n, nanos: 0 } }) },
  ]);
  const error = decodeError(shed);
  assert.ok(error instanceof ServerOverloadedError);
  assert.ok(error instanceof JournalUnavailableError);
  assert.equal(error.retryDelayMs, 1000);
});

test("the shipped service config is the contract's", () => {
  const shipped: unknown = JSON.parse(
    readFileSync(new URL("../../../../proto/opjournal/v1/service_config.json", import.meta.url), "utf8"),
  );
  assert.deepEqual(SERVICE_CONFIG, shipped);
});

/** An in-memory OperationJournal whose GetOperation fails `failures` times with `code`. */
function flaky(failures: number, code: Code) {
  let attempts = 0;
  const transport = createRouterTransport(
    ({ service }) => {
      service(v1.OperationJournal, {
        getOperation() {
          attempts += 1;
          if (attempts <= failures) {
            throw new ConnectError("refused", code);
          }
          return {};
        },
      });
    },
    { transport: { interceptors: [retryInterceptor(SERVICE_CONFIG)] } },
  );
  return { client: createClient(v1.OperationJournal, transport), attempts: () => attempts };
}

test("UNAVAILABLE is repeated for an RPC the service config names", async () => {
  const { client, attempts } = flaky(1, Code.Unavailable);
  await client.getOperation({ operationKey: "payment:order-817:intent-01" });
  assert.equal(attempts(), 2);
});

test("repeats stop after maxAttempts", async () => {
  const { client, attempts } = flaky(10, Code.Unavailable);
  await assert.rejects(client.getOperation({ operationKey: "k" }), (e: unknown) => ConnectError.from(e).code === Code.Unavailable);
  assert.equal(attempts(), 4);
});

test("other codes are never repeated by the transport", async () => {
  const { client, attempts } = flaky(1, Code.Canceled);
  await assert.rejects(client.getOperation({ operationKey: "k" }));
  assert.equal(attempts(), 1);
});
