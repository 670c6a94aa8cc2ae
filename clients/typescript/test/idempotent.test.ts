/**
 * `idempotent()` against the real server and sandbox: a wrapped function runs once per
 * key, its errors are classified, the other outcomes are typed errors (or outcome objects),
 * the waits end with another holder's or the reconciler's result, and a lease that ends
 * reaches the function as an aborted signal. `tests/it/typescript_client.rs` checks the rows and the
 * provider's counts afterwards.
 */

import assert from "node:assert/strict";
import { after, test } from "node:test";

import {
  type Classification,
  currentCall,
  DuplicateIntentSuspectedError,
  FailedFinalError,
  IdempotencyKeyReusedError,
  idempotent,
  InProgressError,
  LEASE_EXPIRED,
  LeaseExpiredError,
  summarizeOutcome,
  VerificationRequiredError,
  v1,
} from "../src/index.js";
import { connect, HttpError, PAY_817, Sandbox, waitFor } from "./harness.js";

const journal = connect();
const sandbox = new Sandbox();
after(() => journal.close());

interface Order {
  order_id: string;
  amount_minor: number;
  currency: string;
}

type Payment = { id: string; status: string } & Record<string, unknown>;

/** A payment function, counting its calls; `fault` is sent to the sandbox. */
function paymentFunction(fault?: string): { calls: () => number; pay: (order: Order) => Promise<Payment> } {
  let calls = 0;
  return {
    calls: () => calls,
    pay: async (order) => {
      calls += 1;
      return (await sandbox.pay(currentCall().providerKey, order, { fault, timeoutMs: 1000 })) as Payment;
    },
  };
}

test("a wrapped function runs once per key and a repeat gets the same payment", async () => {
  const provider = paymentFunction();
  const createPayment = idempotent(provider.pay, {
    journal,
    actionType: "create_payment",
    key: (order) => `ts:idem:order-${order.order_id}`,
    payload: (order) => order,
    externalId: (payment) => payment.id,
  });
  const order = { ...PAY_817, order_id: "idem-1" };

  const first = await createPayment(order);
  const again = await createPayment(order);
  assert.equal(provider.calls(), 1);
  assert.equal(again.id, first.id);
  assert.equal(again.status, "succeeded");

  const outcome = await createPayment.outcome(order);
  assert.ok(outcome.kind === "succeeded");
  assert.equal(outcome.replayed, true);
  assert.equal(outcome.externalId, first.id);
  assert.equal(provider.calls(), 1);
  const summary = JSON.parse(JSON.stringify(summarizeOutcome(outcome)));
  assert.deepEqual(
    { ...summary, result: undefined },
    {
      outcome: "succeeded",
      replayed: true,
      external_id: first.id,
      result: undefined,
      operation_key: "ts:idem:order-idem-1",
      namespace: "default",
      status: "succeeded",
      attempt_count: 1,
    },
  );

  // The same key with another amount: a conflict, and the function is not called.
  await assert.rejects(createPayment({ ...order, amount_minor: 1 }), IdempotencyKeyReusedError);
  assert.equal(provider.calls(), 1);
  assert.deepEqual(await sandbox.effects("ts:idem:order-idem-1"), { requests: 1, effects: 1, lookups: 0 });
});

test("the payload may leave out arguments that do not define the intent", async () => {
  const provider = paymentFunction();
  const createPayment = idempotent((order: Order, _traceId: string) => provider.pay(order), {
    journal,
    actionType: "create_payment",
    key: "ts:idem:run-7:payment", // from the orchestrator's run, not from the arguments
    payload: (order) => order,
  });
  const order = { ...PAY_817, order_id: "idem-2" };
  const first = await createPayment(order, "trace-a");
  const second = await createPayment(order, "trace-b");
  assert.equal(second.id, first.id);
  assert.equal(provider.calls(), 1);
});

test("a confirmed rejection from the classifier is FailedFinalError, now and on a replay", async () => {
  const provider = paymentFunction("reject");
  const createPayment = idempotent(provider.pay, {
    journal,
    actionType: "create_payment",
    key: "ts:idem:declined",
    classify: (error) =>
      error instanceof HttpError && error.status === 402 ? { rejected: "card_declined" } : undefined,
  });
  const order = { ...PAY_817, order_id: "idem-3" };
  await assert.rejects(createPayment(order), (error: unknown) => {
    assert.ok(error instanceof FailedFinalError);
    assert.equal(error.errorCode, "card_declined");
    assert.equal(error.replayed, false);
    assert.ok(error.cause instanceof HttpError);
    return true;
  });
  await assert.rejects(createPayment(order), (error: unknown) => {
    assert.ok(error instanceof FailedFinalError);
    assert.equal(error.replayed, true);
    assert.equal(error.toJSON().outcome, "failed_final");
    return true;
  });
  assert.equal(provider.calls(), 1);
});

