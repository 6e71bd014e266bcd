/**
 * ProcessFork image-store format helpers shared by the `pfimg` and `kv` sources: digest
 * strings, store paths, manifest parsing (snake_case on disk, camelCase accepted), and
 * "decompress one zstd frame and hash what comes out" in two flavours — synchronous for
 * small frames (a few MiB at most, so the main thread is never held long) and through the
 * zstd worker stream for everything else.
 */
import { createHash } from "node:crypto";
import { once } from "node:events";
import { createRequire } from "node:module";
import { StringDecoder } from "node:string_decoder";
import { MemsnapError } from "../../errors.js";
import { createZstdDecompressor } from "../../pipeline/zstd.js";
import type { Redactor } from "../../redact/types.js";

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
  bf16: 2, bfloat16: 2, f16: 2, fp16: 2, float16: 2, half: 2,
  f32: 4, fp32: 4, float32: 4, float: 4,
  fp8e4m3: 1, fp8_e4m3: 1, float8_e4m3fn: 1, fp8: 1, e4m3: 1,
};

const CANONICAL_DTYPE: Readonly<Record<string, string>> = {
  bf16: "bf16", bfloat16: "bf16", f16: "f16", fp16: "f16", float16: "f16", half: "f16",
  f32: "f32", fp32: "f32", float32: "f32", float: "f32",
  fp8e4m3: "fp8e4m3", fp8_e4m3: "fp8e4m3", float8_e4m3fn: "fp8e4m3", fp8: "fp8e4m3", e4m3: "fp8e4m3",
};

/** The canonical name of a dtype (`bf16`, `f16`, `f32`, `fp8e4m3`), or null when unknown. */
export function canonicalDtype(dtype: unknown): string | null {
  return typeof dtype === "string" ? CANONICAL_DTYPE[dtype.toLowerCase()] ?? null : null;
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
    ...(path ? { path } : {}), hint: "the ProcessFork store is damaged or not one this memsnap reads; check it with ProcessFork's own tools",
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
  if (mt !== undefined && mt !== IMAGE_MEDIA_TYPE) throw invalid(`${where} has media_type ${JSON.stringify(mt)}, expected ${IMAGE_MEDIA_TYPE}`, path);
  const refs: BlobRef[] = [];
  const ref = (obj: unknown, key: string, what: string, category: BlobCategory, role: BlobRef["role"], optionalName = false): string | null => {
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
  if (layout !== undefined && layout !== "paged-batchinvariant-v1") throw invalid(`${where} has layout ${JSON.stringify(layout)}, expected paged-batchinvariant-v1`, path);
  const pageSizeTokens = posInt(field(doc, "page_size_tokens"));
  const nLayers = posInt(field(doc, "n_layers"));
  const nHeads = posInt(field(doc, "n_heads") ?? field(doc, "n_kv_heads"));
  const headDim = posInt(field(doc, "head_dim"));
  const dt = field(doc, "dtype");
  const dtype = typeof dt === "string" ? dt : null;
  if (dtype !== null && dtypeBytes(dtype) === null) throw invalid(`${where} has an unknown dtype ${JSON.stringify(dtype)} (bf16, f16, f32, fp8e4m3)`, path);
  const eb = dtypeBytes(dtype);
  const pageBytes = pageSizeTokens && nLayers && nHeads && headDim && eb ? nLayers * pageSizeTokens * nHeads * headDim * eb : null;
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
  return { pageSizeTokens, nLayers, nHeads, headDim, dtype, pageBytes, pages, logicalSeqs: field(doc, "logical_seqs") ?? null };
}

/** Parse an `fs.tree.v1` blob: the file entries that reference blobs. */
export function parseFsTree(bytes: Buffer, where: string, path?: string): { path: string; hex: string; size: number | null }[] {
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
    if (!hex) throw invalid(`${where}: entry ${JSON.stringify(p)} has blob ${JSON.stringify(b)}, not a sha256 digest`, path);
    const size = field(e, "size");
    out.push({ path: typeof p === "string" ? p : "?", hex, size: Number.isSafeInteger(size) && (size as number) >= 0 ? (size as number) : null });
  }
  return out;
}

// ------------------------------------------------------------------------------ zstd frames

interface ZstdBinding {
  DCtx: new () => { decompress(dst: Uint8Array, src: Uint8Array): number };
  getFrameContentSize(frame: Uint8Array): number | null;
  compress(dst: Uint8Array, src: Uint8Array, level: number): number;
  compressBound(n: number): number;
}
let bindingCache: ZstdBinding | undefined;
/** zstd-napi's native binding (small synchronous frames only). */
export function zstdBinding(): ZstdBinding {
  bindingCache ??= createRequire(import.meta.url)("zstd-napi/binding") as ZstdBinding;
  return bindingCache;
}

