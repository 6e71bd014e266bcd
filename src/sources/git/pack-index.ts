/**
 * A git layer's pack index (`repo.idx`): the `.idx` file (version 2) git wrote beside the pack of
 * the layer's whole bundle. Restore installs the bundle's pack with it as a packfile of the new
 * repository instead of running `git index-pack` (which inflates and hashes every object, and
 * resolves every delta: 1.8 of the 2.2 s that fetching the realistic home's memdir took).
 *
 * Both files are hostile input. Before the pack is installed, checkAndCopyPack checks that the index
 * describes this pack and nothing else, so that git reads only the pack's own bytes, each object
 * once, with no delta cycle:
 * - the index: its magic and version, its size against its object count, a fanout that never
 *   decreases and ends at the count, names strictly increasing and under the right fanout
 *   bucket, 31-bit offsets or indices into the 64-bit table (each used once, in order, each over
 *   2^31), and its trailing checksum;
 * - the pack: its signature, version and object count (the index's), its trailing checksum
 *   (computed), and the index's copy of it;
 * - the objects: their offsets distinct, the first right after the pack header and each object
 *   running up to the next (the last up to the trailer), a header of a known type (commit, tree,
 *   blob, tag, or a delta against an earlier offset of the pack that is an object's own: a
 *   delta by object name is refused), an inflated size zlib could reach from its bytes, and
 *   delta chains at most MAX_DEPTH long.
 * What this does not check is that each object's name is the hash of its content, nor that the
 * refs' histories are complete: `verify --deep` does (it indexes the pack again with git and
 * compares the index byte for byte, then walks every ref's history).
 */
import { createHash } from "node:crypto";
import { open, type FileHandle } from "node:fs/promises";
import type { LayerEntry } from "../../format/manifest.js";

export const PACK_INDEX_ARTIFACT = "repo.idx";
/** The artifact kind of the pack index. */
export const PACK_INDEX_KIND = "git-pack-index";
/** Git's own bound on a delta chain (pack-objects --depth). */
export const MAX_DEPTH = 4095;
/** Objects at most in an index restore installs (its offsets and CRCs, ~24 bytes each, are held while it is checked); a bigger pack is fetched. */
export const MAX_INDEXED_OBJECTS = 1 << 21;

/** The pack index's size the layer meta declares (`bundle_index_bytes`), or null. */
export function declaredIndexBytes(layer: LayerEntry): number | null {
  const n = layer.meta?.bundle_index_bytes;
  return typeof n === "number" && Number.isSafeInteger(n) && n > 0 ? n : null;
}

const IDX_MAGIC = Buffer.from([0xff, 0x74, 0x4f, 0x63]);
const HEADER = 8 + 256 * 4;
/** deflate's largest expansion is 1032:1; a declared size beyond it cannot be inflated from the bytes. */
const MAX_RATIO = 1032;
const BLOCK = 1 << 20;

export interface PackIndexFacts {
  objects: number;
  /** The pack's checksum (its trailer), hex: the pack's name in objects/pack. */
  packName: string;
}

async function readAt(fh: FileHandle, pos: number, len: number): Promise<Buffer> {
  const b = Buffer.allocUnsafe(len);
  let got = 0;
  while (got < len) {
    const { bytesRead } = await fh.read(b, got, len - got, pos + got);
    if (bytesRead === 0) break;
    got += bytesRead;
  }
  return got === len ? b : b.subarray(0, got);
}

/**
 * Check the index at `idxPath` alone (see above); returns its object offsets in pack order, the
 * pack checksum it names, or why it is not an index memsnap installs. `null`: more objects than
 * MAX_INDEXED_OBJECTS (not an error: such a pack is fetched).
 */
