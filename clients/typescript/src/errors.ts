/**
 * Typed errors decoded from the `google.rpc.ErrorInfo` that every opjournal error carries.
 *
 * Every non-OK status from opjournal carries exactly one `ErrorInfo` (domain
 * `opjournal.dev`) with a stable UPPER_SNAKE `reason`; field errors add a `BadRequest` and
 * retry hints a `RetryInfo` (AIP-193). {@link decodeError} turns a failed call into the
 * {@link OpjournalError} subclass named by that reason, so callers write
 * `if (err instanceof LeaseLostError)` instead of comparing strings. The catalog of reasons
 * is `docs/errors.md` in the opjournal repository.
 *
 * @module
 */

import { Code, ConnectError } from "@connectrpc/connect";
import {
  BadRequestSchema,
  ErrorInfoSchema,
  RetryInfoSchema,
} from "./gen/google/rpc/error_details_pb.js";

/** The ErrorInfo domain of every error the opjournal server produces. */
export const ERROR_DOMAIN = "opjournal.dev";

/** One `google.rpc.BadRequest.FieldViolation`: which request field is wrong. */
export interface FieldViolation {
  readonly field: string;
  readonly description: string;
}

/** What an {@link OpjournalError} is built from. */
export interface OpjournalErrorInit {
  /** The gRPC status code. */
  code: Code;
  /** The status message, for people (never match on it). */
  rawMessage: string;
  /** `ErrorInfo.reason`; empty when the status carried no ErrorInfo. */
  reason?: string;
  /** `ErrorInfo.domain`. */
  domain?: string;
  /** `ErrorInfo.metadata`. */
  metadata?: Record<string, string>;
  /** `BadRequest.field_violations`. */
  fieldViolations?: FieldViolation[];
  /** `RetryInfo.retry_delay` in milliseconds. */
  retryDelayMs?: number;
  /** The original error. */
  cause?: unknown;
}

/**
 * A failed opjournal call. Match on the subclass or on {@link reason}, never on the message.
 */
export class OpjournalError extends Error {
  /** The gRPC status code (`Code.Aborted`, ...). */
  readonly code: Code;
  /** `ErrorInfo.reason`, e.g. `"LEASE_LOST"`; empty for a transport failure. */
  readonly reason: string;
  /** `ErrorInfo.domain`: `"opjournal.dev"` for the server's own errors. */
  readonly domain: string;
  /** `ErrorInfo.metadata`, e.g. `{ status: "succeeded" }`. */
  readonly metadata: Readonly<Record<string, string>>;
  /** The `BadRequest` field violations, if any. */
  readonly fieldViolations: readonly FieldViolation[];
  /** Milliseconds from `RetryInfo.retry_delay`, when the server suggested a delay. */
  readonly retryDelayMs: number | undefined;
  /** The status message without the code prefix. */
  readonly rawMessage: string;

  constructor(init: OpjournalErrorInit) {
    const label = init.reason ? `${Code[init.code]}/${init.reason}` : Code[init.code];
    super(init.rawMessage ? `${label}: ${init.rawMessage}` : label, { cause: init.cause });
    this.name = new.target.name;
    this.code = init.code;
    this.reason = init.reason ?? "";
    this.domain = init.domain ?? "";
    this.metadata = Object.freeze({ ...(init.metadata ?? {}) });
    this.fieldViolations = Object.freeze([...(init.fieldViolations ?? [])]);
    this.retryDelayMs = init.retryDelayMs;
    this.rawMessage = init.rawMessage;
  }
}

/**
 * `ALREADY_EXISTS` / `IDEMPOTENCY_KEY_REUSED`: the key is bound to another request hash or
 * action type. Never call the provider: a changed request is a new intent with a new key.
 */
export class IdempotencyKeyReusedError extends OpjournalError {}
/**
 * `ABORTED` / `LEASE_LOST`: this lease was taken over (or, for RenewLease, it ended). Stop
 * calling the provider for this attempt; Begin again to see the current state.
 */
