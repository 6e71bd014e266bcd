/**
 * The `kv` source: KV-cache page dumps, deduplicated by content.
 *
 * Input formats:
 * - `memsnap`: a directory with `kv-manifest.json` and data files (docs/FORMAT.md "KV dump format");
 * - `pfimg-paged`: a ProcessFork `paged-batchinvariant-v1` page manifest (JSON, or its
 *   zstd blob) inside a store-like directory whose `blobs/sha256/<xx>/<hex>[.zst]` hold the
 *   K and V pages;
 * - `lmcache`: headerless LMCache-style chunk files, shape given in the config.
 *
 * Each data file is cut into pages (tiles). Every page's SHA-256 (over its original bytes)
 * is computed as it streams; each distinct non-zero page is stored once as `pages/<sha256>`
 * (or `pages/<sha256>.s2|.s4` when byte-plane shuffled), zero pages are flags only, other
 * files are kept verbatim under `files/<path>`, and the last artifact, `kv-index.json`, maps
 * every original page and every tile of every data file to its content. Restore rebuilds the
 * dump directory byte for byte. The dump is never held in memory: pages stream one read
 * block (≤ 4 MiB) at a time.
 */
import { createHash, randomBytes } from "node:crypto";
import { closeSync, createReadStream, ftruncateSync, openSync, readFileSync, readSync, writeSync } from "node:fs";
import type { Stats } from "node:fs";
import { chmod, lstat, mkdir, open, readdir, readFile, rename, rm, stat, utimes, type FileHandle } from "node:fs/promises";
import { basename, dirname, join, resolve } from "node:path";
import type { LayerEntry } from "../../format/manifest.js";
import { MemsnapError, isMemsnapError } from "../../errors.js";
import type { Redactor } from "../../redact/types.js";
import { configInvalid, isPlainObject, optString, rejectUnknownKeys, reqString } from "../../util/config-check.js";
import {
  KV_INDEX, KV_MANIFEST, KV_MANIFEST_MAX_BYTES, KV_MAX_PAGE_BYTES, KV_WORK_PREFIX, KvIndexUnsafe, PAGE_ARTIFACT_RE, kvInvalid,
  Grow, pageArtifact, pagePlace, readKvIndex, readKvManifest, shuffle as shufflePlanes, unshuffle,
  type KvIndexFile,
} from "./format.js";
import { canonicalDtype, dtypeBytes, parsePageManifest, sha256Hex } from "../pfimg/format.js";
import { FrameHasher, decompressToBuffer, hashFrameChunks, isAllZero, zstdCompressSync } from "../pfimg/frames.js";
import { TextScanner } from "../pfimg/text-scanner.js";
import { SPOOL_FILE, SPOOL_MAP, isSpoolName, type Artifact, type SourceKind, type VerifiedLookup } from "../types.js";
import { readSpoolMap } from "../../restore/spool.js";
import { sourceChanged, sourceError, walkFiles, type FileStats } from "../walk.js";
import { FdCache } from "../../util/fd-cache.js";
import { KvIndexWriter } from "./index-writer.js";
import { kvPageFingerprint } from "../../pipeline/incremental.js";
import { readBlocks, type ReadBlock } from "./blocks.js";
import { collectNow } from "../../util/gc.js";
import { currentUmask, restoredMode } from "../../util/umask.js";

export interface KvShape {
  n_layers: number;
  n_kv_heads: number;
  head_dim: number;
  dtype: string;
  block_size: number;
  tokens_per_chunk: number;
}

export interface KvConfig {
  kind: "kv";
  name: string;
  path: string;
  format?: "memsnap" | "pfimg-paged" | "lmcache";
  shape?: KvShape;
  shuffle?: "auto" | "on" | "off";
}

type Format = NonNullable<KvConfig["format"]>;

/** Bytes read from a data file at a time (whole pages). */
/** Auto shuffle: at most this many pages, this many bytes, compressed both ways at zstd -3. */
const SAMPLE_PAGES = 32;
const SAMPLE_MAX_BYTES = 4 * 1024 * 1024;
const SAMPLE_LEVEL = 3;
/**
 * Keep the shuffle when it makes the sample at least this much smaller. Shuffled pages cost a
 * pass each way and compress far slower at the same level (measured, bf16 KV pages: zstd -1
 * 860 → 372 MB/s, zstd -3 564 → 225 MB/s), so a saving of a few percent is not worth it: on the
 * bench mix a 7 % saving made the KV layer's snapshot 2.3x slower.
 */
const SHUFFLE_MIN_SAVING = 0.1;
/** Verbatim JSON files at most this big are scanned with the redactor. */
const SCAN_MAX = 64 * 1024 * 1024;

// ------------------------------------------------------------------------------ plan

interface Tile {
  offset: number;
  len: number;
  label: string;
  /** Digest the dump declares (lowercase hex), or null. */
  sha: string | null;
  /** The dump declares the page all-zero. */
  zero: boolean;
}

/** A data file's tiles: its pages in offset order. */
interface Tiles {
  readonly length: number;
  offset(i: number): number;
  len(i: number): number;
  label(i: number): string;
  /** Digest the dump declares (lowercase hex), or null. */
  sha(i: number): string | null;
  /** The dump declares the page all-zero. */
  zero(i: number): boolean;
}

function listTiles(t: Tile[]): Tiles {
  return {
    length: t.length,
    offset: (i) => t[i]!.offset,
    len: (i) => t[i]!.len,
    label: (i) => t[i]!.label,
    sha: (i) => t[i]!.sha,
    zero: (i) => t[i]!.zero,
  };
}

interface DataFile {
  rel: string;
  abs: string;
  stats: FileStats;
  tiles: Tiles;
}

interface VerbatimFile {
  rel: string;
  abs: string;
  stats: FileStats;
  /** SHA-256 of the bytes read (and validated) while planning: the streamed bytes must match it. */
  planned: string | null;
  /** A ProcessFork page blob kept as its stored zstd frame: verified while streaming. */
  zst: { hex: string; what: string; expectRaw: number | null } | null;
  scan: boolean;
}

interface KvPlan {
  format: Format;
  root: string;
  dtype: string;
  elem: number;
  pageBytes: number;
  data: DataFile[];
  verbatim: VerbatimFile[];
  /** Original pages stored inside verbatim zstd blobs: [label, blob hex]. */
  framePages: [string, string][];
  meta: Record<string, unknown>;
}

function digestMismatch(msg: string, path: string): MemsnapError {
  return new MemsnapError("MEMSNAP_SOURCE_DIGEST_MISMATCH", msg, {
    path, hint: "the dump's pages do not match its manifest: re-export the KV dump (a page changed after it was hashed, or the file is damaged)",
  });
}

async function statFile(abs: string, what: string): Promise<Stats> {
  let st: Stats;
  try {
    st = await lstat(abs);
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code === "ENOENT") throw kvInvalid(`kv: ${what} ${abs} is missing`, abs);
    throw sourceError(e, abs);
  }
  if (!st.isFile()) throw kvInvalid(`kv: ${what} ${abs} is not a regular file`, abs);
  return st;
}

async function readSmall(abs: string, st: Stats, cap: number): Promise<Buffer> {
  if (st.size > cap) throw kvInvalid(`kv: ${abs} is ${st.size} bytes, over the ${cap}-byte cap`, abs);
  let b: Buffer;
  try {
    b = await readFile(abs);
  } catch (e) {
    throw sourceError(e, abs);
  }
  if (b.length !== st.size) throw sourceChanged(abs, `size ${st.size} → ${b.length}`);
  return b;
}

const sizeWord = (n: number): string => `${n} byte${n === 1 ? "" : "s"}`;

