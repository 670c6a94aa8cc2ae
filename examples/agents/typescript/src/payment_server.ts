/**
 * An MCP server with one side-effecting tool, `create_payment`, journaled by opjournal: a
 * model (or its MCP client) that repeats a call after losing the answer gets the payment
 * that was made, never a second one.
 *
 * The idempotency key is the client's (`idempotencyKey` in the `tools/call` params, or
 * `_meta.idempotencyKey`), scoped to the tool by the server; a call without one is keyed
 * by its order: one payment per order. The payment goes to the sandbox provider (or any
 * API of the same shape) with the journal's provider key as its `Idempotency-Key`.
 */

import { McpServer } from "@modelcontextprotocol/sdk/server/mcp.js";
import { z } from "zod";

import { type JournalClient, ProviderRejected } from "@opjournal/client";
import { currentCall, registerJournaledTool } from "@opjournal/client/mcp";

/** What the server needs. */
export interface PaymentServerOptions {
  /** The opjournal client (`JournalClient.connect("http://127.0.0.1:50051")`). */
  journal: JournalClient;
  /** The payment provider's base URL, e.g. the sandbox's `http://127.0.0.1:8081`. */
  providerUrl: string;
  /** Milliseconds the provider may take to answer before the outcome is unknown; default 10 000. */
  providerTimeoutMs?: number;
  /** Milliseconds a repeated call waits for the first, still running, to finish; default 20 000. */
  inProgressWaitMs?: number;
}

/** The provider's answer to a refused or failed payment. */
class ProviderHttpError extends Error {
  constructor(readonly status: number) {
    super(`the payment provider answered HTTP ${status}`);
    this.name = "ProviderHttpError";
  }
}

/** A payment as the provider answers it. */
interface Payment {
  id: string;
  status: string;
  amount_minor: number;
  currency: string;
}

/** The MCP server: register it on a transport with `connect(withIdempotencyKeys(transport))`. */
export function createPaymentServer(options: PaymentServerOptions): McpServer {
  const server = new McpServer({ name: "opjournal-payments", version: "0.2.0" });
  const providerUrl = options.providerUrl.replace(/\/$/, "");
  registerJournaledTool(
    server,
    "create_payment",
    {
      title: "Create a payment",
      description:
        "Charges the customer for an order. Send an idempotencyKey with every call: a new " +
        "unique value for a new payment, the same value when repeating a call whose answer " +
        "you did not get. A repeated call returns the payment already made.",
      inputSchema: {
        order_id: z.string().min(1).max(64),
        amount_minor: z.number().int().positive(),
        currency: z.string().length(3),
      },
      annotations: { destructiveHint: false, idempotentHint: true, openWorldHint: true },
    },
    {
      journal: options.journal,
      actionType: "create_payment",
      subject: "payment",
      deriveKey: (args) => `payment:order-${args.order_id}`,
      externalId: (payment: Payment) => payment.id,
      inProgressWaitMs: options.inProgressWaitMs ?? 20_000,
    },
    async (args): Promise<Payment> => {
      const call = currentCall();
      const response = await fetch(`${providerUrl}/v1/payments`, {
        method: "POST",
        headers: { "Idempotency-Key": call.providerKey, "Content-Type": "application/json" },
        body: JSON.stringify(args),
        signal: AbortSignal.any([call.signal, AbortSignal.timeout(options.providerTimeoutMs ?? 10_000)]),
      });
      if (response.status === 402) {
        await response.body?.cancel();
        throw new ProviderRejected("card_declined"); // the provider proved nothing was charged
      }
      if (!response.ok) {
        await response.body?.cancel();
        throw new ProviderHttpError(response.status); // a 5xx may have charged: unknown
      }
      return (await response.json()) as Payment;
    },
  );
  return server;
}
