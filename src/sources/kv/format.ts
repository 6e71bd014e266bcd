/**
 * The memsnap KV dump format (docs/FORMAT.md "KV dump format") and the `kv` layer's
 * bundle-side index: parsing and validating `kv-manifest.json`, the byte-plane shuffle, and
 * the `kv-index.json` document.
 */
import { createHash } from "node:crypto";
import { MemsnapError } from "../../errors.js";
import { JsonStreamError, streamJson } from "../../util/json-stream.js";
import { dtypeBytes, field, isObject, posInt } from "../pfimg/format.js";

export const KV_MANIFEST = "kv-manifest.json";
export const KV_INDEX = "kv-index.json";
export const KV_DUMP_FORMAT = "memsnap-kv-dump";
export const KV_INDEX_FORMAT = "memsnap-kv-index";
/** Pages larger than this are refused (a page is held in memory while it is hashed). */
export const KV_MAX_PAGE_BYTES = 64 * 1024 * 1024;
/** kv-manifest.json larger than this is refused. */
export const KV_MANIFEST_MAX_BYTES = 512 * 1024 * 1024;

function invalid(msg: string, path?: string): MemsnapError {
  return new MemsnapError("MEMSNAP_SOURCE_INVALID", msg, {
    ...(path ? { path } : {}), hint: "fix the KV dump (see docs/FORMAT.md \"KV dump format\") or the kv source's format/shape in memsnap.json",
  });
}
export { invalid as kvInvalid };

/** A relative POSIX path of plain segments (no `..`, `.`, empty, absolute, backslash or NUL). */
export function safeRel(p: unknown): p is string {
  if (typeof p !== "string" || p === "" || p.startsWith("/") || p.includes("\\") || p.includes("\0")) return false;
  return p.split("/").every((s) => s !== "" && s !== "." && s !== "..");
}

/** Growable typed array. */
export class Grow<T extends Float64Array | Int32Array | Uint8Array> {
  a: T;
  length = 0;
  constructor(private readonly make: (n: number) => T) {
    this.a = make(1024);
  }
  push(v: number): number {
    if (this.length === this.a.length) {
      const b = this.make(this.a.length * 2);
      b.set(this.a);
      this.a = b;
    }
    this.a[this.length] = v;
    return this.length++;
  }
}

/**
 * The pages of a dump manifest, column by column (a few dozen bytes per page, where parsed
 * objects took several hundred): page `i` is `layer[i]`, `block[i]`, data file `file[i]` (an
 * index into the manifest's `dataFiles`), `offset[i]`, `zero[i]` and, when `hasSha[i]`, its
 * declared digest at bytes `32 i` of `sha`.
 */
export class KvDumpPages {
  readonly layer = new Grow((n) => new Float64Array(n));
  readonly block = new Grow((n) => new Float64Array(n));
  readonly file = new Grow((n) => new Int32Array(n));
  readonly offset = new Grow((n) => new Float64Array(n));
  readonly zero = new Grow((n) => new Uint8Array(n));
  readonly hasSha = new Grow((n) => new Uint8Array(n));
  sha = Buffer.alloc(32 * 1024);

  get count(): number {
    return this.layer.length;
  }

  push(layer: number, block: number, file: number, offset: number, zero: boolean, sha: string | null): void {
    const i = this.layer.push(layer);
    this.block.push(block);
    this.file.push(file);
    this.offset.push(offset);
    this.zero.push(zero ? 1 : 0);
    this.hasSha.push(sha === null ? 0 : 1);
    if (sha !== null) {
      if (this.sha.length < 32 * (i + 1)) {
        const b = Buffer.alloc(this.sha.length * 2);
        this.sha.copy(b);
        this.sha = b;
      }
      this.sha.write(sha, 32 * i, "hex");
    }
  }

  /** Declared digest of page `i` (lowercase hex), or null. */
  shaOf(i: number): string | null {
    return this.hasSha.a[i] === 1 ? this.sha.toString("hex", 32 * i, 32 * i + 32) : null;
  }

  label(i: number): string {
    return `L${this.layer.a[i]!}/B${this.block.a[i]!}`;
  }
}

export interface KvDumpManifest {
  engine: unknown;
  nLayers: number;
  nKvHeads: number;
  headDim: number;
  dtype: string;
  blockSize: number;
  pageBytes: number;
  dataFiles: { path: string; bytes: number | null }[];
  pages: KvDumpPages;
  sequences: { seqId: string; blocks: number[] }[];
}

