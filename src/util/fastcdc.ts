/**
 * FastCDC content-defined chunking, the 2020 variant (Xia et al., "The Design of Fast
 * Content-Defined Chunking for Data Deduplication Based Storage Systems", IEEE TPDS 2020), cut
 * for cut as the fastcdc-rs crate's `v2020` module computes it (normalization level 1, no seed;
 * test/util/fastcdc.test.ts checks its published vectors): a gear hash rolled two bytes at a
 * time with a left-shifted table, a stricter mask before the average size and a looser one
 * after, no cut before `min` and a forced cut at `max`.
 *
 * The 64-bit hash is kept as two 32-bit halves (JS numbers hold 53 bits). The gear table is
 * what fastcdc-rs derives: the first 8 bytes (big-endian) of MD5 over 64 bytes of the index.
 */
import { createHash } from "node:crypto";

/** Masks by number of bits (fastcdc-rs MASKS; 0-4 unused). */
const MASKS = [
  "0",
  "0",
  "0",
  "0",
  "0",
  "0000000001804110",
  "0000000001803110",
  "0000000018035100",
  "0000001800035300",
  "0000019000353000",
  "0000590003530000",
  "0000d90003530000",
  "0000d90103530000",
  "0000d90303530000",
  "0000d90313530000",
  "0000d90f03530000",
  "0000d90303537000",
  "0000d90703537000",
  "0000d90707537000",
  "0000d91707537000",
  "0000d91747537000",
  "0000d91767537000",
  "0000d93767537000",
  "0000d93777537000",
  "0000d93777577000",
  "0000db3777577000",
];

const M64 = (1n << 64n) - 1n;
const GEAR: bigint[] = [];
const GEAR_LS: bigint[] = [];
// The cut decision needs only the hash's low 50 bits (no mask, shifted, reaches above bit 48, and
// a bit of the hash depends only on the bits below it), kept as a 24-bit and a 26-bit half: every
// value stays a small integer, which V8 keeps in registers (32-bit halves ran 3-4 times slower).
const G_LO = new Int32Array(256);
const G_HI = new Int32Array(256);
const GLS_LO = new Int32Array(256);
const GLS_HI = new Int32Array(256);
for (let i = 0; i < 256; i++) {
  const g = createHash("md5").update(Buffer.alloc(64, i)).digest().readBigUInt64BE(0);
  GEAR.push(g);
  GEAR_LS.push((g << 1n) & M64);
  G_LO[i] = Number(g & 0xffffffn);
  G_HI[i] = Number((g >> 24n) & 0x3ffffffn);
  GLS_LO[i] = Number((g << 1n) & 0xffffffn);
  GLS_HI[i] = Number(((g << 1n) >> 24n) & 0x3ffffffn);
}

/** The gear table's entry `i` (for tests). */
export function gear(i: number): bigint {
  return GEAR[i]!;
}

export interface FastCdcParams {
  min: number;
  avg: number;
  max: number;
}

/** One cut: the chunk's length and the gear hash at the cut (fastcdc-rs `cut`'s pair). */
export interface Cut {
  length: number;
  hash: bigint;
}

/** A mask's bits 24-49 and 0-23. */
const split = (v: bigint): [number, number] => [Number((v >> 24n) & 0x3ffffffn), Number(v & 0xffffffn)];

const rolled = { at: -1, hi: 0, lo: 0 };

/**
 * The gear hash rolled two bytes a step from pair `from` to pair `to` of `src[start…]`, starting
 * from hash (hi, lo): the position of the first cut (`at`, -1 for none) and the
 * hash there, for the masks (mhi, mlo) and, left-shifted, (lhi, llo) (24- and 26-bit halves).
 */
function roll(
  src: Uint8Array,
  start: number,
  from: number,
  to: number,
  hi: number,
  lo: number,
  mhi: number,
  mlo: number,
  lhi: number,
  llo: number,
): { at: number; hi: number; lo: number } {
  let at = -1;
  for (let index = from; index < to; index++) {
    const a = start + index * 2;
    // hash = (hash << 2) + GEAR_LS[src[a]]
    let b = src[a]!;
    let nlo = ((lo << 2) & 0xffffff) + GLS_LO[b]!;
    hi = (((hi << 2) | (lo >>> 22)) + GLS_HI[b]! + (nlo >>> 24)) & 0x3ffffff;
    lo = nlo & 0xffffff;
    if (((hi & lhi) | (lo & llo)) === 0) {
      at = index * 2;
      break;
    }
    // hash += GEAR[src[a + 1]]
    b = src[a + 1]!;
    nlo = lo + G_LO[b]!;
    hi = (hi + G_HI[b]! + (nlo >>> 24)) & 0x3ffffff;
    lo = nlo & 0xffffff;
    if (((hi & mhi) | (lo & mlo)) === 0) {
      at = index * 2 + 1;
      break;
    }
  }
  rolled.at = at;
  rolled.hi = hi;
  rolled.lo = lo;
  return rolled;
}

