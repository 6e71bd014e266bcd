/**
 * The SQL scan of a database's cells (the slow, exact path of the live read's redaction scan;
 * ./worker-pages.ts is the fast one): every TEXT and BLOB cell through the pre-filter.
 */
import { candidate, candidateIn, collectScanned } from "./worker-candidate.js";
import { type Handle, maybeYield } from "./worker-handles.js";
import { type Db, qi, type TableListRow } from "./worker-sql.js";
import type { LiveScanStats } from "./worker-types.js";

// Every real table but the schema itself, with its columns: ordinary tables, sqlite_stat* and
// sqlite_sequence, and the shadow tables of virtual tables (an FTS table's own content lives in
// one: <name>_content).
export function scanTargets(db: Db): Array<{ name: string; wr: boolean; cols: string[] }> {
  return (db.pragma("table_list") as TableListRow[])
    .filter(
      (t) =>
        t.schema === "main" &&
        (t.type === "table" || t.type === "shadow") &&
        !/^sqlite_(temp_)?(schema|master)$/i.test(t.name),
    )
    .map((t) => ({
      name: t.name,
      wr: t.wr === 1,
      cols: (db.pragma("table_xinfo(" + qi(t.name) + ")") as Array<{ name: string; hidden: number }>)
        .filter((c) => c.hidden !== 1)
        .map((c) => c.name),
    }))
    .filter((t) => t.cols.length > 0);
}

const CHUNK_BYTES = 1 << 20;
const CHUNK_MAX = 2 << 20;
const ROW_MAX = 256 << 20;

// An upper bound of a table's payload (all its cells' bytes) and of one row's, from dbstat
// (which walks only that table's pages), or null when dbstat is not available.
function payloadBound(db: Db, name: string): { total: number; row: number } | null {
  try {
    const r = db
      .prepare<[string], [number | null, number | null]>(
        "SELECT sum(payload), max(mx_payload) FROM dbstat WHERE name = ? AND aggregate = 1",
      )
      .raw(true)
      .get(name);
    return r && r[0] !== null ? { total: r[0], row: Math.max(1, r[1] || 1) } : { total: 0, row: 1 };
  } catch (e) {
    if (e && (e as { code?: unknown }).code === "SQLITE_ERROR") return null; // no dbstat in this build
    throw e;
  }
}

/** A count of cells and their text joined by newlines (null: none). */
type Joined = [number, string | null];
type RowId = bigint | null;

/** At most this many candidate cells, of at most this many bytes together, are handed to the redactor. */
export const CANDIDATE_CELLS_MAX = 256;
export const CANDIDATE_BYTES_MAX = 16 << 20;

/**
 * The candidate cells of a scan that collects them (see {@link scanCells}): each value as read
 * (TEXT as a string, BLOB as bytes); `overflow` once they are past the limits (the scan stops there,
 * and the database goes to the copy path as it would without collecting).
 */
export interface CandidateCells {
  cells: Array<string | Uint8Array>;
  bytes: number;
  overflow: boolean;
}

