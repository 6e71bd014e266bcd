/**
 * The snapshot's payload encoder: payload tar bytes in, bundle file bytes out, all of the
 * heavy work in two threads.
 *
 *   main thread: tar bytes ──(1 MiB transferred buffers)──▶ payload worker: zstd
 *                          ──(shared ring, 4 × 1 MiB)──▶ sink: [age STREAM] ─▶ SHA-256 ─▶ pwrite(fd)
 *
 * The main thread reads the sources, hashes each artifact and frames the tar; everything
 * downstream of the tar runs off it. The payload worker only compresses; the sink seals the
 * compressed stream, hashes the stored bytes and writes them into the bundle's temp file.
 * They run ./encoder.worker.ts and ./encoder-sink.worker.ts (and ./encoder-peer.worker.ts, the
 * peer compressor of `threads`).
 * Measured on the 2-core bench machine (scale 1): with all of it in one worker, that worker
 * was busy 4.5 s of a 5.5 s snapshot (zstd 2.75 s, sealing 0.8 s, writes 0.96 s) and was the
 * bottleneck while the SQLite layer packed (zstd busy 90-99 % of every 100 ms). With the
 * sink the same snapshot took 4.6-4.8 s (medians of alternating runs, against 5.1-5.7 s), at
 * ~9 MiB more peak RSS (one more isolate and the ring).
 *
 * Work stealing: when the worker is behind (every input buffer in flight), the main thread,
 * which would otherwise wait, compresses the buffer it has filled as a frame of its own and
 * posts the frame; the worker emits it in its place in the stream (after the bytes queued before
 * it), so both cores compress where zstd is the bottleneck (SQLite text and JSONL at the
 * configured level). At most {@link STOLEN_FRAMES} such frames wait at the worker. Measured on
 * the bench mix (scale 1, 5 alternating runs): snapshot 5.14 -> 4.80 s, and 4.35 -> 4.00 s
 * without redaction, at the same CPU and peak RSS (the main thread's zstd context is a few MiB;
 * a peer worker thread for the same job costs ~15 MiB and is opt-in, see `threads`).
 *
 * Levels: {@link PayloadEncoder.setLevel} changes the zstd level for what follows. zstd
 * applies a new level only at a frame start in single-threaded mode (measured: a level set
 * mid-frame is ignored), so a change ends the current frame and the next bytes open a new
 * one. Concatenated frames are one valid zstd stream (`zstd -d` and every reader decode them
 * in sequence), so the payload stays a standard `.tar.zst`.
 *
 * age: the header and payload key are made on the main thread (see codecs/age/stream-seal.ts
 * `prepareAgeEncryption`); the sink only runs STREAM: 64 KiB chunks, each sealed with
 * ChaCha20-Poly1305 under the 11-byte big-endian counter nonce, the last one flagged. A full
 * chunk is held back until more bytes arrive, so the last chunk is never empty unless the
 * whole payload is (age v1 spec).
 *
 * Flow control: at most {@link IN_FLIGHT_BUFS} input buffers are at the worker at once; the
 * worker acknowledges each after it has compressed it and put the frames in the ring, so the
 * main thread stalls when the disk or the compressor is the slower side. The worker blocks
 * (Atomics.wait) while the ring is full, the sink while it is empty. Memory stays bounded:
 * 4 MiB of input, 2 MiB of zstd segment and output, the 4 MiB ring, a 1 MiB write batch.
 *
 * Failure: a write error (ENOSPC, EIO) in the sink or a zstd error in the worker is reported
 * once with its errno code; the other thread sees the stop flag in the ring's control words
 * and stops too, and the caller aborts the bundle. {@link PayloadEncoder.destroy} terminates
 * both threads and resolves once they are gone, so the caller may close the file after.
 */
