/**
 * Helpers for the tests that run against a real opjournal server and sandbox provider.
 *
 * The Rust integration tests `tests/it/typescript_client.rs` start both on port 0 over a fresh
 * Postgres database and run these files with `node --test`, passing their addresses in
 * `OPJOURNAL_TEST_SERVER` (`host:port`) and `OPJOURNAL_TEST_SANDBOX_URL`; afterwards they
 * check the journal rows and the provider's effect counts themselves. The server's test
 * policy (`tests/it/common/mod.rs`) defines the action types used here.
 */

import { JournalClient } from "../src/index.js";

/** The source article's payment, and the same key's payload with another amount. */
export const PAY_817 = { order_id: "817", amount_minor: 490000, currency: "RUB" };
export const PAY_817_OTHER_AMOUNT = { order_id: "817", amount_minor: 590000, currency: "RUB" };

function requiredEnv(name: string): string {
  const value = process.env[name];
  if (!value) {
    throw new Error(
      `${name} is not set: these tests need a running opjournal server and sandbox; ` +
        "run them through `cargo test --test typescript_client` (./scripts/test)",
    );
  }
  return value;
}

/** A client of the server under test; close it in `after()`. */
export function connect(): JournalClient {
  return JournalClient.connect(`http://${requiredEnv("OPJOURNAL_TEST_SERVER")}`);
}

/** The sandbox's answer to a refused payment. */
export class HttpError extends Error {
  constructor(readonly status: number) {
    super(`HTTP ${status}`);
    this.name = "HttpError";
  }
}

/** Provider-side counts for one key (GET /v1/effects/{key}). */
export interface Counts {
  requests: number;
  effects: number;
  lookups: number;
}

/** The sandbox payment provider (docs/sandbox.md), called the way an orchestrator would. */
export class Sandbox {
  readonly baseUrl = requiredEnv("OPJOURNAL_TEST_SANDBOX_URL").replace(/\/$/, "");

  /** POST /v1/payments; rejects with a TimeoutError or an {@link HttpError}. */
  async pay(
    idempotencyKey: string,
    body: unknown,
    options: { fault?: string; timeoutMs?: number } = {},
  ): Promise<{ id: string } & Record<string, unknown>> {
    const headers: Record<string, string> = {
      "Idempotency-Key": idempotencyKey,
      "Content-Type": "application/json",
    };
    if (options.fault) {
      headers["X-Sandbox-Fault"] = options.fault;
    }
    const response = await fetch(`${this.baseUrl}/v1/payments`, {
      method: "POST",
      headers,
      body: JSON.stringify(body),
      signal: AbortSignal.timeout(options.timeoutMs ?? 5000),
    });
    if (!response.ok) {
      throw new HttpError(response.status);
    }
    return (await response.json()) as { id: string };
  }

  async effects(key: string): Promise<Counts> {
    const response = await fetch(`${this.baseUrl}/v1/effects/${encodeURIComponent(key)}`);
    const counts = (await response.json()) as Counts;
    return { requests: counts.requests, effects: counts.effects, lookups: counts.lookups };
  }
}

/**
 * Polls `probe` until it resolves to something other than undefined; throws after
 * `seconds` (a bound against hanging, not a timing assertion).
 */
export async function waitFor<T>(
  what: string,
  probe: () => Promise<T | undefined>,
  seconds = 30,
): Promise<T> {
  const deadline = Date.now() + seconds * 1000;
  for (;;) {
    const value = await probe();
    if (value !== undefined) {
      return value;
    }
    if (Date.now() > deadline) {
      throw new Error(`gave up waiting for ${what}`);
    }
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
}
