/**
 * `idempotent(fn, options)`: turns an async function with a side effect into one that runs
 * at most once per intent, through {@link execute}.
 *
 * The wrapped function keeps its parameters. The idempotency key comes from the
 * orchestrator's code — a function of the arguments, or a string such as a run or intent id
 * — never from a model. Inside `fn`, {@link currentCall} gives the provider key to send to
 * the provider and a signal that is aborted when the lease is lost.
 *
 * What a call answers (`returns: "value"`, the default): on a fresh success what `fn`
 * returned; on a replay the stored result (the JSON the journal kept, as the action's policy
 * sanitized it), without calling `fn`; every other outcome is thrown as a typed
 * {@link OutcomeError}: {@link FailedFinalError}, {@link VerificationRequiredError},
 * {@link InProgressError}, {@link DuplicateIntentSuspectedError}. With
 * `returns: "outcome"` (or `wrapped.outcome(...)`) it resolves to the {@link Outcome} of
 * every decision instead. Both reject with {@link IdempotencyKeyReusedError} (the same key
 * with other arguments), {@link LeaseLostError}, {@link JournalUnavailableError} and the
 * other {@link OpjournalError}s. {@link summarizeOutcome} (and `OutcomeError.toJSON()`)
 * gives the JSON summary an agent reads, the same as the Python client's `to_dict()`.
 *
 * @module
 */

import { toJsonText, type JournalClient } from "./client.js";
import type { IdempotencyKeyReusedError, JournalUnavailableError, LeaseLostError, OpjournalError } from "./errors.js";
import { classifierOptions, currentCall, type Classification, type CurrentCall, withCurrentCall } from "./current.js";
import {
  execute,
  ProviderOutcomeUnknown,
  ProviderRejected,
  type DuplicateIntentSuspected,
  type FailedFinal,
  type InProgress,
  type Outcome,
  type Succeeded,
  type VerificationRequired,
} from "./execute.js";
import { OperationStatus, type Operation } from "./gen/opjournal/v1/journal_pb.js";
import { JsonValue } from "./json.js";

export { currentCall, type Classification, type CurrentCall };

/** Options of {@link idempotent}; `A` are the function's parameters, `R` its result. */
export interface IdempotentOptions<A extends unknown[], R> {
  /** The journal client. */
  journal: JournalClient;
  /** The action as named in the server's policy, e.g. `"create_payment"`. */
  actionType: string;
  /**
   * The idempotency key: a function of the arguments (`(order) => \`payment:${order.id}\``),
   * or a string the orchestrator holds for this intent (a run or intent id). Never let a
   * model choose it.
   */
  key: string | ((...args: A) => string);
  /**
   * What is hashed as the request's payload (a same key with another payload is
   * `IDEMPOTENCY_KEY_REUSED`): default `{ args: [...arguments] }` without trailing
   * `undefined` arguments (`f(1)` and `f(1, undefined)` are one intent). JavaScript has no
   * parameter names to bind, so defaults are not applied: `f(1)` and `f(1, 5)` differ even
   * when 5 is the second parameter's default. Give a function to select the members that
   * define the intent (leave out, say, a trace id) — recommended for anything but plain
   * arguments. The payload must be plain data (see `jsonText`; a `Date` counts as its
   * ISO text): a `Map`, a `Set`, a class instance without `toJSON`, a function, a symbol, a
   * `BigInt`, `NaN` or `undefined` inside an array throws a `TypeError` before Begin, since
   * JSON would write two different intents the same. A string is taken as JSON text.
   */
  payload?: (...args: A) => unknown;
  /** The tenant namespace; absent means `default`. */
  namespace?: string;
  /** Business links kept with the record (not hashed), or a function of the arguments. */
  references?: Record<string, string> | ((...args: A) => Record<string, string>);
  /** The lease to ask for, in seconds; absent means the action's default. */
  leaseSeconds?: number;
  /** The provider's id of the effect, taken from the function's result (e.g. `(r) => r.id`). */
  externalId?: (result: R) => string | undefined;
  /**
   * What the journal stores and replays, from the function's result; default the result
   * itself. It is a value, never JSON text: a string is stored as a JSON string, and a
   * replay gives back an equal value (as far as the action's policy keeps it); undefined
   * stores no result. Only plain data is accepted (see `jsonText`): a `Map`, a class
   * instance without `toJSON`, `NaN`… cannot be stored, so the call's outcome is recorded
   * unknown (`result_not_serializable`) although the function ran.
   */
  toResult?: (result: R) => unknown;
  /** Proceed after `DECISION_DUPLICATE_INTENT_SUSPECTED`: this really is a new intent. */
  confirmDuplicateIntent?: boolean;
  /**
   * `"value"` (default): resolve to the result and throw an {@link OutcomeError} for
   * every other outcome; `"outcome"`: resolve to the {@link Outcome}.
   */
  returns?: "value" | "outcome";
  /**
   * Classifies an error thrown by the function; undefined keeps the safe default: a
   * {@link ProviderRejected} is a confirmed rejection, a {@link ProviderOutcomeUnknown}
   * an unknown outcome with its code, and anything else an unknown outcome (`timeout`,
   * `connection_reset`, `connection_error` or `exception`). Say `rejected` only when the
   * provider proved that nothing happened. Codes are 1-100 characters of `[A-Za-z0-9._:-]`;
   * a hook that throws is an unknown outcome `classifier_failed`, and a malformed code or
   * answer an unknown outcome `invalid_error_code`, reported at once.
   */
  classify?: (error: unknown) => Classification | undefined;
  /** Wait for another holder's lease up to this long (see `ExecuteOptions.inProgressWaitMs`). */
  inProgressWaitMs?: number;
  /** Wait for an unknown outcome to be settled up to this long (see `ExecuteOptions.settleWaitMs`). */
  settleWaitMs?: number;
  /** Renew the lease while the function runs (default true). */
  renewLease?: boolean;
}

