/** Planning a capture of headerless LMCache-style chunk files, their shape given in the config. */
import { stat } from "node:fs/promises";
import { dirname } from "node:path";
import { dtypeBytes } from "../pfimg/format.js";
import { sourceError, walkFiles } from "../walk.js";
import type { KvConfig } from "./config.js";
import { KV_MAX_PAGE_BYTES, kvInvalid } from "./format.js";
import { listTiles, sizeWord, type DataFile, type KvPlan, type Tile } from "./plan.js";

export async function planLmcache(pathAbs: string, cfg: KvConfig): Promise<KvPlan> {
  const s = cfg.shape!;
  const eb = dtypeBytes(s.dtype)!;
  const row = 2 * s.n_layers * s.n_kv_heads * s.head_dim * eb;
  const pageBytes = s.block_size * s.n_kv_heads * s.head_dim * eb;
  if (pageBytes > KV_MAX_PAGE_BYTES) {
    throw kvInvalid(`kv: pages of ${pageBytes} bytes are over the ${KV_MAX_PAGE_BYTES}-byte cap`);
  }
  const st = await stat(pathAbs).catch((e: unknown) => {
    throw sourceError(e, pathAbs);
  });
  const root = st.isDirectory() ? pathAbs : dirname(pathAbs);
  const { files, skipped } = await walkFiles(pathAbs);
  const data: DataFile[] = [];
  for (const f of files) {
    const size = f.stats.size;
    const tokens = size / row;
    if (size === 0 || !Number.isInteger(tokens) || tokens > s.tokens_per_chunk) {
      throw kvInvalid(
        `kv: chunk file ${f.rel} is ${sizeWord(size)}, not 1..${s.tokens_per_chunk} tokens of ` +
          `[${s.n_layers} layers, 2, tokens, ${s.n_kv_heads} heads, ${s.head_dim}] ${s.dtype} (${row} bytes per token)`,
        f.abs,
      );
    }
    const tiles: Tile[] = [];
    for (let off = 0, i = 0; off < size; off += pageBytes, i++) {
      tiles.push({ offset: off, len: Math.min(pageBytes, size - off), label: `${f.rel}#${i}`, sha: null, zero: false });
    }
    data.push({ rel: f.rel, abs: f.abs, stats: f.stats, tiles: listTiles(tiles) });
  }
  return {
    format: "lmcache",
    root,
    dtype: s.dtype,
    elem: eb,
    pageBytes,
    data,
    verbatim: [],
    framePages: [],
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
