/**
 * The `sqlite` source: SQLite databases, each captured as one consistent copy even while
 * another process writes to it.
 *
 * Copy. Copying the `.db` file (with or without its `-wal`) under a live writer loses
 * committed rows or tears transactions, so each database is opened read-only
 * (`readonly`, `fileMustExist`, busy timeout `busy_timeout_ms`) and copied with
 * `VACUUM INTO '<tmpDir>/…'`: one read transaction, so the copy is exactly one committed
 * state, with the WAL's committed frames folded in and the free pages dropped. If VACUUM INTO
 * fails with a plain SQL error, a one-step online backup (`backup(dest, {progress: () => 2**31-1})`,
 * all pages in one step: the default stepped backup restarts on every foreign write and may
 * never finish, and better-sqlite3 reads a returned 0 as zero pages per step) is used instead; the layer meta records which. Both calls block the thread
 * they run on, so they run in a worker thread (./sqlite-worker.ts), as do VACUUM and the
 * checks. The copy is a rollback-journal database; the `-wal`/`-shm`/`-journal` files are
 * never captured.
 *
 * Redaction (when `ctx.redactor` is present) rewrites TEXT cells IN THE COPY, never the live
 * database, on the main thread where the redactor lives, in bounded slices:
 * - ordinary tables (not `sqlite_%`, not shadow tables): rows are streamed with `.iterate()`
 *   in key order (rowid, or the PRIMARY KEY of a WITHOUT ROWID table) and resumed by keyset
 *   (`WHERE key > last`), so each slice holds at most a few thousand rows; every TEXT value
 *   goes through `redactor.candidate()` and only candidates through `redactText()`. Changed
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
 * Not redacted: BLOB cells, the schema SQL, and the skipped tables above.
 *
 * Then `PRAGMA quick_check` must be `ok` on the final copy. The layer meta records per
 * database: the source's `journal_mode`, `page_size`, `user_version`, `schema_version`,
 * `application_id`, `encoding`; each ordinary table's row count; the copy's size, method
 * and time.
 */
import { randomBytes } from "node:crypto";
import { createWriteStream } from "node:fs";
import { mkdtemp, open, rm, stat } from "node:fs/promises";
import { createRequire } from "node:module";
import { tmpdir } from "node:os";
import { basename, join, resolve } from "node:path";
import { Readable } from "node:stream";
import { pipeline } from "node:stream/promises";
import { MemsnapError } from "../errors.js";
import type { Redactor } from "../redact/types.js";
import { isPlainObject, optInt, optStringArray, rejectUnknownKeys, reqString } from "../util/config-check.js";
import {
  betterSqlitePath, runSqliteJob, SqliteJobError, SqliteWorker, type CheckResult, type CopyResult,
} from "./sqlite-worker.js";
import type { Artifact, SourceKind } from "./types.js";
import { fileArtifact, sourceError, walkFiles } from "./walk.js";
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
}

export const SQLITE_DEFAULT_INCLUDE = ["*.db", "*.sqlite", "*.sqlite3"];
export const SQLITE_DEFAULT_BUSY_TIMEOUT_MS = 5000;
/** SQLite's side files: never captured, removed beside restored databases. */
const SIDE_FILE = /-(wal|shm|journal)$/;
const HEADER = Buffer.from("SQLite format 3\0", "latin1");

/** Per-database facts in the layer meta (`meta.databases[<artifact path>]`). */
export interface SqliteDbMeta {
  method: "vacuum_into" | "backup";
  journal_mode: string;
  page_size: number;
  user_version: number;
  schema_version: number;
  application_id: number;
  encoding: string;
  source_bytes: number;
  copy_bytes: number;
  copy_ms: number;
  quick_check: "ok";
  tables: Record<string, number>;
  redaction?: SqliteRedactionStats;
}

export interface SqliteRedactionStats {
  /** How old bytes are scrubbed from the copy. */
  scrub: "secure_delete+vacuum";
  tables: number;
  cells_scanned: number;
  candidates: number;
  cells_redacted: number;
  fts_rebuilt: string[];
  fts_optimized: string[];
  stat4_cleared: boolean;
  skipped: Array<{ table: string; reason: string }>;
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
    const buf = Buffer.alloc(4096);
    const { bytesRead } = await fh.read(buf, 0, buf.length, 0);
    if (bytesRead === 0) return "empty";
    if (bytesRead >= HEADER.length && buf.subarray(0, HEADER.length).equals(HEADER)) return "sqlite";
    const seen = new Set(buf.subarray(0, bytesRead));
    return bytesRead >= 1024 && seen.size >= 200 ? "random" : "other";
  } catch (e) {
    throw sourceError(e, path);
  } finally {
    await fh.close();
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
    fts_rebuilt: [], fts_optimized: [], stat4_cleared: false, skipped: [],
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
  const sel = `SELECT ${keyList}, ${cols.map((c) => `CASE WHEN typeof(${qi(c.name)}) = 'text' THEN ${qi(c.name)} END`).join(", ")} FROM ${qi(target.name)}`;
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
  for (;;) {
    signal?.throwIfAborted();
    const batch: Array<{ key: unknown[]; col: number; text: string }> = [];
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
        if (typeof v !== "string") continue;
        stats.cells_scanned++;
        bytes += v.length;
        if (redactor.candidate(v)) {
          batch.push({ key, col: i, text: v });
          batchBytes += v.length;
        }
      }
      if (++rows >= SLICE_ROWS || bytes >= SLICE_BYTES || batch.length >= BATCH_CELLS || batchBytes >= BATCH_BYTES) {
        more = true;
        break; // closes the iterator, so the connection is free for the UPDATEs
      }
    }
    stats.candidates += batch.length;
    const writes: Array<{ key: unknown[]; col: number; text: string }> = [];
    for (const c of batch) {
      const out = await redactor.redactText(c.text, artifact);
      if (out !== c.text) writes.push({ key: c.key, col: c.col, text: out });
    }
    if (writes.length) {
      db.transaction(() => {
        beforeWrite();
        for (const w of writes) {
          if (writeCell(updateOf(w.col), w.text, w.key)) changed++;
        }
      })();
      stats.cells_redacted += writes.length;
    }
    if (!more) break;
    await yieldToLoop();
  }
  return changed;
}

