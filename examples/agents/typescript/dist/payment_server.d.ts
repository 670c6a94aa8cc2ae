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
import { type JournalClient } from "@opjournal/client";
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
/** The MCP server: register it on a transport with `connect(withIdempotencyKeys(transport))`. */
export declare function createPaymentServer(options: PaymentServerOptions): McpServer;
