/**
 * Capture of a kv layer: the verbatim files, then every data file's pages streamed a block at a
 * time, each distinct non-zero page stored once, and last the layer's kv-index.json.
 */
import { createHash, randomBytes } from "node:crypto";
import { createReadStream, type Stats } from "node:fs";
import { stat } from "node:fs/promises";
import { resolve } from "node:path";
import { MemsnapError, isMemsnapError } from "../../errors.js";
import { kvPageFingerprint } from "../types.js";
import type { Redactor } from "../../redact/types.js";
import { FrameHasher, isAllZero } from "../pfimg/frames.js";
import { TextScanner } from "../pfimg/text-scanner.js";
import type { Artifact, CaptureContext, LayerCapture } from "../types.js";
import { sourceChanged, sourceError, type FileStats } from "../walk.js";
import { readBlocks, type ReadBlock } from "./blocks.js";
import type { KvConfig } from "./config.js";
import { detect } from "./detect.js";
import { KV_INDEX, kvInvalid, pageArtifact } from "./format.js";
import type { KvIndexFile } from "./index-format.js";
import { KvIndexWriter } from "./index-writer.js";
import { planLmcache } from "./plan-lmcache.js";
import { planMemsnap } from "./plan-memsnap.js";
import { planPaged } from "./plan-paged.js";
import { planPfimgPaged } from "./plan-pfimg.js";
import { digestMismatch, sizeWord, type DataFile, type KvPlan, type VerbatimFile } from "./plan.js";
import { decideShuffle, PLANE_MIN_BYTES, type ShuffleDecision } from "./shuffle.js";

function unchanged(abs: string, before: FileStats): () => Promise<void> {
  return async () => {
    let now: Stats;
    try {
      now = await stat(abs);
    } catch {
      throw sourceChanged(abs, "it was removed");
    }
    if (now.size !== before.size) throw sourceChanged(abs, `size ${before.size} → ${now.size}`);
    if (now.mtimeMs !== before.mtimeMs) throw sourceChanged(abs, "modified during capture");
  };
}

function verbatimArtifact(
  v: VerbatimFile,
  layer: string,
  redactor: Redactor | undefined,
  contents: KvIndexWriter,
): Artifact {
  const path = `files/${v.rel}`;
  return {
    path,
    kind: v.zst ? "kv-blob" : "file",
    size: v.stats.size,
    mode: v.stats.mode & 0o7777,
    mtime: v.stats.mtime,
    open: () =>
      (async function* () {
        const scanner = redactor && v.scan ? new TextScanner(redactor, `${layer}/${path}`, true) : null;
        const hasher = v.zst ? new FrameHasher(v.zst.expectRaw !== null ? { maxOutput: v.zst.expectRaw } : {}) : null;
        const planned = v.planned === null ? null : createHash("sha256");
        let ended = false;
        try {
          // Streamed from disk (planning read it once, not kept: a dump's manifest grows with its pages).
          const src = createReadStream(v.abs, { start: 0, end: v.stats.size, highWaterMark: 1 << 20 });
          for await (const c of src as AsyncIterable<Buffer>) {
            planned?.update(c);
            await hasher?.push(c);
            await scanner?.push(c);
            yield c;
          }
          if (planned && planned.digest("hex") !== v.planned) throw sourceChanged(v.abs, "modified during capture");
          await scanner?.end();
          if (hasher && v.zst) {
            let d;
            try {
              d = await hasher.end();
            } catch (e) {
              if (isMemsnapError(e) && /exceeds the declared size/.test(e.message)) {
                throw kvInvalid(
                  `kv: blob sha256:${v.zst.hex} (${v.zst.what}) decompresses to more than ` +
                    `the ${v.zst.expectRaw} bytes of a page`,
                  v.abs,
                );
              }
              throw digestMismatch(
                `kv: blob sha256:${v.zst.hex} (${v.zst.what}) is not a valid zstd frame: ${(e as Error).message}`,
                v.abs,
              );
            }
            ended = true;
            if (d.hex !== v.zst.hex) {
              throw digestMismatch(
                `kv: blob sha256:${v.zst.hex} (${v.zst.what}) ` + `decompresses to content with digest sha256:${d.hex}`,
                v.abs,
              );
            }
            if (v.zst.expectRaw !== null && d.size !== v.zst.expectRaw) {
              throw kvInvalid(
                `kv: blob sha256:${v.zst.hex} (${v.zst.what}) holds ${sizeWord(d.size)}, ` +
                  `a page is ${v.zst.expectRaw}`,
                v.abs,
              );
            }
            if (contents.frame(d.hex) === undefined) {
              contents.addFrame({ sha256: d.hex, bytes: d.size, zero: d.zero, artifact: path, encoding: "zstd" });
            }
          }
        } catch (e) {
          if (isMemsnapError(e)) throw e;
          if ((e as NodeJS.ErrnoException).code === "ENOENT") throw sourceChanged(v.abs, "it was removed");
          throw sourceError(e, v.abs);
        } finally {
          if (!ended) hasher?.abort();
        }
      })(),
    check: unchanged(v.abs, v.stats),
  };
}