function checkShape(cfg: KvConfig, got: { nLayers: number | null; nKvHeads: number | null; headDim: number | null; dtype: string | null; blockSize: number | null }, where: string): void {
  const s = cfg.shape;
  if (!s) return;
  const pairs: [string, unknown, unknown][] = [
    ["n_layers", s.n_layers, got.nLayers], ["n_kv_heads", s.n_kv_heads, got.nKvHeads], ["head_dim", s.head_dim, got.headDim],
    ["block_size", s.block_size, got.blockSize],
  ];
  for (const [k, want, have] of pairs) {
    if (have !== null && want !== have) throw kvInvalid(`kv: ${where} has ${k} ${String(have)}, the config's shape says ${String(want)}`);
  }
  if (got.dtype !== null && canonicalDtype(got.dtype) !== canonicalDtype(s.dtype)) throw kvInvalid(`kv: ${where} has dtype ${got.dtype}, the config's shape says ${s.dtype}`);
}

async function planMemsnap(root: string, cfg: KvConfig): Promise<KvPlan> {
  const mAbs = join(root, KV_MANIFEST);
  const mSt = await statFile(mAbs, "dump manifest");
  if (mSt.size > KV_MANIFEST_MAX_BYTES) throw kvInvalid(`kv: ${mAbs} is over the ${KV_MANIFEST_MAX_BYTES}-byte cap`, mAbs);
  // Read as it streams (the manifest grows with the pages: ~200 bytes each), hashed on the way:
  // the bytes packed later must be these.
  const mHash = createHash("sha256");
  let mRead = 0;
  const m = await readKvManifest((async function* () {
    try {
      for await (const c of createReadStream(mAbs, { start: 0, end: mSt.size, highWaterMark: 1 << 20 })) {
        mHash.update(c as Buffer);
        mRead += (c as Buffer).length;
        yield c as Buffer;
      }
    } catch (e) {
      throw sourceError(e, mAbs);
    }
  })(), mAbs);
  if (mRead !== mSt.size) throw sourceChanged(mAbs, `size ${mSt.size} → ${mRead} while it was read`);
  checkShape(cfg, { nLayers: m.nLayers, nKvHeads: m.nKvHeads, headDim: m.headDim, dtype: m.dtype, blockSize: m.blockSize }, mAbs);
  for (const f of m.dataFiles) if (f.path === KV_MANIFEST) throw kvInvalid(`kv: ${mAbs} lists itself as a data file`, mAbs);
  // Each data file's pages in offset order: page indexes grouped by file, then sorted.
  const pg = m.pages;
  const starts = new Uint32Array(m.dataFiles.length + 1);
  for (let i = 0; i < pg.count; i++) starts[pg.file.a[i]! + 1]!++;
  for (let k = 0; k < m.dataFiles.length; k++) starts[k + 1]! += starts[k]!;
  const fill = starts.slice(0, m.dataFiles.length);
  const byFile = new Uint32Array(pg.count);
  for (let i = 0; i < pg.count; i++) byFile[fill[pg.file.a[i]!]!++] = i;
  const data: DataFile[] = [];
  for (const [k, f] of m.dataFiles.entries()) {
    const abs = join(root, ...f.path.split("/"));
    const st = await statFile(abs, `data file ${f.path} named by ${KV_MANIFEST}:`);
    const idx = byFile.subarray(starts[k]!, starts[k + 1]!).sort((x, y) => pg.offset.a[x]! - pg.offset.a[y]!);
    for (let i = 0; i < idx.length; i++) {
      const off = pg.offset.a[idx[i]!]!;
      if (off !== i * m.pageBytes) {
        throw kvInvalid(`kv: data file ${f.path}: pages must tile it from offset 0 without gaps or overlaps; page ${pg.label(idx[i]!)} is at offset ${off}, expected ${i * m.pageBytes}`, abs);
      }
    }
    const want = idx.length * m.pageBytes;
    if (st.size !== want) {
      throw kvInvalid(`kv: data file ${f.path} is ${sizeWord(st.size)}, but its ${idx.length} page(s) of [2, ${m.blockSize}, ${m.nKvHeads}, ${m.headDim}] ${m.dtype} (${m.pageBytes} bytes each) need ${want}`, abs);
    }
    if (f.bytes !== null && f.bytes !== st.size) throw kvInvalid(`kv: data file ${f.path} is ${sizeWord(st.size)}, ${KV_MANIFEST} says ${f.bytes}`, abs);
    const pageLen = m.pageBytes;
    data.push({
      rel: f.path, abs, stats: st,
      tiles: {
        length: idx.length,
        offset: (i) => i * pageLen,
        len: () => pageLen,
        label: (i) => pg.label(idx[i]!),
        sha: (i) => pg.shaOf(idx[i]!),
        zero: (i) => pg.zero.a[idx[i]!] === 1,
      },
    });
  }
  const dataSet = new Set(m.dataFiles.map((f) => f.path));
  const { files, skipped } = await walkFiles(root);
  const verbatim: VerbatimFile[] = [];
  for (const f of files) {
    if (dataSet.has(f.rel)) continue;
    if (f.rel === KV_MANIFEST) verbatim.push({ rel: f.rel, abs: f.abs, stats: mSt, planned: mHash.digest("hex"), zst: null, scan: true });
    else verbatim.push({ rel: f.rel, abs: f.abs, stats: f.stats, planned: null, zst: null, scan: /\.(json|jsonl|txt|md)$/.test(f.rel) && f.stats.size <= SCAN_MAX });
  }
  return {
    format: "memsnap", root, dtype: m.dtype, elem: dtypeBytes(m.dtype)!, pageBytes: m.pageBytes, data, verbatim, framePages: [],
    meta: {
      engine: m.engine,
      model: { n_layers: m.nLayers, n_kv_heads: m.nKvHeads, head_dim: m.headDim },
      block_size: m.blockSize,
      sequences: m.sequences.length,
      declared_sha256: pg.hasSha.a.subarray(0, pg.count).reduce((n, v) => n + v, 0),
      skipped,
    },
  };
}

/** The nearest directory at or above `from` holding `blobs/sha256`. */
async function findBlobRoot(from: string): Promise<string | null> {
  let d = from;
  for (;;) {
    if (await stat(join(d, "blobs", "sha256")).then((s) => s.isDirectory(), () => false)) return d;
    const up = dirname(d);
    if (up === d) return null;
    d = up;
  }
}

async function readPageManifest(abs: string, st: Stats): Promise<Buffer> {
  const raw = await readSmall(abs, st, KV_MANIFEST_MAX_BYTES);
  if (!abs.endsWith(".zst")) return raw;
  let out: { bytes: Buffer; hex: string };
  try {
    out = await decompressToBuffer(raw, KV_MANIFEST_MAX_BYTES);
  } catch (e) {
    throw kvInvalid(`kv: ${abs} is not a valid zstd frame: ${(e as Error).message}`, abs);
  }
  const m = /([0-9a-f]{64})\.zst$/.exec(abs);
  if (m && out.hex !== m[1]) throw digestMismatch(`kv: page manifest ${abs} decompresses to sha256:${out.hex}, not the digest in its name`, abs);
  return out.bytes;
}

