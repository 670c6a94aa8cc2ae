/**
 * The gRPC service config shipped with the server's contract
 * (`proto/opjournal/v1/service_config.json`; a test in the repository keeps this copy equal
 * to it), and the interceptor that applies its retry policy: Connect's gRPC transport has
 * no service-config support of its own.
 *
 * @module
 */

import { Code, ConnectError, type Interceptor } from "@connectrpc/connect";

/** The retry policy of one group of methods (gRPC's `retryPolicy`). */
export interface RetryPolicy {
  /** Attempts in all, the first included. */
  maxAttempts: number;
  /** The first pause, as a gRPC duration string (`"0.1s"`). */
  initialBackoff: string;
  /** The longest pause (`"2s"`). */
  maxBackoff: string;
  /** Each pause's growth. */
  backoffMultiplier: number;
  /** The status codes repeated, by name (`"UNAVAILABLE"`). */
  retryableStatusCodes: readonly string[];
}

/** gRPC's service config, the part this client reads. */
export interface ServiceConfig {
  methodConfig: readonly {
    name: readonly { service: string; method?: string }[];
    retryPolicy?: RetryPolicy;
  }[];
  retryThrottling?: { maxTokens: number; tokenRatio: number };
}

/** The service config every {@link JournalClient.connect} uses unless told otherwise. */
export const SERVICE_CONFIG: ServiceConfig = {
  "methodConfig": [
    {
      "name": [
        { "service": "opjournal.v1.OperationJournal", "method": "BeginOperation" },
        { "service": "opjournal.v1.OperationJournal", "method": "CompleteOperation" },
        { "service": "opjournal.v1.OperationJournal", "method": "FailOperation" },
        { "service": "opjournal.v1.OperationJournal", "method": "ReportUnknownOutcome" },
        { "service": "opjournal.v1.OperationJournal", "method": "RenewLease" },
        { "service": "opjournal.v1.OperationJournal", "method": "GetOperation" },
        { "service": "opjournal.v1.OperationJournal", "method": "ListOperations" },
        { "service": "opjournal.v1.OperationJournal", "method": "DeriveOperationKey" },
        { "service": "opjournal.v1.Reconciler", "method": "ListOperationsForReview" },
        { "service": "opjournal.v1.Reconciler", "method": "GetOperationHistory" }
      ],
      "retryPolicy": {
        "maxAttempts": 4,
        "initialBackoff": "0.1s",
        "maxBackoff": "2s",
        "backoffMultiplier": 2,
        "retryableStatusCodes": ["UNAVAILABLE"]
      }
    }
  ],
  "retryThrottling": {
    "maxTokens": 10,
    "tokenRatio": 0.1
  }
};

/** A gRPC duration string (`"0.1s"`) in milliseconds. */
function millis(duration: string): number {
  return Number(duration.replace(/s$/, "")) * 1000;
}

/** `SCREAMING_SNAKE` code names to Connect's codes. */
function codeOf(name: string): Code | undefined {
  const camel = name.toLowerCase().replace(/_([a-z])/g, (_, c: string) => c.toUpperCase());
  const key = (camel.charAt(0).toUpperCase() + camel.slice(1)).replace(/^Cancelled$/, "Canceled");
  return (Code as unknown as Record<string, Code>)[key];
}

/** The policy `config` gives `service`/`method`, if any. */
export function retryPolicyFor(
  config: ServiceConfig,
  service: string,
  method: string,
): RetryPolicy | undefined {
  for (const entry of config.methodConfig) {
    if (entry.name.some((n) => n.service === service && (n.method === undefined || n.method === method))) {
      return entry.retryPolicy;
    }
  }
  return undefined;
}

/**
 * An interceptor that repeats a unary call as `config`'s retry policy says: the same request
 * again, after a randomized exponential pause, while the status code is retryable and the
 * call's deadline has not passed; at most `maxAttempts` attempts. Like gRPC's own retry
 * throttling, repeats stop while most recent calls failed (`retryThrottling`).
 */
export function retryInterceptor(config: ServiceConfig = SERVICE_CONFIG): Interceptor {
  const throttling = config.retryThrottling;
  let tokens = throttling?.maxTokens ?? 0;
  return (next) => async (request) => {
    const policy = request.stream ? undefined : retryPolicyFor(config, request.service.typeName, request.method.name);
    if (policy === undefined) {
      return next(request);
    }
    const retryable = new Set(policy.retryableStatusCodes.map(codeOf));
    let pause = millis(policy.initialBackoff);
    for (let attempt = 1; ; attempt++) {
      try {
        const response = await next(request);
        if (throttling) {
          tokens = Math.min(throttling.maxTokens, tokens + throttling.tokenRatio);
        }
        return response;
      } catch (error) {
        const code = ConnectError.from(error).code;
        if (!retryable.has(code)) {
          throw error;
        }
        if (throttling) {
          tokens = Math.max(0, tokens - 1);
        }
        const throttled = throttling !== undefined && tokens <= throttling.maxTokens / 2;
        if (attempt >= policy.maxAttempts || throttled || request.signal.aborted) {
          throw error;
        }
        await new Promise((resolve) => setTimeout(resolve, Math.random() * pause));
        pause = Math.min(pause * policy.backoffMultiplier, millis(policy.maxBackoff));
      }
    }
  };
}