// Scan every TEXT and BLOB cell with the pre-filter. A table's TEXT (and BLOBs, as text) is
// joined in SQL (group_concat with a newline between cells) and tested as one string, in one
// piece when the table's payload is small and otherwise in rowid ranges of at most CHUNK_MAX
// bytes (dbstat's largest row bounds a range's size). Every scanner is a regex without anchors or
// negative look-arounds, so a match inside one cell is also a match in the joined text: joining
// can only add matches, which sends the database to the copy path. A WITHOUT ROWID table too big
// to join whole is scanned row by row. With `collect`, every cell is tested on its own instead
// and the candidates are collected ({@link scanEachCell}).
export async function scanCells(h: Handle, st: LiveScanStats, collect: CandidateCells | null = null): Promise<void> {
  if (collect) return scanEachCell(h, st, collect);
  const db = h.db!;
  const hit = (s: string, name: string): boolean => {
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
    const text = t.cols.map(
      (c) =>
        "CASE typeof(" + qi(c) + ") WHEN 'text' THEN " + qi(c) + " WHEN 'blob' THEN CAST(" + qi(c) + " AS TEXT) END",
    );
    const rowText = text.length === 1 ? text[0] : "concat_ws(char(10), " + text.join(", ") + ")";
    const nText = t.cols.map((c) => "(typeof(" + qi(c) + ") IN ('text', 'blob'))").join(" + ");
    const lower = new Set(t.cols.map((c) => c.toLowerCase()));
    const rid = t.wr ? null : ["rowid", "_rowid_", "oid"].find((a) => !lower.has(a));
    const T = qi(t.name);
    const bound = payloadBound(db, t.name);
    if (bound && bound.row > ROW_MAX) throw new Error("a row of " + t.name + " is too large to scan in one piece");
    if (bound && bound.total <= CHUNK_MAX) {
      const whole = "SELECT total(" + nText + "), group_concat(" + rowText + ", char(10)) FROM " + T;
      const [n, joined] = db.prepare<[], Joined>(whole).raw(true).get()!;
      st.cells_scanned += n;
      if (joined && hit(joined, t.name)) return;
      await maybeYield(h);
      continue;
    }
    if (rid && bound) {
      const rowCount = db
        .prepare<[], number>("SELECT count(*) FROM " + T)
        .pluck()
        .get()!;
      const rows = Math.max(
        1,
        Math.min(Math.floor(CHUNK_MAX / bound.row), Math.ceil((rowCount * CHUNK_BYTES) / Math.max(1, bound.total))),
      );
      const next = db
        .prepare<[bigint, number], bigint>(
          "SELECT " + rid + " FROM " + T + " WHERE " + rid + " > ? ORDER BY " + rid + " LIMIT 1 OFFSET ?",
        )
        .pluck()
        .safeIntegers(true);
      const first = db
        .prepare<[number], bigint>("SELECT " + rid + " FROM " + T + " ORDER BY " + rid + " LIMIT 1 OFFSET ?")
        .pluck()
        .safeIntegers(true);
      const sel = "SELECT total(" + nText + "), group_concat(" + rowText + ", char(10)) FROM " + T + " WHERE ";
      const mid = db.prepare<[bigint, bigint], Joined>(sel + rid + " > ? AND " + rid + " <= ?").raw(true);
      const head = db.prepare<[bigint], Joined>(sel + rid + " <= ?").raw(true);
      const tail = db.prepare<[bigint], Joined>(sel + rid + " > ?").raw(true);
      let lo: RowId = null;
      for (;;) {
        let hi: RowId | undefined = lo === null ? first.get(rows - 1) : next.get(lo, rows - 1);
        if (hi === undefined) hi = null;
        const [n, joined] = (
          hi === null
            ? lo === null
              ? db
                  .prepare<[], Joined>(sel + "1")
                  .raw(true)
                  .get()
              : tail.get(lo)
            : lo === null
              ? head.get(hi)
              : mid.get(lo, hi)
        )!;
        st.cells_scanned += n;
        if (joined && hit(joined, t.name)) return;
        if (hi === null) break;
        lo = hi;
        await maybeYield(h);
      }
      continue;
    }
    // WITHOUT ROWID too big to join whole (or no dbstat): one string per row.
    const it = db
      .prepare<[], Joined>("SELECT " + nText + ", " + rowText + " FROM " + T)
      .raw(true)
      .iterate();
    try {
      let k = 0;
      for (const [n, s] of it) {
        st.cells_scanned += n;
        if (s && hit(s, t.name)) return;
        if (++k % 4096 === 0) await maybeYield(h);
      }
    } finally {
      it.return?.();
    }
  }
}

// The scan that collects (see {@link scanCells}): every TEXT and BLOB cell tested on its own, as
// the copy path tests it (../redact-copy.ts): TEXT by the pre-filter, a BLOB by the native
// pre-filter on its bytes and then by the pre-filter on the text they decode to. Each candidate
// cell is kept for the host's redactor to rule on; the scan goes on past it, until the limits
// (then `overflow`, and it stops).
async function scanEachCell(h: Handle, st: LiveScanStats, collect: CandidateCells): Promise<void> {
  const db = h.db!;
  for (const t of scanTargets(db)) {
    st.tables++;
    const bound = payloadBound(db, t.name);
    if (bound && bound.row > ROW_MAX) throw new Error("a row of " + t.name + " is too large to scan in one piece");
    const it = db
      .prepare<[], unknown[]>("SELECT " + t.cols.map(qi).join(", ") + " FROM " + qi(t.name))
      .raw(true)
      .iterate();
    try {
      let k = 0;
      for (const row of it) {
        for (const v of row) {
          let n: number;
          let hit: boolean;
          if (typeof v === "string") {
            n = Buffer.byteLength(v);
            collectScanned(v.length);
            hit = candidate(v);
          } else if (v instanceof Uint8Array) {
            n = v.byteLength;
            const b = Buffer.from(v.buffer, v.byteOffset, v.byteLength);
            hit = n > 0 && candidateIn(b, 0, n, "utf8Slice");
          } else continue;
          st.cells_scanned++;
          st.text_bytes += n;
          if (!hit) continue;
          st.candidates++;
          st.found = t.name;
          collect.bytes += n;
          collect.cells.push(typeof v === "string" ? v : new Uint8Array(v));
          if (collect.cells.length > CANDIDATE_CELLS_MAX || collect.bytes > CANDIDATE_BYTES_MAX) {
            collect.overflow = true;
            return;
          }
        }
        if (++k % 1024 === 0) await maybeYield(h);
      }
    } finally {
      it.return?.();
    }
  }
}
