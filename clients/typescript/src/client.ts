/**
 * A thin, typed wrapper over the generated `OperationJournal` and `Reconciler` services,
 * over gRPC (`createGrpcTransport`: the server speaks gRPC, not the Connect protocol).
 *
 * Every method sends the bearer token (when one is given) and a deadline, and throws the
 * {@link OpjournalError} subclass for the status's `ErrorInfo.reason`.
 *
 * @module
 */

import { createClient, type Client, type Interceptor, type Transport } from "@connectrpc/connect";
import { createGrpcTransport, Http2SessionManager } from "@connectrpc/connect-node";
import { randomUUID } from "node:crypto";
import type { SecureClientSessionOptions } from "node:http2";

import { decodeError, isLostAnswer, isLostBeginAnswer } from "./errors.js";
import { retryInterceptor, SERVICE_CONFIG, type ServiceConfig } from "./service-config.js";
import { jsonText, JsonValue } from "./json.js";
import { execute, type ExecuteOptions, type Outcome, type ProviderCall, type ProviderResult } from "./execute.js";
import {
  OperationJournal,
  Reconciler,
  type BeginOperationResponse,
  type Operation,
  type ReconcileOperationResponse,
} from "./gen/opjournal/v1/journal_pb.js";

/** Milliseconds each call may take before it fails with `DEADLINE_EXCEEDED`. */
export const DEFAULT_TIMEOUT_MS = 10_000;

/**
 * Milliseconds for which a report (Complete, Fail, ReportUnknownOutcome) whose answer was
 * lost is repeated, with backoff, before its error is thrown.
 */
export const DEFAULT_REPORT_RETRY_MS = 30_000;

/** Milliseconds a Begin whose answer was lost is repeated for, unless the client says otherwise. */
export const DEFAULT_BEGIN_RETRY_MS = 10_000;

/** Options of every {@link JournalClient}, however it was built. */
export interface ClientOptions {
  /**
   * Milliseconds each call may take (its gRPC deadline); default {@link DEFAULT_TIMEOUT_MS}.
   * A call that runs out fails with `DEADLINE_EXCEEDED` ({@link JournalUnavailableError}).
   */
  timeoutMs?: number;
  /**
   * Milliseconds for which a report whose answer was lost (`UNAVAILABLE`, `CANCELLED`,
   * `DEADLINE_EXCEEDED`, a refused or reset connection) is repeated with the same lease
   * token and the same outcome, with backoff (100 ms doubling to 2 s); default
   * {@link DEFAULT_REPORT_RETRY_MS}, 0 to never repeat. The journal answers a repeated
   * report with the record of the first, so repeating is always safe.
   */
  reportRetryMs?: number;
  /**
   * Milliseconds for which a Begin whose answer was lost (`UNAVAILABLE`, `CANCELLED`,
   * `DEADLINE_EXCEEDED`) is repeated with the same attempt id, with the same backoff;
   * default {@link DEFAULT_BEGIN_RETRY_MS}, 0 to never repeat. The journal answers the
   * repeat with the lease it granted to the first, so the provider is still called once.
   */
  beginRetryMs?: number;
}

/** How {@link JournalClient.connect} reaches the server. */
export interface ConnectOptions extends ClientOptions {
  /** A bearer token, sent as `authorization: Bearer <token>` on every call. */
  token?: string;
  /**
   * TLS settings for an `https://` URL (Node's `http2.connect` options): `ca` trusts a
   * private CA, `cert` and `key` are the client certificate for mutual TLS.
   */
  tls?: Pick<SecureClientSessionOptions, "ca" | "cert" | "key" | "servername">;
  /**
   * The gRPC service config whose retry policy is applied ({@link retryInterceptor}):
   * {@link SERVICE_CONFIG} (the one shipped with the contract: RPCs safe to repeat are
   * repeated on `UNAVAILABLE`, at most 4 attempts) unless given; `null` repeats nothing.
   */
  serviceConfig?: ServiceConfig | null;
}

