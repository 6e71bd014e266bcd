/**
 * Reassembling chunked artifacts (format/chunked.ts) in place, in three steps:
 *
 * 1. {@link spreadStored}: the file holds the payload entry's stored ranges back to back; each is
 *    moved to where it belongs in the artifact (last first, so nothing is overwritten before it
 *    is moved) and the file is given the artifact's size. The ranges read from bases are holes.
 * 2. {@link PiecePlacer}: as each base's payload streams, the bytes of the entry at the artifact's
 *    path are written where the ranges put them, each range checked to lie inside that entry
 *    before any of its bytes is written (MEMSNAP_UNSAFE_BUNDLE); every range must be filled
 *    (MEMSNAP_INDEX_MISMATCH). The base's entries are checked against its own index as it streams.
 * 3. {@link checkAssembled}: the whole file is hashed and must be the index's size and SHA-256
 *    (MEMSNAP_ARTIFACT_HASH_MISMATCH).
 *
 * Every byte lands at a position below the artifact's size, which the index bounds; a base entry
 * is read only by the artifact at its own path, and no two ranges read the same base bytes, so a
 * bundle cannot make a restore write more than its own and its bases' payloads hold.
 */
import { createHash } from "node:crypto";
import { open, type FileHandle } from "node:fs/promises";
import { MemsnapError, destinationError } from "../errors.js";
import type { ChunkRange } from "../format/chunked.js";
import type { IndexEntry } from "../format/manifest.js";
import type { EntryHandler } from "./read-payload.js";

/** A chunked artifact and the file it is reassembled in. */
export interface ChunkedTarget {
  entry: IndexEntry & { ranges: ChunkRange[] };
  file: string;
}

const MOVE = 1 << 20;
const HINT = "the bundle or its base is damaged or was altered; nothing was restored";

/** Step 1: move the stored ranges of `t.file` into place and give it the artifact's size. */
export async function spreadStored(t: ChunkedTarget): Promise<void> {
  let fh: FileHandle;
  try {
    fh = await open(t.file, "r+");
  } catch (e) {
    throw destinationError(e, t.file);
  }
  try {
    const moves: { from: number; to: number; len: number }[] = [];
    let at = 0;
    let stored = 0;
    for (const r of t.entry.ranges) {
      if (r.length === 1) {
        if (at !== stored) moves.push({ from: stored, to: at, len: r[0] });
        stored += r[0];
      }
      at += r[0];
    }
    const buf = Buffer.allocUnsafe(Math.min(MOVE, Math.max(1, stored)));
    // Last range first, each from its end: a destination is never below its source.
    for (let i = moves.length - 1; i >= 0; i--) {
      const m = moves[i]!;
      for (let end = m.len; end > 0;) {
        const n = Math.min(buf.length, end);
        end -= n;
        const { bytesRead } = await fh.read(buf, 0, n, m.from + end);
        if (bytesRead !== n)
          throw new MemsnapError(
            "MEMSNAP_INTERNAL",
            `${t.entry.path}: its stored bytes are shorter than the index says`,
          );
        await fh.write(buf, 0, n, m.to + end);
      }
    }
    await fh.truncate(t.entry.size);
  } catch (e) {
    throw destinationError(e, t.file);
  } finally {
    await fh.close();
  }
}

/** A range read from a base: bytes [off, off+len) of its entry go to `to` in the target file. */
interface Piece {
  off: number;
  len: number;
  to: number;
}

/** Step 2: writes the base ranges of the targets as their bases' payloads stream. */
export class PiecePlacer {
  /** Base id → payload path → the target and its pieces, sorted by offset in the base entry. */
  readonly #byBase = new Map<string, Map<string, { t: ChunkedTarget; pieces: Piece[]; placed: boolean }>>();

