/** Planning a capture of a memsnap KV dump: `kv-manifest.json` and the data files its pages tile. */
import { createHash } from "node:crypto";
import { createReadStream } from "node:fs";
import { join } from "node:path";
import { dtypeBytes } from "../pfimg/format.js";
import { sourceChanged, sourceError, walkFiles } from "../walk.js";
import type { KvConfig } from "./config.js";
import { KV_MANIFEST, KV_MANIFEST_MAX_BYTES, kvInvalid } from "./format.js";
import { readKvManifest } from "./manifest.js";
import { SCAN_MAX, checkShape, sizeWord, statFile, type DataFile, type KvPlan, type VerbatimFile } from "./plan.js";

export async function planMemsnap(root: string, cfg: KvConfig): Promise<KvPlan> {
  const mAbs = join(root, KV_MANIFEST);
  const mSt = await statFile(mAbs, "dump manifest");
  if (mSt.size > KV_MANIFEST_MAX_BYTES) {
    throw kvInvalid(`kv: ${mAbs} is over the ${KV_MANIFEST_MAX_BYTES}-byte cap`, mAbs);
  }
  // Read as it streams (the manifest grows with the pages: ~200 bytes each), hashed on the way:
  // the bytes packed later must be these.
  const mHash = createHash("sha256");
  let mRead = 0;
  const m = await readKvManifest(
    (async function* () {
      try {
        for await (const c of createReadStream(mAbs, { start: 0, end: mSt.size, highWaterMark: 1 << 20 })) {
          mHash.update(c as Buffer);
          mRead += (c as Buffer).length;
          yield c as Buffer;
        }
      } catch (e) {
        throw sourceError(e, mAbs);
      }
    })(),
    mAbs,
  );
  if (mRead !== mSt.size) throw sourceChanged(mAbs, `size ${mSt.size} → ${mRead} while it was read`);
  checkShape(
    cfg,
    {
      nLayers: m.nLayers,
      nKvHeads: m.nKvHeads,
      headDim: m.headDim,
      dtype: m.dtype,
      blockSize: m.blockSize,
    },
    mAbs,
  );
  for (const f of m.dataFiles) {
    if (f.path === KV_MANIFEST) throw kvInvalid(`kv: ${mAbs} lists itself as a data file`, mAbs);
  }
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
        throw kvInvalid(
          `kv: data file ${f.path}: pages must tile it from offset 0 without gaps or overlaps; ` +
            `page ${pg.label(idx[i]!)} is at offset ${off}, expected ${i * m.pageBytes}`,
          abs,
        );
      }
    }
    const want = idx.length * m.pageBytes;
    if (st.size !== want) {
      throw kvInvalid(
        `kv: data file ${f.path} is ${sizeWord(st.size)}, but its ${idx.length} page(s) of ` +
          `[2, ${m.blockSize}, ${m.nKvHeads}, ${m.headDim}] ${m.dtype} (${m.pageBytes} bytes each) need ${want}`,
        abs,
      );
    }
    if (f.bytes !== null && f.bytes !== st.size) {
      throw kvInvalid(`kv: data file ${f.path} is ${sizeWord(st.size)}, ${KV_MANIFEST} says ${f.bytes}`, abs);
    }
    const pageLen = m.pageBytes;
    data.push({
      rel: f.path,
      abs,
      stats: st,
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
    if (f.rel === KV_MANIFEST) {
      verbatim.push({ rel: f.rel, abs: f.abs, stats: mSt, planned: mHash.digest("hex"), zst: null, scan: true });
    } else {
      const scan = /\.(json|jsonl|txt|md)$/.test(f.rel) && f.stats.size <= SCAN_MAX;
      verbatim.push({ rel: f.rel, abs: f.abs, stats: f.stats, planned: null, zst: null, scan });
    }
  }
  return {
    format: "memsnap",
    root,
    dtype: m.dtype,
    elem: dtypeBytes(m.dtype)!,
    pageBytes: m.pageBytes,
    data,
    verbatim,
    framePages: [],
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
