/**
 * The live read's jobs in the SQLite worker: `live_begin` (a read transaction, and whether the
 * database file itself can be captured: see the module comment of ../sqlite-worker.ts) and
 * `live_verify` (the checks inside the held transaction).
 */
import { fstatSync, statSync } from "node:fs";
import { type CandidateCells, scanCells, scanTargets } from "./worker-cells.js";
import { closeHandle, type Handle, handles, released } from "./worker-handles.js";
import type { CellState } from "./worker-pages.js";
import { load, ordinaryTables, qi } from "./worker-sql.js";
import type { PassHooks } from "./worker-changed.js";
import { scanStale } from "./worker-stale.js";
import type {
  LiveBeginJob,
  LiveBeginResult,
  LiveScanStats,
  LiveVerifyResult,
  SourcePragmas,
  SqliteJob,
} from "./worker-types.js";

function walBytes(src: string): number {
  try {
    return statSync(src + "-wal").size;
  } catch (e) {
    if (e && (e as NodeJS.ErrnoException).code === "ENOENT") return 0;
    throw e;
  }
}

/** Start (or look ahead on) a live read; see the module comment of ../sqlite-worker.ts. */
export async function liveBegin(job: LiveBeginJob): Promise<LiveBeginResult> {
  const D = load();
  const t0 = performance.now();
  let h = handles.get(job.handle);
  if (!h) {
    h = { id: job.handle, db: null, fd: job.fd, released: false, cache: null };
    handles.set(job.handle, h);
    try {
      h.db = new D(job.src, { readonly: true, fileMustExist: true, timeout: job.busyTimeoutMs });
      h.db.pragma("cache_size = -4096"); // every page is read about once: a small cache will do
    } catch (e) {
      closeHandle(h);
      throw e;
    }
  }
  const db = h.db!;
  h.busy = true;
  h.verified = undefined; // a check of an earlier transaction says nothing of this one
  let settle!: () => void;
  h.idle = new Promise<void>((r) => (settle = r));
  try {
    db.exec("BEGIN");
    db.prepare("SELECT count(*) FROM sqlite_schema").pluck().get(); // the read transaction starts here
    const pragmas: SourcePragmas = {
      journal_mode: String(db.pragma("journal_mode", { simple: true })).toLowerCase(),
      page_size: db.pragma("page_size", { simple: true }) as number,
      user_version: db.pragma("user_version", { simple: true }) as number,
      schema_version: db.pragma("schema_version", { simple: true }) as number,
      application_id: db.pragma("application_id", { simple: true }) as number,
      encoding: db.pragma("encoding", { simple: true }) as string,
    };
    const dataVersion = db.pragma("data_version", { simple: true }) as number;
    const pageCount = db.pragma("page_count", { simple: true }) as number;
    const wal = pragmas.journal_mode === "wal" ? walBytes(job.src) : 0;
    const stat = fstatSync(h.fd);
    const virtualTables = db
      .prepare<[], { name: string; sql: string | null }>(
        "SELECT name, sql FROM sqlite_schema WHERE type = 'table' AND sql LIKE 'CREATE VIRTUAL%'",
      )
      .all()
      .map((r) => ({ name: r.name, sql: r.sql || "" }));
    const out: LiveBeginResult = {
      eligible: false,
      pragmas,
      size: stat.size,
      mtimeMs: stat.mtimeMs,
      walBytes: wal,
      virtualTables,
      ms: 0,
    };
    let reason: string | null = null;
    let candidates: Array<string | Uint8Array> | undefined;
    let pages: { pageSize: number; table: Uint8Array; sha256: string } | undefined;
    if (pragmas.journal_mode === "wal") {
      if (wal > 0) reason = "wal_frames";
    } else if (!["delete", "truncate", "persist"].includes(pragmas.journal_mode)) {
      reason = "journal_mode=" + pragmas.journal_mode;
    }
    if (!reason && stat.size < pageCount * pragmas.page_size) reason = "size";
    // The stale-byte scan reads a latin1 view of the bytes: only UTF-8 text shows there as text.
    if (!reason && job.redact && pragmas.encoding !== "UTF-8") reason = "encoding=" + pragmas.encoding;
    if (!reason && job.redact) {
      const c = h.cache;
      if (c && c.dataVersion === dataVersion && c.size === stat.size && c.mtimeMs === stat.mtimeMs) {
        out.scan = c.scan;
        out.reused = true;
        reason = c.reason;
        candidates = c.candidates;
        pages = c.pages;
        // the same committed state as the look-ahead's transaction checked (see the cache's key)
        if (c.verified) h.verified = c.verified;
      } else {
        const st: LiveScanStats = {
          tables: 0,
          cells_scanned: 0,
          text_bytes: 0,
          candidates: 0,
          stale_bytes: 0,
          free_pages: 0,
          ms: 0,
        };
        const s0 = performance.now();
        try {
          // One pass over the pages: the stale bytes and (the fast path) every cell's TEXT.
          // "scan" once the walk starts (an empty file or a refused freelist never does)
          const cells: { state: CellState; collect?: CandidateCells } = { state: "unparsed" };
          const hashesOut: PassHooks = {};
          const limit = job.verifyLimit;
          if (job.base && limit !== undefined && Number.isSafeInteger(limit) && limit > 0) {
            // most likely read live again (the last snapshot was): check it while the pool hashes
            hashesOut.during = () => {
              try {
                h!.verified = { ...verifyNow(db, limit), limit };
              } catch {
                // (a database SQLite cannot check: live_verify runs it again and reports that)
              }
            };
          }
          const stale = await scanStale(h, st, stat.size, pageCount, cells, job.base ?? null, hashesOut);
          pages = hashesOut.hashes;
          // Candidate cells are collected (for the host's redactor to rule on) only when the
          // stale bytes are clean: a stale hit sends the database to the copy path anyway. The
          // page walk collects them as it goes (./worker-pages.ts); the SQL scan starts afresh.
          let collect: CandidateCells | null = stale === null && cells.collect ? cells.collect : null;
          st.cells_via = "pages";
          if (cells.state !== "scan") {
            collect = stale === null ? { cells: [], bytes: 0, overflow: false } : null;
            // a hit, or pages this parser cannot read (or a freelist it refused): SQL decides
            st.cells_via = "sql";
            st.cells_scanned = 0;
            st.text_bytes = 0;
            st.candidates = 0;
            const c0 = performance.now();
            await scanCells(h, st, collect);
            st.cells_ms = Math.round(performance.now() - c0);
          }
          st.tables = scanTargets(db).length;
          if (st.candidates) reason = "redaction_candidate";
          else reason = stale;
          if (reason === "redaction_candidate" && collect && !collect.overflow && collect.cells.length) {
            candidates = collect.cells;
          }
        } catch (e) {
          const x = e as { code?: unknown; message?: unknown } | null;
          const code = x && typeof x.code === "string" ? x.code : "";
          if (code.startsWith("SQLITE_") || code === "MEMSNAP_RELEASED") throw e;
          // a value the scan cannot read as a string: copy instead
          reason = "scan_failed: " + String((x && x.message) || e);
        }
        st.ms = Math.round(performance.now() - s0);
        out.scan = st;
        h.cache = {
          dataVersion,
          size: stat.size,
          mtimeMs: stat.mtimeMs,
          scan: st,
          reason,
          candidates,
          pages,
          verified: h.verified,
        };
      }
    }
    if (h.released) throw released();
    out.eligible = !reason;
    if (reason) out.reason = reason;
    if (candidates) out.candidates = candidates;
    if (pages) out.pages = pages;
    out.ms = Math.round(performance.now() - t0);
    // With candidate cells the transaction is held too: the host may find them clean and read the file.
    if (job.hold && (out.eligible || candidates)) {
      h.holding = true;
      return out;
    }
    db.exec("COMMIT"); // a look-ahead (or a no): end the transaction now
    if (job.hold) closeHandle(h);
    return out;
  } catch (e) {
    h.busy = false;
    closeHandle(h);
    throw e;
  } finally {
    h.busy = false;
    settle();
  }
}

