/**
 * gen-kv.mjs — deterministic synthetic KV-cache dumps for memsnap's tests and benchmark.
 * Plain ESM, Node built-ins only.
 *
 *   generateKvDump(opts)          a memsnap KV dump directory (kv-manifest.json + data files,
 *                                 see docs/FORMAT.md "KV dump format"): N sequences that share
 *                                 a prompt prefix (duplicated in separate blocks, as an engine
 *                                 without prefix caching holds it), plus free all-zero blocks
 *   kvDumpOptionsForBytes(n, o)   options that make generateKvDump write about n data bytes
 *   generateLmcacheChunks(opts)   headerless LMCache-style chunk files ([layers, 2, tokens,
 *                                 kv_heads, head_dim]); shared-prefix chunks repeat under
 *                                 different names (prefix hashes differ across restarts)
 *   kvValues(seed, key, n, dtype) n bytes of "realistic" KV values (sign/mantissa uniform,
 *                                 exponent spread like |N(0,1)|: barely compressible, like real KV)
 *
 * The same seed and options give byte-identical output. Data is produced page by page and
 * written in ≤ 4 MiB pieces; no dump is held in memory whole.
 */
import { createCipheriv, createHash } from "node:crypto";
import fs from "node:fs";
import path from "node:path";

export const GEN_KV_VERSION = 1;

/** Bytes per element of each dtype memsnap knows. */
export const DTYPE_BYTES = { bf16: 2, f16: 2, f32: 4, fp8e4m3: 1 };

const FIXED_MTIME = new Date("2024-06-01T12:00:00Z");
const WRITE_CHUNK = 4 * 1024 * 1024;

function eb(dtype) {
  const n = DTYPE_BYTES[dtype];
  if (!n) throw new Error(`unknown dtype ${dtype} (bf16, f16, f32, fp8e4m3)`);
  return n;
}

/** Bytes of one memsnap KV page: K and V of one layer for one block, [2, block_size, n_kv_heads, head_dim]. */
export function kvPageBytes({ nKvHeads, headDim, dtype, blockSize = 16 }) {
  return 2 * blockSize * nKvHeads * headDim * eb(dtype);
}

// ------------------------------------------------------------------------------ values

// 32-entry exponent table: offsets from the exponent of 1.0, weighted like |N(0,1)|.
const EXP_OFFSETS = (() => {
  const w = [[1, 1], [0, 9], [-1, 10], [-2, 6], [-3, 3], [-4, 2], [-5, 1]];
  const t = [];
  for (const [e, n] of w) for (let i = 0; i < n; i++) t.push(e);
  return t;
})();
const LUT_F16 = new Uint16Array(65536);
const LUT_BF16 = new Uint16Array(65536);
for (let r = 0; r < 65536; r++) {
  const e = EXP_OFFSETS[(r >>> 10) & 31];
  LUT_F16[r] = (r & 0x8000) | ((15 + e) << 10) | (r & 0x3ff);
  LUT_BF16[r] = (r & 0x8000) | ((127 + e) << 7) | (r & 0x7f);
}
const LUT_FP8 = new Uint8Array(256);
for (let r = 0; r < 256; r++) {
  const e = Math.max(1, Math.min(15, 7 + EXP_OFFSETS[(r >>> 3) & 31]));
  LUT_FP8[r] = (r & 0x80) | (e << 3) | (r & 0x7);
}

const ZEROS = Buffer.alloc(WRITE_CHUNK);

