/**
 * ProcessFork image-store format helpers shared by the `pfimg` and `kv` sources: digest
 * strings, store paths, dtypes, and manifest parsing (snake_case on disk, camelCase accepted).
 */
import { createHash } from "node:crypto";
import { MemsnapError } from "../../errors.js";

// ------------------------------------------------------------------------------ digests and paths

/** `sha256:` + 64 hex digits; the original parser accepts uppercase, readers lowercase before comparing. */
export const DIGEST_RE = /^sha256:([0-9a-fA-F]{64})$/;
export const HEX64_RE = /^[0-9a-f]{64}$/;

/** The lowercase hex of a digest string, or null when `v` is not one. */
export function digestHex(v: unknown): string | null {
  if (typeof v !== "string") return null;
  const m = DIGEST_RE.exec(v);
  return m ? m[1]!.toLowerCase() : null;
}

export const sha256Hex = (b: Buffer | string): string => createHash("sha256").update(b).digest("hex");

/** A blob's path inside a store: `blobs/sha256/<hex[0:2]>/<hex>.zst`. */
export const blobRel = (hex: string): string => `blobs/sha256/${hex.slice(0, 2)}/${hex}.zst`;
/** An image manifest's path inside a store: `images/<hex>.json`. */
export const imageRel = (hex: string): string => `images/${hex}.json`;

export const BLOB_REL_RE = /^blobs\/sha256\/([0-9a-f]{2})\/([0-9a-f]{64})\.zst$/;
export const IMAGE_REL_RE = /^images\/([0-9a-f]{64})\.json$/;

export const IMAGE_MEDIA_TYPE = "application/vnd.processfork.image.v1+json";

/** Bytes per element of the KV dtypes ProcessFork and memsnap know (with common aliases). */
export const DTYPE_BYTES: Readonly<Record<string, number>> = {
  bf16: 2,
  bfloat16: 2,
  f16: 2,
  fp16: 2,
  float16: 2,
  half: 2,
  f32: 4,
  fp32: 4,
  float32: 4,
  float: 4,
  fp8e4m3: 1,
  fp8_e4m3: 1,
  float8_e4m3fn: 1,
  fp8: 1,
  e4m3: 1,
};

const CANONICAL_DTYPE: Readonly<Record<string, string>> = {
  bf16: "bf16",
  bfloat16: "bf16",
  f16: "f16",
  fp16: "f16",
  float16: "f16",
  half: "f16",
  f32: "f32",
  fp32: "f32",
  float32: "f32",
  float: "f32",
  fp8e4m3: "fp8e4m3",
  fp8_e4m3: "fp8e4m3",
  float8_e4m3fn: "fp8e4m3",
  fp8: "fp8e4m3",
  e4m3: "fp8e4m3",
};

/** The canonical name of a dtype (`bf16`, `f16`, `f32`, `fp8e4m3`), or null when unknown. */
export function canonicalDtype(dtype: unknown): string | null {
  return typeof dtype === "string" ? (CANONICAL_DTYPE[dtype.toLowerCase()] ?? null) : null;
}

/** The byte width of a dtype name, or null when unknown. */
export function dtypeBytes(dtype: unknown): number | null {
  if (typeof dtype !== "string") return null;
  return DTYPE_BYTES[dtype.toLowerCase()] ?? null;
}

// ------------------------------------------------------------------------------ snake/camel keys

const camel = (s: string): string => s.replace(/_([a-z0-9])/g, (_m, c: string) => c.toUpperCase());

/** `obj[snake]`, else `obj[camelCase(snake)]` (some ProcessFork docs show camelCase). */
export function field(obj: unknown, snake: string): unknown {
  if (typeof obj !== "object" || obj === null || Array.isArray(obj)) return undefined;
  const o = obj as Record<string, unknown>;
  if (Object.hasOwn(o, snake)) return o[snake];
  const c = camel(snake);
  return Object.hasOwn(o, c) ? o[c] : undefined;
}

export function isObject(v: unknown): v is Record<string, unknown> {
  return typeof v === "object" && v !== null && !Array.isArray(v);
}

export function posInt(v: unknown): number | null {
  return Number.isSafeInteger(v) && (v as number) > 0 ? (v as number) : null;
}

// ------------------------------------------------------------------------------ image manifests

