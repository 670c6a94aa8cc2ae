/**
 * Runs the payment MCP server over stdio (how MCP hosts start local servers).
 *
 * Environment: `OPJOURNAL_SERVER` (default `http://127.0.0.1:50051`), `OPJOURNAL_TOKEN`
 * (a bearer token, if the journal wants one), `PAYMENT_PROVIDER_URL` (default the sandbox's
 * `http://127.0.0.1:8081`), `PAYMENT_PROVIDER_TIMEOUT_MS` (default 10000). Logs go to
 * standard error: standard output is the MCP channel.
 */
export {};
