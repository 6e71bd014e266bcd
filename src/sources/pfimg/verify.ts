/** Deep verify of a `pfimg` layer's artifacts: every blob decompressed and hashed, within the layer's raw size. */
import type { LayerEntry } from "../../format/manifest.js";
import { BLOB_REL_RE, IMAGE_REL_RE, parseImageManifest, sha256Hex } from "./format.js";
import { hashFrameChunks } from "./frames.js";
import type { DeepVerifyContext } from "../types.js";
import { IMAGE_MAX_BYTES } from "./plan.js";
import { RawBudget, declaredRawBytes } from "./materialize.js";
import { collect } from "../../util/streams.js";

/** Deep verify's budgets, one per layer entry of the manifest being verified. */
const deepBudgets = new WeakMap<LayerEntry, RawBudget>();

/** Check one artifact of a pfimg layer; a message when it is bad, null when it is good. */
export async function deepVerifyPfimg({ entry, bytes, layer }: DeepVerifyContext): Promise<string | null> {
  const rel = entry.path.startsWith(`${entry.layer}/`) ? entry.path.slice(entry.layer.length + 1) : entry.path;
  const bm = BLOB_REL_RE.exec(rel);
  if (bm) {
    if (!bm[2]!.startsWith(bm[1]!)) return `${entry.path}: blob is filed under the wrong directory (${bm[1]})`;
    // Within the layer's declared raw size, shared by all its blobs in this verify (a caller
    // that gives no layer entry, a test, checks one blob unbounded).
    // Its problem (no declared size, or past it) is reported once, on the first blob it stops.
    let budget: RawBudget | undefined;
    if (layer) {
      budget = deepBudgets.get(layer);
      if (!budget) {
        const declared = declaredRawBytes(layer);
        budget = new RawBudget(typeof declared === "string" ? 0 : declared);
        deepBudgets.set(layer, budget);
        if (typeof declared === "string") {
          budget.reported = true;
          return `${entry.path}: ${declared}`;
        }
      }
      if (budget.reported) return null;
    }
    try {
      const d = budget ? await budget.hash(bytes) : await hashFrameChunks(bytes);
      if (d === null) {
        budget!.reported = true;
        return (
          `${entry.path}: the layer's blobs decompress to more than the ${budget!.declared} bytes ` +
          "its manifest declares (meta.raw_bytes)"
        );
      }
      return d.hex === bm[2] ? null : `${entry.path}: blob decompresses to sha256:${d.hex}, not the digest in its name`;
    } catch (e) {
      return `${entry.path}: blob is not a valid zstd frame (${(e as Error).message})`;
    }
  }
  const im = IMAGE_REL_RE.exec(rel);
  if (im) {
    const buf = await collect(bytes, IMAGE_MAX_BYTES);
    if (buf === null) return `${entry.path}: image manifest over ${IMAGE_MAX_BYTES} bytes`;
    const h = sha256Hex(buf);
    if (h !== im[1]) return `${entry.path}: image manifest hashes to sha256:${h}, not its id`;
    try {
      parseImageManifest(buf, im[1]!, entry.path);
      return null;
    } catch (e) {
      return `${entry.path}: ${(e as Error).message}`;
    }
  }
  return `${entry.path}: not a ProcessFork store path (images/<hex>.json or blobs/sha256/<xx>/<hex>.zst)`;
}
