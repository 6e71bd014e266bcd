/**
 * The SQLite worker (see ../sqlite-worker.ts, its host): runs the `sqlite` source's blocking
 * SQLite calls off the main thread, one job after another in the order they arrive (a live
 * read's scan yields between pieces). Started from its compiled file (util/worker-path.ts).
 */
import { renameSync, rmSync } from "node:fs";
import { parentPort as port } from "node:worker_threads";
import { candidate } from "./worker-candidate.js";
import { closeHandle, handles } from "./worker-handles.js";
import { liveBegin, liveVerify } from "./worker-live.js";
import { load, ordinaryTables, qi } from "./worker-sql.js";
import type { CheckResult, CopyResult, SourcePragmas, SqliteJob, SqliteReply, SqliteRequest } from "./worker-types.js";

const parentPort = port!;

async function run(job: SqliteJob): Promise<unknown> {
  const D = load();
  if (job.op === "copy") {
    const src = new D(job.src, { readonly: true, fileMustExist: true, timeout: job.busyTimeoutMs });
    try {
      // Each page is read about once: a small cache will do. better-sqlite3's default (16 MB)
      // made VACUUM INTO of the realistic home's memory.db (66 MB and a 34 MB WAL) take 36 MiB
      // more RSS, now 7, and 350 → 300 ms.
      src.pragma("cache_size = -1024");
      const pragmas = src.transaction((): SourcePragmas => ({
        journal_mode: String(src.pragma("journal_mode", { simple: true })).toLowerCase(),
        page_size: src.pragma("page_size", { simple: true }) as number,
        user_version: src.pragma("user_version", { simple: true }) as number,
        schema_version: src.pragma("schema_version", { simple: true }) as number,
        application_id: src.pragma("application_id", { simple: true }) as number,
        encoding: src.pragma("encoding", { simple: true }) as string,
      }))();
      const t0 = process.hrtime.bigint();
      let method = job.method || "vacuum_into";
      if (method === "vacuum_into") {
        try {
          src.prepare("VACUUM INTO ?").run(job.dest);
        } catch (e) {
          // A plain SQL error (not busy, locked, corrupt, I/O): try the one-step backup instead.
          if (!e || (e as { code?: unknown }).code !== "SQLITE_ERROR") throw e;
          rmSync(job.dest, { force: true });
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
      return { pragmas, method, ms } satisfies CopyResult;
    } finally {
      src.close();
    }
  }
  if (job.op === "check") {
    const db = new D(job.path, { readonly: true, fileMustExist: true });
    try {
      db.pragma("cache_size = -1024"); // as for the copy: one pass over the pages
      const problems = db
        .prepare<[], unknown>("PRAGMA " + job.pragma + "(" + Number(job.limit) + ")")
        .pluck()
        .all()
        .map(String);
      const out: CheckResult = { problems };
      if (job.counts && problems.length === 1 && problems[0] === "ok") {
        const tables: Record<string, number> = {};
        for (const t of ordinaryTables(db)) {
          tables[t] = db
            .prepare<[], number>("SELECT count(*) FROM " + qi(t))
            .pluck()
            .get()!;
        }
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
    rmSync(out, { force: true });
    const db = new D(job.path, { readonly: true, fileMustExist: true });
    try {
      db.pragma("cache_size = -1024"); // as for the copy: one pass over the pages
      db.prepare("VACUUM INTO ?").run(out);
    } catch (e) {
      rmSync(out, { force: true });
      throw e;
    } finally {
      db.close();
    }
    renameSync(out, job.path);
    return {};
  }
  if (job.op === "live_begin") return liveBegin(job);
  if (job.op === "live_verify") return liveVerify(job);
  if (job.op === "live_release") {
    const h = handles.get(job.handle);
    if (h) {
      const idle = h.busy ? h.idle : undefined;
      closeHandle(h); // a scan in progress on it stops at its next yield
      // and the host closes the descriptor only once no read of the scan is still on the pool
      // (the scan's own answer goes first: its reply is posted before this one's)
      if (idle) {
        await idle;
        await new Promise((r) => setImmediate(r));
      }
    }
    return {};
  }
  if (job.op === "probe_candidate") return job.texts.map(candidate);
  if (job.op === "materialize") {
    const db = new D(job.path, { fileMustExist: true });
    try {
      db.prepare("SELECT count(*) FROM sqlite_schema").pluck().get();
      let mode = String(db.pragma("journal_mode", { simple: true })).toLowerCase();
      if (job.journalMode === "wal" && mode !== "wal") {
        mode = String(db.pragma("journal_mode = WAL", { simple: true })).toLowerCase();
      }
      return { journal_mode: mode };
    } finally {
      db.close(); // the last connection checkpoints and removes -wal/-shm
    }
  }
  throw new Error("unknown job " + (job as { op: string }).op);
}

parentPort.on("message", (m: SqliteRequest) => {
  run(m.job).then(
    (result) => parentPort.postMessage({ id: m.id, ok: true, result } satisfies SqliteReply),
    (e: { code?: string; message?: unknown } | null) => {
      const message = String((e && e.message) || e);
      parentPort.postMessage({ id: m.id, ok: false, code: e?.code, message } satisfies SqliteReply);
    },
  );
});
