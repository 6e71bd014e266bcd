/**
 * zstd compression and decompression as Node streams whose work runs in a
 * `worker_threads` Worker, so the main thread stays free to hash and encrypt.
 *
 * Each stream starts one Worker (./zstd.worker.ts, from dist/: see util/worker-path.ts) that
 * loads the `zstd-napi` native binding.
 *
 * Flow control, both directions:
 * - input: written bytes are copied into recycled {@link IN_BUF}-byte ArrayBuffers that are
 *   transferred to the worker and transferred back with its acknowledgement once zstd has
 *   consumed them; at most {@link IN_FLIGHT_BUFS} are out at a time, and the write
 *   callback is held until the whole chunk has been handed over;
 * - output: the worker fills {@link OUT_CHUNK}-byte buffers and transfers them; the main
 *   thread copies each into a Buffer of its own, pushes that, and transfers the buffer back
 *   for reuse. The worker may post at most {@link OUT_CREDIT} bytes that the main thread
 *   has not handed back as credit; credit is handed back as soon as `push()` accepts a
 *   chunk, or on the next `_read()` when `push()` asked to stop. A slow consumer therefore
 *   stalls the worker, which stalls the acknowledgements, which stalls the writer.
 *
 * The worker is `ref()`ed only while it has work it can make progress on, and is
 * terminated when the stream finishes, fails or is destroyed, so no thread outlives its
 * stream or keeps the process alive on its own.
 *
 * @module
 */

import { Duplex } from "node:stream";
import { Worker } from "node:worker_threads";
import { MemsnapError } from "../errors.js";
import { workerUrl } from "../util/worker-path.js";
import { zstdBindingPath } from "./zstd-binding.js";
import type { ZstdReply, ZstdRequest, ZstdWorkerData } from "./zstd.worker.js";

/** The four bytes every zstd frame starts with (0xFD2FB528 little-endian). */
export const ZSTD_MAGIC: Buffer = Buffer.from([0x28, 0xb5, 0x2f, 0xfd]);

/** The Duplex returned by {@link createZstdCompressor} and {@link createZstdDecompressor}. */
export interface ZstdDuplex extends Duplex {
  /** The worker's thread id while it runs; -1 once the worker has exited (diagnostics, tests). */
  readonly workerThreadId: number;
}

/** Options for {@link createZstdCompressor}. */
export interface ZstdCompressorOptions {
  /** zstd compression level, an integer from -131072 to 22. Default 3. */
  level?: number;
  /**
   * zstd `nbWorkers` (threads zstd starts inside the worker), 0 to 64. Default 0. With
   * threads > 0, zstd's `jobSize` is set to 4 MiB to bound its buffers.
   */
  threads?: number;
  /** Write the zstd frame checksum (XXH64 of the content). Default true. */
  checksum?: boolean;
}

/** Options for {@link createZstdDecompressor}. */
export interface ZstdDecompressorOptions {
  /**
   * Upper bound on the total decompressed bytes (a zstd-bomb guard). Producing even one
   * byte more fails the stream with MEMSNAP_PAYLOAD_CORRUPT. Default: no limit.
   */
  maxOutputBytes?: number;
}

/** Size of each input buffer handed to the worker (also the most input per zstd call). */
const IN_BUF = 1024 * 1024;
/** Most input buffers out at the worker at a time (4 MiB of input in flight). */
const IN_FLIGHT_BUFS = 4;
/** Most output bytes the worker may post before the main thread returns credit. */
const OUT_CREDIT = 4 * 1024 * 1024;
/** Size of each output buffer the worker fills before posting it. */
const OUT_CHUNK = 1024 * 1024;
/** zstd `jobSize` when `threads` > 0 (bounds zstd's multi-threading buffers). */
const MT_JOB_SIZE = 4 * 1024 * 1024;
/** The writable side buffers this much before write() returns false (coalesced by _writev). */
const WRITABLE_HWM = 256 * 1024;

const MIN_LEVEL = -131072;
const MAX_LEVEL = 22;

type Callback = (error?: Error | null) => void;

/** A Duplex that feeds a zstd worker and pushes what it produces. */
class ZstdWorkerStream extends Duplex implements ZstdDuplex {
  readonly #worker: Worker;
  readonly #mode: "compress" | "decompress";
  readonly #maxOutputBytes: number | null;
  /** Input buffers posted to the worker and not yet given back. */
  #inFlight = 0;
  /** Input buffers given back by the worker, for reuse. */
  readonly #free: ArrayBuffer[] = [];
  /** The write being handed over, and its held callback. */
  #pending: { chunks: readonly Buffer[]; idx: number; off: number; cb: Callback } | null = null;
  /** The held final callback, until the worker reports done. */
  #finalCb: Callback | null = null;
  /** Output bytes received and not yet returned to the worker as credit. */
  #unreturned = 0;
  /** Output bytes whose credit is withheld until the next _read(). */
  #owed = 0;
  #done = false;
  #workerGone = false;
  #refed = true;