async function planPfimgPaged(manifestAbs: string, cfg: KvConfig): Promise<KvPlan> {
  const mSt = await statFile(manifestAbs, "page manifest");
  const bytes = await readPageManifest(manifestAbs, mSt);
  const pm = parsePageManifest(bytes, `kv: page manifest ${manifestAbs}`, manifestAbs);
  checkShape(cfg, { nLayers: pm.nLayers, nKvHeads: pm.nHeads, headDim: pm.headDim, dtype: pm.dtype, blockSize: pm.pageSizeTokens }, manifestAbs);
  const root = await findBlobRoot(dirname(manifestAbs));
  if (!root) throw kvInvalid(`kv: no blobs/sha256/ directory at or above ${dirname(manifestAbs)} to hold the pages of ${manifestAbs}`, manifestAbs);
  const mRel = manifestAbs.slice(root.length + 1).split("\\").join("/");
  const dtype = pm.dtype ?? cfg.shape?.dtype ?? "bf16";
  const verbatim: VerbatimFile[] = [{ rel: mRel, abs: manifestAbs, stats: mSt, planned: null, zst: null, scan: false }];
  const data: DataFile[] = [];
  const framePages: [string, string][] = [];
  const seen = new Map<string, "zst" | "raw">();
  const rawLabels: [string, string][] = [];
  for (const p of pm.pages) {
    for (const kv of ["k", "v"] as const) {
      const hex = p[kv];
      const label = `${p.ix}/${kv}`;
      const what = `page ${kv} of page ${p.ix}`;
      const prior = seen.get(hex);
      if (prior === "zst") {
        framePages.push([label, hex]);
        continue;
      }
      if (prior === "raw") {
        rawLabels.push([label, hex]);
        continue;
      }
      const zRel = `blobs/sha256/${hex.slice(0, 2)}/${hex}.zst`;
      const rRel = `blobs/sha256/${hex.slice(0, 2)}/${hex}`;
      const zAbs = join(root, ...zRel.split("/"));
      const rAbs = join(root, ...rRel.split("/"));
      const zSt = await lstat(zAbs).catch(() => null);
      if (zSt?.isFile()) {
        verbatim.push({ rel: zRel, abs: zAbs, stats: zSt, planned: null, zst: { hex, what, expectRaw: pm.pageBytes }, scan: false });
        framePages.push([label, hex]);
        seen.set(hex, "zst");
        continue;
      }
      const rSt = await lstat(rAbs).catch(() => null);
      if (!rSt?.isFile()) throw kvInvalid(`kv: blob sha256:${hex} (${what}) is missing: neither ${zRel} nor ${rRel} under ${root}`, zAbs);
      if (pm.pageBytes !== null && rSt.size !== pm.pageBytes) {
        throw kvInvalid(`kv: blob sha256:${hex} (${what}) is ${sizeWord(rSt.size)}; a page of ${pm.nLayers} layers × ${pm.pageSizeTokens} tokens × ${pm.nHeads} heads × ${pm.headDim} × ${dtype} is ${pm.pageBytes}`, rAbs);
      }
      if (rSt.size > KV_MAX_PAGE_BYTES) throw kvInvalid(`kv: blob sha256:${hex} (${what}) is over the ${KV_MAX_PAGE_BYTES}-byte page cap`, rAbs);
      data.push({ rel: rRel, abs: rAbs, stats: rSt, tiles: listTiles([{ offset: 0, len: rSt.size, label, sha: hex, zero: false }]) });
      seen.set(hex, "raw");
    }
  }
  return {
    format: "pfimg-paged", root, dtype, elem: dtypeBytes(dtype) ?? 1, pageBytes: pm.pageBytes ?? 0, data, verbatim, framePages,
    meta: {
      manifest: mRel,
      model: { n_layers: pm.nLayers, n_kv_heads: pm.nHeads, head_dim: pm.headDim },
      block_size: pm.pageSizeTokens,
      pfimg_pages: pm.pages.length,
      extra_labels: rawLabels,
    },
  };
}

async function planLmcache(pathAbs: string, cfg: KvConfig): Promise<KvPlan> {
  const s = cfg.shape!;
  const eb = dtypeBytes(s.dtype)!;
  const row = 2 * s.n_layers * s.n_kv_heads * s.head_dim * eb;
  const pageBytes = s.block_size * s.n_kv_heads * s.head_dim * eb;
  if (pageBytes > KV_MAX_PAGE_BYTES) throw kvInvalid(`kv: pages of ${pageBytes} bytes are over the ${KV_MAX_PAGE_BYTES}-byte cap`);
  const st = await stat(pathAbs).catch((e: unknown) => { throw sourceError(e, pathAbs); });
  const root = st.isDirectory() ? pathAbs : dirname(pathAbs);
  const { files, skipped } = await walkFiles(pathAbs);
  const data: DataFile[] = [];
  for (const f of files) {
    const size = f.stats.size;
    const tokens = size / row;
    if (size === 0 || !Number.isInteger(tokens) || tokens > s.tokens_per_chunk) {
      throw kvInvalid(`kv: chunk file ${f.rel} is ${sizeWord(size)}, not 1..${s.tokens_per_chunk} tokens of [${s.n_layers} layers, 2, tokens, ${s.n_kv_heads} heads, ${s.head_dim}] ${s.dtype} (${row} bytes per token)`, f.abs);
    }
    const tiles: Tile[] = [];
    for (let off = 0, i = 0; off < size; off += pageBytes, i++) {
      tiles.push({ offset: off, len: Math.min(pageBytes, size - off), label: `${f.rel}#${i}`, sha: null, zero: false });
    }
    data.push({ rel: f.rel, abs: f.abs, stats: f.stats, tiles: listTiles(tiles) });
  }
  return {
    format: "lmcache", root, dtype: s.dtype, elem: eb, pageBytes, data, verbatim: [], framePages: [],
    meta: {
      model: { n_layers: s.n_layers, n_kv_heads: s.n_kv_heads, head_dim: s.head_dim },
      block_size: s.block_size,
      tokens_per_chunk: s.tokens_per_chunk,
      layout: "[n_layers, 2, tokens, n_kv_heads, head_dim]",
      chunks: data.length,
      skipped,
    },
  };
}

/** Which format a path holds, when the config does not say. */
async function detect(pathAbs: string, cfg: KvConfig): Promise<{ format: Format; target: string }> {
  let st: Stats;
  try {
    st = await stat(pathAbs);
  } catch (e) {
    throw sourceError(e, pathAbs);
  }
  const looksPaged = async (abs: string): Promise<boolean> => {
    try {
      const s2 = await stat(abs);
      if (!s2.isFile() || s2.size > KV_MANIFEST_MAX_BYTES) return false;
      const b = await readPageManifest(abs, s2);
      parsePageManifest(b, abs);
      return true;
    } catch {
      return false;
    }
  };
  if (st.isDirectory()) {
    const want = cfg.format;
    if (want === "lmcache") return { format: "lmcache", target: pathAbs };
    if (want === "memsnap" || (!want && (await stat(join(pathAbs, KV_MANIFEST)).then(() => true, () => false)))) return { format: "memsnap", target: pathAbs };
    for (const n of ["cache-manifest.json", "manifest.json"]) {
      const abs = join(pathAbs, n);
      if (want === "pfimg-paged" || !want) {
        if (await looksPaged(abs)) return { format: "pfimg-paged", target: abs };
      }
    }
    if (want === "pfimg-paged") throw kvInvalid(`kv: ${pathAbs} holds no paged-batchinvariant-v1 page manifest (cache-manifest.json or manifest.json); point path at the manifest file`, pathAbs);
    if (cfg.shape) return { format: "lmcache", target: pathAbs };
    throw kvInvalid(`kv: cannot tell what ${pathAbs} holds: no ${KV_MANIFEST}, no page manifest, and no shape for LMCache chunks`, pathAbs);
  }
  if (cfg.format === "memsnap" || (!cfg.format && basename(pathAbs) === KV_MANIFEST)) return { format: "memsnap", target: dirname(pathAbs) };
  if (cfg.format === "pfimg-paged") return { format: "pfimg-paged", target: pathAbs };
  if (cfg.format === "lmcache") return { format: "lmcache", target: pathAbs };
  if (await looksPaged(pathAbs)) return { format: "pfimg-paged", target: pathAbs };
  if (cfg.shape) return { format: "lmcache", target: pathAbs };
  throw kvInvalid(`kv: cannot tell what ${pathAbs} holds: not ${KV_MANIFEST}, not a page manifest, and no shape for LMCache chunks`, pathAbs);
}