/**
 * Run `PRAGMA quick_check` and the row counts inside the held transaction.
 *
 * The whole check, on an incremental snapshot too (issue 38 weighed a cheaper one). In a full
 * snapshot it runs beside the stream: the source posts this job before it yields the artifact
 * and awaits it in check(), after the pages were read and hashed. In an incremental one the
 * stream is a few pages, so live_begin ran it already, while its changed-page pass hashed on the
 * pool (LiveBeginJob.verifyLimit; here ~0.15-0.2 CPU-s per 255 MiB: a pread per page), and this
 * answers with that result. A check of only the
 * b-trees holding pages that changed since the base (whose full check passed on byte-identical
 * unchanged pages) would not prove what this one does: SQLite's partial check
 * (`quick_check(<table>)`) leaves out the page accounting (every page used exactly once, and the
 * freelist), which is where a change to one page shows up as damage around it. An interior page
 * that lost a child pointer leaves unchanged pages unreferenced (rows gone, only "never used"
 * says so); a changed page pointing into an unchanged tree's page is a second reference that only
 * the whole map sees when that tree is not checked. Which trees own the changed pages is itself
 * known only from a walk of every tree's interior pages and overflow chains. A sound shortcut
 * needs the base's page ownership and the references its changed pages held (the base's bytes,
 * which a snapshot never reads). Memory-mapped reads (3-4x cheaper here) were dropped for their
 * RSS (docs/BENCHMARK.md), and would turn an I/O error or a truncation by a non-SQLite writer
 * into SIGBUS.
 */
export function liveVerify(job: Extract<SqliteJob, { op: "live_verify" }>): LiveVerifyResult {
  const h = handles.get(job.handle);
  if (!h || !h.holding) throw new Error("no live read transaction " + job.handle);
  const done = h.verified;
  h.verified = undefined;
  if (done && done.limit === job.limit) {
    const { limit: _, ...v } = done;
    return { ...v, ahead: true };
  }
  return verifyNow(h.db!, job.limit);
}

/** quick_check(limit) and, when it passes, the row count of every ordinary table. */
function verifyNow(db: NonNullable<Handle["db"]>, limit: number): LiveVerifyResult {
  const t0 = performance.now();
  const problems = db
    .prepare<[], unknown>("PRAGMA quick_check(" + Number(limit) + ")")
    .pluck()
    .all()
    .map(String);
  const t1 = performance.now();
  const tables: Record<string, number> = {};
  if (problems.length === 1 && problems[0] === "ok") {
    for (const t of ordinaryTables(db)) {
      tables[t] = db
        .prepare<[], number>("SELECT count(*) FROM " + qi(t))
        .pluck()
        .get()!;
    }
  }
  return { problems, tables, quickCheckMs: Math.round(t1 - t0), countMs: Math.round(performance.now() - t1) };
}