export async function readPackIndex(
  idxPath: string,
  hashLen: 20 | 32,
): Promise<{ offsets: Float64Array; packChecksum: Buffer } | string | null> {
  const fh = await open(idxPath, "r");
  try {
    const size = (await fh.stat()).size;
    if (size < HEADER + 2 * hashLen) return "the pack index is truncated";
    const head = await readAt(fh, 0, HEADER);
    if (!head.subarray(0, 4).equals(IDX_MAGIC) || head.readUInt32BE(4) !== 2) {
      return "not a version 2 git pack index";
    }
    const n = head.readUInt32BE(HEADER - 4);
    if (n > MAX_INDEXED_OBJECTS) return null;
    let prev = 0;
    for (let b = 0; b < 256; b++) {
      const f = head.readUInt32BE(8 + b * 4);
      if (f < prev) return "the pack index's fanout table decreases";
      prev = f;
    }
    const fixed = HEADER + n * (hashLen + 8) + 2 * hashLen;
    const rest = size - fixed;
    if (rest < 0 || rest % 8 !== 0) return `the pack index's size (${size}) does not fit its ${n} objects`;
    const large = rest / 8;
    if (large > n) return `the pack index's size (${size}) does not fit its ${n} objects`;
    const sum = createHash(hashLen === 20 ? "sha1" : "sha256").update(head);
    // Names: strictly increasing, each in its fanout bucket.
    const namesEnd = HEADER + n * hashLen;
    let last: Buffer | null = null;
    let i = 0;
    for (let pos = HEADER; pos < namesEnd; ) {
      const len = Math.min(namesEnd - pos, Math.floor(BLOCK / hashLen) * hashLen);
      const buf = await readAt(fh, pos, len);
      if (buf.length !== len) return "the pack index is truncated";
      sum.update(buf);
      for (let o = 0; o < len; o += hashLen, i++) {
        const name = buf.subarray(o, o + hashLen);
        if (last && Buffer.compare(last, name) >= 0) return "the pack index's object names are not in strict order";
        const bucket = name[0]!;
        const lo = bucket === 0 ? 0 : head.readUInt32BE(8 + (bucket - 1) * 4);
        const hi = head.readUInt32BE(8 + bucket * 4);
        if (i < lo || i >= hi) return "an object name of the pack index is outside its fanout bucket";
        last = Buffer.from(name);
      }
      pos += len;
    }
    const tail = await readAt(fh, namesEnd, size - namesEnd);
    if (tail.length !== size - namesEnd) return "the pack index is truncated";
    sum.update(tail.subarray(0, tail.length - hashLen));
    if (!sum.digest().equals(tail.subarray(tail.length - hashLen))) {
      return "the pack index's checksum does not match its bytes";
    }
    const off32 = n * 4; // after the CRCs
    const off64 = off32 + n * 4;
    const offsets = new Float64Array(n);
    let nextLarge = 0;
    for (let k = 0; k < n; k++) {
      const v = tail.readUInt32BE(off32 + k * 4);
      if (v & 0x80000000) {
        const at = v & 0x7fffffff;
        if (at !== nextLarge || at >= large) return "the pack index's 64-bit offsets are not used once each, in order";
        nextLarge++;
        const hi = tail.readUInt32BE(off64 + at * 8);
        const lo = tail.readUInt32BE(off64 + at * 8 + 4);
        const o = hi * 2 ** 32 + lo;
        if (hi >= 1 << 21 || o < 2 ** 31) return "the pack index holds a 64-bit offset out of range";
        offsets[k] = o;
      } else offsets[k] = v;
    }
    if (nextLarge !== large) return "the pack index holds 64-bit offsets no object uses";
    offsets.sort();
    return { offsets, packChecksum: Buffer.from(tail.subarray(off64 + large * 8, off64 + large * 8 + hashLen)) };
  } finally {
    await fh.close();
  }
}

/** One object's header at `b[p..]`: its type, declared size and header length (null: not enough bytes). */
function objectHeader(b: Buffer, p: number, end: number): { type: number; size: number; len: number; back: number } | null {
  let q = p;
  if (q >= end) return null;
  let c = b[q++]!;
  const type = (c >> 4) & 7;
  let size = c & 15;
  let shift = 4;
  while (c & 0x80) {
    if (q >= end || shift > 49) return q >= end ? null : { type: -1, size: 0, len: 0, back: 0 };
    c = b[q++]!;
    size += (c & 0x7f) * 2 ** shift;
    shift += 7;
  }
  let back = 0;
  if (type === 6) {
    if (q >= end) return null;
    c = b[q++]!;
    back = c & 0x7f;
    let n = 0;
    while (c & 0x80) {
      if (q >= end) return null;
      if (++n > 7) return { type: -1, size: 0, len: 0, back: 0 };
      c = b[q++]!;
      back = (back + 1) * 128 + (c & 0x7f);
    }
  }
  return { type, size, len: q - p, back };
}

/**
 * Check `idxPath` against the pack that starts at `packOffset` of the bundle at `bundlePath`
 * (see the top of this file), copying the pack to `packOut` as it is read (when not null). Returns the facts,
 * a problem string (`packOut` may then hold part of the pack: the caller removes it), or null
 * when the index holds more objects than restore installs this way.
 */
