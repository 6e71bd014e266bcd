/**
 * The KV source's reads: the pages of every data file, in blocks of whole tiles (up to
 * {@link READ_BLOCK} bytes), read ahead of the block being packed and across file boundaries.
 *
 * With the native addon (native/aead `readHash`), each block is read and its pages hashed
 * (SHA-256 of Node's OpenSSL, or found all zero) on libuv's thread pool, two blocks at a time.
 * The main thread used to hash every page itself: ~245 ms of a scale-1 snapshot's main thread
 * for 535 MiB of pages, and in an incremental snapshot, which packs few of them, the other core
 * sat idle meanwhile. Without the addon (not built, or `MEMSNAP_NATIVE=0`) blocks are read one
 * ahead with fs reads and the caller hashes the pages, as before.
 *
 * Buffers: blocks rotate through `depth + 2` slots (8 MiB with the addon), so the block being packed and the one
 * before it stay intact while the next `depth` are read (a consumer of the KV source packs,
 * that is copies, an artifact before it asks for the next one; one block back is slack). The
 * slots are allocated once per capture and shared by all data files: fresh buffers per
 * block fragmented the heap (+25 MiB peak RSS measured on the bench's KV layer).
 */
import type { FileHandle } from "node:fs/promises";
import { open } from "node:fs/promises";
import { aeadAddon, readHashError } from "../../codecs/aead.js";
import { sourceChanged, sourceError } from "../walk.js";

/**
 * Bytes read at a time (whole tiles; a tile bigger than this is read alone). 2 MiB: the four
 * slots then hold what the two 4 MiB buffers of the reader before them held (at scale 10 the
 * incremental snapshot's peak RSS is within a few MiB of the 200 MiB bound), and a block still
 * costs the main thread one ~20 µs call.
 */
export const READ_BLOCK = 2 * 1024 * 1024;

/** A data file's tiles, as the reader needs them: contiguous pages in offset order. */
export interface BlockFile {
  abs: string;
  stats: { size: number };
  tiles: { readonly length: number; offset(i: number): number; len(i: number): number };
}

/** One block: whole tiles `[first, end)` of data file `file`. */
export interface ReadBlock {
  /** Index of the data file in the list given to {@link readBlocks}. */
  file: number;
  first: number;
  end: number;
  /** The tiles' bytes, contiguous. Valid until the block after the next one is taken. */
  bytes: Buffer;
  /**
   * With the addon: per tile (index `i - first`) 1 when all its bytes are zero, else 0 and its
   * binary SHA-256 at `digests[32 * k]`. Null without the addon (the caller hashes).
   */
  zero: Uint8Array | null;
  digests: Buffer | null;
}

interface Slot {
  bytes: Buffer;
  lens: Uint32Array;
  zero: Uint8Array;
  digests: Buffer;
}

interface Planned {
  file: number;
  first: number;
  end: number;
  start: number;
  len: number;
  /** The last block of its file: the file is closed once it is read. */
  last: boolean;
}

/** The blocks of every file, in order. */
function* plan(files: readonly BlockFile[]): Generator<Planned> {
  for (let file = 0; file < files.length; file++) {
    const t = files[file]!.tiles;
    let i = 0;
    while (i < t.length) {
      let j = i;
      let len = 0;
      while (j < t.length && (j === i || len + t.len(j) <= READ_BLOCK)) len += t.len(j++);
      yield { file, first: i, end: j, start: t.offset(i), len, last: j === t.length };
      i = j;
    }
  }
}

type ReadHash = NonNullable<NonNullable<ReturnType<typeof aeadAddon>>["readHash"]>;

/**
 * Read the data files' tiles block by block, ahead of the consumer. The generator must be run
 * to its end or closed (`return()`): it waits for the reads in flight, then closes the files.
 * A file is closed when the consumer takes its last block: the reads in flight may finish out
 * of order on the thread pool, and closing when the last read finished closed the descriptor
 * under an earlier block's read still queued (a snapshot failed now and then with EBADF).
 * `hooks.readHash` replaces the addon's (tests, to reorder the reads).
 */