/**
 * Read and validate `kv-manifest.json` as it streams: dimensions, page shape and bytes, safe
 * data file paths, page placement (aligned, inside the file list), and sequences naming known
 * blocks. Whether data files are exactly tiled by their pages is checked against their sizes
 * by the caller. The pages are kept column by column ({@link KvDumpPages}), never as the
 * document's text or as objects, so memory stays small for dumps of millions of pages; the
 * findings are those, in the order, of checking the parsed document member by member.
 * Throws MEMSNAP_SOURCE_INVALID.
 */
export async function readKvManifest(chunks: AsyncIterable<Uint8Array> | Iterable<Uint8Array>, path: string): Promise<KvDumpManifest> {
  const where = `kv: ${path}`;
  const pages = new KvDumpPages();
  // Data files as the pages name them, in order of first mention (reconciled with data_files at the end).
  const named = new Map<string, number>();
  const namedList: string[] = [];
  /** The first problem a page has on its own (its index and message); later pages are still read. */
  let early: { i: number; msg: string } | null = null;
  const onPage = (p: unknown, i: number): void => {
    if (early) return;
    const bad = (msg: string): void => { early = { i, msg }; };
    if (!isObject(p)) return bad(`${where}: pages[${i}] is not an object`);
    const layer = p.layer;
    const block = p.block;
    if (!Number.isSafeInteger(layer) || (layer as number) < 0) return bad(`${where}: pages[${i}].layer ${JSON.stringify(layer)} is not in 0..`);
    if (!Number.isSafeInteger(block) || (block as number) < 0) return bad(`${where}: pages[${i}].block ${JSON.stringify(block)} is not a non-negative integer`);
    if (!safeRel(p.file)) return bad(`${where}: pages[${i}].file ${JSON.stringify(p.file)} is not a safe relative path`);
    if (p.file === KV_MANIFEST) return bad(`${where}: pages[${i}] points into ${KV_MANIFEST}`);
    const offset = p.offset ?? 0;
    if (!Number.isSafeInteger(offset) || (offset as number) < 0) return bad(`${where}: pages[${i}].offset ${JSON.stringify(p.offset)} is not a multiple of the page size`);
    const sha = p.sha256 ?? "";
    if (typeof sha !== "string" || (sha !== "" && !/^(sha256:)?[0-9a-fA-F]{64}$/.test(sha))) return bad(`${where}: pages[${i}].sha256 ${JSON.stringify(sha)} is not a hex SHA-256 (or "")`);
    const zero = p.zero ?? false;
    if (typeof zero !== "boolean") return bad(`${where}: pages[${i}].zero must be true or false`);
    let f = named.get(p.file);
    if (f === undefined) {
      f = namedList.push(p.file) - 1;
      named.set(p.file, f);
    }
    pages.push(layer as number, block as number, f, offset as number, zero, sha ? sha.replace(/^sha256:/, "").toLowerCase() : null);
  };
  let doc: Record<string, unknown>;
  try {
    doc = await streamJson(chunks, { arrays: { pages: onPage } });
  } catch (e) {
    if (e instanceof JsonStreamError) throw invalid(`${where} is not valid JSON: ${e.message}`, path);
    throw e;
  }
  if (doc.format !== KV_DUMP_FORMAT) throw invalid(`${where}: format is ${JSON.stringify(doc.format)}, expected "${KV_DUMP_FORMAT}"`, path);
  if (doc.format_version !== 1) throw invalid(`${where}: format_version ${JSON.stringify(doc.format_version)}; this memsnap reads 1`, path);
  const model = doc.model;
  const nLayers = posInt(field(model, "n_layers"));
  const nKvHeads = posInt(field(model, "n_kv_heads"));
  const headDim = posInt(field(model, "head_dim"));
  if (!nLayers || !nKvHeads || !headDim) throw invalid(`${where}: model.n_layers, model.n_kv_heads and model.head_dim must be positive integers`, path);
  const dtype = typeof doc.dtype === "string" ? doc.dtype : "";
  const eb = dtypeBytes(dtype);
  if (!eb) throw invalid(`${where}: unknown dtype ${JSON.stringify(doc.dtype)} (bf16, f16, f32, fp8e4m3)`, path);
  const blockSize = posInt(doc.block_size);
  if (!blockSize) throw invalid(`${where}: block_size must be a positive integer`, path);
  const pageBytes = 2 * blockSize * nKvHeads * headDim * eb;
  const page = doc.page;
  if (!isObject(page)) throw invalid(`${where}: page must be an object {shape, bytes}`, path);
  const shape = page.shape;
  const wantShape = [2, blockSize, nKvHeads, headDim];
  if (!Array.isArray(shape) || shape.length !== 4 || shape.some((v, i) => v !== wantShape[i])) {
    throw invalid(`${where}: page.shape ${JSON.stringify(shape)} does not match [2, block_size, n_kv_heads, head_dim] = ${JSON.stringify(wantShape)}`, path);
  }
  if (page.bytes !== pageBytes) throw invalid(`${where}: page.bytes ${JSON.stringify(page.bytes)} is not 2 × ${blockSize} × ${nKvHeads} × ${headDim} × ${eb} = ${pageBytes}`, path);
  if (pageBytes > KV_MAX_PAGE_BYTES) throw invalid(`${where}: pages of ${pageBytes} bytes are over the ${KV_MAX_PAGE_BYTES}-byte cap`, path);
  const dataFiles: KvDumpManifest["dataFiles"] = [];
  const declared = new Map<string, number>();
  if (doc.data_files !== undefined) {
    if (!Array.isArray(doc.data_files)) throw invalid(`${where}: data_files must be an array`, path);
    for (const f of doc.data_files) {
      const p = field(f, "path");
      const b = field(f, "bytes");
      if (!safeRel(p)) throw invalid(`${where}: data file path ${JSON.stringify(p)} is not a safe relative path`, path);
      if (b !== undefined && !(Number.isSafeInteger(b) && (b as number) >= 0)) throw invalid(`${where}: data file ${p} has bytes ${JSON.stringify(b)}`, path);
      if (declared.has(p)) throw invalid(`${where}: data file ${p} is listed twice`, path);
      declared.set(p, dataFiles.length);
      dataFiles.push({ path: p, bytes: (b as number | undefined) ?? null });
    }
  }
  if (typeof doc.pages !== "number") throw invalid(`${where}: pages must be an array`, path);
  // The checks that need the header, page by page in order, up to the first problem found while streaming.
  const n = pages.count;
  const fileMap = new Int32Array(namedList.length).fill(-1); // first-mention index → dataFiles index
  const upto = early === null ? n : (early as { i: number }).i;
  const order = new Uint32Array(upto);
  for (let i = 0; i < upto; i++) {
    order[i] = i;
    const layer = pages.layer.a[i]!;
    if (layer >= nLayers) throw invalid(`${where}: pages[${i}].layer ${layer} is not in 0..${nLayers - 1}`, path);
    const offset = pages.offset.a[i]!;
    if (offset % pageBytes !== 0) throw invalid(`${where}: pages[${i}].offset ${offset} is not a multiple of the page size ${pageBytes}`, path);
    const fi = pages.file.a[i]!;
    if (fileMap[fi] === -1) {
      const name = namedList[fi]!;
      const d = declared.get(name);
      if (d !== undefined) fileMap[fi] = d;
      else if (doc.data_files !== undefined) throw invalid(`${where}: pages[${i}].file ${name} is not in data_files`, path);
      else {
        fileMap[fi] = dataFiles.length;
        declared.set(name, dataFiles.length);
        dataFiles.push({ path: name, bytes: null });
      }
    }
    pages.file.a[i] = fileMap[fi]!;
  }
  // A (layer, block) listed twice: sorted, repeats are neighbours; reported at the repeat's index.
  order.sort((x, y) => pages.layer.a[x]! - pages.layer.a[y]! || pages.block.a[x]! - pages.block.a[y]! || x - y);
  let dup = -1;
  for (let k = 1; k < upto; k++) {
    const a = order[k - 1]!;
    const b = order[k]!;
    if (pages.layer.a[a] === pages.layer.a[b] && pages.block.a[a] === pages.block.a[b] && (dup === -1 || b < dup)) dup = b;
  }
  if (dup !== -1) throw invalid(`${where}: layer ${pages.layer.a[dup]!} block ${pages.block.a[dup]!} is listed twice`, path);
  if (early !== null) {
    const e = early as { i: number; msg: string };
    throw invalid(e.msg.endsWith("is not in 0..") ? `${e.msg}${nLayers - 1}` : e.msg.endsWith("multiple of the page size") ? `${e.msg} ${pageBytes}` : e.msg, path);
  }
  const blocks = Float64Array.from(pages.block.a.subarray(0, n)).sort();
  const hasBlock = (b: number): boolean => {
    let lo = 0;
    let hi = blocks.length;
    while (lo < hi) {
      const mid = (lo + hi) >> 1;
      if (blocks[mid]! < b) lo = mid + 1;
      else hi = mid;
    }
    return lo < blocks.length && blocks[lo] === b;
  };
  const sequences: KvDumpManifest["sequences"] = [];
  if (doc.sequences !== undefined) {
    if (!Array.isArray(doc.sequences)) throw invalid(`${where}: sequences must be an array`, path);
    for (const [i, s] of (doc.sequences as unknown[]).entries()) {
      const id = field(s, "seq_id");
      const bl = field(s, "blocks");
      if ((typeof id !== "string" && typeof id !== "number") || !Array.isArray(bl)) throw invalid(`${where}: sequences[${i}] needs seq_id and blocks`, path);
      for (const b of bl) {
        if (!Number.isSafeInteger(b) || !hasBlock(b as number)) throw invalid(`${where}: sequence ${String(id)} names block ${JSON.stringify(b)}, which has no page`, path);
      }
      sequences.push({ seqId: String(id), blocks: bl as number[] });
    }
  }
  return { engine: doc.engine ?? null, nLayers, nKvHeads, headDim, dtype, blockSize, pageBytes, dataFiles, pages, sequences };
}