export async function checkAndCopyPack(
  bundlePath: string,
  packOffset: number,
  idxPath: string,
  hashLen: 20 | 32,
  packOut: string | null,
): Promise<PackIndexFacts | string | null> {
  const idx = await readPackIndex(idxPath, hashLen);
  if (idx === null || typeof idx === "string") return idx;
  const { offsets } = idx;
  const n = offsets.length;
  const src = await open(bundlePath, "r");
  try {
    const packSize = (await src.stat()).size - packOffset;
    if (packSize < 12 + hashLen) return "the bundle's pack is truncated";
    const ph = await readAt(src, packOffset, 12);
    if (ph.toString("latin1", 0, 4) !== "PACK" || (ph.readUInt32BE(4) !== 2 && ph.readUInt32BE(4) !== 3)) {
      return "the bundle holds no version 2 or 3 pack";
    }
    if (ph.readUInt32BE(8) !== n) return `the pack holds ${ph.readUInt32BE(8)} objects, its index ${n}`;
    const dataEnd = packSize - hashLen;
    if (n > 0 && offsets[0] !== 12) return "the pack index's first object does not start after the pack header";
    if (n === 0 && dataEnd !== 12) return "the pack holds bytes its index does not describe";
    for (let k = 1; k < n; k++) if (offsets[k]! <= offsets[k - 1]!) return "two objects of the pack index share an offset";
    if (n > 0 && offsets[n - 1]! >= dataEnd) return "the pack index places an object past the pack's end";
    const depth = new Uint16Array(n);
    const find = (o: number): number => {
      let lo = 0;
      let hi = n - 1;
      while (lo <= hi) {
        const mid = (lo + hi) >>> 1;
        const v = offsets[mid]!;
        if (v === o) return mid;
        if (v < o) lo = mid + 1;
        else hi = mid - 1;
      }
      return -1;
    };
    const out = packOut === null ? null : await open(packOut, "wx", 0o444);
    try {
      const sum = createHash(hashLen === 20 ? "sha1" : "sha256");
      let carry = Buffer.alloc(0);
      let k = 0;
      for (let pos = 0; pos < packSize; ) {
        const chunk = await readAt(src, packOffset + pos, Math.min(BLOCK, packSize - pos));
        if (chunk.length === 0) return "the bundle's pack is truncated";
        if (out) await out.write(chunk, 0, chunk.length, pos);
        const upto = pos + chunk.length;
        sum.update(upto > dataEnd ? chunk.subarray(0, Math.max(0, chunk.length - (upto - dataEnd))) : chunk);
        // A window of the carried tail and this chunk; headers are parsed where fully inside it.
        const win = carry.length ? Buffer.concat([carry, chunk]) : chunk;
        const winStart = upto - win.length;
        const final = upto >= packSize;
        for (; k < n; k++) {
          const o = offsets[k]!;
          const end = k + 1 < n ? offsets[k + 1]! : dataEnd;
          const h = objectHeader(win, o - winStart, Math.min(win.length, end - winStart));
          if (h === null) {
            if (!final && end > upto) break; // the header runs into the next chunk
            return `the pack's object at offset ${o} has a truncated header`;
          }
          if (h.type === 7) return `the pack's object at offset ${o} is a delta by object name, which memsnap does not write`;
          if (h.type !== 1 && h.type !== 2 && h.type !== 3 && h.type !== 4 && h.type !== 6) {
            return `the pack's object at offset ${o} has an invalid type ${h.type}`;
          }
          const body = end - o - h.len;
          if (body < 1 || h.size > body * MAX_RATIO + 64) {
            return `the pack's object at offset ${o} declares ${h.size} bytes, more than its ${body} compressed bytes hold`;
          }
          if (h.type === 6) {
            const base = find(o - h.back);
            if (h.back === 0 || base < 0) return `the pack's delta at offset ${o} is against no object of the pack`;
            const d = depth[base]! + 1;
            if (d > MAX_DEPTH) return `the pack's delta chain at offset ${o} is over ${MAX_DEPTH} deep`;
            depth[k] = d;
          }
        }
        carry = Buffer.from(win.subarray(Math.max(0, win.length - 64)));
        pos = upto;
      }
      if (k !== n) return "the pack index places an object past the pack's end";
      const trailer = await readAt(src, packOffset + dataEnd, hashLen);
      if (!sum.digest().equals(trailer)) return "the pack's checksum does not match its bytes";
      if (!trailer.equals(idx.packChecksum)) return "the pack index is not the index of this pack (its pack checksum differs)";
      return { objects: n, packName: trailer.toString("hex") };
    } finally {
      await out?.close();
    }
  } finally {
    await src.close();
  }
}