/** The function returned by {@link idempotent} with `returns: "value"` (the default). */
export interface IdempotentFunction<A extends unknown[], R> {
  /**
   * Runs the function at most once per intent. Resolves to what it returned, or on a
   * replay to the stored result (the journal's copy, as the action's policy sanitized it).
   *
   * @throws {FailedFinalError} | {VerificationRequiredError} | {InProgressError} |
   *   {DuplicateIntentSuspectedError} for the other outcomes.
   * @throws {IdempotencyKeyReusedError} the key is bound to other arguments; nothing was called.
   * @throws {LeaseLostError} the lease was taken over before the report.
   * @throws {OpjournalError} any other journal error (e.g. {@link JournalUnavailableError}).
   */
  (...args: A): Promise<R>;
  /** Runs like the function itself, but resolves to the {@link Outcome} of every decision. */
  outcome(...args: A): Promise<Outcome>;
}

/** The function returned by {@link idempotent} with `returns: "outcome"`. */
export interface IdempotentOutcomeFunction<A extends unknown[]> {
  /** Runs the function at most once per intent; resolves to the {@link Outcome}. */
  (...args: A): Promise<Outcome>;
  /** The same as calling the function. */
  outcome(...args: A): Promise<Outcome>;
}

/**
 * Wraps `fn` so that it runs at most once per intent: the key names the intent, the
 * journal decides whether `fn` may run, and its result or error is recorded. Inside `fn`,
 * {@link currentCall} gives the provider key and the lease's signal.
 *
 * @param fn the side effect. Resolve to the provider's answer on a confirmed success;
 *   throw {@link ProviderRejected} when the provider proved nothing happened; anything
 *   else thrown is an unknown outcome (see `classify`).
 */
