/**
 * The SQLite worker: every blocking SQLite call of the `sqlite` source (the consistent copy,
 * the post-redaction rebuild, quick_check / integrity_check, the journal-mode switch on restore,
 * and the live read's transaction, redaction scan and checks) runs in a `worker_threads` Worker
 * so the main thread keeps hashing, compressing and answering timers.
 *
 * The worker runs an inline (eval'd) CommonJS script that `require`s better-sqlite3 by its
 * resolved path, so it works the same from the TypeScript sources (vitest) and from dist/.
 * For the same reason it cannot import src/redact/prefilter.ts: it gets the pre-filter's
 * finders as JavaScript source (src/redact/finders-js.ts, the very code prefilter.ts builds its
 * `FINDERS` from) and the main scanner's alternatives, and builds `candidate()` from them as
 * prefilter.ts does; a test checks the two agree. One {@link SqliteWorker} serves many jobs in the order they arrive; a job that
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
import { MemsnapError } from "../errors.js";
import { ESCAPES_JS } from "../redact/escapes-js.js";
import { FINDERS_JS } from "../redact/finders-js.js";
import { HIDING_ESCAPE } from "../redact/json.js";
import { NATIVE_PREFILTER_PATH, nativePrefilter } from "../redact/native.js";
import { MAIN_ALTERNATIVES } from "../redact/prefilter.js";

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

/** What the live read's redaction scan found (counts, never content). */
export interface LiveScanStats {
  /** Tables whose TEXT and BLOB cells were scanned (every real table but sqlite_schema: ordinary, shadow and sqlite_stat*). */
  tables: number;
  cells_scanned: number;
  /** Bytes of TEXT (UTF-8) and BLOB cells scanned. */
  text_bytes: number;
  /** Cells (or, when the scan stops, chunks of cells) the pre-filter flagged; the scan stops at the first. */
  candidates: number;
  /** Bytes of stale space (free pages, unallocated and freed space, overflow tails) that are not all zero and were scanned. */
  stale_bytes: number;
  /** Pages whose whole content is stale (free pages, pages past the database's end). */
  free_pages: number;
  /** Wall time of the scan, milliseconds, and of its TEXT-cell part. */
  ms: number;
  cells_ms?: number;
  /**
   * How the TEXT cells were scanned: `pages` (parsed from the pages in the stale-byte walk), or
   * `sql` (group_concat per table: when the page walk found a candidate or could not read a page).
   */
  cells_via?: "pages" | "sql";
  /** Which page walk ran: `native` (native/prefilter/sqlite_walk.c) or `js` (the same walk in the worker's JS). */
  walk?: "native" | "js";
  /** Where the first hit is (`table`, or `stale page N`), never the text. */
  found?: string;
  /** Set by the source when the result came from a look-ahead and still held (same `data_version`, size and mtime). */
  reused?: boolean;
}

/** What `live_begin` returns. */
export interface LiveBeginResult {
  /** True when the database file itself may be captured (with `hold`: the read transaction is held). */
  eligible: boolean;
  /** Why not: `journal_mode=<mode>`, `wal_frames`, `redaction_candidate`, `stale_candidate`, `stale_token`, `freelist`, `size`, `encoding=<enc>` (with redaction), `scan_failed: …`. */
  reason?: string;
  pragmas: SourcePragmas;
  /** The file's size, read through `fd` inside the read transaction. */
  size: number;
  mtimeMs: number;
  /** `-wal` size in bytes (0 when absent). */
  walBytes: number;
  /** With `redact`: the scan, fresh or reused from a look-ahead (`reused`). */
  scan?: LiveScanStats;
  reused?: boolean;
  /** Virtual tables (name and declaration), for the redaction meta. */
  virtualTables: Array<{ name: string; sql: string }>;
  /** Wall time of the job, milliseconds. */
  ms: number;
}

/** What `live_verify` returns. */
export interface LiveVerifyResult {
  problems: string[];
  tables: Record<string, number>;
  quickCheckMs: number;
  countMs: number;
}

/** Start (or look ahead on) a live read; see the module comment. */
export interface LiveBeginJob {
  op: "live_begin";
  handle: number;
  src: string;
  /**
   * An open read-only descriptor of `src`, owned by the caller, who closes it only after
   * `live_release` of this handle has settled (or the worker has exited).
   */
  fd: number;
  busyTimeoutMs: number;
  redact: boolean;
  hold: boolean;
}

export type SqliteJob =
  | { op: "copy"; src: string; dest: string; busyTimeoutMs: number; method?: "vacuum_into" | "backup" }
  | { op: "check"; path: string; pragma: "quick_check" | "integrity_check"; limit: number; counts?: boolean }
  | { op: "vacuum"; path: string }
  | { op: "materialize"; path: string; journalMode: string | null }
  | LiveBeginJob
  | { op: "live_verify"; handle: number; limit: number }
  | { op: "live_release"; handle: number }
  | { op: "probe_candidate"; texts: string[] };

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
const os = require("node:os");
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