/** n deterministic bytes of KV-like values of `dtype` for content key `key`. */
export function kvValues(seed, key, n, dtype) {
  const k = createHash("sha256").update(`memsnap-kv/v${GEN_KV_VERSION}/${seed}/${key}`).digest();
  const c = createCipheriv("aes-256-ctr", k, Buffer.alloc(16));
  const out = Buffer.alloc(n);
  let off = 0;
  while (off < n) {
    const m = Math.min(WRITE_CHUNK, n - off);
    const r = c.update(ZEROS.subarray(0, m));
    const dst = out.subarray(off, off + m);
    if (dtype === "f16" || dtype === "bf16") {
      const lut = dtype === "f16" ? LUT_F16 : LUT_BF16;
      for (let i = 0; i + 1 < m; i += 2) {
        const v = lut[r[i] | (r[i + 1] << 8)];
        dst[i] = v & 0xff;
        dst[i + 1] = v >>> 8;
      }
    } else if (dtype === "f32") {
      for (let i = 0; i + 3 < m; i += 4) {
        const e = 127 + EXP_OFFSETS[r[i + 3] & 31];
        // sign | exponent | 23 random mantissa bits, little-endian
        dst[i] = r[i];
        dst[i + 1] = r[i + 1];
        dst[i + 2] = (r[i + 2] & 0x7f) | ((e & 1) << 7);
        dst[i + 3] = (r[i + 3] & 0x80) | (e >>> 1);
      }
    } else if (dtype === "fp8e4m3") {
      for (let i = 0; i < m; i++) dst[i] = LUT_FP8[r[i]];
    } else {
      throw new Error(`unknown dtype ${dtype}`);
    }
    off += m;
  }
  return out;
}

// ------------------------------------------------------------------------------ writing

function sha256(b) {
  return createHash("sha256").update(b).digest("hex");
}

/** Sequential writer with a ≤ 4 MiB buffer. */
class FileWriter {
  constructor(file) {
    fs.mkdirSync(path.dirname(file), { recursive: true });
    this.file = file;
    this.fd = fs.openSync(file, "w", 0o644);
    this.parts = [];
    this.len = 0;
    this.bytes = 0;
  }
  write(b) {
    this.parts.push(b);
    this.len += b.length;
    this.bytes += b.length;
    if (this.len >= WRITE_CHUNK) this.flush();
  }
  flush() {
    if (this.len) fs.writeSync(this.fd, Buffer.concat(this.parts, this.len));
    this.parts = [];
    this.len = 0;
  }
  close() {
    this.flush();
    fs.closeSync(this.fd);
    fs.utimesSync(this.file, FIXED_MTIME, FIXED_MTIME);
  }
}

/**
 * Writes JSON.stringify(doc, null, 1) + "\n" (the same bytes) without building the whole text:
 * the top-level arrays named in `streamKeys` are written one element at a time.
 */
function writeJson(file, doc, streamKeys = []) {
  const marks = new Map();
  const shallow = { ...doc };
  for (const k of streamKeys) {
    if (!Array.isArray(doc[k]) || doc[k].length === 0) continue;
    const m = `\u0000stream:${k}\u0000`;
    marks.set(JSON.stringify(m), doc[k]);
    shallow[k] = m;
  }
  const w = new FileWriter(file);
  let text = JSON.stringify(shallow, null, 1) + "\n";
  for (const [m, arr] of marks) {
    const at = text.indexOf(m);
    w.write(Buffer.from(text.slice(0, at) + "[\n", "utf8"));
    arr.forEach((el, i) => {
      const s = JSON.stringify(el, null, 1).replace(/^/gm, "  ");
      w.write(Buffer.from(i < arr.length - 1 ? `${s},\n` : `${s}\n ]`, "utf8"));
    });
    text = text.slice(at + m.length);
  }
  w.write(Buffer.from(text, "utf8"));
  w.close();
}

/**
 * Write a memsnap KV dump into `dir` (created; must not hold an older dump).
 *
 * Physical blocks: each of `sequences` sequences gets `prefixBlocks` blocks whose content is
 * the shared prefix (identical across sequences) and `ownBlocks` blocks of its own; then
 * `zeroBlocks` free blocks of zeros. Every layer holds the same block table, its content
 * keyed by layer (so layers never dedup with each other).
 *
 * Options: dir, seed (1), nLayers (4), nKvHeads (2), headDim (64), dtype ("bf16"), blockSize (16),
 * sequences (4), prefixBlocks (2), ownBlocks (2), zeroBlocks (2), hashes (true: fill each
 * page's sha256; false: leave "" for memsnap to compute), layout ("per-layer": one data file
 * per layer, "per-page": one file per page), engine, modelName, shuffleBlocks (false: block ids
 * in sequence order; true: a deterministic permutation, like a real allocator).
 *
 * Returns { dir, manifestPath, pageBytes, numBlocks, dataBytes, expected: { pagesTotal,
 * pagesUnique, pagesZero, dedupRatio } } where pagesUnique counts distinct non-zero pages and
 * dedupRatio = pagesTotal / pagesUnique.
 */
