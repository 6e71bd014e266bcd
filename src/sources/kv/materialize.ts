/** Restore of a kv layer: the dump's files rebuilt, byte for byte, from the staged artifacts. */
import { randomBytes } from "node:crypto";
import { closeSync, createReadStream, ftruncateSync, openSync, writeSync } from "node:fs";
import { chmod, lstat, mkdir, readdir, rename, rm, stat, utimes } from "node:fs/promises";
import { dirname, join } from "node:path";
import type { LayerEntry } from "../../format/manifest.js";
import { MemsnapError } from "../../errors.js";
import { readSpoolMap } from "../spool.js";
import { collectNow } from "../../util/gc.js";
import { currentUmask, restoredMode } from "../../util/umask.js";
import { SPOOL_MAP, isSpoolName, type VerifiedLookup } from "../types.js";
import { KV_INDEX, KV_WORK_PREFIX } from "./format.js";
import { KvIndexUnsafe, readKvIndex, type KvIndexFile } from "./index-format.js";
import { KvContents, PageReader } from "./page-reader.js";
import { SpoolReader, restoreBad } from "./spool-reader.js";
import { sha256File } from "../../util/fs-atomic.js";

/** Restore: tiles are gathered into one buffer of this size and written with one call. */
const WRITE_BATCH = 4 * 1024 * 1024;

/** Layers already materialized in this process (restore may call materialize twice). */
const materialized = new WeakMap<LayerEntry, Set<string>>();

const UNSAFE_HINT = "the bundle's KV layer asks for what no KV dump has: do not restore it";

function writeFully(fd: number, buf: Buffer, len: number, pos: number): void {
  let off = 0;
  while (off < len) off += writeSync(fd, buf, off, len - off, pos + off);
}

/** What one rebuild works with, shared by the files it rebuilds. */
interface Rebuild {
  dir: string;
  /** The work directory the bundle-side artifacts were moved into. */
  src: string;
  layer: string;
  contents: KvContents;
  pages: PageReader;
  spool: SpoolReader | null;
  /**
   * Placed pages by part file: offset → slot, and how many were placed there (two at one
   * offset leave one in the map: the count tells them apart).
   */
  placed: Map<number, Map<number, number>>;
  placedCount: Map<number, number>;
  umask: number;
  batch: Buffer;
}

/**
 * Rebuild the dump files of a KV layer in `dir` from its staged artifacts: kv-index.json, the
 * pages (in the spool, or already in place in the spool part of their data file) and the
 * verbatim files. A data file that received placed pages is its spool part, renamed; the
 * other tiles are written into it: copies of pages placed elsewhere, spooled pages. Zero tiles
 * are left as holes (the file is sized first), which read as zeros: the bytes are the dump's,
 * byte for byte. A placed page must sit exactly on a tile that the index gives that page, and
 * no two may overlap; anything else is refused, so a hole is never anything but zeros.
 * Memory: the index is read as it streams; per distinct page a few numbers and its digest
 * are kept (the spool's names while the index is read), never the index's text or labels.
 */
export async function materializeKv(dir: string, layer: LayerEntry, verified?: VerifiedLookup): Promise<void> {
  const done = materialized.get(layer) ?? new Set<string>();
  if (done.has(dir)) return;
  const declared = await checkIndex(dir, layer);
  // Move the bundle-side artifacts aside, then rebuild the original files in `dir`.
  const src = join(dir, `${KV_WORK_PREFIX}${randomBytes(4).toString("hex")}`);
  await mkdir(src);
  const moved: string[] = [];
  for (const n of await readdir(dir)) {
    if (n === KV_INDEX || n === "pages" || n === "files" || isSpoolName(n)) {
      await rename(join(dir, n), join(src, n));
      moved.push(n);
    }
  }
  const spool = moved.includes(SPOOL_MAP) ? new SpoolReader(src, moved) : null;
  await spool?.load(join(src, SPOOL_MAP), layer.name);
  const contents = new KvContents(spool);
  const files = await readIndex(src, layer.name, contents, declared);
  // The index and map were read in 1 MiB / 64 KiB chunks, garbage now: free them before the rebuild.
  collectNow("minor");
  const { placed, placedCount } = placedPages(spool);
  const rb: Rebuild = {
    dir,
    src,
    layer: layer.name,
    contents,
    pages: new PageReader(layer.name, contents, src, verified),
    spool,
    placed,
    placedCount,
    umask: currentUmask(),
    batch: Buffer.allocUnsafe(WRITE_BATCH),
  };
  try {
    for (const [fileNo, f] of files.entries()) await rebuildFile(rb, fileNo, f);
    for (const fileNo of placed.keys()) {
      if (!files[fileNo]?.tiles) {
        throw restoreBad(
          `${layer.name}: pages are placed in file ${fileNo}, which the index does not have`,
          layer.name,
        );
      }
    }
  } finally {
    spool?.close();
  }
  await rm(src, { recursive: true, force: true });
  done.add(dir);
  materialized.set(layer, done);
}

