/**
 * Leases through the TypeScript client: a holder whose lease was taken over gets
 * `LeaseLostError` for its report and its renewal, `execute` renews the lease while a long
 * provider call runs, and stops waiting for a call that outlives its unrenewed lease. Uses `create_payment_dedup` (`on_timeout: retry_with_same_key`),
 * whose ended lease may be claimed again by a new holder.
 */

import assert from "node:assert/strict";
import { after, test } from "node:test";

import { Code } from "@connectrpc/connect";

import { LEASE_EXPIRED, LeaseExpiredError, LeaseLostError, type Outcome, v1 } from "../src/index.js";
import { connect, PAY_817, Sandbox, waitFor } from "./harness.js";

const client = connect();
const sandbox = new Sandbox();
after(() => client.close());

/** Begins until the first holder's 1 s lease has ended and a new lease is granted. */
function takeOver(key: string): Promise<v1.BeginOperationResponse> {
  return waitFor("the lease to be taken over", async () => {
    const begin = await client.begin({ operationKey: key, actionType: "create_payment_dedup", payload: PAY_817 });
    return begin.decision === v1.Decision.EXECUTE ? begin : undefined;
  });
}

function isLeaseLost(error: unknown): boolean {
  assert.ok(error instanceof LeaseLostError);
  assert.equal(error.code, Code.Aborted);
  assert.equal(error.reason, "LEASE_LOST");
  return true;
}

test("a stale holder gets LEASE_LOST for its report and its renewal", async () => {
  const key = "ts:leases:stale-holder";
  const first = await client.begin({
    operationKey: key,
    actionType: "create_payment_dedup",
    payload: PAY_817,
    leaseSeconds: 1,
  });
  assert.equal(first.decision, v1.Decision.EXECUTE);
  const second = await takeOver(key);
  assert.equal(second.operation?.attemptCount, 2);

  await assert.rejects(
    client.complete(first.leaseToken, { externalId: "pay_stale", result: { id: "pay_stale" } }),
    isLeaseLost,
  );
  await assert.rejects(client.renewLease(first.leaseToken, 30), isLeaseLost);
  await assert.rejects(client.reportUnknown(first.leaseToken, "timeout"), isLeaseLost);

  const payment = await sandbox.pay(second.operation?.providerKey ?? "", PAY_817);
  const done = await client.complete(second.leaseToken, { externalId: payment.id, result: payment });
  assert.equal(done.status, v1.OperationStatus.SUCCEEDED);
  assert.equal(done.externalId, payment.id);
});

test("a call that outlives its unrenewed lease is cut off and recorded unknown", async () => {
  const key = "ts:leases:taken-over";
  let stalled: Promise<v1.BeginOperationResponse> | undefined;
  let signal: AbortSignal | undefined;
  let remainingAtStart = -1;
  const outcome = await client.execute(
    { operationKey: key, actionType: "create_payment_dedup", payload: PAY_817, leaseSeconds: 1 },
    async (call) => {
      signal = call.signal;
      remainingAtStart = call.leaseRemainingMs();
      const payment = await sandbox.pay(call.providerKey, PAY_817);
      // Stalls past its lease (no renewal) until another worker holds a new one.
      stalled = takeOver(key);
      await stalled;
      return { externalId: payment.id, result: payment };
    },
    { renewLease: false },
  );
  // execute stopped waiting when the lease ended, and recorded the outcome unknown.
  assert.equal(outcome.kind, "verification_required");
  assert.ok(outcome.kind === "verification_required" && outcome.reported);
  assert.equal(outcome.errorCode, LEASE_EXPIRED);
  assert.ok(remainingAtStart > 0 && remainingAtStart <= 1000, `${remainingAtStart}`);
  assert.ok(signal?.aborted && signal.reason instanceof LeaseExpiredError);

  // The new holder calls the provider with the same key: the provider deduplicates.
  assert.ok(stalled);
  const second = await stalled;
  assert.equal(second.operation?.attemptCount, 2);
  const payment = await sandbox.pay(second.operation?.providerKey ?? "", PAY_817);
  await client.complete(second.leaseToken, { externalId: payment.id, result: payment });
  assert.deepEqual(await sandbox.effects(key), { requests: 2, effects: 1, lookups: 0 });
});

test("execute renews the lease while a long call runs", async () => {
  const key = "ts:leases:renewed";
  const intent = { operationKey: key, actionType: "create_payment", payload: PAY_817 };
  let inner: Outcome | undefined;
  const done = await client.execute({ ...intent, leaseSeconds: 3 }, async (call) => {
    const granted = call.operation.leaseUntil?.seconds ?? 0n;
    const grantedNanos = call.operation.leaseUntil?.nanos ?? 0;
    // Renewal happens every third of the 3 s lease; wait until the journal shows it.
    await waitFor("a lease renewal", async () => {
      const until = (await client.get(key)).leaseUntil;
      const later = until !== undefined && (until.seconds > granted || (until.seconds === granted && until.nanos > grantedNanos));
      return later ? true : undefined;
    });
    inner = await client.execute(intent, async () => {
      throw new Error("must not be called while the lease is held");
    });
    assert.equal(call.signal.aborted, false);
    const payment = await sandbox.pay(call.providerKey, PAY_817);
    return { externalId: payment.id, result: payment };
  });
  assert.ok(done.kind === "succeeded");
  assert.equal(done.operation.attemptCount, 1);
  assert.equal(inner?.kind, "in_progress");
});