export function generateKvDump(opts) {
  const {
    dir, seed = 1, nLayers = 4, nKvHeads = 2, headDim = 64, dtype = "bf16", blockSize = 16,
    sequences = 4, prefixBlocks = 2, ownBlocks = 2, zeroBlocks = 2, hashes = true, layout = "per-layer",
    engine = { name: "synthetic", version: `gen-kv/${GEN_KV_VERSION}` }, modelName = "synthetic-kv",
    shuffleBlocks = false,
  } = opts;
  const pageBytes = kvPageBytes({ nKvHeads, headDim, dtype, blockSize });
  const numBlocks = sequences * (prefixBlocks + ownBlocks) + zeroBlocks;
  // Logical block list, then a permutation to physical ids.
  const logical = [];
  for (let s = 0; s < sequences; s++) {
    for (let j = 0; j < prefixBlocks; j++) logical.push({ key: `prefix/${j}`, seq: s });
    for (let j = 0; j < ownBlocks; j++) logical.push({ key: `seq${s}/${j}`, seq: s });
  }
  for (let z = 0; z < zeroBlocks; z++) logical.push({ key: null, seq: -1 });
  const perm = logical.map((_, i) => i);
  if (shuffleBlocks) {
    const h = createHash("sha256").update(`perm/${seed}`).digest();
    let x = h.readUInt32LE(0) | 1;
    for (let i = perm.length - 1; i > 0; i--) {
      x ^= x << 13; x ^= x >>> 17; x ^= x << 5;
      const j = (x >>> 0) % (i + 1);
      [perm[i], perm[j]] = [perm[j], perm[i]];
    }
  }
  const blockOf = new Array(numBlocks); // physical id → logical entry
  logical.forEach((l, i) => { blockOf[perm[i]] = l; });
  const seqs = [];
  for (let s = 0; s < sequences; s++) {
    const blocks = [];
    logical.forEach((l, i) => { if (l.seq === s) blocks.push(perm[i]); });
    seqs.push({ seq_id: `seq-${s}`, num_tokens: blocks.length * blockSize, blocks });
  }

  fs.mkdirSync(dir, { recursive: true });
  const pages = [];
  const dataFiles = [];
  const zero = Buffer.alloc(pageBytes);
  const zeroSha = sha256(zero);
  let dataBytes = 0;
  for (let l = 0; l < nLayers; l++) {
    let w = null;
    let rel = null;
    if (layout === "per-layer") {
      rel = `data/layer-${String(l).padStart(3, "0")}.bin`;
      w = new FileWriter(path.join(dir, rel));
    }
    for (let b = 0; b < numBlocks; b++) {
      const entry = blockOf[b];
      const bytes = entry.key === null ? zero : kvValues(seed, `L${l}/${entry.key}`, pageBytes, dtype);
      let offset = 0;
      if (layout === "per-page") {
        rel = `pages/L${String(l).padStart(3, "0")}-B${String(b).padStart(6, "0")}.bin`;
        const pw = new FileWriter(path.join(dir, rel));
        pw.write(bytes);
        pw.close();
        dataFiles.push({ path: rel, bytes: pageBytes });
      } else {
        offset = w.bytes;
        w.write(bytes);
      }
      pages.push({
        layer: l, block: b, file: rel, offset,
        sha256: hashes ? (entry.key === null ? zeroSha : sha256(bytes)) : "",
        zero: entry.key === null,
      });
      dataBytes += pageBytes;
    }
    if (w) {
      w.close();
      dataFiles.push({ path: rel, bytes: w.bytes });
    }
  }
  const manifest = {
    format: "memsnap-kv-dump",
    format_version: 1,
    engine,
    model: { name: modelName, n_layers: nLayers, n_kv_heads: nKvHeads, head_dim: headDim },
    dtype,
    block_size: blockSize,
    page: { layout: "kv-block", shape: [2, blockSize, nKvHeads, headDim], bytes: pageBytes },
    data_files: dataFiles,
    pages,
    sequences: seqs,
  };
  const manifestPath = path.join(dir, "kv-manifest.json");
  writeJson(manifestPath, manifest, ["pages"]);
  const uniquePerLayer = (prefixBlocks > 0 ? prefixBlocks : 0) + sequences * ownBlocks;
  const pagesTotal = nLayers * numBlocks;
  const pagesUnique = nLayers * uniquePerLayer;
  return {
    dir, manifestPath, pageBytes, numBlocks, dataBytes,
    expected: { pagesTotal, pagesUnique, pagesZero: nLayers * zeroBlocks, dedupRatio: pagesTotal / pagesUnique },
  };
}