// ---------------------------------------------------------------- live read

// The redaction pre-filter (src/redact/prefilter.ts): candidate(t) is "any scanner matches",
// tested with the very finders the redactor runs (built from the same source).
const FINDERS = workerData.finders ? new Function("ALT", workerData.finders.js)(workerData.finders.alt) : [];
function rawCandidate(t) {
  for (const f of FINDERS) if (f.cursor(t)(0) >= 0) return true;
  return false;
}
// The production redactor's candidate() (src/redact/index.ts) is also true for a text whose
// JSON escapes decode to a candidate ("ghp_…": src/redact/json.ts, escapedCandidate),
// with the same code (src/redact/escapes-js.ts) and regex.
const ESC = workerData.escapes ? new Function(workerData.escapes.js)() : null;
const HIDING = workerData.escapes ? new RegExp(workerData.escapes.hiding) : null;
function candidate(t) {
  if (rawCandidate(t)) return true;
  if (ESC === null || t.indexOf("\\") < 0 || !HIDING.test(t)) return false;
  return rawCandidate(ESC.decodeText(t));
}
// The native pre-filter (src/redact/native.ts), when built: scan(bytes, a, e) is -1 only when
// the finders find nothing in those bytes as UTF-8 text and as a latin1 view; with no JSON
// escape that can hide a secret either, candidate() is false, so the common "no" is answered
// without decoding; any other answer goes to candidate().
const NATIVE = workerData.prefilterPath ? require(workerData.prefilterPath) : null;
/** candidate() of b[a, e) decoded by \`decode\` ("utf8Slice" or "latin1Slice"). */
function candidateIn(b, a, e, decode) {
  if (NATIVE !== null && NATIVE.scan(b, a, e) === -1 && (ESC === null || ESC.hidingEscapeAt(b, a, e) < 0)) return false;
  const s = b[decode](a, e);
  collectScanned(s.length);
  return candidate(s);
}
// A run of token characters with a letter and a digit: what is left of a secret whose start
// (and with it the pre-filter's anchor) was overwritten in stale space.
const TOKEN_RUN = /[A-Za-z0-9+\/_=-]{24,}/g;
function tokenRun(s) {
  TOKEN_RUN.lastIndex = 0;
  for (let m = TOKEN_RUN.exec(s); m; m = TOKEN_RUN.exec(s)) {
    if (/[0-9]/.test(m[0]) && /[A-Za-z]/.test(m[0])) return true;
  }
  return false;
}

const handles = new Map();
const released = () => Object.assign(new Error("the live read was released"), { code: "MEMSNAP_RELEASED" });
let lastYield = 0;
async function maybeYield(h) {
  const now = performance.now();
  if (now - lastYield < 15) return;
  await new Promise((r) => setImmediate(r));
  lastYield = performance.now();
  if (h.released) throw released();
}

function closeHandle(h) {
  handles.delete(h.id);
  h.released = true;
  if (h.busy) return; // live_begin is running on it (suspended in a scan): it closes the handle when it resumes
  if (h.db) {
    try { if (h.db.inTransaction) h.db.exec("ROLLBACK"); } catch {}
    try { h.db.close(); } catch {}
    h.db = null;
  }
}

function walBytes(src) {
  try {
    return fs.statSync(src + "-wal").size;
  } catch (e) {
    if (e && e.code === "ENOENT") return 0;
    throw e;
  }
}

// Every real table but the schema itself, with its columns: ordinary tables, sqlite_stat* and
// sqlite_sequence, and the shadow tables of virtual tables (an FTS table's own content lives in
// one: <name>_content).
function scanTargets(db) {
  return db.pragma("table_list")
    .filter((t) => t.schema === "main" && (t.type === "table" || t.type === "shadow") && !/^sqlite_(temp_)?(schema|master)$/i.test(t.name))
    .map((t) => ({ name: t.name, wr: t.wr === 1, cols: db.pragma("table_xinfo(" + qi(t.name) + ")").filter((c) => c.hidden !== 1).map((c) => c.name) }))
    .filter((t) => t.cols.length > 0);
}

const CHUNK_BYTES = 1 << 20;
const CHUNK_MAX = 2 << 20;
const ROW_MAX = 256 << 20;

// An upper bound of a table's payload (all its cells' bytes) and of one row's, from dbstat
// (which walks only that table's pages), or null when dbstat is not available.
function payloadBound(db, name) {
  try {
    const r = db.prepare("SELECT sum(payload), max(mx_payload) FROM dbstat WHERE name = ? AND aggregate = 1").raw(true).get(name);
    return r && r[0] !== null ? { total: r[0], row: Math.max(1, r[1] || 1) } : { total: 0, row: 1 };
  } catch (e) {
    if (e && e.code === "SQLITE_ERROR") return null; // no dbstat in this build
    throw e;
  }
}

