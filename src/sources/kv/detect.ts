/** Telling which input format a kv source's path holds. */
import type { Stats } from "node:fs";
import { stat } from "node:fs/promises";
import { basename, dirname, join } from "node:path";
import { parsePageManifest } from "../pfimg/format.js";
import { sourceError } from "../walk.js";
import type { Format, KvConfig } from "./config.js";
import { KV_MANIFEST, KV_MANIFEST_MAX_BYTES, kvInvalid } from "./format.js";
import { readPageManifest } from "./plan.js";

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
    if (want === "memsnap" || (!want && (await stat(join(pathAbs, KV_MANIFEST)).then(() => true, () => false)))) {
      return { format: "memsnap", target: pathAbs };
    }
    for (const n of ["cache-manifest.json", "manifest.json"]) {
      const abs = join(pathAbs, n);
      if (want === "pfimg-paged" || !want) {
        if (await looksPaged(abs)) return { format: "pfimg-paged", target: abs };
      }
    }
    if (want === "pfimg-paged") {
      throw kvInvalid(`kv: ${pathAbs} holds no paged-batchinvariant-v1 page manifest ` +
        "(cache-manifest.json or manifest.json); point path at the manifest file", pathAbs);
    }
    if (cfg.shape) return { format: "lmcache", target: pathAbs };
    throw kvInvalid(`kv: cannot tell what ${pathAbs} holds: no ${KV_MANIFEST}, no page manifest, ` +
      "and no shape for LMCache chunks", pathAbs);
  }
  if (cfg.format === "memsnap" || (!cfg.format && basename(pathAbs) === KV_MANIFEST)) {
    return { format: "memsnap", target: dirname(pathAbs) };
  }
  if (cfg.format === "pfimg-paged") return { format: "pfimg-paged", target: pathAbs };
  if (cfg.format === "lmcache") return { format: "lmcache", target: pathAbs };
  if (await looksPaged(pathAbs)) return { format: "pfimg-paged", target: pathAbs };
  if (cfg.shape) return { format: "lmcache", target: pathAbs };
  throw kvInvalid(`kv: cannot tell what ${pathAbs} holds: not ${KV_MANIFEST}, not a page manifest, ` +
    "and no shape for LMCache chunks", pathAbs);
}
