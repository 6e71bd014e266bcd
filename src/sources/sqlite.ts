/**
 * The `sqlite` source: SQLite databases, each captured as exactly one committed state even
 * while other processes write to them.
 *
 * Copying the `.db` file (with or without its `-wal`) while a writer works loses committed
 * rows or tears transactions, so every database is opened read-only (`readonly`,
 * `fileMustExist`, busy timeout `busy_timeout_ms`) in a worker thread (./sqlite-worker.ts)
 * and captured inside a read transaction, in one of two ways.
 *
 * Live read (`method: "live_read"`, the default when it is sound; `"live_read": false` turns
 * it off). The worker starts a read transaction (`BEGIN` and a read) and keeps it open while
 * the pipeline streams the database FILE ITSELF, from offset 0 to its size read under the
 * transaction (the declared size); no copy is written. It is taken when:
 * - the journal mode is `delete`, `truncate` or `persist` (rollback journal). The read
 *   transaction holds a SHARED lock; a writer needs EXCLUSIVE to write the file, so the file
 *   cannot change while it streams and its bytes are the last committed state. (A hot
 *   journal makes the read fail, as it makes the copy fail: a read-only connection cannot
 *   roll it back.) Writers wait for the lock meanwhile, up to their own busy timeout: the
 *   transaction is held for as long as the bytes take through the pipeline.
 * - the journal mode is `wal` and, after the read transaction started, the `-wal` file is
 *   absent or empty. Then no frame is newer than the file, so the reader ignores the WAL and
 *   holds WAL_READ_LOCK(0) (wal.c, walTryBeginRead: "The WAL has been completely backfilled
 *   (or it is empty) and can be safely ignored"); the only writes to a WAL database's file are
 *   a checkpoint's backfill and truncate, and walCheckpoint takes WAL_READ_LOCK(0)
 *   EXCLUSIVELY for them, so no checkpoint can run while the file streams; a writer's new
 *   commits go to the WAL only (and a WAL that holds frames is never emptied while a reader
 *   holds a read lock: restarting it needs every other read lock, and deleting it needs an
 *   EXCLUSIVE lock on the database file, where the reader holds SHARED). The captured file is
 *   a complete database; its header still says WAL (bytes 18/19 = 2), which only makes SQLite
 *   start a new, empty WAL when it is opened (restore removes stale `-wal`/`-shm`). Writers
 *   are not blocked; checkpoints wait (an automatic one just does not backfill) and the WAL
 *   grows meanwhile. A `-wal` with frames (committed content not yet in the file) takes the
 *   copy below.
 * - with redaction on (`ctx.redactor`), the worker finds no redaction candidate, in the same
 *   read transaction, (a) in any TEXT or BLOB cell of any table (ordinary, shadow and `sqlite_stat*`
 *   tables, all columns), and (b) in the file's stale bytes,
 *   which a copy would drop but a file holds: free pages (the freelist) and pages past the
 *   database's end whole, in b-tree pages the unallocated space and freed blocks, and the
 *   unused tail of overflow pages (from `dbstat`); each region is tested on its own (latin1
 *   view of its bytes) and also rejected when it holds a run of 24+ token characters with a
 *   letter and a digit: what is left of a secret whose beginning (and so its anchor) was
 *   overwritten. A hit anywhere sends the database to the copy path, which redacts the cells
 *   and drops the stale bytes; so does a UTF-16 database (its stale text does not show in a
 *   latin1 view). (a) and (b) are one walk over the file's pages: every b-tree page that holds
 *   records (table leaves, and index pages, where WITHOUT ROWID tables and index keys live)
 *   is parsed, and the TEXT and BLOB values of its cells (followed onto their overflow pages) are
 *   joined with newlines in batches of ~1 MiB, decoded as UTF-8 and tested; this is a superset
 *   of the table cells (the schema's SQL and index keys are tested too) at memory speed. The
 *   walk can only say no: a hit, or a page it cannot parse, sends the database to the exact
 *   test, in SQL (each table's TEXT and BLOBs, cast to text, joined with newlines by `group_concat`, in pieces of at
 *   most 8 MB; a join can only add matches), whose verdict stands (`live_scan.cells_via` says
 *   which one decided). The test is the memsnap pre-filter (src/redact/prefilter.ts,
 *   built in the worker from the same finder source, on the text and on the text its JSON
 *   escapes decode to, src/redact/escapes-js.ts; the native scan of src/redact/native.ts,
 *   when built, runs first on the raw bytes and only its "maybe" is decoded), which is exactly `candidate()` of the
 *   production redactor: the scan relies on `Redactor.candidate` being that pre-filter (a
 *   Redactor whose candidate() flags more would need `"live_read": false`). Not scanned, as on
 *   the copy path: contentless FTS indexes (listed in
 *   `redaction.skipped`). Stale bytes are NOT scanned without redaction: like a file copy,
 *   a live read then keeps deleted rows that still sit in free space.
 * The worker then runs `PRAGMA quick_check` and the row counts in the same transaction while
 * the bytes stream (off the main thread, and in parallel with it); the artifact's `check()`
 * waits for them (a damaged database fails the snapshot with MEMSNAP_SOURCE_INVALID), checks
 * the file's size and mtime did not change (only a non-SQLite writer could change them), and
 * releases the transaction. The transaction is also released when the stream fails or is
 * abandoned, and by `cleanup()` (which stops the workers, closing every connection).
 * Descriptors: the main thread opens each database file once (the header sniff, the stale
 * scan in the worker and the stream all read through it) and closes it only after the
 * worker has closed the connection: closing any descriptor of a file drops every POSIX lock
 * the process holds on it, the transaction's included.
 * Overlap: there are two workers. While database i is scanned, held and streamed in one,
 * the other scans database i+1 ahead in a read transaction of its own that ends with the
 * scan (so it blocks writers no longer than a copy would), keeping the connection and the
 * scan's `data_version`. When its turn comes it starts its real read transaction on that
 * connection and reuses the scan only if `data_version` (no other connection committed
 * since), the file's size and mtime are unchanged and the `-wal` is still empty; otherwise it
 * scans again. Only one database's transaction is ever held across a stream. The first
 * database's look-ahead starts in capture() itself: a snapshot starts every capture up front,
 * so that scan runs while the layers before this one pack.
 *
 * Copy (`vacuum_into` / `backup`; `live_read_skipped` in the meta says why the live read was
 * not taken: `wal_frames`, `redaction_candidate`, `stale_candidate`, `stale_token`,
 * `journal_mode=…`, `encoding=…`, `freelist`, `disabled`, …). The database is copied with
 * `VACUUM INTO '<tmpDir>/…'`: one read transaction, so the copy is exactly one committed
 * state, with the WAL's committed frames folded in and the free pages dropped. If VACUUM INTO
 * fails with a plain SQL error, a one-step online backup (`backup(dest, {progress: () => 2**31-1})`,
 * all pages in one step: the default stepped backup restarts on every foreign write and may
 * never finish, and better-sqlite3 reads a returned 0 as zero pages per step) is used instead;
 * the layer meta records which. Both calls block the thread they run on, so they run in a
 * worker, as do VACUUM and the checks. The copy is a rollback-journal database; the
 * `-wal`/`-shm`/`-journal` files are never captured.
 *
 * Redaction on the copy path (when `ctx.redactor` is present) rewrites TEXT cells (and BLOB cells that are text) IN THE COPY,
 * never the live database, on the main thread where the redactor lives, in bounded slices:
 * - ordinary tables (not `sqlite_%`, not shadow tables): rows are streamed with `.iterate()`
 *   in key order (rowid, or the PRIMARY KEY of a WITHOUT ROWID table) and resumed by keyset
 *   (`WHERE key > last`), so each slice holds at most a few thousand rows; every TEXT value
 *   goes through `redactor.candidate()` and only candidates through `redactText()`. So does
 *   every BLOB value that is text (valid UTF-8, no control character but tab and line breaks:
 *   JSON or notes stored as bytes; written back as a BLOB); a binary BLOB (an embedding, a
 *   serialized object) is never rewritten, only scanned (`scanText()`), and what the rules find
 *   in it is reported as unredacted, which refuses a plaintext bundle without
 *   `--allow-unredacted`, as git history does (`redaction.blob_cells` counts them). Changed
 *   cells are written with one UPDATE by key per cell, a batch per transaction.
 *   Triggers are dropped for the rewrite and recreated after (an audit trigger would copy the
 *   old value elsewhere), foreign keys and CHECK constraints are not enforced, and a value
 *   that collides with a UNIQUE/PRIMARY KEY constraint gets a `#n` suffix.
 * - FTS3/4/5 tables that store their own content are rewritten through the FTS table itself
 *   (so the index stays consistent), then `optimize`d so the old tokens leave the index;
 *   external-content FTS tables are `rebuild`t from their (redacted) content table;
 *   contentless FTS tables and other virtual tables cannot be read back and are skipped and
 *   listed in the meta (`redaction.skipped`). Shadow tables are never written directly.
 * - `sqlite_stat4` (sampled index keys) is cleared when anything changed.
 * Old bytes: the rewrite runs with `PRAGMA secure_delete=ON` (freed cells and pages are
 * zeroed) and a memory rollback journal (no journal file ever holds the old pages), and when
 * any cell changed the copy is rebuilt in the worker: `VACUUM INTO` a fresh file renamed over
 * it (as thorough as VACUUM, and one write of the data instead of two). The rebuild is the
 * step that matters: secure_delete alone leaves old values in interior b-tree pages (an
 * index's divider keys are copies of indexed TEXT values and are not rewritten when the leaf
 * entries change; pages that were split keep stale bytes in their unallocated area); the
 * rebuild writes every page from the redacted rows. The test greps the bundled bytes for this.
 * Not redacted: binary BLOB cells (reported, see above), the schema SQL, and the skipped tables above.
 * Then `PRAGMA quick_check` must be `ok` on the final copy.
 *
 * The layer meta records per database: `method`; the source's `journal_mode`, `page_size`,
 * `user_version`, `schema_version`, `application_id`, `encoding`; each ordinary table's row
 * count; `source_bytes` (file + `-wal`), `copy_bytes` (bytes captured), `copy_ms` (0 for a
 * live read), `quick_check`; for a live read `prepare_ms` and `quick_check_ms` (and with
 * redaction `redaction.scrub: "none"` and `redaction.live_scan`); for a copy taken although
 * live reads are on, `live_read_skipped`.
 */