test("anything else is an unknown outcome: VerificationRequiredError, and no second call", async () => {
  let calls = 0;
  const sendEmail = idempotent(
    async (_to: string) => {
      calls += 1;
      throw new Error("an error no classifier knows");
    },
    { journal, actionType: "create_payment", key: "ts:idem:unexpected" },
  );
  await assert.rejects(sendEmail("someone"), (error: unknown) => {
    assert.ok(error instanceof VerificationRequiredError);
    assert.equal(error.reported, true);
    assert.equal(error.errorCode, "exception");
    assert.match(error.message, /^verification required/);
    return true;
  });
  const outcome = await sendEmail.outcome("someone");
  assert.ok(outcome.kind === "verification_required");
  assert.equal(outcome.reported, false);
  assert.equal(calls, 1);

  // An HTTP 5xx from the provider: unknown with the status as its code.
  const provider = paymentFunction("fail-before-store");
  const createPayment = idempotent(provider.pay, { journal, actionType: "create_payment", key: "ts:idem:http-503" });
  await assert.rejects(createPayment({ ...PAY_817, order_id: "idem-4" }), (error: unknown) => {
    assert.ok(error instanceof VerificationRequiredError);
    assert.equal(error.errorCode, "http_503");
    return true;
  });
});

test("returns: 'outcome' answers every decision as an outcome object", async () => {
  const provider = paymentFunction("reject");
  const createPayment = idempotent(provider.pay, {
    journal,
    actionType: "create_payment",
    key: "ts:idem:outcome-mode",
    returns: "outcome",
    classify: (error) => (error instanceof HttpError && error.status === 402 ? { rejected: "card_declined" } : undefined),
  });
  const outcome = await createPayment({ ...PAY_817, order_id: "idem-5" });
  assert.equal(outcome.kind, "failed_final");
});

test("currentCall() outside a wrapped function throws", () => {
  assert.throws(() => currentCall(), /only available inside/);
});

test("another holder's lease is InProgressError, and a wait ends with its result", async () => {
  const key = "ts:idem:held";
  const order = { ...PAY_817, order_id: "idem-6" };
  const held = await journal.begin({ operationKey: key, actionType: "create_payment", payload: order });
  assert.equal(held.decision, v1.Decision.EXECUTE);

  const provider = paymentFunction();
  const options = { journal, actionType: "create_payment", key, payload: (o: Order) => o };
  await assert.rejects(idempotent(provider.pay, options)(order), (error: unknown) => {
    assert.ok(error instanceof InProgressError);
    assert.ok(error.retryAfterMs > 0);
    return true;
  });

  // The holder finishes after 300 ms; a caller that waits gets its payment.
  setTimeout(async () => {
    const payment = await sandbox.pay(held.operation?.providerKey ?? "", order);
    await journal.complete(held.leaseToken, { externalId: payment.id, result: payment });
  }, 300);
  const waited = await idempotent(provider.pay, { ...options, inProgressWaitMs: 15_000 })(order);
  assert.equal(waited.status, "succeeded");
  assert.equal(provider.calls(), 0);
  assert.deepEqual(await sandbox.effects(key), { requests: 1, effects: 1, lookups: 0 });
});

test("settleWaitMs waits for the reconciler to settle a lost answer", async () => {
  const key = "ts:idem:settled";
  const provider = paymentFunction("commit-then-timeout");
  const options = { journal, actionType: "create_payment", key, payload: (o: Order) => o };
  const order = { ...PAY_817, order_id: "idem-7" };
  await assert.rejects(idempotent(provider.pay, options)(order), VerificationRequiredError);

  setTimeout(() => void journal.reconcile(key), 300);
  const settled = await idempotent(provider.pay, { ...options, settleWaitMs: 15_000 })(order);
  assert.equal(settled.status, "succeeded");
  assert.equal(provider.calls(), 1);
});

test("a duplicate intent under a new key is DuplicateIntentSuspectedError", async () => {
  const provider = paymentFunction();
  const order = { ...PAY_817, order_id: "idem-8" };
  const options = { journal, actionType: "create_payment_hold", payload: (o: Order) => o };
  await idempotent(provider.pay, { ...options, key: "ts:idem:hold-1" })(order);
  await assert.rejects(idempotent(provider.pay, { ...options, key: "ts:idem:hold-2" })(order), (error: unknown) => {
    assert.ok(error instanceof DuplicateIntentSuspectedError);
    assert.equal(error.duplicateOfOperationKey, "ts:idem:hold-1");
    return true;
  });
  assert.equal(provider.calls(), 1);
});

