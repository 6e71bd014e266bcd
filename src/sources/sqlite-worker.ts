/**
 * The SQLite worker: every blocking SQLite call of the `sqlite` source (the consistent copy,
 * the post-redaction rebuild, quick_check / integrity_check, and the journal-mode switch on restore) runs in a
 * `worker_threads` Worker so the main thread keeps hashing, compressing and answering timers.
 *
 * The worker runs an inline (eval'd) CommonJS script that `require`s better-sqlite3 by its
 * resolved path, so it works the same from the TypeScript sources (vitest) and from dist/.
 * One {@link SqliteWorker} serves many jobs, one at a time, in order. A job that fails posts
 * the SQLite error code (`SQLITE_BUSY`, `SQLITE_NOTADB`, …) and message back; the caller maps
 * it to a MemsnapError that names its path.
 *
 * @module
 */
import { createRequire } from "node:module";
import { Worker } from "node:worker_threads";
import { MemsnapError } from "../errors.js";

/** Source pragmas read in one read transaction before the copy. */
export interface SourcePragmas {
  journal_mode: string;
  page_size: number;
  user_version: number;
  schema_version: number;
  application_id: number;
  encoding: string;
}

/** What the `copy` job returns. */
export interface CopyResult {
  pragmas: SourcePragmas;
  /** `vacuum_into`, or `backup` (one-step online backup) when VACUUM INTO failed with a plain SQL error. */
  method: "vacuum_into" | "backup";
  /** Wall time of the copy alone, in milliseconds. */
  ms: number;
}

/** What the `check` job returns. */
export interface CheckResult {
  /** The pragma's rows: `["ok"]` when the database is sound. */
  problems: string[];
  /** Row count of every ordinary table (not `sqlite_%`, shadow or virtual tables), when asked. */
  tables?: Record<string, number>;
}

export type SqliteJob =
  | { op: "copy"; src: string; dest: string; busyTimeoutMs: number; method?: "vacuum_into" | "backup" }
  | { op: "check"; path: string; pragma: "quick_check" | "integrity_check"; limit: number; counts?: boolean }
  | { op: "vacuum"; path: string }
  | { op: "materialize"; path: string; journalMode: string | null };

/** A failure inside the worker: the SQLite (or Node) error code and message. */
export class SqliteJobError extends Error {
  readonly sqliteCode: string | undefined;
  constructor(code: string | undefined, message: string) {
    super(message);
    this.name = "SqliteJobError";
    this.sqliteCode = code;
  }
}