import { isUtf8 } from "node:buffer";
import { randomBytes } from "node:crypto";
import { createWriteStream } from "node:fs";
import { mkdtemp, open, rm, stat, type FileHandle } from "node:fs/promises";
import { createRequire } from "node:module";
import { tmpdir } from "node:os";
import { basename, join, resolve } from "node:path";
import { Readable } from "node:stream";
import { pipeline } from "node:stream/promises";
import { MemsnapError } from "../errors.js";
import type { Redactor } from "../redact/types.js";
import { isPlainObject, optBool, optInt, optStringArray, rejectUnknownKeys, reqString } from "../util/config-check.js";
import { reusedChunks } from "../util/reused-chunks.js";
import {
  betterSqlitePath, runSqliteJob, SqliteJobError, SqliteWorker, type CheckResult, type CopyResult,
  type LiveBeginResult, type LiveScanStats, type LiveVerifyResult,
} from "./sqlite-worker.js";
import type { Artifact, OpenOptions, SourceKind } from "./types.js";
import { fileArtifact, fingerprintOf, sourceChanged, sourceError, walkFiles, walkNotices, type FoundFile } from "./walk.js";
import { pathTarget } from "./live-target.js";

export interface SqliteConfig {
  kind: "sqlite";
  name: string;
  /** A database file, or a directory scanned for `*.db`, `*.sqlite`, `*.sqlite3`. */
  path: string;
  include?: string[];
  exclude?: string[];
  /** How long to wait for a lock before MEMSNAP_LOCKED. Default 5000. */
  busy_timeout_ms: number;
  /** Capture the database file itself under a read transaction when that is sound (see the module comment). Default true. */
  live_read: boolean;
}

export const SQLITE_DEFAULT_INCLUDE = ["*.db", "*.sqlite", "*.sqlite3"];
export const SQLITE_DEFAULT_BUSY_TIMEOUT_MS = 5000;
/** SQLite's side files: never captured, removed beside restored databases. */
const SIDE_FILE = /-(wal|shm|journal)$/;
const HEADER = Buffer.from("SQLite format 3\0", "latin1");

/** Per-database facts in the layer meta (`meta.databases[<artifact path>]`). */
export interface SqliteDbMeta {
  /** `live_read`: the database file itself, read under a read transaction; otherwise a copy. */
  method: "vacuum_into" | "backup" | "live_read";
  journal_mode: string;
  page_size: number;
  user_version: number;
  schema_version: number;
  application_id: number;
  encoding: string;
  source_bytes: number;
  /** Bytes captured (the copy's size, or with `live_read` the file's). */
  copy_bytes: number;
  /** Time of the copy; 0 with `live_read`. */
  copy_ms: number;
  /** An incremental snapshot referenced the database unchanged: this meta is that snapshot's (nothing was read now). */
  reused?: boolean;
  /** `live_read`: time to start the read transaction and decide (journal mode, `-wal`, the redaction scan). */
  prepare_ms?: number;
  quick_check: "ok";
  /** `live_read`: time of quick_check, run in the same read transaction while the file streamed. */
  quick_check_ms?: number;
  /** A copy method: why the database file could not be captured as it is (`wal_frames`, `redaction_candidate`, `disabled`, …). */
  live_read_skipped?: string;
  tables: Record<string, number>;
  redaction?: SqliteRedactionStats;
}