interface Counters {
  bytesStored: number;
}

/**
 * The artifacts of one data file's tiles, from its blocks as `blocks` reads them (ahead, and
 * with the native addon hashed off the main thread): an artifact per new distinct non-zero page.
 */
async function* dataArtifacts(
  f: DataFile,
  fileNo: number,
  plan: KvPlan,
  shuffle: ShuffleDecision,
  contents: KvIndexWriter,
  tiles: number[],
  counters: Counters,
  blocks: AsyncIterator<ReadBlock>,
  at: number,
): AsyncGenerator<Artifact> {
  let i = 0;
  while (i < f.tiles.length) {
    const next = await blocks.next();
    if (next.done || next.value.file !== at || next.value.first !== i) {
      throw new MemsnapError("MEMSNAP_INTERNAL", `kv: the block reader lost its place in ${f.abs}`);
    }
    const b = next.value;
    let off = 0;
    for (let k = 0; i < b.end; i++, k++) {
      const t = {
        offset: f.tiles.offset(i),
        len: f.tiles.len(i),
        label: f.tiles.label(i),
        sha: f.tiles.sha(i),
        zero: f.tiles.zero(i),
      };
      const page = b.bytes.subarray(off, off + t.len);
      off += t.len;
      // The dedup key is the binary digest (a 32-character latin1 string); hex only where needed.
      let hex: string | null = null;
      let key: string;
      const zero = b.zero ? b.zero[k] === 1 : isAllZero(page);
      if (zero) {
        hex = zeroPageSha(t.len);
        key = KvIndexWriter.key(hex);
      } else {
        key = b.digests
          ? b.digests.toString("latin1", 32 * k, 32 * k + 32)
          : createHash("sha256").update(page).digest("binary");
      }
      const hexOf = (): string => (hex ??= Buffer.from(key, "latin1").toString("hex"));
      if (t.sha !== null && t.sha !== hexOf()) {
        throw digestMismatch(
          `kv: page ${t.label} (${f.rel} at offset ${t.offset}) hashes to sha256:${hexOf()}, ` +
            `but the dump's manifest says sha256:${t.sha}`,
          f.abs,
        );
      }
      if (t.zero && !zero) {
        throw digestMismatch(
          `kv: page ${t.label} (${f.rel} at offset ${t.offset}) is marked zero but holds non-zero bytes`,
          f.abs,
        );
      }
      let idx = contents.raw(key);
      if (idx === undefined) {
        const sha = hexOf();
        if (zero) {
          idx = contents.addRaw(key, { sha256: sha, bytes: t.len, zero: true, artifact: null });
        } else {
          const elem = shuffle.applied && t.len % plan.elem === 0 ? plan.elem : 1;
          // A page carries the place of this first occurrence: restore writes it straight
          // there (a shuffled one put back in order first) instead of spooling it and copying
          // it into place afterwards.
          const path = pageArtifact(sha, elem, { file: fileNo, offset: t.offset });
          idx = contents.addRaw(key, { sha256: sha, bytes: t.len, zero: false, artifact: path });
          counters.bytesStored += page.length;
          yield {
            path,
            kind: "kv-page",
            size: page.length,
            mode: 0o644,
            mtime: f.stats.mtime,
            // A plain array, not a Readable: one stream object per page was most of the
            // capture's garbage (53k pages of 8 KiB: peak RSS 286 → 246 MiB).
            // A shuffled page is shuffled by the packer, into a buffer it reuses: one new 64 KiB
            // buffer per page here kept ~25 MiB more garbage alive (KV layer peak RSS 119 → 144 MiB).
            open: () => [page],
            // An unshuffled page is yielded from the very bytes just hashed: no second hash.
            ...(elem === 1 ? { sha256: sha } : {}),
            // A shuffled page's planes are compressed a frame each (see codecs/zstd-profile.ts).
            ...(elem > 1 ? { shuffle: { elem, frames: t.len / elem >= PLANE_MIN_BYTES } } : {}),
            // Its bytes are a function of the page's digest and the shuffle alone.
            fingerprint: elem === 1 ? kvPageFingerprint(sha, t.len) : `kv-page:${sha}:${elem}:${t.len}`,
          };
        }
      }
      tiles.push(idx);
      contents.addLabel(t.label, idx);
    }
  }
  await unchanged(f.abs, f.stats)();
}

