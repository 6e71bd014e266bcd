/**
 * The chunk tables of incremental snapshots below the file (./chunking.ts): how an artifact is
 * cut (`pages`, `cdc`), the table of its chunks' hashes built as they pass, and a base's table
 * as a lookup.
 */
import { createHash } from "node:crypto";
import type { ChunkHint } from "../format/artifact.js";
import { FastCdcStream } from "../util/fastcdc.js";

/** FastCDC sizes for `cdc` artifacts (sources mark files of at least CDC_MIN_FILE, format/artifact.ts). */
export const CDC_PARAMS = { min: 16 * 1024, avg: 64 * 1024, max: 256 * 1024 } as const;

/** Cuts bytes into the chunks of a mode: views valid until the next push() or end(). */
export interface Splitter {
  push(b: Buffer): Buffer[];
  end(): Buffer[];
}

export class PageSplitter implements Splitter {
  readonly #carry: Buffer;
  #n = 0;
  constructor(readonly size: number) {
    this.#carry = Buffer.allocUnsafe(size);
  }

  push(b: Buffer): Buffer[] {
    const out: Buffer[] = [];
    let at = 0;
    if (this.#n > 0) {
      const k = Math.min(this.size - this.#n, b.length);
      b.copy(this.#carry, this.#n, 0, k);
      this.#n += k;
      at = k;
      if (this.#n < this.size) return out;
      out.push(this.#carry);
      this.#n = 0;
    }
    for (; at + this.size <= b.length; at += this.size) out.push(b.subarray(at, at + this.size));
    // (the carried page is hashed by the caller before the next push refills it)
    if (at < b.length) {
      if (out.length && out[0] === this.#carry) out[0] = Buffer.from(this.#carry);
      b.copy(this.#carry, 0, at);
      this.#n = b.length - at;
    }
    return out;
  }

  end(): Buffer[] {
    return this.#n > 0 ? [this.#carry.subarray(0, this.#n)] : [];
  }
}

export function splitter(hint: ChunkHint): Splitter | null {
  if (hint.mode === "pages") return new PageSplitter(hint.pageSize!);
  if (hint.mode === "cdc") return new FastCdcStream(CDC_PARAMS);
  return null;
}

export const hash16 = (b: Buffer): Buffer => createHash("sha256").update(b).digest().subarray(0, 16);

/** Accumulates a table as chunks pass. */
export class TableBuilder {
  readonly #parts: Buffer[] = [];
  #cur = Buffer.allocUnsafe(64 * 1024);
  #n = 0;
  constructor(readonly mode: ChunkHint["mode"]) {}

  add(len: number, h: Buffer): void {
    const rec = this.mode === "cdc" ? 20 : 16;
    if (this.#n + rec > this.#cur.length) {
      this.#parts.push(this.#cur.subarray(0, this.#n));
      this.#cur = Buffer.allocUnsafe(this.#cur.length);
      this.#n = 0;
    }
    if (this.mode === "cdc") {
      this.#cur.writeUInt32LE(len, this.#n);
      this.#n += 4;
    }
    h.copy(this.#cur, this.#n);
    this.#n += 16;
  }

  /** `pages`: the first `n` 16-byte hashes of `h`, as n calls of add() would. */
  addPages(h: Buffer, n: number): void {
    for (let off = 0; off < 16 * n;) {
      if (this.#n + 16 > this.#cur.length) {
        this.#parts.push(this.#cur.subarray(0, this.#n));
        this.#cur = Buffer.allocUnsafe(this.#cur.length);
        this.#n = 0;
      }
      const k = Math.min(16 * n - off, (this.#cur.length - this.#n) & ~15);
      h.copy(this.#cur, this.#n, off, off + k);
      this.#n += k;
      off += k;
    }
  }

  done(): Buffer {
    return Buffer.concat([...this.#parts, this.#cur.subarray(0, this.#n)]);
  }
}

/**
 * A base table as a lookup: each chunk's offset and length, and by hash the chunk numbers. A page
 * is first compared with the base's page at its own place (most are there); the map by hash is
 * built only when one is not (shifted pages, a CDC chunk).
 */
export class BaseTable {
  readonly offsets: number[] = [];
  readonly lengths: number[] = [];
  #byHash: Map<number, number | number[]> | null = null;
  readonly used: Uint8Array;
  readonly #rec: number;

  constructor(
    readonly table: Buffer,
    readonly hint: ChunkHint,
    size: number,
  ) {
    this.#rec = hint.mode === "cdc" ? 20 : 16;
    let off = 0;
    for (let at = 0; at + this.#rec <= table.length; at += this.#rec) {
      const len = hint.mode === "cdc" ? table.readUInt32LE(at) : Math.min(hint.pageSize!, size - off);
      this.offsets.push(off);
      this.lengths.push(len);
      off += len;
    }
    this.used = new Uint8Array(this.offsets.length);
    if (off !== size) this.offsets.length = 0; // a table that does not tile the artifact matches nothing
  }

  // Keyed by the hash's first 48 bits as a number (a string key per chunk cost ~60 ms to build for a
  // 255 MiB database); a candidate's other bits are compared in find().
  #map(): Map<number, number | number[]> {
    if (this.#byHash) return this.#byHash;
    const m = new Map<number, number | number[]>();
    for (let i = 0; i < this.offsets.length; i++) {
      const key = this.table.readUIntLE(i * this.#rec + this.#rec - 16, 6);
      const had = m.get(key);
      if (had === undefined) m.set(key, i);
      else if (typeof had === "number") m.set(key, [had, i]);
      else had.push(i);
    }
    return (this.#byHash = m);
  }

  /**
   * `pages`: the number of the base's page at `at` when it and the `n - 1` after it are whole
   * pages, unused, and hash to the `n` 16-byte hashes in `hashes` (each page where find() would
   * have found it first: at its own place); else -1.
   */
  samePages(at: number, n: number, hashes: Buffer): number {
    const ps = this.hint.pageSize!;
    if (this.hint.mode !== "pages" || n < 1 || at % ps !== 0) return -1;
    const i = at / ps;
    // (every page but the base's last is whole)
    if (i + n > this.offsets.length || this.lengths[i + n - 1] !== ps) return -1;
    for (let k = i; k < i + n; k++) if (this.used[k]) return -1;
    return this.table.compare(hashes, 0, 16 * n, 16 * i, 16 * (i + n)) === 0 ? i : -1;
  }

  /** An unused chunk of length `len` hashing to `h`, the one at `at` first. */
  find(h: Buffer, len: number, at: number): number | undefined {
    if (!this.offsets.length) return undefined;
    if (this.hint.mode === "pages") {
      const i = Math.floor(at / this.hint.pageSize!);
      if (
        i < this.offsets.length &&
        !this.used[i] &&
        this.lengths[i] === len &&
        this.offsets[i] === at &&
        this.table.compare(h, 0, 16, i * 16, i * 16 + 16) === 0
      )
        return i;
    }
    const had = this.#map().get(h.readUIntLE(0, 6));
    if (had === undefined) return undefined;
    const list = typeof had === "number" ? [had] : had;
    let pick: number | undefined;
    for (const i of list) {
      if (this.used[i] || this.lengths[i] !== len) continue;
      const at = i * this.#rec + this.#rec - 16;
      if (this.table.compare(h, 0, 16, at, at + 16) !== 0) continue;
      if (this.offsets[i] === at) return i;
      pick ??= i;
    }
    return pick;
  }
}
