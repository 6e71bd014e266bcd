/**
 * The snapshot's payload encoder: payload tar bytes in, bundle file bytes out, all of the
 * heavy work in one worker thread.
 *
 *   main thread: tar bytes ──(1 MiB transferred buffers)──▶ worker: zstd ─▶ [age STREAM] ─▶ SHA-256 ─▶ pwrite(fd)
 *
 * The main thread reads the sources, hashes each artifact and frames the tar; everything
 * downstream of the tar (compression, ChaCha20-Poly1305 sealing, hashing of the stored bytes
 * and the writes into the bundle's temp file) runs in the worker, so the two cores each carry
 * about half of a snapshot. Measured on the 2-core bench machine (scale 1): the main thread
 * went from ~7.3 s busy (it also encrypted, hashed the ciphertext and wrote) to the work of
 * reading, hashing and framing only.
 *
 * Levels: {@link PayloadEncoder.setLevel} changes the zstd level for what follows. zstd
 * applies a new level only at a frame start in single-threaded mode (measured: a level set
 * mid-frame is ignored), so a change ends the current frame and the next bytes open a new
 * one. Concatenated frames are one valid zstd stream (`zstd -d` and every reader decode them
 * in sequence), so the payload stays a standard `.tar.zst`.
 *
 * age: the header and payload key are made on the main thread (typage; see age.ts
 * `prepareAgeEncryption`); the worker only runs STREAM: 64 KiB chunks, each sealed with
 * ChaCha20-Poly1305 under the 11-byte big-endian counter nonce, the last one flagged. A full
 * chunk is held back until more bytes arrive, so the last chunk is never empty unless the
 * whole payload is (age v1 spec).
 *
 * Flow control: at most {@link IN_FLIGHT_BUFS} input buffers are at the worker at once; the
 * worker acknowledges each after it has compressed, sealed and written everything it produced,
 * so the main thread stalls when the disk or the compressor is the slower side, and memory
 * stays bounded (4 MiB of input, 1 MiB of zstd output, 1 MiB of write batch).
 *
 * Failure: a write error (ENOSPC, EIO) or a zstd error is reported once with its errno code;
 * the stream is then dead, and the caller aborts the bundle. {@link PayloadEncoder.destroy}
 * terminates the worker and resolves once it is gone, so the caller may close the file after.
 */
import { Worker } from "node:worker_threads";
import { createRequire } from "node:module";
import { MemsnapError, destinationError } from "../errors.js";
import type { PayloadWritten } from "../format/container.js";
import { AGE_CHUNK, AGE_TAG, type AgeStreamParams } from "./age.js";

/** Input buffer size: what the main thread fills before handing a buffer to the worker. */
const IN_BUF = 1024 * 1024;
/** Input buffers at the worker at a time. */
const IN_FLIGHT_BUFS = 4;
/** zstd output buffer in the worker. */
const Z_OUT = 1024 * 1024;
/** Bytes the worker collects before one pwrite. */
const W_BATCH = 1024 * 1024;

export interface PayloadEncoderOptions {
  /** Open file descriptor of the bundle's temp file; the payload goes at `start`. */
  fd: number;
  start: number;
  /** The bundle path, for error messages. */
  path: string;
  level: number;
  /** zstd `nbWorkers` (0: compress in the worker thread itself). */
  threads?: number;
  /** age STREAM parameters, or null for a plaintext payload. */
  age: AgeStreamParams | null;
}

