/** Types for gen-paged-kv.mjs (a synthetic paged KV dump: layer_NN.kvpages files and a manifest.json). */
export declare const GEN_PAGED_KV_VERSION: 1;
export interface PagedKvOptions {
  dir: string;
  seed?: number;
  pages?: number;
  distinct?: number;
  zeroPages?: number;
  pageBytes?: number;
  nLayers?: number;
  dtype?: "bf16" | "f16" | "f32" | "fp8e4m3";
  blockSize?: number;
  manifest?: boolean;
  hashes?: boolean;
}
export interface PagedKvDump {
  dir: string;
  pageBytes: number;
  files: { path: string; pages: number }[];
  rawBytes: number;
  expected: { pagesTotal: number; pagesUnique: number; pagesZero: number; storedBytes: number };
}
export declare function generatePagedKvDump(opts: PagedKvOptions): PagedKvDump;
