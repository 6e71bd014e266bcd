/**
 * Incremental below the file: an artifact that changed since the last incremental snapshot is
 * packed as a chunked entry (format/chunked.ts) when most of its bytes are still those of the
 * artifact at its path then, so that only what changed is stored.
 *
 * Three ways to find what is unchanged, chosen by the source (Artifact.chunking):
 * - `append` (JSONL, agentlog traces, append-only logs): when the first `size` bytes, `size`
 *   being the last snapshot's, still hash to that snapshot's SHA-256, they are referenced and
 *   only the tail is stored. The prefix is hashed as it is read and nothing of it is kept; if
 *   it differs, the artifact is read again and stored whole (only for rereadable artifacts).
 * - `pages` (SQLite): the file is cut in pages of the database's page size; a page whose
 *   SHA-256 is one the last snapshot's table lists is referenced (the same page number first).
 *   A database read live is read and its pages hashed on the thread pool (./page-reader.ts).
 * - `cdc` (other large files): FastCDC cuts (util/fastcdc.ts, 16/64/256 KiB), matched the same
 *   way, so an edit in the middle costs the chunks around it.
 * Nothing of a base is read: the tables (16 bytes of SHA-256 per page or chunk) and each
 * artifact's recipe (where its bytes are: this bundle's stored ranges, or ranges of the entry
 * at its path in a base) are kept in the incremental cache (./incremental.ts). A recipe is
 * always resolved down to the bundles that store the bytes, so a reader never follows a chain.
 *
 * Chains stay bounded ({@link POLICY}): an artifact is stored whole again (and becomes the base
 * of what follows) once its last recipe reads from {@link POLICY.maxHolders} bundles, after
 * {@link POLICY.maxGenerations} chunked snapshots in a row, or when less than
 * {@link POLICY.minReferenced} of its bytes came from bases last time; a recipe of more than
 * {@link POLICY.maxRanges} ranges stores the rest of the artifact in this bundle.
 */
import { createHash } from "node:crypto";
import { read } from "node:fs";
import { open, rm, type FileHandle } from "node:fs/promises";
import { join } from "node:path";
import { destinationError, sourceChanged, sourceError } from "../errors.js";
import type { ChunkHint } from "../format/artifact.js";
import type { ChunkRange } from "../format/chunked.js";
import type { IndexEntry } from "../format/manifest.js";
import type { Artifact } from "../sources/types.js";
import { BaseTable, hash16, splitter, TableBuilder } from "./chunk-tables.js";
import { pageBlocks } from "./page-reader.js";

export type { ChunkHint };

/** When an artifact is stored whole again; see the module comment. */
export const POLICY = {
  maxHolders: 16,
  maxGenerations: 64,
  minReferenced: 0.5,
  maxRanges: 8192,
} as const;

export { CDC_PARAMS } from "./chunk-tables.js";

/** A range of a recipe: `len` bytes at `off` of the payload entry (at the artifact's path) of bundle `holder`. */
export type Piece = [number, string, number];

/** What the incremental cache keeps of an artifact for the next snapshot to chunk against. */
export interface ChunkRecord {
  /** How it is cut. */
  m: ChunkHint["mode"];
  /** Chunked snapshots in a row since it was last stored whole. */
  g: number;
  /** The page size (`pages`). */
  p?: number;
  /** Where its bytes are, when it is chunked; absent when it is stored whole in the cache line's bundle. */
  r?: Piece[];
  /** Where its table is in the cache's table file: offset, length, SHA-256 (hex, first 32) of the bytes. */
  t?: [number, number, string];
}

/** What the last snapshot recorded of the artifact at a path. */
export interface ChunkBase {
  size: number;
  sha256: string;
  /** The bundle of the cache line (holding it whole, when `rec.r` is absent). */
  holder: string;
  rec: ChunkRecord;
  /** Its table (`pages`: 16 bytes a page; `cdc`: a u32 length and 16 bytes a chunk), or null. */
  table: Buffer | null;
}

/** The result of packing a chunkable artifact. */
export interface ChunkedPack {
  entry: IndexEntry;
  rec: ChunkRecord;
  table: Buffer | null;
  /** Why it was stored whole, when it was and a base was there. */
  whole?: string;
}

