/**
 * Planning a capture of a generic paged dump (`format: "paged"`): a directory of binary files
 * made of pages of one size, which memsnap does not know by name. The page size comes from the
 * config (`page_bytes`) or from the dump's `manifest.json` (its top-level `page_bytes`); the
 * manifest is otherwise kept as it is (its block tables and page hashes are the engine's, not
 * checked: memsnap hashes every page itself). Every binary file is cut into pages of that size
 * (the last one may be shorter); text files (JSON, Markdown, …), the manifest among them, and
 * empty files are kept verbatim.
 */
import { createReadStream } from "node:fs";
import { lstat } from "node:fs/promises";
import { join } from "node:path";
import { JsonStreamError, streamJson } from "../../util/json-stream.js";
import { canonicalDtype, dtypeBytes } from "../pfimg/format.js";
import { sourceError, walkFiles, type FileStats } from "../walk.js";
import type { KvConfig } from "./config.js";
import { KV_MANIFEST_MAX_BYTES, KV_MAX_PAGE_BYTES, KV_MIN_PAGE_BYTES, kvInvalid } from "./format.js";
import { SCAN_MAX, type DataFile, type KvPlan, type Tiles, type VerbatimFile } from "./plan.js";

/** The manifest a paged dump may hold at its top. */
export const PAGED_MANIFEST = "manifest.json";
/** Files kept verbatim (and scanned by the redactor) in a paged dump, whatever their size. */
export const PAGED_TEXT_RE = /\.(json|jsonl|ndjson|txt|md|yaml|yml|toml|csv)$/i;
/** The manifest's arrays that may be large (block tables, page hashes): streamed and dropped. */
const BIG_ARRAYS = ["pages", "page_hashes", "hashes", "block_tables", "blocks", "layers", "files", "sequences"];

/** What a paged dump's manifest says that memsnap uses. */
export interface PagedHints {
  /** Its top-level `page_bytes`, or null when it has none. */
  pageBytes: number | null;
  /** Its top-level `dtype` when memsnap knows it (the byte-plane shuffle's element), else null. */
  dtype: string | null;
}

/**
 * Read a paged dump's manifest as it streams (bounded memory: its large arrays are dropped).
 * Throws MEMSNAP_SOURCE_INVALID when it is not a JSON object or its `page_bytes` is not a page size.
 */
export async function readPagedManifest(abs: string, st: FileStats): Promise<PagedHints> {
  if (st.size > KV_MANIFEST_MAX_BYTES) {
    throw kvInvalid(`kv: ${abs} is ${st.size} bytes, over the ${KV_MANIFEST_MAX_BYTES}-byte cap`, abs);
  }
  const arrays = Object.fromEntries(BIG_ARRAYS.map((k) => [k, () => undefined]));
  let doc: Record<string, unknown>;
  try {
    doc = await streamJson(createReadStream(abs, { highWaterMark: 1 << 20 }) as AsyncIterable<Buffer>, { arrays });
  } catch (e) {
    if (e instanceof JsonStreamError) throw kvInvalid(`kv: ${abs} is not a JSON object: ${e.message}`, abs);
    throw sourceError(e, abs);
  }
  const pb = doc.page_bytes;
  if (pb !== undefined && !isPageSize(pb)) {
    throw kvInvalid(
      `kv: ${abs} gives page_bytes ${JSON.stringify(pb)}; ` +
        `a page size is an integer from ${KV_MIN_PAGE_BYTES} to ${KV_MAX_PAGE_BYTES}`,
      abs,
    );
  }
  const dtype = canonicalDtype(doc.dtype);
  return { pageBytes: (pb as number | undefined) ?? null, dtype: dtype && dtypeBytes(dtype) ? dtype : null };
}

export const isPageSize = (v: unknown): v is number =>
  Number.isSafeInteger(v) && (v as number) >= KV_MIN_PAGE_BYTES && (v as number) <= KV_MAX_PAGE_BYTES;

/** A data file's pages of `pageBytes`, computed (nothing per page is held). */
function pagedTiles(rel: string, size: number, pageBytes: number): Tiles {
  return {
    length: Math.ceil(size / pageBytes),
    offset: (i) => i * pageBytes,
    len: (i) => Math.min(pageBytes, size - i * pageBytes),
    label: (i) => `${rel}#${i}`,
    sha: () => null,
    zero: () => false,
  };
}

export async function planPaged(root: string, cfg: KvConfig): Promise<KvPlan> {
  const mAbs = join(root, PAGED_MANIFEST);
  const mSt = await lstat(mAbs).catch(() => null);
  const hints = mSt?.isFile() ? await readPagedManifest(mAbs, mSt) : null;
  if (cfg.page_bytes !== undefined && hints?.pageBytes != null && hints.pageBytes !== cfg.page_bytes) {
    throw kvInvalid(`kv: ${mAbs} gives page_bytes ${hints.pageBytes}, the config says ${cfg.page_bytes}`, mAbs);
  }
  const pageBytes = cfg.page_bytes ?? hints?.pageBytes ?? null;
  if (pageBytes === null) {
    throw kvInvalid(
      `kv: the paged dump at ${root} does not say its page size: give "page_bytes" in the kv ` +
        `source's config, or a ${PAGED_MANIFEST} with a top-level page_bytes`,
      root,
    );
  }
  const dtype = cfg.shape?.dtype ?? hints?.dtype ?? "bytes";
  const { files, skipped } = await walkFiles(root);
  const data: DataFile[] = [];
  const verbatim: VerbatimFile[] = [];
  let aligned = 0;
  for (const f of files) {
    const text = PAGED_TEXT_RE.test(f.rel);
    if (text || f.stats.size === 0) {
      verbatim.push({
        rel: f.rel,
        abs: f.abs,
        stats: f.stats,
        planned: null,
        zst: null,
        scan: text && f.stats.size <= SCAN_MAX,
      });
      continue;
    }
    if (f.stats.size % pageBytes === 0) aligned++;
    data.push({ rel: f.rel, abs: f.abs, stats: f.stats, tiles: pagedTiles(f.rel, f.stats.size, pageBytes) });
  }
  return {
    format: "paged",
    root,
    dtype,
    elem: dtypeBytes(dtype) ?? 1,
    pageBytes,
    data,
    verbatim,
    framePages: [],
    meta: {
      manifest: hints ? PAGED_MANIFEST : null,
      page_bytes_from: cfg.page_bytes !== undefined ? "config" : "manifest",
      // Data files whose size is a whole number of pages (the others end with a shorter page).
      aligned_files: aligned,
      skipped,
    },
  };
}
