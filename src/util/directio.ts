/**
 * The native/directio addon: page-aligned memory, so the bundle sink (../snapshot/encoder.ts)
 * can write with O_DIRECT. Why: on the 2-core bench machine (ext4 on a virtio disk) writing
 * 600 MiB through the page cache and fdatasync took 0.66-0.72 s and 0.40-0.48 CPU-s of kernel
 * time (copying into the page cache, then writeback), and with O_DIRECT 0.31-0.41 s and
 * 0.05-0.07 CPU-s (`dd bs=1M count=600 conv=fdatasync` against `oflag=direct`). A snapshot is
 * CPU-bound on such a machine, so the kernel's copy competes with zstd and SHA-256.
 *
 * Linux only (O_DIRECT). Built by `npm install` / `npm ci` with node-gyp, like the pre-filter;
 * without it (no compiler, another platform) bundles are written through the page cache as
 * before. `MEMSNAP_DIRECT_IO=0` turns it off (`misaligned`, for tests, hands the sink memory that
 * O_DIRECT refuses, to exercise the fallback). Bundles are the same bytes either way.
 */
import { closeSync, constants, existsSync, openSync, write } from "node:fs";
import { createRequire } from "node:module";
import { fileURLToPath } from "node:url";

/** Where the addon is built (native/directio/build/Release), from dist/util or src/util. */
const ADDON = fileURLToPath(new URL("../../native/directio/build/Release/memsnap_directio.node", import.meta.url));

/** The addon's path when this process may write bundles with O_DIRECT (null: page cache). */
export function directIoAddon(): string | null {
  if (process.env.MEMSNAP_DIRECT_IO === "0" || process.platform !== "linux" || constants.O_DIRECT === undefined)
    return null;
  return existsSync(ADDON) ? ADDON : null;
}

/**
 * The addon's path for its memcpy (`copy`), used with shared memory whatever the O_DIRECT
 * setting (null: not built, or `MEMSNAP_NATIVE=0`: Buffer#copy).
 */
export function memoryAddon(): string | null {
  if (process.env.MEMSNAP_NATIVE === "0") return null;
  return existsSync(ADDON) ? ADDON : null;
}

/** native/directio's memcpy: `n` bytes of `src` at `srcOffset` to `dst` at `dstOffset`. */
export type NativeCopy = (dst: Uint8Array, dstOffset: number, src: Uint8Array, srcOffset: number, n: number) => void;

/**
 * The memcpy of the addon at `path` (from {@link memoryAddon}, for a worker thread), or null:
 * Buffer#copy. V8 copies into and out of a SharedArrayBuffer with relaxed atomic word stores,
 * several times slower than memcpy; a ring's hand-over is ordered by Atomics either way (see
 * native/directio/directio.c).
 */
export function nativeCopy(path: string | null): NativeCopy | null {
  if (!path) return null;
  try {
    return (createRequire(import.meta.url)(path) as { copy: NativeCopy }).copy;
  } catch {
    return null;
  }
}

/** Writes are whole blocks of this many bytes at offsets that are multiples of it. */
export const DIRECT_ALIGN = 4096;

/** Aligned memory of `size` bytes from the addon (`misaligned`: one byte off, for tests), or null. */
export function alignedBuffer(size: number): Buffer | null {
  const path = directIoAddon();
  if (path === null) return null;
  try {
    const ab = (
      createRequire(import.meta.url)(path) as { alignedBuffer(size: number, align: number): ArrayBuffer }
    ).alignedBuffer(size + 1, DIRECT_ALIGN);
    return Buffer.from(ab, process.env.MEMSNAP_DIRECT_IO === "misaligned" ? 1 : 0, size);
  } catch {
    return null; // built for another ABI: the page cache
  }
}

/**
 * A new file written front to back, from offset 0: whole blocks go out with O_DIRECT from
 * aligned buffers through a second descriptor, the tail through `fd`. Falls back to `fd` alone
 * (the same bytes) where O_DIRECT is refused: at open, or EINVAL on a write. One file at a
 * time per set of buffers.
 *
 * With two buffers, one fills while the other is written: an O_DIRECT write returns only once
 * the device has the bytes, so with one buffer the restore stood still for every write (one
 * write is in flight at a time either way). Call {@link end} to finish the file, or
 * {@link settle} when giving up on it; either waits for the write in flight, so the file's
 * descriptors may be closed after it.
 */
export class SequentialDirectWriter {
  #dfd: number | null;
  readonly #bufs: readonly Buffer[];
  #cur = 0;
  #fill = 0;
  /** File offset of the current buffer's first byte. */
  #pos = 0;
  #inflight: Promise<void> | null = null;

