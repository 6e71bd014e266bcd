/**
 * The read side of the payload, in one worker thread: bundle file ─pread─▶ SHA-256 of the
 * stored bytes ─▶ [age STREAM open] ─▶ zstd -d (bounded) ─▶ tar bytes, pushed to the main
 * thread as a Readable; with `scan` (what readPayload uses), the tar's framing is parsed here
 * too (./tar-scan.ts) and the main thread gets each batch of bytes with its entries' ranges.
 *
 * The main thread only writes each artifact (restore) and hashes the entries the worker left
 * to it, so decryption, decompression, tar parsing and the stored-byte hash run on the other
 * core. Measured on the bench's scale-1 restore: 3.55 -> 3.1 CPU-s and ~8 MiB less peak RSS
 * than parsing with tar-stream on the main thread (its streams and per-entry objects), wall
 * time within the noise (this worker is then the busier thread; see docs/BENCHMARK.md). The age header is
 * opened on the main thread first (typage and the identities live there; see codecs/age/stream-open.ts
 * `openAgePrefix`), and the worker gets the payload key and the offset of the first chunk.
 *
 * Errors keep the codes and messages of the stream stages they replace (codecs/age/stream-open.ts
 * AgeDecryptStream, zstd.ts): a chunk that does not authenticate, a truncated STREAM, data
 * after the final chunk → MEMSNAP_DECRYPT_FAILED; damaged or truncated zstd, or output past
 * `maxOutputBytes` → MEMSNAP_PAYLOAD_CORRUPT; a short read → MEMSNAP_BUNDLE_TRUNCATED.
 *
 * Flow control: the worker decompresses into the slots of one shared memory (util/slots.ts)
 * and posts each slot as it fills; it stops reading the file while no slot is free, so memory
 * stays bounded whatever the compression ratio (a zstd bomb included). With `scan`, the main
 * thread reads a batch where the worker wrote it and gives the slot back once the reader and
 * whoever pinned a view of it are done with it; without, it copies the bytes out first.
 */
import { closeSync, constants, openSync } from "node:fs";
import { Readable } from "node:stream";
import { Worker } from "node:worker_threads";
import { createRequire } from "node:module";
import { MemsnapError } from "../errors.js";
import { isBundleUrl, openBundle, type BundleFile } from "../format/bundle-file.js";
import { AEAD_LOAD_SOURCE, aeadAddonPath } from "../codecs/aead.js";
import { directIoAddon } from "../util/directio.js";
import { SlotPool } from "../util/slots.js";
import { WORKER_MINOR_GC_JS } from "../util/gc.js";
import { AGE_DAMAGED_HINT, AGE_SEALED_CHUNK } from "../codecs/age/stream-open.js";
import { TarScanner } from "./tar-scan.js";

const READ_BLOCK = 1024 * 1024;
const OUT_CHUNK = 1024 * 1024;
/** Bytes the main thread may hold unread without `scan` (then copied out of the slots). */
const OUT_CREDIT = 4 * 1024 * 1024;
/**
 * Slots with `scan`: the reader's batch, the batches queued for it and those pinned by writes in
 * flight (a restore's WriteBehind keeps up to 4 MiB of views), with room for the worker to go on.
 */
const SCAN_SLOTS = 10;

export interface PayloadDecoderOptions {
  /** A local path (read by the worker itself), or a bundle URL (read here and fed to the worker). */
  path: string;
  /** The bundle's size, when known (saves a remote bundle's HeadObject). */
  fileSize?: number;
  /** Byte range of the payload member in the bundle file. */
  offset: number;
  size: number;
  /** age STREAM key and the offset (within the payload) of its first chunk, or null when plaintext. */
  age: { key: Buffer; offset: number } | null;
  /** zstd output past this is MEMSNAP_PAYLOAD_CORRUPT (a bomb guard). */
  maxOutputBytes: number;
  onStored?: (storedBytes: number, storedTotal: number) => void;
  /**
   * Parse the tar in the worker and hash each entry there (./tar-scan.ts): the decoder then
   * yields {@link ScannedBatch}es instead of tar bytes, and a failure comes after the batches
   * decoded before it, as a batch holding only the error. Output past `tarSize` bytes is
   * MEMSNAP_UNSAFE_BUNDLE (the manifest's declared size: a zstd or tar bomb).
   */
  scan?: { tarSize: number };
}

