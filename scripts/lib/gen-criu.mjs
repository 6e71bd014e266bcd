/**
 * gen-criu.mjs — synthetic CRIU images directories (Node built-ins only).
 *
 * CRIU cannot dump on every kernel (criu 3.17 fails on kernel ≥ 6.13 vDSO), so memsnap's
 * tests and benchmark use dumps made here: the same file names, magics, framing and the
 * protobuf fields memsnap decodes (PstreeEntry.pid, PagemapHead.pages_id, PagemapEntry
 * vaddr/nr_pages/in_parent/flags), and page data of the size the pagemaps declare. The other
 * images (core, mm, ids, fs, fdinfo, files, stats) are well framed but their messages are
 * only plausible, not restorable: no real criu could restore these.
 *
 *   import { genCriuDump } from "./lib/gen-criu.mjs";
 *   genCriuDump("/tmp/dump", { pids: [100, 101], pagesPerProcess: 256, seed: 1 });
 */
import fs from "node:fs";
import path from "node:path";

export const PAGE_SIZE = 4096;

export const MAGIC = Object.freeze({
  COMMON: 0x54564319,
  SERVICE: 0x55105940,
  INVENTORY: 0x58313116,
  PSTREE: 0x50273030,
  CORE: 0x55053847,
  MM: 0x57492820,
  PAGEMAP: 0x56084025,
  FDINFO: 0x56213732,
  IDS: 0x54432030,
  FILES: 0x56303138,
  FS: 0x51403912,
  STATS: 0x57093306,
});

export const PE_PARENT = 1;
export const PE_LAZY = 2;
export const PE_PRESENT = 4;

/** Protobuf varint of a non-negative integer (number or bigint). */
export function varint(n) {
  let v = BigInt(n);
  if (v < 0n) throw new RangeError("varint of a negative number");
  const out = [];
  do {
    let b = Number(v & 0x7fn);
    v >>= 7n;
    if (v > 0n) b |= 0x80;
    out.push(b);
  } while (v > 0n);
  return Buffer.from(out);
}

/** A varint field. */
export function fVarint(no, v) {
  return Buffer.concat([varint((no << 3) | 0), varint(v)]);
}

/** A length-delimited field (bytes, string or nested message). */
export function fBytes(no, v) {
  const b = typeof v === "string" ? Buffer.from(v, "utf8") : v;
  return Buffer.concat([varint((no << 3) | 2), varint(b.length), b]);
}

/** One frame: u32 little-endian length + message. */
export function frame(msg) {
  const h = Buffer.alloc(4);
  h.writeUInt32LE(msg.length, 0);
  return Buffer.concat([h, msg]);
}

function u32(...ns) {
  const b = Buffer.alloc(4 * ns.length);
  ns.forEach((n, i) => b.writeUInt32LE(n >>> 0, 4 * i));
  return b;
}

/** A framed image: common (or service) magic, type magic, frames. */
export function imageBytes(typeMagic, msgs, { service = false } = {}) {
  return Buffer.concat([u32(service ? MAGIC.SERVICE : MAGIC.COMMON, typeMagic), ...msgs.map(frame)]);
}

/** inventory.img: its own magic only, then frames. */
export function inventoryBytes(msgs) {
  return Buffer.concat([u32(MAGIC.INVENTORY), ...msgs.map(frame)]);
}

export function pstreeEntry({ pid, ppid = 0, pgid = pid, sid = pid, threads = [pid] }) {
  return Buffer.concat([fVarint(1, pid), fVarint(2, ppid), fVarint(3, pgid), fVarint(4, sid), ...threads.map((t) => fVarint(5, t))]);
}

export function pagemapHead(pagesId) {
  return fVarint(1, pagesId);
}

export function pagemapEntry({ vaddr, nrPages, inParent, flags }) {
  const parts = [fVarint(1, vaddr), fVarint(2, nrPages)];
  if (inParent !== undefined) parts.push(fVarint(3, inParent ? 1 : 0));
  if (flags !== undefined) parts.push(fVarint(4, flags));
  return Buffer.concat(parts);
}

/** Deterministic xorshift32 PRNG. */
function rng(seed) {
  let x = (seed >>> 0) || 0x9e3779b9;
  return () => {
    x ^= x << 13;
    x >>>= 0;
    x ^= x >>> 17;
    x ^= x << 5;
    x >>>= 0;
    return x;
  };
}

const TEXTISH = Buffer.from("the agent remembered that the user prefers short answers; tool call ok; ");

function fillPage(buf, off, rand, random) {
  if (random) {
    for (let i = 0; i < PAGE_SIZE; i += 4) buf.writeUInt32LE(rand(), off + i);
  } else {
    const start = rand() % TEXTISH.length;
    for (let i = 0; i < PAGE_SIZE; i++) buf[off + i] = TEXTISH[(start + i) % TEXTISH.length];
  }
}

