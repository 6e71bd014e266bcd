/** Planning a `pfimg` capture: the walk from the selected images to every blob they reach. */
import { readFileSync, statSync } from "node:fs";
import { readdir, readFile, stat } from "node:fs/promises";
import type { Stats } from "node:fs";
import { homedir } from "node:os";
import { join, resolve } from "node:path";
import { MemsnapError, isMemsnapError } from "../../errors.js";
import {
  blobRel,
  digestHex,
  imageRel,
  parseFsTree,
  parseImageManifest,
  parsePageManifest,
  sha256Hex,
  type BlobCategory,
  type ImageManifest,
} from "./format.js";
import { decompressToBuffer } from "./frames.js";
import { sourceChanged, sourceError } from "../walk.js";
import { exists } from "../../util/fs-atomic.js";

/** Image manifests larger than this are refused (they are small JSON documents). */
export const IMAGE_MAX_BYTES = 64 * 1024 * 1024;
/**
 * Files up to this size are read with one synchronous call (stats too): a store is many small
 * files, and an awaited thread-pool round trip per file made planning and the restore check
 * latency-bound (the bench's 56-file store: ~100-130 ms of the restore's serial tail).
 */
export const SMALL_READ = 1024 * 1024;
export const readSmall = (abs: string, size: number): Promise<Buffer> | Buffer =>
  size <= SMALL_READ ? readFileSync(abs) : readFile(abs);
/** Structural blobs (page manifest, fs tree) are parsed in memory: caps on their sizes. */
const STRUCT_MAX_COMPRESSED = 256 * 1024 * 1024;
const STRUCT_MAX_RAW = 1024 * 1024 * 1024;
/** Structural blobs this small (compressed) are kept from the planning read and streamed from memory. */
const KEEP_MAX = 8 * 1024 * 1024;

type Role = ImageManifest["refs"][number]["role"] | "cache-page" | "fs-file";

export interface PlannedImage {
  hex: string;
  abs: string;
  bytes: Buffer;
  stats: Stats;
  manifest: ImageManifest;
}

export interface PlannedBlob {
  hex: string;
  rel: string;
  abs: string;
  stats: Stats;
  /** The first reference that reached it, for messages: `cache page k of page 3, image sha256:…`. */
  what: string;
  category: BlobCategory;
  role: Role;
  /** Uncompressed size it must have (cache pages; fs files with a size), or null. */
  expectRaw: number | null;
  /** Scan with the redactor: text, sniff (text unless binary-looking), or not at all. */
  scan: "text" | "sniff" | null;
  /** Compressed bytes kept from the planning read (small structural blobs). */
  kept: Buffer | null;
  rawSize: number | null;
}

export interface StorePlan {
  root: string;
  images: PlannedImage[];
  blobs: PlannedBlob[];
  /** Files under images/ that are not `<64 hex>.json` (ignored). */
  skipped: number;
  cache: { layout: string | null; pages: number }[];
}

const SCAN: Partial<Record<Role, "text" | "sniff">> = {
  "model-diff": "text",
  env: "text",
  ledger: "text",
  trace: "text",
  manifest: "text",
  procs: "sniff",
  "fs-file": "sniff",
};

export function srcInvalid(msg: string, path?: string): MemsnapError {
  return new MemsnapError("MEMSNAP_SOURCE_INVALID", msg, {
    ...(path ? { path } : {}),
    hint: "the ProcessFork store is incomplete or damaged; repair it (or select other images) and retry",
  });
}

export function digestMismatch(msg: string, path: string, cause?: unknown): MemsnapError {
  return new MemsnapError("MEMSNAP_SOURCE_DIGEST_MISMATCH", msg, {
    path,
    ...(cause === undefined ? {} : { cause }),
    hint:
      "the store holds a corrupt or altered blob; restore it from a good copy (ProcessFork can re-fetch it) " +
      "and retry",
  });
}

/** The store root for a config: `store`, else `$PF_STORE`, else `~/.processfork`. */
export function pfStoreRoot(store: string | undefined, baseDir: string): string {
  const expand = (p: string): string => (p === "~" ? homedir() : p.startsWith("~/") ? join(homedir(), p.slice(2)) : p);
  if (store) return resolve(baseDir, expand(store));
  const env = process.env.PF_STORE;
  if (env) return resolve(expand(env));
  return join(homedir(), ".processfork");
}

