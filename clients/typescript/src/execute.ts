/**
 * `execute`: one side-effecting provider call, made safe to retry through the journal.
 *
 * The source article's `executeOperation`. Begin registers the intent; only
 * `DECISION_EXECUTE` lets the provider be called, with `operation.providerKey` as its
 * idempotency key, while the lease is renewed in the background. The outcome is then
 * classified the only safe way:
 *
 * - `call` resolved to a {@link ProviderResult} → CompleteOperation → `succeeded`;
 * - it threw {@link ProviderRejected} (or `isConfirmedRejection` named an error code): the
 *   provider proved no effect happened → FailOperation → `failed_final`;
 * - anything else — a timeout, a reset connection, a 5xx, an unexpected exception — may
 *   have happened at the provider → ReportUnknownOutcome → `verification_required`. It is
 *   never treated as a failure, and the provider is not called again until the operation
 *   has been reconciled.
 *
 * The other decisions are answers too, never exceptions: a replay resolves to the stored
 * outcome (`replayed: true`), and `in_progress`, `verification_required` and
 * `duplicate_intent_suspected` say why the provider was not called. Errors (a reused key,
 * a lost lease, a bad request, an unreachable journal) reject with {@link OpjournalError}
 * subclasses.
 *
 * @module
 */

import { randomUUID } from "node:crypto";
import type { JournalClient, BeginRequest } from "./client.js";
import { InvalidArgumentError, LeaseExpiredBeforeCallError, LeaseLostError } from "./errors.js";
import { JsonValue } from "./json.js";
import {
  Decision,
  OperationStatus,
  type BeginOperationResponse,
  type Operation,
} from "./gen/opjournal/v1/journal_pb.js";

const ERROR_CODE = /^[A-Za-z0-9._:-]{1,100}$/;

function checkedCode(errorCode: string): string {
  if (!ERROR_CODE.test(errorCode)) {
    throw new RangeError("error codes are 1-100 characters of [A-Za-z0-9._:-]");
  }
  return errorCode;
}

/**
 * The error code of the unknown outcome reported when the provider call succeeded but the
 * journal refused its success report (`INVALID_ARGUMENT`: `RESULT_TOO_LARGE`,
 * `INVALID_RESULT`, `INVALID_EXTERNAL_ID`): the effect happened and is left to reconciliation.
 */
export const RESULT_REFUSED = "result_refused";

/**
 * The error code of the unknown outcome reported when the provider call succeeded but its
 * result cannot be written as JSON (a `TypeError` of {@link JsonValue} or `JSON.stringify`).
 */
export const RESULT_NOT_SERIALIZABLE = "result_not_serializable";

/**
 * The error code of the unknown outcome reported when a classifier hook
 * (`isConfirmedRejection`, `unknownErrorCode`, or `idempotent`'s `classify`) threw: an
 * unproven rejection is no rejection.
 */
export const CLASSIFIER_FAILED = "classifier_failed";

/**
 * The error code of the unknown outcome reported when a classifier hook answered an error
 * code that is not 1-100 characters of `[A-Za-z0-9._:-]`, or something else than a verdict.
 */
export const INVALID_ERROR_CODE = "invalid_error_code";

/**
 * Throw from the provider call when the provider *proved* that no effect happened and none
 * will (a declined card, a validation error before anything was stored). A timeout, a reset
 * connection, a 5xx or a proxy's odd answer is not a rejection. `errorCode` is a short
 * machine code such as `"card_declined"` (1-100 characters of `[A-Za-z0-9._:-]`).
 */
export class ProviderRejected extends Error {
  readonly errorCode: string;
  constructor(errorCode: string, options?: { cause?: unknown }) {
    super(errorCode, options);
    this.name = "ProviderRejected";
    this.errorCode = checkedCode(errorCode);
  }
}

/**
 * Throw from the provider call to report an uncertain outcome with your own code (e.g.
 * `"http_502"`); any other error is reported as unknown too.
 */
export class ProviderOutcomeUnknown extends Error {
  readonly errorCode: string;
  constructor(errorCode: string, options?: { cause?: unknown }) {
    super(errorCode, options);
    this.name = "ProviderOutcomeUnknown";
    this.errorCode = checkedCode(errorCode);
  }
}

