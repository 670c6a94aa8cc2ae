/**
 * Bearer tokens and namespaces through the TypeScript client, against a server that
 * requires tokens (`tests/it/typescript_client.rs` starts it knowing only
 * `OPJOURNAL_TEST_TOKEN`, a `client` of the namespace `tenant-a`).
 */

import assert from "node:assert/strict";
import { after, test } from "node:test";

import { Code } from "@connectrpc/connect";

import {
  JournalClient,
  PermissionDeniedError,
  type ProviderCall,
  type ProviderResult,
  UnauthenticatedError,
} from "../src/index.js";
import { connect, PAY_817, Sandbox } from "./harness.js";

const KEY = "ts:auth:payment";
const server = `http://${process.env["OPJOURNAL_TEST_SERVER"]}`;
const anonymous = connect();
const tenantA = JournalClient.connect(server, { token: process.env["OPJOURNAL_TEST_TOKEN"] ?? "" });
const wrong = JournalClient.connect(server, { token: "tok-wrong.0000" });
const sandbox = new Sandbox();
after(() => [anonymous, tenantA, wrong].forEach((client) => client.close()));

const intent = (namespace: string) => ({
  operationKey: KEY,
  actionType: "create_payment",
  payload: PAY_817,
  namespace,
});

test("a call without a token is unauthenticated", async () => {
  await assert.rejects(anonymous.begin(intent("tenant-a")), (error: unknown) => {
    assert.ok(error instanceof UnauthenticatedError);
    assert.equal(error.code, Code.Unauthenticated);
    assert.equal(error.reason, "MISSING_CREDENTIALS");
    return true;
  });
});

test("a wrong token is unauthenticated", async () => {
  await assert.rejects(wrong.begin(intent("tenant-a")), (error: unknown) => {
    assert.ok(error instanceof UnauthenticatedError);
    assert.equal(error.reason, "INVALID_CREDENTIALS");
    return true;
  });
});

test("the token reaches its namespace and no other", async () => {
  const providerKeys: string[] = [];
  const pay = async (call: ProviderCall): Promise<ProviderResult> => {
    providerKeys.push(call.providerKey);
    const payment = await sandbox.pay(call.providerKey, PAY_817);
    return { externalId: payment.id, result: payment };
  };
  const done = await tenantA.execute(intent("tenant-a"), pay);
  assert.equal(done.kind, "succeeded");
  assert.equal(done.operation?.namespace, "tenant-a");
  assert.deepEqual(providerKeys, [`tenant-a/${KEY}`], "the provider key carries the namespace");

  await assert.rejects(tenantA.execute(intent("tenant-b"), pay), (error: unknown) => {
    assert.ok(error instanceof PermissionDeniedError);
    assert.equal(error.reason, "NAMESPACE_NOT_ALLOWED");
    return true;
  });
  assert.equal(providerKeys.length, 1);
});