export class LeaseLostError extends OpjournalError {}
/**
 * `ABORTED` / `LEASE_EXPIRED_BEFORE_CALL`, thrown by `execute` on this side (the journal
 * never sends it): Begin's EXECUTE answer arrived after the lease it granted had ended,
 * measured on this side's monotonic clock from when that Begin was sent. Another holder may
 * already hold the operation, so the provider was not called and nothing was reported.
 * Begin the same intent again (same key): it replays, asks for verification, or grants a
 * new lease.
 */
export class LeaseExpiredBeforeCallError extends OpjournalError {
  constructor(leaseMs: number) {
    super({
      code: Code.Aborted,
      rawMessage:
        `the Begin answer arrived after its lease of ${Math.round(leaseMs)} ms had ended; the provider ` +
        "was not called: begin the same intent again to see where it stands",
      reason: "LEASE_EXPIRED_BEFORE_CALL",
      domain: ERROR_DOMAIN,
    });
  }
}
/** `ABORTED` / `CONCURRENT_MODIFICATION`: repeat the same call after {@link OpjournalError.retryDelayMs}. */
export class ConcurrentModificationError extends OpjournalError {}
/** `FAILED_PRECONDITION` / `OUTCOME_ALREADY_RECORDED`: this token already recorded another outcome. */
export class OutcomeAlreadyRecordedError extends OpjournalError {}
/** `NOT_FOUND` / `OPERATION_NOT_FOUND`: no such key in the namespace. */
export class OperationNotFoundError extends OpjournalError {}
/** `FAILED_PRECONDITION` / `OPERATION_NOT_RECONCILABLE`: pending, terminal or under a live lease. */
export class OperationNotReconcilableError extends OpjournalError {}
/** `FAILED_PRECONDITION` / `RECONCILE_IN_PROGRESS`: someone is looking it up right now. */
export class ReconcileInProgressError extends OpjournalError {}
/** `FAILED_PRECONDITION` / `NO_PROVIDER_ADAPTER`: the action has no lookup; a person settles it. */
export class NoProviderAdapterError extends OpjournalError {}
/** `FAILED_PRECONDITION` / `OPERATION_CHANGED`: ResolveOperation saw another state than the reviewer. */
export class OperationChangedError extends OpjournalError {}
/** `FAILED_PRECONDITION` / `KEY_DERIVATION_DISABLED`: the server has no key derivation secret. */
export class KeyDerivationDisabledError extends OpjournalError {}
/** `INVALID_ARGUMENT`: a malformed request ({@link OpjournalError.reason} says what); fix it. */
export class InvalidArgumentError extends OpjournalError {}
/** `UNAUTHENTICATED`: missing or invalid bearer token. */
export class UnauthenticatedError extends OpjournalError {}
/** `PERMISSION_DENIED`: the token lacks the role or the namespace. */
export class PermissionDeniedError extends OpjournalError {}
/**
 * The journal could not be reached or did not answer in time (`UNAVAILABLE`,
 * `DEADLINE_EXCEEDED`, `CANCELLED`: the server's transport ends a call whose deadline
 * passed with a bare `CANCELLED`, without `ErrorInfo`). The call may or may not have taken
 * effect; every opjournal call, Begin and the reports included, is safe to repeat with the
 * same request and backoff.
 */
export class JournalUnavailableError extends OpjournalError {}
/** `UNAVAILABLE` / `STORE_UNAVAILABLE`: the server cannot reach its database. */
export class StoreUnavailableError extends JournalUnavailableError {}
/**
 * `RESOURCE_EXHAUSTED` / `SERVER_OVERLOADED`: the server is serving as many calls as it
 * allows and did nothing with this one; repeat it after {@link OpjournalError.retryDelayMs}.
 */
export class ServerOverloadedError extends JournalUnavailableError {}

type ErrorClass = new (init: OpjournalErrorInit) => OpjournalError;

const BY_REASON: Readonly<Record<string, ErrorClass>> = {
  IDEMPOTENCY_KEY_REUSED: IdempotencyKeyReusedError,
  LEASE_LOST: LeaseLostError,
  CONCURRENT_MODIFICATION: ConcurrentModificationError,
  OUTCOME_ALREADY_RECORDED: OutcomeAlreadyRecordedError,
  OPERATION_NOT_FOUND: OperationNotFoundError,
  OPERATION_NOT_RECONCILABLE: OperationNotReconcilableError,
  RECONCILE_IN_PROGRESS: ReconcileInProgressError,
  NO_PROVIDER_ADAPTER: NoProviderAdapterError,
  OPERATION_CHANGED: OperationChangedError,
  KEY_DERIVATION_DISABLED: KeyDerivationDisabledError,
  STORE_UNAVAILABLE: StoreUnavailableError,
  SERVER_OVERLOADED: ServerOverloadedError,
};

