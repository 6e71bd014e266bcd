/**
 * Per-class zstd levels: spend the configured level on bytes that reward it, and the fastest
 * level that still entropy-codes (level 1) on bytes that do not.
 *
 * KV-cache pages (fp16/bf16), float32 embedding BLOBs and other numeric dumps have almost no
 * repeated strings, so a higher level's deeper match search finds nothing: measured on the
 * bench mix, zstd -3 and -1 give the same size (within 0.2 %) on the KV pages and on a
 * vector database, while -1 runs 1.3-1.5x faster. Text (notes, JSONL traces, SQLite pages of
 * text) does gain from the configured level.
 *
 * The class is measured, not guessed from names: a sample of the artifact's first chunk (four
 * 16 KiB slices spread over it) is compressed at level 1 on the calling thread (~0.2 ms); if it
 * keeps more than {@link INCOMPRESSIBLE_RATIO} of its size, it is compressed at the configured
 * level too, and when that gains less than {@link MIN_LEVEL_GAIN} the bytes are "dense" and get
 * level min(configured, 1). The slices were 4 KiB until the realistic home (#38) showed them too
 * short for level 3's matches to show: SQLite databases of text and embedding BLOBs gained
 * 2.0-2.2 % on such a sample (so level 1) but 5.0-6.4 % on the whole 1 MiB chunk, which cost
 * the bundle 4 MiB of 108; on 16 KiB slices the same sample gains 3.2-3.8 %, KV pages 0.0 %. Measured on the bench mix: float32 embedding BLOBs are dense (level
 * 3 gains 0.1 %), bf16 KV pages are not (level 3 is 6.6 % smaller than level 1 and still runs
 * at 560 MB/s). Sampling is throttled: an artifact is sampled when it is at least
 * {@link MIN_SAMPLE_ARTIFACT} bytes and {@link RESAMPLE_BYTES} have passed since the layer's
 * last sample; big artifacts are re-sampled every {@link RESAMPLE_BYTES} inside (a database
 * can hold text tables and BLOB tables). Smaller artifacts keep the layer's current level, so
 * runs of small files do not flip levels (each change ends a zstd frame).
 */
import { createRequire } from "node:module";

/** A sample that keeps more than this fraction of its size at zstd -1 is dense. */
export const INCOMPRESSIBLE_RATIO = 0.6;
/** A dense sample stays at the configured level only if that makes it at least this much smaller than level 1. */
export const MIN_LEVEL_GAIN = 0.02;
/** Artifacts smaller than this are not sampled (they keep the layer's current level). */
export const MIN_SAMPLE_ARTIFACT = 64 * 1024;
/** Bytes between samples within a layer or an artifact. */
export const RESAMPLE_BYTES = 4 * 1024 * 1024;
const SLICE = 16 * 1024;
const SLICES = 4;

interface Binding {
  CCtx: new () => { compress(dst: Uint8Array, src: Uint8Array, level: number): number };
}
let cctx: { compress(dst: Uint8Array, src: Uint8Array, level: number): number } | undefined;
let dst: Buffer | undefined;
const sampleBuf = Buffer.allocUnsafe(SLICE * SLICES);

function sampleOf(chunk: Uint8Array): Uint8Array {
  if (chunk.length <= SLICE * SLICES) return chunk;
  const step = Math.floor((chunk.length - SLICE) / (SLICES - 1));
  for (let i = 0; i < SLICES; i++) sampleBuf.set(chunk.subarray(i * step, i * step + SLICE), i * SLICE);
  return sampleBuf;
}

function compressedSize(sample: Uint8Array, level: number): number {
  if (!cctx) {
    const b = createRequire(import.meta.url)("zstd-napi/binding") as Binding;
    cctx = new b.CCtx();
    dst = Buffer.allocUnsafe(SLICE * SLICES + 1024);
  }
  return cctx.compress(dst!, sample, level);
}

/** Compressed size / size of a sample of `chunk` at zstd level 1. */
export function sampleRatio(chunk: Uint8Array): number {
  const sample = sampleOf(chunk);
  return sample.length === 0 ? 0 : compressedSize(sample, 1) / sample.length;
}

/**
 * True when `chunk` is dense for `level`: a sample keeps more than {@link INCOMPRESSIBLE_RATIO}
 * of its size at level 1, and `level` makes it less than {@link MIN_LEVEL_GAIN} smaller still.
 */
export function isDense(chunk: Uint8Array, level: number): boolean {
  const sample = sampleOf(chunk);
  if (sample.length === 0) return false;
  const at1 = compressedSize(sample, 1);
  if (at1 <= INCOMPRESSIBLE_RATIO * sample.length) return false;
  return compressedSize(sample, level) >= (1 - MIN_LEVEL_GAIN) * at1;
}

/** Chooses the zstd level for each stretch of the payload. */
export class LevelPolicy {
  readonly dense: number;
  #layer = "";
  #current: number;
  #since = Infinity;
  #big = false;
  /** Samples taken and how many were dense (for the bench and tests). */
  samples = 0;
  denseSamples = 0;

  constructor(readonly level: number) {
    this.dense = Math.min(level, 1);
    this.#current = level;
  }

  /** The level for an artifact of `size` bytes of `layer` whose first chunk is `first`. */
  start(layer: string, size: number, first: Uint8Array | undefined): number {
    if (layer !== this.#layer) {
      this.#layer = layer;
      this.#current = this.level;
      this.#since = Infinity;
    }
    this.#big = size >= MIN_SAMPLE_ARTIFACT;
    if (this.dense !== this.level && first && this.#big && this.#since >= RESAMPLE_BYTES) this.#sample(first);
    return this.#current;
  }

  /**
   * Account the artifact's next chunk (the first one too, after {@link start}); inside a big artifact, a chunk that
   * starts a new stretch is re-sampled.
   */
  next(chunk: Uint8Array): number {
    if (this.dense !== this.level && this.#big && this.#since >= RESAMPLE_BYTES) this.#sample(chunk);
    this.#since += chunk.length;
    return this.#current;
  }

  #sample(chunk: Uint8Array): void {
    const dense = isDense(chunk, this.level);
    this.samples++;
    if (dense) this.denseSamples++;
    this.#current = dense ? this.dense : this.level;
    this.#since = 0;
  }
}
