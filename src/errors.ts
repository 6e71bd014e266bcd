/**
 * The one error class memsnap throws, and the table of stable codes.
 *
 * Codes are API: add, never rename. Each code belongs to one exit class; the CLI maps
 * the class to a process exit code (src/cli/exit-codes.ts). docs/errors.md mirrors this
 * table and a test keeps the two in sync.
 */

/** Failure classes; each maps to one CLI exit code. */
export type ErrorClass =
  | "internal"
  | "usage"
  | "integrity"
  | "key"
  | "malformed"
  | "source"
  | "locked"
  | "destination"
  | "unsafe"
  | "interrupted";

/** Every stable error code with its class and a one-line meaning (used by docs/errors.md). */
export const ERROR_CODES = {
  MEMSNAP_INTERNAL: { class: "internal", meaning: "a bug or an unexpected failure inside memsnap" },
  MEMSNAP_USAGE: { class: "usage", meaning: "bad command-line arguments" },
  MEMSNAP_CONFIG_NOT_FOUND: { class: "usage", meaning: "no memsnap.json where one was expected" },
  MEMSNAP_CONFIG_INVALID: { class: "usage", meaning: "memsnap.json is not valid JSON or has a bad value" },
  MEMSNAP_CONFIG_UNKNOWN_KEY: { class: "usage", meaning: "memsnap.json has a key memsnap does not know" },
  MEMSNAP_SEAL_MISMATCH: { class: "integrity", meaning: "the manifest seal does not match the manifest" },
  MEMSNAP_MANIFEST_CORRUPT: {
    class: "integrity",
    meaning:
      "the manifest is not valid JSON, misses required fields, or has a field outside its grammar (ids, kinds, " +
      "times, nesting)",
  },
  MEMSNAP_PAYLOAD_HASH_MISMATCH: {
    class: "integrity",
    meaning: "the payload bytes do not hash to the manifest's SHA-256 or size",
  },
  MEMSNAP_ARTIFACT_HASH_MISMATCH: {
    class: "integrity",
    meaning: "an artifact's bytes do not match its indexed size or SHA-256",
  },
  MEMSNAP_BASE_MISMATCH: {
    class: "integrity",
    meaning: "an incremental bundle's base is not the bundle it was taken against (another seal or agent)",
  },
  MEMSNAP_INDEX_MISMATCH: {
    class: "integrity",
    meaning: "the payload's entries do not match the artifact index (missing, extra, duplicate, or unbound index)",
  },
  MEMSNAP_VERIFY_FAILED: { class: "integrity", meaning: "verify found one or more problems (each is listed)" },
  MEMSNAP_DEEP_VERIFY_FAILED: { class: "integrity", meaning: "a layer's deep check failed on an artifact" },
  MEMSNAP_GIT_CHAIN_INVALID: {
    class: "integrity",
    meaning:
      "a git layer's chain of bundles is not one: a bundle whose prerequisites the bundles before it do not hold, a " +
      "cycle, a bundle missing or named twice, or more bundles than the bound",
  },
  MEMSNAP_SIGNATURE_INVALID: {
    class: "integrity",
    meaning: "the manifest's signature does not verify (the manifest or the payload it commits to changed)",
  },
  MEMSNAP_SIGNATURE_REQUIRED: {
    class: "key",
    meaning: "--trust (or restore --require-signature) was given and the bundle is unsigned",
  },
  MEMSNAP_SIGNATURE_UNTRUSTED: { class: "key", meaning: "the bundle is signed by a key not given with --trust" },
  MEMSNAP_IDENTITY_REQUIRED: {
    class: "key",
    meaning: "the bundle is encrypted and no identity or passphrase was given",
  },
  MEMSNAP_IDENTITY_INVALID: { class: "key", meaning: "the identity file or recipient could not be parsed" },
  MEMSNAP_DECRYPT_FAILED: {
    class: "key",
    meaning: "no given identity or passphrase opens the bundle, or the ciphertext is damaged",
  },
  MEMSNAP_BUNDLE_TRUNCATED: { class: "malformed", meaning: "the bundle file ends early" },
  MEMSNAP_BUNDLE_MALFORMED: { class: "malformed", meaning: "the bundle is not a memsnap container" },
  MEMSNAP_PAYLOAD_MISLABELED: {
    class: "malformed",
    meaning: "the payload bytes are not what the manifest says (plaintext labelled encrypted, or the reverse)",
  },
  MEMSNAP_UNSUPPORTED_VERSION: {
    class: "malformed",
    meaning: "the bundle's manifest_version is newer than this memsnap reads",
  },
  MEMSNAP_UNSUPPORTED_LAYER: {
    class: "malformed",
    meaning: "a layer kind or layer schema version this memsnap does not read",
  },
  MEMSNAP_PAYLOAD_CORRUPT: {
    class: "malformed",
    meaning: "the decompressed payload is not a valid tar or zstd stream",
  },
  MEMSNAP_BASE_MISSING: {
    class: "source",
    meaning: "an incremental bundle's base (a bundle it references) is not beside it",
  },
  MEMSNAP_SOURCE_MISSING: { class: "source", meaning: "a configured source path does not exist" },
  MEMSNAP_SOURCE_UNREADABLE: { class: "source", meaning: "a source could not be read" },
  MEMSNAP_SOURCE_CHANGED: { class: "source", meaning: "a source file changed size or content while it was captured" },
  MEMSNAP_SOURCE_INVALID: {
    class: "source",
    meaning: "a source's content is not what its kind requires (e.g. a state file that is not JSON)",
  },
  MEMSNAP_SOURCE_DIGEST_MISMATCH: {
    class: "source",
    meaning: "content-addressed source data (a ProcessFork blob or image, a KV page) does not hash to its digest",
  },
  MEMSNAP_UNREDACTED_SECRETS: {
    class: "usage",
    meaning: "a plaintext bundle would hold secrets that cannot be redacted (git history, content-addressed layers)",
  },
  MEMSNAP_PLAINTEXT_PROCESS_MEMORY: {
    class: "usage",
    meaning: "a plaintext bundle would hold process memory (a criu layer), which cannot be redacted",
  },
  MEMSNAP_CRIU_INVALID: {
    class: "source",
    meaning:
      "a CRIU images directory or procs.criu.v1 blob fails validation (magic, framing, pages size, a missing " +
      "per-process image, a parent link outside the capture)",
  },
  MEMSNAP_TRACE_INVALID: {
    class: "source",
    meaning:
      "an agentlog trace fails validation (a record id that does not match its payload, a parent that is not an " +
      "earlier record, a first record that is not metadata, bad JSON)",
  },
  MEMSNAP_PLUGIN_FAILED: {
    class: "source",
    meaning: "a source plugin could not be started, or exited non-zero or on a signal",
  },
  MEMSNAP_PLUGIN_TIMEOUT: { class: "source", meaning: "a source plugin ran past its timeout_ms and was killed" },
  MEMSNAP_PLUGIN_PROTOCOL: {
    class: "source",
    meaning:
      "a source plugin broke the plugin protocol (malformed tar stream, an entry outside its layer or not a regular " +
      "file, a bad response)",
  },
  MEMSNAP_PLUGIN_UNTRUSTED: {
    class: "unsafe",
    meaning:
      "restoring the layer would run the plugin command recorded in the bundle, and MEMSNAP_ALLOW_PLUGINS does not " +
      "allow it",
  },
  MEMSNAP_AGENT_MISMATCH: {
    class: "usage",
    meaning: "the bundle belongs to another tenant/agent than the config (use --as-agent)",
  },
  MEMSNAP_LOCKED: {
    class: "locked",
    meaning:
      "another memsnap process holds the agent's lock, or (in-place restore) another process holds a live file open " +
      "or works inside a live directory",
  },
  MEMSNAP_HOOK_REFUSED: {
    class: "locked",
    meaning:
      "the before_restore hook failed or timed out (the agent was not made ready): the in-place restore did not start",
  },
  MEMSNAP_DEST_UNWRITABLE: {
    class: "destination",
    meaning: "the destination cannot be written (permissions, missing directory)",
  },
  MEMSNAP_DEST_FULL: { class: "destination", meaning: "the destination file system is full" },
  MEMSNAP_DEST_NOT_EMPTY: { class: "destination", meaning: "restore --to needs a new or empty directory" },
  MEMSNAP_DEST_EXISTS: { class: "destination", meaning: "the output file already exists" },
  MEMSNAP_STORE_UNREACHABLE: {
    class: "destination",
    meaning:
      "the object store could not be reached, or kept failing (connection refused or reset, time-outs, 5xx and " +
      "SlowDown), after retries",
  },
  MEMSNAP_STORE_DENIED: {
    class: "destination",
    meaning:
      "the object store refused the credentials (unknown key, bad signature) or denied the request (AccessDenied)",
  },
  MEMSNAP_STORE_NOT_FOUND: { class: "destination", meaning: "the object store has no such bucket" },
  MEMSNAP_STORE_ERROR: {
    class: "destination",
    meaning: "the object store refused a request for another reason (its error code is shown)",
  },
  MEMSNAP_UNSAFE_PATH: {
    class: "unsafe",
    meaning: "a bundle entry would write outside its target or is not a regular file",
  },
  MEMSNAP_JOURNAL_UNTRUSTED: {
    class: "unsafe",
    meaning:
      "the restore journal (.memsnap/journal.json) names a path or a step that an in-place restore under this " +
      "config does not produce: recover changed nothing",
  },
  MEMSNAP_UNSAFE_BUNDLE: {
    class: "unsafe",
    meaning:
      "a bundle exceeds its own declared sizes (zstd/tar bomb, entry longer than declared, oversized manifest) or " +
      "asks for an scrypt work factor over the cap",
  },
  MEMSNAP_INTERRUPTED: {
    class: "interrupted",
    meaning:
      "the command was stopped by SIGINT or SIGTERM before it finished; nothing half-done was left (no partial " +
      "bundle, the live state untouched)",
  },
} as const satisfies Record<string, { class: ErrorClass; meaning: string }>;

