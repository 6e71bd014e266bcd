/**
 * The TEXT and BLOB values of every cell, read from the pages (the fast path of the live read's
 * cell scan; ./worker-cells.ts is the exact one).
 *
 * While the stale-byte scan (./worker-stale.ts) walks the file, every b-tree page that holds
 * records (table leaves, index leaves and interior index pages: WITHOUT ROWID tables and indexes
 * live in index b-trees) is parsed: each cell's record header gives the byte ranges of its TEXT
 * values (serial type odd and >= 13) and BLOB values (even and >= 12: a secret in a BLOB reaches
 * the bundle as surely as one in TEXT; the copy path then redacts or reports it), local or
 * continued on overflow pages (the chain is followed with preads). The values are joined with a
 * newline in batches of under 64 KiB (young strings for V8; 1 MiB batches cost 0.4 CPU-s more per
 * bench snapshot in GC), decoded as UTF-8 (as SQL returns them) and tested with the pre-filter:
 * the same test scanCells makes on group_concat, on a superset of its cells (sqlite_schema and
 * index keys are scanned too), at memory speed instead of SQL speed. A batch the pre-filter
 * does not clear is tested again value by value, as the SQL scan that collects tests each cell
 * (TEXT as its text, a BLOB as the text its bytes decode to), and each value that is a candidate
 * is collected for the host's redactor to rule on (up to the same limits: past them, and for a
 * page or record this parser does not understand, the database goes to scanCells, which decides
 * exactly). Before, one candidate anywhere (random bytes of an embedding read as "key=") sent the
 * whole database to that SQL scan: 0.74 of 0.96 s on the incremental bench's 255 MiB database.
 */
import { readSync } from "node:fs";
import { CANDIDATE_BYTES_MAX, CANDIDATE_CELLS_MAX, type CandidateCells } from "./worker-cells.js";
import { candidate, candidateIn, collectScanned, type Sliceable } from "./worker-candidate.js";
import type { Handle } from "./worker-handles.js";
import type { LiveScanStats } from "./worker-types.js";

export type CellState = "scan" | "hit" | "unparsed";

/** The cell scan of one walk: its state, and the batch of values waiting to be tested. */
export interface CellScan {
  state: CellState;
  h: Handle;
  st: LiveScanStats;
  ps: number;
  usable: number;
  pageCount: number;
  /** free[p] = 1: page p is on the freelist. */
  free: Uint8Array;
  batch: Buffer;
  /** Bytes in the batch. */
  n: number;
  /** The batch's values: [start, len << 1 | blob] each. */
  vals: Uint32Array;
  /** Values in the batch. */
  nv: number;
  /** The candidate values found so far. */
  collect: CandidateCells;
  /** The overflow page in hand. */
  ob: Buffer;
}

/** A record's overflow chain, read forward only. */
interface Overflow {
  next: number;
  start: number;
  page: number;
  count: number;
}

const SERIAL_FIXED = [0, 1, 2, 3, 4, 6, 8, 8, 0, 0];
export const TEXT_BATCH = 1 << 16;
/** The most values one batch holds (each of at least one byte, after a separator but the first). */
export const BATCH_VALS_MAX = TEXT_BATCH / 2 + 1;
const TEXT_VALUE_MAX = 32 << 20;
let vpos = 0;
// An SQLite varint at p (no further than end), or -1; vpos is set past it.
export function varint(b: Buffer, p: number, end: number): number {
  let v = 0;
  for (let i = 0; i < 8; i++) {
    if (p >= end) return -1;
    const x = b[p++]!;
    v = v * 128 + (x & 0x7f);
    if (x < 0x80) {
      vpos = p;
      return v;
    }
  }
  if (p >= end) return -1;
  v = v * 256 + b[p++]!;
  vpos = p;
  return v;
}