/** What the provider call gets. */
export interface ProviderCall {
  /**
   * The idempotency key to send to the provider (`Operation.providerKey`: the key itself
   * in the `default` namespace, `namespace/key` elsewhere).
   */
  readonly providerKey: string;
  /** The journal record as Begin left it (IN_PROGRESS). */
  readonly operation: Operation;
  /**
   * Aborted (with a {@link LeaseLostError}) when a lease renewal was refused with
   * `LEASE_LOST`: another holder may now call the provider; or (with a
   * {@link LeaseExpiredError}) when the lease ended unrenewed, at which moment `execute`
   * stops waiting for the call and records its outcome unknown ({@link LEASE_EXPIRED}).
   * Pass it to `fetch` or check it in a long call.
   */
  readonly signal: AbortSignal;
  /**
   * Milliseconds until the lease ends unless it is renewed (0 once it has): Begin's send
   * time plus the length granted, moved on by each renewal. Give the provider request a
   * timeout no longer than this.
   */
  leaseRemainingMs(): number;
}

/**
 * The error code of the unknown outcome recorded when the provider call was cut off at the
 * end of its unrenewed lease.
 */
export const LEASE_EXPIRED = "lease_expired";

/** The reason `ProviderCall.signal` is aborted with when the lease ended unrenewed. */
export class LeaseExpiredError extends Error {
  constructor() {
    super("the lease ended before the provider call did");
    this.name = "LeaseExpiredError";
  }
}

/** What the provider call resolves to on a confirmed success. */
export interface ProviderResult {
  /** The provider's id of the effect (payment id, message id); up to 200 characters. */
  externalId?: string;
  /**
   * The provider's answer to keep and replay: JSON text, a value for `JSON.stringify`, or a
   * {@link JsonValue} (a value, a string in it written as a JSON string: what `idempotent`
   * and the MCP tools pass); absent for no result body. The journal keeps only what the
   * action's policy allows (`result.keep`) and never card numbers, tokens or secrets.
   */
  result?: unknown;
}

/** The effect happened. */
export interface Succeeded {
  readonly kind: "succeeded";
  readonly operation: Operation;
  /** The provider's id of the effect, when recorded. */
  readonly externalId: string | undefined;
  /** The stored (sanitized) result, parsed from JSON; the same on every replay. */
  readonly result: unknown;
  /** True when the provider was not called now (the stored outcome was replayed). */
  readonly replayed: boolean;
  /**
   * What the provider call returned as its `result` this time (a {@link JsonValue}'s value
   * unwrapped); undefined on a replay.
   */
  readonly providerResult?: unknown;
}

/** The provider proved no effect happened; the operation is terminal. */
export interface FailedFinal {
  readonly kind: "failed_final";
  readonly operation: Operation;
  readonly errorCode: string | undefined;
  readonly replayed: boolean;
  /** The rejection thrown by this call; undefined on a replay. */
  readonly cause?: unknown;
}

/**
 * The outcome is unknown: the provider must not be called until the operation is
 * reconciled (by the reconcile worker, {@link JournalClient.reconcile} or a reviewer).
 * Calling `execute` again with the same key is always safe.
 */
export interface VerificationRequired {
  readonly kind: "verification_required";
  readonly operation: Operation;
  /** True when this call reported the unknown outcome; false when Begin found it unknown. */
  readonly reported: boolean;
  /**
   * The code this call reported (`timeout`, `exception`, {@link RESULT_REFUSED}, …);
   * undefined when Begin found the operation unknown.
   */
  readonly errorCode?: string;
  /**
   * What made the outcome unknown: the provider call's error, or the journal's refusal of
   * its success report (an {@link InvalidArgumentError}) after the provider acted.
   */
  readonly cause?: unknown;
}

/** Another holder's lease is live; the provider was not called. */
export interface InProgress {
  readonly kind: "in_progress";
  readonly operation: Operation;
  /** Milliseconds until the current lease ends. */
  readonly retryAfterMs: number;
}

/**
 * The duplicate-intent policy held the request: the same payload is registered under
 * `duplicateOfOperationKey`. Nothing was registered. Retry under that key; send
 * `confirmDuplicateIntent` only for a genuinely new intent.
 */
export interface DuplicateIntentSuspected {
  readonly kind: "duplicate_intent_suspected";
  readonly operation: Operation | undefined;
  readonly duplicateOfOperationKey: string;
}

