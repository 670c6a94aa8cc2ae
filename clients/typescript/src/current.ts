/**
 * What {@link idempotent} and the MCP tools share: the provider call in progress (read with
 * {@link currentCall}) and the error classifier hook.
 *
 * @module
 */

import { AsyncLocalStorage } from "node:async_hooks";

import {
  INVALID_ERROR_CODE,
  ProviderRejected,
  unknownOutcomeCode,
  type ExecuteOptions,
  type ProviderCall,
} from "./execute.js";

/**
 * What an error classifier decides for an error thrown by the provider call: a confirmed
 * rejection with its error code (the provider proved nothing happened: FailOperation), or
 * an unknown outcome with its code (ReportUnknownOutcome). Codes are 1-100 characters of
 * `[A-Za-z0-9._:-]`.
 */
export type Classification = { rejected: string } | { unknown: string };

/** The provider call in progress, as {@link currentCall} gives it inside the function. */
export interface CurrentCall extends ProviderCall {
  /** The idempotency key of the intent in the journal (in its namespace). */
  readonly operationKey: string;
}

const calls = new AsyncLocalStorage<CurrentCall>();

/**
 * The provider call that the function wrapped by `idempotent` (or a journaled MCP tool) is
 * running now: send `providerKey` to the provider as its idempotency key, and pass
 * `signal` to `fetch` (it is aborted with a `LeaseLostError` when the lease is lost).
 *
 * @throws {Error} when called outside such a function.
 */
export function currentCall(): CurrentCall {
  const call = calls.getStore();
  if (call === undefined) {
    throw new Error("currentCall() is only available inside a function run by idempotent()");
  }
  return call;
}

/** Runs `fn` with `call` as the {@link currentCall}. */
export function withCurrentCall<T>(call: CurrentCall, fn: () => Promise<T>): Promise<T> {
  return calls.run(call, fn);
}

/**
 * The `isConfirmedRejection` and `unknownErrorCode` of execute for a classifier hook:
 * where the hook answers undefined, the safe default holds (a {@link ProviderRejected} is a
 * confirmed rejection; anything else is unknown, coded by {@link unknownOutcomeCode}). The
 * hook runs once per error. An answer that is neither `{ rejected: string }` nor
 * `{ unknown: string }` is an unknown outcome ({@link INVALID_ERROR_CODE}); a hook that
 * throws, or a malformed code, is an unknown outcome too (see `execute`).
 */
export function classifierOptions(
  classify: ((error: unknown) => Classification | undefined) | undefined,
): Pick<ExecuteOptions, "isConfirmedRejection" | "unknownErrorCode"> {
  let last: { error: unknown; decided: Classification | undefined } | undefined;
  const decide = (error: unknown): Classification | undefined => {
    if (last === undefined || last.error !== error) {
      last = { error, decided: checked(classify?.(error)) };
    }
    return last.decided;
  };
  return {
    isConfirmedRejection: (error) => {
      const decided = decide(error);
      if (decided !== undefined) {
        return "rejected" in decided ? decided.rejected : undefined;
      }
      return error instanceof ProviderRejected ? error.errorCode : undefined;
    },
    unknownErrorCode: (error) => {
      const decided = decide(error);
      return decided !== undefined && "unknown" in decided ? decided.unknown : unknownOutcomeCode(error);
    },
  };
}

/** A hook's answer as a {@link Classification}: anything malformed is `invalid_error_code`. */
function checked(decided: unknown): Classification | undefined {
  if (decided === undefined) {
    return undefined;
  }
  if (typeof decided === "object" && decided !== null) {
    const { rejected, unknown } = decided as { rejected?: unknown; unknown?: unknown };
    if (typeof rejected === "string" && unknown === undefined) {
      return { rejected };
    }
    if (typeof unknown === "string" && rejected === undefined) {
      return { unknown };
    }
  }
  return { unknown: INVALID_ERROR_CODE };
}
