/**
 * Planning a capture of a ProcessFork `paged-batchinvariant-v1` page manifest: its K and V pages
 * in the store-like directory that holds it (raw pages are data files, zstd blobs kept verbatim).
 */
import { lstat, stat } from "node:fs/promises";
import { dirname, join } from "node:path";
import { dtypeBytes, parsePageManifest } from "../pfimg/format.js";
import type { KvConfig } from "./config.js";
import { KV_MAX_PAGE_BYTES, kvInvalid } from "./format.js";
import {
  checkShape,
  listTiles,
  readPageManifest,
  sizeWord,
  statFile,
  type DataFile,
  type KvPlan,
  type VerbatimFile,
} from "./plan.js";

/** The nearest directory at or above `from` holding `blobs/sha256`. */
async function findBlobRoot(from: string): Promise<string | null> {
  let d = from;
  for (;;) {
    if (
      await stat(join(d, "blobs", "sha256")).then(
        (s) => s.isDirectory(),
        () => false,
      )
    )
      return d;
    const up = dirname(d);
    if (up === d) return null;
    d = up;
  }
}

export async function planPfimgPaged(manifestAbs: string, cfg: KvConfig): Promise<KvPlan> {
  const mSt = await statFile(manifestAbs, "page manifest");
  const bytes = await readPageManifest(manifestAbs, mSt);
  const pm = parsePageManifest(bytes, `kv: page manifest ${manifestAbs}`, manifestAbs);
  checkShape(
    cfg,
    {
      nLayers: pm.nLayers,
      nKvHeads: pm.nHeads,
      headDim: pm.headDim,
      dtype: pm.dtype,
      blockSize: pm.pageSizeTokens,
    },
    manifestAbs,
  );
  const root = await findBlobRoot(dirname(manifestAbs));
  if (!root) {
    throw kvInvalid(
      `kv: no blobs/sha256/ directory at or above ${dirname(manifestAbs)} ` + `to hold the pages of ${manifestAbs}`,
      manifestAbs,
    );
  }
  const mRel = manifestAbs
    .slice(root.length + 1)
    .split("\\")
    .join("/");
  const dtype = pm.dtype ?? cfg.shape?.dtype ?? "bf16";
  const verbatim: VerbatimFile[] = [{ rel: mRel, abs: manifestAbs, stats: mSt, planned: null, zst: null, scan: false }];
  const data: DataFile[] = [];
  const framePages: [string, string][] = [];
  const seen = new Map<string, "zst" | "raw">();
  const rawLabels: [string, string][] = [];
  for (const p of pm.pages) {
    for (const kv of ["k", "v"] as const) {
      const hex = p[kv];
      const label = `${p.ix}/${kv}`;
      const what = `page ${kv} of page ${p.ix}`;
      const prior = seen.get(hex);
      if (prior === "zst") {
        framePages.push([label, hex]);
        continue;
      }
      if (prior === "raw") {
        rawLabels.push([label, hex]);
        continue;
      }
      const zRel = `blobs/sha256/${hex.slice(0, 2)}/${hex}.zst`;
      const rRel = `blobs/sha256/${hex.slice(0, 2)}/${hex}`;
      const zAbs = join(root, ...zRel.split("/"));
      const rAbs = join(root, ...rRel.split("/"));
      const zSt = await lstat(zAbs).catch(() => null);
      if (zSt?.isFile()) {
        verbatim.push({
          rel: zRel,
          abs: zAbs,
          stats: zSt,
          planned: null,
          zst: { hex, what, expectRaw: pm.pageBytes },
          scan: false,
        });
        framePages.push([label, hex]);
        seen.set(hex, "zst");
        continue;
      }
      const rSt = await lstat(rAbs).catch(() => null);
      if (!rSt?.isFile()) {
        throw kvInvalid(`kv: blob sha256:${hex} (${what}) is missing: neither ${zRel} nor ${rRel} under ${root}`, zAbs);
      }
      if (pm.pageBytes !== null && rSt.size !== pm.pageBytes) {
        throw kvInvalid(
          `kv: blob sha256:${hex} (${what}) is ${sizeWord(rSt.size)}; ` +
            `a page of ${pm.nLayers} layers × ${pm.pageSizeTokens} tokens × ${pm.nHeads} heads × ${pm.headDim} × ` +
            `${dtype} is ${pm.pageBytes}`,
          rAbs,
        );
      }
      if (rSt.size > KV_MAX_PAGE_BYTES) {
        throw kvInvalid(`kv: blob sha256:${hex} (${what}) is over the ${KV_MAX_PAGE_BYTES}-byte page cap`, rAbs);
      }
      const tiles = listTiles([{ offset: 0, len: rSt.size, label, sha: hex, zero: false }]);
      data.push({ rel: rRel, abs: rAbs, stats: rSt, tiles });
      seen.set(hex, "raw");
    }
  }
  return {
    format: "pfimg-paged",
    root,
    dtype,
    elem: dtypeBytes(dtype) ?? 1,
    pageBytes: pm.pageBytes ?? 0,
    data,
    verbatim,
    framePages,
    meta: {
      manifest: mRel,
      model: { n_layers: pm.nLayers, n_kv_heads: pm.nHeads, head_dim: pm.headDim },
      block_size: pm.pageSizeTokens,
      pfimg_pages: pm.pages.length,
      extra_labels: rawLabels,
    },
  };
}