// ------------------------------------------------------------------------------ byte-plane shuffle

/**
 * Split `src` (elements of `elem` bytes) into byte planes: every element's byte 0, then
 * every byte 1, …; for 2-byte dtypes the low bytes, then the high bytes. `src.length` must
 * be a multiple of `elem`.
 */
export function shuffle(src: Uint8Array, elem: number): Buffer {
  const n = src.length / elem;
  const out = Buffer.allocUnsafe(src.length);
  if (elem === 2) {
    for (let i = 0, j = 0; i < n; i++, j += 2) {
      out[i] = src[j]!;
      out[n + i] = src[j + 1]!;
    }
  } else {
    for (let b = 0; b < elem; b++) {
      const base = b * n;
      for (let i = 0, j = b; i < n; i++, j += elem) out[base + i] = src[j]!;
    }
  }
  return out;
}

/** The inverse of {@link shuffle}. */
export function unshuffle(src: Uint8Array, elem: number): Buffer {
  const n = src.length / elem;
  const out = Buffer.allocUnsafe(src.length);
  if (elem === 2) {
    for (let i = 0, j = 0; i < n; i++, j += 2) {
      out[j] = src[i]!;
      out[j + 1] = src[n + i]!;
    }
  } else {
    for (let b = 0; b < elem; b++) {
      const base = b * n;
      for (let i = 0, j = b; i < n; i++, j += elem) out[j] = src[base + i]!;
    }
  }
  return out;
}