/**
 * Tar bytes and what the worker's scanner found in them (`ops`, see TarScanner), or the failure
 * that ended the payload. `buf` is a view of a shared slot: call `release` once (when the reader
 * moves on); a view kept past that must be pinned (util/slots.ts `pin`).
 */
export type ScannedBatch = { buf: Buffer; ops: (number | string)[]; release: () => void } | { err: MemsnapError };

export interface StoredResult {
  sha256: string;
  size: number;
  /** Of those bytes, how many were read with O_DIRECT (0: all through the page cache). */
  directBytes: number;
}

const WORKER_SOURCE = String.raw`
"use strict";
const { parentPort, workerData: wd } = require("node:worker_threads");
const crypto = require("node:crypto");
const fs = require("node:fs");
const b = require(wd.bindingPath);
${AEAD_LOAD_SOURCE}
const SEALED = wd.sealedChunk, TAG = 16;
let failed = false, finished = false;
// Output slots of the shared memory (see util/slots.ts) that the main thread has given back.
const freeSlots = [];
for (let i = 0; i < wd.slots; i++) freeSlots.push(i);

function fail(kind, msg) {
  failed = true;
  // Scanning: what was decoded before the failure goes first (the reader meets its entries,
  // then the error, in payload order).
  if (scanner !== null) post();
  parentPort.postMessage({ t: "err", kind, msg });
}

// -- tar framing and per-entry SHA-256 (wd.scan; see tar-scan.ts)
// (an expression: a bundler may name the class itself differently, e.g. _TarScanner)
const TarScanner = (${TarScanner.toString()});
// An entry is hashed here when this thread found no free slot since the previous entry began
// (the main thread is behind), by the main thread otherwise. Measured: deciding by how much
// room is left instead had this thread hashing while the main thread was mostly idle,
// waiting for its writes (batches queue up behind a write's latency, not its CPU).
let starved = false;
const scanner = wd.scan ? new TarScanner(() => crypto.createHash("sha256"), () => {
  const here = starved;
  starved = false;
  return here;
}) : null;

// -- output (tar bytes), decompressed straight into a free slot; none free: wait for one
let out = null, outSlot = -1;
let outPos = 0;
function post() {
  if (outPos === 0) return;
  if (scanner !== null) {
    parentPort.postMessage({ t: "out", slot: outSlot, len: outPos, ops: scanner.ops });
    scanner.ops = [];
  } else parentPort.postMessage({ t: "out", slot: outSlot, len: outPos });
  out = null;
  outPos = 0;
}

// -- zstd
const dctx = new b.DCtx();
let lastRet = 0, totalIn = 0, totalOut = 0;
const plain = []; // plaintext (zstd input) waiting: { buf, pos }
function decompressSome() {
  // Returns false when no slot is free; true when everything queued was consumed.
  while (plain.length > 0) {
    const item = plain[0];
    for (;;) {
      if (out === null) {
        if (freeSlots.length === 0) { starved = true; return false; }
        outSlot = freeSlots.shift();
        out = Buffer.from(wd.memory, outSlot * wd.outChunk, wd.outChunk);
      }
      const end = Math.min(out.length, outPos + (wd.maxOut - totalOut) + 1);
      const dst = out.subarray(outPos, end);
      let r;
      try {
        r = dctx.decompressStream(dst, item.buf.subarray(item.pos));
      } catch (e) {
        fail("corrupt", String(e && e.message));
        return false;
      }
      if (r[1] > 0 || r[2] > 0) lastRet = r[0];
      outPos += r[1];
      totalOut += r[1];
      item.pos += r[2];
      if (totalOut > wd.maxOut) { outPos -= r[1]; fail("too-big", ""); return false; }
      if (scanner !== null && r[1] > 0) {
        if (totalOut > wd.scan.tarSize) { outPos -= r[1]; fail("bomb", ""); return false; }
        if (!scanner.scan(out, outPos - r[1], outPos)) { fail("tar", scanner.error); return false; }
      }
      if (outPos === out.length) post();
      if (item.pos === item.buf.length && (r[1] < dst.length || r[0] === 0)) break;
    }
    plain.shift();
    if (item.buf.pooled !== undefined) plainFree.push(item.buf.pooled);
  }
  return true;
}
function feedPlain(buf) {
  if (buf.length === 0) return;
  totalIn += buf.length;
  plain.push({ buf, pos: 0 });
}

// collect(n): a minor GC every 4 MiB opened (see WORKER_MINOR_GC_JS).
${WORKER_MINOR_GC_JS}
// -- age STREAM open
const key = wd.ageKey ? Buffer.from(wd.ageKey) : null;
const sealedBuf = key ? Buffer.allocUnsafeSlow(SEALED) : null;
let used = 0, counter = 0, sealedDone = false;
const nonce = Buffer.alloc(12);
// With native/aead, chunks open into recycled 64 KiB buffers (given back once zstd has
// consumed them); node:crypto otherwise (a cipher object and a fresh buffer per chunk).
const AEAD = key ? loadAead(wd.aeadAddon) : null;
const plainFree = [];
function tryOpen(sealed, last) {
  if (AEAD !== null) {
    const p = plainFree.pop() || Buffer.allocUnsafeSlow(SEALED - TAG);
    const n = AEAD.open(key, counter, last, sealed, 0, sealed.length, p, 0);
    if (n < 0) { plainFree.push(p); return null; }
    const r = p.subarray(0, n);
    r.pooled = p;
    return r;
  }
  nonce.fill(0);
  nonce.writeUIntBE(counter, 5, 6);
  nonce[11] = last ? 1 : 0;
  const d = crypto.createDecipheriv("chacha20-poly1305", key, nonce, { authTagLength: TAG });
  d.setAuthTag(sealed.subarray(sealed.length - TAG));
  const p = d.update(sealed.subarray(0, sealed.length - TAG));
  try { d.final(); } catch { return null; }
  return p;
}
function openChunk(sealed, last) {
  const p = tryOpen(sealed, last);
  if (p !== null) { counter++; feedPlain(p); if (AEAD === null) collect(p.length); return true; }
  if (!last && tryOpen(sealed, true) !== null) return fail("decrypt", "trailing data after the final age chunk (chunk " + counter + ")"), false;
  if (last && sealed.length === SEALED && tryOpen(sealed, false) !== null) {
    return fail("decrypt", "the age payload is truncated: it ends after chunk " + counter + ", which is not marked final"), false;
  }
  fail("decrypt", "age payload chunk " + counter + " does not authenticate" + (last ? " (the file is truncated or damaged)" : ""));
  return false;
}
function feedSealed(data) {
  while (data.length > 0) {
    if (used === SEALED) {
      if (!openChunk(sealedBuf, false)) return false;
      used = 0;
    }
    if (used === 0 && data.length > SEALED) {
      if (!openChunk(data.subarray(0, SEALED), false)) return false;
      data = data.subarray(SEALED);
      continue;
    }
    const n = Math.min(SEALED - used, data.length);
    data.copy(sealedBuf, used, 0, n);
    used += n;
    data = data.subarray(n);
  }
  return true;
}
function finishSealed() {
  if (used < TAG) {
    fail("decrypt", used === 0 && counter === 0
      ? "the age file is truncated: it has no payload after the nonce"
      : "the age file is truncated inside a chunk");
    return false;
  }
  if (used === TAG && counter > 0) {
    fail("decrypt", "the age payload ends with an empty final chunk, which is invalid");
    return false;
  }
  return openChunk(sealedBuf.subarray(0, used), true);
}

// -- the file
const hash = crypto.createHash("sha256");
let fd;
let at = 0; // bytes of the payload read
const streamStart = key ? wd.ageOffset : 0;
// An encrypted payload is read into one reused buffer: feedSealed consumes a block before the
// next read (it copies a partial chunk into sealedBuf and decrypts whole ones into new buffers).
// A fresh block per read cost its page faults: measured reading a 551 MB bundle from the page
// cache, 100-190 ms against 40-50 ms. A plaintext block stays queued for zstd, so it is fresh.
const readBuf = key ? Buffer.allocUnsafeSlow(wd.readBlock) : null;
// An encrypted payload is read with O_DIRECT where native/directio gives aligned memory and the
// file system takes it: a bundle is written with O_DIRECT, so it is not in the page cache, and a
// buffered read of it cost ~0.4 CPU-s of kernel time per 550 MB (filling the page cache, then
// copying out of it) against ~0.04 s. Reads are whole 4 KiB blocks at aligned offsets into two
// aligned buffers; the payload's bytes are sliced out of them. The next block is read on the
// thread pool while this one is opened and decompressed (a direct read waits for the device).
// EINVAL (an alignment the device refuses) turns it off for the rest of the payload.
// The descriptors (wd.fd, and wd.dfd opened with O_DIRECT or -1) belong to the main thread,
// which closes them once this worker has exited, whatever the outcome (the thread pool finishes
// a read in flight before the worker's teardown completes).
const ALIGN = 4096;
let direct = null; // { fd, bufs, k, job: read in flight or done, gen }
if (key && wd.dfd >= 0 && wd.directAddon) {
  try {
    // MEMSNAP_DIRECT_IO=misaligned (tests): memory one byte off, which O_DIRECT refuses (EINVAL).
    const off = process.env.MEMSNAP_DIRECT_IO === "misaligned" ? 1 : 0;
    const alloc = () => Buffer.from(require(wd.directAddon).alignedBuffer(wd.readBlock + 2 * ALIGN + off, ALIGN), off, wd.readBlock + 2 * ALIGN);
    direct = { fd: wd.dfd, bufs: [alloc(), alloc()], k: 0, job: null };
  } catch {
    direct = null;
  }
}
let waiting = false; // pump() returned to wait for a read
let directBytes = 0; // payload bytes read with O_DIRECT
function stopDirect() {
  direct = null;
}
/** Start reading payload bytes [from, from + n) into the next aligned buffer. */
function startDirect(from) {
  const d = direct;
  const n = Math.min(wd.readBlock, wd.size - from);
  const pos = wd.offset + from;
  const lead = pos % ALIGN;
  const want = lead + n;
  const len = Math.ceil(want / ALIGN) * ALIGN;
  const buf = d.bufs[d.k];
  d.k ^= 1;
  const job = { from, n, lead, want, buf, got: 0, done: false, err: null };
  d.job = job;
  const step = () => fs.read(d.fd, buf, job.got, len - job.got, pos - lead + job.got, (err, r) => {
    if (!err && r > 0 && (job.got += r) < want) return step();
    job.err = err;
    job.done = true;
    if (waiting && direct === d) { waiting = false; pump(); }
  });
  step();
}
/**
 * The next block through O_DIRECT: its bytes, WAIT while its read is in flight, or null when
 * O_DIRECT was refused (then off for good; the block is read through wd.fd).
 */
const WAIT = 0;
function nextDirect(n) {
  const d = direct;
  if (d.job === null) startDirect(at);
  const job = d.job;
  if (!job.done) return WAIT;
  d.job = null;
  if (job.err) {
    if (job.err.code !== "EINVAL") throw job.err;
    stopDirect();
    return null;
  }
  if (at + n < wd.size) startDirect(at + n); // into the other buffer, while this one is used
  const got = job.buf.subarray(job.lead, Math.max(job.lead, Math.min(job.want, job.got)));
  directBytes += got.length;
  return got;
}
/** Read the next block and feed it on: true to go on, false on failure, WAIT for a read. */
function readBlock() {
  if (wd.feed) return readFed();
  const n = Math.min(wd.readBlock, wd.size - at);
  let buf = direct ? nextDirect(n) : null;
  if (buf === WAIT) return WAIT;
  let got = buf ? buf.length : 0;
  if (buf === null) {
    buf = readBuf ? readBuf.subarray(0, n) : Buffer.allocUnsafe(n);
    while (got < n) {
      const r = fs.readSync(fd, buf, got, n - got, wd.offset + at + got);
      if (r === 0) break;
      got += r;
    }
  }
  if (got < n) { fail("short", "the bundle ends inside the payload"); return false; }
  return take(buf, n);
}
// -- a remote bundle (wd.feed): the main thread streams the payload's bytes and posts them
// here, two blocks queued at most; "need" asks for the next.
const inQ = [];
let inEnd = false, asked = false;
function ask() {
  if (!asked && !inEnd && inQ.length < 2) { asked = true; parentPort.postMessage({ t: "need" }); }
}
function readFed() {
  if (inQ.length === 0) {
    if (inEnd) { fail("short", "the bundle ends inside the payload"); return false; }
    ask();
    return WAIT;
  }
  let buf = inQ.shift();
  ask();
  const n = Math.min(buf.length, wd.size - at);
  if (buf.length > n) buf = buf.subarray(0, n);
  return take(buf, n);
}
/** Hash a block of payload bytes read and feed it on. */
function take(buf, n) {
  hash.update(buf);
  const from = at;
  at += n;
  if (wd.progress) parentPort.postMessage({ t: "stored", n: at }); // a message costs both threads ~0.1 ms
  let data = buf;
  if (from < streamStart) data = buf.subarray(Math.min(n, streamStart - from));
  if (data.length === 0) return true;
  if (key) return feedSealed(data);
  feedPlain(data);
  return true;
}

function pump() {
  try {
    while (!failed && !finished) {
      if (!decompressSome()) return;
      if (failed) return;
      if (at < wd.size) {
        const r = readBlock();
        if (r === WAIT) { waiting = true; return; }
        if (!r) return;
        continue;
      }
      // Everything read: the last sealed chunk, then the end of the zstd stream.
      if (key && !sealedDone) {
        sealedDone = true;
        if (!finishSealed()) return;
        continue;
      }
      if (totalIn === 0) return fail("truncated", "the input is empty (no zstd frame)");
      if (lastRet !== 0) return fail("truncated", "the input ends inside a zstd frame");
      if (scanner !== null && !scanner.end()) return fail("tar", scanner.error);
      post();
      finished = true;
      stopDirect();
      parentPort.postMessage({ t: "done", sha256: hash.digest("hex"), size: at, directBytes });
    }
  } catch (e) {
    fail("internal", String(e && e.message));
  }
}

parentPort.on("message", (m) => {
  if (failed) return;
  if (m.t === "free") {
    freeSlots.push(m.slot);
    pump();
  } else if (m.t === "in") {
    asked = false;
    if (m.end) inEnd = true;
    else inQ.push(Buffer.from(m.buf));
    ask();
    if (waiting) { waiting = false; pump(); }
  }
});

fd = wd.fd;
if (!wd.feed && fd < 0) fail("open", wd.openError);
else pump();
`;

