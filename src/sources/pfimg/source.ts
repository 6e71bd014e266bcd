/**
 * The `pfimg` source: ProcessFork image stores.
 *
 * A store is content-addressed: `images/<hex>.json` holds an image manifest whose id is the
 * SHA-256 of its bytes exactly as stored, and `blobs/sha256/<xx>/<hex>.zst` holds one zstd
 * frame whose *uncompressed* bytes hash to `<hex>`. The layer bundles each selected image's
 * manifest bytes as stored, and every blob it reaches (model base and diff, the cache page
 * manifest and every K and V page, the world fs tree and its file blobs, env and procs, the
 * effects ledger, the trace; with `with_parents` the parents' too), each compressed frame as
 * stored and once however many images reach it. Every digest is checked while the bytes
 * stream (decompress, hash). Extracted, the layer directory is itself a valid store.
 *
 * Text blobs (trace, effects, env, model diff, text-looking world files) are scanned with
 * the redactor; content-addressed bytes are never rewritten, so findings are recorded as
 * unredacted.
 */
import { closeSync, createReadStream, openSync, readFileSync, readSync, statSync } from "node:fs";
import { readdir, readFile, stat } from "node:fs/promises";
import type { Stats } from "node:fs";
import { homedir } from "node:os";
import { join, resolve } from "node:path";
import { Readable } from "node:stream";
import type { LayerEntry } from "../../format/manifest.js";
import { MemsnapError, isMemsnapError } from "../../errors.js";
import { configInvalid, optBool, optString, optStringArray, rejectUnknownKeys, reqString } from "../../util/config-check.js";
import {
  BLOB_REL_RE, FrameHasher, IMAGE_REL_RE, TextScanner, blobRel, decompressToBuffer, digestHex, hashFrameChunks, imageRel,
  parseFsTree, parseImageManifest, parsePageManifest, sha256Hex, zstdBinding, type BlobCategory, type ImageManifest,
} from "./format.js";
import type { Artifact, CaptureContext, SourceKind } from "../types.js";
import { fingerprintOf, sourceChanged, sourceError, walkFiles } from "../walk.js";

export interface PfimgConfig {
  kind: "pfimg";
  name: string;
  store?: string;
  /** Image ids (`sha256:…`) or `all` (the default). */
  images?: string[];
  with_parents?: boolean;
}

/** Image manifests larger than this are refused (they are small JSON documents). */
const IMAGE_MAX_BYTES = 64 * 1024 * 1024;
/**
 * Files up to this size are read with one synchronous call (stats too): a store is many small
 * files, and an awaited thread-pool round trip per file made planning and the restore check
 * latency-bound (the bench's 56-file store: ~100-130 ms of the restore's serial tail).
 */
const SMALL_READ = 1024 * 1024;
const readSmall = (abs: string, size: number): Promise<Buffer> | Buffer => (size <= SMALL_READ ? readFileSync(abs) : readFile(abs));
/** Structural blobs (page manifest, fs tree) are parsed in memory: caps on their sizes. */
const STRUCT_MAX_COMPRESSED = 256 * 1024 * 1024;
const STRUCT_MAX_RAW = 1024 * 1024 * 1024;
/** Structural blobs this small (compressed) are kept from the planning read and streamed from memory. */
const KEEP_MAX = 8 * 1024 * 1024;

type Role = ImageManifest["refs"][number]["role"] | "cache-page" | "fs-file";

interface PlannedImage {
  hex: string;
  abs: string;
  bytes: Buffer;
  stats: Stats;
  manifest: ImageManifest;
}

interface PlannedBlob {
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
  "model-diff": "text", env: "text", ledger: "text", trace: "text", manifest: "text", procs: "sniff", "fs-file": "sniff",
};

function srcInvalid(msg: string, path?: string): MemsnapError {
  return new MemsnapError("MEMSNAP_SOURCE_INVALID", msg, {
    ...(path ? { path } : {}), hint: "the ProcessFork store is incomplete or damaged; repair it (or select other images) and retry",
  });
}