/** Compress a small buffer synchronously (sampling, tests). */
export function zstdCompressSync(src: Uint8Array, level: number): Buffer {
  const b = zstdBinding();
  const dst = Buffer.allocUnsafe(b.compressBound(src.length));
  const n = b.compress(dst, src, level);
  return dst.subarray(0, n);
}

/** Frames at most this big (compressed) with a declared content size at most {@link SYNC_MAX_CONTENT} decompress synchronously. */
export const SYNC_MAX_COMPRESSED = 1024 * 1024;
export const SYNC_MAX_CONTENT = 8 * 1024 * 1024;

/** The decompressed bytes of a small single frame, or null when it is not small or the quick path fails (then use the worker). */
export function tryDecompressSmall(frame: Buffer, maxOutput?: number): Buffer | null {
  if (frame.length > SYNC_MAX_COMPRESSED) return null;
  const b = zstdBinding();
  let n: number | null;
  try {
    n = b.getFrameContentSize(frame);
  } catch {
    return null;
  }
  if (n === null || n > SYNC_MAX_CONTENT || (maxOutput !== undefined && n > maxOutput)) return null;
  try {
    const out = Buffer.allocUnsafe(n);
    const got = new b.DCtx().decompress(out, frame);
    return got === n ? out : null;
  } catch {
    return null;
  }
}

/** What a verified frame decompressed to. */
export interface FrameDigest {
  hex: string;
  size: number;
  /** True when every decompressed byte is zero. */
  zero: boolean;
}

function allZero(b: Uint8Array): boolean {
  // Compare 4 bytes at a time where aligned.
  const n4 = b.byteOffset % 4 === 0 ? b.length >>> 2 : 0;
  if (n4 > 0) {
    const w = new Uint32Array(b.buffer, b.byteOffset, n4);
    for (let i = 0; i < n4; i++) if (w[i] !== 0) return false;
  }
  for (let i = n4 << 2; i < b.length; i++) if (b[i] !== 0) return false;
  return true;
}
export { allZero as isAllZero };

/**
 * Decompress one zstd stream fed chunk by chunk and hash what comes out. Frames that end
 * up small are decompressed synchronously; bigger ones go through the zstd worker (fed as
 * they arrive, with back-pressure), so the main thread is never held on big data.
 * `onData` sees the decompressed bytes (text scanning). Errors (corrupt or truncated zstd,
 * more than `maxOutput` bytes) reject `push`/`end` with MEMSNAP_PAYLOAD_CORRUPT.
 */
export class FrameHasher {
  readonly #max: number | undefined;
  readonly #onData: ((b: Buffer) => void | Promise<void>) | undefined;
  #buffered: Buffer[] = [];
  #bufferedLen = 0;
  #hash = createHash("sha256");
  #size = 0;
  #zero = true;
  #dec: ReturnType<typeof createZstdDecompressor> | null = null;
  #consumed: Promise<void> | null = null;
  #err: unknown = null;

  constructor(opts: { maxOutput?: number; onData?: (b: Buffer) => void | Promise<void> } = {}) {
    this.#max = opts.maxOutput;
    this.#onData = opts.onData;
  }

