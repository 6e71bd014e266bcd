/**
 * The live read's stale-byte scan: what VACUUM INTO would drop from a database file, tested for
 * redaction candidates, in one pass over the pages that also feeds the cell scan of
 * ./worker-pages.ts (natively in ./worker-walk.ts where the addon is built).
 */
import { readSync } from "node:fs";
import { staleVerdict } from "./worker-candidate.js";
import { type Handle, maybeYield } from "./worker-handles.js";
import { type CellScan, type CellState, flushCells, newCellScan, pageCells } from "./worker-pages.js";
import type { LiveScanStats } from "./worker-types.js";
import { FULL, type PassHooks, scanChanged } from "./worker-changed.js";
import type { PageBase } from "./worker-types.js";
import { WALK, walkPages } from "./worker-walk.js";

// Scan the stale bytes of the database file (what VACUUM INTO would drop): free pages and
// pages past the database's end whole; in b-tree pages the unallocated space and the freed
// blocks; the unused tail of overflow pages. Each region is tested on its own (latin1 view of
// its bytes, as src/redact/stream.ts does) with the pre-filter and for a long token run.
export async function scanStale(
  h: Handle,
  st: LiveScanStats,
  size: number,
  pageCount: number,
  cellsIn: { state: CellState } | null = null,
  base: PageBase | null = null,
  hashesOut: PassHooks = {},
): Promise<string | null> {
  if (size === 0) return null; // an empty file is an empty database
  const fd = h.fd;
  const hdr = Buffer.alloc(100);
  readSync(fd, hdr, 0, 100, 0);
  let ps = hdr.readUInt16BE(16);
  if (ps === 1) ps = 65536;
  const usable = ps - hdr[20]!;
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
    readSync(fd, pg, 0, ps, (trunk - 1) * ps);
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
  let cells: CellScan | null =
    cellsIn === null ? null : Object.assign(cellsIn, newCellScan(h, st, ps, usable, pageCount, free));
  if (base && cells !== null) {
    // an incremental snapshot: only what changed since the last clean scan (./worker-changed.ts)
    const before = { ...st };
    const v = await scanChanged(h, st, size, ps, usable, pageCount, free, cells, base, hashesOut);
    if (v !== FULL) return v;
    for (const k of Object.keys(st) as Array<keyof LiveScanStats>) if (!(k in before)) delete st[k];
    Object.assign(st, before);
    cells = Object.assign(cellsIn!, newCellScan(h, st, ps, usable, pageCount, free));
  }
  const others: number[] = [];
  // (a usable size under 480 bytes is no valid database; the JS walk takes it as before)
  const native = WALK !== null && usable >= 480;
  st.walk = native ? "native" : "js";
  let verdict: string | null = native ? await walkPages(h, st, size, ps, usable, pageCount, free, cells, others) : null;
  const region = (b: Buffer, a: number, e: number, p: number): void => {
    if (verdict) return;
    verdict = staleVerdict(b, a, e, st);
    if (verdict) st.found = "stale page " + p;
  };
  const CH = 64 * ps;
  const buf = native ? null : Buffer.allocUnsafe(CH); // the JS walk's read buffer
  for (let off = 0; off < size && !verdict && !native; off += CH) {
    const got = readSync(fd, buf!, 0, Math.min(CH, size - off), off);
    for (let po = 0; po < got && !verdict; po += ps) {
      const p = (off + po) / ps + 1;
      const end = Math.min(po + ps, got);
      if (p > pageCount || end - po < ps || free[p]) {
        st.free_pages++;
        region(buf!, po, end, p);
        continue;
      }
      const b = buf!.subarray(po, end);
      const ho = p === 1 ? 100 : 0;
      const type = b[ho]!;
      if (type === 2 || type === 5 || type === 10 || type === 13) {
        const nCell = b.readUInt16BE(ho + 3);
        const cStart = b.readUInt16BE(ho + 5) || 65536;
        const ptrEnd = ho + (type === 2 || type === 5 ? 12 : 8) + 2 * nCell;
        let ok = ptrEnd <= cStart && cStart <= usable;
        const blocks: number[] = [];
        for (let fb = b.readUInt16BE(ho + 1), prev = 0, guard = 0; ok && fb; guard++) {
          if (fb <= prev || fb < cStart || fb + 4 > usable || guard > ps) {
            ok = false;
            break;
          }
          const sz = b.readUInt16BE(fb + 2);
          if (sz < 4 || fb + sz > usable) {
            ok = false;
            break;
          }
          blocks.push(fb + 4, fb + sz);
          prev = fb;
          fb = b.readUInt16BE(fb);
        }
        if (ok) {
          region(b, ptrEnd, cStart, p);
          for (let i = 0; i < blocks.length; i += 2) region(b, blocks[i]!, blocks[i + 1]!, p);
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
    if (verdict)
      cells.state = "unparsed"; // the walk stopped early: the cells were not all seen
    else flushCells(cells);
  }
  if (verdict || others.length === 0) return verdict;
  // Overflow pages: only the tail after the payload is stale (dbstat knows where it starts).
  const tail = new Map<number, number>();
  const overflow = h.db!.prepare<[], [number, number]>("SELECT pageno, unused FROM dbstat WHERE pagetype = 'overflow'");
  for (const [p, unused] of overflow.raw(true).iterate()) tail.set(p, unused);
  for (const p of others) {
    readSync(fd, pg, 0, ps, (p - 1) * ps);
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
