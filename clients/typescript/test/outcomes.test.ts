/**
 * How `execute` classifies each outcome of the provider call, against the real server and
 * sandbox: success, confirmed rejection, an uncertain 5xx, and the decisions that keep the
 * provider from being called (in progress, duplicate intent).
 */

import assert from "node:assert/strict";
import { after, test } from "node:test";

import {
  InvalidArgumentError,
  type Outcome,
  type ProviderCall,
  ProviderOutcomeUnknown,
  ProviderRejected,
  type ProviderResult,
  v1,
} from "../src/index.js";
import { connect, HttpError, PAY_817, Sandbox } from "./harness.js";

const client = connect();
const sandbox = new Sandbox();
after(() => client.close());

/** A provider call that classifies the sandbox's answers the way a real one would. */
function pay(fault?: string) {
  return async (call: ProviderCall): Promise<ProviderResult> => {
    try {
      const payment = await sandbox.pay(call.providerKey, PAY_817, { fault });
      return { externalId: payment.id, result: payment };
    } catch (error) {
      if (error instanceof HttpError && error.status === 402) {
        // A declined card: the provider stored nothing.
        throw new ProviderRejected("card_declined", { cause: error });
      }
      if (error instanceof HttpError) {
        // A 5xx proves nothing: the outcome is unknown, with a code of our own.
        throw new ProviderOutcomeUnknown(`http_${error.status}`, { cause: error });
      }
      throw error; // timeouts and anything else: unknown too
    }
  };
}

const intent = (operationKey: string, actionType = "create_payment") => ({
  operationKey,
  actionType,
  payload: PAY_817,
});

test("a confirmed success is completed and replayed", async () => {
  const key = "ts:outcomes:success";
  const done = await client.execute({ ...intent(key), references: { order_id: "817" } }, pay());
  assert.ok(done.kind === "succeeded" && !done.replayed);
  assert.equal(done.operation.status, v1.OperationStatus.SUCCEEDED);
  assert.equal(done.externalId, (done.providerResult as { id: string }).id);
  assert.equal((done.result as { amount_minor: number }).amount_minor, 490000);
  assert.deepEqual(done.operation.references, { order_id: "817" });

  const replay = await client.execute(intent(key), pay());
  assert.ok(replay.kind === "succeeded" && replay.replayed);
  assert.deepEqual([replay.externalId, replay.result], [done.externalId, done.result]);
  assert.deepEqual(await sandbox.effects(key), { requests: 1, effects: 1, lookups: 0 });
});

test("a confirmed rejection fails the operation for good", async () => {
  const key = "ts:outcomes:declined";
  const failed = await client.execute(intent(key), pay("reject"));
  assert.ok(failed.kind === "failed_final" && !failed.replayed);
  assert.equal(failed.errorCode, "card_declined");
  assert.ok(failed.cause instanceof ProviderRejected);
  assert.equal(failed.operation.status, v1.OperationStatus.FAILED_FINAL);

  const replay = await client.execute(intent(key), pay());
  assert.ok(replay.kind === "failed_final" && replay.replayed);
  assert.equal(replay.errorCode, "card_declined");
  assert.deepEqual(await sandbox.effects(key), { requests: 1, effects: 0, lookups: 0 });
});

test("a 5xx is unknown and runs again only after reconciliation proves absence", async () => {
  const key = "ts:outcomes:unavailable";
  const unknown = await client.execute(intent(key), pay("fail-before-store"));
  assert.ok(unknown.kind === "verification_required" && unknown.reported);
  assert.equal(unknown.errorCode, "http_503");
  assert.equal(unknown.operation.status, v1.OperationStatus.UNKNOWN);

  const blocked = await client.execute(intent(key), pay());
  assert.ok(blocked.kind === "verification_required" && !blocked.reported);
  assert.equal((await sandbox.effects(key)).requests, 1);

  // The sandbox's lookup is complete and the grace window is 0 s: absence is proof.
  const reconciled = await client.reconcile(key);
  assert.equal(reconciled.action, v1.ReconcileAction.RELEASED_FOR_RETRY);
  assert.equal(reconciled.operation?.status, v1.OperationStatus.PENDING);

  const retried = await client.execute(intent(key), pay());
  assert.ok(retried.kind === "succeeded" && !retried.replayed);
  assert.equal(retried.operation.attemptCount, 2);
  assert.deepEqual(await sandbox.effects(key), { requests: 2, effects: 1, lookups: 1 });
});

test("a begin while the lease is held is in progress and calls nothing", async () => {
  const key = "ts:outcomes:in-progress";
  const seen: Outcome[] = [];
  const done = await client.execute(intent(key), async (call) => {
    seen.push(await client.execute(intent(key), pay()));
    return pay()(call);
  });
  assert.equal(done.kind, "succeeded");
  assert.equal(seen.length, 1);
  const inner = seen[0];
  assert.ok(inner?.kind === "in_progress" && inner.retryAfterMs > 0);
  assert.equal((await sandbox.effects(key)).requests, 1);
});

test("the same request under a new key is held as a suspected duplicate", async () => {
  const first = await client.execute(intent("ts:outcomes:hold-1", "create_payment_hold"), pay());
  assert.equal(first.kind, "succeeded");
  const held = await client.execute(intent("ts:outcomes:hold-2", "create_payment_hold"), pay());
  assert.ok(held.kind === "duplicate_intent_suspected");
  assert.equal(held.duplicateOfOperationKey, "ts:outcomes:hold-1");
  assert.equal((await sandbox.effects("ts:outcomes:hold-2")).requests, 0);

  const confirmed = await client.execute(
    { ...intent("ts:outcomes:hold-2", "create_payment_hold"), confirmDuplicateIntent: true },
    pay(),
  );
  assert.equal(confirmed.kind, "succeeded");
  assert.equal((await sandbox.effects("ts:outcomes:hold-2")).effects, 1);
});

test("a malformed payload is an invalid argument with its reason", async () => {
  await assert.rejects(
    client.begin({
      operationKey: "ts:outcomes:bad-json",
      actionType: "create_payment",
      payload: '{"amount_minor": 1, "amount_minor": 2}',
    }),
    (error: unknown) => {
      assert.ok(error instanceof InvalidArgumentError);
      assert.equal(error.reason, "INVALID_PAYLOAD");
      assert.equal(error.metadata["rule"], "duplicate_member");
      return true;
    },
  );
});