/** What {@link execute} resolves to; switch on `kind`. */
export type Outcome =
  | Succeeded
  | FailedFinal
  | VerificationRequired
  | InProgress
  | DuplicateIntentSuspected;

/** Options of {@link execute}. */
export interface ExecuteOptions {
  /** Renew the lease every third of its length while `call` runs (default true). */
  renewLease?: boolean;
  /**
   * Maps an error thrown by `call` to the error code of a confirmed rejection, or
   * undefined when it proves nothing. Default: {@link confirmedRejectionCode}. When it
   * throws, or answers a code that is not 1-100 characters of `[A-Za-z0-9._:-]`, the
   * outcome is reported unknown at once ({@link CLASSIFIER_FAILED}, {@link INVALID_ERROR_CODE}).
   */
  isConfirmedRejection?: (error: unknown) => string | undefined;
  /**
   * Maps any other error to a short code for the journal. Default: {@link unknownOutcomeCode}.
   * When it throws or answers a malformed code, the outcome is still reported unknown, with
   * {@link CLASSIFIER_FAILED} or {@link INVALID_ERROR_CODE}.
   */
  unknownErrorCode?: (error: unknown) => string;
  /**
   * Milliseconds to wait while another holder's lease is live (`DECISION_IN_PROGRESS`):
   * Begin is asked again after `retry_after` (at most after a backoff step of 100 ms
   * doubling to 2 s), until another decision comes or this time is up; then the outcome is
   * `in_progress`. Default 0: answer `in_progress` at once.
   */
  inProgressWaitMs?: number;
  /**
   * Milliseconds to wait when Begin answers `DECISION_VERIFICATION_REQUIRED`: Begin is
   * asked again with backoff (100 ms doubling to 2 s) until the reconciler (or a reviewer)
   * has settled the operation — a replay of its outcome, or, when the provider proved that
   * nothing happened, a new provider call under the same key — or this time is up; then the
   * outcome is `verification_required`. An unknown outcome this call reports itself is
   * answered at once. Default 0: answer at once.
   */
  settleWaitMs?: number;
}

/** Begin answered a decision this client does not know (a newer server?). */
export class UnexpectedDecisionError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "UnexpectedDecisionError";
  }
}

/** The default `isConfirmedRejection`: the code of a {@link ProviderRejected}, else undefined. */
export function confirmedRejectionCode(error: unknown): string | undefined {
  return error instanceof ProviderRejected ? error.errorCode : undefined;
}

const TIMEOUT_CODES = new Set(["ETIMEDOUT", "UND_ERR_CONNECT_TIMEOUT", "UND_ERR_HEADERS_TIMEOUT", "UND_ERR_BODY_TIMEOUT"]);

/**
 * The default `unknownErrorCode`: a short code for an uncertain outcome, never the error's
 * message (which may quote payloads). `lease_lost` for the {@link LeaseLostError} that
 * aborted `ProviderCall.signal`; through `fetch`'s `cause` chain: `timeout`,
 * `connection_reset`, `connection_error`; `http_<status>` for an error carrying a numeric
 * HTTP `status` or `statusCode` (as the errors of most HTTP clients do); else `exception`.
 */
export function unknownOutcomeCode(error: unknown): string {
  if (error instanceof ProviderOutcomeUnknown) {
    return error.errorCode;
  }
  if (error instanceof LeaseLostError) {
    return "lease_lost"; // the call stopped because ProviderCall.signal was aborted
  }
  for (let e: unknown = error, depth = 0; e instanceof Error && depth < 5; depth++) {
    const status = (e as { status?: unknown }).status ?? (e as { statusCode?: unknown }).statusCode;
    if (typeof status === "number" && Number.isInteger(status) && status >= 100 && status <= 599) {
      return `http_${status}`;
    }
    const code = (e as { code?: unknown }).code;
    if (e.name === "TimeoutError" || (typeof code === "string" && TIMEOUT_CODES.has(code))) {
      return "timeout";
    }
    if (code === "ECONNRESET" || code === "UND_ERR_SOCKET") {
      return "connection_reset";
    }
    if (typeof code === "string" && code.startsWith("ECONN")) {
      return "connection_error";
    }
    e = e.cause;
  }
  return "exception";
}