import { closeSync, constants, openSync, readSync } from "node:fs";
import { Worker } from "node:worker_threads";
import { MemsnapError, destinationError } from "../errors.js";
import type { PayloadWritten } from "../format/container.js";
import { aeadAddonPath } from "../codecs/aead.js";
import { DIRECT_ALIGN, directIoAddon, memoryAddon } from "../util/directio.js";
import { workerUrl } from "../util/worker-path.js";
import { AGE_CHUNK, AGE_TAG, type AgeStreamParams } from "../codecs/age/stream-seal.js";
import type { SinkData } from "./encoder-sink.worker.js";
import type { EncoderReply, PayloadRequest, PayloadWorkerData } from "./encoder.worker.js";
import { loadZstdBinding, zstdBindingPath } from "../codecs/zstd-binding.js";
import { applyFrameLevel } from "../codecs/zstd-profile.js";

/** Input buffer size: what the main thread fills before handing a buffer to the worker. */
const IN_BUF = 1024 * 1024;
/** Input buffers at the worker at a time. */
const IN_FLIGHT_BUFS = 4;
/** Tar bytes per zstd frame (at most; a level change ends a frame early). */
const SEG_BYTES = 2 * 1024 * 1024;
/** Bytes in a slot of the ring between the payload worker and the sink, and in the sink's write batch. */
const W_BATCH = 1024 * 1024;
/** Slots in the ring between the payload worker and the sink. */
const W_SLOTS = 4;
/** Frames the main thread compressed that may wait in the worker's queue at once (see PayloadEncoder's #steal). */
const STOLEN_FRAMES = 4;
/** A buffer for one stolen frame: ≥ ZSTD_compressBound(IN_BUF). */
const FRAME_BYTES = IN_BUF + (IN_BUF >> 7) + 1024;
/**
 * With {@link PayloadEncoderOptions.output}: batches (≤ 1 MiB each) the sink posts before the main thread has taken
 * them.
 */
const OUT_UNACKED = 4;

export interface PayloadEncoderOptions {
  /** Open file descriptor of the bundle's temp file; the payload goes at `start` (-1 with `output`). */
  fd: number;
  start: number;
  /** The bundle path, for error messages. */
  path: string;
  level: number;
  /**
   * Extra compression threads: 0 (default) compresses in the payload worker alone; any other
   * value adds one peer thread that compresses every other frame. Measured on the 2-core bench
   * machine: 0.1-0.3 s faster on a 1 GiB mix, 10-60 MiB more peak RSS, so it is opt-in.
   */
  threads?: number;
  /**
   * age STREAM parameters, or null for a plaintext payload. An encrypted payload's zstd frames
   * carry no XXH64 content checksum: age's Poly1305 tag already authenticates every 64 KiB of
   * what is decompressed, and the index's SHA-256 covers every artifact, so the checksum only
   * cost time on both sides (~2 % of zstd's work on text). A plaintext payload keeps it, for
   * whoever reads it with `zstd -d` alone.
   */
  age: AgeStreamParams | null;
  /**
   * Write with O_DIRECT where the native/directio addon and the file system allow it (default true; see
   * src/util/directio.ts).
   */
  directIo?: boolean;
  /**
   * Instead of writing to `fd`: the sink posts the stored bytes (sealed, hashed) in order to the
   * main thread, which passes each batch to `output` (an object store upload); at most
   * OUT_UNACKED batches wait for it, so a slow `output` holds the sink, the ring and write().
   * A rejection fails the encoder with that error.
   */
  output?: (bytes: Uint8Array) => Promise<void>;
}

/** The part of zstd-napi's native compression context the main thread uses. */
interface ZstdCCtx {
  setParameter(param: number, value: number): void;
  compress2(dst: Uint8Array, src: Uint8Array): number;
}

/** ZSTD_compressBound: the most a frame of `n` bytes can take. */
function compressBound(n: number): number {
  return n + (n >> 8) + (n < 128 * 1024 ? (128 * 1024 - n) >> 11 : 0);
}

