/** Capture of a criu layer: take or unpack the dump, validate its chain, list its images. */
import type { Stats } from "node:fs";
import { mkdir, mkdtemp, readdir, realpath, rm, stat } from "node:fs/promises";
import { dirname, join, resolve } from "node:path";
import { MemsnapError } from "../../errors.js";
import type { Artifact, CaptureContext, LayerCapture } from "../types.js";
import { fileArtifact, sourceError } from "../walk.js";
import { unpackBlob } from "./blob.js";
import type { CriuConfig } from "./config.js";
import { criuDump } from "./dump.js";
import { pagesId } from "./format.js";
import { criuInvalid, resolveChain, scanLevel, type LevelScan, type Skipped } from "./scan.js";

function pageKind(name: string): string {
  return pagesId(name) !== null ? "criu-pages" : "criu-image";
}

/** Capture a criu source: its dump (taken now with `pid`), then every image of its chain. */
export async function captureCriu(cfg: CriuConfig, ctx: CaptureContext): Promise<LayerCapture> {
  let tmp: string | null = null;
  const tmpDir = async (): Promise<string> => (tmp ??= await mkdtemp(join(ctx.tmpDir, `criu-${cfg.name}-`)));
  const cleanup = async (): Promise<void> => {
    if (tmp) await rm(tmp, { recursive: true, force: true });
  };
  try {
    let origin: "dir" | "blob" | "dump";
    let top: string;
    let root: string;
    let source: string;
    const meta: Record<string, unknown> = {};
    if (cfg.pid !== undefined) {
      origin = "dump";
      const t = await tmpDir();
      let images: string;
      if (cfg.path !== undefined) {
        images = resolve(ctx.baseDir, cfg.path);
        const existing = await readdir(images).catch((e: NodeJS.ErrnoException) => {
          if (e.code === "ENOENT") return [] as string[];
          throw sourceError(e, images);
        });
        if (existing.length) {
          throw new MemsnapError("MEMSNAP_SOURCE_INVALID", `criu dump target ${images} is not empty`, {
            path: images,
            hint:
              'with "pid", "path" names a new or empty directory for criu dump; ' +
              'drop "pid" to capture an existing dump',
          });
        }
        await mkdir(images, { recursive: true, mode: 0o700 }).catch((e: unknown) => {
          throw sourceError(e, images);
        });
      } else {
        images = join(t, "images");
        await mkdir(images, { mode: 0o700 });
      }
      const work = join(t, "work");
      await mkdir(work, { mode: 0o700 });
      meta.criu_bin = await criuDump(cfg, ctx.baseDir, images, work, ctx.signal);
      meta.pid = cfg.pid;
      source = cfg.path !== undefined ? images : "";
      top = await realpath(images);
      root = dirname(top);
    } else {
      source = resolve(ctx.baseDir, cfg.path!);
      let st: Stats;
      try {
        st = await stat(source);
      } catch (e) {
        throw sourceError(e, source);
      }
      if (st.isDirectory()) {
        origin = "dir";
        top = await realpath(source);
        root = dirname(top);
      } else if (st.isFile()) {
        origin = "blob";
        const { header, images } = await unpackBlob(source, await tmpDir(), ctx.signal);
        const text = JSON.stringify(header);
        if (text.length <= 4096) meta.blob_header = header;
        top = await realpath(images);
        root = top;
      } else {
        throw criuInvalid(source, "neither a directory nor a file");
      }
    }
    const levels = await resolveChain(top, root);
    const skipped: Skipped = { other: 0, symlinks: 0, dirs: 0 };
    const scans: LevelScan[] = [];
    for (let i = 0; i < levels.length; i++) scans.push(await scanLevel(levels[i]!, i, i + 1 < levels.length, skipped));
    const all = scans.flatMap((s) => s.files.map((f) => ({ f, prefix: s.level.prefix })));
    const pids = scans[0]!.pids;
    Object.assign(meta, {
      origin,
      path: source || null,
      processes: pids.length,
      pids: pids.slice(0, 64),
      images: all.length,
      bytes: all.reduce((n, x) => n + x.f.stats.size, 0),
      pages_bytes: scans.reduce((n, s) => n + s.pagesBytes, 0),
      parent_depth: levels.length - 1,
      skipped,
    });
    return {
      estimatedBytes: meta.bytes as number,
      artifacts: (async function* (): AsyncGenerator<Artifact> {
        for (const { f, prefix } of all) {
          const a = fileArtifact({ abs: f.abs, rel: f.name, stats: f.stats }, pageKind(f.name), `${prefix}/${f.name}`);
          a.text = false;
          yield a;
        }
      })(),
      finish: async () => meta,
      cleanup,
    };
  } catch (e) {
    await cleanup().catch(() => undefined);
    throw e;
  }
}
