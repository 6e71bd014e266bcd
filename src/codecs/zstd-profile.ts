/**
 * The zstd settings behind a frame's "level": a zstd level, or {@link PLANE_LEVEL}, the profile
 * for a byte plane of numeric data (KV pages shuffled into planes, see sources/kv/format.ts).
 *
 * A byte plane holds no repeated strings, only skewed byte frequencies (bf16's high bytes: the
 * sign and most of the exponent, ~2.4 bits of entropy per byte on a realistic home's KV dump;
 * the low bytes ~8, incompressible). Its saving comes from Huffman-coding the literals alone, so
 * the match finder only costs time, and with a small hash table zstd finds fewer short matches,
 * which codes such bytes better. Measured on that dump's 250 MB of distinct bf16 pages, each
 * plane a frame of its own (32 KiB): level 1 41.1 MB of high planes in 362 ms with hashLog 8,
 * 40.2 MB in 241 ms with hashLog 6 (the smallest), 45.1 MB in 579 ms with level 1's default.
 * A module of its own, so the encoder's worker threads load nothing else.
 */

/** Not a zstd level (those are -131072 to 22): a byte plane's frame, level 1 with hashLog 6. */
export const PLANE_LEVEL = 1001;
const PLANE_HASH_LOG = 6;

interface LevelParams {
  compressionLevel: number;
  hashLog: number;
}

/** A compression context that takes parameters (zstd-napi's CCtx). */
interface ParamCtx {
  setParameter(param: number, value: number): void;
}

/** Set `cctx` up for frames of `level`; hashLog 0 is zstd's "the level's own". */
export function applyFrameLevel(cctx: ParamCtx, p: LevelParams, level: number): void {
  if (level === PLANE_LEVEL) {
    cctx.setParameter(p.compressionLevel, 1);
    cctx.setParameter(p.hashLog, PLANE_HASH_LOG);
  } else {
    cctx.setParameter(p.compressionLevel, level);
    cctx.setParameter(p.hashLog, 0);
  }
}