/** Where a page first occurs: data file `file` (its position in kv-index `files`) at byte `offset`. */
export interface PagePlace {
  file: number;
  offset: number;
}

/**
 * A stored page's artifact path: `pages/<sha256>`; byte-plane shuffled, `pages/<sha256>.s<elem>`;
 * or (layer schema 2) an unshuffled page with the place of its first occurrence,
 * `pages/<sha256>@<file>.<offset>`, which restore writes straight into place.
 */
export const pageArtifact = (hex: string, elem: number, at?: PagePlace): string =>
  elem > 1 ? `pages/${hex}.s${elem}` : at ? `pages/${hex}@${at.file}.${at.offset}` : `pages/${hex}`;
/** Groups: 1 the SHA-256, 2 the shuffle element size, 3 and 4 the place's file and offset. */
export const PAGE_ARTIFACT_RE = /^pages\/([0-9a-f]{64})(?:\.s([24])|@(0|[1-9][0-9]{0,8})\.(0|[1-9][0-9]{0,14}))?$/;
/** A placed page may not end past this offset in its file (a sparse 1 TiB file is the most a hostile bundle can ask for). */
export const PLACE_MAX_END = 2 ** 40;
/** The data files of a kv layer (files with tiles) hold at most this many bytes in all, as a place's bound. */
export const KV_MAX_RESTORE_BYTES = PLACE_MAX_END;
/** The prefix of the work directory a rebuild moves the bundle-side artifacts into: no dump file may use it. */
export const KV_WORK_PREFIX = ".memsnap-work-kv-";