// Scan every TEXT and BLOB cell with the pre-filter. A table's TEXT (and BLOBs, as text) is joined in SQL (group_concat with
// a newline between cells) and tested as one string, in one piece when the table's payload
// is small and otherwise in rowid ranges of at most CHUNK_MAX bytes (dbstat's largest row
// bounds a range's size). Every scanner is a regex without anchors or negative look-arounds,
// so a match inside one cell is also a match in the joined text: joining can only add matches,
// which sends the database to the copy path. A WITHOUT ROWID table too big to join whole is
// scanned row by row.
//
// A string of 64K characters or more (group_concat of a table, a long value, a two-byte batch)
// is a large object to V8, which puts it straight into its old generation, where it waits for a
// full collection: left to V8's pacing, two scanning workers held ~100 MiB of such dead text at
// peak. A full GC every 32 MiB of them (a few ms each, the live heap is tiny) keeps that flat.
// The page walk's batches (below TEXT_BATCH) are young strings, freed by scavenges.
let runGc = null;
try {
  require("node:v8").setFlagsFromString("--expose-gc");
  runGc = require("node:vm").runInNewContext("gc");
} catch { runGc = null; }
const LARGE_CHARS = 1 << 16;
let largeSinceGc = 0;
function collectScanned(n) {
  if (n < LARGE_CHARS) return;
  largeSinceGc += n;
  if (runGc !== null && largeSinceGc >= 32 * 1024 * 1024) {
    largeSinceGc = 0;
    runGc();
  }
}
async function scanCells(h, st) {
  const db = h.db;
  const hit = (s, name) => {
    st.text_bytes += Buffer.byteLength(s);
    collectScanned(s.length);
    if (!candidate(s)) return false;
    st.candidates++;
    st.found = name;
    return true;
  };
  for (const t of scanTargets(db)) {
    st.tables++;
    // TEXT as it is, a BLOB as the text its bytes read as (NULs kept, invalid UTF-8 as U+FFFD:
    // every ASCII byte shows as itself, which is all an anchor needs).
    const text = t.cols.map((c) => "CASE typeof(" + qi(c) + ") WHEN 'text' THEN " + qi(c) + " WHEN 'blob' THEN CAST(" + qi(c) + " AS TEXT) END");
    const rowText = text.length === 1 ? text[0] : "concat_ws(char(10), " + text.join(", ") + ")";
    const nText = t.cols.map((c) => "(typeof(" + qi(c) + ") IN ('text', 'blob'))").join(" + ");
    const lower = new Set(t.cols.map((c) => c.toLowerCase()));
    const rid = t.wr ? null : ["rowid", "_rowid_", "oid"].find((a) => !lower.has(a));
    const T = qi(t.name);
    const bound = payloadBound(db, t.name);
    if (bound && bound.row > ROW_MAX) throw new Error("a row of " + t.name + " is too large to scan in one piece");
    if (bound && bound.total <= CHUNK_MAX) {
      const [n, joined] = db.prepare("SELECT total(" + nText + "), group_concat(" + rowText + ", char(10)) FROM " + T).raw(true).get();
      st.cells_scanned += n;
      if (joined && hit(joined, t.name)) return;
      await maybeYield(h);
      continue;
    }
    if (rid && bound) {
      const rowCount = db.prepare("SELECT count(*) FROM " + T).pluck().get();
      const rows = Math.max(1, Math.min(Math.floor(CHUNK_MAX / bound.row), Math.ceil(rowCount * CHUNK_BYTES / Math.max(1, bound.total))));
      const next = db.prepare("SELECT " + rid + " FROM " + T + " WHERE " + rid + " > ? ORDER BY " + rid + " LIMIT 1 OFFSET ?").pluck().safeIntegers(true);
      const first = db.prepare("SELECT " + rid + " FROM " + T + " ORDER BY " + rid + " LIMIT 1 OFFSET ?").pluck().safeIntegers(true);
      const sel = "SELECT total(" + nText + "), group_concat(" + rowText + ", char(10)) FROM " + T + " WHERE ";
      const mid = db.prepare(sel + rid + " > ? AND " + rid + " <= ?").raw(true);
      const head = db.prepare(sel + rid + " <= ?").raw(true);
      const tail = db.prepare(sel + rid + " > ?").raw(true);
      let lo = null;
      for (;;) {
        let hi = lo === null ? first.get(rows - 1) : next.get(lo, rows - 1);
        if (hi === undefined) hi = null;
        const [n, joined] = hi === null ? (lo === null ? db.prepare(sel + "1").raw(true).get() : tail.get(lo))
          : lo === null ? head.get(hi) : mid.get(lo, hi);
        st.cells_scanned += n;
        if (joined && hit(joined, t.name)) return;
        if (hi === null) break;
        lo = hi;
        await maybeYield(h);
      }
      continue;
    }
    // WITHOUT ROWID too big to join whole (or no dbstat): one string per row.
    const it = db.prepare("SELECT " + nText + ", " + rowText + " FROM " + T).raw(true).iterate();
    try {
      let k = 0;
      for (const [n, s] of it) {
        st.cells_scanned += n;
        if (s && hit(s, t.name)) return;
        if (++k % 4096 === 0) await maybeYield(h);
      }
    } finally {
      it.return();
    }
  }
}