/** The fields of BeginOperation; see {@link JournalClient.begin}. */
export interface BeginRequest {
  /** The idempotency key naming the business intent (not the network attempt). */
  operationKey: string;
  /** The action as named in the server's policy, e.g. `"create_payment"`. */
  actionType: string;
  /**
   * The provider request's parameters: a JSON object as text, or a plain object (written by
   * {@link toJsonText}; a `Map`, a class instance, a `BigInt`… throw a `TypeError` before
   * anything is sent). Only its SHA-256 (RFC 8785 canonical form) is stored.
   */
  payload: unknown;
  /** The tenant namespace; empty or absent means `default`. */
  namespace?: string;
  /** The lease to ask for, in seconds; 0 or absent means the action's default. */
  leaseSeconds?: number;
  /** Business links kept with the record (not hashed), e.g. `{ order_id: "817" }`. */
  references?: Record<string, string>;
  /** Proceed after `DECISION_DUPLICATE_INTENT_SUSPECTED`: this really is a new intent. */
  confirmDuplicateIntent?: boolean;
  /**
   * The id of this Begin intent: 16-64 characters of `[A-Za-z0-9_-]`. Absent: a new random
   * UUID for each {@link JournalClient.begin} call (and one per {@link execute} call, kept
   * for all its Begins). Pass your own only to repeat one intent's Begin yourself; never
   * reuse one for another intent.
   */
  attemptId?: string;
}

/**
 * `value` as JSON text: a string is taken as JSON text already; a {@link JsonValue} is
 * written as its value (a string in it becomes a JSON string); anything else with
 * {@link jsonText}, which refuses what `JSON.stringify` would change silently.
 *
 * @throws {TypeError} the value cannot be written as JSON without loss: a `Map`, a `Set`,
 *   a class instance without `toJSON`, a function, a symbol, a `BigInt`, `NaN`, `undefined`
 *   in an array (see {@link jsonText}). For a payload this is thrown before anything is
 *   sent, so two different intents never hash the same.
 */
export function toJsonText(value: unknown): string {
  if (value instanceof JsonValue) {
    return jsonText(value.value);
  }
  if (typeof value === "string") {
    return value;
  }
  return jsonText(value);
}

/** The `result_json` of a report: `""` (no result body) for undefined or a {@link JsonValue} of undefined. */
function resultText(result: unknown): string {
  if (result === undefined || (result instanceof JsonValue && result.value === undefined)) {
    return "";
  }
  return toJsonText(result);
}

/** Runs one call, rejecting with the decoded {@link OpjournalError}. */
async function decoded<T>(call: Promise<T>): Promise<T> {
  try {
    return await call;
  } catch (error) {
    throw decodeError(error);
  }
}

function bearer(token: string): Interceptor {
  return (next) => (request) => {
    request.header.set("authorization", `Bearer ${token}`);
    return next(request);
  };
}

/**
 * A client of one opjournal server. Build one with {@link JournalClient.connect}, or pass
 * your own gRPC transport; call {@link close} when done.
 */
export class JournalClient {
  /**
   * The generated OperationJournal client, for calls not wrapped here. It rejects with
   * `ConnectError`; {@link decodeError} turns that into the typed error.
   */
  readonly journal: Client<typeof OperationJournal>;
  /** The generated Reconciler client, for calls not wrapped here (see {@link journal}). */
  readonly reconciler: Client<typeof Reconciler>;
  /** Milliseconds each call may take (its deadline). */
  readonly timeoutMs: number;
  /** Milliseconds for which a report whose answer was lost is repeated (see {@link ClientOptions}). */
  readonly reportRetryMs: number;
  /** Milliseconds for which a Begin whose answer was lost is repeated (see {@link ClientOptions}). */
  readonly beginRetryMs: number;
  private readonly sessions: Http2SessionManager | undefined;

  /**
   * @param transport a gRPC transport (`createGrpcTransport`), or use {@link JournalClient.connect}.
   * @param sessions the HTTP/2 session manager to close in {@link close}, if any.
   * @param options deadlines and report repetition.
   */
  constructor(transport: Transport, sessions?: Http2SessionManager, options: ClientOptions = {}) {
    this.journal = createClient(OperationJournal, transport);
    this.reconciler = createClient(Reconciler, transport);
    this.sessions = sessions;
    this.timeoutMs = options.timeoutMs ?? DEFAULT_TIMEOUT_MS;
    this.reportRetryMs = options.reportRetryMs ?? DEFAULT_REPORT_RETRY_MS;
    this.beginRetryMs = options.beginRetryMs ?? DEFAULT_BEGIN_RETRY_MS;
  }

