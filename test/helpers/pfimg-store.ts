/**
 * Synthetic ProcessFork image stores for tests: a typed face over scripts/lib/gen-pfimg.mjs
 * (plain ESM, shared with the benchmark's generators).
 */
export interface PfimgStoreOptions {
  root: string;
  seed?: number;
  nLayers?: number;
  nHeads?: number;
  headDim?: number;
  dtype?: "bf16" | "f16" | "f32" | "fp8e4m3";
  pages?: number;
  zeroPages?: number;
  forks?: number;
  merge?: boolean;
  camelCase?: boolean;
  oldCacheShape?: boolean;
  level?: number;
  pageLevel?: number;
  criu?: boolean;
  secret?: boolean;
  asBlob?: boolean;
}

export interface PfimgStore {
  root: string;
  images: { id: string; parents: string[]; kind: "root" | "fork" | "merge" }[];
  rootId: string;
  pageBytes: number;
  blobs: number;
  blobBytes: number;
}

export interface PagedCacheOptions {
  seed?: number;
  nLayers?: number;
  nHeads?: number;
  headDim?: number;
  dtype?: string;
  pageSizeTokens?: number;
  /** Content keys of the pages (null: an all-zero page). */
  pages?: (string | null)[];
  camelCase?: boolean;
  oldShape?: boolean;
  level?: number;
  pageLevel?: number;
  logicalSeqs?: boolean;
}

interface GenPfimg {
  generatePfimgStore(o: PfimgStoreOptions): PfimgStore;
  writeBlob(root: string, bytes: Buffer | string, level?: number): string;
  writeImage(root: string, manifest: object | Buffer | string, o?: { asBlob?: boolean; level?: number }): string;
  writePagedCache(root: string, o?: PagedCacheOptions): { manifest: string; pageBytes: number; pages: { ix: number; k: string; v: string }[]; json: string };
  blobPath(root: string, digest: string): string;
  imagePath(root: string, id: string): string;
  MEDIA_TYPE: string;
}

const mod = (await import(new URL("../../scripts/lib/gen-pfimg.mjs", import.meta.url).href)) as GenPfimg;

export const generatePfimgStore = mod.generatePfimgStore;
export const writeBlob = mod.writeBlob;
export const writeImage = mod.writeImage;
export const writePagedCache = mod.writePagedCache;
export const blobPath = mod.blobPath;
export const imagePath = mod.imagePath;
export const PF_MEDIA_TYPE = mod.MEDIA_TYPE;