/** The bytes of an artifact where each of them is, in order. */
export function recipeOf(b: Pick<ChunkBase, "size" | "holder" | "rec">): Piece[] {
  return b.rec.r ?? [[b.size, b.holder, 0]];
}

/** Why the artifact must be stored whole this time rather than chunked against `b`, or null. */
export function wholeReason(b: ChunkBase, hint: ChunkHint, a: Artifact): string | null {
  if (b.rec.m !== hint.mode || (hint.mode === "pages" && b.rec.p !== hint.pageSize))
    return "it is cut another way than last time";
  if (b.rec.g >= POLICY.maxGenerations) return `${POLICY.maxGenerations} chunked snapshots in a row`;
  const r = recipeOf(b);
  if (new Set(r.map((p) => p[1])).size >= POLICY.maxHolders) return `its bytes are in ${POLICY.maxHolders} bundles`;
  if (r.length > POLICY.maxRanges / 2) return "its ranges are too fragmented";
  if (b.rec.r) {
    const own = b.rec.r.reduce((n, p) => n + (p[1] === b.holder ? p[0] : 0), 0);
    if (b.size > 0 && 1 - own / b.size < POLICY.minReferenced) return "most of it changed last time";
  }
  if (hint.mode === "append") {
    if (b.size === 0 || b.size > a.size) return "it is not longer than last time";
    if (a.rereadable !== true) return "it cannot be read twice";
  } else if (!b.table) return "no table of its chunks";
  return null;
}

/** The index ranges of a recipe, `self`'s pieces (this bundle's stored bytes) as `[len]`. */
export function indexRanges(r: readonly Piece[], self: string): ChunkRange[] {
  const out: ChunkRange[] = [];
  for (const [len, holder, off] of r) {
    const last = out[out.length - 1];
    if (holder === self) {
      if (last && last.length === 1) last[0] += len;
      else out.push([len]);
    } else if (last && last.length === 3 && last[1] === holder && last[2] + last[0] === off) last[0] += len;
    else out.push([len, holder, off]);
  }
  return out;
}

/** Append a piece, merged with the last one when it continues it. */
function pushPiece(out: Piece[], p: Piece): void {
  const last = out[out.length - 1];
  if (last && last[1] === p[1] && last[2] + last[0] === p[2]) last[0] += p[0];
  else out.push([p[0], p[1], p[2]]);
}

/** Finds where bytes of a base artifact are, through its recipe. */
class RecipeIndex {
  readonly #starts: number[] = [];
  constructor(readonly pieces: readonly Piece[]) {
    let at = 0;
    for (const p of pieces) {
      this.#starts.push(at);
      at += p[0];
    }
  }