// ---- the TEXT and BLOB values of every cell, read from the pages (the fast path of the cell scan)
//
// While the stale-byte scan walks the file, every b-tree page that holds records (table
// leaves, index leaves and interior index pages: WITHOUT ROWID tables and indexes live in
// index b-trees) is parsed: each cell's record header gives the byte ranges of its TEXT values
// (serial type odd and >= 13) and BLOB values (even and >= 12: a secret in a BLOB reaches the
// bundle as surely as one in TEXT; the copy path then redacts or reports it), local or continued on overflow pages (the chain is followed
// with preads). The values are joined with a newline in batches of under 64 KiB (young strings
// for V8; 1 MiB batches cost 0.4 CPU-s more per bench snapshot in GC), decoded as UTF-8 (as SQL
// returns them) and tested with the pre-filter: the same test scanCells makes on
// group_concat, on a superset of its cells (sqlite_schema and index keys are scanned too), at
// memory speed instead of SQL speed. The result is only ever a "no": a hit, or a page or record
// this parser does not understand, sends the database to scanCells, which decides exactly.
const SERIAL_FIXED = [0, 1, 2, 3, 4, 6, 8, 8, 0, 0];
const TEXT_BATCH = 1 << 16;
const TEXT_VALUE_MAX = 32 << 20;
let vpos = 0;
// An SQLite varint at p (no further than end), or -1; vpos is set past it.
function varint(b, p, end) {
  let v = 0;
  for (let i = 0; i < 8; i++) {
    if (p >= end) return -1;
    const x = b[p++];
    v = v * 128 + (x & 0x7f);
    if (x < 0x80) { vpos = p; return v; }
  }
  if (p >= end) return -1;
  v = v * 256 + b[p++];
  vpos = p;
  return v;
}

function newCellScan(h, st, ps, usable, pageCount, free) {
  return {
    state: "scan", // "scan" | "hit" | "unparsed"
    h, st, ps, usable, pageCount, free,
    batch: Buffer.allocUnsafe(TEXT_BATCH), n: 0,
    ob: Buffer.allocUnsafe(ps), // the overflow page in hand
  };
}

function flushCells(cs) {
  if (cs.n === 0) return;
  testText(cs, cs.batch, 0, cs.n);
  cs.n = 0;
}

// Test the UTF-8 text in b[a, e).
function testText(cs, b, a, e) {
  cs.st.text_bytes += e - a;
  if (cs.state === "scan" && candidateIn(b, a, e, "utf8Slice")) {
    cs.st.candidates++;
    cs.state = "hit";
  }
}

// Reserve room for a value of len bytes (plus its separator) in the batch; null when the value
// gets a buffer of its own.
function room(cs, len) {
  if (cs.n + len + 1 > TEXT_BATCH) flushCells(cs);
  if (len + 1 > TEXT_BATCH) return null;
  if (cs.n > 0) cs.batch[cs.n++] = 10;
  return cs.batch;
}

function pageCells(cs, b, ho, type, nCell, cStart) {
  const usable = cs.usable;
  const ptrs = ho + (type === 2 ? 12 : 8);
  const maxLocal = type === 13 ? usable - 35 : Math.floor(((usable - 12) * 64) / 255) - 23;
  const minLocal = Math.floor(((usable - 12) * 32) / 255) - 23;
  for (let i = 0; i < nCell && cs.state === "scan"; i++) {
    let c = b.readUInt16BE(ptrs + 2 * i);
    if (c < cStart || c >= usable) { cs.state = "unparsed"; return; }
    if (type === 2) c += 4; // the left child's page number
    const P = varint(b, c, usable);
    if (P < 0) { cs.state = "unparsed"; return; }
    c = vpos;
    if (type === 13) {
      if (varint(b, c, usable) < 0) { cs.state = "unparsed"; return; }
      c = vpos; // past the rowid
    }
    let local = P;
    if (P > maxLocal) {
      const k = minLocal + ((P - minLocal) % (usable - 4));
      local = k <= maxLocal ? k : minLocal;
    }
    if (c + local + (local < P ? 4 : 0) > usable) { cs.state = "unparsed"; return; }
    record(cs, b, c, local, P, local < P ? b.readUInt32BE(c + local) : 0);
  }
}