  constructor(
    readonly path: string,
    readonly fd: number,
    bufs: Buffer | readonly Buffer[],
  ) {
    this.#bufs = Array.isArray(bufs) ? bufs : [bufs as Buffer];
    if (
      this.#bufs.length < 1 ||
      this.#bufs.length > 2 ||
      this.#bufs.some((b) => b.length !== this.#bufs[0]!.length || b.length % DIRECT_ALIGN !== 0)
    ) {
      throw new RangeError("SequentialDirectWriter: one or two buffers of the same size, a multiple of 4096 bytes");
    }
    try {
      this.#dfd = openSync(path, constants.O_WRONLY | constants.O_DIRECT);
    } catch {
      this.#dfd = null;
    }
  }

  /** Bytes written with O_DIRECT so far (for tests). */
  direct = 0;

  async write(c: Uint8Array): Promise<void> {
    for (let off = 0; off < c.length;) {
      const buf = this.#bufs[this.#cur]!;
      const k = Math.min(buf.length - this.#fill, c.length - off);
      buf.set(c.subarray(off, off + k), this.#fill);
      this.#fill += k;
      off += k;
      if (this.#fill === buf.length) await this.#submit(false);
    }
  }

  /** Write what is left (the last partial block through the ordinary descriptor) and close the direct one. */
  async end(): Promise<void> {
    await this.#submit(true);
    await this.#inflight;
    this.close();
  }

  /** Wait for the write in flight (its error is dropped) and close the direct descriptor. */
  async settle(): Promise<void> {
    await this.#inflight?.catch(() => undefined);
    this.close();
  }

  /** Close the direct descriptor; only once no write is in flight (after {@link end} or {@link settle}). */
  close(): void {
    if (this.#dfd !== null) closeSync(this.#dfd);
    this.#dfd = null;
  }

  /**
   * Hand the current buffer's whole blocks (all of it when `final`) to a write, once the one
   * in flight is done; the partial block left over starts the other buffer.
   */
  async #submit(final: boolean): Promise<void> {
    await this.#inflight;
    this.#inflight = null;
    const buf = this.#bufs[this.#cur]!;
    const fill = this.#fill;
    const n = final || this.#dfd === null ? fill : fill - (fill % DIRECT_ALIGN);
    const write = this.#writeOut(buf, n, this.#pos);
    const next = this.#bufs[(this.#cur + 1) % this.#bufs.length]!;
    if (next === buf) {
      await write; // one buffer: its bytes must be out before it is filled again
      if (n < fill) buf.copy(buf, 0, n, fill);
    } else {
      if (n < fill) buf.copy(next, 0, n, fill);
      write.catch(() => undefined); // awaited by the next submit, end or settle
      this.#inflight = write;
      this.#cur = (this.#cur + 1) % this.#bufs.length;
    }
    this.#pos += n;
    this.#fill = fill - n;
  }

  /** Write buf[0, n) at `pos`: whole blocks with O_DIRECT while it is on, the rest through `fd`. */
  async #writeOut(buf: Buffer, n: number, pos: number): Promise<void> {
    let done = 0;
    if (this.#dfd !== null) {
      const whole = n - (n % DIRECT_ALIGN);
      if (whole > 0) {
        try {
          done = await writeP(this.#dfd, buf, 0, whole, pos);
          this.direct += done;
        } catch (e) {
          if ((e as NodeJS.ErrnoException).code !== "EINVAL") throw e;
          this.close();
        }
      }
    }
    await writeAll(this.fd, buf, done, n - done, pos + done);
  }
}

const writeP = (fd: number, buf: Buffer, off: number, len: number, pos: number): Promise<number> =>
  new Promise((res, rej) => write(fd, buf, off, len, pos, (e, n) => (e ? rej(e) : res(n))));

async function writeAll(fd: number, buf: Buffer, off: number, len: number, pos: number): Promise<void> {
  while (len > 0) {
    const n = await writeP(fd, buf, off, len, pos);
    off += n;
    pos += n;
    len -= n;
  }
}

let trim: (() => boolean) | null | undefined;

/**
 * Hand the free memory of malloc's heaps back to the kernel (glibc's malloc_trim, in the
 * addon); false when nothing was or the addon is not built. The snapshot calls it when a layer
 * is done: the workers a layer started (a SQLite scan's, a KV reader's) free their isolates
 * into malloc's arenas, which kept them resident, so the process's RSS only ever grew.
 */
export function mallocTrim(): boolean {
  if (trim === undefined) {
    const path = memoryAddon();
    try {
      trim = path
        ? ((createRequire(import.meta.url)(path) as { mallocTrim?: () => boolean }).mallocTrim ?? null)
        : null;
    } catch {
      trim = null;
    }
  }
  return trim ? trim() : false;
}