  /** Append to `out` the pieces holding bytes [off, off+len) of the base artifact. */
  locate(off: number, len: number, out: Piece[]): void {
    let lo = 0;
    let hi = this.#starts.length - 1;
    while (lo < hi) {
      const mid = (lo + hi + 1) >>> 1;
      if (this.#starts[mid]! <= off) lo = mid;
      else hi = mid - 1;
    }
    for (let i = lo; len > 0; i++) {
      const p = this.pieces[i]!;
      const skip = off - this.#starts[i]!;
      const n = Math.min(len, p[0] - skip);
      pushPiece(out, [n, p[1], p[2] + skip]);
      off += n;
      len -= n;
    }
  }
}

/** An artifact's chunks as they stream, copied where the reader reuses its buffers. */
async function* iterate(a: Artifact): AsyncGenerator<Buffer> {
  const src = a.open({ reuse: true }) as AsyncIterable<Buffer> | Iterable<Buffer>;
  yield* src as AsyncIterable<Buffer>;
}

/** Pack `a` whole, taking its table on the way (the base for the next snapshot). */
export async function packWhole(
  a: Artifact,
  hint: ChunkHint,
  pack: (a: Artifact) => Promise<IndexEntry>,
  whole?: string,
): Promise<ChunkedPack> {
  const cut = splitter(hint);
  const table = cut ? new TableBuilder(hint.mode) : null;
  const tapped: Artifact = !cut
    ? a
    : {
        ...a,
        open: (o) =>
          (async function* () {
            for await (const c of a.open(o) as AsyncIterable<Buffer>) {
              for (const x of cut.push(c)) table!.add(x.length, hash16(x));
              yield c;
            }
            for (const x of cut.end()) table!.add(x.length, hash16(x));
          })(),
      };
  const entry = await pack(tapped);
  return {
    entry,
    rec: { m: hint.mode, g: 0, ...(hint.mode === "pages" ? { p: hint.pageSize! } : {}) },
    table: table?.done() ?? null,
    ...(whole ? { whole } : {}),
  };
}

export interface ChunkContext {
  /** The payload path of the artifact. */
  name: string;
  layer: string;
  /** This snapshot's id. */
  self: string;
  /** Where the stored ranges are spooled. */
  workDir: string;
  /** Pack an artifact as a payload entry (the pipeline's packArtifact). */
  pack: (a: Artifact) => Promise<IndexEntry>;
  /** The bundles a recipe reads: referenced by this snapshot. */
  use: (ids: Iterable<string>) => void;
}

/** The chunked index entry for `a`, its stored ranges packed as `stored`. */
function chunkedEntry(
  ctx: ChunkContext,
  a: Artifact,
  size: number,
  sha256: string,
  ranges: ChunkRange[],
  stored: IndexEntry,
): IndexEntry {
  return {
    path: ctx.name,
    layer: ctx.layer,
    kind: a.kind,
    size,
    sha256,
    mode: a.mode,
    mtime: a.mtime.toISOString(),
    ranges,
    stored_size: stored.size,
    stored_sha256: stored.sha256,
  };
}

/**
 * Pack `a` against `base` (checked with {@link wholeReason} first): a chunked entry when some
 * of its bytes are the base's, else whole.
 */
export async function packChunked(
  a: Artifact,
  hint: ChunkHint,
  base: ChunkBase,
  ctx: ChunkContext,
): Promise<ChunkedPack> {
  return hint.mode === "append" ? packAppended(a, base, ctx) : packMatched(a, hint, base, ctx);
}

/** `append`: the prefix checked against the base's hash, the tail packed. */
async function packAppended(a: Artifact, base: ChunkBase, ctx: ChunkContext): Promise<ChunkedPack> {
  const it = iterate(a)[Symbol.asyncIterator]();
  const whole = createHash("sha256");
  let seen = 0;
  let left: Buffer | null = null;
  try {
    while (seen < base.size) {
      const r = await it.next();
      if (r.done) throw sourceChanged(ctx.name, `shrank from ${a.size} to ${seen} bytes`);
      const c = r.value;
      if (seen + c.length <= base.size) {
        whole.update(c);
        seen += c.length;
      } else {
        whole.update(c.subarray(0, base.size - seen));
        left = c.subarray(base.size - seen);
        seen = base.size;
      }
    }
  } catch (e) {
    await it.return?.(undefined);
    throw e;
  }
  if (whole.copy().digest("hex") !== base.sha256) {
    await it.return?.(undefined);
    return packWhole(a, { mode: "append" }, ctx.pack, "its first bytes changed");
  }
  const tail: Artifact = {
    path: a.path,
    kind: a.kind,
    size: a.size - base.size,
    mode: a.mode,
    mtime: a.mtime,
    open: () =>
      (async function* () {
        if (left) {
          whole.update(left);
          yield left;
        }
        for (;;) {
          const r = await it.next();
          if (r.done) return;
          whole.update(r.value);
          yield r.value;
        }
      })(),
  };
  const stored = await ctx.pack(tail);
  await a.check?.();
  const sha256 = whole.digest("hex");
  if (a.expectSha256 !== undefined && a.expectSha256 !== sha256) {
    throw sourceChanged(ctx.name, "its bytes changed between the redaction scan and packing (same size and mtime)");
  }
  const r = recipeOf(base).map((p) => [...p] as Piece);
  if (tail.size > 0) pushPiece(r, [tail.size, ctx.self, 0]);
  ctx.use(r.map((p) => p[1]).filter((id) => id !== ctx.self));
  return {
    entry: chunkedEntry(ctx, a, a.size, sha256, indexRanges(r, ctx.self), stored),
    rec: { m: "append", g: base.rec.g + 1, r },
    table: null,
  };
}

/** Literal bytes gathered into ~1 MiB writes to the spool. */
class Spool {
  readonly #buf = Buffer.allocUnsafe(1 << 20);
  #n = 0;
  size = 0;
  constructor(
    readonly path: string,
    readonly fh: FileHandle,
  ) {}

