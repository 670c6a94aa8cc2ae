/**
 * Runs every scenario of `clients/scenarios.yaml` (the behaviour every client's execute
 * must show; read its header) through this client's {@link execute}, and checks each
 * step's `expect` and the scenario's `final` rows and provider counts.
 *
 * Environment (set by `tests/it/client_scenarios.rs`): `OPJOURNAL_TEST_SERVER` (host:port),
 * `OPJOURNAL_TEST_SANDBOX_URL`, `OPJOURNAL_TEST_CONTROL_URL`, `OPJOURNAL_SCENARIO_PREFIX`;
 * `OPJOURNAL_SCENARIOS_FILE` names another scenario file.
 */

import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { after, test } from "node:test";

import { parse } from "yaml";

import {
  IdempotencyKeyReusedError,
  LeaseExpiredBeforeCallError,
  LeaseLostError,
  OperationNotFoundError,
  ProviderRejected,
  v1,
  type ExecuteOptions,
  type Outcome,
  type ProviderCall,
  type ProviderResult,
} from "../src/index.js";
import { connect, Sandbox } from "./harness.js";

interface Step {
  execute?: {
    key?: string;
    action_type?: string;
    payload?: Record<string, unknown>;
    payload_patch?: Record<string, unknown>;
    provider: string;
    in_progress_wait_ms?: number;
    settle_wait_ms?: number;
    lease_seconds?: number;
  };
  expect?: {
    outcome: string;
    replayed?: boolean;
    reported?: boolean;
    error_code?: string;
    external_id_from_provider?: boolean;
    duplicate_of?: string;
  };
  control?: { path: string; body: Record<string, unknown> };
}

interface Final {
  row?: "none";
  status?: string;
  attempt_count?: number;
  error_code?: string;
  requests?: number;
  effects?: number;
  /** Checked by the harness (the relay's count), not by this runner. */
  begin_answers_lost?: number;
}

interface Scenario {
  name: string;
  about: string;
  steps: Step[];
  final: Record<string, Final>;
}

interface ScenarioFile {
  version: number;
  defaults: { action_type: string; payload: Record<string, unknown> };
  scenarios: Scenario[];
}

function env(name: string): string {
  const value = process.env[name];
  if (!value) {
    throw new Error(`${name} is not set: run the scenarios through tests/it/client_scenarios.rs`);
  }
  return value;
}

const file = process.env.OPJOURNAL_SCENARIOS_FILE ?? new URL("../../../scenarios.yaml", import.meta.url);
const spec = parse(readFileSync(file, "utf8")) as ScenarioFile;
assert.equal(spec.version, 1, "this runner reads version 1 of the scenario file");

const prefix = env("OPJOURNAL_SCENARIO_PREFIX");
const controlUrl = env("OPJOURNAL_TEST_CONTROL_URL").replace(/\/$/, "");
const sandbox = new Sandbox();
const client = connect();
after(() => client.close());

/** The sandbox's answer to a refused or failed payment, as an ordinary HTTP client throws it. */
class HttpStatusError extends Error {
  constructor(readonly status: number) {
    super(`HTTP ${status}`);
    this.name = "HttpStatusError";
  }
}

async function control(path: string, body: Record<string, unknown>): Promise<void> {
  const response = await fetch(`${controlUrl}/${path}`, {
    method: "POST",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify(body),
  });
  await response.arrayBuffer();
  assert.equal(response.status, 200, `control ${path} answered ${response.status}`);
}

/** One scenario's keys, payloads and what its provider calls returned. */
class Run {
  /** The payment id the provider returned, per step key. */
  readonly paidIds = new Map<string, string>();
  readonly payload: Record<string, unknown>;

  constructor(readonly scenario: Scenario) {
    this.payload = { ...spec.defaults.payload, run: `${prefix}:${scenario.name}` };
  }

  key(stepKey = "main"): string {
    return `${prefix}:${this.scenario.name}:${stepKey}`;
  }

  /** The provider function for a behaviour of the file's header. */
  provider(
    behaviour: string,
    stepKey: string,
    actionType: string,
    payload: Record<string, unknown>,
  ): (call: ProviderCall) => Promise<ProviderResult> {
    return async (call) => {
      if (behaviour === "none") {
        throw new assert.AssertionError({ message: "the provider must not be called in this step" });
      }
      if (behaviour === "raise") {
        throw new Error("an error the classifier does not know");
      }
      const fault = ["commit-then-timeout", "fail-before-store", "reject"].includes(behaviour)
        ? behaviour
        : undefined;
      const headers: Record<string, string> = {
        "Idempotency-Key": call.providerKey,
        "Content-Type": "application/json",
      };
      if (fault) {
        headers["X-Sandbox-Fault"] = fault;
      }
      const response = await fetch(`${sandbox.baseUrl}/v1/payments`, {
        method: "POST",
        headers,
        body: JSON.stringify(payload),
        signal: AbortSignal.any([call.signal, AbortSignal.timeout(1000)]),
      });
      if (response.status === 402) {
        await response.arrayBuffer();
        throw new ProviderRejected("card_declined");
      }
      if (!response.ok) {
        await response.arrayBuffer();
        throw new HttpStatusError(response.status);
      }
      const payment = (await response.json()) as { id: string };
      this.paidIds.set(stepKey, payment.id);
      if (behaviour === "restart_journal") {
        await control("journal/restart", { down_ms: 1500 });
      } else if (behaviour === "takeover") {
        await control("lease/takeover", { operation_key: this.key(stepKey), action_type: actionType, payload });
      } else {
        assert.equal(behaviour, "ok", `unknown provider behaviour ${behaviour}`);
      }
      return { externalId: payment.id, result: payment };
    };
  }

