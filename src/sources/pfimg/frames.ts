/**
 * "Decompress one zstd frame and hash what comes out" in two flavours: synchronous for small
 * frames (a few MiB at most, so the main thread is never held long), whether or not the frame
 * declares its content size, and through the zstd worker stream for everything else.
 */
import { createHash } from "node:crypto";
import { once } from "node:events";
import { createRequire } from "node:module";
import { createZstdDecompressor } from "../../codecs/zstd.js";
import { sha256Hex } from "./format.js";

interface DCtx {
  decompress(dst: Uint8Array, src: Uint8Array): number;
  decompressStream(dst: Uint8Array, src: Uint8Array): [number, number, number];
  setParameter(param: number, value: number): void;
  reset(directive: number): void;
}
interface ZstdBinding {
  DCtx: new () => DCtx;
  DParameter: { windowLogMax: number };
  ResetDirective: { sessionOnly: number };
  getFrameContentSize(frame: Uint8Array): number | null;
  compress(dst: Uint8Array, src: Uint8Array, level: number): number;
  compressBound(n: number): number;
}
let bindingCache: ZstdBinding | undefined;
/** zstd-napi's native binding (small synchronous frames only). */
export function zstdBinding(): ZstdBinding {
  bindingCache ??= createRequire(import.meta.url)("zstd-napi/binding") as ZstdBinding;
  return bindingCache;
}

/** Compress a small buffer synchronously (sampling, tests). */
export function zstdCompressSync(src: Uint8Array, level: number): Buffer {
  const b = zstdBinding();
  const dst = Buffer.allocUnsafe(b.compressBound(src.length));
  const n = b.compress(dst, src, level);
  return dst.subarray(0, n);
}

/**
 * Frames at most this big (compressed) with a declared content size at most {@link SYNC_MAX_CONTENT}
 * decompress synchronously.
 */
export const SYNC_MAX_COMPRESSED = 1024 * 1024;
export const SYNC_MAX_CONTENT = 8 * 1024 * 1024;

/**
 * The decompressed bytes of a small single frame, or null when it is not small or the quick path fails (then use
 * the worker).
 */
export function tryDecompressSmall(frame: Buffer, maxOutput?: number): Buffer | null {
  if (frame.length > SYNC_MAX_COMPRESSED) return null;
  const b = zstdBinding();
  let n: number | null;
  try {
    n = b.getFrameContentSize(frame);
  } catch {
    return null;
  }
  if (n === null || n > SYNC_MAX_CONTENT || (maxOutput !== undefined && n > maxOutput)) return null;
  try {
    const out = Buffer.allocUnsafe(n);
    const got = new b.DCtx().decompress(out, frame);
    return got === n ? out : null;
  } catch {
    return null;
  }
}

/** Output of the in-thread streaming path is produced this many bytes at a time. */
const STREAM_SCRATCH = 256 * 1024;
/**
 * The in-thread streaming path refuses frames whose window is over 2^23 bytes (8 MiB: zstd -19's): it never
 * produces more than SYNC_MAX_CONTENT, and a hostile header must not make it allocate a big window.
 */
const STREAM_WINDOW_LOG_MAX = 23;
let streamCtx: DCtx | undefined;
let scratch: Buffer | undefined;

/**
 * The decompressed bytes of a small zstd stream whose frames need not declare their content size
 * (streaming compressors leave it out), in chunks; null when it is not small, or anything about it
 * is wrong (then use the worker, which says what). Streams in the calling thread through one
 * reused context: a worker per such frame cost ~65 ms of CPU, ten times the frame's own work.
 * Bounds: at most SYNC_MAX_CONTENT bytes and `maxOutput` are produced (one more byte to tell), with
 * a window of at most 2^{@link STREAM_WINDOW_LOG_MAX}, before it gives up.
 */
export function tryDecompressStreamSmall(frame: Buffer, maxOutput?: number): Buffer[] | null {
  if (frame.length === 0 || frame.length > SYNC_MAX_COMPRESSED) return null;
  const b = zstdBinding();
  if (!streamCtx) {
    streamCtx = new b.DCtx();
    streamCtx.setParameter(b.DParameter.windowLogMax, STREAM_WINDOW_LOG_MAX);
  }
  const d = streamCtx;
  const out = (scratch ??= Buffer.allocUnsafeSlow(STREAM_SCRATCH));
  const cap = Math.min(SYNC_MAX_CONTENT, maxOutput ?? SYNC_MAX_CONTENT);
  const parts: Buffer[] = [];
  let total = 0;
  let pos = 0;
  // As the worker does: the frame is complete when the last call that moved data returned 0.
  let lastRet = -1;
  try {
    for (;;) {
      const room = Math.min(out.length, cap - total + 1);
      const [ret, written, read] = d.decompressStream(out.subarray(0, room), frame.subarray(pos));
      if (written === 0 && read === 0) return null; // no progress: not a stream zstd can finish
      lastRet = ret;
      pos += read;
      total += written;
      if (total > cap) return null;
      if (written > 0) parts.push(Buffer.from(out.subarray(0, written)));
      if (pos === frame.length && (written < room || ret === 0)) break;
    }
  } catch {
    return null;
  } finally {
    d.reset(b.ResetDirective.sessionOnly);
  }
  return lastRet === 0 ? parts : null;
}