const WORKER_SOURCE = String.raw`
"use strict";
const { parentPort, workerData: wd } = require("node:worker_threads");
const crypto = require("node:crypto");
const fs = require("node:fs");
const b = require(wd.bindingPath);
const EMPTY = Buffer.alloc(0);
const CHUNK = wd.ageChunk, TAG = wd.ageTag;
let failed = false;

// -- output: SHA-256 of the stored bytes, the first 64 of them, batched positional writes
const hash = crypto.createHash("sha256");
let stored = 0;
let head = Buffer.alloc(0);
const wbuf = Buffer.allocUnsafeSlow(wd.wBatch);
let wlen = 0;
let pos = wd.start;
function flushWrites() {
  const t0 = now();
  let off = 0;
  while (off < wlen) {
    off += fs.writeSync(wd.fd, wbuf, off, wlen - off, pos + off);
  }
  pos += wlen;
  wlen = 0;
  T.write += now() - t0;
}
function out(buf) {
  if (buf.length === 0) return;
  hash.update(buf);
  if (head.length < 64) head = Buffer.concat([head, buf.subarray(0, 64 - head.length)]);
  stored += buf.length;
  if (buf.length >= wd.wBatch) {
    flushWrites();
    let off = 0;
    while (off < buf.length) off += fs.writeSync(wd.fd, buf, off, buf.length - off, pos + off);
    pos += buf.length;
    return;
  }
  if (wlen + buf.length > wd.wBatch) flushWrites();
  buf.copy(wbuf, wlen);
  wlen += buf.length;
}

// Each sealed chunk is a fresh 64 KiB Buffer (node:crypto has no update-into). Left to V8's
// own pacing they pile up as external memory (measured: +38 MiB of peak RSS on a 1 GiB
// snapshot), so a minor GC runs every 4 MiB sealed; it costs well under a millisecond.
let runGc = null;
try {
  require("node:v8").setFlagsFromString("--expose-gc");
  runGc = require("node:vm").runInNewContext("gc");
} catch { runGc = null; }
let sinceGc = 0;
function collect(n) {
  sinceGc += n;
  if (runGc !== null && sinceGc >= 4 * 1024 * 1024) {
    sinceGc = 0;
    runGc({ type: "minor" });
  }
}

// -- age STREAM (optional)
const key = wd.ageKey ? Buffer.from(wd.ageKey) : null;
const chunk = key ? Buffer.allocUnsafeSlow(CHUNK) : null;
let used = 0, counter = 0;
const nonce = Buffer.alloc(12);
function seal(plain, last) {
  const t0 = now();
  nonce.fill(0);
  nonce.writeUIntBE(counter, 5, 6);
  nonce[11] = last ? 1 : 0;
  const c = crypto.createCipheriv("chacha20-poly1305", key, nonce, { authTagLength: TAG });
  out(c.update(plain));
  c.final();
  out(c.getAuthTag());
  counter++;
  collect(plain.length);
  T.seal += now() - t0;
}
function emit(data) {
  if (!key) return out(data);
  while (data.length > 0) {
    if (used === CHUNK) { seal(chunk, false); used = 0; }
    if (used === 0 && data.length > CHUNK) {
      seal(data.subarray(0, CHUNK), false);
      data = data.subarray(CHUNK);
      continue;
    }
    const n = Math.min(CHUNK - used, data.length);
    data.copy(chunk, used, 0, n);
    used += n;
    data = data.subarray(n);
  }
}
if (key) out(Buffer.from(wd.agePreamble));

// -- zstd
const cctx = new b.CCtx();
let level = wd.level;
cctx.setParameter(b.CParameter.compressionLevel, level);
cctx.setParameter(b.CParameter.checksumFlag, 1);
if (wd.threads > 0) {
  cctx.setParameter(b.CParameter.nbWorkers, wd.threads);
  cctx.setParameter(b.CParameter.jobSize, 4 * 1024 * 1024);
}
const zout = Buffer.allocUnsafeSlow(wd.zOut);
let zpos = 0;
let frameOpen = false;
let frames = 0;
function zflush() {
  if (zpos > 0) { emit(zout.subarray(0, zpos)); zpos = 0; }
}
function compress(buf) {
  let at = 0;
  frameOpen = true;
  while (at < buf.length) {
    const r = cctx.compressStream2(zout.subarray(zpos), buf.subarray(at), b.EndDirective.continue);
    zpos += r[1];
    at += r[2];
    if (zpos === zout.length) zflush();
  }
}
function endFrame() {
  for (;;) {
    const r = cctx.compressStream2(zout.subarray(zpos), EMPTY, b.EndDirective.end);
    zpos += r[1];
    if (zpos === zout.length || r[0] === 0) zflush();
    if (r[0] === 0) break;
  }
  frameOpen = false;
  frames++;
}

const T = { z: 0, seal: 0, write: 0, hash: 0 };
const now = () => Number(process.hrtime.bigint()) / 1e6;
function fail(e, kind) {
  failed = true;
  parentPort.postMessage({ t: "err", kind, code: e && e.code, msg: String(e && e.message) });
}

parentPort.on("message", (m) => {
  if (failed) return;
  try {
    if (m.t === "data") {
      const t0 = now();
      compress(Buffer.from(m.ab, 0, m.len));
      T.z += now() - t0;
      parentPort.postMessage({ t: "ack", ab: m.ab }, [m.ab]);
    } else if (m.t === "level") {
      if (m.level !== level) {
        if (frameOpen) endFrame();
        level = m.level;
        cctx.setParameter(b.CParameter.compressionLevel, level);
      }
    } else if (m.t === "end") {
      // An empty payload still gets one (empty) frame, so it is a valid zstd stream.
      if (frameOpen || frames === 0) endFrame();
      zflush();
      if (key) seal(chunk.subarray(0, used), true);
      flushWrites();
      if (process.env.MEMSNAP_DEBUG_ENCODER) process.stderr.write("encoder worker busy ms: " + JSON.stringify(T) + " frames " + frames + "\n");
      parentPort.postMessage({ t: "done", stored, sha256: hash.digest("hex"), head });
    }
  } catch (e) {
    fail(e, e && typeof e.code === "string" && e.syscall ? "io" : "internal");
  }
});
`;

let bindingPathCache: string | undefined;
function bindingPath(): string {
  bindingPathCache ??= createRequire(import.meta.url).resolve("zstd-napi/binding");
  return bindingPathCache;
}

type Msg =
  | { t: "ack"; ab: ArrayBuffer }
  | { t: "done"; stored: number; sha256: string; head: Uint8Array }
  | { t: "err"; kind: "io" | "internal"; code?: string; msg: string };

