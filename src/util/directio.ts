/**
 * The native/directio addon: page-aligned memory, so the bundle sink (../pipeline/encoder.ts)
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
  if (process.env.MEMSNAP_DIRECT_IO === "0" || process.platform !== "linux" || constants.O_DIRECT === undefined) return null;
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

/** Writes are whole blocks of this many bytes at offsets that are multiples of it. */
export const DIRECT_ALIGN = 4096;

/** Aligned memory of `size` bytes from the addon (`misaligned`: one byte off, for tests), or null. */
export function alignedBuffer(size: number): Buffer | null {
  const path = directIoAddon();
  if (path === null) return null;
  try {
    const ab = (createRequire(import.meta.url)(path) as { alignedBuffer(size: number, align: number): ArrayBuffer }).alignedBuffer(size + 1, DIRECT_ALIGN);
    return Buffer.from(ab, process.env.MEMSNAP_DIRECT_IO === "misaligned" ? 1 : 0, size);
  } catch {
    return null; // built for another ABI: the page cache
  }
}

/**
 * A new file written front to back, from offset 0: whole blocks go out with O_DIRECT from the
 * aligned `buf` through a second descriptor, the tail through `fd`. Falls back to `fd` alone
 * (the same bytes) where O_DIRECT is refused: at open, or EINVAL on a write. One file at a
 * time per buffer; {@link close} before the file's own descriptor is closed.
 */
export class SequentialDirectWriter {
  #dfd: number | null;
  #fill = 0;
  #pos = 0;

  constructor(readonly path: string, readonly fd: number, readonly buf: Buffer) {
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
      const k = Math.min(this.buf.length - this.#fill, c.length - off);
      this.buf.set(c.subarray(off, off + k), this.#fill);
      this.#fill += k;
      off += k;
      if (this.#fill === this.buf.length) await this.#flush(false);
    }
  }

  /** Write what is left (the last partial block through the ordinary descriptor) and close the direct one. */
  async end(): Promise<void> {
    await this.#flush(true);
    this.close();
  }

  close(): void {
    if (this.#dfd !== null) closeSync(this.#dfd);
    this.#dfd = null;
  }

  async #flush(final: boolean): Promise<void> {
    let n = this.#fill;
    let done = 0;
    if (this.#dfd !== null) {
      n = this.#fill - (this.#fill % DIRECT_ALIGN);
      if (n > 0) {
        try {
          done = await writeP(this.#dfd, this.buf, 0, n, this.#pos);
          this.direct += done;
        } catch (e) {
          if ((e as NodeJS.ErrnoException).code !== "EINVAL") throw e;
          this.close();
        }
      }
      if (final || this.#dfd === null) n = this.#fill;
    }
    await writeAll(this.fd, this.buf, done, n - done, this.#pos + done);
    if (n < this.#fill) this.buf.copy(this.buf, 0, n, this.#fill);
    this.#pos += n;
    this.#fill -= n;
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