/** The page's place, when its artifact path carries one. */
export function pagePlace(rel: string): PagePlace | null {
  const m = PAGE_ARTIFACT_RE.exec(rel);
  return m && m[3] !== undefined ? { file: Number(m[3]), offset: Number(m[4]) } : null;
}

// ------------------------------------------------------------------------------ kv-index.json

/** A distinct page content. */
export interface KvContent {
  sha256: string;
  bytes: number;
  zero: boolean;
  /** Where its bytes are in the layer: `pages/…` (raw or shuffled), `files/…` (a verbatim zstd blob), or null (zero). */
  artifact: string | null;
  /** `zstd`: the artifact is a verbatim zstd frame (a ProcessFork blob) of the content. */
  encoding?: "zstd";
}

/** An original file of the dump. */
export interface KvIndexFile {
  path: string;
  bytes: number;
  mode: number;
  mtime: string;
  /** Verbatim files: the artifact holding its bytes (`files/<path>`). */
  artifact?: string;
  /** Data files: content indexes of its consecutive pages, which tile it exactly. */
  tiles?: number[];
}

export interface KvIndex {
  format: typeof KV_INDEX_FORMAT;
  version: 1;
  source_format: "memsnap" | "pfimg-paged" | "lmcache";
  dtype: string;
  page_bytes: number;
  shuffle: { applied: boolean; elem_bytes: number };
  contents: KvContent[];
  /** Every original page: [label, content index]. Labels: `L<layer>/B<block>`, `<ix>/k`, `<file>#<n>`. */
  pages: [string, number][];
  files: KvIndexFile[];
}

/** The kv-index's members other than its three arrays, and how many entries each array had. */
export interface KvIndexHead {
  source_format: KvIndex["source_format"];
  dtype: string;
  page_bytes: number;
  shuffle: KvIndex["shuffle"];
  contents: number;
  pages: number;
  files: number;
}

/**
 * A kv-index that asks restore for something unsafe (a path out of its layer, a file under a
 * file, a size no dump has): restore refuses it with `code` (exit 9). Other problems of the
 * document are plain Errors (a damaged index).
 */
export class KvIndexUnsafe extends Error {
  constructor(message: string, readonly code: "MEMSNAP_UNSAFE_PATH" | "MEMSNAP_UNSAFE_BUNDLE") {
    super(message);
  }
}

/** Check one `contents` entry of a kv-index (throws a plain Error, or KvIndexUnsafe for its size). */
function checkContent(c: unknown): KvContent {
  if (!isObject(c) || typeof c.sha256 !== "string" || !/^[0-9a-f]{64}$/.test(c.sha256) || !Number.isSafeInteger(c.bytes) || typeof c.zero !== "boolean") {
    throw new Error("kv-index has a malformed content entry");
  }
  const bytes = c.bytes as number;
  // A page is at most KV_MAX_PAGE_BYTES (capture refuses bigger ones); a ProcessFork blob kept
  // as its zstd frame (encoding zstd) is never written from its content entry.
  if (bytes < 0 || (c.encoding !== "zstd" && bytes > KV_MAX_PAGE_BYTES)) {
    throw new KvIndexUnsafe(`kv-index content ${c.sha256} has ${bytes} bytes (a page has 0 to ${KV_MAX_PAGE_BYTES})`, "MEMSNAP_UNSAFE_BUNDLE");
  }
  if (c.artifact !== null && !(typeof c.artifact === "string" && safeRel(c.artifact))) throw new Error(`kv-index content artifact ${JSON.stringify(c.artifact)} is not a safe path`);
  if (c.artifact === null && !c.zero) throw new Error(`kv-index content ${c.sha256} has no bytes and is not zero`);
  return c as unknown as KvContent;
}