/** Compresses, encrypts, hashes and writes the payload in a worker thread. */
export class PayloadEncoder {
  readonly #worker: Worker;
  readonly #path: string;
  #buf: Uint8Array;
  #len = 0;
  #inFlight = 0;
  readonly #free: ArrayBuffer[] = [];
  #level: number;
  #waiter: { resolve: () => void; reject: (e: Error) => void } | null = null;
  #finish: { resolve: (r: PayloadWritten) => void; reject: (e: Error) => void } | null = null;
  #error: Error | null = null;
  #exited: Promise<void>;
  /** Bytes given to {@link write} so far (the payload tar's size). */
  bytesIn = 0;

  constructor(opts: PayloadEncoderOptions) {
    this.#path = opts.path;
    this.#level = opts.level;
    this.#buf = new Uint8Array(new ArrayBuffer(IN_BUF));
    this.#worker = new Worker(WORKER_SOURCE, {
      eval: true,
      execArgv: [],
      // The worker's JS only moves buffers: a small young generation keeps its heap small.
      resourceLimits: { maxYoungGenerationSizeMb: 4 },
      workerData: {
        bindingPath: bindingPath(), fd: opts.fd, start: opts.start, level: opts.level, threads: opts.threads ?? 0,
        zOut: Z_OUT, wBatch: W_BATCH, ageChunk: AGE_CHUNK, ageTag: AGE_TAG,
        ageKey: opts.age ? Uint8Array.from(opts.age.key) : null,
        agePreamble: opts.age ? Uint8Array.from(opts.age.preamble) : null,
      },
    });
    this.#exited = new Promise((res) => this.#worker.once("exit", () => res()));
    this.#worker.on("message", (m: Msg) => this.#onMessage(m));
    this.#worker.on("error", (e: Error) => this.#fail(new MemsnapError("MEMSNAP_INTERNAL", `payload worker failed: ${e.message}`, { cause: e })));
    this.#worker.on("exit", (code: number) => {
      if (this.#finish !== null || this.#waiter !== null) this.#fail(new MemsnapError("MEMSNAP_INTERNAL", `payload worker exited unexpectedly (code ${code})`));
    });
  }

  #onMessage(m: Msg): void {
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
      case "done": {
        const f = this.#finish;
        this.#finish = null;
        void this.#worker.terminate();
        f?.resolve({ storedSize: m.stored, sha256: m.sha256, head: Buffer.from(m.head) });
        return;
      }
      case "err": {
        const e = m.kind === "io"
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
    void this.#worker.terminate();
    const w = this.#waiter;
    this.#waiter = null;
    w?.reject(e);
    const f = this.#finish;
    this.#finish = null;
    f?.reject(e);
  }

  /** Post the filled part of the current input buffer. */
  #post(): void {
    if (this.#len === 0) return;
    const ab = this.#buf.buffer as ArrayBuffer;
    this.#inFlight++;
    this.#worker.postMessage({ t: "data", ab, len: this.#len }, [ab]);
    const next = this.#free.pop();
    this.#buf = new Uint8Array(next ?? new ArrayBuffer(IN_BUF));
    this.#len = 0;
  }

  /** Resolves when another input buffer may be posted. */
  #room(): Promise<void> | undefined {
    if (this.#error) return Promise.reject(this.#error);
    if (this.#inFlight < IN_FLIGHT_BUFS) return undefined;
    return new Promise((resolve, reject) => { this.#waiter = { resolve, reject }; });
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
        if (this.#inFlight >= IN_FLIGHT_BUFS) {
          // Rare: a write larger than the free buffers; wait, then go on with the rest.
          const rest = data.subarray(off);
          return this.#room()!.then(() => {
            this.#post();
            return this.write(rest);
          }).then(() => undefined);
        }
        this.#post();
      }
    }
    return this.#room();
  }

  /** The zstd level for the bytes written from now on (a change starts a new zstd frame). */
  setLevel(level: number): void {
    if (level === this.#level || this.#error) return;
    this.#level = level;
    this.#post();
    this.#worker.postMessage({ t: "level", level });
  }

  get level(): number {
    return this.#level;
  }

  /** Flush, end the zstd stream and the age STREAM, and resolve with what was stored. */
  finish(): Promise<PayloadWritten> {
    if (this.#error) return Promise.reject(this.#error);
    this.#post();
    return new Promise<PayloadWritten>((resolve, reject) => {
      this.#finish = { resolve, reject };
      this.#worker.postMessage({ t: "end" });
    });
  }

  /** Stop the worker; resolves once it has exited (no write of it can land after). */
  async destroy(): Promise<void> {
    if (!this.#error) this.#error = new MemsnapError("MEMSNAP_INTERNAL", "payload encoder destroyed");
    this.#waiter?.reject(this.#error);
    this.#waiter = null;
    this.#finish = null;
    await this.#worker.terminate().catch(() => undefined);
    await this.#exited;
  }
}