/** A FastCDC 2020 chunker with fixed sizes. */
export class FastCdc {
  readonly min: number;
  readonly avg: number;
  readonly max: number;
  readonly #ms: [number, number];
  readonly #ml: [number, number];
  readonly #msLs: [number, number];
  readonly #mlLs: [number, number];

  constructor({ min, avg, max }: FastCdcParams) {
    if (!(min >= 64 && min <= avg && avg <= max && max <= 16 * 1024 * 1024 && avg >= 256))
      throw new RangeError("FastCDC sizes out of range");
    this.min = min;
    this.avg = avg;
    this.max = max;
    const bits = Math.round(Math.log2(avg));
    const ms = BigInt(`0x${MASKS[bits + 1]!}`);
    const ml = BigInt(`0x${MASKS[bits - 1]!}`);
    this.#ms = split(ms);
    this.#ml = split(ml);
    this.#msLs = split(ms << 1n);
    this.#mlLs = split(ml << 1n);
  }

  /**
   * The length of the chunk that starts at `start` in `src[start, end)` (the rest of the data
   * when `end - start` is below `max`; otherwise only the first `max` bytes are looked at).
   */
  cut(src: Uint8Array, start: number, end: number): number {
    let remaining = end - start;
    if (remaining <= this.min) return remaining;
    let center = this.avg;
    if (remaining > this.max) remaining = this.max;
    else if (remaining < center) center = remaining;
    const first = this.min >>> 1;
    const mid = Math.max(first, center >>> 1);
    let r = roll(src, start, first, mid, 0, 0, this.#ms[0], this.#ms[1], this.#msLs[0], this.#msLs[1]);
    if (r.at < 0)
      r = roll(src, start, mid, remaining >>> 1, r.hi, r.lo, this.#ml[0], this.#ml[1], this.#mlLs[0], this.#mlLs[1]);
    return r.at >= 0 ? r.at : remaining;
  }

  /**
   * The full 64-bit gear hash at the cut that ends the chunk `src[start, start+length)` of data
   * ending at `end`, as fastcdc-rs reports it (for tests: rolled again, in BigInt).
   */
  hashAt(src: Uint8Array, start: number, end: number, length: number): bigint {
    const remaining = Math.min(end - start, this.max);
    if (remaining <= this.min) return 0n;
    let h = 0n;
    for (let index = this.min >>> 1; index < remaining >>> 1; index++) {
      const a = index * 2;
      h = ((h << 2n) + GEAR_LS[src[start + a]!]!) & M64;
      if (a === length) return h;
      h = (h + GEAR[src[start + a + 1]!]!) & M64;
      if (a + 1 === length) return h;
    }
    return h;
  }

  /** Every cut of `data`, in order. */
  cuts(data: Uint8Array): Cut[] {
    const out: Cut[] = [];
    for (let at = 0; at < data.length;) {
      const length = this.cut(data, at, data.length);
      out.push({ length, hash: this.hashAt(data, at, data.length, length) });
      at += length;
    }
    return out;
  }
}

/**
 * FastCDC over a stream: bytes are pushed as they come (any chunking, buffers the caller may
 * reuse) and whole chunks come out, the same cuts as over the data in one piece. A chunk is a
 * view of an internal buffer, valid until the next push() or end().
 */
export class FastCdcStream {
  readonly #cdc: FastCdc;
  #buf: Buffer;
  #start = 0;
  #end = 0;

  constructor(params: FastCdcParams) {
    this.#cdc = new FastCdc(params);
    this.#buf = Buffer.allocUnsafe(params.max * 2);
  }

  push(data: Uint8Array): Buffer[] {
    // The views handed out by the last call are stale from here: what is left moves to the front.
    if (this.#start > 0) {
      this.#buf.copy(this.#buf, 0, this.#start, this.#end);
      this.#end -= this.#start;
      this.#start = 0;
    }
    if (this.#end + data.length > this.#buf.length) {
      const grown = Buffer.allocUnsafe(Math.max(this.#buf.length * 2, this.#end + data.length));
      this.#buf.copy(grown, 0, 0, this.#end);
      this.#buf = grown;
    }
    this.#buf.set(data, this.#end);
    this.#end += data.length;
    const out: Buffer[] = [];
    // A cut looks at `max` bytes at most: with that many buffered it is final.
    while (this.#end - this.#start >= this.#cdc.max) out.push(this.#take());
    return out;
  }

  #take(): Buffer {
    const n = this.#cdc.cut(this.#buf, this.#start, this.#end);
    const c = this.#buf.subarray(this.#start, this.#start + n);
    this.#start += n;
    return c;
  }

  /** The last chunks, once every byte was pushed. */
  end(): Buffer[] {
    const out: Buffer[] = [];
    while (this.#end > this.#start) out.push(this.#take());
    return out;
  }
}
