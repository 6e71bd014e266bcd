/**
 * The restore side of a kv layer's pages: the contents its kv-index lists, kept compactly, and
 * the reads that give a content's original bytes (from the spool, or from a staged artifact),
 * each checked against its digest once per rebuild.
 */
import { createHash } from "node:crypto";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { sha256Hex } from "../pfimg/format.js";
import type { VerifiedLookup } from "../types.js";
import { Grow, PAGE_ARTIFACT_RE, pageArtifact, unshuffle } from "./format.js";
import type { KvContent } from "./index-format.js";
import { readFully, restoreBad, type SpoolReader } from "./spool-reader.js";

/**
 * The contents, compactly: per content its bytes, zero flag, shuffle element (1 raw page,
 * 2/4 shuffled, 0 not a page), spool slot (-1: none) and digest; the artifact path itself
 * only for a content not in the spool (a verbatim zstd blob, or a page missing from it).
 */
export class KvContents {
  readonly bytes = new Grow((n) => new Float64Array(n));
  readonly zero = new Grow((n) => new Uint8Array(n));
  readonly elem = new Grow((n) => new Uint8Array(n));
  readonly slot = new Grow((n) => new Int32Array(n));
  sha = Buffer.alloc(32 * 1024);
  readonly #art = new Map<number, string>();

  constructor(readonly spool: SpoolReader | null) {}

  hexOf(ci: number): string {
    return this.sha.toString("hex", 32 * ci, 32 * ci + 32);
  }

  /** The content's artifact path, as the index named it: kept, or told from its digest, shuffle and slot. */
  artifactOf(ci: number): string | null {
    const kept = this.#art.get(ci);
    if (kept !== undefined) return kept;
    const slot = this.slot.a[ci]!;
    if (slot < 0) return null;
    const elem = this.elem.a[ci]!;
    const file = this.spool!.part.a[slot]!;
    const at = file >= 0 ? { file, offset: this.spool!.off.a[slot]! } : undefined;
    return pageArtifact(this.hexOf(ci), elem, at);
  }

  /**
   * The content's bytes are in place in a spool part, in element order: an unshuffled page as
   * stored, or a shuffled one that RestoreSpool put back in order and checked against its digest.
   */
  inPlace(ci: number): boolean {
    const slot = this.slot.a[ci]!;
    return slot >= 0 && this.spool!.part.a[slot]! >= 0;
  }

  /** Add content `i` of the index (contents are added in order). */
  add(c: KvContent, i: number): void {
    this.bytes.push(c.bytes);
    this.zero.push(c.zero ? 1 : 0);
    const m = c.artifact ? PAGE_ARTIFACT_RE.exec(c.artifact) : null;
    this.elem.push(m && m[1] === c.sha256 ? (m[2] ? Number(m[2]) : 1) : 0);
    const slot = c.artifact !== null ? this.spool?.slots.get(c.artifact) : undefined;
    this.slot.push(slot ?? -1);
    if (this.sha.length < 32 * (i + 1)) {
      const b = Buffer.alloc(this.sha.length * 2);
      this.sha.copy(b);
      this.sha = b;
    }
    this.sha.write(c.sha256, 32 * i, "hex");
    // Kept whenever the name cannot be told from the digest and the slot (a damaged map).
    if (c.artifact !== null && (slot === undefined || this.artifactOf(i) !== c.artifact)) this.#art.set(i, c.artifact);
  }
}

/** A content's original bytes, read for a rebuild and checked against its digest. */
export class PageReader {
  readonly #zeroBufs = new Map<number, Buffer>();
  readonly #cache = new Map<number, Buffer>();
  /** Contents whose bytes were already checked against their SHA-256 in this rebuild. */
  readonly checked: Uint8Array;

  /** `layer`: the layer's name; `src`: the work directory holding the staged artifacts. */
  constructor(
    readonly layer: string,
    readonly contents: KvContents,
    readonly src: string,
    readonly verified?: VerifiedLookup,
  ) {
    this.checked = new Uint8Array(contents.bytes.length);
  }