  /**
   * Connects to `baseUrl` (`http://host:port`, or `https://host:port` for TLS) over gRPC.
   */
  static connect(baseUrl: string, options: ConnectOptions = {}): JournalClient {
    const sessions = new Http2SessionManager(baseUrl, {}, options.tls ?? {});
    const interceptors = options.token ? [bearer(options.token)] : [];
    const serviceConfig = options.serviceConfig === undefined ? SERVICE_CONFIG : options.serviceConfig;
    if (serviceConfig !== null) {
      // Outermost: each repeat goes through the other interceptors again.
      interceptors.unshift(retryInterceptor(serviceConfig));
    }
    const transport = createGrpcTransport({
      baseUrl,
      sessionManager: sessions,
      interceptors,
      defaultTimeoutMs: options.timeoutMs ?? DEFAULT_TIMEOUT_MS,
    });
    return new JournalClient(transport, sessions, options);
  }

  /** Closes the HTTP/2 connection this client opened (a no-op for a passed transport). */
  close(): void {
    this.sessions?.abort();
  }

  /**
   * BeginOperation: registers the intent and, where the rules allow, claims a lease. The
   * response's `decision` says what to do (see {@link execute}).
   *
   * Sent under `request.attemptId` (a new random UUID when absent). A Begin whose answer is
   * lost (`UNAVAILABLE`, `CANCELLED`, `DEADLINE_EXCEEDED`: the journal may have granted a
   * lease) is repeated with the same attempt id for up to {@link beginRetryMs}, with
   * backoff; the journal answers the repeat with the lease it granted to the first, instead
   * of `DECISION_IN_PROGRESS` against it.
   *
   * @throws {IdempotencyKeyReusedError} the key is bound to another payload or action type.
   * @throws {InvalidArgumentError} a malformed key, payload, attempt id or field.
   * @throws {JournalUnavailableError} no answer within {@link beginRetryMs}.
   */
  async begin(request: BeginRequest): Promise<BeginOperationResponse> {
    const message = {
      namespace: request.namespace ?? "",
      operationKey: request.operationKey,
      actionType: request.actionType,
      payloadJson: toJsonText(request.payload),
      leaseSeconds: request.leaseSeconds ?? 0,
      references: request.references ?? {},
      confirmDuplicateIntent: request.confirmDuplicateIntent ?? false,
      attemptId: request.attemptId ?? randomUUID(),
    };
    return this.repeat(
      () => this.journal.beginOperation(message, this.callOptions()),
      this.beginRetryMs,
      isLostBeginAnswer,
    );
  }

  /**
   * CompleteOperation: records a confirmed success; resolves to the SUCCEEDED record.
   * `result` (JSON text, a value, or a {@link JsonValue} to write a string as a JSON string;
   * absent for no result body) is sanitized by the server's policy before it is stored and
   * replayed.
   *
   * A call whose answer was lost is repeated with the same token and outcome for up to
   * {@link reportRetryMs} (see {@link ClientOptions.reportRetryMs}).
   *
   * @throws {LeaseLostError} the lease was taken over.
   * @throws {OutcomeAlreadyRecordedError} this token already recorded another outcome.
   * @throws {InvalidArgumentError} e.g. `RESULT_TOO_LARGE`, `INVALID_EXTERNAL_ID`.
   * @throws {JournalUnavailableError} the journal did not answer within {@link reportRetryMs}.
   */
  async complete(
    leaseToken: string,
    outcome: { externalId?: string; result?: unknown } = {},
  ): Promise<Operation> {
    const request = {
      leaseToken,
      externalId: outcome.externalId ?? "",
      resultJson: resultText(outcome.result),
    };
    const response = await this.report(() => this.journal.completeOperation(request, this.callOptions()));
    return required(response.operation);
  }

  /**
   * FailOperation: records a definitive rejection (no effect happened); resolves to the
   * FAILED_FINAL record. `errorCode`: 1-100 characters of `[A-Za-z0-9._:-]`. Repeated like
   * {@link complete} when its answer is lost.
   *
   * @throws {LeaseLostError} | {OutcomeAlreadyRecordedError} | {InvalidArgumentError}
   */
  async fail(leaseToken: string, errorCode: string): Promise<Operation> {
    const response = await this.report(() =>
      this.journal.failOperation({ leaseToken, errorCode }, this.callOptions()),
    );
    return required(response.operation);
  }

