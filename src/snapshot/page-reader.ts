/**
 * An artifact's pages read and hashed off the main thread, for the `pages` chunking of an
 * incremental snapshot (./chunking.ts).
 *
 * A chunked SQLite database costs two SHA-256 passes over the whole file: the artifact's own
 * hash (the index entry's `sha256`, which a restore checks) and one per page (the table an
 * unchanged page is matched by). On the main thread, with a Hash object per page, that was most
 * of an incremental snapshot of a 255 MiB database after one row was inserted: 0.73-0.9 s of the
 * main thread's ~1 s (Intel Xeon, 2 cores, SHA extensions: yes; scripts/bench-incremental.mjs),
 * while quick_check ran beside it in the SQLite worker. Here an artifact that offers its open
 * descriptor (Artifact.descriptor: a live read, whose file cannot change under its read
 * transaction) is read block by block by the native addon's `readHash` (native/aead) on the
 * libuv pool, which hashes each page there as it reads it; the main thread only hashes the
 * whole artifact, on bytes it did not read itself. The file is read once, as before.
 *
 * readHash writes no digest for an all-zero tile (it sets `zero`): such a page gets the hash of
 * a zero page of its length, computed here once.
 */
import { createHash } from "node:crypto";
import { aeadAddon, readHashError } from "../codecs/aead.js";
import { sourceChanged, sourceError } from "../errors.js";
import type { Artifact } from "../sources/types.js";

/** Bytes per read (rounded down to whole pages, at least one). */
const BLOCK = 1 << 20;
/** Reads in flight on the pool ahead of the consumer. */
const DEPTH = 3;

/** One block of pages: its bytes, and each page's SHA-256 (first 16 bytes) at `hashes[16 * k]`. */
export interface PageBlock {
  /** Valid until the next block is asked for. */
  bytes: Buffer;
  /** Pages in the block (the last one of the artifact may be short). */
  count: number;
  pageSize: number;
  hashes: Buffer;
}

interface Slot {
  bytes: Buffer;
  lens: Uint32Array;
  zero: Uint8Array;
  digests: Buffer;
  hashes: Buffer;
}

const zeroHashes = new Map<number, Buffer>();
function zeroHash(len: number): Buffer {
  let h = zeroHashes.get(len);
  if (!h) zeroHashes.set(len, (h = createHash("sha256").update(Buffer.alloc(len)).digest().subarray(0, 16)));
  return h;
}

/**
 * The pages of `a` (of `pageSize` bytes, the last one short when its size is not a multiple)
 * read through its descriptor with their hashes, or null when it has none or the addon is not
 * there (the caller then reads `a.open()` and hashes the pages itself). Exactly `a.size` bytes
 * are read: a file that shrank fails with MEMSNAP_SOURCE_CHANGED, one that grew is the
 * artifact's check() to catch (Artifact.descriptor). Run it to its end or close it.
 */
export function pageBlocks(a: Artifact, pageSize: number): AsyncGenerator<PageBlock> | null {
  const d = a.descriptor;
  const readHash = d ? aeadAddon()?.readHash : undefined;
  if (!d || typeof readHash !== "function" || !(pageSize > 0)) return null;
  return blocks(a.size, pageSize, d.fd, d.path, readHash);
}

type ReadHash = NonNullable<NonNullable<ReturnType<typeof aeadAddon>>["readHash"]>;

async function* blocks(
  size: number,
  pageSize: number,
  fd: number,
  path: string,
  readHash: ReadHash,
): AsyncGenerator<PageBlock> {
  const per = Math.max(1, Math.floor(BLOCK / pageSize));
  // DEPTH reads in flight and the block the consumer holds.
  const slots: Slot[] = [];
  for (let k = 0; k <= DEPTH; k++) {
    slots.push({
      bytes: Buffer.allocUnsafe(per * pageSize),
      lens: new Uint32Array(per),
      zero: new Uint8Array(per),
      digests: Buffer.allocUnsafe(32 * per),
      hashes: Buffer.allocUnsafe(16 * per),
    });
  }
  let next = 0; // the next byte to read
  let seq = 0;
  const inflight: Promise<PageBlock>[] = [];
  const read = (at: number, s: Slot): Promise<PageBlock> => {
    const len = Math.min(per * pageSize, size - at);
    const count = Math.ceil(len / pageSize);
    for (let k = 0; k < count; k++) s.lens[k] = Math.min(pageSize, len - k * pageSize);
    return new Promise<PageBlock>((res, rej) => {
      readHash(fd, at, s.bytes, s.lens, count, s.digests, s.zero, (errno, got) => {
        if (errno) return rej(sourceError(readHashError(errno, path), path));
        if (got < len) return rej(sourceChanged(path, `it ends at ${at + got} bytes, shorter than its ${size}`));
        for (let k = 0; k < count; k++) {
          if (s.zero[k]) zeroHash(s.lens[k]!).copy(s.hashes, 16 * k);
          else s.digests.copy(s.hashes, 16 * k, 32 * k, 32 * k + 16);
        }
        res({ bytes: s.bytes.subarray(0, len), count, pageSize, hashes: s.hashes });
      });
    });
  };
  const fill = (): void => {
    while (inflight.length < DEPTH && next < size) {
      const p = read(next, slots[seq++ % slots.length]!);
      p.catch(() => undefined); // awaited in order below
      inflight.push(p);
      next = Math.min(size, next + per * pageSize);
    }
  };
  try {
    fill();
    while (inflight.length) {
      const b = await inflight.shift()!;
      fill(); // into the slots after this one's: it stays the consumer's until the next call
      yield b;
    }
  } finally {
    // A read in flight still writes its slot and reads the descriptor: let it finish first.
    await Promise.allSettled(inflight);
  }
}