// ------------------------------------------------------------------------------ shuffle decision

interface ShuffleDecision {
  mode: "auto" | "on" | "off";
  applied: boolean;
  elem_bytes: number;
  reason?: string;
  sample?: { pages: number; bytes: number; zstd3_plain: number; zstd3_shuffled: number; saving_pct: number };
}

async function decideShuffle(plan: KvPlan, mode: "auto" | "on" | "off"): Promise<ShuffleDecision> {
  const elem = plan.elem;
  if (elem !== 2 && elem !== 4) return { mode, applied: false, elem_bytes: elem, reason: `${plan.dtype} has ${elem}-byte elements; byte-plane shuffle applies to 2- and 4-byte dtypes` };
  if (plan.data.length === 0) return { mode, applied: false, elem_bytes: elem, reason: "no raw pages (ProcessFork zstd blobs are kept as stored)" };
  if (mode === "off") return { mode, applied: false, elem_bytes: elem };
  if (mode === "on") return { mode, applied: true, elem_bytes: elem };
  // auto: compress a spread-out sample of non-zero pages both ways at zstd -3.
  // Candidates (tiles of whole elements, not declared zero) by number, without listing them all.
  const ok = (f: DataFile, i: number): boolean => f.tiles.len(i) % elem === 0 && !f.tiles.zero(i);
  let total = 0;
  for (const f of plan.data) for (let i = 0; i < f.tiles.length; i++) if (ok(f, i)) total++;
  let cf = 0;
  let ci = 0;
  let seen = 0;
  /** The k-th candidate (k not decreasing). */
  const nth = (k: number): { f: DataFile; t: { offset: number; len: number } } => {
    for (;;) {
      const f = plan.data[cf]!;
      if (ci >= f.tiles.length) {
        cf++;
        ci = 0;
        continue;
      }
      if (ok(f, ci)) {
        if (seen === k) return { f, t: { offset: f.tiles.offset(ci), len: f.tiles.len(ci) } };
        seen++;
      }
      ci++;
    }
  };
  const all = { length: total };
  const want = Math.min(all.length, SAMPLE_PAGES * 2);
  const plain: Buffer[] = [];
  const shuf: Buffer[] = [];
  let bytes = 0;
  for (let k = 0; k < want && plain.length < SAMPLE_PAGES && bytes < SAMPLE_MAX_BYTES; k++) {
    const { f, t } = nth(Math.floor((k * all.length) / want));
    const len = Math.min(t.len, SAMPLE_MAX_BYTES - bytes);
    const n = len - (len % elem);
    if (n === 0) break;
    const b = Buffer.alloc(n);
    let fh: FileHandle | undefined;
    try {
      fh = await open(f.abs, "r");
      await fh.read(b, 0, n, t.offset);
    } catch (e) {
      throw sourceError(e, f.abs);
    } finally {
      await fh?.close();
    }
    if (isAllZero(b)) continue;
    plain.push(b);
    shuf.push(shufflePlanes(b, elem));
    bytes += n;
  }
  if (plain.length === 0) return { mode, applied: false, elem_bytes: elem, reason: "no non-zero pages to sample" };
  const a = zstdCompressSync(Buffer.concat(plain), SAMPLE_LEVEL).length;
  const s = zstdCompressSync(Buffer.concat(shuf), SAMPLE_LEVEL).length;
  const saving = 1 - s / a;
  return {
    mode, applied: saving >= SHUFFLE_MIN_SAVING, elem_bytes: elem,
    sample: { pages: plain.length, bytes, zstd3_plain: a, zstd3_shuffled: s, saving_pct: Math.round(saving * 10000) / 100 },
  };
}

// ------------------------------------------------------------------------------ capture

function unchanged(abs: string, before: FileStats): () => Promise<void> {
  return async () => {
    let now: Stats;
    try {
      now = await stat(abs);
    } catch {
      throw sourceChanged(abs, "it was removed");
    }
    if (now.size !== before.size) throw sourceChanged(abs, `size ${before.size} → ${now.size}`);
    if (now.mtimeMs !== before.mtimeMs) throw sourceChanged(abs, "modified during capture");
  };
}

function verbatimArtifact(v: VerbatimFile, layer: string, redactor: Redactor | undefined, contents: KvIndexWriter): Artifact {
  const path = `files/${v.rel}`;
  return {
    path,
    kind: v.zst ? "kv-blob" : "file",
    size: v.stats.size,
    mode: v.stats.mode & 0o7777,
    mtime: v.stats.mtime,
    open: () => (async function* () {
      const scanner = redactor && v.scan ? new TextScanner(redactor, `${layer}/${path}`, true) : null;
      const hasher = v.zst ? new FrameHasher(v.zst.expectRaw !== null ? { maxOutput: v.zst.expectRaw } : {}) : null;
      const planned = v.planned === null ? null : createHash("sha256");
      let ended = false;
      try {
        // Streamed from disk (planning read it once, not kept: a dump's manifest grows with its pages).
        const src = createReadStream(v.abs, { start: 0, end: v.stats.size, highWaterMark: 1 << 20 });
        for await (const c of src as AsyncIterable<Buffer>) {
          planned?.update(c);
          await hasher?.push(c);
          await scanner?.push(c);
          yield c;
        }
        if (planned && planned.digest("hex") !== v.planned) throw sourceChanged(v.abs, "modified during capture");
        await scanner?.end();
        if (hasher && v.zst) {
          let d;
          try {
            d = await hasher.end();
          } catch (e) {
            if (isMemsnapError(e) && /exceeds the declared size/.test(e.message)) {
              throw kvInvalid(`kv: blob sha256:${v.zst.hex} (${v.zst.what}) decompresses to more than the ${v.zst.expectRaw} bytes of a page`, v.abs);
            }
            throw digestMismatch(`kv: blob sha256:${v.zst.hex} (${v.zst.what}) is not a valid zstd frame: ${(e as Error).message}`, v.abs);
          }
          ended = true;
          if (d.hex !== v.zst.hex) throw digestMismatch(`kv: blob sha256:${v.zst.hex} (${v.zst.what}) decompresses to content with digest sha256:${d.hex}`, v.abs);
          if (v.zst.expectRaw !== null && d.size !== v.zst.expectRaw) throw kvInvalid(`kv: blob sha256:${v.zst.hex} (${v.zst.what}) holds ${sizeWord(d.size)}, a page is ${v.zst.expectRaw}`, v.abs);
          if (contents.frame(d.hex) === undefined) contents.addFrame({ sha256: d.hex, bytes: d.size, zero: d.zero, artifact: path, encoding: "zstd" });
        }
      } catch (e) {
        if (isMemsnapError(e)) throw e;
        if ((e as NodeJS.ErrnoException).code === "ENOENT") throw sourceChanged(v.abs, "it was removed");
        throw sourceError(e, v.abs);
      } finally {
        if (!ended) hasher?.abort();
      }
    })(),
    check: unchanged(v.abs, v.stats),
  };
}

interface Counters {
  bytesStored: number;
}

/**
 * The artifacts of one data file's tiles, from its blocks as `blocks` reads them (ahead, and
 * with the native addon hashed off the main thread): an artifact per new distinct non-zero page.
 */