/** UPDATE one cell; a value colliding with a UNIQUE/PRIMARY KEY constraint gets a `#n` suffix. */
function writeCell(stmt: BsStatement, text: string, key: unknown[]): boolean {
  for (let n = 1; ; n++) {
    try {
      return stmt.run(n === 1 ? text : `${text}#${n}`, ...key).changes > 0;
    } catch (e) {
      const code = String((e as { code?: unknown }).code ?? "");
      if (!code.startsWith("SQLITE_CONSTRAINT") || n >= 1000) throw e;
    }
  }
}

// ------------------------------------------------------------------------------ the source kind

async function sizeOr0(p: string): Promise<number> {
  try {
    return (await stat(p)).size;
  } catch {
    return 0;
  }
}

/** SQLite databases, each copied consistently under a live writer (see the module comment). */
export const sqliteSource: SourceKind<SqliteConfig> = {
  kind: "sqlite",
  schemaVersion: 1,
  parseConfig(raw, where) {
    rejectUnknownKeys(raw, ["kind", "name", "path", "include", "exclude", "busy_timeout_ms"], where);
    return {
      kind: "sqlite",
      name: reqString(raw, "name", where),
      path: reqString(raw, "path", where),
      include: optStringArray(raw, "include", where),
      exclude: optStringArray(raw, "exclude", where),
      busy_timeout_ms: optInt(raw, "busy_timeout_ms", where, 0, 3_600_000) ?? SQLITE_DEFAULT_BUSY_TIMEOUT_MS,
    };
  },

  async capture(cfg, ctx) {
    const root = resolve(ctx.baseDir, cfg.path);
    const { files, skipped } = await walkFiles(root, { include: cfg.include ?? SQLITE_DEFAULT_INCLUDE, exclude: cfg.exclude });
    const dbs = files.filter((f) => !SIDE_FILE.test(f.rel));
    const sideFiles = files.length - dbs.length;
    const databases: Record<string, SqliteDbMeta> = {};
    const temps = new Set<string>();
    let worker: SqliteWorker | null = null;
    const tag = randomBytes(4).toString("hex");
    let seq = 0;
    const removeCopy = async (p: string): Promise<void> => {
      for (const f of [p, `${p}-journal`, `${p}.vacuum`]) await rm(f, { force: true });
      temps.delete(p);
    };
    return {
      estimatedBytes: dbs.reduce((n, f) => n + f.stats.size, 0),
      artifacts: (async function* (): AsyncGenerator<Artifact> {
        for (const f of dbs) {
          ctx.signal?.throwIfAborted();
          const kind = await sniff(f.abs);
          if (kind === "other" || kind === "random") throw notSqlite(f.abs, kind);
          const copy = join(ctx.tmpDir, `sqlite-${cfg.name}-${tag}-${seq++}.db`);
          temps.add(copy);
          worker ??= new SqliteWorker();
          const w = worker;
          const job = <T>(p: Promise<T>): Promise<T> => p.catch((e: unknown) => {
            throw ctx.signal?.aborted ? e : sqliteSourceError(e, f.abs, ctx.tmpDir);
          });
          const sourceBytes = f.stats.size + (await sizeOr0(`${f.abs}-wal`));
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
            tables: chk.tables ?? {},
            ...(redaction ? { redaction } : {}),
          };
          const a = fileArtifact({ abs: copy, rel: f.rel, stats: st }, "sqlite");
          yield { ...a, mode: f.stats.mode & 0o7777, mtime: f.stats.mtime };
          // The pipeline has packed and checked the artifact: drop the copy now to bound disk use.
          await removeCopy(copy);
        }
      })(),
      finish: async () => ({
        root,
        databases,
        skipped: { ...skipped, side_files: sideFiles },
      }),
      cleanup: async () => {
        await (worker as SqliteWorker | null)?.close();
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
    const capturedFile = dbs.length === 1 && dbs[0] === basename(abs) && layer.meta?.root === abs;
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