/** Compresses, encrypts, hashes and writes the payload in a worker thread. */
export class PayloadEncoder {
  readonly #worker: Worker;
  readonly #sink: Worker;
  readonly #ctl: Int32Array;
  #done: { compressed: number } | null = null;
  #sunk: { taken: number; stored: number; sha256: string; head: Uint8Array } | null = null;
  readonly #path: string;
  #buf: Uint8Array;
  #len = 0;
  #inFlight = 0;
  readonly #free: ArrayBuffer[] = [];
  #level: number;
  #waiter: { resolve: () => void; reject: (e: Error) => void } | null = null;
  /** Frames this thread compressed and posted, not yet emitted by the worker; their buffers when back. */
  #stolen = 0;
  readonly #frameFree: ArrayBuffer[] = [];
  #cctx: ZstdCCtx | null = null;
  #cctxLevel = Number.NaN;
  #params: { compressionLevel: number; hashLog: number } | null = null;
  /** Offsets in the current input buffer where a frame must end (see {@link cut}). */
  #cuts: number[] = [];
  /** zstd frame checksums: on for a plaintext payload only (see {@link PayloadEncoderOptions.age}). */
  readonly #checksum: boolean;
  #finish: { resolve: (r: PayloadWritten) => void; reject: (e: Error) => void } | null = null;
  #error: Error | null = null;
  #exited: Promise<void>;
  /** With {@link PayloadEncoderOptions.output}: the batches handed to it, in order. */
  readonly #output: ((bytes: Uint8Array) => Promise<void>) | undefined;
  #outChain: Promise<void> = Promise.resolve();
  /** Bytes given to {@link write} so far (the payload tar's size). */
  bytesIn = 0;
  /** Frames the main thread compressed itself while the worker was behind (for tests and MEMSNAP_DEBUG_ENCODER). */
  stolenFrames = 0;
  /** Payload bytes the sink wrote with O_DIRECT (known once the payload is finished; for tests). */
  directBytes = 0;

