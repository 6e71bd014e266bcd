/**
 * The live read's redaction scan in an incremental snapshot: only what changed since the last
 * one is scanned (issue 38: one row inserted into a 255 MiB database cost a 0.8 s scan of every
 * page).
 *
 * The last incremental snapshot read the database live, and its scan of every page found
 * nothing (or only candidates the redactor cleared), under the same redaction settings (the
 * incremental cache is keyed by them). Its table of page hashes (16 bytes of SHA-256 a page, the
 * one the `pages` chunking matches pages by) says which pages hold the same bytes now. The full
 * walk's verdict is a function of each page's bytes, read as what it is; so a page whose bytes
 * and role are those of the last snapshot adds nothing new, and the scan here covers the rest:
 * - every page that changed, walked as the full walk walks it (stale regions, and the cells of
 *   b-tree pages, each value whole, across its overflow chain);
 * - the whole overflow chain of every cell on a changed page: the unused tail of its last page
 *   is stale space, as dbstat gives it to the full walk, and every page of it is "covered";
 * - every free page and every page past the database's end, changed or not (raw, whole).
 * A page's role is its own bytes' for b-tree pages (an overflow or pointer-map page starts with
 * a zero byte while there are fewer than 2^24 pages), and free pages are always scanned; a page
 * that was free last time could be a b-tree page now with the same bytes, so the last scan must
 * have found no free page. An overflow page that changed is covered by a changed cell's chain
 * or the scan falls back to the full walk, as it does for anything else it cannot vouch for: a
 * changed page it cannot parse, a broken chain, more than a quarter of the pages changed, a
 * different page size. The candidates it collects, and its verdict, are the full walk's on those
 * pages; what it skips was cleared last time.
 *
 * The pass that finds the changed pages hashes every byte of the file anyway, under the read
 * transaction the file then streams in: the whole file's SHA-256 and the page table go to the
 * pack with the artifact (Artifact.pageHashes), which then reads only the pages it stores.
 *
 * With the native addon the pass is three jobs on the thread pool (the whole file's SHA-256, and
 * the page table in two halves), so this thread is free meanwhile: `during` (the caller's
 * quick_check and row counts, in the same read transaction) runs here while they hash. One row
 * into a 255 MiB database spent ~270 ms in this pass, then ~180 ms in the check after it.
 */
import { createHash } from "node:crypto";
import { readSync } from "node:fs";
import { workerData } from "node:worker_threads";
import { loadAead } from "../../codecs/aead.js";
import { staleVerdict } from "./worker-candidate.js";
import { type Handle, released } from "./worker-handles.js";
import { type CellScan, flushCells, pageCells } from "./worker-pages.js";
import type { LiveScanStats, PageBase, SqliteWorkerData } from "./worker-types.js";

/** The answer "walk every page instead". */
export const FULL = Symbol("full walk");

const AEAD = loadAead((workerData as SqliteWorkerData).aeadPath ?? null);
/** Bytes read (and hashed) at a time. */
const BLOCK = 1 << 20;

const zeroHashes = new Map<number, Buffer>();
function zeroHash(len: number): Buffer {
  let z = zeroHashes.get(len);
  if (!z) zeroHashes.set(len, (z = createHash("sha256").update(Buffer.alloc(len)).digest().subarray(0, 16)));
  return z;
}

/** The file's hashes as the changed-page pass read it: see {@link PageBase} and Artifact.pageHashes. */
export interface FileHashes {
  pageSize: number;
  table: Buffer;
  sha256: string;
}

/**
 * What the changed-page pass hands back (`hashes`), and what it runs on this thread while the
 * pool hashes (`during`: called once, when the pass starts reading; not at all when the scan
 * decides on the full walk before reading).
 */
export interface PassHooks {
  hashes?: FileHashes;
  during?: () => void;
}

/** Run `hooks.during` once (later calls do nothing). */
function runDuring(hooks: PassHooks): void {
  const f = hooks.during;
  hooks.during = undefined;
  f?.();
}

