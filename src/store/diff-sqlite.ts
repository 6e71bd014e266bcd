/**
 * The SQLite view of `memsnap diff`: per database and table, the row counts the layer meta
 * records in each snapshot and, when both copies are at hand (the database changed), the rows
 * added, removed and changed by rowid, from two ordered scans of private temp copies.
 */
import { createRequire } from "node:module";
import { performance } from "node:perf_hooks";
import type { LayerDiff, SqliteDiff } from "./diff-types.js";

interface Bs {
  prepare(sql: string): {
    raw(on: boolean): { safeIntegers(on: boolean): { iterate(): IterableIterator<unknown[]> } };
    all(): unknown[];
  };
  pragma(s: string): unknown;
  close(): void;
}

/** A cell as comparable text (type-tagged: 1 and '1' differ). */
function cell(v: unknown): string {
  if (v === null) return "n";
  if (typeof v === "bigint") return `i${v}`;
  if (typeof v === "number") return `r${v}`;
  if (typeof v === "string") return `s${v.length}:${v}`;
  if (Buffer.isBuffer(v)) return `b${v.toString("hex")}`;
  return `?${String(v)}`;
}

/**
 * Rows added, removed and changed by rowid in each table present (with a rowid) in both copies:
 * two ordered scans merged, one row of each in memory at a time. The copies are private temp
 * files; each is opened with untrusted schema off and queries only.
 */
async function rowDiff(
  fa: string,
  fb: string,
): Promise<Record<string, { added: number; removed: number; changed: number; changed_rowids: string[] }>> {
  const Database = createRequire(import.meta.url)("better-sqlite3") as new (p: string, o: object) => Bs;
  const open = (f: string): Bs => {
    const db = new Database(f, { fileMustExist: true });
    db.pragma("trusted_schema = OFF");
    db.pragma("query_only = ON");
    return db;
  };
  const [A, B] = [open(fa), open(fb)];
  try {
    const tables = (db: Bs): Map<string, string> =>
      new Map(
        (
          db
            .prepare(
              "SELECT name, sql FROM sqlite_schema WHERE type = 'table' AND name NOT LIKE 'sqlite\\_%' ESCAPE '\\'",
            )
            .all() as { name: string; sql: string | null }[]
        )
          .filter(
            (t) => !/^\s*CREATE\s+VIRTUAL\b/i.test(t.sql ?? "") && !/\bWITHOUT\s+ROWID\s*[;,)]?\s*$/i.test(t.sql ?? ""),
          )
          .map((t) => [t.name, t.sql ?? ""]),
      );
    const [ta, tb] = [tables(A), tables(B)];
    const out: Record<string, { added: number; removed: number; changed: number; changed_rowids: string[] }> = {};
    let turn = performance.now();
    for (const t of ta.keys()) {
      if (!tb.has(t)) continue;
      const q = `SELECT _rowid_, * FROM "${t.replace(/"/g, '""')}" ORDER BY _rowid_`;
      let ia: IterableIterator<unknown[]>;
      let ib: IterableIterator<unknown[]>;
      try {
        ia = A.prepare(q).raw(true).safeIntegers(true).iterate();
        ib = B.prepare(q).raw(true).safeIntegers(true).iterate();
      } catch {
        continue; // no rowid to compare by
      }
      const r = { added: 0, removed: 0, changed: 0, changed_rowids: [] as string[] };
      let x = ia.next();
      let y = ib.next();
      while (!x.done || !y.done) {
        if (performance.now() - turn > 50) {
          await new Promise<void>((res) => setImmediate(res));
          turn = performance.now();
        }
        const kx = x.done ? null : (x.value[0] as bigint);
        const ky = y.done ? null : (y.value[0] as bigint);
        if (ky === null || (kx !== null && kx < ky)) {
          r.removed++;
          x = ia.next();
        } else if (kx === null || ky < kx) {
          r.added++;
          y = ib.next();
        } else {
          const va = x.value as unknown[];
          const vb = y.value as unknown[];
          if (va.length !== vb.length || va.some((v, i) => i > 0 && cell(v) !== cell(vb[i]))) {
            r.changed++;
            if (r.changed_rowids.length < 100) r.changed_rowids.push(String(kx));
          }
          x = ia.next();
          y = ib.next();
        }
      }
      out[t] = r;
    }
    return out;
  } finally {
    for (const db of [A, B]) {
      try {
        db.close();
      } catch {
        // a statement left mid-scan by an error: the process ends it
      }
    }
  }
}

/**
 * A SQLite layer's view: the tables of every database in either snapshot, with rows compared
 * where `copies` gives both copies' temp files (a comparison that fails is a note on `d`).
 */
export async function sqliteLayerDiff(
  d: LayerDiff,
  xa: Record<string, unknown>,
  xb: Record<string, unknown>,
  copies: (name: string) => [string | null, string | null],
): Promise<SqliteDiff> {
  const da = (xa.databases ?? {}) as Record<string, { tables?: Record<string, number> }>;
  const db = (xb.databases ?? {}) as Record<string, { tables?: Record<string, number> }>;
  const sq: SqliteDiff = { databases: {} };
  for (const name of new Set([...Object.keys(da), ...Object.keys(db)])) {
    const ta = da[name]?.tables ?? {};
    const tb = db[name]?.tables ?? {};
    const tables: SqliteDiff["databases"][string] = {};
    for (const t of new Set([...Object.keys(ta), ...Object.keys(tb)])) {
      const from = typeof ta[t] === "number" ? ta[t] : 0;
      const to = typeof tb[t] === "number" ? tb[t] : 0;
      tables[t] = { from, to };
    }
    // Both copies at hand (the database changed): rows added, removed and changed by rowid.
    const [fa, fb] = copies(name);
    if (fa !== null && fb !== null) {
      try {
        for (const [t, r] of Object.entries(await rowDiff(fa, fb))) if (tables[t]) Object.assign(tables[t], r);
      } catch (e) {
        d.notes.push(`${name}: rows not compared (${(e as Error).message})`);
      }
    }
    sq.databases[name] = tables;
  }
  return sq;
}