  async add(b: Buffer): Promise<void> {
    this.size += b.length;
    let at = 0;
    while (at < b.length) {
      const k = Math.min(b.length - at, this.#buf.length - this.#n);
      b.copy(this.#buf, this.#n, at, at + k);
      this.#n += k;
      at += k;
      if (this.#n === this.#buf.length) await this.flush();
    }
  }

  async flush(): Promise<void> {
    if (this.#n === 0) return;
    try {
      await this.fh.write(this.#buf, 0, this.#n);
    } catch (e) {
      throw destinationError(e, this.path);
    }
    this.#n = 0;
  }
}

let spools = 0;

/** A positioned read through a descriptor the caller does not own (fs.read on the thread pool). */
const readAt = (fd: number, b: Buffer, pos: number): Promise<number> =>
  new Promise((res, rej) => read(fd, b, 0, b.length, pos, (e, n) => (e ? rej(e) : res(n))));

/** `pages` and `cdc`: each chunk matched against the base's table; the others spooled, then packed. */
async function packMatched(a: Artifact, hint: ChunkHint, base: ChunkBase, ctx: ChunkContext): Promise<ChunkedPack> {
  const bt = new BaseTable(base.table!, hint, base.size);
  const recipe = new RecipeIndex(recipeOf(base));
  const cut = splitter(hint)!;
  const table = new TableBuilder(hint.mode);
  const whole = createHash("sha256");
  const file = join(ctx.workDir, `chunked-${process.pid}-${spools++}`);
  let fh: FileHandle;
  try {
    fh = await open(file, "wx", 0o600);
  } catch (e) {
    throw destinationError(e, file);
  }
  const spool = new Spool(file, fh);
  const pieces: Piece[] = [];
  let at = 0;
  let referenced = 0;
  const chunk = async (x: Buffer, h = hash16(x)): Promise<void> => {
    table.add(x.length, h);
    const i = pieces.length < POLICY.maxRanges ? bt.find(h, x.length, at) : undefined;
    if (i !== undefined) {
      bt.used[i] = 1;
      recipe.locate(bt.offsets[i]!, x.length, pieces);
      referenced += x.length;
    } else {
      pushPiece(pieces, [x.length, ctx.self, spool.size]);
      await spool.add(x);
    }
    at += x.length;
  };
  // Hashes a reader of every byte computed already (Artifact.pageHashes): only the pages stored
  // are read, each checked against its hash there, and the whole file's hash is taken as it is.
  const pre =
    hint.mode === "pages" &&
    a.descriptor &&
    a.pageHashes &&
    a.pageHashes.pageSize === hint.pageSize &&
    a.pageHashes.table.length === 16 * Math.ceil(a.size / hint.pageSize!) &&
    /^[0-9a-f]{64}$/.test(a.pageHashes.sha256)
      ? a.pageHashes
      : null;
  try {
    // Pages read and hashed on the thread pool when the artifact offers its descriptor (./page-reader.ts).
    const blocks = hint.mode === "pages" && !pre ? pageBlocks(a, hint.pageSize!) : null;
    if (pre) {
      const ps = hint.pageSize!;
      const hashes = Buffer.from(pre.table.buffer, pre.table.byteOffset, pre.table.length);
      const n = hashes.length / 16;
      const per = Math.max(1, Math.floor((1 << 20) / ps));
      const page = Buffer.allocUnsafe(ps);
      for (let i = 0; i < n; i += per) {
        const count = Math.min(per, n - i);
        const len = Math.min(count * ps, a.size - at);
        const hs = hashes.subarray(16 * i, 16 * (i + count));
        // most runs of pages are unchanged in place: referenced at once, unread
        const j = len === count * ps && pieces.length + count <= POLICY.maxRanges ? bt.samePages(at, count, hs) : -1;
        if (j >= 0) {
          bt.used.fill(1, j, j + count);
          table.addPages(hs, count);
          recipe.locate(at, len, pieces);
          referenced += len;
          at += len;
          continue;
        }
        for (let k = 0; k < count; k++) {
          const plen = Math.min(ps, a.size - at);
          const h = hs.subarray(16 * k, 16 * k + 16);
          const m = pieces.length < POLICY.maxRanges ? bt.find(h, plen, at) : undefined;
          if (m !== undefined) {
            table.add(plen, h);
            bt.used[m] = 1;
            recipe.locate(bt.offsets[m]!, plen, pieces);
            referenced += plen;
            at += plen;
            continue;
          }
          const x = page.subarray(0, plen);
          let got: number;
          try {
            got = await readAt(a.descriptor!.fd, x, at);
          } catch (e) {
            throw sourceError(e, a.descriptor!.path);
          }
          if (got !== plen) throw sourceChanged(ctx.name, `it ends before its ${a.size} bytes`);
          if (hash16(x).compare(h) !== 0)
            throw sourceChanged(ctx.name, `its page at byte ${at} changed while it was read`);
          await chunk(x, h);
        }
      }
    } else if (blocks) {
      for await (const b of blocks) {
        whole.update(b.bytes);
        const len = b.bytes.length;
        // Most blocks are unchanged in place: referenced at once, as page by page (merged) they would be.
        const i =
          len === b.count * b.pageSize && pieces.length + b.count <= POLICY.maxRanges
            ? bt.samePages(at, b.count, b.hashes)
            : -1;
        if (i >= 0) {
          bt.used.fill(1, i, i + b.count);
          table.addPages(b.hashes, b.count);
          recipe.locate(at, len, pieces);
          referenced += len;
          at += len;
          continue;
        }
        for (let k = 0; k < b.count; k++) {
          const o = k * b.pageSize;
          await chunk(b.bytes.subarray(o, o + b.pageSize), b.hashes.subarray(16 * k, 16 * k + 16));
        }
      }
    } else {
      let seen = 0;
      for await (const c of iterate(a)) {
        seen += c.length;
        if (seen > a.size) throw sourceChanged(ctx.name, `grew past its declared ${a.size} bytes`);
        whole.update(c);
        for (const x of cut.push(c)) await chunk(x);
      }
      for (const x of cut.end()) await chunk(x);
      if (seen !== a.size) throw sourceChanged(ctx.name, `shrank from ${a.size} to ${seen} bytes`);
    }
    await spool.flush();
  } finally {
    await fh.close();
  }
  try {
    await a.check?.();
    const sha256 = pre ? pre.sha256 : whole.digest("hex");
    if (a.expectSha256 !== undefined && a.expectSha256 !== sha256) {
      throw sourceChanged(ctx.name, "its bytes changed between the redaction scan and packing (same size and mtime)");
    }
    const spooled: Artifact = {
      path: a.path,
      kind: a.kind,
      size: spool.size,
      mode: a.mode,
      mtime: a.mtime,
      open: () =>
        (async function* () {
          const f = await open(file, "r");
          try {
            for (let pos = 0; pos < spool.size;) {
              const buf = Buffer.allocUnsafe(Math.min(1 << 20, spool.size - pos));
              const { bytesRead } = await f.read(buf, 0, buf.length, pos);
              if (bytesRead === 0) break;
              pos += bytesRead;
              yield buf.subarray(0, bytesRead);
            }
          } finally {
            await f.close();
          }
        })(),
    };
    const rec: ChunkRecord = { m: hint.mode, g: 0, ...(hint.mode === "pages" ? { p: hint.pageSize! } : {}) };
    const stored = await ctx.pack(spooled);
    if (referenced === 0) {
      // Nothing matched: the spool is the whole artifact, stored as any other.
      if (stored.sha256 !== sha256) throw sourceChanged(ctx.name, "its bytes changed while they were packed");
      return { entry: stored, rec, table: table.done(), whole: "none of its chunks was unchanged" };
    }
    ctx.use(pieces.map((p) => p[1]).filter((id) => id !== ctx.self));
    return {
      entry: chunkedEntry(ctx, a, a.size, sha256, indexRanges(pieces, ctx.self), stored),
      rec: { ...rec, g: base.rec.g + 1, r: pieces },
      table: table.done(),
    };
  } finally {
    await rm(file, { force: true });
  }
}