  async control(step: NonNullable<Step["control"]>): Promise<void> {
    const { key, ...rest } = step.body;
    const body: Record<string, unknown> = {
      action_type: spec.defaults.action_type,
      payload: this.payload,
      ...rest,
    };
    if (typeof key === "string") {
      body.operation_key = this.key(key);
    }
    await control(step.path, body);
  }

  async execute(step: NonNullable<Step["execute"]>, expect: NonNullable<Step["expect"]>): Promise<void> {
    const stepKey = step.key ?? "main";
    const actionType = step.action_type ?? spec.defaults.action_type;
    const payload = { ...(step.payload ?? this.payload), ...(step.payload_patch ?? {}) };
    if (step.payload !== undefined) {
      payload.run = this.payload.run;
    }
    const options: ExecuteOptions = {
      inProgressWaitMs: step.in_progress_wait_ms ?? 0,
      settleWaitMs: step.settle_wait_ms ?? 0,
    };
    const request = {
      operationKey: this.key(stepKey),
      actionType,
      payload,
      leaseSeconds: step.lease_seconds ?? 0,
    };
    let outcome: Outcome | "conflict" | "lease_lost" | "lease_expired";
    try {
      outcome = await client.execute(request, this.provider(step.provider, stepKey, actionType, payload), options);
    } catch (error) {
      if (error instanceof IdempotencyKeyReusedError) {
        outcome = "conflict";
      } else if (error instanceof LeaseLostError) {
        outcome = "lease_lost";
      } else if (error instanceof LeaseExpiredBeforeCallError) {
        outcome = "lease_expired";
      } else {
        throw error;
      }
    }
    if (typeof outcome === "string") {
      assert.equal(outcome, expect.outcome);
      return;
    }
    if (outcome.kind === "verification_required" && outcome.cause instanceof assert.AssertionError) {
      throw outcome.cause; // the provider was called in a step that must not call it
    }
    assert.equal(outcome.kind, expect.outcome);
    this.check(outcome, expect, stepKey);
  }

  private check(outcome: Outcome, expect: NonNullable<Step["expect"]>, stepKey: string): void {
    if (expect.replayed !== undefined) {
      assert.ok(outcome.kind === "succeeded" || outcome.kind === "failed_final");
      assert.equal(outcome.replayed, expect.replayed, "replayed");
    }
    if (expect.reported !== undefined) {
      assert.ok(outcome.kind === "verification_required");
      assert.equal(outcome.reported, expect.reported, "reported");
    }
    if (expect.error_code !== undefined) {
      assert.ok(outcome.kind === "failed_final" || outcome.kind === "verification_required");
      assert.equal(outcome.errorCode, expect.error_code, "error_code");
    }
    if (expect.external_id_from_provider) {
      assert.ok(outcome.kind === "succeeded");
      const paid = this.paidIds.get(stepKey);
      assert.ok(paid, "the provider returned a payment id in an earlier step");
      assert.equal(outcome.externalId, paid, "external id");
    }
    if (expect.duplicate_of !== undefined) {
      assert.ok(outcome.kind === "duplicate_intent_suspected");
      assert.equal(outcome.duplicateOfOperationKey, this.key(expect.duplicate_of));
    }
  }

  async checkFinal(): Promise<void> {
    for (const [stepKey, want] of Object.entries(this.scenario.final)) {
      const key = this.key(stepKey);
      if (want.row === "none") {
        await assert.rejects(client.get(key), OperationNotFoundError, `no row for ${stepKey}`);
      } else {
        const row = await client.get(key);
        if (want.status !== undefined) {
          assert.equal(v1.OperationStatus[row.status].toLowerCase(), want.status, `${stepKey} status`);
        }
        if (want.attempt_count !== undefined) {
          assert.equal(row.attemptCount, want.attempt_count, `${stepKey} attempt_count`);
        }
        if (want.error_code !== undefined) {
          assert.equal(row.errorCode, want.error_code, `${stepKey} error_code`);
        }
      }
      const counts = await sandbox.effects(key);
      if (want.requests !== undefined) {
        assert.equal(counts.requests, want.requests, `${stepKey} provider requests`);
      }
      if (want.effects !== undefined) {
        assert.equal(counts.effects, want.effects, `${stepKey} provider effects`);
      }
    }
  }
}

for (const scenario of spec.scenarios) {
  test(`${scenario.name}: ${scenario.about}`, async () => {
    const run = new Run(scenario);
    for (const [index, step] of scenario.steps.entries()) {
      if (step.control) {
        await run.control(step.control);
      }
      if (step.execute) {
        assert.ok(step.expect, `step ${index + 1} of ${scenario.name} has no expect`);
        await run.execute(step.execute, step.expect);
      }
    }
    await run.checkFinal();
  });
}