export function idempotent<A extends unknown[], R>(
  fn: (...args: A) => Promise<R>,
  options: IdempotentOptions<A, R> & { returns?: "value" },
): IdempotentFunction<A, R>;
export function idempotent<A extends unknown[], R>(
  fn: (...args: A) => Promise<R>,
  options: IdempotentOptions<A, R> & { returns: "outcome" },
): IdempotentOutcomeFunction<A>;
export function idempotent<A extends unknown[], R>(
  fn: (...args: A) => Promise<R>,
  options: IdempotentOptions<A, R>,
): IdempotentFunction<A, R> | IdempotentOutcomeFunction<A> {
  /** Runs one call; `returned` is what `fn` returned when it ran now and succeeded. */
  const run = async (args: A): Promise<{ outcome: Outcome; returned?: { value: R } }> => {
    const operationKey = typeof options.key === "string" ? options.key : options.key(...args);
    const references =
      typeof options.references === "function" ? options.references(...args) : options.references;
    let returned: { value: R } | undefined;
    const outcome = await execute(
      options.journal,
      {
        operationKey,
        actionType: options.actionType,
        payload: payloadText(options.payload ? options.payload(...args) : { args: withoutTrailingUndefined(args) }),
        namespace: options.namespace,
        leaseSeconds: options.leaseSeconds,
        references,
        confirmDuplicateIntent: options.confirmDuplicateIntent,
      },
      (call) =>
        withCurrentCall({ ...call, operationKey }, async () => {
          const value = await fn(...args);
          returned = { value };
          return {
            externalId: options.externalId?.(value),
            result: new JsonValue(options.toResult ? options.toResult(value) : value),
          };
        }),
      {
        renewLease: options.renewLease,
        inProgressWaitMs: options.inProgressWaitMs,
        settleWaitMs: options.settleWaitMs,
        ...classifierOptions(options.classify),
      },
    );
    return { outcome, returned };
  };
  const outcome = async (...args: A): Promise<Outcome> => (await run(args)).outcome;
  if (options.returns === "outcome") {
    return Object.assign((...args: A) => outcome(...args), { outcome });
  }
  const wrapped = async (...args: A): Promise<R> => {
    const { outcome: answered, returned } = await run(args);
    const done = throwForOutcome(answered);
    return done.replayed || returned === undefined ? (done.result as R) : returned.value;
  };
  return Object.assign(wrapped, { outcome });
}

/** `args` without its trailing `undefined` members: `f(1)` and `f(1, undefined)` are one call. */
function withoutTrailingUndefined(args: readonly unknown[]): unknown[] {
  let end = args.length;
  while (end > 0 && args[end - 1] === undefined) {
    end -= 1;
  }
  return args.slice(0, end);
}

/**
 * The payload as JSON text (a string as JSON text already), before anything is sent.
 *
 * @throws {TypeError} it holds a value JSON cannot represent without loss.
 */
function payloadText(payload: unknown): string {
  try {
    return toJsonText(payload);
  } catch (error) {
    const reason = error instanceof Error ? error.message : "it is not JSON";
    throw new TypeError(
      `the payload cannot be hashed: ${reason}. The default payload is the function's ` +
        "arguments; give idempotent() a `payload` function that selects plain data",
      { cause: error },
    );
  }
}

/**
 * `outcome` when it is `succeeded`; every other outcome is thrown as its
 * {@link OutcomeError} (with the provider call's error as `cause` when there is one).
 */
export function throwForOutcome(outcome: Outcome): Succeeded {
  switch (outcome.kind) {
    case "succeeded":
      return outcome;
    case "failed_final":
      throw new FailedFinalError(outcome);
    case "verification_required":
      throw new VerificationRequiredError(outcome);
    case "in_progress":
      throw new InProgressError(outcome);
    case "duplicate_intent_suspected":
      throw new DuplicateIntentSuspectedError(outcome);
  }
}

/** The JSON summary of an {@link Outcome}, for a program or an agent (snake_case, as the Python client's `to_dict()`). */
export type OutcomeSummary =
  | ({ outcome: "succeeded"; replayed: boolean; external_id: string | null; result: unknown } & OperationSummary)
  | ({ outcome: "failed_final"; replayed: boolean; error_code: string | null } & OperationSummary)
  | ({ outcome: "verification_required"; reported: boolean; error_code: string | null } & OperationSummary)
  | ({ outcome: "in_progress"; retry_after: number } & OperationSummary)
  | { outcome: "duplicate_intent_suspected"; duplicate_of_operation_key: string };

/** The record's part of an {@link OutcomeSummary}. */
export interface OperationSummary {
  operation_key: string;
  namespace: string;
  /** `succeeded`, `failed_final`, `unknown`, `in_progress` or `pending`. */
  status: string;
  attempt_count: number;
}

function operationSummary(operation: Operation): OperationSummary {
  return {
    operation_key: operation.operationKey,
    namespace: operation.namespace,
    status: (OperationStatus[operation.status] ?? "unspecified").toLowerCase(),
    attempt_count: operation.attemptCount,
  };
}

/**
 * A JSON-serializable summary of `outcome` (the journal record's bigint timestamps
 * left out): `{ outcome, replayed, external_id, result, operation_key, namespace, status,
 * attempt_count }` for a success, and likewise for the other kinds; `retry_after` is in
 * seconds.
 */