// The TEXT values of one record: payload bytes [0, local) at b[c...], the rest on overflow pages from ovfl.
function record(cs, b, c, local, P, ovfl) {
  const hs = varint(b, c, c + local);
  if (hs < 1 || hs > local || hs > P) { cs.state = "unparsed"; return; }
  let p = vpos;
  let off = hs;
  const ov = { next: ovfl, start: local, page: 0, count: 0 }; // the chain, read forward only
  const he = c + hs;
  while (p < he) {
    let t = b[p];
    if (t < 0x80) p++;
    else {
      t = varint(b, p, he);
      p = vpos;
    }
    if (t < 0 || t === 10 || t === 11) { cs.state = "unparsed"; return; }
    const len = t < 12 ? SERIAL_FIXED[t] : Math.floor((t - 12) / 2);
    if (off + len > P) { cs.state = "unparsed"; return; }
    if (t >= 12) {
      // TEXT (odd) and BLOB (even): a BLOB's bytes are tested as the text they read as
      cs.st.cells_scanned++;
      if (len > 0) {
        if (off + len <= local && cs.n + len + 1 <= TEXT_BATCH) {
          // the common case: a local value that fits the batch (short ones copied inline)
          const dst = cs.batch;
          let n = cs.n;
          if (n > 0) dst[n++] = 10;
          const a = c + off;
          if (len <= 64) for (let k = 0; k < len; k++) dst[n + k] = b[a + k];
          else b.copy(dst, n, a, a + len);
          cs.n = n + len;
        } else if (!text(cs, b, c, local, ov, off, len)) return;
      }
    }
    off += len;
  }
  if (off !== P) cs.state = "unparsed";
}

// Copy payload bytes [off, off + len) into the batch (or a buffer of their own) and, in the
// latter case, test them at once. False when the scan stops (unparsed).
function text(cs, b, c, local, ov, off, len) {
  if (len > TEXT_VALUE_MAX) { cs.state = "unparsed"; return false; }
  let dst = room(cs, len);
  let at = 0;
  if (dst === null) dst = Buffer.allocUnsafe(len);
  else at = cs.n;
  const at0 = at;
  let need = off;
  const end = off + len;
  if (need < local) {
    const e = Math.min(end, local);
    b.copy(dst, at, c + need, c + e);
    at += e - need;
    need = e;
  }
  const span = cs.usable - 4;
  while (need < end) {
    while (ov.page === 0 || need >= ov.start + span) {
      if (ov.page !== 0) ov.start += span;
      const pn = ov.next;
      if (pn < 2 || pn > cs.pageCount || cs.free[pn] || ++ov.count > cs.pageCount) { cs.state = "unparsed"; return false; }
      if (fs.readSync(cs.h.fd, cs.ob, 0, cs.ps, (pn - 1) * cs.ps) !== cs.ps) { cs.state = "unparsed"; return false; }
      ov.page = pn;
      ov.next = cs.ob.readUInt32BE(0);
    }
    const e = Math.min(end, ov.start + span);
    cs.ob.copy(dst, at, 4 + need - ov.start, 4 + e - ov.start);
    at += e - need;
    need = e;
  }
  if (dst === cs.batch) cs.n = at;
  else testText(cs, dst, at0, at);
  return cs.state === "scan";
}

const ZERO = Buffer.alloc(65536);

// The page walk in native code (native/prefilter/sqlite_walk.c), when the addon is built: the
// walk below, step for step (the same regions, values, counts and answers), without the JS
// cost (~0.15 CPU-s per bench snapshot to run and ~0.2 CPU-s of JIT compiling, per isolate).
// It decides only "no": a stale region it does not clear comes back here for the finders (then
// the walk resumes at the next region), and so does cell text, at the end of its page.
// workerData.walk === "js" keeps the JS walk (tests compare the two). An addon built before
// its version 2 (BLOB values, JSON escapes) would clear what this walk does not: not used.
const WALK = NATIVE !== null && typeof NATIVE.sqliteWalk === "function" && NATIVE.sqliteWalkVersion >= 2 && workerData.walk !== "js" ? NATIVE.sqliteWalk : null;
// Indices into the state array the walk shares with JS (S_* in sqlite_walk.c).
const W_PS = 0, W_USABLE = 1, W_PAGE_COUNT = 2, W_CELLS = 3, W_BATCH_N = 4, W_STALE_BYTES = 5, W_FREE_PAGES = 6,
  W_TEXT_BYTES = 7, W_CELLS_SCANNED = 8, W_PEND_BYTES = 9, W_AT_PO = 10, W_AT_REGION = 11, W_REGION_A = 12,
  W_REGION_E = 13, W_REGION_TOKEN = 14, W_REGION_MAYBE = 15, W_AT_PAGE = 16, W_ERRNO = 17, W_LEN = 18;
