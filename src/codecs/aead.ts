/**
 * The native/aead addon: age STREAM chunks sealed and opened into caller buffers with the
 * ChaCha20-Poly1305 of Node's own OpenSSL (see native/aead/aead.c).
 *
 * node:crypto needs a cipher object per 64 KiB chunk and returns fresh output buffers, which
 * were then copied again: measured on the bench machine, 8,400 chunks (525 MiB) took 530-580 ms
 * that way and 161 ms through the addon, and the bundle sink's page faults on fresh buffers
 * (~0.13 CPU-s of kernel time per scale-1 snapshot) went away. The bytes are the same: age
 * STREAM is deterministic given the key, counter and flag, and tests compare both paths and
 * decrypt with the `age` CLI.
 *
 * Optional, built by `npm install` / `npm ci` like the other addons; without it (no compiler,
 * Node headers without OpenSSL's) node:crypto does the work. `MEMSNAP_NATIVE=0` turns it off.
 */
import { existsSync } from "node:fs";
import { createRequire } from "node:module";
import { fileURLToPath } from "node:url";
import { getSystemErrorName } from "node:util";

/** Where the addon is built (native/aead/build/Release), from dist/util or src/util. */
const ADDON = fileURLToPath(new URL("../../native/aead/build/Release/memsnap_aead.node", import.meta.url));

export interface AeadAddon {
  /**
   * Seal `length` bytes of `src` (≤ 64 KiB) as age chunk `counter`; writes ciphertext and tag at `dst[dstOffset]`,
   * returns `length + 16`.
   */
  seal(
    key: Uint8Array,
    counter: number,
    last: boolean,
    src: Uint8Array,
    srcOffset: number,
    length: number,
    dst: Uint8Array,
    dstOffset: number,
  ): number;
  /**
   * Open a sealed chunk of `sealedLength` bytes into `dst`; returns the plaintext length, or -1 when it does not
   * authenticate.
   */
  open(
    key: Uint8Array,
    counter: number,
    last: boolean,
    src: Uint8Array,
    srcOffset: number,
    sealedLength: number,
    dst: Uint8Array,
    dstOffset: number,
  ): number;
  /**
   * On a libuv pool thread: read the `count` tiles of `lens[k]` bytes each at `position` of
   * `fd` into `buf`, then per tile set `zero[k]` (1: all zero bytes) or write its SHA-256 at
   * `digests[32 * k]`. `callback(errno, bytesRead)`: errno 0 or the read's; a short bytesRead
   * (end of file) or an errno means nothing was hashed. Leave the buffers alone until then.
   */
  readHash?(
    fd: number,
    position: number,
    buf: Uint8Array,
    lens: Uint32Array,
    count: number,
    digests: Uint8Array,
    zero: Uint8Array,
    callback: (errno: number, bytesRead: number) => void,
  ): void;
  /**
   * On a libuv pool thread: read `length` bytes of `fd` at `position` (1 MiB at a time, into
   * the addon's own buffer) and hash them: with `pageSize` > 0, the first 16 bytes of each
   * page's SHA-256 at `out[16 * i]` (the last page may be short); with `pageSize` 0, the SHA-256
   * of the whole range at `out[0..32)`. `callback(errno, bytesRead)` as readHash's: a short
   * bytesRead or an errno means `out` holds nothing to use. Leave `out` alone until then.
   */
  hashRange?(
    fd: number,
    position: number,
    length: number,
    pageSize: number,
    out: Uint8Array,
    callback: (errno: number, bytesRead: number) => void,
  ): void;
}

/** The addon's path (null: not built, or `MEMSNAP_NATIVE=0`), for worker threads to load. */
export function aeadAddonPath(): string | null {
  if (process.env.MEMSNAP_NATIVE === "0") return null;
  return existsSync(ADDON) ? ADDON : null;
}

/** The addon at `path` (from {@link aeadAddonPath}, in a worker thread), or null (none, or built for another ABI). */
export function loadAead(path: string | null): AeadAddon | null {
  if (!path) return null;
  try {
    return createRequire(import.meta.url)(path) as AeadAddon;
  } catch {
    return null;
  }
}

/** The addon in this thread, or null. */
export function aeadAddon(): AeadAddon | null {
  const path = aeadAddonPath();
  if (path === null) return null;
  try {
    return createRequire(import.meta.url)(path) as AeadAddon;
  } catch {
    return null;
  }
}

/** The error of a failed native `readHash` (it reports a negative errno), shaped as `node:fs` shapes its own. */
export function readHashError(errno: number, path: string): NodeJS.ErrnoException {
  let code: string;
  try {
    code = getSystemErrorName(-errno);
  } catch {
    code = `errno ${errno}`;
  }
  const e = new Error(`${code}: read failed, read '${path}'`) as NodeJS.ErrnoException;
  e.code = code;
  e.errno = -errno;
  return e;
}
