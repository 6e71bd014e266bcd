/**
 * The SQLite worker: every blocking SQLite call of the `sqlite` source (the consistent copy,
 * the post-redaction rebuild, quick_check / integrity_check, the journal-mode switch on restore,
 * and the live read's transaction, redaction scan and checks) runs in a `worker_threads` Worker
 * so the main thread keeps hashing, compressing and answering timers.
 *
 * The worker (./sqlite/jobs.worker.ts and the ./sqlite/worker-*.ts modules it imports, started
 * from dist/: see util/worker-path.ts) `require`s better-sqlite3 by the path resolved here, and
 * tests redaction candidates with the redactor's own finders (src/redact/prefilter.ts); a test
 * checks the two agree. One {@link SqliteWorker} serves many jobs in the order they arrive; a job that
 * blocks runs to its end, and the live read's long scans yield every few milliseconds so that
 * a short job (the release of another database's read transaction) is not held up behind them.
 * A job that fails posts the SQLite error code (`SQLITE_BUSY`, `SQLITE_NOTADB`, …) and message
 * back; the caller maps it to a MemsnapError that names its path.
 *
 * Live read jobs (see the module comment of ./sqlite.ts for why they are sound):
 * - `live_begin` opens a read-only connection (kept under a handle number), starts a read
 *   transaction (`BEGIN` + a read) and decides whether the database file itself can be
 *   captured: journal mode, an empty `-wal`, and with `redact` no redaction candidate in any
 *   TEXT or BLOB cell and none in the file's stale bytes (free pages, unallocated and freed space in
 *   b-tree pages, the tails of overflow pages). With `hold` and a yes, the transaction stays
 *   open; otherwise it ends (and with `hold` the connection closes). Without `hold` (a
 *   look-ahead while another database streams) the connection stays open without a
 *   transaction, with the scan result and the `data_version` it was valid for: a later
 *   `live_begin` with `hold` reuses the result when `data_version`, the file's size and mtime
 *   (and an empty `-wal`) are unchanged, else it scans again inside its own transaction.
 * - `live_verify` runs `PRAGMA quick_check` and the row counts inside the held transaction.
 * - `live_release` ends the transaction and closes the connection (idempotent).
 * The file descriptor the stale-byte scan reads through is opened and closed by the caller
 * (see {@link LiveBeginJob.fd}): it must stay open until the connection is closed, since
 * closing any descriptor of a file drops every POSIX lock this process holds on it.
 *
 * @module
 */
import { createRequire } from "node:module";
import { Worker } from "node:worker_threads";
import { aeadAddonPath } from "../../codecs/aead.js";
import { MemsnapError } from "../../errors.js";
import { NATIVE_PREFILTER_PATH, nativePrefilter } from "../../redact/native.js";
import { workerUrl } from "../../util/worker-path.js";
import type { SqliteJob, SqliteReply, SqliteRequest, SqliteWorkerData } from "./worker-types.js";

export type {
  CheckResult,
  CopyResult,
  LiveBeginJob,
  LiveBeginResult,
  LiveScanStats,
  LiveVerifyResult,
  SourcePragmas,
  SqliteJob,
} from "./worker-types.js";

/** A failure inside the worker: the SQLite (or Node) error code and message. */
export class SqliteJobError extends Error {
  readonly sqliteCode: string | undefined;
  constructor(code: string | undefined, message: string) {
    super(message);
    this.name = "SqliteJobError";
    this.sqliteCode = code;
  }
}

let bsqlPathCache: string | undefined;

/** Resolved path of the better-sqlite3 package entry (the worker and the main thread load the same copy). */
export function betterSqlitePath(): string {
  if (bsqlPathCache === undefined) {
    try {
      bsqlPathCache = createRequire(import.meta.url).resolve("better-sqlite3");
    } catch (e) {
      throw new MemsnapError(
        "MEMSNAP_INTERNAL",
        "the sqlite source needs the better-sqlite3 package, which is not installed",
        {
          cause: e,
          hint: "reinstall memsnap (npm install) so its native dependency is built",
        },
      );
    }
  }
  return bsqlPathCache;
}

/**
 * One worker thread that runs SQLite jobs in the order they arrive (a `live_begin` scan yields
 * between pieces, so later short jobs may finish before it). Call {@link SqliteWorker.close}
 * when done: the thread's exit closes every connection it holds.
 */
export class SqliteWorker {
  /** Workers started in this process (tests: a source starts only the ones it uses). */
  static started = 0;
  readonly #worker: Worker;
  readonly #pending = new Map<number, { resolve: (v: unknown) => void; reject: (e: Error) => void }>();
  #nextId = 1;
  #dead: Error | null = null;
  #exited: Promise<void>;

  /** `walk: "js"` keeps the live read's page walk in JS even where the native one is built (tests compare them). */
  constructor(opts: { walk?: "native" | "js" } = {}) {
    SqliteWorker.started++;
    this.#worker = new Worker(workerUrl("sources/sqlite/jobs.worker.js"), {
      execArgv: [],
      resourceLimits: { maxYoungGenerationSizeMb: 16 },
      workerData: {
        bsqlPath: betterSqlitePath(),
        prefilterPath: nativePrefilter() === null ? null : NATIVE_PREFILTER_PATH,
        walk: opts.walk ?? "native",
        aeadPath: aeadAddonPath(),
      } satisfies SqliteWorkerData,
    });
    this.#worker.unref();
    this.#worker.on("message", (m: SqliteReply) => {
      const p = this.#pending.get(m.id);
      if (!p) return;
      this.#pending.delete(m.id);
      if (this.#pending.size === 0) this.#worker.unref();
      if (m.ok) p.resolve(m.result);
      else p.reject(new SqliteJobError(m.code, m.message));
    });
    const fail = (e: Error): void => {
      this.#dead ??= e;
      for (const p of this.#pending.values()) p.reject(e);
      this.#pending.clear();
    };
    this.#worker.on("error", (e) => fail(new SqliteJobError(undefined, `sqlite worker failed: ${e.message}`)));
    this.#exited = new Promise((res) =>
      this.#worker.once("exit", (code) => {
        fail(new SqliteJobError(undefined, `sqlite worker exited (code ${code})`));
        res();
      }),
    );
  }

  /** Run one job; rejects with a {@link SqliteJobError}. An aborted signal terminates the worker. */
  call<T>(job: SqliteJob, signal?: AbortSignal): Promise<T> {
    if (this.#dead) return Promise.reject(this.#dead);
    signal?.throwIfAborted();
    const id = this.#nextId++;
    return new Promise<T>((resolve, reject) => {
      const onAbort = (): void => {
        reject(signal!.reason instanceof Error ? signal!.reason : new Error("aborted"));
        void this.close();
      };
      signal?.addEventListener("abort", onAbort, { once: true });
      this.#pending.set(id, {
        resolve: (v) => {
          signal?.removeEventListener("abort", onAbort);
          resolve(v as T);
        },
        reject: (e) => {
          signal?.removeEventListener("abort", onAbort);
          reject(e);
        },
      });
      this.#worker.ref();
      this.#worker.postMessage({ id, job } satisfies SqliteRequest);
    });
  }

  /** Stop the worker; resolves once its thread has exited (after any native call in progress returns). */
  async close(): Promise<void> {
    await this.#worker.terminate().catch(() => undefined);
    await this.#exited;
  }
}

/** Run one job in a worker of its own. */
export async function runSqliteJob<T>(job: SqliteJob, signal?: AbortSignal): Promise<T> {
  const w = new SqliteWorker();
  try {
    return await w.call<T>(job, signal);
  } finally {
    await w.close();
  }
}