  /**
   * ReportUnknownOutcome: the effect may or may not have happened; resolves to the UNKNOWN
   * record. `errorCode` is a short machine code such as `"timeout"`. Repeated like
   * {@link complete} when its answer is lost.
   *
   * @throws {LeaseLostError} | {OutcomeAlreadyRecordedError} | {InvalidArgumentError}
   */
  async reportUnknown(leaseToken: string, errorCode = ""): Promise<Operation> {
    const response = await this.report(() =>
      this.journal.reportUnknownOutcome({ leaseToken, errorCode }, this.callOptions()),
    );
    return required(response.operation);
  }

  /**
   * RenewLease: extends a live lease to `leaseSeconds` from now (database clock).
   *
   * @throws {LeaseLostError} the lease has ended or was taken over.
   */
  async renewLease(leaseToken: string, leaseSeconds: number): Promise<Operation> {
    const response = await decoded(this.journal.renewLease({ leaseToken, leaseSeconds }, this.callOptions()));
    return required(response.operation);
  }

  /**
   * GetOperation: reads one record.
   *
   * @throws {OperationNotFoundError} no such key in the namespace.
   */
  async get(operationKey: string, options: { namespace?: string } = {}): Promise<Operation> {
    const response = await decoded(this.journal.getOperation({
      namespace: options.namespace ?? "",
      operationKey,
    }, this.callOptions()));
    return required(response.operation);
  }

  /**
   * DeriveOperationKey: an opaque, stable key (`ok_…`) for an intent reference that may
   * hold personal data; the reference is never stored.
   *
   * @throws {KeyDerivationDisabledError} the server has no key derivation secret.
   */
  async deriveKey(
    actionType: string,
    intentReference: string,
    options: { namespace?: string } = {},
  ): Promise<string> {
    const response = await decoded(this.journal.deriveOperationKey({
      namespace: options.namespace ?? "",
      actionType,
      intentReference,
    }, this.callOptions()));
    return response.operationKey;
  }

  /**
   * ReconcileOperation: asks the provider now what happened to an UNKNOWN operation (or
   * one whose lease expired) and applies the answer.
   *
   * @throws {OperationNotFoundError} | {OperationNotReconcilableError} |
   *   {ReconcileInProgressError} | {NoProviderAdapterError}
   */
  async reconcile(
    operationKey: string,
    options: { namespace?: string } = {},
  ): Promise<ReconcileOperationResponse> {
    return decoded(this.reconciler.reconcileOperation({
      namespace: options.namespace ?? "",
      operationKey,
    }, this.callOptions()));
  }

  /** The options of one generated call: this client's deadline. */
  private callOptions(): { timeoutMs: number } {
    return { timeoutMs: this.timeoutMs };
  }

  /**
   * Runs one report, repeating it while its answer is lost ({@link isLostAnswer}) for up to
   * {@link reportRetryMs}, with backoff: 100 ms doubling to 2 s, each wait drawn between
   * half and all of that. Every other error, and the last lost one, is thrown decoded.
   */
  private async report<T>(send: () => Promise<T>): Promise<T> {
    return this.repeat(send, this.reportRetryMs, isLostAnswer);
  }

  /**
   * Runs `send`, repeating it unchanged while `lost` says its answer was lost, for up to
   * `boundMs`, with the backoff of {@link report}.
   */
  private async repeat<T>(
    send: () => Promise<T>,
    boundMs: number,
    lost: (error: unknown) => boolean,
  ): Promise<T> {
    const deadline = Date.now() + boundMs;
    for (let delay = 100; ; delay = Math.min(delay * 2, 2000)) {
      try {
        return await send();
      } catch (error) {
        const decodedError = decodeError(error);
        const wait = delay / 2 + (Math.random() * delay) / 2;
        if (!lost(decodedError) || Date.now() + wait > deadline) {
          throw decodedError;
        }
        await new Promise((resolve) => setTimeout(resolve, wait));
      }
    }
  }

  /** {@link execute} with this client: runs `call` at most once per intent. */
  execute(
    request: BeginRequest,
    call: (call: ProviderCall) => Promise<ProviderResult>,
    options?: ExecuteOptions,
  ): Promise<Outcome> {
    return execute(this, request, call, options);
  }
}

function required(operation: Operation | undefined): Operation {
  if (operation === undefined) {
    throw new TypeError("the server answered without an operation");
  }
  return operation;
}