test("a lease that ends during the call aborts currentCall().signal and is recorded lease_expired", async () => {
  let aborted: unknown;
  const slow = idempotent(
    async () => {
      const call = currentCall();
      // Block the event loop past the 1 s lease: no renewal can run, the lease ends.
      const until = Date.now() + 1500;
      while (Date.now() < until) {
        // busy
      }
      await waitFor("the signal to say the lease ended", async () => (call.signal.aborted ? true : undefined), 10);
      aborted = call.signal.reason;
      throw aborted;
    },
    { journal, actionType: "create_payment_dedup", key: "ts:idem:lease-lost", leaseSeconds: 1 },
  );
  // The call is not awaited past its lease; nobody took the lease over, so the journal
  // still takes this holder's report: unknown.
  await assert.rejects(slow(), (error: unknown) => {
    assert.ok(error instanceof VerificationRequiredError);
    assert.equal(error.errorCode, LEASE_EXPIRED);
    return true;
  });
  await waitFor("the function to see its signal", async () => (aborted === undefined ? undefined : true), 10);
  assert.ok(aborted instanceof LeaseExpiredError);
});

test("a classifier that throws or names a malformed code is an unknown outcome at once", async () => {
  const cases: [string, (error: unknown) => Classification | undefined, string][] = [
    ["classify-throws", () => {
      throw new Error("a broken hook");
    }, "classifier_failed"],
    ["classify-bad-rejection", () => ({ rejected: "card declined!" }), "invalid_error_code"],
    ["classify-bad-unknown", () => ({ unknown: "" }), "invalid_error_code"],
    ["classify-not-a-verdict", () => ({ rejected: 402 }) as unknown as Classification, "invalid_error_code"],
  ];
  for (const [name, classify, code] of cases) {
    const key = `ts:idem:${name}`;
    let calls = 0;
    const pay = idempotent(
      async (order: Order) => {
        calls += 1;
        // The provider took the payment; then something failed on the way back.
        await sandbox.pay(currentCall().providerKey, order);
        throw new Error("the answer was lost");
      },
      { journal, actionType: "create_payment", key, classify },
    );
    const order = { ...PAY_817, order_id: name };
    await assert.rejects(pay(order), (error: unknown) => {
      assert.ok(error instanceof VerificationRequiredError, `${name}: ${String(error)}`);
      assert.equal(error.reported, true);
      assert.equal(error.errorCode, code, name);
      return true;
    });
    // Recorded now, not left in progress until the lease expires; not called again.
    const row = await journal.get(key);
    assert.equal(row.status, v1.OperationStatus.UNKNOWN, name);
    assert.equal(row.errorCode, code, name);
    const again = await pay.outcome(order);
    assert.equal(again.kind, "verification_required", name);
    assert.equal(calls, 1, name);
    assert.deepEqual(await sandbox.effects(key), { requests: 1, effects: 1, lookups: 0 }, name);
  }
});

test("a caller that cancels the provider call gets verification required; one that stops waiting leaves it to finish", async () => {
  // The caller's signal combined with the lease's, as the README shows: the payment is
  // taken, the answer never comes, the caller aborts.
  const caller = new AbortController();
  let calls = 0;
  const pay = idempotent(
    async (order: Order) => {
      calls += 1;
      const call = currentCall();
      const response = await fetch(`${sandbox.baseUrl}/v1/payments`, {
        method: "POST",
        headers: {
          "Idempotency-Key": call.providerKey,
          "Content-Type": "application/json",
          "X-Sandbox-Fault": "commit-then-timeout",
        },
        body: JSON.stringify(order),
        signal: AbortSignal.any([call.signal, caller.signal]),
      });
      return response.json();
    },
    { journal, actionType: "create_payment", key: "ts:idem:cancelled" },
  );
  const order = { ...PAY_817, order_id: "idem-cancelled" };
  setTimeout(() => caller.abort(), 300);
  await assert.rejects(pay(order), (error: unknown) => {
    assert.ok(error instanceof VerificationRequiredError, String(error));
    assert.equal(error.errorCode, "exception");
    assert.equal((error.cause as Error).name, "AbortError");
    return true;
  });
  assert.equal((await pay.outcome(order)).kind, "verification_required");
  assert.equal(calls, 1);

  // A caller that only stops waiting does not stop the call: it finishes and is recorded.
  let finished = false;
  const slow = idempotent(
    async (o: Order) => {
      await new Promise((resolve) => setTimeout(resolve, 300));
      const payment = await sandbox.pay(currentCall().providerKey, o);
      finished = true;
      return payment;
    },
    { journal, actionType: "create_payment", key: "ts:idem:abandoned" },
  );
  const abandoned = { ...PAY_817, order_id: "idem-abandoned" };
  const raced = await Promise.race([slow(abandoned), new Promise((resolve) => setTimeout(() => resolve("gave up"), 50))]);
  assert.equal(raced, "gave up");
  await waitFor("the abandoned call to be recorded", async () => {
    const row = await journal.get("ts:idem:abandoned");
    return row.status === v1.OperationStatus.SUCCEEDED ? true : undefined;
  }, 10);
  assert.ok(finished);
  const replayed = await slow.outcome(abandoned);
  assert.ok(replayed.kind === "succeeded" && replayed.replayed, replayed.kind);
});