/**
 * The staged kv-index.json must be the one the (sealed) layer meta names: with any other, or
 * none, the staged artifacts would be left as the dump. Returns the bytes the layer declares.
 */
async function checkIndex(dir: string, layer: LayerEntry): Promise<number> {
  const idxAbs = join(dir, KV_INDEX);
  const have = await sha256File(idxAbs).catch(() => null);
  const want = layer.meta?.index_sha256;
  if (have === null) throw restoreBad(`${layer.name}: the layer has no ${KV_INDEX}`, `${layer.name}/${KV_INDEX}`);
  if (have !== want) {
    throw restoreBad(
      `${layer.name}/${KV_INDEX} hashes to sha256:${have}, ` +
        `the layer's index_sha256 is ${JSON.stringify(want ?? null)}`,
      `${layer.name}/${KV_INDEX}`,
    );
  }
  const declared = layer.meta?.bytes_total;
  if (!Number.isSafeInteger(declared) || (declared as number) < 0) {
    throw new MemsnapError(
      "MEMSNAP_UNSAFE_BUNDLE",
      `${layer.name}: the layer meta's bytes_total ${JSON.stringify(declared ?? null)} is not a byte count`,
      { path: layer.name, hint: UNSAFE_HINT },
    );
  }
  return declared as number;
}

/**
 * Read the moved kv-index.json as it streams: its contents into `contents`, its files returned.
 * The spool is closed when the index is refused.
 */
async function readIndex(src: string, layer: string, contents: KvContents, declared: number): Promise<KvIndexFile[]> {
  const spool = contents.spool;
  const files: KvIndexFile[] = [];
  let dataBytes: number;
  try {
    const chunks = createReadStream(join(src, KV_INDEX), { highWaterMark: 1 << 20 }) as AsyncIterable<Buffer>;
    ({ dataBytes } = await readKvIndex(chunks, {
      content: (c, i) => contents.add(c, i),
      file: (f) => {
        files.push(f);
      },
    }));
  } catch (e) {
    spool?.close();
    if (e instanceof KvIndexUnsafe) {
      throw new MemsnapError(e.code, `${layer}/${KV_INDEX}: ${e.message}`, {
        path: `${layer}/${KV_INDEX}`,
        hint: UNSAFE_HINT,
      });
    }
    throw restoreBad(`${layer}/${KV_INDEX}: ${(e as Error).message}`, `${layer}/${KV_INDEX}`);
  }
  // The data files are no bigger than the pages the layer declares (bytes_total counts every
  // page, each data file's tiles are some of them): nothing is written past what it says.
  if (dataBytes > declared) {
    spool?.close();
    const why =
      `${layer}/${KV_INDEX}: its data files hold ${dataBytes} bytes, ` + `the layer declares ${declared} (bytes_total)`;
    throw new MemsnapError("MEMSNAP_UNSAFE_BUNDLE", why, { path: `${layer}/${KV_INDEX}`, hint: UNSAFE_HINT });
  }
  return files;
}

/** The spool's placed pages by part file (see {@link Rebuild.placed}); the spool's names are dropped. */
function placedPages(spool: SpoolReader | null): {
  placed: Map<number, Map<number, number>>;
  placedCount: Map<number, number>;
} {
  const placed = new Map<number, Map<number, number>>();
  const placedCount = new Map<number, number>();
  if (spool) {
    for (const slot of spool.slots.values()) {
      const file = spool.part.a[slot]!;
      if (file < 0) continue;
      let m = placed.get(file);
      if (!m) placed.set(file, (m = new Map()));
      m.set(spool.off.a[slot]!, slot);
      placedCount.set(file, (placedCount.get(file) ?? 0) + 1);
    }
    spool.slots.clear(); // the names are no longer needed
  }
  return { placed, placedCount };
}

/** Rebuild file `fileNo` of the index: a data file from its tiles, a verbatim file moved into place. */
async function rebuildFile(rb: Rebuild, fileNo: number, f: KvIndexFile): Promise<void> {
  const target = join(rb.dir, ...f.path.split("/"));
  await mkdir(dirname(target), { recursive: true });
  const here = rb.placed.get(fileNo);
  if (f.tiles) {
    await rebuildDataFile(rb, fileNo, f, target, here);
  } else {
    if (here) throw restoreBad(`${rb.layer}: pages are placed in ${f.path}, which has no tiles`, f.path);
    const from = join(rb.src, ...f.artifact!.split("/"));
    const st = await stat(from).catch(() => null);
    if (!st || st.size !== f.bytes) {
      throw restoreBad(`${rb.layer}/${f.artifact!} is missing or has the wrong size`, f.artifact!);
    }
    await rename(from, target);
  }
  await chmod(target, restoredMode(f.mode, rb.umask)); // never setuid, setgid or sticky; within the umask
  const t = new Date(f.mtime);
  if (!Number.isNaN(t.getTime())) await utimes(target, t, t);
}

