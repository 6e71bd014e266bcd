/**
 * The S3 client for an s3 store, configured the AWS way (the SDK's credential chain: environment,
 * shared config and credentials files, AWS_PROFILE, ...), plus memsnap's own knobs, and the map
 * from SDK and network errors to MemsnapErrors with hints.
 *
 * Environment: MEMSNAP_S3_ENDPOINT (an S3-compatible server; else the config's s3_endpoint),
 * MEMSNAP_S3_PATH_STYLE (0/1; default 1 when an endpoint is set), MEMSNAP_S3_MAX_ATTEMPTS
 * (default 5; see BackoffRetry), MEMSNAP_S3_TIMEOUT_MS (a request with no bytes moving for this long is retried;
 * default 30000). Region: AWS_REGION, AWS_DEFAULT_REGION, the profile's, else us-east-1.
 */
import { S3Client } from "@aws-sdk/client-s3";
import { readFileSync } from "node:fs";
import { rootCertificates } from "node:tls";
import { MemsnapError } from "../errors.js";
import { intEnv, s3Endpoint } from "./location.js";

export { s3Endpoint, useConfiguredEndpoint } from "./location.js";

export interface S3ClientOptions {
  /** The config's s3_endpoint (MEMSNAP_S3_ENDPOINT wins over it). */
  endpoint?: string;
}

/**
 * The CA bundle for https endpoints: bin/memsnap.js keeps NODE_EXTRA_CA_CERTS from node's start
 * (memsnap made no TLS connections), so a private CA named there is added here.
 */
function extraCa(env: NodeJS.ProcessEnv): string[] | undefined {
  const file = env.NODE_EXTRA_CA_CERTS || env.MEMSNAP_SAVED_EXTRA_CA_CERTS;
  if (!file) return undefined;
  try {
    return [...rootCertificates, readFileSync(file, "utf8")];
  } catch {
    return undefined;
  }
}

/** A retry token: the retry it stands for and the delay before it. */
class RetryTicket {
  constructor(
    readonly count: number,
    readonly delay: number,
  ) {}
  getRetryCount(): number {
    return this.count;
  }
  getRetryDelay(): number {
    return this.delay;
  }
}

/**
 * The SDK's retry contract (RetryStrategyV2), with exponential backoff and full jitter: a delay
 * drawn from [0, base x 2^(n-1)), capped at 20 s; base 250 ms, 1 s for throttling (SlowDown), at
 * least what a Retry-After asks. Unlike the SDK's standard strategy there is no client-wide retry
 * budget: a multipart upload's parts fail together when the server is down, and the budget (about
 * 35 retries) ran out after ~10 s, whatever maxAttempts said.
 */
export class BackoffRetry {
  readonly mode = "standard";
  constructor(readonly maxAttempts: number) {}
  async acquireInitialRetryToken(_scope: string): Promise<RetryTicket> {
    return new RetryTicket(0, 0);
  }
  async refreshRetryTokenForRetry(
    t: RetryTicket,
    info: { errorType: string; retryAfterHint?: Date },
  ): Promise<RetryTicket> {
    const n = t.getRetryCount() + 1;
    if (n >= this.maxAttempts || (info.errorType !== "THROTTLING" && info.errorType !== "TRANSIENT")) {
      throw new Error("no more retries");
    }
    const base = info.errorType === "THROTTLING" ? 1000 : 250;
    let delay = Math.floor(Math.random() * Math.min(20_000, base * 2 ** (n - 1)));
    if (info.retryAfterHint instanceof Date)
      delay = Math.max(delay, Math.min(20_000, info.retryAfterHint.getTime() - Date.now()));
    return new RetryTicket(n, delay);
  }
  recordSuccess(_t: RetryTicket): void {}
}

/** An S3 client for a store (the location is not needed to configure it; kept for per-store settings). */
export function s3ClientFor(
  _loc: { bucket: string },
  env: NodeJS.ProcessEnv = process.env,
  opts: S3ClientOptions = {},
): S3Client {
  // The SDK warns on every run that its releases after January 2027 need Node 22; memsnap pins one that supports 20.
  process.env.AWS_SDK_JS_NODE_VERSION_SUPPORT_WARNING_DISABLED ??= "true";
  const endpoint = s3Endpoint(env, opts);
  const pathStyle = env.MEMSNAP_S3_PATH_STYLE ? env.MEMSNAP_S3_PATH_STYLE !== "0" : endpoint !== undefined;
  const maxAttempts = intEnv(env, "MEMSNAP_S3_MAX_ATTEMPTS", 5, 1, 100);
  const timeout = intEnv(env, "MEMSNAP_S3_TIMEOUT_MS", 30_000, 100, 3_600_000);
  const explicitRegion = env.AWS_REGION || env.AWS_DEFAULT_REGION;
  // No region set: the profile's (the SDK's own provider), else us-east-1 (S3-compatible servers mostly ignore it).
  let probe: S3Client | undefined;
  const region =
    explicitRegion ??
    (async () => {
      try {
        probe ??= new S3Client({});
        return await probe.config.region();
      } catch {
        return "us-east-1";
      } finally {
        probe?.destroy();
      }
    });
  const ca = endpoint?.startsWith("https:") ? extraCa(env) : undefined;
  // Keys in `env` first, as the SDK's chain does for process.env (so a caller's env is honoured);
  // otherwise the chain: shared files, AWS_PROFILE, SSO, container and instance roles.
  const credentials =
    env.AWS_ACCESS_KEY_ID && env.AWS_SECRET_ACCESS_KEY
      ? {
          accessKeyId: env.AWS_ACCESS_KEY_ID,
          secretAccessKey: env.AWS_SECRET_ACCESS_KEY,
          ...(env.AWS_SESSION_TOKEN ? { sessionToken: env.AWS_SESSION_TOKEN } : {}),
        }
      : undefined;
  return new S3Client({
    region,
    ...(credentials ? { credentials } : {}),
    ...(endpoint ? { endpoint } : {}),
    forcePathStyle: pathStyle,
    maxAttempts,
    retryStrategy: new BackoffRetry(maxAttempts),
    requestHandler: {
      connectionTimeout: Math.min(timeout, 10_000),
      socketTimeout: timeout,
      ...(ca ? { httpsAgent: { ca, keepAlive: true } } : {}),
    },
    // Checksums only where the API requires them: S3-compatible servers differ on the newer CRC headers.
    requestChecksumCalculation: "WHEN_REQUIRED",
    responseChecksumValidation: "WHEN_REQUIRED",
  });
}