let bindingPathCache: string | undefined;
function bindingPath(): string {
  bindingPathCache ??= createRequire(import.meta.url).resolve("zstd-napi/binding");
  return bindingPathCache;
}

type Msg =
  | { t: "out"; slot: number; len: number; ops?: (number | string)[] }
  | { t: "stored"; n: number }
  | { t: "need" }
  | { t: "done"; sha256: string; size: number; directBytes: number }
  | { t: "err"; kind: "decrypt" | "corrupt" | "truncated" | "too-big" | "bomb" | "tar" | "short" | "open" | "internal"; msg: string };

function toError(kind: Extract<Msg, { t: "err" }>["kind"], msg: string, o: PayloadDecoderOptions): MemsnapError {
  switch (kind) {
    case "decrypt":
      return new MemsnapError("MEMSNAP_DECRYPT_FAILED", msg, { hint: AGE_DAMAGED_HINT });
    case "corrupt":
      return new MemsnapError("MEMSNAP_PAYLOAD_CORRUPT", `invalid zstd data: ${msg}`);
    case "truncated":
      return new MemsnapError("MEMSNAP_PAYLOAD_CORRUPT", `zstd stream is truncated: ${msg}`);
    case "too-big":
      return new MemsnapError("MEMSNAP_PAYLOAD_CORRUPT", `decompressed size exceeds the declared size (${o.maxOutputBytes} bytes)`);
    case "bomb":
      return new MemsnapError("MEMSNAP_UNSAFE_BUNDLE", `the payload decompresses past its declared ${o.scan!.tarSize} bytes`, {
        hint: "a zstd or tar bomb, or a tampered manifest: nothing was restored",
      });
    case "tar":
      return new MemsnapError("MEMSNAP_PAYLOAD_CORRUPT", `the payload is not a valid tar stream: ${msg}`, { hint: "the bundle is damaged; use another copy" });
    case "short":
      return new MemsnapError("MEMSNAP_BUNDLE_TRUNCATED", `${o.path}: ${msg}`, { path: o.path, hint: "the file was cut short, e.g. by an interrupted copy; use another copy" });
    case "open":
      return new MemsnapError("MEMSNAP_SOURCE_UNREADABLE", `cannot read bundle ${o.path}: ${msg}`, { path: o.path, hint: "check the bundle path" });
    case "internal":
      return new MemsnapError("MEMSNAP_INTERNAL", `payload decoding failed: ${msg}`);
  }
}