const zeroShas = new Map<number, string>();
/** SHA-256 of `len` zero bytes (cached per length). */
function zeroPageSha(len: number): string {
  let h = zeroShas.get(len);
  if (h === undefined) zeroShas.set(len, (h = createHash("sha256").update(Buffer.alloc(len)).digest("hex")));
  return h;
}

/** Capture a kv source: plan its dump, decide the shuffle, then stream its artifacts. */
export async function captureKv(cfg: KvConfig, ctx: CaptureContext): Promise<LayerCapture> {
  const pathAbs = resolve(ctx.baseDir, cfg.path);
  const { format, target } = await detect(pathAbs, cfg);
  if (format === "lmcache" && !cfg.shape) {
    throw kvInvalid(`kv: LMCache chunks at ${pathAbs} need the shape in the config`, pathAbs);
  }
  const plan =
    format === "memsnap"
      ? await planMemsnap(target, cfg)
      : format === "pfimg-paged"
        ? await planPfimgPaged(target, cfg)
        : format === "paged"
          ? await planPaged(target, cfg)
          : await planLmcache(target, cfg);
  const shuffle = await decideShuffle(plan, cfg.shuffle ?? "auto");
  const contents = new KvIndexWriter(ctx.tmpDir, randomBytes(6).toString("hex"));
  const files: KvIndexFile[] = [];
  const counters: Counters = { bytesStored: 0 };
  let indexHex = "";
  const layer = cfg.name;
  const fileEntry = (rel: string, st: FileStats): Omit<KvIndexFile, "artifact" | "tiles"> => ({
    path: rel,
    bytes: st.size,
    mode: st.mode & 0o7777,
    mtime: st.mtime.toISOString(),
  });
  return {
    // 3: shuffled pages are named with their place too (pages/<sha>.s<elem>@<file>.<offset>).
    schemaVersion: shuffle.applied ? 3 : 2,
    estimatedBytes:
      plan.data.reduce((n, f) => n + f.stats.size, 0) + plan.verbatim.reduce((n, v) => n + v.stats.size, 0),
    artifacts: (async function* (): AsyncGenerator<Artifact> {
      for (const v of plan.verbatim) {
        files.push({ ...fileEntry(v.rel, v.stats), artifact: `files/${v.rel}` });
        if (v.zst) counters.bytesStored += v.stats.size;
        yield verbatimArtifact(v, layer, ctx.redactor, contents);
      }
      const blocks = readBlocks(plan.data, ctx.signal);
      try {
        for (const [at, f] of plan.data.entries()) {
          const tiles: number[] = [];
          yield* dataArtifacts(f, files.length, plan, shuffle, contents, tiles, counters, blocks, at);
          files.push({ ...fileEntry(f.rel, f.stats), tiles });
        }
      } finally {
        await blocks.return(undefined);
      }
      for (const [label, hex] of plan.framePages) contents.addLabel(label, contents.frame(hex)!);
      for (const [label, hex] of (plan.meta.extra_labels as [string, string][] | undefined) ?? []) {
        contents.addLabel(label, contents.raw(KvIndexWriter.key(hex))!);
      }
      delete plan.meta.extra_labels;
      const doc = contents.finish(
        {
          source_format: plan.format,
          dtype: plan.dtype,
          page_bytes: plan.pageBytes,
          shuffle: { applied: shuffle.applied, elem_bytes: plan.elem },
        },
        files,
        (hex) => {
          indexHex = hex;
        },
      );
      yield { path: KV_INDEX, kind: "json", size: doc.size, mode: 0o644, mtime: new Date(), open: doc.open };
    })(),
    finish: async () => {
      const st = contents.stats;
      return {
        format: plan.format,
        root: plan.root,
        ...plan.meta,
        dtype: plan.dtype,
        page_bytes: plan.pageBytes,
        files: { data: plan.data.length, verbatim: plan.verbatim.length },
        pages_total: st.pages_total,
        pages_unique: st.pages_unique,
        pages_zero: st.pages_zero,
        dedup_ratio: Math.round((st.pages_total / Math.max(1, st.pages_unique)) * 1000) / 1000,
        bytes_total: st.bytes_total,
        bytes_stored: counters.bytesStored,
        shuffle,
        index_sha256: indexHex,
      };
    },
    cleanup: async () => {
      contents.close();
    },
  };
}