export interface SqliteRedactionStats {
  /** How old bytes are scrubbed from the copy; `none` for a `live_read` (no candidate in any cell or in the stale bytes). */
  scrub: "secure_delete+vacuum" | "none";
  tables: number;
  /** TEXT cells (and, on the copy path, BLOB cells: see `blob_cells`) read. */
  cells_scanned: number;
  candidates: number;
  cells_redacted: number;
  /**
   * The copy path's BLOB cells: `scanned`; `redacted`, those that are text (valid UTF-8 without
   * control characters but tab and line breaks) and were rewritten as TEXT cells are (the cell
   * stays a BLOB); `unredacted`, binary ones in which a rule matched: they are kept byte for
   * byte (rewriting could corrupt an embedding or a serialized object) and their findings are
   * in the report's `unredacted`, so a plaintext snapshot is refused without `--allow-unredacted`.
   */
  blob_cells?: { scanned: number; redacted: number; unredacted: number };
  fts_rebuilt: string[];
  fts_optimized: string[];
  stat4_cleared: boolean;
  skipped: Array<{ table: string; reason: string }>;
  /** `live_read`: what the worker's scan of the live file covered. */
  live_scan?: LiveScanStats;
}

// ------------------------------------------------------------------------------ errors

const ENCRYPTED_HINT =
  "if it is encrypted (SQLCipher or similar) memsnap cannot copy it: exclude it (\"exclude\": [...]) or capture it with a files source while nothing writes it";

/** Map a SQLite failure on `path` (a source database) to a MemsnapError naming it. */
export function sqliteSourceError(e: unknown, path: string, tmpDir?: string): MemsnapError {
  if (e instanceof MemsnapError) return e;
  const code = e instanceof SqliteJobError ? e.sqliteCode : (e as { code?: unknown } | undefined)?.code;
  const msg = (e as Error | undefined)?.message ?? String(e);
  const c = typeof code === "string" ? code : "";
  if (c.startsWith("SQLITE_BUSY") || c.startsWith("SQLITE_LOCKED")) {
    return new MemsnapError("MEMSNAP_LOCKED", `database ${path} is locked: ${msg}`, {
      path, cause: e, hint: "another process holds a write lock; retry or raise busy_timeout_ms",
    });
  }
  if (c === "SQLITE_READONLY_ROLLBACK") {
    return new MemsnapError("MEMSNAP_SOURCE_UNREADABLE", `database ${path} has a hot journal that a read-only reader cannot roll back: ${msg}`, {
      path, cause: e, hint: `a writer crashed mid-transaction and left ${path}-journal: open the database once read-write (e.g. \`sqlite3 FILE 'PRAGMA quick_check'\`) to roll it back, then retry`,
    });
  }
  if (c === "SQLITE_NOTADB") {
    return new MemsnapError("MEMSNAP_SOURCE_INVALID", `${path} is not a readable SQLite database: ${msg}`, {
      path, cause: e, hint: ENCRYPTED_HINT,
    });
  }
  if (c.startsWith("SQLITE_CORRUPT")) {
    return new MemsnapError("MEMSNAP_SOURCE_INVALID", `database ${path} is damaged: ${msg}`, {
      path, cause: e, hint: "check it with `sqlite3 FILE 'PRAGMA integrity_check'`; recover it (.recover) or exclude it",
    });
  }
  if (c === "SQLITE_FULL" || c === "ENOSPC") {
    return new MemsnapError("MEMSNAP_DEST_FULL", `no space left for the copy of ${path}${tmpDir ? ` in ${tmpDir}` : ""}`, {
      path: tmpDir ?? path, cause: e, hint: "free space beside the bundle's destination",
    });
  }
  if (c === "ENOENT") return sourceError(e, path);
  if (c === "MODULE_NOT_FOUND" || c === "ERR_DLOPEN_FAILED") {
    return new MemsnapError("MEMSNAP_INTERNAL", `the sqlite source cannot load better-sqlite3: ${msg}`, {
      cause: e, hint: "reinstall memsnap (npm install) so its native dependency is built for this Node",
    });
  }
  return new MemsnapError("MEMSNAP_SOURCE_UNREADABLE", `cannot read database ${path}: ${msg}`, {
    path, cause: e, hint: "check the file's and its directory's permissions (a WAL database needs its -shm file)",
  });
}

/** Look at a file's first bytes: an SQLite header, empty, or not SQLite (random-looking bytes suggest encryption). */
async function sniff(path: string): Promise<"sqlite" | "empty" | "other" | "random"> {
  let fh;
  try {
    fh = await open(path, "r");
  } catch (e) {
    throw sourceError(e, path);
  }
  try {
    return await sniffHandle(fh, path);
  } finally {
    await fh.close();
  }
}

async function sniffHandle(fh: FileHandle, path: string): Promise<"sqlite" | "empty" | "other" | "random"> {
  try {
    const buf = Buffer.alloc(4096);
    const { bytesRead } = await fh.read(buf, 0, buf.length, 0);
    if (bytesRead === 0) return "empty";
    if (bytesRead >= HEADER.length && buf.subarray(0, HEADER.length).equals(HEADER)) return "sqlite";
    const seen = new Set(buf.subarray(0, bytesRead));
    return bytesRead >= 1024 && seen.size >= 200 ? "random" : "other";
  } catch (e) {
    throw sourceError(e, path);
  }
}

function notSqlite(path: string, kind: "other" | "random"): MemsnapError {
  const why = kind === "random"
    ? "it has no 'SQLite format 3' header and its bytes look encrypted"
    : "it has no 'SQLite format 3' header";
  return new MemsnapError("MEMSNAP_SOURCE_INVALID", `${path} is not an SQLite database: ${why}`, {
    path, hint: kind === "random" ? ENCRYPTED_HINT : "remove it from the sqlite source (\"exclude\") or capture it with a files source",
  });
}

// ------------------------------------------------------------------------------ better-sqlite3 (main thread)

interface BsStatement {
  run(...params: unknown[]): { changes: number };
  iterate(...params: unknown[]): IterableIterator<unknown[]>;
  all(...params: unknown[]): unknown[];
  get(...params: unknown[]): unknown;
  raw(toggle?: boolean): BsStatement;
  pluck(toggle?: boolean): BsStatement;
}
interface BsDatabase {
  prepare(sql: string): BsStatement;
  exec(sql: string): unknown;
  pragma(sql: string, opts?: { simple?: boolean }): unknown;
  transaction<A extends unknown[], R>(fn: (...a: A) => R): (...a: A) => R;
  close(): void;
}
type BsCtor = new (path: string, opts?: { readonly?: boolean; fileMustExist?: boolean; timeout?: number }) => BsDatabase;

let bsCache: BsCtor | undefined;
function betterSqlite(): BsCtor {
  bsCache ??= createRequire(import.meta.url)(betterSqlitePath()) as BsCtor;
  return bsCache;
}

const qi = (s: string): string => `"${s.replace(/"/g, '""')}"`;

// ------------------------------------------------------------------------------ redaction in the copy

/** Rows a slice may scan before it yields to the event loop. */
const SLICE_ROWS = 5000;
/** TEXT bytes a slice may scan before it yields. */
const SLICE_BYTES = 16 * 1024 * 1024;
/** Candidate cells per batch (redacted, then written in one transaction). */
const BATCH_CELLS = 1000;
/** Candidate text bytes per batch. */
const BATCH_BYTES = 8 * 1024 * 1024;

