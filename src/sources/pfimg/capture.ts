/** Capture of a `pfimg` layer: the planned images and blobs as artifacts, digests checked as they stream. */
import { closeSync, createReadStream, openSync, readSync, statSync } from "node:fs";
import type { Stats } from "node:fs";
import { Readable } from "node:stream";
import { isMemsnapError, type MemsnapError } from "../../errors.js";
import type { Redactor } from "../../redact/types.js";
import { imageRel, type BlobCategory } from "./format.js";
import { FrameHasher, zstdBinding } from "./frames.js";
import { TextScanner } from "./text-scanner.js";
import type { Artifact, CaptureContext, LayerCapture } from "../types.js";
import { fingerprintOf, sourceChanged, sourceError } from "../walk.js";
import type { PfimgConfig } from "./config.js";
import {
  digestMismatch,
  pfStoreRoot,
  planStore,
  srcInvalid,
  type PlannedBlob,
  type PlannedImage,
  type StorePlan,
} from "./plan.js";

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
function blobArtifact(b: PlannedBlob, layer: string, ctx: { redactor?: Redactor }): Artifact {
  return {
    path: b.rel,
    kind: "pfimg-blob",
    size: b.stats.size,
    mode: b.stats.mode & 0o7777,
    mtime: b.stats.mtime,
    open: () =>
      (async function* () {
        const scanner =
          ctx.redactor && b.scan ? new TextScanner(ctx.redactor, `${layer}/${b.rel}`, b.scan === "sniff") : null;
        const hasher = new FrameHasher({
          ...(b.expectRaw !== null ? { maxOutput: b.expectRaw } : {}),
          ...(scanner ? { onData: (c: Buffer) => scanner.push(c) } : {}),
        });
        const fail = (e: unknown): MemsnapError => {
          if (isMemsnapError(e) && e.code !== "MEMSNAP_PAYLOAD_CORRUPT") return e;
          if (isMemsnapError(e) && /exceeds the declared size/.test(e.message)) {
            return srcInvalid(
              `pfimg: blob sha256:${b.hex} (${b.what}) decompresses to more than the ${b.expectRaw} bytes it must have`,
              b.abs,
            );
          }
          if (isMemsnapError(e)) {
            return digestMismatch(
              `pfimg: blob sha256:${b.hex} (${b.what}) is not a valid zstd frame: ${e.message}`,
              b.abs,
              e,
            );
          }
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
          if (d.hex !== b.hex) {
            throw digestMismatch(
              `pfimg: blob sha256:${b.hex} (${b.what}) decompresses to content with digest sha256:${d.hex}`,
              b.abs,
            );
          }
          if (b.expectRaw !== null && d.size !== b.expectRaw) {
            throw srcInvalid(
              `pfimg: blob sha256:${b.hex} (${b.what}) holds ${d.size} bytes, expected ${b.expectRaw}`,
              b.abs,
            );
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

/** Capture a pfimg source: its store's selected images and every blob they reach. */
export async function capturePfimg(cfg: PfimgConfig, ctx: CaptureContext): Promise<LayerCapture> {
  const root = pfStoreRoot(cfg.store, ctx.baseDir);
  const sel = !cfg.images || cfg.images.includes("all") ? "all" : cfg.images;
  const plan = await planStore(root, sel, cfg.with_parents ?? false, ctx.signal);
  const layer = cfg.name;
  return {
    estimatedBytes:
      plan.images.reduce((n, i) => n + i.bytes.length, 0) + plan.blobs.reduce((n, b) => n + b.stats.size, 0),
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
}
