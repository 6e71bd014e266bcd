/** Telling which input format a kv source's path holds. */
import type { Stats } from "node:fs";
import { lstat, readdir, stat } from "node:fs/promises";
import { basename, dirname, join } from "node:path";
import { parsePageManifest } from "../pfimg/format.js";
import { sourceError } from "../walk.js";
import type { Format, KvConfig } from "./config.js";
import { KV_MANIFEST, KV_MANIFEST_MAX_BYTES, kvInvalid } from "./format.js";
import { PAGED_MANIFEST, PAGED_TEXT_RE, readPagedManifest } from "./plan-paged.js";
import { readPageManifest } from "./plan.js";

/**
 * The page size of a generic paged dump at `dir`, or null when `dir` is not one: a top-level
 * `manifest.json` (a JSON object) with a `page_bytes`, and at least one binary file beside it, each
 * a whole number of those pages. Only the top level is looked at (init's detection: conservative,
 * so that no other directory with a manifest.json is taken for a dump).
 */
export async function pagedDumpAt(dir: string): Promise<number | null> {
  try {
    const m = join(dir, PAGED_MANIFEST);
    const st = await lstat(m);
    if (!st.isFile()) return null;
    const { pageBytes } = await readPagedManifest(m, st);
    if (pageBytes === null) return null;
    let pages = 0;
    for (const e of await readdir(dir, { withFileTypes: true })) {
      if (!e.isFile() || PAGED_TEXT_RE.test(e.name)) continue;
      const s = await lstat(join(dir, e.name));
      if (s.size === 0 || s.size % pageBytes !== 0) return null;
      pages += s.size / pageBytes;
    }
    return pages > 0 ? pageBytes : null;
  } catch {
    return null;
  }
}

/** Which format a path holds, when the config does not say. */
export async function detect(pathAbs: string, cfg: KvConfig): Promise<{ format: Format; target: string }> {
  let st: Stats;
  try {
    st = await stat(pathAbs);
  } catch (e) {
    throw sourceError(e, pathAbs);
  }
  const looksPaged = async (abs: string): Promise<boolean> => {
    try {
      const s2 = await stat(abs);
      if (!s2.isFile() || s2.size > KV_MANIFEST_MAX_BYTES) return false;
      const b = await readPageManifest(abs, s2);
      parsePageManifest(b, abs);
      return true;
    } catch {
      return false;
    }
  };
  if (st.isDirectory()) {
    const want = cfg.format;
    if (want === "lmcache") return { format: "lmcache", target: pathAbs };
    if (want === "paged" || (!want && cfg.page_bytes !== undefined)) return { format: "paged", target: pathAbs };
    if (
      want === "memsnap" ||
      (!want &&
        (await stat(join(pathAbs, KV_MANIFEST)).then(
          () => true,
          () => false,
        )))
    ) {
      return { format: "memsnap", target: pathAbs };
    }
    for (const n of ["cache-manifest.json", "manifest.json"]) {
      const abs = join(pathAbs, n);
      if (want === "pfimg-paged" || !want) {
        if (await looksPaged(abs)) return { format: "pfimg-paged", target: abs };
      }
    }
    if (want === "pfimg-paged") {
      throw kvInvalid(
        `kv: ${pathAbs} holds no paged-batchinvariant-v1 page manifest ` +
          "(cache-manifest.json or manifest.json); point path at the manifest file",
        pathAbs,
      );
    }
    if (!want && (await pagedDumpAt(pathAbs)) !== null) return { format: "paged", target: pathAbs };
    if (cfg.shape) return { format: "lmcache", target: pathAbs };
    throw kvInvalid(
      `kv: cannot tell what ${pathAbs} holds: no ${KV_MANIFEST}, no page manifest, ` +
        `no ${PAGED_MANIFEST} with page_bytes and pages beside it, and no shape for LMCache chunks ` +
        '(a dump of pages of one size: "format": "paged" with "page_bytes")',
      pathAbs,
    );
  }
  if (cfg.format === "memsnap" || (!cfg.format && basename(pathAbs) === KV_MANIFEST)) {
    return { format: "memsnap", target: dirname(pathAbs) };
  }
  if (cfg.format === "pfimg-paged") return { format: "pfimg-paged", target: pathAbs };
  if (cfg.format === "lmcache") return { format: "lmcache", target: pathAbs };
  if (cfg.format === "paged" || cfg.page_bytes !== undefined) {
    throw kvInvalid(`kv: a paged dump's path must be its directory; ${pathAbs} is a file`, pathAbs);
  }
  if (await looksPaged(pathAbs)) return { format: "pfimg-paged", target: pathAbs };
  if (cfg.shape) return { format: "lmcache", target: pathAbs };
  throw kvInvalid(
    `kv: cannot tell what ${pathAbs} holds: not ${KV_MANIFEST}, not a page manifest, ` +
      "and no shape for LMCache chunks",
    pathAbs,
  );
}