interface TableListRow { schema: string; name: string; type: string; ncol: number; wr: number; strict: number }
interface XInfoRow { cid: number; name: string; type: string; pk: number; hidden: number }

/** The `content=` option of an FTS3/4/5 declaration: undefined (own content), "" (contentless) or a table name. */
export function ftsContentOption(sql: string): string | undefined {
  const open = sql.indexOf("(");
  const close = sql.lastIndexOf(")");
  if (open < 0 || close < open) return undefined;
  const body = sql.slice(open + 1, close);
  // Split on commas outside quotes.
  const args: string[] = [];
  let cur = "";
  let quote: string | null = null;
  for (const ch of body) {
    if (quote) {
      cur += ch;
      if (ch === quote) quote = null;
    } else if (ch === "'" || ch === '"' || ch === "`") {
      quote = ch;
      cur += ch;
    } else if (ch === "[") {
      quote = "]";
      cur += ch;
    } else if (ch === ",") {
      args.push(cur);
      cur = "";
    } else {
      cur += ch;
    }
  }
  args.push(cur);
  for (const a of args) {
    const m = /^\s*content\s*=\s*(.*?)\s*$/is.exec(a);
    if (!m) continue;
    let v = m[1] ?? "";
    const q = v[0];
    if ((q === "'" || q === '"' || q === "`") && v.endsWith(q) && v.length >= 2) v = v.slice(1, -1).replaceAll(q + q, q);
    else if (q === "[" && v.endsWith("]")) v = v.slice(1, -1);
    return v;
  }
  return undefined;
}

interface Target { name: string; fts: boolean; withoutRowid: boolean }

/**
 * Redact the TEXT cells of the database copy at `path` in place (see the module comment).
 * `changed` is true when any byte of the file's content changed (the caller then VACUUMs).
 */
export async function redactSqliteCopy(
  path: string, redactor: Redactor, artifact: string, signal?: AbortSignal,
): Promise<{ stats: SqliteRedactionStats; changed: boolean }> {
  const Database = betterSqlite();
  const db = new Database(path, { fileMustExist: true });
  const stats: SqliteRedactionStats = {
    scrub: "secure_delete+vacuum", tables: 0, cells_scanned: 0, candidates: 0, cells_redacted: 0,
    blob_cells: { scanned: 0, redacted: 0, unredacted: 0 }, fts_rebuilt: [], fts_optimized: [], stat4_cleared: false, skipped: [],
  };
  const changedTables = new Set<string>();
  const dropped: { triggers: Array<{ name: string; sql: string }> | null } = { triggers: null }; // set once dropped
  try {
    db.pragma("journal_mode = MEMORY");
    db.pragma("secure_delete = ON");
    db.pragma("foreign_keys = OFF");
    db.pragma("ignore_check_constraints = ON");
    db.pragma("recursive_triggers = OFF");
    const list = (db.pragma("table_list") as TableListRow[])
      .filter((t) => t.schema === "main")
      .sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0));
    const sqlOf = new Map((db.prepare("SELECT name, sql FROM sqlite_schema WHERE type = 'table'").all() as Array<{ name: string; sql: string | null }>)
      .map((r) => [r.name, r.sql ?? ""]));
    const lowerNames = new Set(list.map((t) => t.name.toLowerCase()));
    const targets: Target[] = [];
    const ftsExternal: Array<{ name: string; content: string }> = [];
    for (const t of list) {
      if (/^sqlite_/i.test(t.name) || t.type === "shadow" || t.type === "view") continue;
      if (t.type === "table") {
        targets.push({ name: t.name, fts: false, withoutRowid: t.wr === 1 });
        continue;
      }
      if (t.type !== "virtual") continue;
      const sql = sqlOf.get(t.name) ?? "";
      const mod = /\busing\s+([A-Za-z0-9_]+)/i.exec(sql)?.[1]?.toLowerCase() ?? "";
      if (mod !== "fts3" && mod !== "fts4" && mod !== "fts5") {
        stats.skipped.push({ table: t.name, reason: `virtual table (${mod || "unknown module"}) is not rewritten` });
        continue;
      }
      const content = ftsContentOption(sql);
      if (content === undefined) targets.push({ name: t.name, fts: true, withoutRowid: false });
      else if (content === "") stats.skipped.push({ table: t.name, reason: `contentless ${mod} table: its text cannot be read back` });
      else ftsExternal.push({ name: t.name, content });
    }

    const dropTriggers = (): void => {
      if (dropped.triggers) return;
      const list = db.prepare("SELECT name, sql FROM sqlite_schema WHERE type = 'trigger' AND sql IS NOT NULL").all() as Array<{ name: string; sql: string }>;
      for (const tr of list) db.exec(`DROP TRIGGER ${qi(tr.name)}`);
      dropped.triggers = list;
    };

    for (const target of targets) {
      signal?.throwIfAborted();
      const n = await redactTable(db, target, redactor, artifact, stats, dropTriggers, signal);
      if (n > 0) changedTables.add(target.name.toLowerCase());
    }
    const changed = changedTables.size > 0;
    if (changed) {
      for (const f of ftsExternal) {
        const known = lowerNames.has(f.content.toLowerCase());
        if (known && !changedTables.has(f.content.toLowerCase())) continue;
        db.prepare(`INSERT INTO ${qi(f.name)}(${qi(f.name)}) VALUES ('rebuild')`).run();
        stats.fts_rebuilt.push(f.name);
      }
      for (const t of targets) {
        if (t.fts && changedTables.has(t.name.toLowerCase())) {
          db.prepare(`INSERT INTO ${qi(t.name)}(${qi(t.name)}) VALUES ('optimize')`).run();
          stats.fts_optimized.push(t.name);
        }
      }
      for (const s of ["sqlite_stat4", "sqlite_stat3"]) {
        if (list.some((t) => t.name.toLowerCase() === s)) {
          db.exec(`DELETE FROM ${s}`);
          stats.stat4_cleared = true;
        }
      }
    } else {
      for (const f of ftsExternal) {
        stats.skipped.push({ table: f.name, reason: `external-content FTS table: indexes ${f.content}, which had nothing to redact` });
      }
    }
    const toRecreate = dropped.triggers;
    if (toRecreate) db.transaction(() => { for (const tr of toRecreate) db.exec(tr.sql); })();
    return { stats, changed };
  } catch (e) {
    if (e instanceof MemsnapError) throw e;
    if (signal?.aborted) throw e;
    const code = String((e as { code?: unknown }).code ?? "");
    if (code === "SQLITE_FULL" || code.startsWith("SQLITE_IOERR")) throw sqliteSourceError(e, artifact, path);
    throw new MemsnapError("MEMSNAP_SOURCE_INVALID", `cannot redact the copy of ${artifact}: ${(e as Error).message}`, {
      path: artifact, cause: e, hint: "disable redaction for this snapshot (--no-redact) and encrypt the bundle instead, or report the schema that failed",
    });
  } finally {
    db.close();
  }
}

