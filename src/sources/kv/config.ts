/** The kv source's config: the dump's path, its input format, its shape and the shuffle. */
import {
  configInvalid,
  isPlainObject,
  optInt,
  optString,
  rejectUnknownKeys,
  reqString,
} from "../../util/config-check.js";
import { dtypeBytes } from "../pfimg/format.js";
import { KV_MAX_PAGE_BYTES, KV_MIN_PAGE_BYTES } from "./format.js";

export interface KvShape {
  n_layers: number;
  n_kv_heads: number;
  head_dim: number;
  dtype: string;
  block_size: number;
  tokens_per_chunk: number;
}

export interface KvConfig {
  kind: "kv";
  name: string;
  path: string;
  format?: "memsnap" | "pfimg-paged" | "lmcache" | "paged";
  /** `paged`: the size of every page (else the dump's manifest.json gives it). */
  page_bytes?: number;
  shape?: KvShape;
  shuffle?: "auto" | "on" | "off";
}

export type Format = NonNullable<KvConfig["format"]>;

const FORMATS = ["memsnap", "pfimg-paged", "lmcache", "paged"];
const SHAPE_KEYS = ["n_layers", "n_kv_heads", "head_dim", "dtype", "block_size", "tokens_per_chunk"];

function parseShape(raw: unknown, where: string): KvShape {
  const w = `${where}: shape`;
  if (!isPlainObject(raw)) {
    throw configInvalid(
      where,
      '"shape" must be an object {n_layers, n_kv_heads, head_dim, dtype, block_size, tokens_per_chunk}',
    );
  }
  rejectUnknownKeys(raw, SHAPE_KEYS, w);
  const int = (k: string, def?: number): number => {
    const v = raw[k] ?? def;
    if (!Number.isSafeInteger(v) || (v as number) < 1 || (v as number) > 1 << 20) {
      throw configInvalid(w, `"${k}" must be an integer from 1 to ${1 << 20}`);
    }
    return v as number;
  };
  const dtype = reqString(raw, "dtype", w);
  if (dtypeBytes(dtype) === null) {
    throw configInvalid(w, `"dtype" must be bf16, f16, f32 or fp8e4m3, got ${JSON.stringify(dtype)}`);
  }
  return {
    n_layers: int("n_layers"),
    n_kv_heads: int("n_kv_heads"),
    head_dim: int("head_dim"),
    dtype,
    block_size: int("block_size", 16),
    tokens_per_chunk: int("tokens_per_chunk", 256),
  };
}

export function parseKvConfig(raw: Record<string, unknown>, where: string): KvConfig {
  rejectUnknownKeys(raw, ["kind", "name", "path", "format", "page_bytes", "shape", "shuffle"], where);
  const format = optString(raw, "format", where);
  if (format !== undefined && !FORMATS.includes(format)) {
    throw configInvalid(
      where,
      `"format" must be "memsnap", "pfimg-paged", "lmcache" or "paged", got ${JSON.stringify(format)}`,
    );
  }
  const pageBytes = optInt(raw, "page_bytes", where, KV_MIN_PAGE_BYTES, KV_MAX_PAGE_BYTES);
  if (pageBytes !== undefined && format !== undefined && format !== "paged") {
    throw configInvalid(where, `"page_bytes" is for "format": "paged" (the ${format} format gives its own page size)`);
  }
  const shuffle = optString(raw, "shuffle", where);
  if (shuffle !== undefined && !["auto", "on", "off"].includes(shuffle)) {
    throw configInvalid(where, `"shuffle" must be "auto", "on" or "off", got ${JSON.stringify(shuffle)}`);
  }
  const shape = raw.shape === undefined ? undefined : parseShape(raw.shape, where);
  if (format === "lmcache" && !shape) {
    throw configInvalid(
      where,
      '"format": "lmcache" needs "shape" ' +
        "{n_layers, n_kv_heads, head_dim, dtype, block_size, tokens_per_chunk} (chunk files are headerless)",
    );
  }
  return {
    kind: "kv",
    name: reqString(raw, "name", where),
    path: reqString(raw, "path", where),
    ...(format !== undefined ? { format: format as Format } : {}),
    ...(pageBytes !== undefined ? { page_bytes: pageBytes } : {}),
    ...(shape ? { shape } : {}),
    ...(shuffle !== undefined ? { shuffle: shuffle as "auto" | "on" | "off" } : {}),
  };
}