const CELL_STATES = ["scan", "hit", "unparsed"];

// Walk every page with WALK; the verdict on the stale bytes, or null. Fills others (pages it
// cannot read as b-tree pages) and cells (its state and batch) as the JS walk does.
async function walkPages(h, st, size, ps, usable, pageCount, free, cells, others) {
  const S = new Float64Array(W_LEN);
  S[W_PS] = ps;
  S[W_USABLE] = usable;
  S[W_PAGE_COUNT] = pageCount;
  S[W_CELLS] = cells === null ? 3 : 0;
  S[W_STALE_BYTES] = st.stale_bytes;
  S[W_FREE_PAGES] = st.free_pages;
  S[W_TEXT_BYTES] = st.text_bytes;
  S[W_CELLS_SCANNED] = st.cells_scanned;
  const batch = cells !== null ? cells.batch : Buffer.allocUnsafe(TEXT_BATCH);
  const ob = cells !== null ? cells.ob : Buffer.allocUnsafe(ps);
  const pend = [];
  const CH = 64 * ps;
  const buf = Buffer.allocUnsafe(CH);
  let verdict = null;
  try {
    for (let off = 0; off < size && !verdict; off += CH) {
      const got = fs.readSync(h.fd, buf, 0, Math.min(CH, size - off), off);
      let po = 0;
      let ri = 0;
      for (;;) {
        const k = WALK(buf, got, off / ps + 1, po, ri, S, free, batch, ob, h.fd, pend, others);
        if (k === 0) break;
        if (k === 1) {
          // a stale region the walk did not clear: the finders on its latin1 view, then the token run it found
          const a = S[W_REGION_A], e = S[W_REGION_E];
          if (S[W_REGION_MAYBE] === 1) {
            const s = buf.latin1Slice(a, e);
            collectScanned(s.length);
            if (candidate(s)) verdict = "stale_candidate";
          }
          if (!verdict && S[W_REGION_TOKEN] === 1) verdict = "stale_token";
          if (verdict) {
            st.found = "stale page " + S[W_AT_PAGE];
            break;
          }
          po = S[W_AT_PO];
          ri = S[W_AT_REGION] + 1;
        } else if (k === 2) {
          // cell text the walk did not clear (counted already): the finders on its UTF-8 text
          for (const t of pend) {
            const s = t.utf8Slice(0, t.length);
            collectScanned(s.length);
            if (S[W_CELLS] === 0 && candidate(s)) {
              st.candidates++;
              S[W_CELLS] = 1;
            }
          }
          pend.length = 0;
          S[W_PEND_BYTES] = 0;
          po = S[W_AT_PO];
          ri = 0;
        } else {
          const name = Object.keys(os.constants.errno).find((n) => os.constants.errno[n] === S[W_ERRNO]) || "EIO";
          throw Object.assign(new Error(name + ": read of an overflow page failed"), { code: name });
        }
      }
      await maybeYield(h);
    }
  } finally {
    st.stale_bytes = S[W_STALE_BYTES];
    st.free_pages = S[W_FREE_PAGES];
    st.text_bytes = S[W_TEXT_BYTES];
    st.cells_scanned = S[W_CELLS_SCANNED];
    if (cells !== null) {
      cells.state = CELL_STATES[S[W_CELLS]];
      cells.n = S[W_BATCH_N];
    }
  }
  return verdict;
}