function digestMismatch(msg: string, path: string, cause?: unknown): MemsnapError {
  return new MemsnapError("MEMSNAP_SOURCE_DIGEST_MISMATCH", msg, {
    path, ...(cause === undefined ? {} : { cause }), hint: "the store holds a corrupt or altered blob; restore it from a good copy (ProcessFork can re-fetch it) and retry",
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

async function exists(p: string): Promise<boolean> {
  return stat(p).then(() => true, () => false);
}

/**
 * Walk a store from the selected images to every blob they reach. Reads and verifies image
 * manifests and the structural blobs it has to parse (cache page manifest, fs tree); stats
 * every other blob. Throws MEMSNAP_SOURCE_MISSING (no store, a selected image absent),
 * MEMSNAP_SOURCE_INVALID (a blob missing, bad JSON), MEMSNAP_SOURCE_DIGEST_MISMATCH.
 */
export async function planStore(root: string, selection: string[] | "all", withParents: boolean, signal?: AbortSignal): Promise<StorePlan> {
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

  const addBlob = async (hex: string, what: string, category: BlobCategory, role: Role, expectRaw: number | null, optional = false): Promise<void> => {
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
    const b: PlannedBlob = { hex, rel, abs, stats: st, what, category, role, expectRaw, scan: SCAN[role] ?? null, kept: null, rawSize: null };
    blobs.set(hex, b);
    if (role !== "cache-manifest" && role !== "fs-tree") return;
    // Structural: read, verify, parse, and follow.
    if (st.size > STRUCT_MAX_COMPRESSED) throw srcInvalid(`pfimg: blob sha256:${hex} (${what}) is ${st.size} bytes, over the ${STRUCT_MAX_COMPRESSED}-byte cap for a ${role}`, abs);
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
      throw digestMismatch(`pfimg: blob sha256:${hex} (${what}) is not a valid zstd frame: ${(e as Error).message}`, abs, e);
    }
    if (raw.hex !== hex) throw digestMismatch(`pfimg: blob sha256:${hex} (${what}) decompresses to content with digest sha256:${raw.hex}`, abs);
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
      if (st.size > IMAGE_MAX_BYTES) throw srcInvalid(`pfimg: image sha256:${hex} is ${st.size} bytes, over the ${IMAGE_MAX_BYTES}-byte cap`, abs);
      bytes = await readSmall(abs, st.size);
    } catch (e) {
      if (isMemsnapError(e)) throw e;
      if ((e as NodeJS.ErrnoException).code === "ENOENT") {
        if (from) throw srcInvalid(`pfimg: parent image sha256:${hex} of image sha256:${from} is not in the store ${root}`, abs);
        throw new MemsnapError("MEMSNAP_SOURCE_MISSING", `pfimg: image sha256:${hex} is not in the store ${root}`, {
          path: abs, hint: "fix the pfimg source's images list (or its store) in memsnap.json",
        });
      }
      throw sourceError(e, abs);
    }
    if (bytes.length !== st.size) throw sourceChanged(abs, `size ${st.size} → ${bytes.length}`);
    const got = sha256Hex(bytes);
    if (got !== hex) {
      throw digestMismatch(`pfimg: image manifest ${imageRel(hex)} hashes to sha256:${got}, not its id sha256:${hex}`, abs);
    }
    const manifest = parseImageManifest(bytes, hex, abs);
    images.push({ hex, abs, bytes, stats: st, manifest });
    const tag = `image sha256:${hex}`;
    // The manifest may also be stored as a blob; bundle it when it is there.
    await addBlob(hex, `image manifest blob, ${tag}`, "image", "manifest", bytes.length, true);
    for (const r of manifest.refs) {
      if (r.role === "cache-manifest") {
        if (manifest.cacheLayout !== null && manifest.cacheLayout !== "paged-batchinvariant-v1") {
          throw srcInvalid(`pfimg: image sha256:${hex} has cache layout ${JSON.stringify(manifest.cacheLayout)}; this memsnap reads paged-batchinvariant-v1`, abs);
        }
        curLayout = manifest.cacheLayout ?? "paged-batchinvariant-v1";
      }
      await addBlob(r.hex, `${r.what}, ${tag}`, r.category, r.role, null);
    }
    if (withParents) for (const p of manifest.parents) queue.push({ hex: p, from: hex });
  }
  return { root, images, blobs: [...blobs.values()], skipped, cache };
}

function unchanged(abs: string, before: Stats): () => Promise<void> {
  return async () => {
    let now: Stats;
    try {
      now = statSync(abs);
    } catch {
      throw sourceChanged(abs, "it was removed");
    }
    if (now.size !== before.size) throw sourceChanged(abs, `size ${before.size} → ${now.size}`);
    if (now.mtimeMs !== before.mtimeMs) throw sourceChanged(abs, "modified during capture");
  };
}

/**
 * The content size a zstd frame's header declares, or null (not declared, or not readable): an
 * incremental snapshot that references an unchanged blob learns its raw size so, without
 * decompressing it. Its file is the one an earlier snapshot decompressed and checked (same
 * device, inode, size, mtime and ctime), and zstd checks a declared size when it decompresses.
 */
function declaredRawSize(abs: string): number | null {
  let fd: number | undefined;
  try {
    fd = openSync(abs, "r");
    const head = Buffer.alloc(18); // the longest frame header
    const n = readSync(fd, head, 0, head.length, 0);
    return zstdBinding().getFrameContentSize(head.subarray(0, n));
  } catch {
    return null;
  } finally {
    if (fd !== undefined) closeSync(fd);
  }
}

/**
 * Yield a blob's artifact. In an incremental snapshot a blob whose file is unchanged is
 * referenced (its fingerprint matches), so its raw size must be known without reading it: from
 * planning (structural blobs), else from its frame header; a blob whose header does not declare
 * it is packed again (no fingerprint), which measures it.
 */
function blobFor(b: PlannedBlob, layer: string, ctx: CaptureContext): Artifact {
  const fingerprint = fingerprintOf(b.stats);
  if (ctx.unchanged?.(`${layer}/${b.rel}`, fingerprint, "pfimg-blob")) {
    b.rawSize ??= declaredRawSize(b.abs);
    if (b.rawSize === null) return blobArtifact(b, layer, ctx);
  }
  return { ...blobArtifact(b, layer, ctx), fingerprint };
}

/** An artifact over a blob's stored frame that decompresses and checks its digest as it streams. */
function blobArtifact(b: PlannedBlob, layer: string, ctx: { redactor?: import("../../redact/types.js").Redactor }): Artifact {
  return {
    path: b.rel,
    kind: "pfimg-blob",
    size: b.stats.size,
    mode: b.stats.mode & 0o7777,
    mtime: b.stats.mtime,
    open: () => (async function* () {
      const scanner = ctx.redactor && b.scan ? new TextScanner(ctx.redactor, `${layer}/${b.rel}`, b.scan === "sniff") : null;
      const hasher = new FrameHasher({
        ...(b.expectRaw !== null ? { maxOutput: b.expectRaw } : {}),
        ...(scanner ? { onData: (c: Buffer) => scanner.push(c) } : {}),
      });
      const fail = (e: unknown): MemsnapError => {
        if (isMemsnapError(e) && e.code !== "MEMSNAP_PAYLOAD_CORRUPT") return e;
        if (isMemsnapError(e) && /exceeds the declared size/.test(e.message)) {
          return srcInvalid(`pfimg: blob sha256:${b.hex} (${b.what}) decompresses to more than the ${b.expectRaw} bytes it must have`, b.abs);
        }
        if (isMemsnapError(e)) return digestMismatch(`pfimg: blob sha256:${b.hex} (${b.what}) is not a valid zstd frame: ${e.message}`, b.abs, e);
        if ((e as NodeJS.ErrnoException).code === "ENOENT") return sourceChanged(b.abs, "it was removed");
        return sourceError(e, b.abs);
      };
      let ended = false;
      try {
        if (b.kept) {
          await hasher.push(b.kept);
          yield b.kept;
        } else {
          for await (const c of createReadStream(b.abs, { start: 0, end: b.stats.size, highWaterMark: 1 << 20 })) {
            await hasher.push(c as Buffer);
            yield c as Buffer;
          }
        }
        const d = await hasher.end();
        ended = true;
        if (d.hex !== b.hex) throw digestMismatch(`pfimg: blob sha256:${b.hex} (${b.what}) decompresses to content with digest sha256:${d.hex}`, b.abs);
        if (b.expectRaw !== null && d.size !== b.expectRaw) {
          throw srcInvalid(`pfimg: blob sha256:${b.hex} (${b.what}) holds ${d.size} bytes, expected ${b.expectRaw}`, b.abs);
        }
        b.rawSize = d.size;
        await scanner?.end();
      } catch (e) {
        throw fail(e);
      } finally {
        if (!ended) hasher.abort();
      }
    })(),
    check: unchanged(b.abs, b.stats),
  };
}

function imageArtifact(img: PlannedImage): Artifact {
  return {
    path: imageRel(img.hex),
    kind: "pfimg-image",
    size: img.bytes.length,
    mode: img.stats.mode & 0o7777,
    mtime: img.stats.mtime,
    open: () => Readable.from([img.bytes]),
    check: unchanged(img.abs, img.stats),
  };
}

const CATEGORIES: BlobCategory[] = ["image", "model", "cache", "world", "effects", "trace"];

/** The layer meta for a finished capture. */
function planMeta(plan: StorePlan, cfg: PfimgConfig): Record<string, unknown> {
  const per: Record<string, { blobs: number; stored_bytes: number; raw_bytes: number }> = {};
  for (const c of CATEGORIES) per[c] = { blobs: 0, stored_bytes: 0, raw_bytes: 0 };
  for (const b of plan.blobs) {
    const p = per[b.category]!;
    p.blobs++;
    p.stored_bytes += b.stats.size;
    p.raw_bytes += b.rawSize ?? 0;
  }
  const parents: Record<string, string[]> = {};
  for (const i of plan.images) parents[`sha256:${i.hex}`] = i.manifest.parents.map((p) => `sha256:${p}`);
  return {
    store: plan.root,
    selection: cfg.images ?? ["all"],
    with_parents: cfg.with_parents ?? false,
    images: plan.images.map((i) => `sha256:${i.hex}`),
    parents,
    created_at: Object.fromEntries(plan.images.map((i) => [`sha256:${i.hex}`, i.manifest.createdAt])),
    blobs: plan.blobs.length,
    manifest_bytes: plan.images.reduce((n, i) => n + i.bytes.length, 0),
    stored_bytes: plan.blobs.reduce((n, b) => n + b.stats.size, 0),
    raw_bytes: plan.blobs.reduce((n, b) => n + (b.rawSize ?? 0), 0),
    bytes_by_layer: per,
    cache: plan.cache,
    skipped_files: plan.skipped,
  };
}

async function collect(it: AsyncIterable<Buffer>, limit: number): Promise<Buffer | null> {
  const parts: Buffer[] = [];
  let n = 0;
  for await (const c of it) {
    n += c.length;
    if (n > limit) return null;
    parts.push(c);
  }
  return Buffer.concat(parts);
}

/** Restored layers already materialized (restore may call materialize more than once). */
const materialized = new WeakMap<LayerEntry, Set<string>>();

function restoreBad(msg: string, path: string): MemsnapError {
  return new MemsnapError("MEMSNAP_ARTIFACT_HASH_MISMATCH", msg, { path, hint: "the bundle's ProcessFork layer is damaged; use another copy" });
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
  return `layer ${layer.name}: the manifest does not declare the layer's raw size (meta.raw_bytes, a non-negative integer), so its blobs cannot be decompressed within a bound`;
}

function overBudget(msg: string, path: string): MemsnapError {
  return new MemsnapError("MEMSNAP_UNSAFE_BUNDLE", msg, {
    path, hint: "the bundle was not written by memsnap or was altered (a decompression bomb); do not use it",
  });
}

const isTooBig = (e: unknown): boolean => isMemsnapError(e) && /exceeds the declared size/.test(e.message);

/** A decompression budget: the bytes a layer's blobs may still produce. */
class RawBudget {
  /** Deep verify: the layer's problem was reported (no declared size, or past it); its later blobs are not decompressed. */
  reported = false;
  constructor(readonly declared: number, public left = declared) {}
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

/** Deep verify's budgets, one per layer entry of the manifest being verified. */
const deepBudgets = new WeakMap<LayerEntry, RawBudget>();

/**
 * Verify a restored store in place (every digest, and that each image's blobs are all there).
 * Not fsynced here: the restore syncs its whole staged tree before it commits (syncFilesystem).
 */
async function materializeStore(dir: string, layer: LayerEntry): Promise<void> {
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
      if (f.stats.size > IMAGE_MAX_BYTES) throw restoreBad(`${where}: image manifest over ${IMAGE_MAX_BYTES} bytes`, where);
      const bytes = await readSmall(f.abs, f.stats.size);
      if (sha256Hex(bytes) !== im[1]) throw restoreBad(`${where}: image manifest does not hash to its id`, where);
    } else if (bm && bm[2]!.startsWith(bm[1]!)) {
      // Decompressed within what the layer declares for all its blobs: a blob that runs past it
      // is stopped there, not decompressed to its end before its name is compared.
      let d;
      try {
        d = await budget.hash(f.stats.size <= SMALL_READ
          ? (async function* () { yield readFileSync(f.abs); })()
          : createReadStream(f.abs, { highWaterMark: 1 << 20 }));
      } catch (e) {
        throw restoreBad(`${where}: not a valid zstd frame (${(e as Error).message})`, where);
      }
      if (d === null) {
        throw overBudget(`${where}: the layer's blobs decompress to more than the ${declared} bytes its manifest declares (meta.raw_bytes)`, where);
      }
      if (d.hex !== bm[2]) throw restoreBad(`${where}: decompresses to sha256:${d.hex}, not its name`, where);
    } else {
      throw new MemsnapError("MEMSNAP_BUNDLE_MALFORMED", `${where} is not a ProcessFork store path`, { path: where, hint: "the bundle was not written by memsnap or was altered" });
    }
  }
  try {
    await planStore(dir, "all", false);
  } catch (e) {
    if (isMemsnapError(e) && e.code.startsWith("MEMSNAP_SOURCE_")) throw restoreBad(`layer ${layer.name}: the restored store is incomplete: ${e.message}`, layer.name);
    throw e;
  }
  done.add(dir);
  materialized.set(layer, done);
}