/** What an image manifest references, one entry per blob field. */
export interface BlobRef {
  hex: string;
  /** What the blob is, for messages: `model diff`, `cache page manifest`, `trace messages`, … */
  what: string;
  category: BlobCategory;
  /** How the blob is used: structural blobs are parsed to find more blobs. */
  role: "model-base" | "model-diff" | "cache-manifest" | "fs-tree" | "env" | "procs" | "ledger" | "trace" | "manifest";
}

export type BlobCategory = "image" | "model" | "cache" | "world" | "effects" | "trace";

export interface ImageManifest {
  hex: string;
  parents: string[];
  createdAt: string | null;
  refs: BlobRef[];
  /** Non-digest model base (a model name), recorded only. */
  modelBaseName: string | null;
  cacheLayout: string | null;
}

function invalid(msg: string, path?: string): MemsnapError {
  return new MemsnapError("MEMSNAP_SOURCE_INVALID", msg, {
    ...(path ? { path } : {}),
    hint: "the ProcessFork store is damaged or not one this memsnap reads; check it with ProcessFork's own tools",
  });
}

/**
 * Parse an image manifest's bytes (already checked to hash to `hex`). Throws
 * MEMSNAP_SOURCE_INVALID for bad JSON, a schema version other than 1, or a field that
 * should hold a digest and holds something else.
 */
export function parseImageManifest(bytes: Buffer, hex: string, path: string): ImageManifest {
  const where = `pfimg: image sha256:${hex}`;
  let doc: unknown;
  try {
    doc = JSON.parse(bytes.toString("utf8"));
  } catch (e) {
    throw invalid(`${where} is not valid JSON: ${(e as Error).message}`, path);
  }
  if (!isObject(doc)) throw invalid(`${where} is not a JSON object`, path);
  const sv = field(doc, "schema_version");
  if (sv !== 1) throw invalid(`${where} has schema_version ${JSON.stringify(sv)}; this memsnap reads 1`, path);
  const mt = field(doc, "media_type");
  if (mt !== undefined && mt !== IMAGE_MEDIA_TYPE) {
    throw invalid(`${where} has media_type ${JSON.stringify(mt)}, expected ${IMAGE_MEDIA_TYPE}`, path);
  }
  const refs: BlobRef[] = [];
  const ref = (
    obj: unknown,
    key: string,
    what: string,
    category: BlobCategory,
    role: BlobRef["role"],
    optionalName = false,
  ): string | null => {
    const v = field(obj, key);
    if (v === undefined || v === null || v === "") return null;
    const h = digestHex(v);
    if (h) {
      refs.push({ hex: h, what, category, role });
      return null;
    }
    if (optionalName && typeof v === "string") return v;
    throw invalid(`${where}: ${what} is ${JSON.stringify(v).slice(0, 80)}, not a sha256 digest`, path);
  };
  const model = field(doc, "model");
  const modelBaseName = isObject(model) ? ref(model, "base", "model base", "model", "model-base", true) : null;
  if (isObject(model)) ref(model, "diff", "model diff", "model", "model-diff");
  const cache = field(doc, "cache");
  let cacheLayout: string | null = null;
  if (isObject(cache)) {
    const l = field(cache, "layout");
    cacheLayout = typeof l === "string" ? l : null;
    ref(cache, "manifest", "cache page manifest", "cache", "cache-manifest");
  }
  const world = field(doc, "world");
  if (isObject(world)) {
    ref(world, "fs", "world fs tree", "world", "fs-tree");
    ref(world, "env", "world env", "world", "env");
    ref(world, "procs", "world procs", "world", "procs");
  }
  const effects = field(doc, "effects");
  if (isObject(effects)) ref(effects, "ledger", "effects ledger", "effects", "ledger");
  const trace = field(doc, "trace");
  if (isObject(trace)) ref(trace, "messages", "trace messages", "trace", "trace");
  const rawParents = field(doc, "parents") ?? [];
  if (!Array.isArray(rawParents)) throw invalid(`${where}: parents is not an array`, path);
  if (rawParents.length > 2) throw invalid(`${where} has ${rawParents.length} parents (at most 2: a merge)`, path);
  const parents = rawParents.map((p) => {
    const h = digestHex(p);
    if (!h) throw invalid(`${where}: parent ${JSON.stringify(p)} is not a sha256 digest`, path);
    return h;
  });
  const ca = field(doc, "created_at");
  return { hex, parents, createdAt: typeof ca === "string" ? ca : null, refs, modelBaseName, cacheLayout };
}