  constructor(opts: PayloadEncoderOptions) {
    this.#path = opts.path;
    this.#level = opts.level;
    this.#checksum = opts.age === null;
    this.#buf = new Uint8Array(new ArrayBuffer(IN_BUF));
    const ring = new SharedArrayBuffer(W_SLOTS * W_BATCH);
    // ctl: the ring's words (see ./encoder.worker.ts), then the count of output batches taken.
    const ctl = new SharedArrayBuffer((3 + W_SLOTS + 1) * 4);
    this.#ctl = new Int32Array(ctl);
    this.#output = opts.output;
    const shared = {
      ring,
      ctl,
      slots: W_SLOTS,
      wBatch: W_BATCH,
      fd: opts.output ? -1 : opts.fd,
      start: opts.start,
      memAddon: memoryAddon(),
      aeadAddon: aeadAddonPath(),
    };
    const direct = opts.directIo === false || opts.output ? null : directIoAddon();
    // The O_DIRECT descriptor and the head of its first block are opened and read here, and the
    // descriptor is closed here once both threads have exited: a sink terminated mid-stream
    // (destroy) never leaves it open.
    let dfd = -1;
    let lead: Uint8Array = new Uint8Array(0);
    if (direct !== null) {
      try {
        const n = opts.start % DIRECT_ALIGN;
        const b = Buffer.alloc(n);
        const rfd = openSync(`/proc/self/fd/${opts.fd}`, "r");
        try {
          if (n > 0 && readSync(rfd, b, 0, n, opts.start - n) !== n) throw new Error("the bundle's head is short");
        } finally {
          closeSync(rfd);
        }
        dfd = openSync(`/proc/self/fd/${opts.fd}`, constants.O_WRONLY | constants.O_DIRECT);
        lead = Uint8Array.from(b);
      } catch {
        dfd = -1; // no /proc, or no O_DIRECT on this file system: buffered writes
      }
    }
    let sink: Worker | null = null;
    try {
      this.#sink = sink = new Worker(workerUrl("snapshot/encoder-sink.worker.js"), {
        execArgv: [],
        resourceLimits: { maxYoungGenerationSizeMb: 4 },
        workerData: {
          ...shared,
          ageChunk: AGE_CHUNK,
          ageTag: AGE_TAG,
          ageKey: opts.age ? Uint8Array.from(opts.age.key) : null,
          agePreamble: opts.age ? Uint8Array.from(opts.age.preamble) : null,
          directAddon: dfd >= 0 ? direct : null,
          dfd,
          lead,
          ackIdx: 3 + W_SLOTS,
          outUnacked: OUT_UNACKED,
        } satisfies SinkData,
      });
      this.#worker = new Worker(workerUrl("snapshot/encoder.worker.js"), {
        execArgv: [],
        // The worker's JS only moves buffers: a small young generation keeps its heap small.
        resourceLimits: { maxYoungGenerationSizeMb: 4 },
        workerData: {
          ...shared,
          bindingPath: zstdBindingPath(),
          level: opts.level,
          segBytes: SEG_BYTES,
          parallel: (opts.threads ?? 0) > 0,
          peerUrl: workerUrl("snapshot/encoder-peer.worker.js").href,
          checksum: this.#checksum,
          directMin: IN_BUF / 4,
        } satisfies PayloadWorkerData,
      });
    } catch (e) {
      // The descriptor is closed once no thread can write through it.
      const close = (): void => {
        if (dfd >= 0) closeSync(dfd);
      };
      if (sink === null) close();
      else void sink.terminate().finally(close);
      throw e;
    }
    this.#exited = Promise.all(
      [this.#worker, this.#sink].map((w) => new Promise<void>((res) => w.once("exit", () => res()))),
    ).then(() => {
      if (dfd >= 0) closeSync(dfd);
    });
    for (const [w, what] of [
      [this.#worker, "payload worker"],
      [this.#sink, "payload writer"],
    ] as const) {
      w.on("message", (m: EncoderReply) => this.#onMessage(m));
      w.on("error", (e: Error) =>
        this.#fail(new MemsnapError("MEMSNAP_INTERNAL", `${what} failed: ${e.message}`, { cause: e })),
      );
      w.on("exit", (code: number) => {
        // The sink ends on its own once it has written the end of the stream and said so, or
        // when told to stop (by the payload worker, whose own error message is the one to report).
        if (w === this.#sink && (this.#sunk !== null || Atomics.load(this.#ctl, 2) === 2)) return;
        if (this.#finish !== null || this.#waiter !== null)
          this.#fail(new MemsnapError("MEMSNAP_INTERNAL", `${what} exited unexpectedly (code ${code})`));
      });
    }
  }

  /** Resolve finish() once the payload worker has ended the stream and the sink has written all of it. */
  #settle(): void {
    if (this.#done === null || this.#sunk === null) return;
    const f = this.#finish;
    this.#finish = null;
    void this.#worker.terminate();
    if (this.#sunk.taken !== this.#done.compressed) {
      f?.reject(
        new MemsnapError(
          "MEMSNAP_INTERNAL",
          `payload writer took ${this.#sunk.taken} bytes of ${this.#done.compressed}`,
        ),
      );
      return;
    }
    const r = { storedSize: this.#sunk.stored, sha256: this.#sunk.sha256, head: Buffer.from(this.#sunk.head) };
    if (!this.#output) {
      f?.resolve(r);
      return;
    }
    // Every batch was posted before "sunk": done once the output has taken the last one.
    void this.#outChain.then(() => (this.#error ? f?.reject(this.#error) : f?.resolve(r)));
  }

  /** A batch of stored bytes from the sink (posting mode): to the output, in order, then acknowledged. */
  #takeOutput(ab: ArrayBuffer): void {
    const output = this.#output!;
    this.#outChain = this.#outChain.then(async () => {
      if (this.#error) return;
      try {
        await output(new Uint8Array(ab));
      } catch (e) {
        this.#fail(e instanceof Error ? e : new Error(String(e)));
        return;
      }
      Atomics.add(this.#ctl, 3 + W_SLOTS, 1);
      Atomics.notify(this.#ctl, 3 + W_SLOTS);
    });
  }

  #onMessage(m: EncoderReply): void {
    switch (m.t) {
      case "ack":
        this.#inFlight--;
        this.#free.push(m.ab);
        if (this.#waiter) {
          const w = this.#waiter;
          this.#waiter = null;
          w.resolve();
        }
        return;
      case "out":
        this.#takeOutput(m.ab);
        return;
      case "fack":
        this.#stolen--;
        this.#frameFree.push(m.ab);
        return;
      case "done":
        this.#done = { compressed: m.compressed };
        this.#settle();
        return;
      case "sunk":
        this.#sunk = { taken: m.taken, stored: m.stored, sha256: m.sha256, head: m.head };
        this.directBytes = m.directBytes;
        this.#settle();
        return;
      case "err": {
        const e =
          m.kind === "io"
            ? destinationError(Object.assign(new Error(m.msg), { code: m.code }), this.#path)
            : new MemsnapError("MEMSNAP_INTERNAL", `payload encoding failed: ${m.msg}`);
        this.#fail(e);
        return;
      }
    }
  }

  #fail(e: Error): void {
    if (this.#error) return;
    this.#error = e;
    this.#stop();
    const w = this.#waiter;
    this.#waiter = null;
    w?.reject(e);
    const f = this.#finish;
    this.#finish = null;
    f?.reject(e);
  }

  /** Tell both threads to stop at their next slot, then terminate them. */
  #stop(): void {
    Atomics.store(this.#ctl, 2, 2);
    Atomics.notify(this.#ctl, 0);
    Atomics.notify(this.#ctl, 1);
    void this.#worker.terminate();
    void this.#sink.terminate();
  }

  /** Post the filled part of the current input buffer (or compress it here when the worker is behind). */
  #post(): void {
    if (this.#len === 0) return;
    if (this.#inFlight >= IN_FLIGHT_BUFS && this.#stolen < STOLEN_FRAMES) {
      this.#steal();
      return;
    }
    const ab = this.#buf.buffer as ArrayBuffer;
    this.#inFlight++;
    const cuts = this.#cuts.length ? this.#cuts : undefined;
    if (cuts) this.#cuts = [];
    this.#worker.postMessage({ t: "data", ab, len: this.#len, ...(cuts ? { cuts } : {}) } satisfies PayloadRequest, [
      ab,
    ]);
    const next = this.#free.pop();
    this.#buf = new Uint8Array(next ?? new ArrayBuffer(IN_BUF));
    this.#len = 0;
  }

  /**
   * Compress the filled input buffer here, as one zstd frame, and post the frame in its place.
   * Called when the worker is behind (all input buffers in flight) instead of waiting on it:
   * the main thread is then idle, and the worker is the bottleneck (SQLite text and JSONL at the
   * configured level), so both cores compress. At most {@link STOLEN_FRAMES} such frames wait
   * in the worker's queue; beyond that the caller waits as before.
   */
  #steal(): void {
    if (this.#error) {
      this.#len = 0; // failed: write() and finish() reject with the error
      return;
    }
    try {
      this.#compressHere();
    } catch (e) {
      this.#len = 0;
      this.#fail(
        new MemsnapError("MEMSNAP_INTERNAL", `payload encoding failed: ${(e as Error).message}`, { cause: e }),
      );
    }
  }

  #compressHere(): void {
    if (!this.#cctx) {
      const b = loadZstdBinding(zstdBindingPath());
      this.#cctx = new b.CCtx();
      this.#cctx.setParameter(b.CParameter.checksumFlag, this.#checksum ? 1 : 0);
      this.#params = b.CParameter;
    }
    if (this.#cctxLevel !== this.#level) {
      applyFrameLevel(this.#cctx, this.#params!, this.#level);
      this.#cctxLevel = this.#level;
    }
    // One frame, or one per stretch between cuts (back to back: concatenated frames are one stream).
    const ends = [...this.#cuts.filter((c) => c > 0 && c < this.#len), this.#len];
    this.#cuts = [];
    let bound = 0;
    for (let i = 0, at = 0; i < ends.length; at = ends[i++]!) bound += compressBound(ends[i]! - at);
    let ab = this.#frameFree.pop() ?? new ArrayBuffer(FRAME_BYTES);
    if (ab.byteLength < bound) ab = new ArrayBuffer(bound);
    const dst = new Uint8Array(ab);
    let len = 0;
    for (let i = 0, at = 0; i < ends.length; at = ends[i++]!) {
      len += this.#cctx.compress2(dst.subarray(len), this.#buf.subarray(at, ends[i]));
    }
    this.#stolen++;
    this.stolenFrames++;
    this.#worker.postMessage({ t: "frame", ab, len } satisfies PayloadRequest, [ab]);
    this.#len = 0;
  }

  /** Resolves when another input buffer may be posted. */
  #room(): Promise<void> | undefined {
    if (this.#error) return Promise.reject(this.#error);
    if (this.#inFlight < IN_FLIGHT_BUFS || this.#stolen < STOLEN_FRAMES) return undefined;
    return new Promise((resolve, reject) => {
      this.#waiter = { resolve, reject };
    });
  }

  /**
   * Append payload bytes (copied; the caller may reuse `data`). Returns a promise only when
   * the worker is behind and the caller must wait before writing more.
   */
  write(data: Uint8Array): Promise<void> | undefined {
    if (this.#error) return Promise.reject(this.#error);
    this.bytesIn += data.length;
    let off = 0;
    while (off < data.length) {
      const n = Math.min(IN_BUF - this.#len, data.length - off);
      this.#buf.set(data.subarray(off, off + n), this.#len);
      this.#len += n;
      off += n;
      if (this.#len === IN_BUF) {
        if (this.#inFlight >= IN_FLIGHT_BUFS && this.#stolen < STOLEN_FRAMES) {
          this.#steal();
          continue;
        }
        if (this.#inFlight >= IN_FLIGHT_BUFS) {
          // Rare: a write larger than the free buffers; wait, then go on with the rest.
          const rest = data.subarray(off);
          return this.#room()!
            .then(() => {
              this.#post();
              return this.write(rest);
            })
            .then(() => undefined);
        }
        this.#post();
      }
    }
    return this.#room();
  }

  /**
   * End the zstd frame here: the bytes written next start a new one (at the same level). Costs no
   * message; the cut travels with the input buffer. For stretches that compress best alone (the
   * byte planes of a KV page, see codecs/zstd-profile.ts).
   */
  cut(): void {
    if (this.#error) return;
    if (this.#cuts.at(-1) !== this.#len) this.#cuts.push(this.#len);
  }

  /** The zstd level for the bytes written from now on (a change starts a new zstd frame). */
  setLevel(level: number): void {
    if (level === this.#level || this.#error) return;
    this.#level = level;
    this.#post();
    this.#worker.postMessage({ t: "level", level } satisfies PayloadRequest);
  }

  get level(): number {
    return this.#level;
  }

  /** Flush, end the zstd stream and the age STREAM, and resolve with what was stored. */
  finish(): Promise<PayloadWritten> {
    if (this.#error) return Promise.reject(this.#error);
    this.#post();
    if (this.#error) return Promise.reject(this.#error); // compressing the last buffer here failed
    return new Promise<PayloadWritten>((resolve, reject) => {
      this.#finish = { resolve, reject };
      this.#worker.postMessage({ t: "end" } satisfies PayloadRequest);
    });
  }

  /** Stop the worker; resolves once it has exited (no write of it can land after). */
  async destroy(): Promise<void> {
    if (!this.#error) this.#error = new MemsnapError("MEMSNAP_INTERNAL", "payload encoder destroyed");
    this.#waiter?.reject(this.#error);
    this.#waiter = null;
    this.#finish = null;
    this.#stop();
    await Promise.all([this.#worker.terminate(), this.#sink.terminate()]).catch(() => undefined);
    await this.#exited;
  }
}
