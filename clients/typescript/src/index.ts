/**
 * TypeScript client for opjournal, the operation journal that makes side-effecting calls
 * safe to retry.
 *
 * - {@link JournalClient} wraps the generated services (protobuf-es v2, Connect over gRPC)
 *   and throws typed errors.
 * - {@link execute} is the source article's `executeOperation`: Begin, call the provider
 *   only on `DECISION_EXECUTE` with `operation.providerKey`, renew the lease meanwhile, and
 *   record the outcome — success, confirmed rejection, or unknown (never "failed" for a
 *   timeout).
 * - {@link idempotent} wraps an async function so that it runs at most once per intent;
 *   {@link currentCall} gives it the provider key.
 * - The generated messages and enums are re-exported as `v1`.
 *
 * @module
 */

export * from "./client.js";
export * from "./errors.js";
export * from "./execute.js";
export * from "./idempotent.js";
export * from "./json.js";
export * from "./service-config.js";
export * as v1 from "./gen/opjournal/v1/journal_pb.js";
export * as providerAdapterV1 from "./gen/opjournal/v1/provider_adapter_pb.js";