/** Rebuild a data file at `target`: the spool part holding its placed pages (`here`), or a new file. */
async function rebuildDataFile(
  rb: Rebuild,
  fileNo: number,
  f: KvIndexFile,
  target: string,
  here: Map<number, number> | undefined,
): Promise<void> {
  const cannot = (e: unknown): MemsnapError =>
    new MemsnapError("MEMSNAP_UNSAFE_PATH", `${rb.layer}: cannot create ${f.path} (${(e as Error).message})`, {
      path: f.path,
    });
  let fd: number;
  if (here) {
    // The spool part that holds this file's placed pages becomes the file.
    if (
      await lstat(target).then(
        () => true,
        () => false,
      )
    )
      throw cannot(new Error("it already exists"));
    const part = rb.spool!.partPath.get(fileNo);
    if (part === undefined) throw restoreBad(`${rb.layer}: the page spool has no part ${fileNo}`, rb.layer);
    await rename(part, target).catch((e: unknown) => {
      throw cannot(e);
    });
    rb.spool!.partPath.set(fileNo, target);
    // Its own descriptor: the spool's may be closed by a read from other parts.
    fd = openSync(target, "r+");
  } else {
    try {
      fd = openSync(target, "wx", 0o600);
    } catch (e) {
      throw cannot(e);
    }
  }
  let written: { n: number; matched: number };
  try {
    written = await writeTiles(rb, fd, f, here);
  } finally {
    closeSync(fd);
  }
  const { n, matched } = written;
  if (n !== f.bytes) throw restoreBad(`${rb.layer}/${f.path}: rebuilt ${n} bytes, the index says ${f.bytes}`, f.path);
  if (here && matched !== rb.placedCount.get(fileNo)) {
    throw restoreBad(`${rb.layer}/${f.path}: a page is placed off the file's tiles`, f.path);
  }
}

/**
 * Size data file `f` and write its tiles into `fd`, but for the pages already placed in it
 * (`here`: offset → spool slot), which are checked, and the zero tiles, left as holes.
 * Returns the bytes laid out and how many placed pages sat on their tile.
 */
async function writeTiles(
  rb: Rebuild,
  fd: number,
  f: KvIndexFile,
  here: Map<number, number> | undefined,
): Promise<{ n: number; matched: number }> {
  const { contents: c, pages, spool, batch } = rb;
  let n = 0;
  let matched = 0;
  ftruncateSync(fd, f.bytes);
  // Tiles to write are laid into one batch buffer and written a run at a time; a page
  // already in place, and a zero tile (a hole), end the run.
  let used = 0;
  let runAt = 0;
  const flush = (): void => {
    if (used > 0) writeFully(fd, batch, used, runAt);
    used = 0;
  };
  for (const ci of f.tiles!) {
    const len = c.bytes.a[ci]!;
    const p = here?.get(n);
    if (p !== undefined) {
      if (p !== c.slot.a[ci] || spool!.len.a[p] !== len) {
        const where = `${rb.layer}/${await spoolName(rb.src, p)}`;
        throw restoreBad(`${where}: placed at byte ${n} of ${f.path}, where the index has another page`, where);
      }
      const where = `${rb.layer}/${c.artifactOf(ci)!}`;
      matched++;
      if (pages.checked[ci] !== 1) {
        if (pages.isVerified(ci, where)) pages.checked[ci] = 1;
        else pages.fillTile(ci, Buffer.allocUnsafe(len)); // reads and checks the bytes in place
      }
      flush();
    } else if (c.zero.a[ci] === 1) {
      flush();
    } else {
      if (used > 0 && used + len > batch.length) flush();
      if (used === 0) runAt = n;
      if (len > batch.length) {
        const big = Buffer.allocUnsafe(len);
        pages.fillTile(ci, big);
        writeFully(fd, big, len, n);
      } else {
        pages.fillTile(ci, batch.subarray(used, used + len));
        used += len;
      }
    }
    n += len;
  }
  flush();
  return { n, matched };
}

/** The name a spool slot was written under (for a message: slot k is the map's line k). */
async function spoolName(src: string, slot: number): Promise<string> {
  let k = 0;
  for await (const [rel] of readSpoolMap(join(src, SPOOL_MAP))) if (k++ === slot) return rel;
  return "?";
}
