/**
 * Runs the payment MCP server over stdio (how MCP hosts start local servers).
 *
 * Environment: `OPJOURNAL_SERVER` (default `http://127.0.0.1:50051`), `OPJOURNAL_TOKEN`
 * (a bearer token, if the journal wants one), `PAYMENT_PROVIDER_URL` (default the sandbox's
 * `http://127.0.0.1:8081`), `PAYMENT_PROVIDER_TIMEOUT_MS` (default 10000). Logs go to
 * standard error: standard output is the MCP channel.
 */

import { StdioServerTransport } from "@modelcontextprotocol/sdk/server/stdio.js";

import { JournalClient } from "@opjournal/client";
import { withIdempotencyKeys } from "@opjournal/client/mcp";

import { createPaymentServer } from "./payment_server.js";

const journal = JournalClient.connect(process.env.OPJOURNAL_SERVER ?? "http://127.0.0.1:50051", {
  token: process.env.OPJOURNAL_TOKEN,
});
const timeout = process.env.PAYMENT_PROVIDER_TIMEOUT_MS;
const server = createPaymentServer({
  journal,
  providerUrl: process.env.PAYMENT_PROVIDER_URL ?? "http://127.0.0.1:8081",
  providerTimeoutMs: timeout ? Number(timeout) : undefined,
});
const transport = withIdempotencyKeys(new StdioServerTransport());
transport.onclose = () => journal.close();
await server.connect(transport);
console.error("opjournal-payments MCP server on stdio");