export const pfimgSource: SourceKind<PfimgConfig> = {
  kind: "pfimg",
  schemaVersion: 1,
  parseConfig(raw, where) {
    rejectUnknownKeys(raw, ["kind", "name", "store", "images", "with_parents"], where);
    const images = optStringArray(raw, "images", where);
    if (images) {
      if (images.length === 0) throw configInvalid(where, '"images" must list image ids (sha256:…) or "all"');
      for (const i of images) {
        if (i !== "all" && !digestHex(i)) throw configInvalid(where, `"images" entries must be "all" or sha256:<64 hex>, got ${JSON.stringify(i)}`);
      }
      if (images.includes("all") && images.length > 1) throw configInvalid(where, '"images": "all" cannot be combined with image ids');
    }
    const store = optString(raw, "store", where);
    const wp = optBool(raw, "with_parents", where);
    return {
      kind: "pfimg",
      name: reqString(raw, "name", where),
      ...(store !== undefined ? { store } : {}),
      ...(images !== undefined ? { images } : {}),
      ...(wp !== undefined ? { with_parents: wp } : {}),
    };
  },
  async capture(cfg, ctx) {
    const root = pfStoreRoot(cfg.store, ctx.baseDir);
    const sel = !cfg.images || cfg.images.includes("all") ? "all" : cfg.images;
    const plan = await planStore(root, sel, cfg.with_parents ?? false, ctx.signal);
    const layer = cfg.name;
    return {
      estimatedBytes: plan.images.reduce((n, i) => n + i.bytes.length, 0) + plan.blobs.reduce((n, b) => n + b.stats.size, 0),
      artifacts: (async function* (): AsyncGenerator<Artifact> {
        for (const img of plan.images) {
          if (ctx.redactor) {
            const s = new TextScanner(ctx.redactor, `${layer}/${imageRel(img.hex)}`);
            await s.push(img.bytes);
            await s.end();
          }
          yield imageArtifact(img);
        }
        for (const b of plan.blobs) yield blobFor(b, layer, ctx);
      })(),
      finish: async () => planMeta(plan, cfg),
    };
  },
  async deepVerify({ entry, bytes, layer }) {
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
          return `${entry.path}: the layer's blobs decompress to more than the ${budget!.declared} bytes its manifest declares (meta.raw_bytes)`;
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
  },
  materialize: materializeStore,
};