  constructor(targets: readonly ChunkedTarget[]) {
    for (const t of targets) {
      let to = 0;
      for (const r of t.entry.ranges) {
        if (r.length === 3) {
          let m = this.#byBase.get(r[1]);
          if (!m) this.#byBase.set(r[1], (m = new Map()));
          let w = m.get(t.entry.path);
          if (!w) m.set(t.entry.path, (w = { t, pieces: [], placed: false }));
          w.pieces.push({ off: r[2], len: r[0], to });
        }
        to += r[0];
      }
    }
    for (const m of this.#byBase.values()) for (const w of m.values()) w.pieces.sort((a, b) => a.off - b.off);
  }

  /** The bases the ranges read. */
  bases(): Set<string> {
    return new Set(this.#byBase.keys());
  }

  /** Whether entry `name` of base `base` is read by a range. */
  has(base: string, name: string): boolean {
    return this.#byBase.get(base)?.has(name) === true;
  }

  /** The handler for the entries of base `base` that {@link has} names. */
  handler(base: string): EntryHandler {
    return async (info, chunks) => {
      const w = this.#byBase.get(base)?.get(info.name);
      if (!w) return;
      const last = w.pieces[w.pieces.length - 1]!;
      if (last.off + last.len > info.size) {
        throw new MemsnapError(
          "MEMSNAP_UNSAFE_BUNDLE",
          `${info.name}: a range reads bytes ${last.off}-${last.off + last.len} of base ${base}'s entry, which ` +
            `has ${info.size}`,
          {
            path: info.name,
            hint: HINT,
          },
        );
      }
      let fh: FileHandle;
      try {
        fh = await open(w.t.file, "r+");
      } catch (e) {
        throw destinationError(e, w.t.file);
      }
      try {
        let pos = 0;
        let i = 0;
        for await (const c of chunks) {
          const end = pos + c.length;
          // Pieces are sorted and disjoint: those before this chunk are done.
          while (i < w.pieces.length && w.pieces[i]!.off + w.pieces[i]!.len <= pos) i++;
          for (let k = i; k < w.pieces.length && w.pieces[k]!.off < end; k++) {
            const p = w.pieces[k]!;
            const from = Math.max(p.off, pos);
            const to = Math.min(p.off + p.len, end);
            await fh.write(c, from - pos, to - from, p.to + (from - p.off));
          }
          pos = end;
          if (i >= w.pieces.length) break; // the rest of the entry is hashed by the reader, not needed here
        }
        if (pos < last.off + last.len)
          throw new MemsnapError(
            "MEMSNAP_ARTIFACT_HASH_MISMATCH",
            `${info.name}: base ${base}'s entry ended before the ranges read from it`,
            { path: info.name, hint: HINT },
          );
      } catch (e) {
        if (e instanceof MemsnapError) throw e;
        throw destinationError(e, w.t.file);
      } finally {
        await fh.close();
      }
      w.placed = true;
    };
  }

  /** Every range was filled from its base (MEMSNAP_INDEX_MISMATCH otherwise); only the bases in `read`, when given. */
  finish(read?: ReadonlySet<string>): void {
    for (const [base, m] of this.#byBase) {
      if (read && !read.has(base)) continue;
      for (const [path, w] of m) {
        if (!w.placed) {
          throw new MemsnapError(
            "MEMSNAP_INDEX_MISMATCH",
            `${path} reads bytes from base ${base}, which does not hold it`,
            { path, hint: HINT },
          );
        }
      }
    }
  }
}

/** Step 3: the file's bytes are the artifact's (size and SHA-256); returns the digest. */
export async function checkAssembled(t: ChunkedTarget, onBytes?: (c: Buffer) => void): Promise<Buffer> {
  const h = createHash("sha256");
  let n = 0;
  let fh: FileHandle;
  try {
    fh = await open(t.file, "r");
  } catch (e) {
    throw destinationError(e, t.file);
  }
  try {
    const buf = Buffer.allocUnsafe(MOVE);
    for (;;) {
      const { bytesRead } = await fh.read(buf, 0, buf.length, n);
      if (bytesRead === 0) break;
      const c = buf.subarray(0, bytesRead);
      h.update(c);
      onBytes?.(c);
      n += bytesRead;
    }
  } finally {
    await fh.close();
  }
  const d = h.digest();
  if (n !== t.entry.size || d.toString("hex") !== t.entry.sha256) {
    throw new MemsnapError(
      "MEMSNAP_ARTIFACT_HASH_MISMATCH",
      `${t.entry.path}: reassembled from its ranges, its bytes differ from the index`,
      {
        path: t.entry.path,
        hint: HINT,
      },
    );
  }
  return d;
}

/** Read a reassembled file back as chunks (a deep check of a chunked artifact). */
export async function* fileChunks(file: string): AsyncGenerator<Buffer> {
  const fh = await open(file, "r");
  try {
    for (let pos = 0; ;) {
      const buf = Buffer.allocUnsafe(MOVE);
      const { bytesRead } = await fh.read(buf, 0, buf.length, pos);
      if (bytesRead === 0) return;
      pos += bytesRead;
      yield buf.subarray(0, bytesRead);
    }
  } finally {
    await fh.close();
  }
}