// Scan the stale bytes of the database file (what VACUUM INTO would drop): free pages and
// pages past the database's end whole; in b-tree pages the unallocated space and the freed
// blocks; the unused tail of overflow pages. Each region is tested on its own (latin1 view of
// its bytes, as src/redact/stream.ts does) with the pre-filter and for a long token run.
async function scanStale(h, st, size, pageCount, cells = null) {
  if (size === 0) return null; // an empty file is an empty database
  const fd = h.fd;
  const hdr = Buffer.alloc(100);
  fs.readSync(fd, hdr, 0, 100, 0);
  let ps = hdr.readUInt16BE(16);
  if (ps === 1) ps = 65536;
  const usable = ps - hdr[20];
  if (size < pageCount * ps || pageCount >= 0x2000000) return "size";
  const filePages = Math.ceil(size / ps);
  const free = new Uint8Array(filePages + 1);
  // The freelist: trunk pages, each listing leaf pages.
  const nFree = hdr.readUInt32BE(36);
  let seen = 0;
  const pg = Buffer.allocUnsafe(ps);
  for (let trunk = hdr.readUInt32BE(32); trunk; trunk = pg.readUInt32BE(0)) {
    if (trunk < 2 || trunk > pageCount || free[trunk] || ++seen > nFree) return "freelist";
    free[trunk] = 1;
    fs.readSync(fd, pg, 0, ps, (trunk - 1) * ps);
    const n = pg.readUInt32BE(4);
    if (n > usable / 4 - 2 || seen + n > nFree) return "freelist";
    for (let i = 0; i < n; i++) {
      const leaf = pg.readUInt32BE(8 + 4 * i);
      if (leaf < 2 || leaf > pageCount || free[leaf]) return "freelist";
      free[leaf] = 1;
    }
    seen += n;
  }
  if (seen !== nFree) return "freelist";
  if (cells !== null) Object.assign(cells, newCellScan(h, st, ps, usable, pageCount, free));
  const others = [];
  // (a usable size under 480 bytes is no valid database; the JS walk takes it as before)
  const native = WALK !== null && usable >= 480;
  st.walk = native ? "native" : "js";
  let verdict = native ? await walkPages(h, st, size, ps, usable, pageCount, free, cells, others) : null;
  const region = (b, a, e, p) => {
    if (e <= a || verdict) return;
    if (ZERO.compare(b, a, e, 0, e - a) === 0) return;
    st.stale_bytes += e - a;
    if (candidateIn(b, a, e, "latin1Slice")) verdict = "stale_candidate";
    else if (tokenRun(b.latin1Slice(a, e))) verdict = "stale_token";
    if (verdict) st.found = "stale page " + p;
  };
  const CH = 64 * ps;
  const buf = native ? null : Buffer.allocUnsafe(CH); // the JS walk's read buffer
  for (let off = 0; off < size && !verdict && !native; off += CH) {
    const got = fs.readSync(fd, buf, 0, Math.min(CH, size - off), off);
    for (let po = 0; po < got && !verdict; po += ps) {
      const p = (off + po) / ps + 1;
      const end = Math.min(po + ps, got);
      if (p > pageCount || end - po < ps || free[p]) {
        st.free_pages++;
        region(buf, po, end, p);
        continue;
      }
      const b = buf.subarray(po, end);
      const ho = p === 1 ? 100 : 0;
      const type = b[ho];
      if (type === 2 || type === 5 || type === 10 || type === 13) {
        const nCell = b.readUInt16BE(ho + 3);
        const cStart = b.readUInt16BE(ho + 5) || 65536;
        const ptrEnd = ho + (type === 2 || type === 5 ? 12 : 8) + 2 * nCell;
        let ok = ptrEnd <= cStart && cStart <= usable;
        const blocks = [];
        for (let fb = b.readUInt16BE(ho + 1), prev = 0, guard = 0; ok && fb; guard++) {
          if (fb <= prev || fb < cStart || fb + 4 > usable || guard > ps) { ok = false; break; }
          const sz = b.readUInt16BE(fb + 2);
          if (sz < 4 || fb + sz > usable) { ok = false; break; }
          blocks.push(fb + 4, fb + sz);
          prev = fb;
          fb = b.readUInt16BE(fb);
        }
        if (ok) {
          region(b, ptrEnd, cStart, p);
          for (let i = 0; i < blocks.length; i += 2) region(b, blocks[i], blocks[i + 1], p);
          if (usable < ps) region(b, usable, ps, p);
          if (cells !== null && cells.state === "scan" && type !== 5) pageCells(cells, b, ho, type, nCell, cStart);
          continue;
        }
        if (cells !== null) cells.state = "unparsed"; // a b-tree page we cannot read: the SQL scan decides
      }
      others.push(p); // an overflow page (or a page we cannot read as a b-tree page)
    }
    await maybeYield(h);
  }
  if (cells !== null && cells.state === "scan") {
    if (verdict) cells.state = "unparsed"; // the walk stopped early: the cells were not all seen
    else flushCells(cells);
  }
  if (verdict || others.length === 0) return verdict;
  // Overflow pages: only the tail after the payload is stale (dbstat knows where it starts).
  const tail = new Map();
  for (const [p, unused] of h.db.prepare("SELECT pageno, unused FROM dbstat WHERE pagetype = 'overflow'").raw(true).iterate()) tail.set(p, unused);
  for (const p of others) {
    fs.readSync(fd, pg, 0, ps, (p - 1) * ps);
    const unused = tail.get(p);
    if (unused === undefined) region(pg, 0, ps, p);
    else {
      region(pg, usable - unused, usable, p);
      if (usable < ps) region(pg, usable, ps, p);
    }
    if (verdict) break;
    await maybeYield(h);
  }
  return verdict;
}