  constructor(
    mode: "compress" | "decompress",
    data: Pick<ZstdWorkerData, "level" | "threads" | "checksum" | "maxOutputBytes">,
    maxOutputBytes: number | null,
  ) {
    super({ writableHighWaterMark: WRITABLE_HWM, decodeStrings: true });
    this.#mode = mode;
    this.#maxOutputBytes = maxOutputBytes;
    this.#worker = new Worker(workerUrl("codecs/zstd.worker.js"), {
      execArgv: [],
      // The worker's JS only shuffles buffers: a small young generation keeps its heap (and peak RSS) small.
      resourceLimits: { maxYoungGenerationSizeMb: 4 },
      workerData: {
        ...data,
        mode,
        bindingPath: zstdBindingPath(),
        outChunk: OUT_CHUNK,
        outCredit: OUT_CREDIT,
        jobSize: MT_JOB_SIZE,
      } satisfies ZstdWorkerData,
    });
    this.#worker.on("message", (m: ZstdReply) => this.#onMessage(m));
    this.#worker.on("error", (e: Error) => {
      this.#workerGone = true;
      this.destroy(new MemsnapError("MEMSNAP_INTERNAL", `zstd worker failed: ${e.message}`, { cause: e }));
    });
    this.#worker.on("messageerror", (e: Error) => {
      this.destroy(
        new MemsnapError("MEMSNAP_INTERNAL", `zstd worker message could not be read: ${e.message}`, { cause: e }),
      );
    });
    this.#worker.on("exit", (code: number) => {
      this.#workerGone = true;
      if (!this.#done && !this.destroyed) {
        this.destroy(new MemsnapError("MEMSNAP_INTERNAL", `zstd worker exited unexpectedly (code ${code})`));
      }
    });
    this.#updateRef();
  }

  /** The worker's thread id, or -1 once it has exited (for tests and diagnostics). */
  get workerThreadId(): number {
    return this.#worker.threadId;
  }

  /** Keep the process alive only while the worker has work it can make progress on. */
  #updateRef(): void {
    if (this.#workerGone) return;
    const busy = (this.#inFlight > 0 || this.#finalCb !== null) && this.#unreturned < OUT_CREDIT;
    if (busy !== this.#refed) {
      this.#refed = busy;
      if (busy) this.#worker.ref();
      else this.#worker.unref();
    }
  }

  #stopWorker(): void {
    if (this.#workerGone) return;
    this.#workerGone = true;
    this.#worker.terminate().catch(() => undefined);
  }

  #onMessage(m: ZstdReply): void {
    if (this.destroyed) return;
    switch (m.t) {
      case "out": {
        // Copy into a Buffer of this thread and give the worker its buffer back: a fresh
        // main-thread Buffer is collected sooner than a transferred one (measured: peak RSS
        // about 30 MiB lower), and the worker stops allocating. The credit is owed before
        // push(), so a _read() run from inside push() returns it exactly once.
        this.#unreturned += m.len;
        this.#owed += m.len;
        const chunk = Buffer.allocUnsafe(m.len);
        chunk.set(new Uint8Array(m.ab, 0, m.len));
        let n = 0;
        if (this.push(chunk) && this.#owed >= m.len) {
          this.#owed -= m.len;
          n = m.len;
        }
        this.#returnCredit(n, m.ab);
        break;
      }
      case "ack": {
        this.#inFlight--;
        if (this.#free.length < IN_FLIGHT_BUFS) this.#free.push(m.ab);
        this.#handOver();
        break;
      }
      case "done": {
        this.#done = true;
        this.#stopWorker();
        const cb = this.#finalCb;
        this.#finalCb = null;
        this.push(null);
        cb?.();
        break;
      }
      case "err": {
        this.#stopWorker();
        this.destroy(this.#toError(m.kind, m.msg));
        return;
      }
    }
    this.#updateRef();
  }

  #toError(kind: "corrupt" | "truncated" | "too-big" | "internal", msg: string): MemsnapError {
    switch (kind) {
      case "corrupt":
        return new MemsnapError("MEMSNAP_PAYLOAD_CORRUPT", `invalid zstd data: ${msg}`);
      case "truncated":
        return new MemsnapError("MEMSNAP_PAYLOAD_CORRUPT", `zstd stream is truncated: ${msg}`);
      case "too-big":
        return new MemsnapError(
          "MEMSNAP_PAYLOAD_CORRUPT",
          `decompressed size exceeds the declared size (${String(this.#maxOutputBytes)} bytes)`,
        );
      case "internal":
        return new MemsnapError("MEMSNAP_INTERNAL", `zstd ${this.#mode}ion failed in the worker: ${msg}`);
    }
  }

  #returnCredit(n: number, ab?: ArrayBuffer): void {
    this.#unreturned -= n;
    if (ab === undefined) this.#worker.postMessage({ t: "credit", n } satisfies ZstdRequest);
    else this.#worker.postMessage({ t: "credit", n, ab } satisfies ZstdRequest, [ab]);
  }

  /**
   * Copy the pending write into input buffers and post them, while fewer than
   * IN_FLIGHT_BUFS are out; release the write callback once all of it is posted. A written
   * Buffer may share its memory with other data or be kept by the caller, so it is always
   * copied (one copy, never a structured clone) into a buffer this stream owns.
   */
  #handOver(): void {
    const p = this.#pending;
    if (p === null) return;
    while (p.idx < p.chunks.length && this.#inFlight < IN_FLIGHT_BUFS) {
      const ab = this.#free.pop() ?? (Buffer.allocUnsafeSlow(IN_BUF).buffer as ArrayBuffer);
      const buf = new Uint8Array(ab);
      let len = 0;
      while (len < IN_BUF && p.idx < p.chunks.length) {
        const c = p.chunks[p.idx]!;
        const n = Math.min(c.length - p.off, IN_BUF - len);
        buf.set(c.subarray(p.off, p.off + n), len);
        len += n;
        p.off += n;
        if (p.off === c.length) {
          p.idx++;
          p.off = 0;
        }
      }
      if (len === 0) {
        this.#free.push(ab);
        break;
      }
      this.#inFlight++;
      this.#worker.postMessage({ t: "data", ab, len } satisfies ZstdRequest, [ab]);
    }
    if (p.idx === p.chunks.length) {
      this.#pending = null;
      p.cb();
    }
  }

  override _write(chunk: Buffer, _encoding: BufferEncoding, cb: Callback): void {
    this.#pending = { chunks: [chunk], idx: 0, off: 0, cb };
    this.#handOver();
    this.#updateRef();
  }

  override _writev(chunks: Array<{ chunk: Buffer; encoding: BufferEncoding }>, cb: Callback): void {
    this.#pending = { chunks: chunks.map((c) => c.chunk), idx: 0, off: 0, cb };
    this.#handOver();
    this.#updateRef();
  }

  override _final(cb: Callback): void {
    this.#finalCb = cb;
    this.#worker.postMessage({ t: "end" } satisfies ZstdRequest);
    this.#updateRef();
  }

  override _read(): void {
    if (this.#owed > 0 && !this.#workerGone) {
      const n = this.#owed;
      this.#owed = 0;
      this.#returnCredit(n);
      this.#updateRef();
    }
  }

  override _destroy(err: Error | null, cb: (error?: Error | null) => void): void {
    this.#pending = null;
    this.#finalCb = null;
    this.#stopWorker();
    cb(err);
  }
}

