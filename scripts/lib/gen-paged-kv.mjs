/**
 * gen-paged-kv.mjs — a deterministic synthetic paged KV dump of the shape an inference engine's
 * exporter writes and memsnap does not know by name (issue #38): per-layer `layer_NN.kvpages`
 * files of pages of one size, and a `manifest.json` that gives `page_bytes`, the block tables
 * and per-page hashes. Plain ESM, Node built-ins only.
 *
 *   generatePagedKvDump(opts)   writes the dump; returns what memsnap should find in it
 *
 * Pages are KV-like values (kvValues of gen-kv.mjs: barely compressible, like real KV). Of the
 * `pages` pages, `zeroPages` are all zero (free blocks) and the others hold `distinct` distinct
 * contents (the zero page counts as one of them when there are zero pages), the repeats spread at
 * random (a fixed PRNG) over the layers, as when sequences share a prompt prefix. The same options
 * give byte-identical output; pages are written one at a time.
 */
import { createHash } from "node:crypto";
import fs from "node:fs";
import path from "node:path";
import { DTYPE_BYTES, kvValues } from "./gen-kv.mjs";
import { mulberry32 as prng } from "./prng.mjs";

export const GEN_PAGED_KV_VERSION = 1;

const FIXED_MTIME = new Date("2024-06-01T12:00:00Z");


/**
 * Write a paged dump under `dir`. Options: seed (1), pages (6400), distinct (3841), zeroPages
 * (320), pageBytes (65536), nLayers (32; the pages are split evenly over `layer_NN.kvpages`,
 * the first files taking one more when they do not divide), dtype ("bf16"), blockSize (16,
 * recorded only), manifest (true: write manifest.json), hashes (true: per-page SHA-256 in it).
 *
 * Returns { dir, pageBytes, files: [{ path, pages }], rawBytes, expected: { pagesTotal,
 * pagesUnique (distinct non-zero contents), pagesZero, storedBytes (pagesUnique × pageBytes) } }.
 */
export function generatePagedKvDump(opts) {
  const {
    dir, seed = 1, pages = 6400, distinct = 3841, zeroPages = 320, pageBytes = 65536, nLayers = 32, dtype = "bf16",
    blockSize = 16, manifest = true, hashes = true,
  } = opts;
  if (!DTYPE_BYTES[dtype]) throw new Error(`unknown dtype ${dtype}`);
  const nonZero = distinct - (zeroPages > 0 ? 1 : 0);
  if (nonZero < 0 || nonZero > pages - zeroPages || (nonZero === 0 && pages > zeroPages)) {
    throw new Error(`cannot lay out ${pages} pages with ${distinct} distinct contents and ${zeroPages} zero pages`);
  }
  const rand = prng(seed * 2654435761);
  // Content per page: -1 zero, else a content id. Zero pages at random places; the others take
  // every id once and repeats of random ids, in a random order.
  const content = new Int32Array(pages);
  const order = Array.from({ length: pages }, (_, i) => i);
  for (let i = pages - 1; i > 0; i--) {
    const j = Math.floor(rand() * (i + 1));
    [order[i], order[j]] = [order[j], order[i]];
  }
  const ids = Array.from({ length: pages - zeroPages }, (_, i) => (i < nonZero ? i : Math.floor(rand() * nonZero)));
  for (let i = ids.length - 1; i > 0; i--) {
    const j = Math.floor(rand() * (i + 1));
    [ids[i], ids[j]] = [ids[j], ids[i]];
  }
  for (let k = 0; k < pages; k++) content[order[k]] = k < zeroPages ? -1 : ids[k - zeroPages];

  fs.mkdirSync(dir, { recursive: true });
  const zero = Buffer.alloc(pageBytes);
  const zeroSha = createHash("sha256").update(zero).digest("hex");
  const shaOf = new Map();
  const files = [];
  const layers = [];
  const blockTables = {};
  let next = 0;
  for (let l = 0; l < nLayers; l++) {
    const n = Math.floor(pages / nLayers) + (l < pages % nLayers ? 1 : 0);
    const name = `layer_${String(l).padStart(2, "0")}.kvpages`;
    const file = path.join(dir, name);
    const fd = fs.openSync(file, "w", 0o644);
    const pageShas = [];
    try {
      for (let i = 0; i < n; i++, next++) {
        const id = content[next];
        const b = id < 0 ? zero : kvValues(seed, `paged/${id}`, pageBytes, dtype);
        fs.writeSync(fd, b);
        if (hashes) {
          let h = id < 0 ? zeroSha : shaOf.get(id);
          if (h === undefined) shaOf.set(id, (h = createHash("sha256").update(b).digest("hex")));
          pageShas.push(h);
        }
      }
    } finally {
      fs.closeSync(fd);
    }
    fs.utimesSync(file, FIXED_MTIME, FIXED_MTIME);
    files.push({ path: name, pages: n });
    layers.push({ layer: l, file: name, pages: n, ...(hashes ? { page_sha256: pageShas } : {}) });
    // One block table per layer file here: block ids are page numbers in the file, zero pages are free.
    const table = [];
    for (let i = 0; i < n; i++) if (content[next - n + i] >= 0) table.push(i);
    blockTables[`seq-${l}`] = table;
  }
  if (manifest) {
    const doc = {
      format: "paged-kv-export", version: GEN_PAGED_KV_VERSION, page_bytes: pageBytes, dtype, block_size: blockSize,
      n_layers: nLayers, layers, block_tables: blockTables,
    };
    const m = path.join(dir, "manifest.json");
    fs.writeFileSync(m, JSON.stringify(doc));
    fs.utimesSync(m, FIXED_MTIME, FIXED_MTIME);
  }
  return {
    dir, pageBytes, files, rawBytes: pages * pageBytes,
    expected: { pagesTotal: pages, pagesUnique: nonZero, pagesZero: zeroPages, storedBytes: nonZero * pageBytes },
  };
}