async function* dataArtifacts(f: DataFile, fileNo: number, plan: KvPlan, shuffle: ShuffleDecision, contents: KvIndexWriter, tiles: number[], counters: Counters,
  blocks: AsyncIterator<ReadBlock>, at: number): AsyncGenerator<Artifact> {
  let i = 0;
  while (i < f.tiles.length) {
    const next = await blocks.next();
    if (next.done || next.value.file !== at || next.value.first !== i) throw new MemsnapError("MEMSNAP_INTERNAL", `kv: the block reader lost its place in ${f.abs}`);
    const b = next.value;
    let off = 0;
    for (let k = 0; i < b.end; i++, k++) {
      const t = { offset: f.tiles.offset(i), len: f.tiles.len(i), label: f.tiles.label(i), sha: f.tiles.sha(i), zero: f.tiles.zero(i) };
      const page = b.bytes.subarray(off, off + t.len);
      off += t.len;
      // The dedup key is the binary digest (a 32-character latin1 string); hex only where needed.
      let hex: string | null = null;
      let key: string;
      const zero = b.zero ? b.zero[k] === 1 : isAllZero(page);
      if (zero) {
        hex = zeroPageSha(t.len);
        key = KvIndexWriter.key(hex);
      } else {
        key = b.digests ? b.digests.toString("latin1", 32 * k, 32 * k + 32) : createHash("sha256").update(page).digest("binary");
      }
      const hexOf = (): string => (hex ??= Buffer.from(key, "latin1").toString("hex"));
      if (t.sha !== null && t.sha !== hexOf()) {
        throw digestMismatch(`kv: page ${t.label} (${f.rel} at offset ${t.offset}) hashes to sha256:${hexOf()}, but the dump's manifest says sha256:${t.sha}`, f.abs);
      }
      if (t.zero && !zero) throw digestMismatch(`kv: page ${t.label} (${f.rel} at offset ${t.offset}) is marked zero but holds non-zero bytes`, f.abs);
      let idx = contents.raw(key);
      if (idx === undefined) {
        const sha = hexOf();
        if (zero) {
          idx = contents.addRaw(key, { sha256: sha, bytes: t.len, zero: true, artifact: null });
        } else {
          const elem = shuffle.applied && t.len % plan.elem === 0 ? plan.elem : 1;
          const body = elem > 1 ? shufflePlanes(page, elem) : page;
          // An unshuffled page carries the place of this first occurrence: restore writes
          // it straight there instead of spooling it and copying it into place afterwards.
          const path = pageArtifact(sha, elem, elem === 1 ? { file: fileNo, offset: t.offset } : undefined);
          idx = contents.addRaw(key, { sha256: sha, bytes: t.len, zero: false, artifact: path });
          counters.bytesStored += body.length;
          yield {
            path, kind: "kv-page", size: body.length, mode: 0o644, mtime: f.stats.mtime,
            // A plain array, not a Readable: one stream object per page was most of the
            // capture's garbage (53k pages of 8 KiB: peak RSS 286 → 246 MiB).
            open: () => [body],
            // An unshuffled page is yielded from the very bytes just hashed: no second hash.
            ...(elem === 1 ? { sha256: sha } : {}),
            // Its bytes are a function of the page's digest and the shuffle alone.
            fingerprint: elem === 1 ? kvPageFingerprint(sha, t.len) : `kv-page:${sha}:${elem}:${t.len}`,
          };
        }
      }
      tiles.push(idx);
      contents.addLabel(t.label, idx);
    }
  }
  await unchanged(f.abs, f.stats)();
}

/** Restore: tiles are gathered into one buffer of this size and written with one call. */
const WRITE_BATCH = 4 * 1024 * 1024;

const zeroShas = new Map<number, string>();
/** SHA-256 of `len` zero bytes (cached per length). */
function zeroPageSha(len: number): string {
  let h = zeroShas.get(len);
  if (h === undefined) zeroShas.set(len, (h = createHash("sha256").update(Buffer.alloc(len)).digest("hex")));
  return h;
}

// ------------------------------------------------------------------------------ restore

/** Layers already materialized in this process (restore may call materialize twice). */
const materialized = new WeakMap<LayerEntry, Set<string>>();

const UNSAFE_HINT = "the bundle's KV layer asks for what no KV dump has: do not restore it";

function restoreBad(msg: string, path: string): MemsnapError {
  return new MemsnapError("MEMSNAP_ARTIFACT_HASH_MISMATCH", msg, { path, hint: "the bundle's KV layer is damaged; use another copy" });
}

function writeFully(fd: number, buf: Buffer, len: number, pos: number): void {
  let off = 0;
  while (off < len) off += writeSync(fd, buf, off, len - off, pos + off);
}

function readFully(fd: number, dst: Buffer, pos: number, where: string): void {
  let got = 0;
  while (got < dst.length) {
    const r = readSync(fd, dst, got, dst.length - got, pos + got);
    if (r === 0) throw restoreBad(`${where}: the page spool is short`, where);
    got += r;
  }
}

/** Part files kept open at once while rebuilding (a part is reopened after eviction). */
const OPEN_PARTS = 16;

/**
 * The extraction spool of a layer (see SourceKind.restoreSpool), as slots: where each spooled
 * artifact's bytes are (offset, length, and the part file, or -1 for the spool file), and the
 * part files holding placed pages, each renamed to the data file it became once built.
 */
class SpoolReader {
  /** Spooled artifact (layer path) → slot. */
  readonly slots = new Map<string, number>();
  readonly off = new Grow((n) => new Float64Array(n));
  readonly len = new Grow((n) => new Float64Array(n));
  readonly part = new Grow((n) => new Int32Array(n));
  readonly #src: string;
  #fd: number | null = null;
  readonly #parts = new FdCache<number>(OPEN_PARTS);
  /** Part file → where it is now (its spool name, or the rebuilt file it was renamed to). */
  readonly partPath = new Map<number, string>();

  constructor(src: string, names: string[]) {
    this.#src = src;
    for (const n of names) {
      const m = /^\.memsnap-spool-(0|[1-9][0-9]{0,8})$/.exec(n);
      if (m) this.partPath.set(Number(m[1]), join(src, n));
    }
  }

  /** Read the map written on extraction (a later entry for a name replaces an earlier one, as the JSON map did). */
  async load(path: string, layer: string): Promise<void> {
    try {
      for await (const [rel, at] of readSpoolMap(path)) {
        const k = this.off.push(at[0]);
        this.len.push(at[1]);
        this.part.push(at.length === 3 ? at[2] : -1);
        this.slots.set(rel, k);
      }
    } catch {
      throw restoreBad(`${layer}: the page spool map is damaged`, layer);
    }
  }

  fd(slot: number): number {
    const file = this.part.a[slot]!;
    if (file < 0) return (this.#fd ??= openSync(join(this.#src, SPOOL_FILE), "r"));
    return this.#parts.get(file, () => {
      const path = this.partPath.get(file);
      if (path === undefined) throw restoreBad(`the page spool has no part ${file}`, SPOOL_FILE);
      return openSync(path, "r");
    });
  }

  close(): void {
    if (this.#fd !== null) closeSync(this.#fd);
    this.#fd = null;
    this.#parts.closeAll();
  }
}