/**
 * Options for generateKvDump that write about `targetBytes` of page data with the given
 * model shape: 4 sequences sharing a prefix of 25 % of their blocks, and 1 zero block per
 * 16 blocks (overridable through `base`).
 */
export function kvDumpOptionsForBytes(targetBytes, base = {}) {
  const o = { nLayers: 32, nKvHeads: 8, headDim: 128, dtype: "bf16", blockSize: 16, sequences: 4, ...base };
  const pageBytes = kvPageBytes(o);
  const blocks = Math.max(o.sequences + 1, Math.round(targetBytes / (pageBytes * o.nLayers)));
  const zeroBlocks = base.zeroBlocks ?? Math.max(1, Math.round(blocks / 16));
  const perSeq = Math.max(1, Math.floor((blocks - zeroBlocks) / o.sequences));
  const prefixBlocks = base.prefixBlocks ?? Math.max(1, Math.round(perSeq / 4));
  const ownBlocks = base.ownBlocks ?? Math.max(1, perSeq - prefixBlocks);
  return { ...o, prefixBlocks, ownBlocks, zeroBlocks };
}

/**
 * Write LMCache-style raw chunk files into `dir`: headerless, each [n_layers, 2, tokens,
 * n_kv_heads, head_dim] of `dtype`. Each of `sequences` sequences stores `prefixChunks`
 * chunks of the shared prefix (identical bytes, a different file name per sequence — its
 * prefix hash) and `ownChunks` chunks of its own; `lastTokens` (< tokens_per_chunk) makes
 * each sequence's last chunk partial.
 *
 * Returns { dir, files, pageBytes, expected: { pagesTotal, pagesUnique, pagesZero: 0 } } with
 * pages being the contiguous slices of block_size × n_kv_heads × head_dim elements memsnap
 * cuts chunk files into.
 */
export function generateLmcacheChunks(opts) {
  const { dir, seed = 1, shape, sequences = 3, prefixChunks = 2, ownChunks = 1, lastTokens = 0 } = opts;
  const { n_layers: L, n_kv_heads: H, head_dim: D, dtype, block_size: B = 16, tokens_per_chunk: T = 256 } = shape;
  const e = eb(dtype);
  const row = 2 * L * H * D * e;
  const pageBytes = B * H * D * e;
  fs.mkdirSync(dir, { recursive: true });
  const files = [];
  const pagesOf = (bytes) => Math.ceil(bytes / pageBytes);
  let pagesTotal = 0;
  const uniq = new Map(); // content key → pages
  const put = (name, key, tokens) => {
    const bytes = row * tokens;
    const buf = kvValues(seed, `lmcache/${key}/${tokens}`, bytes, dtype);
    const file = path.join(dir, name);
    fs.writeFileSync(file, buf, { mode: 0o644 });
    fs.utimesSync(file, FIXED_MTIME, FIXED_MTIME);
    files.push({ path: name, bytes });
    pagesTotal += pagesOf(bytes);
    uniq.set(`${key}/${tokens}`, pagesOf(bytes));
  };
  for (let s = 0; s < sequences; s++) {
    // A prefix hash that differs per sequence ("engine restart") for the same content.
    const h = (k) => createHash("sha256").update(`restart${s}/${k}`).digest("hex").slice(0, 16);
    for (let c = 0; c < prefixChunks; c++) put(`chunk-${h(`p${c}`)}.kvchunk`, `prefix/${c}`, T);
    for (let c = 0; c < ownChunks; c++) {
      const last = c === ownChunks - 1 && lastTokens > 0;
      put(`chunk-${h(`s${s}/${c}`)}.kvchunk`, `seq${s}/${c}`, last ? lastTokens : T);
    }
  }
  const pagesUnique = [...uniq.values()].reduce((a, b) => a + b, 0);
  return { dir, files, pageBytes, expected: { pagesTotal, pagesUnique, pagesZero: 0, dedupRatio: pagesTotal / pagesUnique } };
}