/** What a verified frame decompressed to. */
export interface FrameDigest {
  hex: string;
  size: number;
  /** True when every decompressed byte is zero. */
  zero: boolean;
}

function allZero(b: Uint8Array): boolean {
  // Compare 4 bytes at a time where aligned.
  const n4 = b.byteOffset % 4 === 0 ? b.length >>> 2 : 0;
  if (n4 > 0) {
    const w = new Uint32Array(b.buffer, b.byteOffset, n4);
    for (let i = 0; i < n4; i++) if (w[i] !== 0) return false;
  }
  for (let i = n4 << 2; i < b.length; i++) if (b[i] !== 0) return false;
  return true;
}
export { allZero as isAllZero };

/**
 * Decompress one zstd stream fed chunk by chunk and hash what comes out. Frames that end
 * up small are decompressed synchronously; bigger ones go through the zstd worker (fed as
 * they arrive, with back-pressure), so the main thread is never held on big data.
 * `onData` sees the decompressed bytes (text scanning). Errors (corrupt or truncated zstd,
 * more than `maxOutput` bytes) reject `push`/`end` with MEMSNAP_PAYLOAD_CORRUPT.
 */
export class FrameHasher {
  readonly #max: number | undefined;
  readonly #onData: ((b: Buffer) => void | Promise<void>) | undefined;
  #buffered: Buffer[] = [];
  #bufferedLen = 0;
  #hash = createHash("sha256");
  #size = 0;
  #zero = true;
  #dec: ReturnType<typeof createZstdDecompressor> | null = null;
  #consumed: Promise<void> | null = null;
  #err: unknown = null;

  constructor(opts: { maxOutput?: number; onData?: (b: Buffer) => void | Promise<void> } = {}) {
    this.#max = opts.maxOutput;
    this.#onData = opts.onData;
  }

  async #take(c: Buffer): Promise<void> {
    this.#hash.update(c);
    this.#size += c.length;
    if (this.#zero && !allZero(c)) this.#zero = false;
    if (this.#onData) await this.#onData(c);
  }

  #startWorker(): void {
    const dec = createZstdDecompressor(this.#max !== undefined ? { maxOutputBytes: this.#max } : {});
    this.#dec = dec;
    this.#consumed = (async () => {
      for await (const c of dec) await this.#take(c as Buffer);
    })().catch((e: unknown) => {
      this.#err = e;
      dec.destroy();
    });
  }

  async #write(c: Buffer): Promise<void> {
    const dec = this.#dec!;
    if (this.#err) throw this.#err;
    if (!dec.write(c)) await Promise.race([once(dec, "drain").catch(() => undefined), this.#consumed]);
    if (this.#err) throw this.#err;
  }

  async push(c: Buffer): Promise<void> {
    if (this.#dec === null) {
      this.#buffered.push(c);
      this.#bufferedLen += c.length;
      if (this.#bufferedLen <= SYNC_MAX_COMPRESSED) return;
      this.#startWorker();
      const held = this.#buffered;
      this.#buffered = [];
      for (const b of held) await this.#write(b);
      return;
    }
    await this.#write(c);
  }

  async end(): Promise<FrameDigest> {
    if (this.#dec === null) {
      const frame = this.#buffered.length === 1 ? this.#buffered[0]! : Buffer.concat(this.#buffered);
      const small = tryDecompressSmall(frame, this.#max);
      if (small) {
        await this.#take(small);
        return this.#digest();
      }
      const parts = tryDecompressStreamSmall(frame, this.#max);
      if (parts) {
        for (const p of parts) await this.#take(p);
        return this.#digest();
      }
      this.#startWorker();
      this.#buffered = [];
      if (frame.length) await this.#write(frame);
    }
    const dec = this.#dec!;
    dec.end();
    await this.#consumed;
    if (this.#err) throw this.#err;
    return this.#digest();
  }

  #digest(): FrameDigest {
    return { hex: this.#hash.digest("hex"), size: this.#size, zero: this.#zero };
  }

  /** Stop early (the artifact's consumer went away). */
  abort(): void {
    this.#dec?.destroy();
  }
}

/** Decompress and hash a whole zstd stream given as chunks. */
export async function hashFrameChunks(
  chunks: AsyncIterable<Buffer>,
  opts: { maxOutput?: number; onData?: (b: Buffer) => void | Promise<void> } = {},
): Promise<FrameDigest> {
  const h = new FrameHasher(opts);
  try {
    for await (const c of chunks) await h.push(c);
    return await h.end();
  } catch (e) {
    h.abort();
    throw e;
  }
}

/** Decompress a zstd stream into one buffer (structural JSON), capped at `maxOutput` bytes. */
export async function decompressToBuffer(frame: Buffer, maxOutput: number): Promise<{ bytes: Buffer; hex: string }> {
  const small = tryDecompressSmall(frame, maxOutput);
  if (small) return { bytes: small, hex: sha256Hex(small) };
  const parts: Buffer[] = [];
  const d = await hashFrameChunks(
    (async function* () {
      yield frame;
    })(),
    {
      maxOutput,
      onData: (b) => {
        parts.push(b);
      },
    },
  );
  return { bytes: Buffer.concat(parts), hex: d.hex };
}