  async #take(c: Buffer): Promise<void> {
    this.#hash.update(c);
    this.#size += c.length;
    if (this.#zero && !allZero(c)) this.#zero = false;
    if (this.#onData) await this.#onData(c);
  }

  #startWorker(): void {
    const dec = createZstdDecompressor(this.#max !== undefined ? { maxOutputBytes: this.#max } : {});
    this.#dec = dec;
    this.#consumed = (async () => {
      for await (const c of dec) await this.#take(c as Buffer);
    })().catch((e: unknown) => {
      this.#err = e;
      dec.destroy();
    });
  }

  async #write(c: Buffer): Promise<void> {
    const dec = this.#dec!;
    if (this.#err) throw this.#err;
    if (!dec.write(c)) await Promise.race([once(dec, "drain").catch(() => undefined), this.#consumed]);
    if (this.#err) throw this.#err;
  }

  async push(c: Buffer): Promise<void> {
    if (this.#dec === null) {
      this.#buffered.push(c);
      this.#bufferedLen += c.length;
      if (this.#bufferedLen <= SYNC_MAX_COMPRESSED) return;
      this.#startWorker();
      const held = this.#buffered;
      this.#buffered = [];
      for (const b of held) await this.#write(b);
      return;
    }
    await this.#write(c);
  }

  async end(): Promise<FrameDigest> {
    if (this.#dec === null) {
      const frame = this.#buffered.length === 1 ? this.#buffered[0]! : Buffer.concat(this.#buffered);
      const small = tryDecompressSmall(frame, this.#max);
      if (small) {
        await this.#take(small);
        return this.#digest();
      }
      this.#startWorker();
      this.#buffered = [];
      if (frame.length) await this.#write(frame);
    }
    const dec = this.#dec!;
    dec.end();
    await this.#consumed;
    if (this.#err) throw this.#err;
    return this.#digest();
  }

  #digest(): FrameDigest {
    return { hex: this.#hash.digest("hex"), size: this.#size, zero: this.#zero };
  }

  /** Stop early (the artifact's consumer went away). */
  abort(): void {
    this.#dec?.destroy();
  }
}

/** Decompress and hash a whole zstd stream given as chunks. */
export async function hashFrameChunks(chunks: AsyncIterable<Buffer>, opts: { maxOutput?: number; onData?: (b: Buffer) => void | Promise<void> } = {}): Promise<FrameDigest> {
  const h = new FrameHasher(opts);
  try {
    for await (const c of chunks) await h.push(c);
    return await h.end();
  } catch (e) {
    h.abort();
    throw e;
  }
}

/** Decompress a zstd stream into one buffer (structural JSON), capped at `maxOutput` bytes. */
export async function decompressToBuffer(frame: Buffer, maxOutput: number): Promise<{ bytes: Buffer; hex: string }> {
  const small = tryDecompressSmall(frame, maxOutput);
  if (small) return { bytes: small, hex: sha256Hex(small) };
  const parts: Buffer[] = [];
  const d = await hashFrameChunks((async function* () { yield frame; })(), { maxOutput, onData: (b) => { parts.push(b); } });
  return { bytes: Buffer.concat(parts), hex: d.hex };
}

// ------------------------------------------------------------------------------ scanning text

/**
 * Feeds decompressed text to the redactor in pieces cut at line ends (scan only: the
 * content is content-addressed and is never rewritten). Binary-looking content (a NUL byte
 * in its first 8 KiB) is skipped when `sniff` is set.
 */
/**
 * Where to cut a long text that has no newline (a JSON document on one line): just after its
 * last comma, else its last space or tab, in the final 64 KiB, so that a token or a `"key":
 * "value"` pair is not split between two scans; the whole text when there is none.
 */
function softCut(text: string): number {
  const stop = Math.max(0, text.length - 64 * 1024);
  let space = -1;
  for (let i = text.length - 1; i >= stop; i--) {
    const c = text.charCodeAt(i);
    if (c === 44) return i + 1; // ,
    if (space < 0 && (c === 32 || c === 9)) space = i + 1;
  }
  return space > 0 ? space : text.length;
}

export class TextScanner {
  readonly #redactor: Redactor;
  readonly #artifact: string;
  readonly #sniff: boolean;
  readonly #dec = new StringDecoder("utf8");
  #pending = "";
  /** Index in #pending just past its last newline, or -1: found in each decoded piece as it arrives. */
  #cut = -1;
  #seen = 0;
  #off = false;

  constructor(redactor: Redactor, artifact: string, sniff = false) {
    this.#redactor = redactor;
    this.#artifact = artifact;
    this.#sniff = sniff;
  }

  async #scan(text: string): Promise<void> {
    if (text && this.#redactor.candidate(text)) await this.#redactor.scanText(text, this.#artifact);
  }

  async push(b: Buffer): Promise<void> {
    if (this.#off) return;
    if (this.#sniff && this.#seen < 8192) {
      const head = b.subarray(0, 8192 - this.#seen);
      if (head.includes(0)) {
        this.#off = true;
        this.#pending = "";
        return;
      }
    }
    this.#seen += b.length;
    // Only the new piece is searched for a newline: lastIndexOf on the whole pending text
    // flattened it on every chunk, and a text without newlines (a dump manifest written as one
    // line) then copied 1 + 2 + … + 8 MiB of string per 8 MiB scanned (measured: the scale-10
    // KV manifest, 16 MiB on one line, grew the heap by ~50 MiB; peak RSS 197 MiB).
    const piece = this.#dec.write(b);
    const nl = piece.lastIndexOf("\n");
    if (nl >= 0) this.#cut = this.#pending.length + nl + 1;
    this.#pending += piece;
    if (this.#pending.length < 1 << 20) return;
    let cut = this.#cut;
    if (cut < 0) {
      if (this.#pending.length < 8 << 20) return;
      cut = softCut(this.#pending);
    }
    const text = this.#pending.slice(0, cut);
    this.#pending = this.#pending.slice(cut);
    this.#cut = -1; // the cut was at the last newline (or took everything)
    await this.#scan(text);
  }

  async end(): Promise<void> {
    if (this.#off) return;
    this.#pending += this.#dec.end();
    const rest = this.#pending;
    this.#pending = "";
    this.#cut = -1;
    await this.#scan(rest);
  }
}