const yieldToLoop = (): Promise<void> => new Promise((r) => setImmediate(r));

/** Redact one table (or FTS table); returns the number of cells changed. */
async function redactTable(
  db: BsDatabase, target: Target, redactor: Redactor, artifact: string, stats: SqliteRedactionStats,
  beforeWrite: () => void, signal?: AbortSignal,
): Promise<number> {
  const cols = (db.pragma(`table_xinfo(${qi(target.name)})`) as XInfoRow[]).filter((c) => c.hidden === 0);
  if (cols.length === 0) return 0;
  let keys: string[];
  if (target.withoutRowid) {
    keys = cols.filter((c) => c.pk > 0).sort((a, b) => a.pk - b.pk).map((c) => qi(c.name));
  } else {
    const names = new Set(cols.map((c) => c.name.toLowerCase()));
    const alias = ["rowid", "_rowid_", "oid"].find((a) => !names.has(a));
    if (!alias) {
      stats.skipped.push({ table: target.name, reason: "its columns shadow every rowid alias" });
      return 0;
    }
    keys = [alias];
  }
  if (keys.length === 0) {
    stats.skipped.push({ table: target.name, reason: "no key to address its rows" });
    return 0;
  }
  stats.tables++;
  const nk = keys.length;
  const keyList = keys.join(", ");
  const ph = keys.map(() => "?").join(", ");
  const sel = `SELECT ${keyList}, ${cols.map((c) => `CASE WHEN typeof(${qi(c.name)}) IN ('text', 'blob') THEN ${qi(c.name)} END`).join(", ")} FROM ${qi(target.name)}`;
  const first = db.prepare(`${sel} ORDER BY ${keyList}`).raw(true);
  const next = db.prepare(`${sel} WHERE (${keyList}) > (${ph}) ORDER BY ${keyList}`).raw(true);
  const updates = new Map<number, BsStatement>();
  const updateOf = (col: number): BsStatement => {
    let s = updates.get(col);
    if (!s) {
      s = db.prepare(`UPDATE ${qi(target.name)} SET ${qi(cols[col]!.name)} = ? WHERE (${keyList}) = (${ph})`);
      updates.set(col, s);
    }
    return s;
  };
  let last: unknown[] | null = null;
  let changed = 0;
  const blobs = stats.blob_cells!;
  for (;;) {
    signal?.throwIfAborted();
    const batch: Array<{ key: unknown[]; col: number; text: string; blob: boolean }> = [];
    const binary: string[] = [];
    let batchBytes = 0;
    let rows = 0;
    let bytes = 0;
    let more = false;
    const rowsIt: IterableIterator<unknown[]> = last ? next.iterate(...last) : first.iterate();
    for (const row of rowsIt) {
      const key: unknown[] = row.slice(0, nk);
      last = key;
      for (let i = 0; i < cols.length; i++) {
        const v = row[nk + i];
        if (typeof v === "string") {
          stats.cells_scanned++;
          bytes += v.length;
          if (redactor.candidate(v)) {
            batch.push({ key, col: i, text: v, blob: false });
            batchBytes += v.length;
          }
          continue;
        }
        if (!Buffer.isBuffer(v)) continue;
        blobs.scanned++;
        bytes += v.length;
        if (v.length === 0 || redactor.clean?.(v) === true) continue;
        const text = v.toString("utf8");
        if (!redactor.candidate(text)) continue;
        if (isTextBlob(v)) {
          batch.push({ key, col: i, text, blob: true });
        } else {
          binary.push(text);
        }
        batchBytes += v.length;
      }
      if (++rows >= SLICE_ROWS || bytes >= SLICE_BYTES || batch.length >= BATCH_CELLS || batchBytes >= BATCH_BYTES) {
        more = true;
        break; // closes the iterator, so the connection is free for the UPDATEs
      }
    }
    stats.candidates += batch.length + binary.length;
    // A binary BLOB is scanned, not rewritten: its findings are reported as unredacted.
    for (const text of binary) {
      if (((await redactor.scanText(text, artifact)) ?? 0) > 0) blobs.unredacted++;
    }
    const writes: Array<{ key: unknown[]; col: number; value: string | Buffer }> = [];
    for (const c of batch) {
      const out = await redactor.redactText(c.text, artifact);
      if (out === c.text) continue;
      writes.push({ key: c.key, col: c.col, value: c.blob ? Buffer.from(out, "utf8") : out });
      if (c.blob) blobs.redacted++;
      else stats.cells_redacted++;
    }
    if (writes.length) {
      db.transaction(() => {
        beforeWrite();
        for (const w of writes) {
          if (writeCell(updateOf(w.col), w.value, w.key)) changed++;
        }
      })();
    }
    if (!more) break;
    await yieldToLoop();
  }
  return changed;
}

/**
 * A BLOB that is text: valid UTF-8 with no control character but tab, line feed and carriage
 * return (JSON or notes stored as bytes). Such a BLOB is redacted as a TEXT cell is; any other
 * (NULs, length prefixes, floats) is binary, and is only scanned.
 */
export function isTextBlob(b: Buffer): boolean {
  for (let i = 0; i < b.length; i++) {
    const c = b[i]!;
    if ((c < 0x20 && c !== 0x09 && c !== 0x0a && c !== 0x0d) || c === 0x7f) return false;
  }
  return isUtf8(b);
}

/** UPDATE one cell; a value colliding with a UNIQUE/PRIMARY KEY constraint gets a `#n` suffix. */
function writeCell(stmt: BsStatement, value: string | Buffer, key: unknown[]): boolean {
  for (let n = 1; ; n++) {
    try {
      const v = n === 1 ? value : typeof value === "string" ? `${value}#${n}` : Buffer.concat([value, Buffer.from(`#${n}`)]);
      return stmt.run(v, ...key).changes > 0;
    } catch (e) {
      const code = String((e as { code?: unknown }).code ?? "");
      if (!code.startsWith("SQLITE_CONSTRAINT") || n >= 1000) throw e;
    }
  }
}