export function summarizeOutcome(outcome: Outcome): OutcomeSummary {
  switch (outcome.kind) {
    case "succeeded":
      return {
        outcome: "succeeded",
        replayed: outcome.replayed,
        external_id: outcome.externalId ?? null,
        result: outcome.result,
        ...operationSummary(outcome.operation),
      };
    case "failed_final":
      return {
        outcome: "failed_final",
        replayed: outcome.replayed,
        error_code: outcome.errorCode ?? null,
        ...operationSummary(outcome.operation),
      };
    case "verification_required":
      return {
        outcome: "verification_required",
        reported: outcome.reported,
        error_code: outcome.errorCode ?? null,
        ...operationSummary(outcome.operation),
      };
    case "in_progress":
      return { outcome: "in_progress", retry_after: outcome.retryAfterMs / 1000, ...operationSummary(outcome.operation) };
    case "duplicate_intent_suspected":
      return { outcome: "duplicate_intent_suspected", duplicate_of_operation_key: outcome.duplicateOfOperationKey };
  }
}

/**
 * An outcome other than success, thrown by a function wrapped with {@link idempotent}.
 * `outcome` is the full {@link Outcome}; the message says, for a person or a model, what
 * happened and what to do, and never carries keys, payloads or results.
 */
export abstract class OutcomeError<O extends Outcome = Outcome> extends Error {
  /** The outcome. */
  readonly outcome: O;
  /** The journal record, when there is one. */
  readonly operation: Operation | undefined;

  constructor(outcome: O, message: string) {
    super(message, { cause: "cause" in outcome ? outcome.cause : undefined });
    this.name = new.target.name;
    this.outcome = outcome;
    this.operation = outcome.operation;
  }

  /** The outcome's {@link summarizeOutcome | summary}, so that `JSON.stringify(error)` is useful. */
  toJSON(): OutcomeSummary {
    return summarizeOutcome(this.outcome);
  }
}

/** `failed_final`: the provider proved that nothing happened; the intent is over. */
export class FailedFinalError extends OutcomeError<FailedFinal> {
  /** The recorded error code, e.g. `"card_declined"`. */
  readonly errorCode: string | undefined;
  /** True when this was a replay of an earlier rejection. */
  readonly replayed: boolean;
  constructor(outcome: FailedFinal) {
    super(
      outcome,
      `failed: the provider rejected this operation (${outcome.errorCode ?? "no code"}); ` +
        "nothing happened, and repeating the same request will not change that",
    );
    this.errorCode = outcome.errorCode;
    this.replayed = outcome.replayed;
  }
}

/**
 * `verification_required`: the outcome is not known (a timeout, a reset, a 5xx); the
 * effect may have happened. Do not call again for this intent with another key; the
 * reconciler settles it, and a later call with the same key replays the outcome.
 */
export class VerificationRequiredError extends OutcomeError<VerificationRequired> {
  /** True when this call reported the unknown outcome; false when it was found unknown. */
  readonly reported: boolean;
  /** The recorded code (`timeout`, …) when this call reported it. */
  readonly errorCode: string | undefined;
  constructor(outcome: VerificationRequired) {
    super(
      outcome,
      "verification required: the outcome of this operation is not known yet and it may " +
        "have taken effect; do not repeat it under another key — it is being verified, and " +
        "the same request later returns the verified result",
    );
    this.reported = outcome.reported;
    this.errorCode = outcome.errorCode;
  }
}

/** `in_progress`: another holder is running this intent now; ask again after `retryAfterMs`. */
export class InProgressError extends OutcomeError<InProgress> {
  /** Milliseconds until the other holder's lease ends. */
  readonly retryAfterMs: number;
  constructor(outcome: InProgress) {
    super(
      outcome,
      `in progress: this operation is running elsewhere; repeat the same request in ` +
        `${Math.ceil(outcome.retryAfterMs / 1000)} s to get its result`,
    );
    this.retryAfterMs = outcome.retryAfterMs;
  }
}

/**
 * `duplicate_intent_suspected`: the same payload is registered under another key
 * (`duplicateOfOperationKey`); nothing was registered or called.
 */
export class DuplicateIntentSuspectedError extends OutcomeError<DuplicateIntentSuspected> {
  /** The key the same payload is registered under. */
  readonly duplicateOfOperationKey: string;
  constructor(outcome: DuplicateIntentSuspected) {
    super(
      outcome,
      "duplicate suspected: the same request is already registered under another key; " +
        "nothing was done — use that operation, or confirm that this is a new intent",
    );
    this.duplicateOfOperationKey = outcome.duplicateOfOperationKey;
  }
}