const NETWORK_CODES = new Set([
  "ECONNREFUSED",
  "ECONNRESET",
  "ETIMEDOUT",
  "EPIPE",
  "ENOTFOUND",
  "EAI_AGAIN",
  "EHOSTUNREACH",
  "ENETUNREACH",
  "ECONNABORTED",
  "UND_ERR_SOCKET",
]);
const DENIED = new Set([
  "InvalidAccessKeyId",
  "SignatureDoesNotMatch",
  "AccessDenied",
  "InvalidToken",
  "ExpiredToken",
  "TokenRefreshRequired",
  "AuthorizationHeaderMalformed",
  "AllAccessDisabled",
  "AccountProblem",
  "InvalidSecurity",
  "CredentialsProviderError",
]);
const BUSY = new Set([
  "SlowDown",
  "ServiceUnavailable",
  "InternalError",
  "RequestTimeout",
  "TimeoutError",
  "Throttling",
]);

interface SdkError {
  name?: string;
  code?: string;
  Code?: string;
  message?: string;
  $metadata?: { httpStatusCode?: number; attempts?: number };
  cause?: unknown;
}

/** The network error code under `e` (the SDK passes Node's errors through, sometimes wrapped). */
function networkCode(e: SdkError | undefined, depth = 0): string | undefined {
  if (!e || depth > 4) return undefined;
  if (typeof e.code === "string" && NETWORK_CODES.has(e.code)) return e.code;
  const agg = (e as { errors?: SdkError[] }).errors;
  if (Array.isArray(agg)) for (const x of agg) if (networkCode(x, depth + 1)) return networkCode(x, depth + 1);
  return networkCode(e.cause as SdkError | undefined, depth + 1);
}

/**
 * Map an error from the SDK (or the network under it) to a MemsnapError; `what` says what was
 * being done ("upload s3://b/p/x.memsnap"). MemsnapErrors pass through unchanged.
 */
export function s3Error(e: unknown, what: string, env: NodeJS.ProcessEnv = process.env): MemsnapError {
  if (e instanceof MemsnapError) return e;
  const err = (e ?? {}) as SdkError;
  const name = err.Code || err.name || "Error";
  const status = err.$metadata?.httpStatusCode;
  const attempts = err.$metadata?.attempts;
  const tried = attempts && attempts > 1 ? ` after ${attempts} attempts` : "";
  const endpoint = env.MEMSNAP_S3_ENDPOINT || "the AWS endpoint";
  const detail = err.message && err.message !== name ? `${name}: ${err.message}` : name;
  const net = networkCode(err);
  if (net || name === "TimeoutError") {
    return new MemsnapError(
      "MEMSNAP_STORE_UNREACHABLE",
      `${what}: the object store did not answer${tried} (${net ?? detail})`,
      {
        hint:
          `check that ${endpoint} is up and reachable (MEMSNAP_S3_ENDPOINT); ` +
          "retries: MEMSNAP_S3_MAX_ATTEMPTS, stall time-out: MEMSNAP_S3_TIMEOUT_MS",
        cause: e,
      },
    );
  }
  if (DENIED.has(name) || status === 403) {
    const creds =
      name === "CredentialsProviderError"
        ? "no credentials were found: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE"
        : name === "AccessDenied" || (status === 403 && !DENIED.has(name))
          ? "the credentials lack a permission this needs (s3:PutObject, s3:GetObject, s3:ListBucket, " +
            "s3:AbortMultipartUpload); check the bucket and IAM policies"
          : "check AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (or AWS_PROFILE) and the clock";
    return new MemsnapError("MEMSNAP_STORE_DENIED", `${what}: the object store denied access (${detail})`, {
      hint: creds,
      cause: e,
    });
  }
  if (name === "NoSuchBucket") {
    return new MemsnapError("MEMSNAP_STORE_NOT_FOUND", `${what}: no such bucket (${detail})`, {
      hint:
        "create the bucket first (e.g. `aws s3 mb s3://BUCKET`), or fix the store URL (--store, MEMSNAP_STORE, " +
        "config store)",
      cause: e,
    });
  }
  if (BUSY.has(name) || (status !== undefined && status >= 500)) {
    return new MemsnapError("MEMSNAP_STORE_UNREACHABLE", `${what}: the object store kept failing${tried} (${detail})`, {
      hint: "the server is overloaded or failing; try again later (MEMSNAP_S3_MAX_ATTEMPTS sets the retries)",
      cause: e,
    });
  }
  if (name === "AbortError") {
    return new MemsnapError("MEMSNAP_INTERRUPTED", `${what}: stopped`, { cause: e });
  }
  return new MemsnapError(
    "MEMSNAP_STORE_ERROR",
    `${what}: the object store refused the request (${detail}${status ? `, HTTP ${status}` : ""})`,
    {
      hint: "see the store's error code above; check the store URL and the server's limits",
      cause: e,
    },
  );
}