/**
 * Renews a lease every third of its length until stopped; aborts `signal` on LEASE_LOST,
 * and at the lease's end (`endsAt`, `performance.now()` milliseconds, moved on by each
 * renewal) when no renewal came in time.
 */
class LeaseRenewal {
  private readonly controller = new AbortController();
  private timer: NodeJS.Timeout | undefined;
  private expiry: NodeJS.Timeout | undefined;
  private inFlight: Promise<void> = Promise.resolve();
  private stopped = false;
  /** Rejects with the {@link LeaseExpiredError} once the lease has ended unrenewed. */
  readonly expired: Promise<never>;
  private expire: (error: LeaseExpiredError) => void = () => {};

  constructor(
    private readonly client: JournalClient,
    private readonly leaseToken: string,
    private readonly leaseSeconds: number,
    private endsAt: number,
  ) {
    this.expired = new Promise<never>((_, reject) => {
      this.expire = reject;
    });
    this.expired.catch(() => {}); // observed by execute's race, or by nobody
  }

  get signal(): AbortSignal {
    return this.controller.signal;
  }

  remainingMs(): number {
    return Math.max(0, this.endsAt - performance.now());
  }

  start(renew: boolean): void {
    if (renew) {
      this.schedule();
    }
    this.watchExpiry();
  }

  private watchExpiry(): void {
    clearTimeout(this.expiry);
    if (this.stopped) {
      return;
    }
    const left = this.endsAt - performance.now();
    if (left > 0) {
      this.expiry = setTimeout(() => this.watchExpiry(), Math.min(left, 2 ** 31 - 1));
      return;
    }
    const error = new LeaseExpiredError();
    if (!this.controller.signal.aborted) {
      this.controller.abort(error);
    }
    this.expire(error);
  }

  private schedule(): void {
    if (this.stopped) {
      return;
    }
    this.timer = setTimeout(() => {
      this.inFlight = this.renew().finally(() => this.schedule());
    }, (this.leaseSeconds * 1000) / 3);
  }

  private async renew(): Promise<void> {
    try {
      const sentAt = performance.now();
      const renewed = await this.client.renewLease(this.leaseToken, this.leaseSeconds);
      this.endsAt = sentAt + grantedLeaseMs(renewed);
      this.watchExpiry();
    } catch (error) {
      if (error instanceof LeaseLostError) {
        this.stopped = true;
        this.controller.abort(error);
      }
      // Anything else is transient (journal unreachable): the lease may still be live.
    }
  }

  async stop(): Promise<void> {
    this.stopped = true;
    clearTimeout(this.timer);
    clearTimeout(this.expiry);
    await this.inFlight;
    clearTimeout(this.expiry);
  }
}

/** The exact length of a granted lease in milliseconds, from two database-clock timestamps. */
function grantedLeaseMs(operation: Operation): number {
  const until = operation.leaseUntil;
  const at = operation.updatedAt;
  if (until === undefined || at === undefined) {
    return 0;
  }
  return Math.max(0, Number(until.seconds - at.seconds) * 1000 + (until.nanos - at.nanos) / 1e6);
}

/** The length of the lease Begin granted, by the server's clock (at least 1 s). */
function grantedLeaseSeconds(operation: Operation): number {
  const until = operation.leaseUntil;
  const at = operation.updatedAt;
  if (until === undefined || at === undefined) {
    return 1;
  }
  const granted = Number(until.seconds - at.seconds) + (until.nanos - at.nanos) / 1e9;
  return Math.max(1, Math.ceil(granted));
}

function succeeded(operation: Operation, replayed: boolean, providerResult?: unknown): Succeeded {
  return {
    kind: "succeeded",
    operation,
    externalId: operation.externalId,
    result: operation.resultJson === undefined ? undefined : JSON.parse(operation.resultJson),
    replayed,
    providerResult,
  };
}

function replay(operation: Operation): Outcome {
  switch (operation.status) {
    case OperationStatus.SUCCEEDED:
      return succeeded(operation, true);
    case OperationStatus.FAILED_FINAL:
      return { kind: "failed_final", operation, errorCode: operation.errorCode, replayed: true };
    default:
      throw new UnexpectedDecisionError(`replay of a non-terminal operation (${OperationStatus[operation.status]})`);
  }
}