/** SHA-256 (hex) of a file, streamed; null when it cannot be read. */
async function sha256File(path: string): Promise<string | null> {
  try {
    const h = createHash("sha256");
    for await (const c of createReadStream(path, { highWaterMark: 1 << 20 })) h.update(c as Buffer);
    return h.digest("hex");
  } catch {
    return null;
  }
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
async function materializeKv(dir: string, layer: LayerEntry, verified?: VerifiedLookup): Promise<void> {
  const done = materialized.get(layer) ?? new Set<string>();
  if (done.has(dir)) return;
  const idxAbs = join(dir, KV_INDEX);
  const have = await sha256File(idxAbs);
  const want = layer.meta?.index_sha256;
  // The index must be the one the (sealed) layer meta names: with any other, or none, the
  // staged artifacts would be left as the dump.
  if (have === null) throw restoreBad(`${layer.name}: the layer has no ${KV_INDEX}`, `${layer.name}/${KV_INDEX}`);
  if (have !== want) {
    throw restoreBad(`${layer.name}/${KV_INDEX} hashes to sha256:${have}, the layer's index_sha256 is ${JSON.stringify(want ?? null)}`, `${layer.name}/${KV_INDEX}`);
  }
  const declared = layer.meta?.bytes_total;
  if (!Number.isSafeInteger(declared) || (declared as number) < 0) {
    throw new MemsnapError("MEMSNAP_UNSAFE_BUNDLE", `${layer.name}: the layer meta's bytes_total ${JSON.stringify(declared ?? null)} is not a byte count`, { path: layer.name, hint: UNSAFE_HINT });
  }
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

  // The contents, compactly: per content its bytes, zero flag, shuffle element (1 raw page,
  // 2/4 shuffled, 0 not a page), spool slot (-1: none) and digest; the artifact path itself
  // only for a content not in the spool (a verbatim zstd blob, or a page missing from it).
  const cBytes = new Grow((n) => new Float64Array(n));
  const cZero = new Grow((n) => new Uint8Array(n));
  const cElem = new Grow((n) => new Uint8Array(n));
  const cSlot = new Grow((n) => new Int32Array(n));
  let cSha = Buffer.alloc(32 * 1024);
  const cArt = new Map<number, string>();
  const files: KvIndexFile[] = [];
  const hexOf = (ci: number): string => cSha.toString("hex", 32 * ci, 32 * ci + 32);
  /** The content's artifact path, as the index named it: kept, or told from its digest, shuffle and slot. */
  const artifactOf = (ci: number): string | null => {
    const kept = cArt.get(ci);
    if (kept !== undefined) return kept;
    const slot = cSlot.a[ci]!;
    if (slot < 0) return null;
    const elem = cElem.a[ci]!;
    const file = spool!.part.a[slot]!;
    return pageArtifact(hexOf(ci), elem, elem === 1 && file >= 0 ? { file, offset: spool!.off.a[slot]! } : undefined);
  };
  let dataBytes: number;
  try {
    ({ dataBytes } = await readKvIndex(createReadStream(join(src, KV_INDEX), { highWaterMark: 1 << 20 }) as AsyncIterable<Buffer>, {
      content: (c, i) => {
        cBytes.push(c.bytes);
        cZero.push(c.zero ? 1 : 0);
        const m = c.artifact ? PAGE_ARTIFACT_RE.exec(c.artifact) : null;
        cElem.push(m && m[1] === c.sha256 ? (m[2] ? Number(m[2]) : 1) : 0);
        const slot = c.artifact !== null ? spool?.slots.get(c.artifact) : undefined;
        cSlot.push(slot ?? -1);
        if (cSha.length < 32 * (i + 1)) {
          const b = Buffer.alloc(cSha.length * 2);
          cSha.copy(b);
          cSha = b;
        }
        cSha.write(c.sha256, 32 * i, "hex");
        // Kept whenever the name cannot be told from the digest and the slot (a damaged map).
        if (c.artifact !== null && (slot === undefined || artifactOf(i) !== c.artifact)) cArt.set(i, c.artifact);
      },
      file: (f) => { files.push(f); },
    }));
  } catch (e) {
    spool?.close();
    if (e instanceof KvIndexUnsafe) throw new MemsnapError(e.code, `${layer.name}/${KV_INDEX}: ${e.message}`, { path: `${layer.name}/${KV_INDEX}`, hint: UNSAFE_HINT });
    throw restoreBad(`${layer.name}/${KV_INDEX}: ${(e as Error).message}`, `${layer.name}/${KV_INDEX}`);
  }
  // The data files are no bigger than the pages the layer declares (bytes_total counts every
  // page, each data file's tiles are some of them): nothing is written past what it says.
  if (dataBytes > (declared as number)) {
    spool?.close();
    throw new MemsnapError("MEMSNAP_UNSAFE_BUNDLE", `${layer.name}/${KV_INDEX}: its data files hold ${dataBytes} bytes, the layer declares ${declared as number} (bytes_total)`, {
      path: `${layer.name}/${KV_INDEX}`, hint: UNSAFE_HINT,
    });
  }
  // The index and map were read in 1 MiB / 64 KiB chunks, garbage now: free them before the rebuild.
  collectNow("minor");

  // Placed pages by part file: offset → slot, and how many were placed there (two at one
  // offset leave one in the map: the count tells them apart).
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
  const umask = currentUmask();
  const zeroBufs = new Map<number, Buffer>();
  const cache = new Map<number, Buffer>();
  /** Contents whose bytes were already checked against their SHA-256 in this rebuild. */
  const checked = new Uint8Array(cBytes.length);
  const pageWhere = (ci: number): { elem: number; where: string } => {
    const art = artifactOf(ci);
    const elem = cElem.a[ci]!;
    if (art === null || elem === 0) throw restoreBad(`${layer.name}: content ${hexOf(ci)} has no page artifact`, layer.name);
    return { elem, where: `${layer.name}/${art}` };
  };
  const isVerified = (ci: number, where: string): boolean => verified?.get(where) === hexOf(ci);
  /** Check bytes read for content `ci` (once per content: extraction hashed most already). */
  const check = (ci: number, bytes: Buffer, where: string): void => {
    if (checked[ci] === 1) return;
    if (bytes.length !== cBytes.a[ci] || (!isVerified(ci, where) && createHash("sha256").update(bytes).digest().compare(cSha, 32 * ci, 32 * ci + 32) !== 0)) {
      throw restoreBad(`${where}: page does not hash to its name`, where);
    }
    checked[ci] = 1;
  };
  const pageBytes = (ci: number): Buffer => {
    const bytes = cBytes.a[ci]!;
    if (cZero.a[ci] === 1) {
      let z = zeroBufs.get(bytes);
      if (!z) zeroBufs.set(bytes, (z = Buffer.alloc(bytes)));
      return z;
    }
    const hit = cache.get(ci);
    if (hit) return hit;
    const { elem, where } = pageWhere(ci);
    // Synchronous: one small page at a time, and nothing else runs meanwhile; an async read
    // per page costs three thread-pool round trips (measured: the rebuild ran at ~45 MB/s).
    let b: Buffer;
    const slot = cSlot.a[ci]!;
    if (slot >= 0) {
      b = Buffer.allocUnsafe(spool!.len.a[slot]!);
      readFully(spool!.fd(slot), b, spool!.off.a[slot]!, where);
    } else {
      try {
        b = readFileSync(join(src, ...artifactOf(ci)!.split("/")));
      } catch {
        throw restoreBad(`${where} is missing from the bundle`, where);
      }
    }
    if (elem > 1) {
      b = unshuffle(b, elem);
      if (b.length !== bytes || sha256Hex(b) !== hexOf(ci)) throw restoreBad(`${where}: page does not hash to its name after un-shuffling`, where);
    } else {
      check(ci, b, where);
    }
    if (cache.size >= 64) cache.delete(cache.keys().next().value!);
    cache.set(ci, b);
    return b;
  };
  /** Put content `ci`'s original bytes into `dst` (its exact length). */
  const fillTile = (ci: number, dst: Buffer): void => {
    const slot = cSlot.a[ci]!;
    if (cZero.a[ci] === 1 || cElem.a[ci] !== 1 || slot < 0 || spool!.len.a[slot] !== cBytes.a[ci]) {
      pageBytes(ci).copy(dst);
      return;
    }
    // An unshuffled page in the spool or in place elsewhere: read it straight into place.
    const where = `${layer.name}/${artifactOf(ci)!}`;
    readFully(spool!.fd(slot), dst, spool!.off.a[slot]!, where);
    check(ci, dst, where);
  };
  const batch = Buffer.allocUnsafe(WRITE_BATCH);
  try {
    for (const [fileNo, f] of files.entries()) {
      const target = join(dir, ...f.path.split("/"));
      await mkdir(dirname(target), { recursive: true });
      const here = placed.get(fileNo);
      if (f.tiles) {
        const cannot = (e: unknown): MemsnapError => new MemsnapError("MEMSNAP_UNSAFE_PATH", `${layer.name}: cannot create ${f.path} (${(e as Error).message})`, { path: f.path });
        let fd: number;
        if (here) {
          // The spool part that holds this file's placed pages becomes the file.
          if (await lstat(target).then(() => true, () => false)) throw cannot(new Error("it already exists"));
          const part = spool!.partPath.get(fileNo);
          if (part === undefined) throw restoreBad(`${layer.name}: the page spool has no part ${fileNo}`, layer.name);
          await rename(part, target).catch((e: unknown) => { throw cannot(e); });
          spool!.partPath.set(fileNo, target);
          // Its own descriptor: the spool's may be closed by a read from other parts.
          fd = openSync(target, "r+");
        } else {
          try {
            fd = openSync(target, "wx", 0o600);
          } catch (e) {
            throw cannot(e);
          }
        }
        let n = 0;
        let matched = 0;
        try {
          ftruncateSync(fd, f.bytes);
          // Tiles to write are laid into one batch buffer and written a run at a time; a page
          // already in place, and a zero tile (a hole), end the run.
          let used = 0;
          let runAt = 0;
          const flush = (): void => {
            if (used > 0) writeFully(fd, batch, used, runAt);
            used = 0;
          };
          for (const ci of f.tiles) {
            const len = cBytes.a[ci]!;
            const p = here?.get(n);
            if (p !== undefined) {
              if (p !== cSlot.a[ci] || spool!.len.a[p] !== len) {
                const where = `${layer.name}/${await spoolName(p)}`;
                throw restoreBad(`${where}: placed at byte ${n} of ${f.path}, where the index has another page`, where);
              }
              const where = `${layer.name}/${artifactOf(ci)!}`;
              matched++;
              if (checked[ci] !== 1) {
                if (isVerified(ci, where)) checked[ci] = 1;
                else fillTile(ci, Buffer.allocUnsafe(len)); // reads and checks the bytes in place
              }
              flush();
            } else if (cZero.a[ci] === 1) {
              flush();
            } else {
              if (used > 0 && used + len > batch.length) flush();
              if (used === 0) runAt = n;
              if (len > batch.length) {
                const big = Buffer.allocUnsafe(len);
                fillTile(ci, big);
                writeFully(fd, big, len, n);
              } else {
                fillTile(ci, batch.subarray(used, used + len));
                used += len;
              }
            }
            n += len;
          }
          flush();
        } finally {
          closeSync(fd);
        }
        if (n !== f.bytes) throw restoreBad(`${layer.name}/${f.path}: rebuilt ${n} bytes, the index says ${f.bytes}`, f.path);
        if (here && matched !== placedCount.get(fileNo)) throw restoreBad(`${layer.name}/${f.path}: a page is placed off the file's tiles`, f.path);
      } else {
        if (here) throw restoreBad(`${layer.name}: pages are placed in ${f.path}, which has no tiles`, f.path);
        const from = join(src, ...f.artifact!.split("/"));
        const st = await stat(from).catch(() => null);
        if (!st || st.size !== f.bytes) throw restoreBad(`${layer.name}/${f.artifact!} is missing or has the wrong size`, f.artifact!);
        await rename(from, target);
      }
      await chmod(target, restoredMode(f.mode, umask)); // never setuid, setgid or sticky; within the umask
      const t = new Date(f.mtime);
      if (!Number.isNaN(t.getTime())) await utimes(target, t, t);
    }
    for (const fileNo of placed.keys()) {
      if (!files[fileNo]?.tiles) throw restoreBad(`${layer.name}: pages are placed in file ${fileNo}, which the index does not have`, layer.name);
    }
  } finally {
    spool?.close();
  }
  await rm(src, { recursive: true, force: true });
  done.add(dir);
  materialized.set(layer, done);

  /** The name a spool slot was written under (for a message: slot k is the map's line k). */
  async function spoolName(slot: number): Promise<string> {
    let k = 0;
    for await (const [rel] of readSpoolMap(join(src, SPOOL_MAP))) if (k++ === slot) return rel;
    return "?";
  }
}

async function collect(it: AsyncIterable<Buffer>, limit: number): Promise<Buffer | null> {
  const parts: Buffer[] = [];
  let n = 0;
  for await (const c of it) {
    n += c.length;
    if (n > limit) return null;
    parts.push(c);
  }
  return Buffer.concat(parts);
}

// ------------------------------------------------------------------------------ the source

const SHAPE_KEYS = ["n_layers", "n_kv_heads", "head_dim", "dtype", "block_size", "tokens_per_chunk"];

function parseShape(raw: unknown, where: string): KvShape {
  const w = `${where}: shape`;
  if (!isPlainObject(raw)) throw configInvalid(where, '"shape" must be an object {n_layers, n_kv_heads, head_dim, dtype, block_size, tokens_per_chunk}');
  rejectUnknownKeys(raw, SHAPE_KEYS, w);
  const int = (k: string, def?: number): number => {
    const v = raw[k] ?? def;
    if (!Number.isSafeInteger(v) || (v as number) < 1 || (v as number) > 1 << 20) throw configInvalid(w, `"${k}" must be an integer from 1 to ${1 << 20}`);
    return v as number;
  };
  const dtype = reqString(raw, "dtype", w);
  if (dtypeBytes(dtype) === null) throw configInvalid(w, `"dtype" must be bf16, f16, f32 or fp8e4m3, got ${JSON.stringify(dtype)}`);
  return {
    n_layers: int("n_layers"), n_kv_heads: int("n_kv_heads"), head_dim: int("head_dim"), dtype,
    block_size: int("block_size", 16), tokens_per_chunk: int("tokens_per_chunk", 256),
  };
}

export const kvSource: SourceKind<KvConfig> = {
  kind: "kv",
  // 2: unshuffled pages are named with the place of their first occurrence (pages/<sha>@<file>.<offset>).
  schemaVersion: 2,
  // Pages are named by their digest and deduplicated by it; files by their unique paths.
  distinctPaths: true,
  parseConfig(raw, where) {
    rejectUnknownKeys(raw, ["kind", "name", "path", "format", "shape", "shuffle"], where);
    const format = optString(raw, "format", where);
    if (format !== undefined && !["memsnap", "pfimg-paged", "lmcache"].includes(format)) {
      throw configInvalid(where, `"format" must be "memsnap", "pfimg-paged" or "lmcache", got ${JSON.stringify(format)}`);
    }
    const shuffle = optString(raw, "shuffle", where);
    if (shuffle !== undefined && !["auto", "on", "off"].includes(shuffle)) throw configInvalid(where, `"shuffle" must be "auto", "on" or "off", got ${JSON.stringify(shuffle)}`);
    const shape = raw.shape === undefined ? undefined : parseShape(raw.shape, where);
    if (format === "lmcache" && !shape) throw configInvalid(where, '"format": "lmcache" needs "shape" {n_layers, n_kv_heads, head_dim, dtype, block_size, tokens_per_chunk} (chunk files are headerless)');
    return {
      kind: "kv",
      name: reqString(raw, "name", where),
      path: reqString(raw, "path", where),
      ...(format !== undefined ? { format: format as Format } : {}),
      ...(shape ? { shape } : {}),
      ...(shuffle !== undefined ? { shuffle: shuffle as "auto" | "on" | "off" } : {}),
    };
  },
  async liveTarget(cfg, baseDir, layer) {
    // The dump directory is rebuilt whole in staging (materialize) and swapped in whole. A
    // ProcessFork page manifest sits in a store other images share: not replaced in place.
    if (layer.meta?.format === "pfimg-paged") {
      throw new MemsnapError("MEMSNAP_USAGE", `layer ${layer.name}: a kv layer of a ProcessFork page manifest cannot be restored in place (its store holds other images)`, {
        hint: "restore it with --to DIR, or leave it out with --only",
      });
    }
    return { root: resolve(baseDir, cfg.path), mode: "dir" };
  },
  async capture(cfg, ctx) {
    const pathAbs = resolve(ctx.baseDir, cfg.path);
    const { format, target } = await detect(pathAbs, cfg);
    if (format === "lmcache" && !cfg.shape) throw kvInvalid(`kv: LMCache chunks at ${pathAbs} need the shape in the config`, pathAbs);
    const plan = format === "memsnap" ? await planMemsnap(target, cfg)
      : format === "pfimg-paged" ? await planPfimgPaged(target, cfg)
        : await planLmcache(target, cfg);
    const shuffle = await decideShuffle(plan, cfg.shuffle ?? "auto");
    const contents = new KvIndexWriter(ctx.tmpDir, randomBytes(6).toString("hex"));
    const files: KvIndexFile[] = [];
    const counters: Counters = { bytesStored: 0 };
    let indexHex = "";
    const layer = cfg.name;
    const fileEntry = (rel: string, st: FileStats): Omit<KvIndexFile, "artifact" | "tiles"> => ({
      path: rel, bytes: st.size, mode: st.mode & 0o7777, mtime: st.mtime.toISOString(),
    });
    return {
      estimatedBytes: plan.data.reduce((n, f) => n + f.stats.size, 0) + plan.verbatim.reduce((n, v) => n + v.stats.size, 0),
      artifacts: (async function* (): AsyncGenerator<Artifact> {
        for (const v of plan.verbatim) {
          files.push({ ...fileEntry(v.rel, v.stats), artifact: `files/${v.rel}` });
          if (v.zst) counters.bytesStored += v.stats.size;
          yield verbatimArtifact(v, layer, ctx.redactor, contents);
        }
        const blocks = readBlocks(plan.data, ctx.signal);
        try {
          for (const [at, f] of plan.data.entries()) {
            const tiles: number[] = [];
            yield* dataArtifacts(f, files.length, plan, shuffle, contents, tiles, counters, blocks, at);
            files.push({ ...fileEntry(f.rel, f.stats), tiles });
          }
        } finally {
          await blocks.return(undefined);
        }
        for (const [label, hex] of plan.framePages) contents.addLabel(label, contents.frame(hex)!);
        for (const [label, hex] of (plan.meta.extra_labels as [string, string][] | undefined) ?? []) contents.addLabel(label, contents.raw(KvIndexWriter.key(hex))!);
        delete plan.meta.extra_labels;
        const doc = contents.finish(
          { source_format: plan.format, dtype: plan.dtype, page_bytes: plan.pageBytes, shuffle: { applied: shuffle.applied, elem_bytes: plan.elem } },
          files, (hex) => { indexHex = hex; },
        );
        yield { path: KV_INDEX, kind: "json", size: doc.size, mode: 0o644, mtime: new Date(), open: doc.open };
      })(),
      finish: async () => {
        const st = contents.stats;
        return {
          format: plan.format,
          root: plan.root,
          ...plan.meta,
          dtype: plan.dtype,
          page_bytes: plan.pageBytes,
          files: { data: plan.data.length, verbatim: plan.verbatim.length },
          pages_total: st.pages_total,
          pages_unique: st.pages_unique,
          pages_zero: st.pages_zero,
          dedup_ratio: Math.round((st.pages_total / Math.max(1, st.pages_unique)) * 1000) / 1000,
          bytes_total: st.bytes_total,
          bytes_stored: counters.bytesStored,
          shuffle,
          index_sha256: indexHex,
        };
      },
      cleanup: async () => {
        contents.close();
      },
    };
  },
  async deepVerify({ entry, bytes }) {
    const rel = entry.path.startsWith(`${entry.layer}/`) ? entry.path.slice(entry.layer.length + 1) : entry.path;
    const pm = PAGE_ARTIFACT_RE.exec(rel);
    if (pm) {
      const buf = await collect(bytes, KV_MAX_PAGE_BYTES);
      if (buf === null) return `${entry.path}: page over ${KV_MAX_PAGE_BYTES} bytes`;
      const elem = pm[2] ? Number(pm[2]) : 1;
      if (buf.length % elem !== 0) return `${entry.path}: ${buf.length} bytes is not a whole number of ${elem}-byte elements`;
      const h = sha256Hex(elem > 1 ? unshuffle(buf, elem) : buf);
      return h === pm[1] ? null : `${entry.path}: page hashes to sha256:${h}${elem > 1 ? " after un-shuffling" : ""}, not the digest in its name`;
    }
    if (rel === KV_INDEX) {
      // Read as it streams (bounded memory); on a finding, the rest is still drained.
      const it = bytes[Symbol.asyncIterator]();
      const feed: AsyncIterable<Buffer> = { [Symbol.asyncIterator]: () => ({ next: () => it.next() }) };
      try {
        await readKvIndex(feed, {});
        return null;
      } catch (e) {
        while (!(await it.next()).done) { /* drain */ }
        return `${entry.path}: ${(e as Error).message}`;
      }
    }
    const zm = /(?:^|\/)blobs\/sha256\/([0-9a-f]{2})\/([0-9a-f]{64})\.zst$/.exec(rel);
    if (rel.startsWith("files/") && zm) {
      try {
        const d = await hashFrameChunks(bytes);
        return d.hex === zm[2] ? null : `${entry.path}: blob decompresses to sha256:${d.hex}, not the digest in its name`;
      } catch (e) {
        return `${entry.path}: blob is not a valid zstd frame (${(e as Error).message})`;
      }
    }
    if (rel === `files/${KV_MANIFEST}`) {
      const it = bytes[Symbol.asyncIterator]();
      let n = 0;
      const feed: AsyncIterable<Buffer> = {
        [Symbol.asyncIterator]: () => ({
          next: async () => {
            const r = await it.next();
            if (!r.done && (n += r.value.length) > KV_MANIFEST_MAX_BYTES) throw new Error(`over ${KV_MANIFEST_MAX_BYTES} bytes`);
            return r;
          },
        }),
      };
      try {
        await readKvManifest(feed, entry.path);
        return null;
      } catch (e) {
        while (!(await it.next()).done) { /* drain */ }
        return `${entry.path}: ${(e as Error).message}`;
      }
    }
    if (!rel.startsWith("files/")) return `${entry.path}: not a kv layer path (pages/…, files/…, ${KV_INDEX})`;
    return null;
  },
  materialize: materializeKv,
  // Pages go to the spool on restore, read back by materializeKv: no file per page. A page
  // with a place goes straight to it, in the spool part of its data file.
  restoreSpool: (rel: string) => (rel.startsWith("pages/") ? pagePlace(rel) ?? true : false),
};
