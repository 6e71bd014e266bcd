/** Deep verify of a kv layer's artifacts: pages hash to their names, the index and the dump manifest parse. */
import {
  KV_INDEX,
  KV_MANIFEST,
  KV_MANIFEST_MAX_BYTES,
  KV_MAX_PAGE_BYTES,
  PAGE_ARTIFACT_RE,
  unshuffle,
} from "./format.js";
import { sha256Hex } from "../pfimg/format.js";
import { hashFrameChunks } from "../pfimg/frames.js";
import type { DeepVerifyContext } from "../types.js";
import { readKvIndex } from "./index-format.js";
import { readKvManifest } from "./manifest.js";
import { collect } from "../../util/streams.js";

/** Check one artifact of a kv layer; a message when it is bad, null when it is good. */
export async function deepVerifyKv({ entry, bytes }: DeepVerifyContext): Promise<string | null> {
  const rel = entry.path.startsWith(`${entry.layer}/`) ? entry.path.slice(entry.layer.length + 1) : entry.path;
  const pm = PAGE_ARTIFACT_RE.exec(rel);
  if (pm) {
    const buf = await collect(bytes, KV_MAX_PAGE_BYTES);
    if (buf === null) return `${entry.path}: page over ${KV_MAX_PAGE_BYTES} bytes`;
    const elem = pm[2] ? Number(pm[2]) : 1;
    if (buf.length % elem !== 0) {
      return `${entry.path}: ${buf.length} bytes is not a whole number of ${elem}-byte elements`;
    }
    const h = sha256Hex(elem > 1 ? unshuffle(buf, elem) : buf);
    return h === pm[1]
      ? null
      : `${entry.path}: page hashes to sha256:${h}${elem > 1 ? " after un-shuffling" : ""}, not the digest in its name`;
  }
  if (rel === KV_INDEX) {
    // Read as it streams (bounded memory); on a finding, the rest is still drained.
    const it = bytes[Symbol.asyncIterator]();
    const feed: AsyncIterable<Buffer> = { [Symbol.asyncIterator]: () => ({ next: () => it.next() }) };
    try {
      await readKvIndex(feed, {});
      return null;
    } catch (e) {
      while (!(await it.next()).done) {
        /* drain */
      }
      return `${entry.path}: ${(e as Error).message}`;
    }
  }
  const zm = /(?:^|\/)blobs\/sha256\/([0-9a-f]{2})\/([0-9a-f]{64})\.zst$/.exec(rel);
  if (rel.startsWith("files/") && zm) {
    try {
      const d = await hashFrameChunks(bytes);
      return d.hex === zm[2] ? null : `${entry.path}: blob decompresses to sha256:${d.hex}, not the digest in its name`;
    } catch (e) {
      return `${entry.path}: blob is not a valid zstd frame (${(e as Error).message})`;
    }
  }
  if (rel === `files/${KV_MANIFEST}`) {
    const it = bytes[Symbol.asyncIterator]();
    let n = 0;
    const feed: AsyncIterable<Buffer> = {
      [Symbol.asyncIterator]: () => ({
        next: async () => {
          const r = await it.next();
          if (!r.done && (n += r.value.length) > KV_MANIFEST_MAX_BYTES) {
            throw new Error(`over ${KV_MANIFEST_MAX_BYTES} bytes`);
          }
          return r;
        },
      }),
    };
    try {
      await readKvManifest(feed, entry.path);
      return null;
    } catch (e) {
      while (!(await it.next()).done) {
        /* drain */
      }
      return `${entry.path}: ${(e as Error).message}`;
    }
  }
  if (!rel.startsWith("files/")) return `${entry.path}: not a kv layer path (pages/…, files/…, ${KV_INDEX})`;
  return null;
}