function isInt(v: unknown, min: number, max: number): v is number {
  return typeof v === "number" && Number.isInteger(v) && v >= min && v <= max;
}

/**
 * A Duplex that zstd-compresses the bytes written to it into one standard zstd frame
 * (readable by `zstd -d`; content checksum on by default, no content size in the header).
 * Compression runs in a worker thread; the frame is ended when the writable side ends.
 *
 * Stream errors: MemsnapError `MEMSNAP_INTERNAL` if zstd or the worker fails.
 *
 * @throws MemsnapError `MEMSNAP_INTERNAL` (synchronously) for an invalid `level` or
 *   `threads`; callers validate user configuration before this point.
 */
export function createZstdCompressor(opts: ZstdCompressorOptions = {}): ZstdDuplex {
  const level = opts.level ?? 3;
  const threads = opts.threads ?? 0;
  const checksum = opts.checksum ?? true;
  if (!isInt(level, MIN_LEVEL, MAX_LEVEL)) {
    throw new MemsnapError(
      "MEMSNAP_INTERNAL",
      `zstd level must be an integer from ${MIN_LEVEL} to ${MAX_LEVEL}, got ${String(level)}`,
    );
  }
  if (!isInt(threads, 0, 64)) {
    throw new MemsnapError("MEMSNAP_INTERNAL", `zstd threads must be an integer from 0 to 64, got ${String(threads)}`);
  }
  return new ZstdWorkerStream("compress", { level, threads, checksum }, null);
}

/**
 * A Duplex that decompresses one or more concatenated zstd frames (skippable frames are
 * skipped) written to it. Decompression runs in a worker thread.
 *
 * Stream errors, all MemsnapError `MEMSNAP_PAYLOAD_CORRUPT`:
 * - the input is not valid zstd (bad magic, damaged block, checksum mismatch, trailing
 *   garbage, a window larger than 128 MiB);
 * - the input is empty or ends inside a frame (the message says "truncated");
 * - more than `maxOutputBytes` would be produced ("decompressed size exceeds the declared
 *   size"); no byte past the limit is ever pushed.
 *
 * `MEMSNAP_INTERNAL` if the worker itself fails.
 *
 * @throws MemsnapError `MEMSNAP_INTERNAL` (synchronously) for an invalid `maxOutputBytes`.
 */
export function createZstdDecompressor(opts: ZstdDecompressorOptions = {}): ZstdDuplex {
  const max = opts.maxOutputBytes;
  if (max !== undefined && !isInt(max, 0, Number.MAX_SAFE_INTEGER)) {
    throw new MemsnapError("MEMSNAP_INTERNAL", `maxOutputBytes must be a non-negative integer, got ${String(max)}`);
  }
  const maxOutputBytes = max ?? null;
  return new ZstdWorkerStream("decompress", { maxOutputBytes }, maxOutputBytes);
}
