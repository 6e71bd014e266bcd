/**
 * The live read's page walk in native code (native/prefilter/sqlite_walk.c): the JS walk of
 * ./worker-stale.ts and ./worker-pages.ts, step for step, where the addon is built.
 */
import { readSync } from "node:fs";
import { constants as osConstants } from "node:os";
import { workerData } from "node:worker_threads";
import { candidate, collectScanned, NATIVE, type Sliceable } from "./worker-candidate.js";
import { type Handle, maybeYield } from "./worker-handles.js";
import { BATCH_VALS_MAX, type CellScan, type CellState, pendedValue, TEXT_BATCH } from "./worker-pages.js";
import type { LiveScanStats, SqliteWorkerData } from "./worker-types.js";

/**
 * One step of the walk over `got` bytes of `buf` (pages from `firstPage`), resuming at page
 * offset `po` and region `ri`: 0 when the buffer is done, 1 for a stale region to test, 2 for
 * cell text to test (in `pend`), 3 for a failed read (errno in `S`). See sqlite_walk.c.
 */
type SqliteWalk = (
  buf: Buffer,
  got: number,
  firstPage: number,
  po: number,
  ri: number,
  S: Float64Array,
  free: Uint8Array,
  batch: Buffer,
  ob: Buffer,
  fd: number,
  pend: Buffer[],
  others: number[],
  vals: Uint32Array,
) => number;

// The page walk in native code (native/prefilter/sqlite_walk.c), when the addon is built: the
// JS walk (./worker-stale.ts), step for step (the same regions, values, counts and answers),
// without the JS cost (~0.15 CPU-s per bench snapshot to run and ~0.2 CPU-s of JIT compiling,
// per isolate).
// It decides only "no": a stale region it does not clear comes back here for the finders (then
// the walk resumes at the next region), and so does each cell value it does not clear (with
// its kind, TEXT or BLOB), at the end of its page.
// workerData.walk === "js" keeps the JS walk (tests compare the two). An addon built before
// its version 2 (BLOB values, JSON escapes) would clear what this walk does not, and one
// before version 3 hands over batches, not values: not used.
export const WALK: SqliteWalk | null =
  NATIVE !== null &&
  typeof NATIVE.sqliteWalk === "function" &&
  (NATIVE.sqliteWalkVersion ?? 0) >= 3 &&
  (workerData as SqliteWorkerData).walk !== "js"
    ? (NATIVE.sqliteWalk as SqliteWalk)
    : null;
// Indices into the state array the walk shares with JS (S_* in sqlite_walk.c).
const W_PS = 0,
  W_USABLE = 1,
  W_PAGE_COUNT = 2,
  W_CELLS = 3,
  W_BATCH_N = 4,
  W_STALE_BYTES = 5,
  W_FREE_PAGES = 6,
  W_TEXT_BYTES = 7,
  W_CELLS_SCANNED = 8,
  W_PEND_BYTES = 9,
  W_AT_PO = 10,
  W_AT_REGION = 11,
  W_REGION_A = 12,
  W_REGION_E = 13,
  W_REGION_TOKEN = 14,
  W_REGION_MAYBE = 15,
  W_AT_PAGE = 16,
  W_ERRNO = 17,
  W_BATCH_VALS = 18,
  W_LEN = 19;
const CELL_STATES: readonly CellState[] = ["scan", "hit", "unparsed"];

// Walk every page with WALK; the verdict on the stale bytes, or null. Fills others (pages it
// cannot read as b-tree pages) and cells (its state and batch) as the JS walk does.
export async function walkPages(
  h: Handle,
  st: LiveScanStats,
  size: number,
  ps: number,
  usable: number,
  pageCount: number,
  free: Uint8Array,
  cells: CellScan | null,
  others: number[],
): Promise<string | null> {
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
  const vals = cells !== null ? cells.vals : new Uint32Array(2 * BATCH_VALS_MAX);
  if (cells !== null) {
    S[W_BATCH_N] = cells.n;
    S[W_BATCH_VALS] = cells.nv;
  }
  const pend: Buffer[] = [];
  const CH = 64 * ps;
  const buf = Buffer.allocUnsafe(CH);
  let verdict: string | null = null;
  try {
    for (let off = 0; off < size && !verdict; off += CH) {
      const got = readSync(h.fd, buf, 0, Math.min(CH, size - off), off);
      let po = 0;
      let ri = 0;
      for (;;) {
        const k = WALK!(buf, got, off / ps + 1, po, ri, S, free, batch, ob, h.fd, pend, others, vals);
        if (k === 0) break;
        if (k === 1) {
          // a stale region the walk did not clear: the finders on its latin1 view, then the token run it found
          const a = S[W_REGION_A]!,
            e = S[W_REGION_E]!;
          if (S[W_REGION_MAYBE] === 1) {
            const s = (buf as Sliceable).latin1Slice(a, e);
            collectScanned(s.length);
            if (candidate(s)) verdict = "stale_candidate";
          }
          if (!verdict && S[W_REGION_TOKEN] === 1) verdict = "stale_token";
          if (verdict) {
            st.found = "stale page " + S[W_AT_PAGE];
            break;
          }
          po = S[W_AT_PO]!;
          ri = S[W_AT_REGION]! + 1;
        } else if (k === 2) {
          // cell values the walk did not clear (counted already): the finders on their UTF-8
          // text, and the candidates collected
          if (cells !== null) {
            cells.state = CELL_STATES[S[W_CELLS]!]!;
            for (const t of pend) pendedValue(cells, t);
            S[W_CELLS] = CELL_STATES.indexOf(cells.state);
          }
          pend.length = 0;
          S[W_PEND_BYTES] = 0;
          po = S[W_AT_PO]!;
          ri = 0;
        } else {
          const errno = osConstants.errno as Record<string, number>;
          const name = Object.keys(errno).find((n) => errno[n] === S[W_ERRNO]) || "EIO";
          throw Object.assign(new Error(name + ": read of an overflow page failed"), { code: name });
        }
      }
      await maybeYield(h);
    }
  } finally {
    st.stale_bytes = S[W_STALE_BYTES]!;
    st.free_pages = S[W_FREE_PAGES]!;
    st.text_bytes = S[W_TEXT_BYTES]!;
    st.cells_scanned = S[W_CELLS_SCANNED]!;
    if (cells !== null) {
      cells.state = CELL_STATES[S[W_CELLS]!]!;
      cells.n = S[W_BATCH_N]!;
      cells.nv = S[W_BATCH_VALS]!;
    }
  }
  return verdict;
}