export async function* readBlocks(
  files: readonly BlockFile[],
  signal?: AbortSignal,
  hooks: { readHash?: ReadHash } = {},
): AsyncGenerator<ReadBlock> {
  const addon = aeadAddon();
  const readHash =
    hooks.readHash ?? (addon && typeof addon.readHash === "function" ? addon.readHash.bind(addon) : null);
  const depth = readHash ? 2 : 1;
  const slots: Slot[] = [];
  let seq = 0;
  const handles = new Map<number, Promise<FileHandle>>();
  const inflight: Promise<{ block: ReadBlock; last: boolean }>[] = [];
  const blocks = plan(files);

  const slotFor = (tiles: number, len: number): Slot => {
    const k = seq++ % (depth + 2);
    let s = slots[k];
    if (!s) {
      slots[k] = s = {
        bytes: Buffer.alloc(0),
        lens: new Uint32Array(0),
        zero: new Uint8Array(0),
        digests: Buffer.alloc(0),
      };
    }
    if (s.bytes.length < len) s.bytes = Buffer.allocUnsafe(Math.max(len, READ_BLOCK));
    if (readHash && s.lens.length < tiles) {
      const n = Math.max(tiles, 64);
      s.lens = new Uint32Array(n);
      s.zero = new Uint8Array(n);
      s.digests = Buffer.allocUnsafe(32 * n);
    }
    return s;
  };

  const handle = (file: number): Promise<FileHandle> => {
    let h = handles.get(file);
    if (!h) {
      const abs = files[file]!.abs;
      h = open(abs, "r").catch((e: unknown) => {
        if ((e as NodeJS.ErrnoException).code === "ENOENT") throw sourceChanged(abs, "it was removed");
        throw sourceError(e, abs);
      });
      h.catch(() => undefined);
      handles.set(file, h);
    }
    return h;
  };

  const close = async (file: number): Promise<void> => {
    const h = handles.get(file);
    handles.delete(file);
    await h?.then((fh) => fh.close()).catch(() => undefined);
  };

  const read = async (b: Planned, s: Slot): Promise<{ block: ReadBlock; last: boolean }> => {
    const f = files[b.file]!;
    const fh = await handle(b.file);
    const bytes = s.bytes.subarray(0, b.len);
    let got = 0;
    if (readHash) {
      const n = b.end - b.first;
      for (let k = 0; k < n; k++) s.lens[k] = f.tiles.len(b.first + k);
      got = await new Promise<number>((res, rej) => {
        readHash(fh.fd, b.start, bytes, s.lens, n, s.digests, s.zero, (errno, bytesRead) => {
          if (errno) rej(sourceError(readHashError(errno, f.abs), f.abs));
          else res(bytesRead);
        });
      });
    } else {
      while (got < b.len) {
        const r = await fh.read(bytes, got, b.len - got, b.start + got).catch((e: unknown) => {
          throw sourceError(e, f.abs);
        });
        if (r.bytesRead === 0) break;
        got += r.bytesRead;
      }
    }
    if (got < b.len) throw sourceChanged(f.abs, `it ends at ${b.start + got} bytes, shorter than its ${f.stats.size}`);
    return {
      block: {
        file: b.file,
        first: b.first,
        end: b.end,
        bytes,
        zero: readHash ? s.zero : null,
        digests: readHash ? s.digests : null,
      },
      last: b.last,
    };
  };

  const fill = (): void => {
    while (inflight.length < depth) {
      const n = blocks.next();
      if (n.done) return;
      const p = read(n.value, slotFor(n.value.end - n.value.first, n.value.len));
      p.catch(() => undefined); // awaited in order below
      inflight.push(p);
    }
  };

  try {
    fill();
    while (inflight.length) {
      signal?.throwIfAborted();
      const { block, last } = await inflight.shift()!;
      if (last) await close(block.file); // its earlier blocks were taken before it: no read of it is left
      fill();
      yield block;
    }
  } finally {
    // A read in flight still uses its file descriptor (and slot): let it finish before closing.
    await Promise.allSettled(inflight);
    for (const file of [...handles.keys()]) await close(file);
  }
}