/**
 * Walk a store from the selected images to every blob they reach. Reads and verifies image
 * manifests and the structural blobs it has to parse (cache page manifest, fs tree); stats
 * every other blob. Throws MEMSNAP_SOURCE_MISSING (no store, a selected image absent),
 * MEMSNAP_SOURCE_INVALID (a blob missing, bad JSON), MEMSNAP_SOURCE_DIGEST_MISMATCH.
 */
export async function planStore(
  root: string,
  selection: string[] | "all",
  withParents: boolean,
  signal?: AbortSignal,
): Promise<StorePlan> {
  let rs: Stats;
  try {
    rs = await stat(root);
  } catch (e) {
    throw sourceError(e, root);
  }
  if (!rs.isDirectory()) throw srcInvalid(`pfimg: store ${root} is not a directory`, root);
  const haveImages = await exists(join(root, "images"));
  if (!haveImages && !(await exists(join(root, "blobs")))) {
    throw srcInvalid(`pfimg: ${root} is not a ProcessFork store (no images/ or blobs/)`, root);
  }
  let skipped = 0;
  let wanted: { hex: string; from: string | null }[];
  if (selection === "all") {
    let names: string[] = [];
    if (haveImages) {
      try {
        names = await readdir(join(root, "images"));
      } catch (e) {
        throw sourceError(e, join(root, "images"));
      }
    }
    const hexes: string[] = [];
    for (const n of names) {
      if (/^[0-9a-f]{64}\.json$/.test(n)) hexes.push(n.slice(0, 64));
      else skipped++;
    }
    hexes.sort();
    wanted = hexes.map((hex) => ({ hex, from: null }));
  } else {
    wanted = selection.map((d) => ({ hex: digestHex(d)!, from: null }));
  }

  const images: PlannedImage[] = [];
  const blobs = new Map<string, PlannedBlob>();
  const seenImages = new Set<string>();
  const cache: StorePlan["cache"] = [];
  let curLayout: string | null = null;

  const addBlob = async (
    hex: string,
    what: string,
    category: BlobCategory,
    role: Role,
    expectRaw: number | null,
    optional = false,
  ): Promise<void> => {
    if (blobs.has(hex)) return;
    signal?.throwIfAborted();
    const rel = blobRel(hex);
    const abs = join(root, ...rel.split("/"));
    let st: Stats;
    try {
      st = statSync(abs);
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code === "ENOENT" || (e as NodeJS.ErrnoException).code === "ENOTDIR") {
        if (optional) return;
        throw srcInvalid(`pfimg: blob sha256:${hex} (${what}) is missing`, abs);
      }
      throw sourceError(e, abs);
    }
    if (!st.isFile()) throw srcInvalid(`pfimg: blob sha256:${hex} (${what}) is not a regular file`, abs);
    const b: PlannedBlob = {
      hex,
      rel,
      abs,
      stats: st,
      what,
      category,
      role,
      expectRaw,
      scan: SCAN[role] ?? null,
      kept: null,
      rawSize: null,
    };
    blobs.set(hex, b);
    if (role !== "cache-manifest" && role !== "fs-tree") return;
    // Structural: read, verify, parse, and follow.
    if (st.size > STRUCT_MAX_COMPRESSED) {
      throw srcInvalid(
        `pfimg: blob sha256:${hex} (${what}) is ${st.size} bytes, ` +
          `over the ${STRUCT_MAX_COMPRESSED}-byte cap for a ${role}`,
        abs,
      );
    }
    let frame: Buffer;
    try {
      frame = await readSmall(abs, st.size);
    } catch (e) {
      throw sourceError(e, abs);
    }
    let raw: { bytes: Buffer; hex: string };
    try {
      raw = await decompressToBuffer(frame, STRUCT_MAX_RAW);
    } catch (e) {
      throw digestMismatch(
        `pfimg: blob sha256:${hex} (${what}) is not a valid zstd frame: ${(e as Error).message}`,
        abs,
        e,
      );
    }
    if (raw.hex !== hex) {
      throw digestMismatch(
        `pfimg: blob sha256:${hex} (${what}) decompresses to content with digest sha256:${raw.hex}`,
        abs,
      );
    }
    b.rawSize = raw.bytes.length;
    if (frame.length <= KEEP_MAX && frame.length === st.size) b.kept = frame;
    const image = what.slice(what.lastIndexOf("image sha256:"));
    if (role === "cache-manifest") {
      const pm = parsePageManifest(raw.bytes, `pfimg: cache page manifest sha256:${hex} (${image})`, abs);
      cache.push({ layout: curLayout, pages: pm.pages.length });
      for (const p of pm.pages) {
        await addBlob(p.k, `cache page k of page ${p.ix}, ${image}`, "cache", "cache-page", pm.pageBytes);
        await addBlob(p.v, `cache page v of page ${p.ix}, ${image}`, "cache", "cache-page", pm.pageBytes);
      }
    } else {
      for (const f of parseFsTree(raw.bytes, `pfimg: world fs tree sha256:${hex} (${image})`, abs)) {
        await addBlob(f.hex, `world file ${f.path}, ${image}`, "world", "fs-file", f.size);
      }
    }
  };

  const queue = [...wanted];
  while (queue.length) {
    const { hex, from } = queue.shift()!;
    if (seenImages.has(hex)) continue;
    seenImages.add(hex);
    signal?.throwIfAborted();
    const abs = join(root, ...imageRel(hex).split("/"));
    let st: Stats;
    let bytes: Buffer;
    try {
      st = statSync(abs);
      if (!st.isFile()) throw srcInvalid(`pfimg: image sha256:${hex} is not a regular file`, abs);
      if (st.size > IMAGE_MAX_BYTES) {
        throw srcInvalid(`pfimg: image sha256:${hex} is ${st.size} bytes, over the ${IMAGE_MAX_BYTES}-byte cap`, abs);
      }
      bytes = await readSmall(abs, st.size);
    } catch (e) {
      if (isMemsnapError(e)) throw e;
      if ((e as NodeJS.ErrnoException).code === "ENOENT") {
        if (from) {
          throw srcInvalid(
            `pfimg: parent image sha256:${hex} of image sha256:${from} is not in the store ${root}`,
            abs,
          );
        }
        throw new MemsnapError("MEMSNAP_SOURCE_MISSING", `pfimg: image sha256:${hex} is not in the store ${root}`, {
          path: abs,
          hint: "fix the pfimg source's images list (or its store) in memsnap.json",
        });
      }
      throw sourceError(e, abs);
    }
    if (bytes.length !== st.size) throw sourceChanged(abs, `size ${st.size} → ${bytes.length}`);
    const got = sha256Hex(bytes);
    if (got !== hex) {
      throw digestMismatch(
        `pfimg: image manifest ${imageRel(hex)} hashes to sha256:${got}, not its id sha256:${hex}`,
        abs,
      );
    }
    const manifest = parseImageManifest(bytes, hex, abs);
    images.push({ hex, abs, bytes, stats: st, manifest });
    const tag = `image sha256:${hex}`;
    // The manifest may also be stored as a blob; bundle it when it is there.
    await addBlob(hex, `image manifest blob, ${tag}`, "image", "manifest", bytes.length, true);
    for (const r of manifest.refs) {
      if (r.role === "cache-manifest") {
        if (manifest.cacheLayout !== null && manifest.cacheLayout !== "paged-batchinvariant-v1") {
          throw srcInvalid(
            `pfimg: image sha256:${hex} has cache layout ${JSON.stringify(manifest.cacheLayout)}; ` +
              "this memsnap reads paged-batchinvariant-v1",
            abs,
          );
        }
        curLayout = manifest.cacheLayout ?? "paged-batchinvariant-v1";
      }
      await addBlob(r.hex, `${r.what}, ${tag}`, r.category, r.role, null);
    }
    if (withParents) for (const p of manifest.parents) queue.push({ hex: p, from: hex });
  }
  return { root, images, blobs: [...blobs.values()], skipped, cache };
}