/**
 * Runs `call` at most once per intent, and only when the journal says so.
 *
 * @param client the journal client.
 * @param request the intent: key, action type, payload (same key with another payload
 *   rejects with {@link IdempotencyKeyReusedError}), namespace, lease, references.
 * @param call the provider call. It must send `providerKey` as the provider's idempotency
 *   key; resolve to a {@link ProviderResult} on a confirmed success, throw
 *   {@link ProviderRejected} on a confirmed rejection; any other error is an unknown outcome.
 * @returns the {@link Outcome}; switch on `kind`.
 * @throws {IdempotencyKeyReusedError} the key is bound to another payload; the provider was not called.
 * @throws {LeaseLostError} another holder took the lease over before this call's report.
 * @throws {LeaseExpiredBeforeCallError} Begin's EXECUTE answer arrived after the lease it
 *   granted had ended (measured from when the Begin was sent): the provider was not called
 *   and nothing was reported; begin the same intent again. A call still running when its
 *   lease ends unrenewed is not awaited further: its outcome is recorded unknown
 *   ({@link LEASE_EXPIRED}) and `ProviderCall.signal` is aborted.
 * @throws {InvalidArgumentError} a malformed request (nothing was called). When the journal
 *   refuses the success report of a call that ran (`RESULT_TOO_LARGE`, `INVALID_RESULT`,
 *   `INVALID_EXTERNAL_ID`), or its result cannot be written as JSON, nothing is thrown: the
 *   outcome is reported unknown ({@link RESULT_REFUSED}, {@link RESULT_NOT_SERIALIZABLE})
 *   and `verification_required` is returned with that error as its `cause`.
 * @throws {JournalUnavailableError} the journal could not be reached; calling `execute`
 *   again with the same key is safe (an unreported lease ends as unknown).
 */
export async function execute(
  client: JournalClient,
  request: BeginRequest,
  call: (call: ProviderCall) => Promise<ProviderResult>,
  options: ExecuteOptions = {},
): Promise<Outcome> {
  const { begin, sentAt } = await beginWaiting(client, request, options);
  const operation = begin.operation;
  switch (begin.decision) {
    case Decision.EXECUTE:
      break;
    case Decision.REPLAY:
      return replay(requiredOperation(operation));
    case Decision.IN_PROGRESS:
      return { kind: "in_progress", operation: requiredOperation(operation), retryAfterMs: retryAfterMs(begin) };
    case Decision.VERIFICATION_REQUIRED:
      return { kind: "verification_required", operation: requiredOperation(operation), reported: false };
    case Decision.DUPLICATE_INTENT_SUSPECTED:
      return {
        kind: "duplicate_intent_suspected",
        operation,
        duplicateOfOperationKey: begin.duplicateOfOperationKey,
      };
    default:
      throw new UnexpectedDecisionError(`unknown decision ${begin.decision}`);
  }

  const held = requiredOperation(operation);
  const token = begin.leaseToken;
  const leaseMs = grantedLeaseMs(held);
  if (performance.now() >= sentAt + leaseMs) {
    // The answer came after the lease it grants had ended: another holder may have it by
    // now. Call nothing, report nothing.
    throw new LeaseExpiredBeforeCallError(leaseMs);
  }
  const renewal = new LeaseRenewal(client, token, grantedLeaseSeconds(held), sentAt + leaseMs);
  renewal.start(options.renewLease ?? true);
  let returned: ProviderResult;
  try {
    const provider = call({
      providerKey: held.providerKey,
      operation: held,
      signal: renewal.signal,
      leaseRemainingMs: () => renewal.remainingMs(),
    });
    returned = await Promise.race([provider, renewal.expired]);
  } catch (error) {
    await renewal.stop();
    const decided: { rejected: string } | { unknown: string } =
      error instanceof LeaseExpiredError ? { unknown: LEASE_EXPIRED } : verdict(error, options);
    if ("rejected" in decided) {
      const failed = await client.fail(token, decided.rejected);
      return { kind: "failed_final", operation: failed, errorCode: decided.rejected, replayed: false, cause: error };
    }
    const code = decided.unknown;
    const unknown = await client.reportUnknown(token, code);
    return { kind: "verification_required", operation: unknown, reported: true, errorCode: code, cause: error };
  }
  await renewal.stop();

  if (typeof returned !== "object" || returned === null) {
    await client.reportUnknown(token, "invalid_provider_result");
    throw new TypeError("the provider call must resolve to a ProviderResult");
  }
  let done: Operation;
  try {
    done = await client.complete(token, { externalId: returned.externalId ?? "", result: returned.result });
  } catch (error) {
    if (error instanceof TypeError || error instanceof InvalidArgumentError) {
      // The effect happened but this report cannot be recorded: it is reported unknown, so
      // that reconciliation (or a reviewer) settles it, and the provider is not called again.
      const code = error instanceof TypeError ? RESULT_NOT_SERIALIZABLE : RESULT_REFUSED;
      const unknown = await client.reportUnknown(token, code);
      return { kind: "verification_required", operation: unknown, reported: true, errorCode: code, cause: error };
    }
    throw error;
  }
  const result = returned.result instanceof JsonValue ? returned.result.value : returned.result;
  return succeeded(done, false, result);
}