const BY_CODE: Partial<Record<Code, ErrorClass>> = {
  [Code.InvalidArgument]: InvalidArgumentError,
  [Code.Unauthenticated]: UnauthenticatedError,
  [Code.PermissionDenied]: PermissionDeniedError,
  [Code.Unavailable]: JournalUnavailableError,
  [Code.DeadlineExceeded]: JournalUnavailableError,
  [Code.Canceled]: JournalUnavailableError,
};

/**
 * Decodes any error thrown by a call into the {@link OpjournalError} subclass for its
 * reason: by `ErrorInfo.reason` (domain `opjournal.dev`) first, then by the status code.
 * An {@link OpjournalError} is returned as it is.
 */
export function decodeError(error: unknown): OpjournalError {
  if (error instanceof OpjournalError) {
    return error;
  }
  const connect = ConnectError.from(error);
  const info = connect.findDetails(ErrorInfoSchema)[0];
  const violations = connect
    .findDetails(BadRequestSchema)
    .flatMap((bad) => bad.fieldViolations)
    .map((v) => ({ field: v.field, description: v.description }));
  const retry = connect.findDetails(RetryInfoSchema)[0]?.retryDelay;
  const retryDelayMs =
    retry === undefined ? undefined : Number(retry.seconds) * 1000 + retry.nanos / 1e6;
  const byReason = info && info.domain === ERROR_DOMAIN ? BY_REASON[info.reason] : undefined;
  const cls = byReason ?? BY_CODE[connect.code] ?? OpjournalError;
  return new cls({
    code: connect.code,
    rawMessage: connect.rawMessage,
    reason: info?.reason ?? "",
    domain: info?.domain ?? "",
    metadata: info ? { ...info.metadata } : {},
    fieldViolations: violations,
    retryDelayMs,
    cause: error,
  });
}

/**
 * True when `error` means the call's answer was lost rather than refused: `UNAVAILABLE`,
 * `CANCELLED`, `DEADLINE_EXCEEDED`, or a connection that was refused, reset or closed
 * (which the transport reports as `UNAVAILABLE`, `INTERNAL` or `UNKNOWN` with a socket
 * error as its cause). The call may or may not have taken effect; a report (Complete,
 * Fail, ReportUnknownOutcome) is safe to repeat with the same token and outcome.
 */
export function isLostAnswer(error: unknown): boolean {
  const decoded = decodeError(error);
  switch (decoded.code) {
    case Code.Unavailable:
    case Code.Canceled:
    case Code.DeadlineExceeded:
      return true;
    case Code.Internal:
    case Code.Unknown:
      return decoded.reason === "" && hasSocketCause(decoded.cause);
    default:
      return false;
  }
}

/**
 * Whether a Begin may have been processed although its answer never came: `UNAVAILABLE`
 * (a connection that cannot be made included), `CANCELLED` or `DEADLINE_EXCEEDED`. Such a
 * Begin is repeated with the same attempt id ({@link JournalClient.begin}).
 */
export function isLostBeginAnswer(error: unknown): boolean {
  const code = decodeError(error).code;
  return code === Code.Unavailable || code === Code.Canceled || code === Code.DeadlineExceeded;
}

const SOCKET_CODES = /^(ECONN|EPIPE|ENOTCONN|EHOSTUNREACH|ENETUNREACH|ERR_HTTP2_(GOAWAY|STREAM|SESSION|INVALID_SESSION|PING))/;

function hasSocketCause(error: unknown): boolean {
  for (let e: unknown = error, depth = 0; e instanceof Error && depth < 6; depth++) {
    const code = (e as { code?: unknown }).code;
    if (typeof code === "string" && SOCKET_CODES.test(code)) {
      return true;
    }
    e = e.cause;
  }
  return false;
}