export function newCellScan(
  h: Handle,
  st: LiveScanStats,
  ps: number,
  usable: number,
  pageCount: number,
  free: Uint8Array,
): CellScan {
  return {
    state: "scan",
    h,
    st,
    ps,
    usable,
    pageCount,
    free,
    batch: Buffer.allocUnsafe(TEXT_BATCH),
    n: 0,
    vals: new Uint32Array(2 * BATCH_VALS_MAX),
    nv: 0,
    collect: { cells: [], bytes: 0, overflow: false },
    ob: Buffer.allocUnsafe(ps), // the overflow page in hand
  };
}

// The batch at once, and only when it is not cleared each of its values.
export function flushCells(cs: CellScan): void {
  if (cs.n === 0) return;
  cs.st.text_bytes += cs.n;
  if (cs.state === "scan" && candidateIn(cs.batch, 0, cs.n, "utf8Slice")) {
    for (let i = 0; i < cs.nv && cs.state === "scan"; i++) {
      const a = cs.vals[2 * i]!;
      const x = cs.vals[2 * i + 1]!;
      testValue(cs, cs.batch, a, a + (x >>> 1), (x & 1) === 1);
    }
  }
  cs.n = 0;
  cs.nv = 0;
}

// Test one value, the UTF-8 text in b[a, e) (not counted here), and collect it if it is a candidate.
function testValue(cs: CellScan, b: Buffer, a: number, e: number, blob: boolean): void {
  if (candidateIn(b, a, e, "utf8Slice"))
    collectCandidate(cs, blob ? new Uint8Array(b.subarray(a, e)) : (b as Sliceable).utf8Slice(a, e));
}

/**
 * A value the pre-filter did not clear (`v`: TEXT as its text, a BLOB as its bytes) as the native
 * walk hands it over, after its kind byte: collected if it is a candidate.
 */
export function pendedValue(cs: { state: CellState; st: LiveScanStats; collect: CandidateCells }, t: Buffer): void {
  if (cs.state !== "scan") return;
  const s = (t as Sliceable).utf8Slice(1, t.length);
  collectScanned(s.length);
  if (candidate(s)) collectCandidate(cs, t[0] === 1 ? new Uint8Array(t.subarray(1)) : s);
}

// Collect a candidate value; past the limits the SQL scan decides (and the database is copied).
function collectCandidate(
  cs: { state: CellState; st: LiveScanStats; collect: CandidateCells },
  v: string | Uint8Array,
): void {
  const c = cs.collect;
  cs.st.candidates++;
  c.cells.push(v);
  c.bytes += typeof v === "string" ? Buffer.byteLength(v) : v.byteLength;
  if (c.cells.length > CANDIDATE_CELLS_MAX || c.bytes > CANDIDATE_BYTES_MAX) {
    c.overflow = true;
    cs.state = "hit";
  }
}

// Test the UTF-8 text in b[a, e): a value of its own.
function testText(cs: CellScan, b: Buffer, a: number, e: number, blob: boolean): void {
  cs.st.text_bytes += e - a;
  if (cs.state === "scan") testValue(cs, b, a, e, blob);
}

// Note a value appended to the batch at [a, a + len).
function batchValue(cs: CellScan, a: number, len: number, blob: boolean): void {
  cs.vals[2 * cs.nv] = a;
  cs.vals[2 * cs.nv + 1] = (len << 1) | (blob ? 1 : 0);
  cs.nv++;
}

// Reserve room for a value of len bytes (plus its separator) in the batch; null when the value
// gets a buffer of its own.
function room(cs: CellScan, len: number): Buffer | null {
  if (cs.n + len + 1 > TEXT_BATCH) flushCells(cs);
  if (len + 1 > TEXT_BATCH) return null;
  if (cs.n > 0) cs.batch[cs.n++] = 10;
  return cs.batch;
}