/**
 * Write a synthetic images directory at `dir` (created; must not hold a dump already).
 *
 * options:
 *   pids            process ids in the tree (default [1000]); the first is the root
 *   pagesPerProcess pages dumped per process (default 16)
 *   parentPages     extra pages per process marked as in the parent (PE_PARENT; default 0)
 *   parent          when set, a `parent` symlink with this target (an incremental dump)
 *   randomRatio     share of pages with random (incompressible) bytes, 0..1 (default 0.5)
 *   seed            PRNG seed (default 1)
 *   legacyFlags     write in_parent instead of flags in pagemap entries (older CRIU)
 *
 * Returns { dir, pids, files (sorted names), bytes (all files), pagesBytes }.
 */
export function genCriuDump(dir, options = {}) {
  const pids = options.pids ?? [1000];
  const pagesPer = options.pagesPerProcess ?? 16;
  const parentPages = options.parentPages ?? 0;
  const randomRatio = options.randomRatio ?? 0.5;
  const rand = rng(options.seed ?? 1);
  fs.mkdirSync(dir, { recursive: true });
  const files = [];
  let bytes = 0;
  let pagesBytes = 0;
  const put = (name, data) => {
    fs.writeFileSync(path.join(dir, name), data);
    files.push(name);
    bytes += data.length;
  };
  put("inventory.img", inventoryBytes([Buffer.concat([fVarint(1, 2), fVarint(2, 1), fVarint(3, pids[0] ?? 1)])]));
  put("pstree.img", imageBytes(MAGIC.PSTREE, pids.map((pid, i) => pstreeEntry({ pid, ppid: i === 0 ? 0 : pids[0], pgid: pids[0], sid: pids[0] }))));
  put("files.img", imageBytes(MAGIC.FILES, [0, 1, 2].map((fd) => Buffer.concat([fVarint(1, fd + 1), fVarint(2, 1), fBytes(3, `/dev/pts/${fd}`)]))));
  put("fdinfo-2.img", imageBytes(MAGIC.FDINFO, [0, 1, 2].map((fd) => Buffer.concat([fVarint(1, fd + 1), fVarint(2, 0), fVarint(3, 1), fVarint(4, fd)]))));
  pids.forEach((pid, idx) => {
    put(`core-${pid}.img`, imageBytes(MAGIC.CORE, [Buffer.concat([fVarint(1, 1), fBytes(2, Buffer.concat([fVarint(1, 0x50), fBytes(2, `agent-${pid}`)]))])]));
    put(`mm-${pid}.img`, imageBytes(MAGIC.MM, [Buffer.concat([fVarint(1, 0x400000), fVarint(2, 0x401000), fVarint(3, 0x600000), fVarint(4, 0x601000)])]));
    put(`ids-${pid}.img`, imageBytes(MAGIC.IDS, [Buffer.concat([fVarint(1, 1), fVarint(2, 2), fVarint(3, 3)])]));
    put(`fs-${pid}.img`, imageBytes(MAGIC.FS, [Buffer.concat([fVarint(1, 4), fVarint(2, 5), fVarint(3, 0o22)])]));
    const pagesId = idx + 1;
    const entries = [pagemapHead(pagesId)];
    let vaddr = 0x7f0000000000n + BigInt(idx) * 0x100000000n;
    const entry = (nrPages, fl) => {
      entries.push(options.legacyFlags
        ? pagemapEntry({ vaddr, nrPages, inParent: (fl & PE_PARENT) !== 0 })
        : pagemapEntry({ vaddr, nrPages, flags: fl }));
      vaddr += BigInt(nrPages * PAGE_SIZE) + 0x10000n;
    };
    let left = pagesPer;
    while (left > 0) {
      const n = Math.min(left, 64);
      entry(n, PE_PRESENT);
      left -= n;
    }
    if (parentPages > 0) entry(parentPages, PE_PARENT);
    put(`pagemap-${pid}.img`, imageBytes(MAGIC.PAGEMAP, entries));
    // Page data, streamed in 1 MiB chunks so large dumps need little memory.
    const name = `pages-${pagesId}.img`;
    const fd = fs.openSync(path.join(dir, name), "w");
    try {
      const CHUNK = 256;
      const buf = Buffer.alloc(CHUNK * PAGE_SIZE);
      for (let p = 0; p < pagesPer; p += CHUNK) {
        const n = Math.min(CHUNK, pagesPer - p);
        for (let i = 0; i < n; i++) fillPage(buf, i * PAGE_SIZE, rand, (rand() % 1000) / 1000 < randomRatio);
        fs.writeSync(fd, buf, 0, n * PAGE_SIZE);
      }
    } finally {
      fs.closeSync(fd);
    }
    files.push(name);
    bytes += pagesPer * PAGE_SIZE;
    pagesBytes += pagesPer * PAGE_SIZE;
  });
  put("stats-dump", imageBytes(MAGIC.STATS, [Buffer.concat([fBytes(1, Buffer.concat([fVarint(1, 1000), fVarint(2, 2000)]))])], { service: true }));
  if (options.parent !== undefined) fs.symlinkSync(options.parent, path.join(dir, "parent"));
  files.sort();
  return { dir, pids, files, bytes, pagesBytes };
}