/** A stable error code string. */
export type ErrorCode = keyof typeof ERROR_CODES;

/** Options carried by a {@link MemsnapError}. */
export interface MemsnapErrorOptions {
  /** What the user can do about it; printed as `memsnap: hint: …`. */
  hint?: string;
  /** The file or artifact the error is about. */
  path?: string;
  /** Individual findings, for aggregate errors such as MEMSNAP_VERIFY_FAILED. */
  findings?: Finding[];
  cause?: unknown;
}

/** One problem found by verify or restore, with its own code. */
export interface Finding {
  code: ErrorCode;
  message: string;
  path?: string;
}

/** The only error class memsnap throws on purpose. `code` is stable API. */
export class MemsnapError extends Error {
  readonly code: ErrorCode;
  readonly hint: string | undefined;
  readonly path: string | undefined;
  readonly findings: Finding[] | undefined;

  constructor(code: ErrorCode, message: string, opts: MemsnapErrorOptions = {}) {
    super(message, opts.cause === undefined ? undefined : { cause: opts.cause });
    this.name = "MemsnapError";
    this.code = code;
    this.hint = opts.hint;
    this.path = opts.path;
    this.findings = opts.findings;
  }

  /** The failure class of this error's code. */
  get errorClass(): ErrorClass {
    return ERROR_CODES[this.code].class;
  }

