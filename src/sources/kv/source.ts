/**
 * The `kv` source: KV-cache page dumps, deduplicated by content.
 *
 * Input formats:
 * - `memsnap`: a directory with `kv-manifest.json` and data files (docs/FORMAT.md "KV dump format");
 * - `pfimg-paged`: a ProcessFork `paged-batchinvariant-v1` page manifest (JSON, or its
 *   zstd blob) inside a store-like directory whose `blobs/sha256/<xx>/<hex>[.zst]` hold the
 *   K and V pages;
 * - `lmcache`: headerless LMCache-style chunk files, shape given in the config;
 * - `paged`: any directory of binary files made of pages of one size (`page_bytes` in the config,
 *   or in the dump's `manifest.json`), which memsnap does not know by name.
 *
 * Each data file is cut into pages (tiles). Every page's SHA-256 (over its original bytes)
 * is computed as it streams; each distinct non-zero page is stored once as `pages/<sha256>`
 * (or `pages/<sha256>.s2|.s4` when byte-plane shuffled), zero pages are flags only, other
 * files are kept verbatim under `files/<path>`, and the last artifact, `kv-index.json`, maps
 * every original page and every tile of every data file to its content. Restore rebuilds the
 * dump directory byte for byte. The dump is never held in memory: pages stream one read
 * block (≤ 4 MiB) at a time.
 */
import { resolve } from "node:path";
import { MemsnapError } from "../../errors.js";
import type { SourceKind } from "../types.js";
import { captureKv } from "./capture.js";
import { parseKvConfig, type KvConfig } from "./config.js";
import { pagePlace } from "./format.js";
import { materializeKv } from "./materialize.js";
import { deepVerifyKv } from "./verify.js";

export const kvSource: SourceKind<KvConfig> = {
  kind: "kv",
  // 2: unshuffled pages are named with the place of their first occurrence (pages/<sha>@<file>.<offset>);
  // 3: shuffled pages too (pages/<sha>.s<elem>@<file>.<offset>). A capture writes 3 only when it shuffles.
  schemaVersion: 3,
  // Pages are named by their digest and deduplicated by it; files by their unique paths.
  distinctPaths: true,
  parseConfig: parseKvConfig,
  async liveTarget(cfg, baseDir, layer) {
    // The dump directory is rebuilt whole in staging (materialize) and swapped in whole. A
    // ProcessFork page manifest sits in a store other images share: not replaced in place.
    if (layer.meta?.format === "pfimg-paged") {
      const why =
        `layer ${layer.name}: a kv layer of a ProcessFork page manifest cannot be restored in place ` +
        "(its store holds other images)";
      throw new MemsnapError("MEMSNAP_USAGE", why, {
        hint: "restore it with --to DIR, or leave it out with --only",
      });
    }
    return { root: resolve(baseDir, cfg.path), mode: "dir" };
  },
  capture: captureKv,
  deepVerify: deepVerifyKv,
  materialize: materializeKv,
  // Pages go to the spool on restore, read back by materializeKv: no file per page. A page
  // with a place goes straight to it, in the spool part of its data file.
  restoreSpool: (rel: string) => (rel.startsWith("pages/") ? (pagePlace(rel) ?? true) : false),
};
