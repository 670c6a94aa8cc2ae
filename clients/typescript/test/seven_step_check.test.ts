/**
 * The source article's reproducible check through `execute` and `JournalClient`: the
 * provider's answer is lost after it stored the payment, and the journal still ends with
 * exactly one effect. `tests/it/typescript_client.rs` then checks the rows and counts from Rust.
 */

import assert from "node:assert/strict";
import { after, test } from "node:test";

import { Code } from "@connectrpc/connect";

import { IdempotencyKeyReusedError, type ProviderCall, type ProviderResult, v1 } from "../src/index.js";
import { connect, PAY_817, PAY_817_OTHER_AMOUNT, Sandbox } from "./harness.js";

const KEY = "payment:order-817:intent-01";
const client = connect();
const sandbox = new Sandbox();
after(() => client.close());

test("the seven-step check ends with exactly one effect", async () => {
  const providerKeys: string[] = [];
  const payAndLoseTheAnswer = async (call: ProviderCall): Promise<ProviderResult> => {
    providerKeys.push(call.providerKey);
    // The sandbox stores the payment, then answers only after the client gave up.
    await sandbox.pay(call.providerKey, PAY_817, { fault: "commit-then-timeout", timeoutMs: 400 });
    throw new Error("the sandbox answered a commit-then-timeout request in time");
  };
  const intent = { operationKey: KEY, actionType: "create_payment", payload: PAY_817 };

  // 1-3. A new key; Begin grants the lease; the provider call times out after the effect
  // happened, and the helper reports the outcome unknown instead of failing it.
  const lost = await client.execute(intent, payAndLoseTheAnswer);
  assert.equal(lost.kind, "verification_required");
  assert.ok(lost.kind === "verification_required" && lost.reported);
  assert.equal(lost.errorCode, "timeout");
  assert.equal(lost.operation.status, v1.OperationStatus.UNKNOWN);
  assert.deepEqual(providerKeys, [KEY], "called once, with operation.providerKey");
  assert.equal((await sandbox.effects(KEY)).effects, 1);

  // 4. The same intent again: verify first, the provider is not called.
  const again = await client.execute(intent, payAndLoseTheAnswer);
  assert.ok(again.kind === "verification_required" && !again.reported);
  assert.deepEqual(providerKeys, [KEY]);
  assert.equal((await sandbox.effects(KEY)).requests, 1);

  // 5. Reconcile: the provider adapter finds the payment by its key.
  const reconciled = await client.reconcile(KEY);
  assert.equal(reconciled.action, v1.ReconcileAction.MARKED_SUCCEEDED);
  assert.equal(reconciled.observation?.outcome, v1.ObservationOutcome.SUCCEEDED);
  assert.equal(reconciled.operation?.status, v1.OperationStatus.SUCCEEDED);

  // 6. Begin replays the stored outcome; exactly one effect at the provider.
  const replay = await client.execute(intent, payAndLoseTheAnswer);
  assert.ok(replay.kind === "succeeded" && replay.replayed);
  assert.match(replay.externalId ?? "", /^pay_/);
  assert.equal(replay.externalId, reconciled.operation?.externalId);
  const result = replay.result as { id: string; amount_minor: number };
  assert.equal(result.id, replay.externalId);
  assert.equal(result.amount_minor, 490000);
  assert.equal(replay.providerResult, undefined);

  // 7. The same key with another amount is refused as a typed error; nothing is called.
  await assert.rejects(
    client.execute({ ...intent, payload: PAY_817_OTHER_AMOUNT }, payAndLoseTheAnswer),
    (error: unknown) => {
      assert.ok(error instanceof IdempotencyKeyReusedError);
      assert.equal(error.code, Code.AlreadyExists);
      assert.equal(error.reason, "IDEMPOTENCY_KEY_REUSED");
      assert.equal(error.domain, "opjournal.dev");
      return true;
    },
  );
  assert.deepEqual(providerKeys, [KEY]);
  const counts = await sandbox.effects(KEY);
  assert.deepEqual([counts.requests, counts.effects], [1, 1]);
});
