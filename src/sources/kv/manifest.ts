/** Reading and validating a memsnap KV dump's `kv-manifest.json` (docs/FORMAT.md "KV dump format"). */
import { JsonStreamError, streamJson } from "../../util/json-stream.js";
import { dtypeBytes, field, isObject, posInt } from "../pfimg/format.js";
import { Grow, KV_DUMP_FORMAT, KV_MANIFEST, KV_MAX_PAGE_BYTES, kvInvalid as invalid, safeRel } from "./format.js";

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
export async function readKvManifest(
  chunks: AsyncIterable<Uint8Array> | Iterable<Uint8Array>,
  path: string,
): Promise<KvDumpManifest> {
  const where = `kv: ${path}`;
  const pages = new KvDumpPages();
  // Data files as the pages name them, in order of first mention (reconciled with data_files at the end).
  const named = new Map<string, number>();
  const namedList: string[] = [];
  /** The first problem a page has on its own (its index and message); later pages are still read. */
  let early: { i: number; msg: string } | null = null;
  const onPage = (p: unknown, i: number): void => {
    if (early) return;
    const bad = (msg: string): void => {
      early = { i, msg };
    };
    if (!isObject(p)) return bad(`${where}: pages[${i}] is not an object`);
    const layer = p.layer;
    const block = p.block;
    if (!Number.isSafeInteger(layer) || (layer as number) < 0) {
      return bad(`${where}: pages[${i}].layer ${JSON.stringify(layer)} is not in 0..`);
    }
    if (!Number.isSafeInteger(block) || (block as number) < 0) {
      return bad(`${where}: pages[${i}].block ${JSON.stringify(block)} is not a non-negative integer`);
    }
    if (!safeRel(p.file)) {
      return bad(`${where}: pages[${i}].file ${JSON.stringify(p.file)} is not a safe relative path`);
    }
    if (p.file === KV_MANIFEST) return bad(`${where}: pages[${i}] points into ${KV_MANIFEST}`);
    const offset = p.offset ?? 0;
    if (!Number.isSafeInteger(offset) || (offset as number) < 0) {
      return bad(`${where}: pages[${i}].offset ${JSON.stringify(p.offset)} is not a multiple of the page size`);
    }
    const sha = p.sha256 ?? "";
    if (typeof sha !== "string" || (sha !== "" && !/^(sha256:)?[0-9a-fA-F]{64}$/.test(sha))) {
      return bad(`${where}: pages[${i}].sha256 ${JSON.stringify(sha)} is not a hex SHA-256 (or "")`);
    }
    const zero = p.zero ?? false;
    if (typeof zero !== "boolean") return bad(`${where}: pages[${i}].zero must be true or false`);
    let f = named.get(p.file);
    if (f === undefined) {
      f = namedList.push(p.file) - 1;
      named.set(p.file, f);
    }
    const hex = sha ? sha.replace(/^sha256:/, "").toLowerCase() : null;
    pages.push(layer as number, block as number, f, offset as number, zero, hex);
  };
  let doc: Record<string, unknown>;
  try {
    doc = await streamJson(chunks, { arrays: { pages: onPage } });
  } catch (e) {
    if (e instanceof JsonStreamError) throw invalid(`${where} is not valid JSON: ${e.message}`, path);
    throw e;
  }
  if (doc.format !== KV_DUMP_FORMAT) {
    throw invalid(`${where}: format is ${JSON.stringify(doc.format)}, expected "${KV_DUMP_FORMAT}"`, path);
  }
  if (doc.format_version !== 1) {
    throw invalid(`${where}: format_version ${JSON.stringify(doc.format_version)}; this memsnap reads 1`, path);
  }
  const model = doc.model;
  const nLayers = posInt(field(model, "n_layers"));
  const nKvHeads = posInt(field(model, "n_kv_heads"));
  const headDim = posInt(field(model, "head_dim"));
  if (!nLayers || !nKvHeads || !headDim) {
    throw invalid(`${where}: model.n_layers, model.n_kv_heads and model.head_dim must be positive integers`, path);
  }
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
    throw invalid(
      `${where}: page.shape ${JSON.stringify(shape)} does not match ` +
        `[2, block_size, n_kv_heads, head_dim] = ${JSON.stringify(wantShape)}`,
      path,
    );
  }
  if (page.bytes !== pageBytes) {
    throw invalid(
      `${where}: page.bytes ${JSON.stringify(page.bytes)} is not ` +
        `2 × ${blockSize} × ${nKvHeads} × ${headDim} × ${eb} = ${pageBytes}`,
      path,
    );
  }
  if (pageBytes > KV_MAX_PAGE_BYTES) {
    throw invalid(`${where}: pages of ${pageBytes} bytes are over the ${KV_MAX_PAGE_BYTES}-byte cap`, path);
  }
  const dataFiles: KvDumpManifest["dataFiles"] = [];
  const declared = new Map<string, number>();
  if (doc.data_files !== undefined) {
    if (!Array.isArray(doc.data_files)) throw invalid(`${where}: data_files must be an array`, path);
    for (const f of doc.data_files) {
      const p = field(f, "path");
      const b = field(f, "bytes");
      if (!safeRel(p)) throw invalid(`${where}: data file path ${JSON.stringify(p)} is not a safe relative path`, path);
      if (b !== undefined && !(Number.isSafeInteger(b) && (b as number) >= 0)) {
        throw invalid(`${where}: data file ${p} has bytes ${JSON.stringify(b)}`, path);
      }
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
    if (offset % pageBytes !== 0) {
      throw invalid(`${where}: pages[${i}].offset ${offset} is not a multiple of the page size ${pageBytes}`, path);
    }
    const fi = pages.file.a[i]!;
    if (fileMap[fi] === -1) {
      const name = namedList[fi]!;
      const d = declared.get(name);
      if (d !== undefined) fileMap[fi] = d;
      else if (doc.data_files !== undefined) {
        throw invalid(`${where}: pages[${i}].file ${name} is not in data_files`, path);
      } else {
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
    if (pages.layer.a[a] === pages.layer.a[b] && pages.block.a[a] === pages.block.a[b] && (dup === -1 || b < dup)) {
      dup = b;
    }
  }
  if (dup !== -1) {
    throw invalid(`${where}: layer ${pages.layer.a[dup]!} block ${pages.block.a[dup]!} is listed twice`, path);
  }
  if (early !== null) {
    const e = early as { i: number; msg: string };
    const msg = e.msg.endsWith("is not in 0..")
      ? `${e.msg}${nLayers - 1}`
      : e.msg.endsWith("multiple of the page size")
        ? `${e.msg} ${pageBytes}`
        : e.msg;
    throw invalid(msg, path);
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
      if ((typeof id !== "string" && typeof id !== "number") || !Array.isArray(bl)) {
        throw invalid(`${where}: sequences[${i}] needs seq_id and blocks`, path);
      }
      for (const b of bl) {
        if (!Number.isSafeInteger(b) || !hasBlock(b as number)) {
          throw invalid(`${where}: sequence ${String(id)} names block ${JSON.stringify(b)}, which has no page`, path);
        }
      }
      sequences.push({ seqId: String(id), blocks: bl as number[] });
    }
  }
  return {
    engine: doc.engine ?? null,
    nLayers,
    nKvHeads,
    headDim,
    dtype,
    blockSize,
    pageBytes,
    dataFiles,
    pages,
    sequences,
  };
}