/** The artifact of a live read: the database file's bytes, read while the worker holds the read transaction. */
function liveArtifact(
  f: FoundFile, live: LiveRead, r: LiveBeginResult, meta: SqliteDbMeta, verified: Promise<LiveVerifyResult>,
  databases: Record<string, SqliteDbMeta>, mapError: (e: unknown) => unknown,
): Artifact {
  const size = r.size;
  return {
    path: f.rel,
    kind: "sqlite",
    size,
    mode: f.stats.mode & 0o7777,
    mtime: f.stats.mtime,
    // The file itself is read: an incremental snapshot may reference it while the file stays as
    // it was found (its stat, taken before the read transaction, is the conservative identity).
    ...(size === f.stats.size ? { fingerprint: fingerprintOf(f.stats) } : {}),
    open: (o?: OpenOptions) => {
      const s = o?.reuse ? null : live.fh.createReadStream({ start: 0, end: size, autoClose: false, highWaterMark: 1 << 20 });
      return (async function* () {
        let done = false;
        try {
          if (s) for await (const chunk of s) yield chunk as Buffer;
          else yield* reusedChunks(live.fh, 0, size);
          done = true;
        } catch (e) {
          throw sourceError(e, f.abs);
        } finally {
          if (!done) {
            s?.destroy();
            void live.release(); // the read failed or was abandoned: let writers go now
          }
        }
      })();
    },
    check: async () => {
      try {
        let v: LiveVerifyResult;
        try {
          v = await verified;
        } catch (e) {
          throw mapError(e);
        }
        if (v.problems.length !== 1 || v.problems[0] !== "ok") {
          throw new MemsnapError("MEMSNAP_SOURCE_INVALID", `${f.abs} fails quick_check: ${v.problems.slice(0, 3).join("; ")}`, {
            path: f.abs, hint: "the database is damaged: check it with `sqlite3 FILE 'PRAGMA integrity_check'`, recover or exclude it",
          });
        }
        // The read transaction kept SQLite writers out; a size or mtime change means something else wrote the file.
        const now = await live.fh.stat();
        if (now.size !== size) throw sourceChanged(f.abs, `size ${size} → ${now.size}`);
        if (now.mtimeMs !== r.mtimeMs) throw sourceChanged(f.abs, "modified during capture");
        databases[f.rel] = { ...meta, quick_check_ms: v.quickCheckMs, tables: v.tables };
      } finally {
        await live.release();
      }
    },
  };
}

// ------------------------------------------------------------------------------ the live read

async function sizeOr0(p: string): Promise<number> {
  try {
    return (await stat(p)).size;
  } catch {
    return 0;
  }
}

/** What the redaction meta lists as not checked for a `live_read` (the same tables the copy path lists as skipped). */
export function liveReadSkips(virtualTables: Array<{ name: string; sql: string }>): Array<{ table: string; reason: string }> {
  const out: Array<{ table: string; reason: string }> = [];
  const external: Array<{ table: string; reason: string }> = [];
  const sorted = [...virtualTables].sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0));
  for (const v of sorted) {
    if (/^sqlite_/i.test(v.name)) continue;
    const mod = /\busing\s+([A-Za-z0-9_]+)/i.exec(v.sql)?.[1]?.toLowerCase() ?? "";
    if (mod !== "fts3" && mod !== "fts4" && mod !== "fts5") {
      out.push({ table: v.name, reason: `virtual table (${mod || "unknown module"}): only the TEXT cells of its shadow tables were scanned` });
      continue;
    }
    const content = ftsContentOption(v.sql);
    if (content === "") out.push({ table: v.name, reason: `contentless ${mod} table: its text cannot be read back` });
    else if (content !== undefined) external.push({ table: v.name, reason: `external-content FTS table: indexes ${content}, which had nothing to redact` });
  }
  return [...out, ...external];
}

/**
 * One database's read transaction in the worker (`handle`) and the file handle its bytes
 * are read through. The file handle is closed only after the worker has closed the
 * connection (or exited): closing a descriptor of the file drops every POSIX lock this
 * process holds on it, the read transaction's included.
 */
class LiveRead {
  #released: Promise<void> | null = null;
  constructor(readonly handle: number, readonly fh: FileHandle, readonly f: FoundFile, readonly worker: SqliteWorker) {}

  /** End the read transaction, close the connection, then the file handle. Idempotent; never rejects. */
  release(): Promise<void> {
    this.#released ??= (async () => {
      try {
        await this.worker.call({ op: "live_release", handle: this.handle });
      } catch {
        await this.worker.close(); // a dead worker: wait until its thread (and so its connections) is gone
      }
      await this.fh.close().catch(() => undefined);
    })();
    return this.#released;
  }
}

