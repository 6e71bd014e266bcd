/** Restore of a `pfimg` layer: the restored store checked in place, within its declared raw size. */
import { createReadStream, readFileSync } from "node:fs";
import type { LayerEntry } from "../../format/manifest.js";
import { MemsnapError, isMemsnapError } from "../../errors.js";
import { BLOB_REL_RE, IMAGE_REL_RE, sha256Hex } from "./format.js";
import { hashFrameChunks } from "./frames.js";
import { walkFiles } from "../walk.js";
import { IMAGE_MAX_BYTES, SMALL_READ, planStore, readSmall } from "./plan.js";

/** Restored layers already materialized (restore may call materialize more than once). */
const materialized = new WeakMap<LayerEntry, Set<string>>();

function restoreBad(msg: string, path: string): MemsnapError {
  return new MemsnapError("MEMSNAP_ARTIFACT_HASH_MISMATCH", msg, {
    path,
    hint: "the bundle's ProcessFork layer is damaged; use another copy",
  });
}

/**
 * What a layer declares its blobs decompress to, all together: meta `raw_bytes` (every capture
 * records it, measured as the blobs streamed). Blobs are decompressed against it, so a bundle
 * cannot make a restore or a deep verify decompress more than it declared (concatenated zstd
 * frames of zeros: 0.3 MB of bundle, tens of GB of output). A string when there is none.
 */
export function declaredRawBytes(layer: LayerEntry): number | string {
  const v = (layer.meta as Record<string, unknown> | undefined)?.raw_bytes;
  if (typeof v === "number" && Number.isSafeInteger(v) && v >= 0) return v;
  return (
    `layer ${layer.name}: the manifest does not declare the layer's raw size (meta.raw_bytes, ` +
    "a non-negative integer), so its blobs cannot be decompressed within a bound"
  );
}

function overBudget(msg: string, path: string): MemsnapError {
  return new MemsnapError("MEMSNAP_UNSAFE_BUNDLE", msg, {
    path,
    hint: "the bundle was not written by memsnap or was altered (a decompression bomb); do not use it",
  });
}

const isTooBig = (e: unknown): boolean => isMemsnapError(e) && /exceeds the declared size/.test(e.message);

/** A decompression budget: the bytes a layer's blobs may still produce. */
export class RawBudget {
  /**
   * Deep verify: the layer's problem was reported (no declared size, or past it); its later blobs are not
   * decompressed.
   */
  reported = false;
  constructor(
    readonly declared: number,
    public left = declared,
  ) {}
  /** Decompress and hash `bytes` within what is left; null when it ran past it. */
  async hash(bytes: AsyncIterable<Buffer>): Promise<{ hex: string; size: number } | null> {
    try {
      const d = await hashFrameChunks(bytes, { maxOutput: this.left });
      this.left -= d.size;
      return d;
    } catch (e) {
      if (isTooBig(e)) {
        this.left = 0;
        return null;
      }
      throw e;
    }
  }
}

/**
 * Verify a restored store in place (every digest, and that each image's blobs are all there).
 * Not fsynced here: the restore syncs its whole staged tree before it commits (syncFilesystem).
 */
export async function materializeStore(dir: string, layer: LayerEntry): Promise<void> {
  const done = materialized.get(layer) ?? new Set<string>();
  if (done.has(dir)) return;
  const declared = declaredRawBytes(layer);
  if (typeof declared === "string") throw overBudget(declared, layer.name);
  const budget = new RawBudget(declared);
  const { files } = await walkFiles(dir);
  for (const f of files) {
    const where = `${layer.name}/${f.rel}`;
    const im = IMAGE_REL_RE.exec(f.rel);
    const bm = BLOB_REL_RE.exec(f.rel);
    if (im) {
      if (f.stats.size > IMAGE_MAX_BYTES) {
        throw restoreBad(`${where}: image manifest over ${IMAGE_MAX_BYTES} bytes`, where);
      }
      const bytes = await readSmall(f.abs, f.stats.size);
      if (sha256Hex(bytes) !== im[1]) throw restoreBad(`${where}: image manifest does not hash to its id`, where);
    } else if (bm && bm[2]!.startsWith(bm[1]!)) {
      // Decompressed within what the layer declares for all its blobs: a blob that runs past it
      // is stopped there, not decompressed to its end before its name is compared.
      let d;
      try {
        d = await budget.hash(
          f.stats.size <= SMALL_READ
            ? (async function* () {
                yield readFileSync(f.abs);
              })()
            : createReadStream(f.abs, { highWaterMark: 1 << 20 }),
        );
      } catch (e) {
        throw restoreBad(`${where}: not a valid zstd frame (${(e as Error).message})`, where);
      }
      if (d === null) {
        throw overBudget(
          `${where}: the layer's blobs decompress to more than the ${declared} bytes ` +
            "its manifest declares (meta.raw_bytes)",
          where,
        );
      }
      if (d.hex !== bm[2]) throw restoreBad(`${where}: decompresses to sha256:${d.hex}, not its name`, where);
    } else {
      throw new MemsnapError("MEMSNAP_BUNDLE_MALFORMED", `${where} is not a ProcessFork store path`, {
        path: where,
        hint: "the bundle was not written by memsnap or was altered",
      });
    }
  }
  try {
    await planStore(dir, "all", false);
  } catch (e) {
    if (isMemsnapError(e) && e.code.startsWith("MEMSNAP_SOURCE_")) {
      throw restoreBad(`layer ${layer.name}: the restored store is incomplete: ${e.message}`, layer.name);
    }
    throw e;
  }
  done.add(dir);
  materialized.set(layer, done);
}