/** A `paged-batchinvariant-v1` cache page manifest. */
export interface PageManifest {
  pageSizeTokens: number | null;
  nLayers: number | null;
  nHeads: number | null;
  headDim: number | null;
  dtype: string | null;
  /** Bytes of each K and each V blob when every dimension is known, else null. */
  pageBytes: number | null;
  pages: { ix: number; k: string; v: string }[];
  logicalSeqs: unknown;
}

/** Parse a cache page manifest (tolerates extra keys, camelCase, and older `page_size_bytes` shapes). */
export function parsePageManifest(bytes: Buffer, where: string, path?: string): PageManifest {
  let doc: unknown;
  try {
    doc = JSON.parse(bytes.toString("utf8"));
  } catch (e) {
    throw invalid(`${where} is not valid JSON: ${(e as Error).message}`, path);
  }
  if (!isObject(doc)) throw invalid(`${where} is not a JSON object`, path);
  const layout = field(doc, "layout");
  if (layout !== undefined && layout !== "paged-batchinvariant-v1") {
    throw invalid(`${where} has layout ${JSON.stringify(layout)}, expected paged-batchinvariant-v1`, path);
  }
  const pageSizeTokens = posInt(field(doc, "page_size_tokens"));
  const nLayers = posInt(field(doc, "n_layers"));
  const nHeads = posInt(field(doc, "n_heads") ?? field(doc, "n_kv_heads"));
  const headDim = posInt(field(doc, "head_dim"));
  const dt = field(doc, "dtype");
  const dtype = typeof dt === "string" ? dt : null;
  if (dtype !== null && dtypeBytes(dtype) === null) {
    throw invalid(`${where} has an unknown dtype ${JSON.stringify(dtype)} (bf16, f16, f32, fp8e4m3)`, path);
  }
  const eb = dtypeBytes(dtype);
  const pageBytes =
    pageSizeTokens && nLayers && nHeads && headDim && eb ? nLayers * pageSizeTokens * nHeads * headDim * eb : null;
  const rawPages = field(doc, "pages");
  if (!Array.isArray(rawPages)) throw invalid(`${where} has no pages array`, path);
  const pages = rawPages.map((p: unknown, i: number) => {
    const ixv = field(p, "ix");
    const ix = Number.isSafeInteger(ixv) && (ixv as number) >= 0 ? (ixv as number) : i;
    const k = digestHex(field(p, "k"));
    const v = digestHex(field(p, "v"));
    if (!k || !v) throw invalid(`${where}: page ${ix} does not name its k and v blobs by sha256 digest`, path);
    return { ix, k, v };
  });
  return {
    pageSizeTokens,
    nLayers,
    nHeads,
    headDim,
    dtype,
    pageBytes,
    pages,
    logicalSeqs: field(doc, "logical_seqs") ?? null,
  };
}

/** Parse an `fs.tree.v1` blob: the file entries that reference blobs. */
export function parseFsTree(
  bytes: Buffer,
  where: string,
  path?: string,
): { path: string; hex: string; size: number | null }[] {
  let doc: unknown;
  try {
    doc = JSON.parse(bytes.toString("utf8"));
  } catch (e) {
    throw invalid(`${where} is not valid JSON: ${(e as Error).message}`, path);
  }
  const entries = Array.isArray(doc) ? doc : field(doc, "entries");
  if (!Array.isArray(entries)) throw invalid(`${where} has no entries array`, path);
  const out: { path: string; hex: string; size: number | null }[] = [];
  for (const e of entries) {
    const kind = field(e, "kind");
    const b = field(e, "blob");
    if (b === undefined || b === null || b === "") continue;
    if (kind !== undefined && kind !== "file") continue;
    const hex = digestHex(b);
    const p = field(e, "path");
    if (!hex) {
      throw invalid(`${where}: entry ${JSON.stringify(p)} has blob ${JSON.stringify(b)}, not a sha256 digest`, path);
    }
    const size = field(e, "size");
    out.push({
      path: typeof p === "string" ? p : "?",
      hex,
      size: Number.isSafeInteger(size) && (size as number) >= 0 ? (size as number) : null,
    });
  }
  return out;
}