const WORKER_SOURCE = String.raw`
"use strict";
const { parentPort, workerData } = require("node:worker_threads");
const fs = require("node:fs");
let Database = null;
function load() {
  if (!Database) Database = require(workerData.bsqlPath);
  return Database;
}
const qi = (s) => '"' + String(s).replace(/"/g, '""') + '"';
function ordinaryTables(db) {
  return db.pragma("table_list")
    .filter((t) => t.schema === "main" && t.type === "table" && !/^sqlite_/i.test(t.name))
    .map((t) => t.name)
    .sort((a, b) => (a < b ? -1 : a > b ? 1 : 0));
}

async function run(job) {
  const D = load();
  if (job.op === "copy") {
    const src = new D(job.src, { readonly: true, fileMustExist: true, timeout: job.busyTimeoutMs });
    try {
      const pragmas = src.transaction(() => ({
        journal_mode: String(src.pragma("journal_mode", { simple: true })).toLowerCase(),
        page_size: src.pragma("page_size", { simple: true }),
        user_version: src.pragma("user_version", { simple: true }),
        schema_version: src.pragma("schema_version", { simple: true }),
        application_id: src.pragma("application_id", { simple: true }),
        encoding: src.pragma("encoding", { simple: true }),
      }))();
      const t0 = process.hrtime.bigint();
      let method = job.method || "vacuum_into";
      if (method === "vacuum_into") {
        try {
          src.prepare("VACUUM INTO ?").run(job.dest);
        } catch (e) {
          // A plain SQL error (not busy, locked, corrupt, I/O): try the one-step backup instead.
          if (!e || e.code !== "SQLITE_ERROR") throw e;
          fs.rmSync(job.dest, { force: true });
          method = "backup";
        }
      }
      if (method === "backup") {
        // All pages in one step: a stepped backup restarts on every write by another
        // connection and may never finish. (better-sqlite3 clamps the returned page count to
        // 0..2^31-1, and 0 means zero pages per step, not all: the backup would spin forever.
        // Its first step always moves 0 pages; the second moves them all.)
        await src.backup(job.dest, { progress: () => 0x7fffffff });
      }
      const ms = Number(process.hrtime.bigint() - t0) / 1e6;
      return { pragmas, method, ms };
    } finally {
      src.close();
    }
  }
  if (job.op === "check") {
    const db = new D(job.path, { readonly: true, fileMustExist: true });
    try {
      const problems = db.prepare("PRAGMA " + job.pragma + "(" + Number(job.limit) + ")").pluck().all().map(String);
      const out = { problems };
      if (job.counts && problems.length === 1 && problems[0] === "ok") {
        const tables = {};
        for (const t of ordinaryTables(db)) tables[t] = db.prepare("SELECT count(*) FROM " + qi(t)).pluck().get();
        out.tables = tables;
      }
      return out;
    } finally {
      db.close();
    }
  }
  if (job.op === "vacuum") {
    // Rebuild the copy from its live rows: VACUUM INTO a fresh file, then rename it over the
    // copy (one write of the data instead of an in-place VACUUM's two, and no journal holding
    // the old pages). Every page of the result is built from the current (redacted) rows.
    const out = job.path + ".vacuum";
    fs.rmSync(out, { force: true });
    const db = new D(job.path, { readonly: true, fileMustExist: true });
    try {
      db.prepare("VACUUM INTO ?").run(out);
    } catch (e) {
      fs.rmSync(out, { force: true });
      throw e;
    } finally {
      db.close();
    }
    fs.renameSync(out, job.path);
    return {};
  }
  if (job.op === "materialize") {
    const db = new D(job.path, { fileMustExist: true });
    try {
      db.prepare("SELECT count(*) FROM sqlite_schema").pluck().get();
      let mode = String(db.pragma("journal_mode", { simple: true })).toLowerCase();
      if (job.journalMode === "wal" && mode !== "wal") mode = String(db.pragma("journal_mode = WAL", { simple: true })).toLowerCase();
      return { journal_mode: mode };
    } finally {
      db.close(); // the last connection checkpoints and removes -wal/-shm
    }
  }
  throw new Error("unknown job " + job.op);
}

parentPort.on("message", (m) => {
  run(m.job).then(
    (result) => parentPort.postMessage({ id: m.id, ok: true, result }),
    (e) => parentPort.postMessage({ id: m.id, ok: false, code: e && e.code, message: String((e && e.message) || e) }),
  );
});
`;

let bsqlPathCache: string | undefined;

/** Resolved path of the better-sqlite3 package entry (the worker and the main thread load the same copy). */
export function betterSqlitePath(): string {
  if (bsqlPathCache === undefined) {
    try {
      bsqlPathCache = createRequire(import.meta.url).resolve("better-sqlite3");
    } catch (e) {
      throw new MemsnapError("MEMSNAP_INTERNAL", "the sqlite source needs the better-sqlite3 package, which is not installed", {
        cause: e, hint: "reinstall memsnap (npm install) so its native dependency is built",
      });
    }
  }
  return bsqlPathCache;
}

type Reply = { id: number; ok: true; result: unknown } | { id: number; ok: false; code?: string; message: string };

/** One worker thread that runs SQLite jobs in order. Call {@link SqliteWorker.close} when done. */
export class SqliteWorker {
  readonly #worker: Worker;
  readonly #pending = new Map<number, { resolve: (v: unknown) => void; reject: (e: Error) => void }>();
  #nextId = 1;
  #dead: Error | null = null;
  #exited: Promise<void>;

  constructor() {
    this.#worker = new Worker(WORKER_SOURCE, { eval: true, execArgv: [], workerData: { bsqlPath: betterSqlitePath() } });
    this.#worker.unref();
    this.#worker.on("message", (m: Reply) => {
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
    this.#exited = new Promise((res) => this.#worker.once("exit", (code) => {
      fail(new SqliteJobError(undefined, `sqlite worker exited (code ${code})`));
      res();
    }));
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
        resolve: (v) => { signal?.removeEventListener("abort", onAbort); resolve(v as T); },
        reject: (e) => { signal?.removeEventListener("abort", onAbort); reject(e); },
      });
      this.#worker.ref();
      this.#worker.postMessage({ id, job });
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
