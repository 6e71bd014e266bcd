/**
 * A kv capture's plan, whatever the input format (plan-memsnap.ts, plan-pfimg.ts, plan-lmcache.ts):
 * the data files cut into tiles, the files kept verbatim, and what the layer meta records; and the
 * checks the planners share.
 */
import type { Stats } from "node:fs";
import { lstat, readFile } from "node:fs/promises";
import { MemsnapError } from "../../errors.js";
import { canonicalDtype } from "../pfimg/format.js";
import { decompressToBuffer } from "../pfimg/frames.js";
import { sourceChanged, sourceError, type FileStats } from "../walk.js";
import type { Format, KvConfig } from "./config.js";
import { KV_MANIFEST_MAX_BYTES, kvInvalid } from "./format.js";

/** Verbatim JSON files at most this big are scanned with the redactor. */
export const SCAN_MAX = 64 * 1024 * 1024;

export interface Tile {
  offset: number;
  len: number;
  label: string;
  /** Digest the dump declares (lowercase hex), or null. */
  sha: string | null;
  /** The dump declares the page all-zero. */
  zero: boolean;
}

/** A data file's tiles: its pages in offset order. */
export interface Tiles {
  readonly length: number;
  offset(i: number): number;
  len(i: number): number;
  label(i: number): string;
  /** Digest the dump declares (lowercase hex), or null. */
  sha(i: number): string | null;
  /** The dump declares the page all-zero. */
  zero(i: number): boolean;
}

export function listTiles(t: Tile[]): Tiles {
  return {
    length: t.length,
    offset: (i) => t[i]!.offset,
    len: (i) => t[i]!.len,
    label: (i) => t[i]!.label,
    sha: (i) => t[i]!.sha,
    zero: (i) => t[i]!.zero,
  };
}

export interface DataFile {
  rel: string;
  abs: string;
  stats: FileStats;
  tiles: Tiles;
}

export interface VerbatimFile {
  rel: string;
  abs: string;
  stats: FileStats;
  /** SHA-256 of the bytes read (and validated) while planning: the streamed bytes must match it. */
  planned: string | null;
  /** A ProcessFork page blob kept as its stored zstd frame: verified while streaming. */
  zst: { hex: string; what: string; expectRaw: number | null } | null;
  scan: boolean;
}

export interface KvPlan {
  format: Format;
  root: string;
  dtype: string;
  elem: number;
  pageBytes: number;
  data: DataFile[];
  verbatim: VerbatimFile[];
  /** Original pages stored inside verbatim zstd blobs: [label, blob hex]. */
  framePages: [string, string][];
  meta: Record<string, unknown>;
}

export function digestMismatch(msg: string, path: string): MemsnapError {
  return new MemsnapError("MEMSNAP_SOURCE_DIGEST_MISMATCH", msg, {
    path,
    hint:
      "the dump's pages do not match its manifest: re-export the KV dump " +
      "(a page changed after it was hashed, or the file is damaged)",
  });
}

export async function statFile(abs: string, what: string): Promise<Stats> {
  let st: Stats;
  try {
    st = await lstat(abs);
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code === "ENOENT") throw kvInvalid(`kv: ${what} ${abs} is missing`, abs);
    throw sourceError(e, abs);
  }
  if (!st.isFile()) throw kvInvalid(`kv: ${what} ${abs} is not a regular file`, abs);
  return st;
}

async function readSmall(abs: string, st: Stats, cap: number): Promise<Buffer> {
  if (st.size > cap) throw kvInvalid(`kv: ${abs} is ${st.size} bytes, over the ${cap}-byte cap`, abs);
  let b: Buffer;
  try {
    b = await readFile(abs);
  } catch (e) {
    throw sourceError(e, abs);
  }
  if (b.length !== st.size) throw sourceChanged(abs, `size ${st.size} → ${b.length}`);
  return b;
}

export const sizeWord = (n: number): string => `${n} byte${n === 1 ? "" : "s"}`;

export function checkShape(
  cfg: KvConfig,
  got: {
    nLayers: number | null;
    nKvHeads: number | null;
    headDim: number | null;
    dtype: string | null;
    blockSize: number | null;
  },
  where: string,
): void {
  const s = cfg.shape;
  if (!s) return;
  const pairs: [string, unknown, unknown][] = [
    ["n_layers", s.n_layers, got.nLayers],
    ["n_kv_heads", s.n_kv_heads, got.nKvHeads],
    ["head_dim", s.head_dim, got.headDim],
    ["block_size", s.block_size, got.blockSize],
  ];
  for (const [k, want, have] of pairs) {
    if (have !== null && want !== have) {
      throw kvInvalid(`kv: ${where} has ${k} ${String(have)}, the config's shape says ${String(want)}`);
    }
  }
  if (got.dtype !== null && canonicalDtype(got.dtype) !== canonicalDtype(s.dtype)) {
    throw kvInvalid(`kv: ${where} has dtype ${got.dtype}, the config's shape says ${s.dtype}`);
  }
}

export async function readPageManifest(abs: string, st: Stats): Promise<Buffer> {
  const raw = await readSmall(abs, st, KV_MANIFEST_MAX_BYTES);
  if (!abs.endsWith(".zst")) return raw;
  let out: { bytes: Buffer; hex: string };
  try {
    out = await decompressToBuffer(raw, KV_MANIFEST_MAX_BYTES);
  } catch (e) {
    throw kvInvalid(`kv: ${abs} is not a valid zstd frame: ${(e as Error).message}`, abs);
  }
  const m = /([0-9a-f]{64})\.zst$/.exec(abs);
  if (m && out.hex !== m[1]) {
    throw digestMismatch(`kv: page manifest ${abs} decompresses to sha256:${out.hex}, not the digest in its name`, abs);
  }
  return out.bytes;
}