/** Check one `files` entry of a kv-index (tile indexes are range-checked by the caller); throws a plain Error or KvIndexUnsafe. */
function checkFile(f: unknown): KvIndexFile {
  if (isObject(f) && typeof f.path === "string" && !safeRel(f.path)) {
    throw new KvIndexUnsafe(`kv-index file path ${JSON.stringify(f.path)} is not a safe relative path`, "MEMSNAP_UNSAFE_PATH");
  }
  if (!isObject(f) || !safeRel(f.path) || !Number.isSafeInteger(f.bytes) || !Number.isSafeInteger(f.mode) || typeof f.mtime !== "string") {
    throw new Error("kv-index has a malformed file entry");
  }
  if ((f.bytes as number) < 0) throw new KvIndexUnsafe(`kv-index file ${f.path} has ${f.bytes as number} bytes`, "MEMSNAP_UNSAFE_BUNDLE");
  if (f.path.split("/")[0]!.startsWith(KV_WORK_PREFIX)) throw new KvIndexUnsafe(`kv-index names a reserved path ${f.path}`, "MEMSNAP_UNSAFE_PATH");
  if (f.tiles !== undefined) {
    if (!Array.isArray(f.tiles) || f.tiles.some((t) => !Number.isSafeInteger(t) || (t as number) < 0)) throw new Error(`kv-index file ${f.path} has bad tiles`);
  } else if (!(typeof f.artifact === "string" && safeRel(f.artifact))) {
    throw new Error(`kv-index file ${f.path} has neither tiles nor an artifact`);
  }
  return f as unknown as KvIndexFile;
}

/**
 * Check that the zero contents (their byte counts `lens`, digests at `32 i` of `shas`) carry
 * the SHA-256 of that many zero bytes: one pass of zeros up to the longest (at most a page),
 * the digest of each length taken from a copy of the running hash, however many there are.
 */
function checkZeroDigests(lens: Float64Array, shas: Buffer, n: number): void {
  const order = Array.from({ length: n }, (_, i) => i).sort((a, b) => lens[a]! - lens[b]!);
  const h = createHash("sha256");
  const zeros = Buffer.alloc(Math.min(1 << 20, Math.max(1, n ? lens[order[n - 1]!]! : 1)));
  let fed = 0;
  for (const i of order) {
    const len = lens[i]!;
    while (fed < len) {
      const k = Math.min(zeros.length, len - fed);
      h.update(k === zeros.length ? zeros : zeros.subarray(0, k));
      fed += k;
    }
    if (h.copy().digest().compare(shas, 32 * i, 32 * i + 32) !== 0) {
      throw new Error(`kv-index content ${shas.toString("hex", 32 * i, 32 * i + 32)} is marked zero, but ${len} zero bytes hash to sha256:${h.copy().digest("hex")}`);
    }
  }
}

/** What {@link readKvIndex} found besides the checks: the bytes of all the data files (files with tiles). */
export interface KvIndexRead extends KvIndexHead {
  dataBytes: number;
}

/**
 * Read a kv-index.json document as it streams, with the checks of {@link parseKvIndex}, handing
 * each content and each file to `on` (pages are checked for shape only and dropped): memory
 * stays bounded whatever the number of pages (the document is ~230 bytes per page). Every
 * check is done before this resolves, so a caller acts on what it collected only after:
 * - contents: sizes (0 to a page's cap), and a zero content's digest is that of its zero bytes;
 * - files: safe relative paths, none twice, none under another (a file is no directory), none
 *   in the rebuild's work directory; a data file's tiles are pages (not ProcessFork frames),
 *   in range, and add up to its `bytes`; all data files hold at most KV_MAX_RESTORE_BYTES.
 * Throws a plain Error saying what is wrong, or a {@link KvIndexUnsafe}.
 */
