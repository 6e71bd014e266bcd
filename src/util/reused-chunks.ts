/**
 * Reading a file in chunks that live in two reused buffers.
 *
 * `createReadStream` allocates a fresh buffer for every read, and a fresh 1 MiB buffer is
 * fresh memory: the kernel copies the file's bytes into pages it must first fault in and
 * clear. Measured here reading a 551 MB file from the page cache in 1 MiB reads: 100-190 ms
 * with a new buffer per read, 40-50 ms into a reused one. The snapshot pipeline reads every
 * file and database it packs once, so it reads them through {@link reusedChunks}.
 *
 * The contract that buys this: a chunk is valid only until the consumer asks for the next
 * one (the buffer is then filled again). The next read is issued before a chunk is yielded,
 * into the other buffer, so the disk and the consumer overlap as with a stream.
 */
import type { FileHandle } from "node:fs/promises";

/** Bytes per read. */
export const REUSED_CHUNK = 1 << 20;

/**
 * The bytes of `fh` from `start` to `end` inclusive (as `createReadStream` counts), or to the
 * end of the file if it is shorter, in chunks of at most `chunk` bytes. Each chunk is
 * overwritten once the next is asked for; a consumer that keeps bytes must copy them.
 */
export async function* reusedChunks(
  fh: FileHandle,
  start: number,
  end: number,
  chunk = REUSED_CHUNK,
): AsyncGenerator<Buffer, void, undefined> {
  const limit = end + 1;
  // A file smaller than a chunk needs one small buffer; bigger ones take two full ones from the pool.
  const small = limit - start <= chunk;
  const bufs = small ? [Buffer.allocUnsafe(Math.max(0, limit - start))] : [take(chunk), take(chunk)];
  let pos = start;
  let eof = false;
  const readInto = (i: number): Promise<Buffer> | null => {
    const n = Math.min(chunk, limit - pos);
    if (eof || n <= 0) return null;
    const at = pos;
    pos += n;
    const buf = bufs[i]!;
    const p = fh.read(buf, 0, n, at).then(({ bytesRead }) => {
      if (bytesRead < n) eof = true; // a short read of a regular file is its end
      return buf.subarray(0, bytesRead);
    });
    p.catch(() => undefined); // awaited below; a consumer that stops early must not leave it unhandled
    return p;
  };
  let i = 0;
  let pending = readInto(0);
  try {
    while (pending) {
      const got = await pending;
      pending = null;
      if (got.length === 0) return;
      pending = readInto(i ^ 1); // small: null, its one read covered the range
      yield got;
      i ^= 1;
    }
  } finally {
    // A read still in flight (the consumer stopped early) finishes before the caller may close
    // fh, and before its buffer can go back to the pool.
    if (pending) await pending.catch(() => undefined);
    if (!small) for (const b of bufs) give(b);
  }
}

// Full-size buffers of finished readers, for the next (artifacts are packed one after another,
// so two are in use at a time; a few are kept for concurrent snapshots in one process).
const pool: Buffer[] = [];
const POOL_MAX = 4;

function take(size: number): Buffer {
  const i = pool.findIndex((b) => b.length === size);
  return i >= 0 ? pool.splice(i, 1)[0]! : Buffer.allocUnsafeSlow(size);
}

function give(b: Buffer): void {
  if (pool.length < POOL_MAX) pool.push(b);
}