/** SQLite databases, each captured as one committed state under live writers (see the module comment). */
export const sqliteSource: SourceKind<SqliteConfig> = {
  kind: "sqlite",
  schemaVersion: 1,
  // A restored database gets its captured mode (less the umask) and mtime, set after materialize.
  restoresAttributes: true,
  parseConfig(raw, where) {
    rejectUnknownKeys(raw, ["kind", "name", "path", "include", "exclude", "busy_timeout_ms", "live_read"], where);
    return {
      kind: "sqlite",
      name: reqString(raw, "name", where),
      path: reqString(raw, "path", where),
      include: optStringArray(raw, "include", where),
      exclude: optStringArray(raw, "exclude", where),
      busy_timeout_ms: optInt(raw, "busy_timeout_ms", where, 0, 3_600_000) ?? SQLITE_DEFAULT_BUSY_TIMEOUT_MS,
      live_read: optBool(raw, "live_read", where) ?? true,
    };
  },

  async capture(cfg, ctx) {
    const root = resolve(ctx.baseDir, cfg.path);
    const walked = await walkFiles(root, { include: cfg.include ?? SQLITE_DEFAULT_INCLUDE, exclude: cfg.exclude });
    const { files, skipped } = walked;
    const dbs = files.filter((f) => !SIDE_FILE.test(f.rel));
    const sideFiles = files.length - dbs.length;
    const databases: Record<string, SqliteDbMeta> = {};
    const temps = new Set<string>();
    const lives = new Set<LiveRead>();
    // With redaction, two workers: while one reads database i, the other scans database i+1 ahead (see the module comment).
    const workers: SqliteWorker[] = [];
    const workerFor = (i: number): SqliteWorker => (workers[ctx.redactor && cfg.live_read !== false ? i % 2 : 0] ??= new SqliteWorker());
    const tag = randomBytes(4).toString("hex");
    let seq = 0;
    let handles = 0;
    const removeCopy = async (p: string): Promise<void> => {
      for (const f of [p, `${p}-journal`, `${p}.vacuum`]) await rm(f, { force: true });
      temps.delete(p);
    };
    const liveOn = cfg.live_read !== false;
    const redact = !!ctx.redactor;

    /** Open a database file and look at its first bytes; the handle stays open for a live read. */
    const openDb = async (f: FoundFile): Promise<FileHandle> => {
      let fh: FileHandle;
      try {
        fh = await open(f.abs, "r");
      } catch (e) {
        throw sourceError(e, f.abs);
      }
      let kind: Awaited<ReturnType<typeof sniffHandle>>;
      try {
        kind = await sniffHandle(fh, f.abs);
      } catch (e) {
        await fh.close().catch(() => undefined);
        throw e;
      }
      if (kind === "other" || kind === "random") {
        await fh.close().catch(() => undefined);
        throw notSqlite(f.abs, kind);
      }
      return fh;
    };

    // An incremental snapshot references a database read live last time whose file has not
    // changed since (same device, inode, size, mtime, ctime) and has no WAL frames or hot journal
    // now: its bytes are those stored then, so it is neither opened nor scanned nor checked
    // again; its meta is carried over from that snapshot (with `reused_from`).
    const reused = new Map<FoundFile, SqliteDbMeta>();
    if (ctx.unchanged && liveOn) {
      for (const f of dbs) {
        const meta = ctx.unchanged(`${cfg.name}/${f.rel}`, fingerprintOf(f.stats), "sqlite");
        const prev = (meta?.databases as Record<string, SqliteDbMeta> | undefined)?.[f.rel];
        if (!prev || prev.method !== "live_read") continue;
        if ((await sizeOr0(`${f.abs}-wal`)) > 0 || (await sizeOr0(`${f.abs}-journal`)) > 0) continue;
        reused.set(f, prev);
      }
    }

    /** A look-ahead: the next database's redaction scan, in its own short read transaction, in the other worker. */
    interface Ahead { f: FoundFile; live: LiveRead; done: Promise<unknown> }
    let ahead: Ahead | null = null;
    const startAhead = async (f: FoundFile | undefined, cur: FoundFile | null, w: SqliteWorker): Promise<void> => {
      if (!f || !liveOn || !redact || ctx.signal?.aborted || reused.has(f)) return;
      // A hard link of the database being read: closing that one's descriptor would drop this one's locks.
      if (cur && f.stats.dev === cur.stats.dev && f.stats.ino === cur.stats.ino) return;
      let fh: FileHandle;
      try {
        fh = await openDb(f);
      } catch {
        return; // reported when its turn comes
      }
      const live = new LiveRead(++handles, fh, f, w);
      lives.add(live);
      const done = w.call<LiveBeginResult>({
        op: "live_begin", handle: live.handle, src: f.abs, fd: fh.fd, busyTimeoutMs: cfg.busy_timeout_ms, redact, hold: false,
      }).catch(() => undefined); // a failure is met again (and reported) when its turn comes
      ahead = { f, live, done };
    };

    // The first database's scan starts now: the snapshot starts every capture up front, so it
    // runs while the layers before this one pack (its result is reused only if the database
    // has not changed by its turn, as for any look-ahead).
    const firstRead = dbs.findIndex((f) => !reused.has(f));
    if (firstRead >= 0) await startAhead(dbs[firstRead], null, workerFor(firstRead));

    return {
      estimatedBytes: dbs.reduce((n, f) => n + f.stats.size, 0),
      notices: () => walkNotices(walked),
      artifacts: (async function* (): AsyncGenerator<Artifact> {
        for (let i = 0; i < dbs.length; i++) {
          const f = dbs[i]!;
          ctx.signal?.throwIfAborted();
          const prev = reused.get(f);
          if (prev) {
            databases[f.rel] = { ...prev, reused: true };
            yield {
              path: f.rel, kind: "sqlite", size: f.stats.size, mode: f.stats.mode & 0o7777, mtime: f.stats.mtime, fingerprint: fingerprintOf(f.stats),
              open: () => {
                throw new MemsnapError("MEMSNAP_INTERNAL", `${f.abs} was to be referenced by the incremental snapshot, not read`);
              },
            };
            continue;
          }
          const w = workerFor(i);
          const job = <T>(p: Promise<T>): Promise<T> => p.catch((e: unknown) => {
            throw ctx.signal?.aborted ? e : sqliteSourceError(e, f.abs, ctx.tmpDir);
          });
          const sourceBytes = f.stats.size + (await sizeOr0(`${f.abs}-wal`));

          // ---- the live read: the file itself under a read transaction, when that is sound
          let skippedWhy: string | undefined = liveOn ? undefined : "disabled";
          const pre = ahead as Ahead | null;
          ahead = null;
          let live: LiveRead | null = null;
          if (pre && pre.f === f) {
            await pre.done; // the look-ahead's job must end before the same handle is used again
            live = pre.live;
          } else if (pre) {
            lives.delete(pre.live);
            await pre.live.release();
          }
          if (liveOn) {
            if (!live) {
              const fh = await openDb(f);
              live = new LiveRead(++handles, fh, f, w);
              lives.add(live);
            }
            const l = live;
            await startAhead(dbs[i + 1], f, workerFor(i + 1)); // runs while this one is scanned and streams
            let r: LiveBeginResult;
            try {
              r = await job(l.worker.call<LiveBeginResult>({
                op: "live_begin", handle: l.handle, src: f.abs, fd: l.fh.fd, busyTimeoutMs: cfg.busy_timeout_ms, redact, hold: true,
              }, ctx.signal));
            } catch (e) {
              lives.delete(l);
              await l.release();
              throw e;
            }
            if (r.eligible) {
              // quick_check and the row counts run in the worker, in the same transaction, while the bytes stream.
              const verified = l.worker.call<LiveVerifyResult>({ op: "live_verify", handle: l.handle, limit: 10 }, ctx.signal);
              verified.catch(() => undefined); // awaited in check()
              const meta: SqliteDbMeta = {
                method: "live_read",
                ...r.pragmas,
                source_bytes: r.size + r.walBytes,
                copy_bytes: r.size,
                copy_ms: 0,
                prepare_ms: r.ms,
                quick_check: "ok",
                tables: {},
                ...(r.scan ? {
                  redaction: {
                    scrub: "none", tables: r.scan.tables, cells_scanned: r.scan.cells_scanned, candidates: 0, cells_redacted: 0,
                    fts_rebuilt: [], fts_optimized: [], stat4_cleared: false, skipped: liveReadSkips(r.virtualTables),
                    live_scan: { ...r.scan, ...(r.reused ? { reused: true } : {}) },
                  } satisfies SqliteRedactionStats,
                } : {}),
              };
              yield liveArtifact(f, l, r, meta, verified, databases, (e) => (ctx.signal?.aborted ? e : sqliteSourceError(e, f.abs)));
              lives.delete(l);
              await l.release();
              continue;
            }
            skippedWhy = r.reason ?? "unknown";
            lives.delete(l);
            await l.release();
          }

          // ---- the copy (today's path): VACUUM INTO (or a one-step backup), redaction in the copy, quick_check
          const copy = join(ctx.tmpDir, `sqlite-${cfg.name}-${tag}-${seq++}.db`);
          temps.add(copy);
          if (!liveOn) {
            const kind = await sniff(f.abs);
            if (kind === "other" || kind === "random") throw notSqlite(f.abs, kind);
          }
          const cr = await job(w.call<CopyResult>({ op: "copy", src: f.abs, dest: copy, busyTimeoutMs: cfg.busy_timeout_ms }, ctx.signal));
          let redaction: SqliteRedactionStats | undefined;
          if (ctx.redactor) {
            const r = await redactSqliteCopy(copy, ctx.redactor, `${cfg.name}/${f.rel}`, ctx.signal);
            redaction = r.stats;
            if (r.changed) await job(w.call({ op: "vacuum", path: copy }, ctx.signal));
          }
          const chk = await job(w.call<CheckResult>({ op: "check", path: copy, pragma: "quick_check", limit: 10, counts: true }, ctx.signal));
          if (chk.problems.length !== 1 || chk.problems[0] !== "ok") {
            throw new MemsnapError("MEMSNAP_SOURCE_INVALID",
              `the copy of ${f.abs} fails quick_check: ${chk.problems.slice(0, 3).join("; ")}`, {
                path: f.abs, hint: "the database is damaged: check it with `sqlite3 FILE 'PRAGMA integrity_check'`, recover or exclude it",
              });
          }
          let st;
          try {
            st = await stat(copy);
          } catch (e) {
            throw sourceError(e, copy);
          }
          databases[f.rel] = {
            method: cr.method,
            ...cr.pragmas,
            source_bytes: sourceBytes,
            copy_bytes: st.size,
            copy_ms: Math.round(cr.ms),
            quick_check: "ok",
            ...(skippedWhy ? { live_read_skipped: skippedWhy } : {}),
            tables: chk.tables ?? {},
            ...(redaction ? { redaction } : {}),
          };
          const a = fileArtifact({ abs: copy, rel: f.rel, stats: st }, "sqlite");
          yield { ...a, mode: f.stats.mode & 0o7777, mtime: f.stats.mtime };
          // The pipeline has packed and checked the artifact: drop the copy now to bound disk use.
          await removeCopy(copy);
        }
      })(),
      finish: async () => {
        // Every database has streamed: stop the workers now (each holds a V8 heap and SQLite
        // caches), not at the end of the whole snapshot, then close the file handles.
        for (const w of workers.splice(0)) await w?.close();
        for (const l of [...lives]) await l.release();
        return { root, root_is_file: files.length === 1 && files[0]!.abs === root, databases, skipped: { ...skipped, side_files: sideFiles } };
      },
      cleanup: async () => {
        // Stop the worker first (its exit closes every connection), then close the file handles.
        for (const w of workers) await w?.close();
        for (const l of [...lives]) await l.release();
        for (const p of [...temps]) await removeCopy(p).catch(() => undefined);
      },
    };
  },

  async deepVerify({ entry, bytes }) {
    const dir = await mkdtemp(join(tmpdir(), "memsnap-sqlite-verify-"));
    try {
      const file = join(dir, "check.db");
      await pipeline(Readable.from(bytes), createWriteStream(file, { mode: 0o600 }));
      let r: CheckResult;
      try {
        r = await runSqliteJob<CheckResult>({ op: "check", path: file, pragma: "integrity_check", limit: 10 });
      } catch (e) {
        if (e instanceof SqliteJobError) return `${entry.path}: not a sound SQLite database: ${e.message}`;
        throw e;
      }
      if (r.problems.length === 1 && r.problems[0] === "ok") return null;
      const shown = r.problems.slice(0, 3).map((p) => p.replace(/\s+/g, " ").trim());
      return `${entry.path}: integrity_check found ${r.problems.length >= 10 ? "10+" : r.problems.length} problem(s): ${shown.join("; ")}`;
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  },

  async liveTarget(cfg, baseDir, layer) {
    const abs = resolve(baseDir, cfg.path);
    const dbs = isPlainObject(layer.meta) && isPlainObject(layer.meta.databases) ? Object.keys(layer.meta.databases) : [];
    // Whether the layer was one database file (not a directory of them): what matters when the
    // live path is missing (a new machine), else the live path says. Bundles before root_is_file
    // tell by the captured root, a file whose name is the one database's.
    const root = layer.meta?.root;
    const capturedFile = typeof layer.meta?.root_is_file === "boolean"
      ? layer.meta.root_is_file
      : dbs.length === 1 && dbs[0] === basename(abs) && typeof root === "string" && basename(root) === dbs[0];
    const t = await pathTarget(abs, capturedFile, { include: cfg.include ?? SQLITE_DEFAULT_INCLUDE, exclude: cfg.exclude });
    const owns = t.owns!;
    return {
      ...t,
      owns: (rel) => !SIDE_FILE.test(rel) && owns(rel),
      // A restored database never keeps the live -wal/-shm/-journal: they belong to the old file.
      companions: (rel) => ["-wal", "-shm", "-journal"].map((x) => rel + x),
    };
  },

  async planLayer(cfg, baseDir, layer) {
    const dbs = isPlainObject(layer.meta) && isPlainObject(layer.meta.databases) ? layer.meta.databases : {};
    const t = await this.liveTarget!(cfg, baseDir, layer);
    const Database = createRequire(import.meta.url)("better-sqlite3") as typeof import("better-sqlite3");
    const lines: string[] = [];
    for (const [rel, m] of Object.entries(dbs)) {
      const want = isPlainObject(m) && isPlainObject(m.tables) ? (m.tables as Record<string, number>) : {};
      const live: Record<string, number> = {};
      try {
        const db = new Database(join(t.root, rel), { readonly: true, fileMustExist: true });
        try {
          for (const name of Object.keys(want)) {
            try {
              live[name] = (db.prepare(`SELECT count(*) AS n FROM "${name.replace(/"/g, '""')}"`).get() as { n: number }).n;
            } catch { /* table absent live */ }
          }
        } finally {
          db.close();
        }
      } catch {
        lines.push(`${rel}: not present live (will be created)`);
        continue;
      }
      const deltas = Object.entries(want).map(([name, n]) => {
        const before = live[name];
        return before === undefined ? `${name} +${n} (new table)` : `${name} ${before} → ${n} (${n - before >= 0 ? "+" : ""}${n - before})`;
      });
      lines.push(`${rel}: rows ${deltas.join(", ") || "(no tables)"}`);
    }
    return lines;
  },

  async materialize(dir, layer) {
    const meta = isPlainObject(layer.meta) && isPlainObject(layer.meta.databases) ? layer.meta.databases : {};
    const { files } = await walkFiles(dir);
    // A sqlite layer never holds side files; one here could be replayed into the wrong database.
    for (const f of files) if (SIDE_FILE.test(f.rel)) await rm(f.abs, { force: true });
    const dbs = files.filter((f) => !SIDE_FILE.test(f.rel));
    if (dbs.length === 0) return;
    const w = new SqliteWorker();
    try {
      for (const f of dbs) {
        for (const s of ["-wal", "-shm", "-journal"]) await rm(f.abs + s, { force: true });
        const m = meta[f.rel];
        const jm = isPlainObject(m) && typeof m.journal_mode === "string" ? m.journal_mode : null;
        const name = `${layer.name}/${f.rel}`;
        try {
          await w.call({ op: "materialize", path: f.abs, journalMode: jm });
        } catch (e) {
          const code = e instanceof SqliteJobError ? e.sqliteCode ?? "" : "";
          if (code === "SQLITE_NOTADB" || code.startsWith("SQLITE_CORRUPT")) {
            throw new MemsnapError("MEMSNAP_DEEP_VERIFY_FAILED", `${name} does not open as an SQLite database: ${(e as Error).message}`, {
              path: name, cause: e, hint: "run `memsnap verify --deep` on the bundle",
            });
          }
          if (code === "SQLITE_FULL") {
            throw new MemsnapError("MEMSNAP_DEST_FULL", `no space left restoring ${name}`, { path: name, cause: e, hint: "free space on the destination" });
          }
          throw new MemsnapError("MEMSNAP_DEST_UNWRITABLE", `cannot open the restored database ${name}: ${(e as Error).message}`, {
            path: name, cause: e, hint: "check that the destination is writable",
          });
        }
      }
    } finally {
      await w.close();
    }
  },
};
