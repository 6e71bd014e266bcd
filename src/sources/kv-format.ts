/**
 * The memsnap KV dump format (docs/FORMAT.md "KV dump format") and the `kv` layer's
 * bundle-side index: parsing and validating `kv-manifest.json`, the byte-plane shuffle, and
 * the `kv-index.json` document.
 */
import { MemsnapError } from "../errors.js";
import { dtypeBytes, field, isObject, posInt } from "./pfimg-format.js";

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

/** One page of a memsnap KV dump. */
export interface KvDumpPage {
  layer: number;
  block: number;
  file: string;
  offset: number;
  /** Lowercase hex, or null when the dump left it empty (memsnap computes it). */
  sha256: string | null;
  zero: boolean;
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
  pages: KvDumpPage[];
  sequences: { seqId: string; blocks: number[] }[];
}

/**
 * Parse and validate `kv-manifest.json`: dimensions, page shape and bytes, safe data file
 * paths, page placement (aligned, inside the file list), and sequences naming known blocks.
 * Whether data files are exactly tiled by their pages is checked against their sizes by
 * the caller. Throws MEMSNAP_SOURCE_INVALID.
 */
export function parseKvManifest(bytes: Buffer, path: string): KvDumpManifest {
  const where = `kv: ${path}`;
  let doc: unknown;
  try {
    doc = JSON.parse(bytes.toString("utf8"));
  } catch (e) {
    throw invalid(`${where} is not valid JSON: ${(e as Error).message}`, path);
  }
  if (!isObject(doc)) throw invalid(`${where} is not a JSON object`, path);
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
  const declared = new Map<string, number | null>();
  if (doc.data_files !== undefined) {
    if (!Array.isArray(doc.data_files)) throw invalid(`${where}: data_files must be an array`, path);
    for (const f of doc.data_files) {
      const p = field(f, "path");
      const b = field(f, "bytes");
      if (!safeRel(p)) throw invalid(`${where}: data file path ${JSON.stringify(p)} is not a safe relative path`, path);
      if (b !== undefined && !(Number.isSafeInteger(b) && (b as number) >= 0)) throw invalid(`${where}: data file ${p} has bytes ${JSON.stringify(b)}`, path);
      if (declared.has(p)) throw invalid(`${where}: data file ${p} is listed twice`, path);
      declared.set(p, (b as number | undefined) ?? null);
      dataFiles.push({ path: p, bytes: (b as number | undefined) ?? null });
    }
  }
  if (!Array.isArray(doc.pages)) throw invalid(`${where}: pages must be an array`, path);
  const pages: KvDumpPage[] = [];
  const seen = new Set<string>();
  const blocks = new Set<number>();
  for (const [i, p] of (doc.pages as unknown[]).entries()) {
    if (!isObject(p)) throw invalid(`${where}: pages[${i}] is not an object`, path);
    const layer = p.layer;
    const block = p.block;
    if (!Number.isSafeInteger(layer) || (layer as number) < 0 || (layer as number) >= nLayers) throw invalid(`${where}: pages[${i}].layer ${JSON.stringify(layer)} is not in 0..${nLayers - 1}`, path);
    if (!Number.isSafeInteger(block) || (block as number) < 0) throw invalid(`${where}: pages[${i}].block ${JSON.stringify(block)} is not a non-negative integer`, path);
    const key = `${layer as number}/${block as number}`;
    if (seen.has(key)) throw invalid(`${where}: layer ${layer as number} block ${block as number} is listed twice`, path);
    seen.add(key);
    blocks.add(block as number);
    if (!safeRel(p.file)) throw invalid(`${where}: pages[${i}].file ${JSON.stringify(p.file)} is not a safe relative path`, path);
    if (p.file === KV_MANIFEST) throw invalid(`${where}: pages[${i}] points into ${KV_MANIFEST}`, path);
    const offset = p.offset ?? 0;
    if (!Number.isSafeInteger(offset) || (offset as number) < 0 || (offset as number) % pageBytes !== 0) {
      throw invalid(`${where}: pages[${i}].offset ${JSON.stringify(p.offset)} is not a multiple of the page size ${pageBytes}`, path);
    }
    const sha = p.sha256 ?? "";
    if (typeof sha !== "string" || (sha !== "" && !/^(sha256:)?[0-9a-fA-F]{64}$/.test(sha))) throw invalid(`${where}: pages[${i}].sha256 ${JSON.stringify(sha)} is not a hex SHA-256 (or "")`, path);
    const zero = p.zero ?? false;
    if (typeof zero !== "boolean") throw invalid(`${where}: pages[${i}].zero must be true or false`, path);
    if (!declared.has(p.file)) {
      if (doc.data_files !== undefined) throw invalid(`${where}: pages[${i}].file ${p.file} is not in data_files`, path);
      declared.set(p.file, null);
      dataFiles.push({ path: p.file, bytes: null });
    }
    pages.push({ layer: layer as number, block: block as number, file: p.file, offset: offset as number, sha256: sha ? sha.replace(/^sha256:/, "").toLowerCase() : null, zero });
  }
  const sequences: KvDumpManifest["sequences"] = [];
  if (doc.sequences !== undefined) {
    if (!Array.isArray(doc.sequences)) throw invalid(`${where}: sequences must be an array`, path);
    for (const [i, s] of (doc.sequences as unknown[]).entries()) {
      const id = field(s, "seq_id");
      const bl = field(s, "blocks");
      if ((typeof id !== "string" && typeof id !== "number") || !Array.isArray(bl)) throw invalid(`${where}: sequences[${i}] needs seq_id and blocks`, path);
      for (const b of bl) {
        if (!Number.isSafeInteger(b) || !blocks.has(b as number)) throw invalid(`${where}: sequence ${String(id)} names block ${JSON.stringify(b)}, which has no page`, path);
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

/** Parse and check a kv-index.json document (shape only). */
export function parseKvIndex(bytes: Buffer): KvIndex {
  const doc = JSON.parse(bytes.toString("utf8")) as unknown;
  if (!isObject(doc) || doc.format !== KV_INDEX_FORMAT) throw new Error(`not a ${KV_INDEX_FORMAT} document`);
  if (doc.version !== 1) throw new Error(`kv-index version ${JSON.stringify(doc.version)}; this memsnap reads 1`);
  if (!Array.isArray(doc.contents) || !Array.isArray(doc.files) || !Array.isArray(doc.pages)) throw new Error("kv-index needs contents, pages and files arrays");
  const n = doc.contents.length;
  for (const c of doc.contents as unknown[]) {
    if (!isObject(c) || typeof c.sha256 !== "string" || !/^[0-9a-f]{64}$/.test(c.sha256) || !Number.isSafeInteger(c.bytes) || typeof c.zero !== "boolean") {
      throw new Error("kv-index has a malformed content entry");
    }
    if (c.artifact !== null && !(typeof c.artifact === "string" && safeRel(c.artifact))) throw new Error(`kv-index content artifact ${JSON.stringify(c.artifact)} is not a safe path`);
    if (c.artifact === null && !c.zero) throw new Error(`kv-index content ${c.sha256} has no bytes and is not zero`);
  }
  for (const f of doc.files as unknown[]) {
    if (!isObject(f) || !safeRel(f.path) || !Number.isSafeInteger(f.bytes) || !Number.isSafeInteger(f.mode) || typeof f.mtime !== "string") {
      throw new Error("kv-index has a malformed file entry");
    }
    if (f.tiles !== undefined) {
      if (!Array.isArray(f.tiles) || f.tiles.some((t) => !Number.isSafeInteger(t) || (t as number) < 0 || (t as number) >= n)) throw new Error(`kv-index file ${f.path} has bad tiles`);
    } else if (!(typeof f.artifact === "string" && safeRel(f.artifact))) {
      throw new Error(`kv-index file ${f.path} has neither tiles nor an artifact`);
    }
  }
  return doc as unknown as KvIndex;
}