/**
 * The pages (numbers from 1) whose bytes differ from the table's, with the file's hashes, or
 * null past `limit` of them. The file is read in blocks and each page hashed, on the thread pool
 * when the native addon is there (two blocks in flight), else here; the whole file is hashed
 * here as the blocks arrive.
 */
async function changedPages(
  h: Handle,
  size: number,
  ps: number,
  table: Uint8Array,
  limit: number,
  hooks: PassHooks,
): Promise<{ changed: number[]; hashes: FileHashes } | null> {
  const basePages = Math.floor(table.length / 16);
  const per = Math.max(1, Math.floor(BLOCK / ps));
  const out: number[] = [];
  const tbl = Buffer.from(table.buffer, table.byteOffset, table.length);
  const mine = Buffer.alloc(16 * Math.ceil(size / ps));
  const whole = createHash("sha256");
  const compare = (p: number, hash: Buffer, at: number): void => {
    hash.copy(mine, 16 * (p - 1), at, at + 16);
    if (p > basePages || tbl.compare(hash, at, at + 16, 16 * (p - 1), 16 * p) !== 0) out.push(p);
  };
  const done = (): { changed: number[]; hashes: FileHashes } => ({
    changed: out,
    hashes: { pageSize: ps, table: mine, sha256: whole.digest("hex") },
  });
  const hashRange = AEAD?.hashRange;
  if (typeof hashRange === "function") {
    const run = (position: number, length: number, pageSize: number, into: Buffer): Promise<boolean> =>
      new Promise<boolean>((res, rej) =>
        hashRange(h.fd, position, length, pageSize, into, (errno, got) =>
          errno ? rej(Object.assign(new Error("read failed"), { errno })) : res(got === length),
        ),
      );
    const pages = Math.ceil(size / ps);
    const half = Math.min(size, Math.ceil(pages / 2) * ps);
    const digest = Buffer.alloc(32);
    const jobs = [
      run(0, size, 0, digest),
      run(0, half, ps, mine.subarray(0, 16 * Math.ceil(half / ps))),
      run(half, size - half, ps, mine.subarray(16 * Math.ceil(half / ps))),
    ];
    for (const j of jobs) j.catch(() => undefined); // awaited below
    let whole: PromiseSettledResult<boolean>[];
    try {
      runDuring(hooks);
    } finally {
      // a job in flight still reads the descriptor and writes `mine`: let every one finish first
      whole = await Promise.allSettled(jobs);
    }
    if (h.released) throw released();
    for (const r of whole) if (r.status === "rejected") throw r.reason;
    if (whole.some((r) => r.status === "fulfilled" && !r.value)) return null; // shorter than its size: the full walk meets it
    for (let p = 1; p <= pages; p++) {
      if (p > basePages || tbl.compare(mine, 16 * (p - 1), 16 * p, 16 * (p - 1), 16 * p) !== 0) out.push(p);
      if (out.length > limit) return null;
    }
    return { changed: out, hashes: { pageSize: ps, table: mine, sha256: digest.toString("hex") } };
  }
  runDuring(hooks);
  const readHash = AEAD?.readHash;
  if (typeof readHash !== "function") {
    const buf = Buffer.allocUnsafe(per * ps);
    for (let at = 0; at < size && out.length <= limit; at += per * ps) {
      const len = Math.min(per * ps, size - at);
      if (readSync(h.fd, buf, 0, len, at) !== len) return null;
      whole.update(buf.subarray(0, len));
      for (let k = 0; k * ps < len; k++) {
        const e = Math.min(len, (k + 1) * ps);
        compare(
          at / ps + k + 1,
          createHash("sha256")
            .update(buf.subarray(k * ps, e))
            .digest(),
          0,
        );
      }
      await new Promise((r) => setImmediate(r));
      if (h.released) throw released();
    }
    return out.length <= limit ? done() : null;
  }
  interface Slot {
    bytes: Buffer;
    lens: Uint32Array;
    zero: Uint8Array;
    digests: Buffer;
  }
  const slot = (): Slot => ({
    bytes: Buffer.allocUnsafe(per * ps),
    lens: new Uint32Array(per),
    zero: new Uint8Array(per),
    digests: Buffer.allocUnsafe(32 * per),
  });
  const slots = [slot(), slot(), slot(), slot()];
  const read = (at: number, s: Slot): Promise<number> => {
    const len = Math.min(per * ps, size - at);
    const count = Math.ceil(len / ps);
    for (let k = 0; k < count; k++) s.lens[k] = Math.min(ps, len - k * ps);
    return new Promise<number>((res, rej) =>
      readHash(h.fd, at, s.bytes, s.lens, count, s.digests, s.zero, (errno, got) =>
        errno ? rej(Object.assign(new Error("read failed"), { errno })) : res(got === len ? count : -1),
      ),
    );
  };
  const inflight: Array<{ at: number; s: Slot; p: Promise<number> }> = [];
  let next = 0;
  let seq = 0;
  const fill = (): void => {
    while (inflight.length < slots.length && next < size) {
      const s = slots[seq++ % slots.length]!;
      const p = read(next, s);
      p.catch(() => undefined); // awaited in order below
      inflight.push({ at: next, s, p });
      next += per * ps;
    }
  };
  try {
    fill();
    while (inflight.length) {
      const { at, s, p } = inflight[0]!;
      const count = await p;
      if (h.released) throw released();
      if (count < 0) return null; // shorter than its size: the full walk meets it
      whole.update(s.bytes.subarray(0, Math.min(per * ps, size - at)));
      for (let k = 0; k < count; k++) {
        const pn = at / ps + k + 1;
        if (s.zero[k]) compare(pn, zeroHash(s.lens[k]!), 0);
        else compare(pn, s.digests, 32 * k);
      }
      if (out.length > limit) return null;
      inflight.shift();
      fill();
    }
  } finally {
    // a read in flight still writes its slot and reads the descriptor: let it finish first
    await Promise.allSettled(inflight.map((x) => x.p));
  }
  return done();
}

