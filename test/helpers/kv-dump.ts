/**
 * Synthetic KV-cache dumps for tests: a typed face over scripts/lib/gen-kv.mjs (plain ESM,
 * shared with the benchmark's generators).
 */
export type KvDtype = "bf16" | "f16" | "f32" | "fp8e4m3";

export interface KvDumpOptions {
  dir: string;
  seed?: number;
  nLayers?: number;
  nKvHeads?: number;
  headDim?: number;
  dtype?: KvDtype;
  blockSize?: number;
  sequences?: number;
  prefixBlocks?: number;
  ownBlocks?: number;
  zeroBlocks?: number;
  hashes?: boolean;
  layout?: "per-layer" | "per-page";
  engine?: unknown;
  modelName?: string;
  shuffleBlocks?: boolean;
}

export interface Expected {
  pagesTotal: number;
  pagesUnique: number;
  pagesZero: number;
  dedupRatio: number;
}

export interface KvDump {
  dir: string;
  manifestPath: string;
  pageBytes: number;
  numBlocks: number;
  dataBytes: number;
  expected: Expected;
}

export interface LmcacheShape {
  n_layers: number;
  n_kv_heads: number;
  head_dim: number;
  dtype: KvDtype;
  block_size?: number;
  tokens_per_chunk?: number;
}

interface GenKv {
  generateKvDump(o: KvDumpOptions): KvDump;
  kvDumpOptionsForBytes(target: number, base?: Partial<KvDumpOptions>): Omit<KvDumpOptions, "dir">;
  generateLmcacheChunks(o: { dir: string; seed?: number; shape: LmcacheShape; sequences?: number; prefixChunks?: number; ownChunks?: number; lastTokens?: number }): {
    dir: string; files: { path: string; bytes: number }[]; pageBytes: number; expected: Expected;
  };
  kvValues(seed: number, key: string, n: number, dtype: KvDtype): Buffer;
  kvPageBytes(o: { nKvHeads: number; headDim: number; dtype: KvDtype; blockSize?: number }): number;
}

const mod = (await import(new URL("../../scripts/lib/gen-kv.mjs", import.meta.url).href)) as GenKv;

export const generateKvDump = mod.generateKvDump;
export const kvDumpOptionsForBytes = mod.kvDumpOptionsForBytes;
export const generateLmcacheChunks = mod.generateLmcacheChunks;
export const kvValues = mod.kvValues;
export const kvPageBytes = mod.kvPageBytes;