/**
 * What the hooks of `options` decide for `error`, safe in every corner: a hook that throws
 * is an unknown outcome ({@link CLASSIFIER_FAILED}), a code that is not 1-100 characters
 * of `[A-Za-z0-9._:-]` too ({@link INVALID_ERROR_CODE}). Either is reported at once, so the
 * operation never waits for its lease to expire.
 */
function verdict(error: unknown, options: ExecuteOptions): { rejected: string } | { unknown: string } {
  let rejection: unknown;
  try {
    rejection = (options.isConfirmedRejection ?? confirmedRejectionCode)(error);
  } catch {
    return { unknown: CLASSIFIER_FAILED };
  }
  if (rejection !== undefined) {
    return typeof rejection === "string" && ERROR_CODE.test(rejection)
      ? { rejected: rejection }
      : { unknown: INVALID_ERROR_CODE };
  }
  let code: unknown;
  try {
    code = (options.unknownErrorCode ?? unknownOutcomeCode)(error);
  } catch {
    return { unknown: CLASSIFIER_FAILED };
  }
  return typeof code === "string" && ERROR_CODE.test(code) ? { unknown: code } : { unknown: INVALID_ERROR_CODE };
}

/** Begin's `retry_after` in milliseconds (0 when absent). */
function retryAfterMs(begin: BeginOperationResponse): number {
  const after = begin.retryAfter;
  return after ? Number(after.seconds) * 1000 + after.nanos / 1e6 : 0;
}

/**
 * Begins, and asks again while the answer is IN_PROGRESS or VERIFICATION_REQUIRED and the
 * caller's wait for that decision ({@link ExecuteOptions.inProgressWaitMs},
 * {@link ExecuteOptions.settleWaitMs}) has time left. Resolves to the last answer, and when
 * the Begin that answered was first sent (`performance.now()` milliseconds).
 */
async function beginWaiting(
  client: JournalClient,
  request: BeginRequest,
  options: ExecuteOptions,
): Promise<{ begin: BeginOperationResponse; sentAt: number }> {
  const started = Date.now();
  const inProgressUntil = started + Math.max(0, options.inProgressWaitMs ?? 0);
  const settleUntil = started + Math.max(0, options.settleWaitMs ?? 0);
  // One attempt id for every Begin of this call: it runs the provider at most once, after
  // the one EXECUTE it receives, so a repeat that gets a lease back only ever stands in for
  // an answer that never arrived.
  const attempt = { ...request, attemptId: request.attemptId ?? randomUUID() };
  for (let step = 100; ; step = Math.min(step * 2, 2000)) {
    // A repeat after a lost answer gets the lease granted to the first send of this
    // Begin (the client repeats it inside `begin`): its lease is measured from here.
    const sentAt = performance.now();
    const begin = await client.begin(attempt);
    let wait: number;
    if (begin.decision === Decision.IN_PROGRESS) {
      const suggested = retryAfterMs(begin);
      wait = Math.min(suggested > 0 ? suggested : step, step, inProgressUntil - Date.now());
    } else if (begin.decision === Decision.VERIFICATION_REQUIRED) {
      wait = Math.min(step, settleUntil - Date.now());
    } else {
      return { begin, sentAt };
    }
    if (wait <= 0) {
      return { begin, sentAt };
    }
    await sleep(wait);
  }
}

function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

function requiredOperation(operation: Operation | undefined): Operation {
  if (operation === undefined) {
    throw new UnexpectedDecisionError("the server answered without an operation");
  }
  return operation;
}