// An SQLite varint at p (no further than end): [value, next], or null.
function varint(b: Buffer, p: number, end: number): [number, number] | null {
  let v = 0;
  for (let i = 0; i < 8; i++) {
    if (p >= end) return null;
    const x = b[p++]!;
    v = v * 128 + (x & 0x7f);
    if (x < 0x80) return [v, p];
  }
  if (p >= end) return null;
  return [v * 256 + b[p++]!, p];
}

/**
 * Scan what changed since the last snapshot (see the module comment): the verdict on the stale
 * bytes (cells into `cells`, as the full walk), or {@link FULL} when the full walk must decide.
 * Leaves `st` and `cells` to be reset by the caller on FULL.
 */
export async function scanChanged(
  h: Handle,
  st: LiveScanStats,
  size: number,
  ps: number,
  usable: number,
  pageCount: number,
  free: Uint8Array,
  cells: CellScan,
  base: PageBase,
  hashesOut: PassHooks,
): Promise<string | null | typeof FULL> {
  if (base.pageSize !== ps || pageCount >= 1 << 24 || usable < 480 || size < pageCount * ps) return FULL;
  const pass = await changedPages(h, size, ps, base.table, Math.floor(pageCount / 4), hashesOut);
  if (pass === null) return FULL;
  // (good for the pack whatever the walk below decides: the same bytes, in the same transaction)
  hashesOut.hashes = pass.hashes;
  const changed = pass.changed;
  const fd = h.fd;
  const filePages = Math.ceil(size / ps);
  // the pages to visit: the changed ones, every free page and every page past the database's end
  const visit = new Uint8Array(filePages + 1);
  for (const p of changed) visit[p] = 1;
  for (let p = 1; p <= filePages; p++) if (free[p] || p > pageCount) visit[p] = 1;
  st.walk = "changed";
  st.pages_changed = changed.length;
  let verdict: string | null = null;
  const region = (b: Buffer, a: number, e: number, p: number): void => {
    if (verdict) return;
    verdict = staleVerdict(b, a, e, st);
    if (verdict) st.found = "stale page " + p;
  };
  const pg = Buffer.allocUnsafe(ps);
  const ovp = Buffer.allocUnsafe(ps);
  const covered = new Set<number>();
  const others: number[] = [];
  const span = usable - 4;
  const maxLocalOf = (type: number): number =>
    type === 13 ? usable - 35 : Math.floor(((usable - 12) * 64) / 255) - 23;
  const minLocal = Math.floor(((usable - 12) * 32) / 255) - 23;

  // The whole overflow chain of each cell of b-tree page `b`: covered, the last page's unused tail
  // (and every page's reserved tail) scanned. False: something the full walk must decide.
  const chains = (b: Buffer, ho: number, type: number, nCell: number, cStart: number): boolean => {
    const ptrs = ho + (type === 2 ? 12 : 8);
    const maxLocal = maxLocalOf(type);
    for (let i = 0; i < nCell && !verdict; i++) {
      let c = b.readUInt16BE(ptrs + 2 * i);
      if (c < cStart || c >= usable) return false;
      if (type === 2) c += 4;
      const pv = varint(b, c, usable);
      if (!pv) return false;
      const P = pv[0];
      c = pv[1];
      if (type === 13) {
        const r = varint(b, c, usable);
        if (!r) return false;
        c = r[1];
      }
      if (P <= maxLocal) continue;
      const k = minLocal + ((P - minLocal) % span);
      const local = k <= maxLocal ? k : minLocal;
      if (c + local + 4 > usable) return false;
      const n = Math.ceil((P - local) / span);
      let pn = b.readUInt32BE(c + local);
      for (let j = 0; j < n; j++) {
        if (pn < 2 || pn > pageCount || free[pn] || covered.has(pn)) return false;
        covered.add(pn);
        if (readSync(fd, ovp, 0, ps, (pn - 1) * ps) !== ps) return false;
        if (j === n - 1) region(ovp, 4 + (P - local - (n - 1) * span), usable, pn);
        if (usable < ps) region(ovp, usable, ps, pn);
        pn = ovp.readUInt32BE(0);
      }
    }
    return true;
  };

  for (let p = 1; p <= filePages && !verdict; p++) {
    if (!visit[p]) continue;
    const len = Math.min(ps, size - (p - 1) * ps);
    if (readSync(fd, pg, 0, len, (p - 1) * ps) !== len) return FULL;
    if (p > pageCount || len < ps || free[p]) {
      st.free_pages++;
      region(pg, 0, len, p);
      continue;
    }
    const ho = p === 1 ? 100 : 0;
    const type = pg[ho]!;
    if (type !== 2 && type !== 5 && type !== 10 && type !== 13) {
      others.push(p); // an overflow page (or a pointer map): a changed cell's chain must cover it
      continue;
    }
    const nCell = pg.readUInt16BE(ho + 3);
    const cStart = pg.readUInt16BE(ho + 5) || 65536;
    const ptrEnd = ho + (type === 2 || type === 5 ? 12 : 8) + 2 * nCell;
    if (!(ptrEnd <= cStart && cStart <= usable)) return FULL;
    const blocks: number[] = [];
    for (let fb = pg.readUInt16BE(ho + 1), prev = 0, guard = 0; fb; guard++) {
      if (fb <= prev || fb < cStart || fb + 4 > usable || guard > ps) return FULL;
      const sz = pg.readUInt16BE(fb + 2);
      if (sz < 4 || fb + sz > usable) return FULL;
      blocks.push(fb + 4, fb + sz);
      prev = fb;
      fb = pg.readUInt16BE(fb);
    }
    region(pg, ptrEnd, cStart, p);
    for (let i = 0; i < blocks.length; i += 2) region(pg, blocks[i]!, blocks[i + 1]!, p);
    if (usable < ps) region(pg, usable, ps, p);
    if (verdict) break;
    if (type === 5) continue;
    if (cells.state === "scan") {
      pageCells(cells, pg, ho, type, nCell, cStart);
      if ((cells.state as CellScan["state"]) === "unparsed") return FULL;
    }
    if (!chains(pg, ho, type, nCell, cStart)) return FULL;
  }
  if (verdict) {
    if (cells.state === "scan") cells.state = "unparsed"; // the walk stopped early: the cells were not all seen
    return verdict;
  }
  for (const p of others) if (!covered.has(p)) return FULL;
  if (cells.state === "scan") flushCells(cells);
  return null;
}