  toJSON(): Record<string, unknown> {
    return {
      code: this.code,
      message: this.message,
      ...(this.hint ? { hint: this.hint } : {}),
      ...(this.path ? { path: this.path } : {}),
      ...(this.findings ? { findings: this.findings } : {}),
    };
  }
}

/** True when `e` is a MemsnapError, optionally with the given code. */
export function isMemsnapError(e: unknown, code?: ErrorCode): e is MemsnapError {
  return e instanceof MemsnapError && (code === undefined || e.code === code);
}

/**
 * `e`, or MEMSNAP_INTERRUPTED (`message`, `hint`) when `signal` was aborted: whatever failed on
 * the way out of an interrupted command (a plugin killed, a write aborted) failed because of it.
 */
export function interruptedOr(e: unknown, signal: AbortSignal | undefined, message: string, hint: string): unknown {
  if (!signal?.aborted || isMemsnapError(e, "MEMSNAP_INTERRUPTED")) return e;
  return new MemsnapError("MEMSNAP_INTERRUPTED", message, { hint, cause: e });
}

/**
 * Turn a Node file-system error on an output path into a destination error, keeping
 * MemsnapErrors as they are. ENOSPC and EDQUOT become MEMSNAP_DEST_FULL; EFBIG (a file size
 * limit, `ulimit -f`) says so in its hint.
 */
export function destinationError(e: unknown, path: string): MemsnapError {
  if (e instanceof MemsnapError) return e;
  const errno = (e as NodeJS.ErrnoException | undefined)?.code;
  if (errno === "ENOSPC" || errno === "EDQUOT") {
    // One hint for every command that writes: a snapshot's bundle, a restore's tree (--to or in place).
    return new MemsnapError(
      "MEMSNAP_DEST_FULL",
      `${errno === "EDQUOT" ? "disk quota exceeded" : "no space left"} writing ${path}`,
      {
        path,
        cause: e,
        hint:
          "free space on that file system (or raise the quota), or write elsewhere: snapshot --out/--store, " +
          "restore --to",
      },
    );
  }
  if (errno === "EFBIG") {
    return new MemsnapError("MEMSNAP_DEST_UNWRITABLE", `cannot write ${path}: ${(e as Error)?.message ?? String(e)}`, {
      path,
      cause: e,
      hint:
        "the file would be larger than this process may write (`ulimit -f`) or the file system allows: raise " +
        "the limit or write elsewhere",
    });
  }
  return new MemsnapError("MEMSNAP_DEST_UNWRITABLE", `cannot write ${path}: ${(e as Error)?.message ?? String(e)}`, {
    path,
    cause: e,
    hint: "check that the directory exists and is writable",
  });
}

/** A source path that is missing or cannot be read, as a MemsnapError (an existing one passes through). */
export function sourceError(e: unknown, path: string): MemsnapError {
  if (e instanceof MemsnapError) return e;
  const code = (e as NodeJS.ErrnoException).code;
  if (code === "ENOENT") {
    return new MemsnapError("MEMSNAP_SOURCE_MISSING", `source path does not exist: ${path}`, {
      path,
      hint: "fix the source's path in memsnap.json or create it",
    });
  }
  return new MemsnapError("MEMSNAP_SOURCE_UNREADABLE", `cannot read ${path}: ${(e as Error).message}`, {
    path,
    cause: e,
    hint:
      code === "ENAMETOOLONG"
        ? "the path is longer than the system allows (4 KiB); point the source at a folder nearer to it"
        : "check the file's permissions",
  });
}

/** A source file that changed size or content while it was captured. */
export function sourceChanged(path: string, what: string): MemsnapError {
  return new MemsnapError("MEMSNAP_SOURCE_CHANGED", `${path} changed while it was captured (${what})`, {
    path,
    hint: "retry the snapshot; stop writers or snapshot databases through an sqlite source",
  });
}