  pageWhere(ci: number): { elem: number; where: string } {
    const art = this.contents.artifactOf(ci);
    const elem = this.contents.elem.a[ci]!;
    if (art === null || elem === 0) {
      throw restoreBad(`${this.layer}: content ${this.contents.hexOf(ci)} has no page artifact`, this.layer);
    }
    return { elem, where: `${this.layer}/${art}` };
  }

  /**
   * The content's bytes were checked on extraction: an unshuffled page's stored bytes hashed to
   * its digest; a shuffled page in place hashed to the index's entry, and, put back in order, to
   * its digest (RestoreSpool refuses it otherwise).
   */
  isVerified(ci: number, where: string): boolean {
    const v = this.verified?.get(where);
    if (v === undefined) return false;
    const c = this.contents;
    return c.elem.a[ci] === 1 ? v === c.hexOf(ci) : c.inPlace(ci);
  }

  /** Check bytes read for content `ci` (once per content: extraction hashed most already). */
  check(ci: number, bytes: Buffer, where: string): void {
    const c = this.contents;
    if (this.checked[ci] === 1) return;
    if (
      bytes.length !== c.bytes.a[ci] ||
      (!this.isVerified(ci, where) &&
        createHash("sha256")
          .update(bytes)
          .digest()
          .compare(c.sha, 32 * ci, 32 * ci + 32) !== 0)
    ) {
      throw restoreBad(`${where}: page does not hash to its name`, where);
    }
    this.checked[ci] = 1;
  }

  pageBytes(ci: number): Buffer {
    const c = this.contents;
    const spool = c.spool;
    const bytes = c.bytes.a[ci]!;
    if (c.zero.a[ci] === 1) {
      let z = this.#zeroBufs.get(bytes);
      if (!z) this.#zeroBufs.set(bytes, (z = Buffer.alloc(bytes)));
      return z;
    }
    const hit = this.#cache.get(ci);
    if (hit) return hit;
    const { elem, where } = this.pageWhere(ci);
    // Synchronous: one small page at a time, and nothing else runs meanwhile; an async read
    // per page costs three thread-pool round trips (measured: the rebuild ran at ~45 MB/s).
    let b: Buffer;
    const slot = c.slot.a[ci]!;
    if (slot >= 0) {
      b = Buffer.allocUnsafe(spool!.len.a[slot]!);
      readFully(spool!.fd(slot), b, spool!.off.a[slot]!, where);
    } else {
      try {
        b = readFileSync(join(this.src, ...c.artifactOf(ci)!.split("/")));
      } catch {
        throw restoreBad(`${where} is missing from the bundle`, where);
      }
    }
    if (elem > 1 && !c.inPlace(ci)) {
      b = unshuffle(b, elem);
      if (b.length !== bytes || sha256Hex(b) !== c.hexOf(ci)) {
        throw restoreBad(`${where}: page does not hash to its name after un-shuffling`, where);
      }
    } else {
      this.check(ci, b, where);
    }
    if (this.#cache.size >= 64) this.#cache.delete(this.#cache.keys().next().value!);
    this.#cache.set(ci, b);
    return b;
  }

  /** Put content `ci`'s original bytes into `dst` (its exact length). */
  fillTile(ci: number, dst: Buffer): void {
    const c = this.contents;
    const spool = c.spool;
    const slot = c.slot.a[ci]!;
    if (
      c.zero.a[ci] === 1 ||
      (c.elem.a[ci] !== 1 && !c.inPlace(ci)) ||
      slot < 0 ||
      spool!.len.a[slot] !== c.bytes.a[ci]
    ) {
      this.pageBytes(ci).copy(dst);
      return;
    }
    // A page in element order in the spool or in place elsewhere: read it straight into place.
    const where = `${this.layer}/${c.artifactOf(ci)!}`;
    readFully(spool!.fd(slot), dst, spool!.off.a[slot]!, where);
    this.check(ci, dst, where);
  }
}