async function liveBegin(job) {
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
  const db = h.db;
  h.busy = true;
  try {
    db.exec("BEGIN");
    db.prepare("SELECT count(*) FROM sqlite_schema").pluck().get(); // the read transaction starts here
    const pragmas = {
      journal_mode: String(db.pragma("journal_mode", { simple: true })).toLowerCase(),
      page_size: db.pragma("page_size", { simple: true }),
      user_version: db.pragma("user_version", { simple: true }),
      schema_version: db.pragma("schema_version", { simple: true }),
      application_id: db.pragma("application_id", { simple: true }),
      encoding: db.pragma("encoding", { simple: true }),
    };
    const dataVersion = db.pragma("data_version", { simple: true });
    const pageCount = db.pragma("page_count", { simple: true });
    const wal = pragmas.journal_mode === "wal" ? walBytes(job.src) : 0;
    const stat = fs.fstatSync(h.fd);
    const virtualTables = db.prepare("SELECT name, sql FROM sqlite_schema WHERE type = 'table' AND sql LIKE 'CREATE VIRTUAL%'").all()
      .map((r) => ({ name: r.name, sql: r.sql || "" }));
    const out = { eligible: false, pragmas, size: stat.size, mtimeMs: stat.mtimeMs, walBytes: wal, virtualTables, ms: 0 };
    let reason = null;
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
      } else {
        const st = { tables: 0, cells_scanned: 0, text_bytes: 0, candidates: 0, stale_bytes: 0, free_pages: 0, ms: 0 };
        const s0 = performance.now();
        try {
          // One pass over the pages: the stale bytes and (the fast path) every cell's TEXT.
          const cells = { state: "unparsed" }; // "scan" once the walk starts (an empty file or a refused freelist never does)
          const stale = await scanStale(h, st, stat.size, pageCount, cells);
          st.cells_via = "pages";
          if (cells.state !== "scan") {
            // a hit, or pages this parser cannot read (or a freelist it refused): SQL decides
            st.cells_via = "sql";
            st.cells_scanned = 0;
            st.text_bytes = 0;
            st.candidates = 0;
            const c0 = performance.now();
            await scanCells(h, st);
            st.cells_ms = Math.round(performance.now() - c0);
          }
          st.tables = scanTargets(db).length;
          if (st.candidates) reason = "redaction_candidate";
          else reason = stale;
        } catch (e) {
          const code = e && typeof e.code === "string" ? e.code : "";
          if (code.startsWith("SQLITE_") || code === "MEMSNAP_RELEASED") throw e;
          reason = "scan_failed: " + String((e && e.message) || e); // a value the scan cannot read as a string: copy instead
        }
        st.ms = Math.round(performance.now() - s0);
        out.scan = st;
        h.cache = { dataVersion, size: stat.size, mtimeMs: stat.mtimeMs, scan: st, reason };
      }
    }
    if (h.released) throw released();
    out.eligible = !reason;
    if (reason) out.reason = reason;
    out.ms = Math.round(performance.now() - t0);
    if (job.hold && out.eligible) {
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
  }
}

function liveVerify(job) {
  const h = handles.get(job.handle);
  if (!h || !h.holding) throw new Error("no live read transaction " + job.handle);
  const db = h.db;
  const t0 = performance.now();
  const problems = db.prepare("PRAGMA quick_check(" + Number(job.limit) + ")").pluck().all().map(String);
  const t1 = performance.now();
  const tables = {};
  if (problems.length === 1 && problems[0] === "ok") {
    for (const t of ordinaryTables(db)) tables[t] = db.prepare("SELECT count(*) FROM " + qi(t)).pluck().get();
  }
  return { problems, tables, quickCheckMs: Math.round(t1 - t0), countMs: Math.round(performance.now() - t1) };
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
  if (job.op === "live_begin") return liveBegin(job);
  if (job.op === "live_verify") return liveVerify(job);
  if (job.op === "live_release") {
    const h = handles.get(job.handle);
    if (h) closeHandle(h); // a scan in progress on it stops at its next yield
    return {};
  }
  if (job.op === "probe_candidate") return job.texts.map(candidate);
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

/**
 * One worker thread that runs SQLite jobs in the order they arrive (a `live_begin` scan yields
 * between pieces, so later short jobs may finish before it). Call {@link SqliteWorker.close}
 * when done: the thread's exit closes every connection it holds.
 */
export class SqliteWorker {
  readonly #worker: Worker;
  readonly #pending = new Map<number, { resolve: (v: unknown) => void; reject: (e: Error) => void }>();
  #nextId = 1;
  #dead: Error | null = null;
  #exited: Promise<void>;

  /** `walk: "js"` keeps the live read's page walk in JS even where the native one is built (tests compare them). */
  constructor(opts: { walk?: "native" | "js" } = {}) {
    this.#worker = new Worker(WORKER_SOURCE, { eval: true, execArgv: [], resourceLimits: { maxYoungGenerationSizeMb: 16 }, workerData: {
      bsqlPath: betterSqlitePath(),
      finders: { js: FINDERS_JS, alt: { ...MAIN_ALTERNATIVES } },
      escapes: { js: ESCAPES_JS, hiding: HIDING_ESCAPE.source },
      prefilterPath: nativePrefilter() === null ? null : NATIVE_PREFILTER_PATH,
      walk: opts.walk ?? "native",
    } });
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