export async function readKvIndex(
  chunks: AsyncIterable<Uint8Array> | Iterable<Uint8Array>,
  on: { content?: (c: KvContent, i: number) => void; file?: (f: KvIndexFile, i: number) => void },
): Promise<KvIndexRead> {
  let maxTile = -1;
  let badTiles: string | null = null;
  // Per content: its bytes, and 1 when it is a zstd frame (not a page a tile can use).
  const cBytes = new Grow((n) => new Float64Array(n));
  const cFrame = new Grow((n) => new Uint8Array(n));
  // Zero contents up to a page: bytes and declared digest, checked at the end.
  const zLens = new Grow((n) => new Float64Array(n));
  let zShas = Buffer.alloc(32 * 64);
  const paths = new Set<string>();
  let dataBytes = 0;
  /** Data files whose tiles name contents not read yet (another member order): summed at the end. */
  const later: KvIndexFile[] = [];
  const sumTiles = (f: KvIndexFile): void => {
    let n = 0;
    for (const t of f.tiles!) {
      if (cFrame.a[t] === 1) throw new Error(`kv-index file ${f.path} has a tile that is not a page`);
      n += cBytes.a[t]!;
    }
    if (n !== f.bytes) throw new KvIndexUnsafe(`kv-index file ${f.path} has ${f.bytes} bytes, its tiles hold ${n}`, "MEMSNAP_UNSAFE_BUNDLE");
  };
  let doc: Record<string, unknown>;
  try {
    doc = await streamJson(chunks, {
      arrays: {
        contents: (raw, i) => {
          const c = checkContent(raw);
          cBytes.push(c.bytes);
          cFrame.push(c.encoding === "zstd" ? 1 : 0);
          if (c.zero && c.bytes <= KV_MAX_PAGE_BYTES) {
            const k = zLens.push(c.bytes);
            if (zShas.length < 32 * (k + 1)) {
              const b = Buffer.alloc(zShas.length * 2);
              zShas.copy(b);
              zShas = b;
            }
            zShas.write(c.sha256, 32 * k, "hex");
          }
          on.content?.(c, i);
        },
        pages: () => undefined,
        files: (raw, i) => {
          const f = checkFile(raw);
          if (paths.has(f.path)) throw new KvIndexUnsafe(`kv-index names ${f.path} twice`, "MEMSNAP_UNSAFE_PATH");
          paths.add(f.path);
          if (f.tiles) {
            for (const t of f.tiles) {
              if (t > maxTile) {
                maxTile = t;
                badTiles = f.path;
              }
            }
            dataBytes += f.bytes;
            if (f.bytes > KV_MAX_RESTORE_BYTES || dataBytes > KV_MAX_RESTORE_BYTES) {
              throw new KvIndexUnsafe(`kv-index data files hold more than ${KV_MAX_RESTORE_BYTES} bytes (at ${f.path})`, "MEMSNAP_UNSAFE_BUNDLE");
            }
            if (maxTile < cBytes.length) sumTiles(f);
            else later.push(f);
          }
          on.file?.(f, i);
        },
      },
    });
  } catch (e) {
    if (e instanceof JsonStreamError) throw new Error(`kv-index is not valid JSON: ${e.message}`);
    throw e;
  }
  if (doc.format !== KV_INDEX_FORMAT) throw new Error(`not a ${KV_INDEX_FORMAT} document`);
  if (doc.version !== 1) throw new Error(`kv-index version ${JSON.stringify(doc.version)}; this memsnap reads 1`);
  if (typeof doc.contents !== "number" || typeof doc.files !== "number" || typeof doc.pages !== "number") throw new Error("kv-index needs contents, pages and files arrays");
  if (maxTile >= doc.contents) throw new Error(`kv-index file ${String(badTiles)} has bad tiles`);
  for (const f of later) sumTiles(f);
  // A file under another file (`a` and `a/b`): the rebuild would need `a` as a directory too.
  for (const p of paths) {
    for (let k = p.indexOf("/"); k !== -1; k = p.indexOf("/", k + 1)) {
      if (paths.has(p.slice(0, k))) throw new KvIndexUnsafe(`kv-index names ${p} under the file ${p.slice(0, k)}`, "MEMSNAP_UNSAFE_PATH");
    }
  }
  checkZeroDigests(zLens.a, zShas, zLens.length);
  return { ...(doc as unknown as KvIndexHead), dataBytes };
}

/** Parse and check a whole kv-index.json document held in memory (shape only): {@link readKvIndex}, collected. */
export async function parseKvIndex(bytes: Buffer): Promise<KvIndex> {
  const contents: KvContent[] = [];
  const files: KvIndexFile[] = [];
  const head = await readKvIndex([bytes], { content: (c) => { contents.push(c); }, file: (f) => { files.push(f); } });
  const pages = (JSON.parse(bytes.toString("utf8")) as { pages: [string, number][] }).pages;
  return { format: KV_INDEX_FORMAT, version: 1, source_format: head.source_format, dtype: head.dtype, page_bytes: head.page_bytes, shuffle: head.shuffle, contents, pages, files };
}
