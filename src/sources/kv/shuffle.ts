/** Whether a capture byte-plane shuffles its pages: the config's choice, or (auto) a sample compressed both ways. */
import { open, type FileHandle } from "node:fs/promises";
import { createRequire } from "node:module";
import { applyFrameLevel, PLANE_LEVEL } from "../../codecs/zstd-profile.js";
import { isAllZero, zstdCompressSync } from "../pfimg/frames.js";
import { sourceError } from "../walk.js";
import { shuffle as shufflePlanes } from "./format.js";
import type { DataFile, KvPlan } from "./plan.js";

/**
 * A shuffled page's planes are compressed a zstd frame each with the plane profile when each plane
 * is at least this big (a frame's header and Huffman table cost ~100 bytes); smaller pages are
 * shuffled into the stream as they come.
 */
export const PLANE_MIN_BYTES = 4096;
/** Auto shuffle: at most this many pages, this many bytes, compressed both ways. */
const SAMPLE_PAGES = 32;
const SAMPLE_MAX_BYTES = 4 * 1024 * 1024;
const SAMPLE_LEVEL = 3;
/**
 * Keep the shuffle when it makes the sample at least this much smaller. Shuffled into one
 * stream, pages compressed far slower at the same level (measured, bf16 KV pages: zstd -1
 * 860 → 372 MB/s, zstd -3 564 → 225 MB/s) and gained little, since zstd's blocks mixed the
 * planes' literals: on the bench mix a 7 % saving made the KV layer's snapshot 2.3x slower. With a
 * frame per plane (the plane profile, codecs/zstd-profile.ts) compression costs about what the
 * unshuffled pages' does; what is left is the shuffle each way and a second SHA-256 each way
 * (the stored planes' on snapshot, the page's on restore), which is why it must still pay.
 */
const SHUFFLE_MIN_SAVING = 0.1;

export interface ShuffleDecision {
  mode: "auto" | "on" | "off";
  applied: boolean;
  elem_bytes: number;
  reason?: string;
  /**
   * `zstd3_plain`: the pages as they are at zstd -3 (or -1 when smaller); `zstd3_shuffled`: shuffled,
   * each plane a frame of the plane profile (planes of PLANE_MIN_BYTES or more), else at zstd -3.
   * The names are the format's (docs/FORMAT.md).
   */
  sample?: { pages: number; bytes: number; zstd3_plain: number; zstd3_shuffled: number; saving_pct: number };
}

export async function decideShuffle(plan: KvPlan, mode: "auto" | "on" | "off"): Promise<ShuffleDecision> {
  const elem = plan.elem;
  if (elem !== 2 && elem !== 4) {
    const reason = `${plan.dtype} has ${elem}-byte elements; byte-plane shuffle applies to 2- and 4-byte dtypes`;
    return { mode, applied: false, elem_bytes: elem, reason };
  }
  if (plan.data.length === 0) {
    const reason = "no raw pages (ProcessFork zstd blobs are kept as stored)";
    return { mode, applied: false, elem_bytes: elem, reason };
  }
  if (mode === "off") return { mode, applied: false, elem_bytes: elem };
  if (mode === "on") return { mode, applied: true, elem_bytes: elem };
  // auto: compress a spread-out sample of non-zero pages both ways at zstd -3.
  // Candidates (tiles of whole elements, not declared zero) by number, without listing them all.
  const ok = (f: DataFile, i: number): boolean => f.tiles.len(i) % elem === 0 && !f.tiles.zero(i);
  let total = 0;
  for (const f of plan.data) for (let i = 0; i < f.tiles.length; i++) if (ok(f, i)) total++;
  let cf = 0;
  let ci = 0;
  let seen = 0;
  /** The k-th candidate (k not decreasing). */
  const nth = (k: number): { f: DataFile; t: { offset: number; len: number } } => {
    for (;;) {
      const f = plan.data[cf]!;
      if (ci >= f.tiles.length) {
        cf++;
        ci = 0;
        continue;
      }
      if (ok(f, ci)) {
        if (seen === k) return { f, t: { offset: f.tiles.offset(ci), len: f.tiles.len(ci) } };
        seen++;
      }
      ci++;
    }
  };
  const all = { length: total };
  const want = Math.min(all.length, SAMPLE_PAGES * 2);
  const plain: Buffer[] = [];
  const shuf: Buffer[] = [];
  let bytes = 0;
  for (let k = 0; k < want && plain.length < SAMPLE_PAGES && bytes < SAMPLE_MAX_BYTES; k++) {
    const { f, t } = nth(Math.floor((k * all.length) / want));
    const len = Math.min(t.len, SAMPLE_MAX_BYTES - bytes);
    const n = len - (len % elem);
    if (n === 0) break;
    const b = Buffer.alloc(n);
    let fh: FileHandle | undefined;
    try {
      fh = await open(f.abs, "r");
      await fh.read(b, 0, n, t.offset);
    } catch (e) {
      throw sourceError(e, f.abs);
    } finally {
      await fh?.close();
    }
    if (isAllZero(b)) continue;
    plain.push(b);
    shuf.push(shufflePlanes(b, elem));
    bytes += n;
  }
  if (plain.length === 0) return { mode, applied: false, elem_bytes: elem, reason: "no non-zero pages to sample" };
  const cat = Buffer.concat(plain);
  const a = Math.min(zstdCompressSync(cat, SAMPLE_LEVEL).length, zstdCompressSync(cat, 1).length);
  const s = shuf.every((b) => b.length / elem >= PLANE_MIN_BYTES)
    ? shuf.reduce((n, b) => n + planeFrames(b, elem), 0)
    : zstdCompressSync(Buffer.concat(shuf), SAMPLE_LEVEL).length;
  const saving = 1 - s / a;
  return {
    mode,
    applied: saving >= SHUFFLE_MIN_SAVING,
    elem_bytes: elem,
    sample: {
      pages: plain.length,
      bytes,
      zstd3_plain: a,
      zstd3_shuffled: s,
      saving_pct: Math.round(saving * 10000) / 100,
    },
  };
}

interface PlaneCCtx {
  setParameter(param: number, value: number): void;
  compress2(dst: Uint8Array, src: Uint8Array): number;
}
let planeCtx: { cctx: PlaneCCtx; dst: Buffer } | undefined;
/** The bytes a shuffled page's planes take, each a frame of the plane profile (as the snapshot packs them). */
function planeFrames(page: Buffer, elem: number): number {
  if (!planeCtx) {
    const b = createRequire(import.meta.url)("zstd-napi/binding") as {
      CCtx: new () => PlaneCCtx;
      CParameter: { compressionLevel: number; hashLog: number };
    };
    const cctx = new b.CCtx();
    applyFrameLevel(cctx, b.CParameter, PLANE_LEVEL);
    planeCtx = { cctx, dst: Buffer.alloc(0) };
  }
  const n = page.length / elem;
  if (planeCtx.dst.length < n + (n >> 8) + 1024) planeCtx.dst = Buffer.allocUnsafe(n + (n >> 8) + 1024);
  let size = 0;
  for (let p = 0; p < elem; p++) size += planeCtx.cctx.compress2(planeCtx.dst, page.subarray(p * n, (p + 1) * n));
  return size;
}