/**
 * The payload's tar bytes (or, with `scan`, {@link ScannedBatch}es), decoded in a worker;
 * `stored` resolves with the stored bytes' hash once all are read.
 */
export class PayloadDecoder extends Readable {
  readonly stored: Promise<StoredResult>;
  readonly #worker: Worker;
  readonly #slots: SlotPool;
  /** Without `scan`: slots copied out but not given back while the consumer is behind. */
  readonly #owed: number[] = [];
  #gone = false;
  #done = false;
  #resolveStored!: (r: StoredResult) => void;
  #rejectStored!: (e: Error) => void;

  constructor(private readonly opts: PayloadDecoderOptions) {
    // Scanning, the objects are batches of at most OUT_CHUNK bytes: the same bound in bytes.
    // (Scanning, the slots bound what is queued; the high-water mark only says when to stop asking.)
    super(opts.scan ? { objectMode: true, highWaterMark: SCAN_SLOTS } : { highWaterMark: OUT_CREDIT });
    const slots = opts.scan ? SCAN_SLOTS : OUT_CREDIT / OUT_CHUNK + 1;
    this.#slots = new SlotPool(slots, OUT_CHUNK, (slot) => {
      if (!this.#gone) this.#worker.postMessage({ t: "free", slot });
    });
    this.stored = new Promise((res, rej) => {
      this.#resolveStored = res;
      this.#rejectStored = rej;
    });
    this.stored.catch(() => undefined);
    // The worker reads through these; they are closed once it has exited (see below), so a
    // failed or abandoned decode leaves no descriptor open.
    let fd = -1;
    let dfd = -1;
    let openError = "";
    const feed = isBundleUrl(opts.path);
    if (!feed) {
      try {
        fd = openSync(opts.path, "r");
      } catch (e) {
        openError = (e as Error).message;
      }
    }
    const direct = fd >= 0 && opts.age !== null ? directIoAddon() : null;
    if (direct !== null) {
      try {
        dfd = openSync(opts.path, constants.O_RDONLY | constants.O_DIRECT);
      } catch {
        dfd = -1; // no O_DIRECT on this file system: buffered reads
      }
    }
    this.#worker = new Worker(WORKER_SOURCE, {
      eval: true,
      execArgv: [],
      resourceLimits: { maxYoungGenerationSizeMb: 4 },
      workerData: {
        bindingPath: bindingPath(), path: opts.path, offset: opts.offset, size: opts.size,
        ageKey: opts.age ? Uint8Array.from(opts.age.key) : null, ageOffset: opts.age?.offset ?? 0,
        maxOut: opts.maxOutputBytes, sealedChunk: AGE_SEALED_CHUNK, readBlock: READ_BLOCK, outChunk: OUT_CHUNK, slots, memory: this.#slots.memory,
        aeadAddon: aeadAddonPath(), directAddon: direct, fd, dfd, openError, scan: opts.scan ?? null,
        progress: opts.onStored !== undefined, feed,
      },
    });
    this.#worker.on("message", (m: Msg) => this.#onMessage(m));
    this.#worker.on("error", (e: Error) => this.#fail(new MemsnapError("MEMSNAP_INTERNAL", `payload worker failed: ${e.message}`, { cause: e })));
    this.#worker.on("exit", (code: number) => {
      for (const d of [fd, dfd]) if (d >= 0) closeSync(d);
      void this.#closeFeed();
      this.#gone = true;
      if (!this.destroyed && !this.#done) this.#fail(new MemsnapError("MEMSNAP_INTERNAL", `payload worker exited unexpectedly (code ${code})`));
    });
  }

  /** A remote bundle's payload stream, opened on the worker's first "need". */
  #feed: { file: BundleFile | null; it: AsyncIterator<Buffer> | null; busy: boolean; closed: boolean } = {
    file: null, it: null, busy: false, closed: false,
  };

  /** Post the worker the next block of a remote payload (or its end). */
  async #pull(): Promise<void> {
    const f = this.#feed;
    if (f.busy || f.closed) return;
    f.busy = true;
    try {
      if (!f.it) {
        f.file = await openBundle(this.opts.path, this.opts.fileSize);
        f.it = f.file.stream(this.opts.offset, this.opts.offset + this.opts.size)[Symbol.asyncIterator]();
      }
      const r = await f.it.next();
      if (this.#gone || f.closed) return;
      if (r.done) {
        this.#worker.postMessage({ t: "in", end: true });
        return;
      }
      // A copy of its own, moved to the worker (the chunk is the stream's to reuse).
      const ab = new ArrayBuffer(r.value.length);
      Buffer.from(ab).set(r.value);
      this.#worker.postMessage({ t: "in", buf: ab }, [ab]);
    } catch (e) {
      if (!this.#gone && !f.closed) {
        this.#fail(e instanceof MemsnapError ? e : new MemsnapError("MEMSNAP_SOURCE_UNREADABLE", `cannot read bundle ${this.opts.path}: ${(e as Error).message}`, {
          path: this.opts.path, hint: "check the bundle path", cause: e,
        }));
      }
    } finally {
      f.busy = false;
    }
  }

  async #closeFeed(): Promise<void> {
    const f = this.#feed;
    if (f.closed) return;
    f.closed = true;
    await f.it?.return?.(undefined).catch(() => undefined);
    await f.file?.close().catch(() => undefined);
  }

  #fail(e: Error): void {
    this.#rejectStored(e);
    this.#stop();
    this.destroy(e);
  }

  #stop(): void {
    if (this.#gone) return;
    this.#gone = true;
    void this.#worker.terminate().catch(() => undefined);
  }

  #onMessage(m: Msg): void {
    if (this.destroyed) return;
    switch (m.t) {
      case "out": {
        let view: Buffer;
        try {
          view = this.#slots.take(m.slot, m.len);
        } catch (e) {
          this.#fail(new MemsnapError("MEMSNAP_INTERNAL", `payload worker: ${(e as Error).message}`, { cause: e }));
          return;
        }
        if (m.ops) {
          const slots = this.#slots;
          let released = false;
          this.push({
            buf: view, ops: m.ops, release: () => {
              if (!released) slots.release(m.slot);
              released = true;
            },
          } satisfies ScannedBatch);
          return;
        }
        if (this.push(Buffer.from(view))) this.#slots.release(m.slot);
        else this.#owed.push(m.slot);
        return;
      }
      case "stored":
        this.opts.onStored?.(m.n, this.opts.size);
        return;
      case "need":
        void this.#pull();
        return;
      case "done":
        this.#done = true;
        this.#resolveStored({ sha256: m.sha256, size: m.size, directBytes: m.directBytes });
        this.#stop();
        this.push(null);
        return;
      case "err": {
        const e = toError(m.kind, m.msg, this.opts);
        if (!this.opts.scan) {
          this.#fail(e);
          return;
        }
        // In order: the reader meets the batches decoded before the failure, then the failure.
        this.#done = true;
        this.#rejectStored(e);
        this.#stop();
        this.push({ err: e } satisfies ScannedBatch);
        this.push(null);
        return;
      }
    }
  }

  override _read(): void {
    for (const slot of this.#owed.splice(0)) this.#slots.release(slot);
  }

  override _destroy(err: Error | null, cb: (e?: Error | null) => void): void {
    this.#rejectStored(err ?? new MemsnapError("MEMSNAP_INTERNAL", "payload reading stopped"));
    this.#stop();
    cb(err);
  }
}
