/**
 * Redaction on the copy path: TEXT cells, and BLOB cells that are text, are rewritten in the
 * copy (never the live database) on the main thread, in bounded slices; binary BLOBs are only
 * scanned, and their findings reported as unredacted. Old bytes go with the rebuild that follows
 * (VACUUM in the worker). Details: docs/BENCHMARK.md, "SQLite capture notes".
 */
import { isUtf8 } from "node:buffer";
import { createRequire } from "node:module";
import { MemsnapError } from "../../errors.js";
import type { Redactor } from "../../redact/types.js";
import { betterSqlitePath } from "./worker-host.js";
import { sqliteSourceError } from "./errors.js";
import type { SqliteRedactionStats } from "./meta.js";

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
type BsCtor = new (
  path: string,
  opts?: { readonly?: boolean; fileMustExist?: boolean; timeout?: number },
) => BsDatabase;

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

interface TableListRow {
  schema: string;
  name: string;
  type: string;
  ncol: number;
  wr: number;
  strict: number;
}
interface XInfoRow {
  cid: number;
  name: string;
  type: string;
  pk: number;
  hidden: number;
}

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
    if ((q === "'" || q === '"' || q === "`") && v.endsWith(q) && v.length >= 2) {
      v = v.slice(1, -1).replaceAll(q + q, q);
    } else if (q === "[" && v.endsWith("]")) v = v.slice(1, -1);
    return v;
  }
  return undefined;
}

interface Target {
  name: string;
  fts: boolean;
  withoutRowid: boolean;
}

/**
 * Redact the TEXT cells of the database copy at `path` in place (see the module comment).
 * `changed` is true when any byte of the file's content changed (the caller then VACUUMs).
 */
export async function redactSqliteCopy(
  path: string,
  redactor: Redactor,
  artifact: string,
  signal?: AbortSignal,
): Promise<{ stats: SqliteRedactionStats; changed: boolean }> {
  const Database = betterSqlite();
  const db = new Database(path, { fileMustExist: true });
  const stats: SqliteRedactionStats = {
    scrub: "secure_delete+vacuum",
    tables: 0,
    cells_scanned: 0,
    candidates: 0,
    cells_redacted: 0,
    blob_cells: { scanned: 0, redacted: 0, unredacted: 0 },
    fts_rebuilt: [],
    fts_optimized: [],
    stat4_cleared: false,
    skipped: [],
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
    const tables = db.prepare("SELECT name, sql FROM sqlite_schema WHERE type = 'table'").all();
    const sqlOf = new Map((tables as Array<{ name: string; sql: string | null }>).map((r) => [r.name, r.sql ?? ""]));
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
      else if (content === "") {
        stats.skipped.push({ table: t.name, reason: `contentless ${mod} table: its text cannot be read back` });
      } else ftsExternal.push({ name: t.name, content });
    }

    const dropTriggers = (): void => {
      if (dropped.triggers) return;
      const list = db
        .prepare("SELECT name, sql FROM sqlite_schema WHERE type = 'trigger' AND sql IS NOT NULL")
        .all() as Array<{ name: string; sql: string }>;
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
        stats.skipped.push({
          table: f.name,
          reason: `external-content FTS table: indexes ${f.content}, which had nothing to redact`,
        });
      }
    }
    const toRecreate = dropped.triggers;
    if (toRecreate)
      db.transaction(() => {
        for (const tr of toRecreate) db.exec(tr.sql);
      })();
    return { stats, changed };
  } catch (e) {
    if (e instanceof MemsnapError) throw e;
    if (signal?.aborted) throw e;
    const code = String((e as { code?: unknown }).code ?? "");
    if (code === "SQLITE_FULL" || code.startsWith("SQLITE_IOERR")) throw sqliteSourceError(e, artifact, path);
    throw new MemsnapError("MEMSNAP_SOURCE_INVALID", `cannot redact the copy of ${artifact}: ${(e as Error).message}`, {
      path: artifact,
      cause: e,
      hint:
        "disable redaction for this snapshot (--no-redact) and encrypt the bundle instead, " +
        "or report the schema that failed",
    });
  } finally {
    db.close();
  }
}

const yieldToLoop = (): Promise<void> => new Promise((r) => setImmediate(r));

/** Redact one table (or FTS table); returns the number of cells changed. */
async function redactTable(
  db: BsDatabase,
  target: Target,
  redactor: Redactor,
  artifact: string,
  stats: SqliteRedactionStats,
  beforeWrite: () => void,
  signal?: AbortSignal,
): Promise<number> {
  const cols = (db.pragma(`table_xinfo(${qi(target.name)})`) as XInfoRow[]).filter((c) => c.hidden === 0);
  if (cols.length === 0) return 0;
  let keys: string[];
  if (target.withoutRowid) {
    keys = cols
      .filter((c) => c.pk > 0)
      .sort((a, b) => a.pk - b.pk)
      .map((c) => qi(c.name));
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
  const cells = cols.map((c) => `CASE WHEN typeof(${qi(c.name)}) IN ('text', 'blob') THEN ${qi(c.name)} END`);
  const sel = `SELECT ${keyList}, ${cells.join(", ")} FROM ${qi(target.name)}`;
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
      const v =
        n === 1 ? value : typeof value === "string" ? `${value}#${n}` : Buffer.concat([value, Buffer.from(`#${n}`)]);
      return stmt.run(v, ...key).changes > 0;
    } catch (e) {
      const code = String((e as { code?: unknown }).code ?? "");
      if (!code.startsWith("SQLITE_CONSTRAINT") || n >= 1000) throw e;
    }
  }
}