export function pageCells(cs: CellScan, b: Buffer, ho: number, type: number, nCell: number, cStart: number): void {
  const usable = cs.usable;
  const ptrs = ho + (type === 2 ? 12 : 8);
  const maxLocal = type === 13 ? usable - 35 : Math.floor(((usable - 12) * 64) / 255) - 23;
  const minLocal = Math.floor(((usable - 12) * 32) / 255) - 23;
  for (let i = 0; i < nCell && cs.state === "scan"; i++) {
    let c = b.readUInt16BE(ptrs + 2 * i);
    if (c < cStart || c >= usable) {
      cs.state = "unparsed";
      return;
    }
    if (type === 2) c += 4; // the left child's page number
    const P = varint(b, c, usable);
    if (P < 0) {
      cs.state = "unparsed";
      return;
    }
    c = vpos;
    if (type === 13) {
      if (varint(b, c, usable) < 0) {
        cs.state = "unparsed";
        return;
      }
      c = vpos; // past the rowid
    }
    let local = P;
    if (P > maxLocal) {
      const k = minLocal + ((P - minLocal) % (usable - 4));
      local = k <= maxLocal ? k : minLocal;
    }
    if (c + local + (local < P ? 4 : 0) > usable) {
      cs.state = "unparsed";
      return;
    }
    record(cs, b, c, local, P, local < P ? b.readUInt32BE(c + local) : 0);
  }
}

// The TEXT values of one record: payload bytes [0, local) at b[c...], the rest on overflow pages from ovfl.
function record(cs: CellScan, b: Buffer, c: number, local: number, P: number, ovfl: number): void {
  const hs = varint(b, c, c + local);
  if (hs < 1 || hs > local || hs > P) {
    cs.state = "unparsed";
    return;
  }
  let p = vpos;
  let off = hs;
  const ov = { next: ovfl, start: local, page: 0, count: 0 }; // the chain, read forward only
  const he = c + hs;
  while (p < he) {
    let t = b[p]!;
    if (t < 0x80) p++;
    else {
      t = varint(b, p, he);
      p = vpos;
    }
    if (t < 0 || t === 10 || t === 11) {
      cs.state = "unparsed";
      return;
    }
    const len = t < 12 ? SERIAL_FIXED[t]! : Math.floor((t - 12) / 2);
    if (off + len > P) {
      cs.state = "unparsed";
      return;
    }
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
          if (len <= 64) for (let k = 0; k < len; k++) dst[n + k] = b[a + k]!;
          else b.copy(dst, n, a, a + len);
          cs.n = n + len;
          batchValue(cs, n, len, (t & 1) === 0);
        } else if (!text(cs, b, c, local, ov, off, len, (t & 1) === 0)) return;
      }
    }
    off += len;
  }
  if (off !== P) cs.state = "unparsed";
}

// Copy payload bytes [off, off + len) into the batch (or a buffer of their own) and, in the
// latter case, test them at once. False when the scan stops (unparsed).
function text(
  cs: CellScan,
  b: Buffer,
  c: number,
  local: number,
  ov: Overflow,
  off: number,
  len: number,
  blob: boolean,
): boolean {
  if (len > TEXT_VALUE_MAX) {
    cs.state = "unparsed";
    return false;
  }
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
      if (pn < 2 || pn > cs.pageCount || cs.free[pn] || ++ov.count > cs.pageCount) {
        cs.state = "unparsed";
        return false;
      }
      if (readSync(cs.h.fd, cs.ob, 0, cs.ps, (pn - 1) * cs.ps) !== cs.ps) {
        cs.state = "unparsed";
        return false;
      }
      ov.page = pn;
      ov.next = cs.ob.readUInt32BE(0);
    }
    const e = Math.min(end, ov.start + span);
    cs.ob.copy(dst, at, 4 + need - ov.start, 4 + e - ov.start);
    at += e - need;
    need = e;
  }
  if (dst === cs.batch) {
    cs.n = at;
    batchValue(cs, at0, at - at0, blob);
  } else testText(cs, dst, at0, at, blob);
  return cs.state === "scan";
}
