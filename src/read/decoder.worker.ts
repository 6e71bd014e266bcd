/**
 * The decoder's worker (see ./decoder.ts): bundle file ─pread─▶ SHA-256 of the stored bytes ─▶
 * [age STREAM open] ─▶ zstd -d (bounded, into the shared slots) ─▶ [tar scan] ─▶ main thread.
 */
import { createDecipheriv, createHash, type Hash } from "node:crypto";
import { read, readSync } from "node:fs";
import { createRequire } from "node:module";
import { parentPort as port, workerData } from "node:worker_threads";
import { loadAead } from "../codecs/aead.js";
import { gcPacer } from "../util/gc.js";
import { TarScanner } from "./tar-scan.js";
import { loadZstdBinding } from "../codecs/zstd-binding.js";

/** What the decoder gives its worker. */
export interface DecoderData {
  bindingPath: string;
  path: string;
  /** Byte range of the payload member in the bundle file. */
  offset: number;
  size: number;
  /** age payload key and the offset (within the payload) of the first STREAM chunk, or null (plaintext). */
  ageKey: Uint8Array | null;
  ageOffset: number;
  maxOut: number;
  sealedChunk: number;
  readBlock: number;
  /** The output slots: `slots` of `outChunk` bytes each in `memory` (util/slots.ts). */
  outChunk: number;
  slots: number;
  memory: SharedArrayBuffer;
  aeadAddon: string | null;
  directAddon: string | null;
  /** The bundle opened by the main thread (-1: `openError`), and with O_DIRECT (-1: none). */
  fd: number;
  dfd: number;
  openError: string;
  scan: { tarSize: number } | null;
  /** Post `stored` progress messages. */
  progress: boolean;
  /** Hash the stored bytes (`done` then carries their SHA-256; else null). See PayloadDecoderOptions.hashStored. */
  hashStored: boolean;
  /** A remote bundle: the main thread streams the payload's bytes here ("need" / "in"), no fd. */
  feed: boolean;
}

/** Main thread → worker: an output slot given back. */
export type DecoderRequest =
  | { t: "free"; slot: number }
  /** A block of a remote payload (the first `len` bytes of `buf`), or its end. */
  | { t: "in"; buf?: ArrayBuffer; len?: number; end?: boolean };

export type DecoderErrorKind =
  "decrypt" | "corrupt" | "truncated" | "too-big" | "bomb" | "tar" | "short" | "open" | "internal";

/** Worker → main thread. */
export type DecoderReply =
  | { t: "out"; slot: number; len: number; ops?: (number | string)[] }
  | { t: "stored"; n: number }
  /** Ask for the next `n` blocks of a remote payload. */
  | { t: "need"; n: number }
  /** A block of a remote payload used up, moved back to be filled again. */
  | { t: "back"; buf: ArrayBuffer }
  | { t: "done"; sha256: string | null; size: number; directBytes: number }
  | { t: "err"; kind: DecoderErrorKind; msg: string };

/**
 * Plaintext (zstd input) waiting; `pooled`: the 64 KiB buffer it was opened into, to reuse; `fed`: the block of
 * a remote payload it is a view of, to move back once consumed.
 */
type Plain = Buffer & { pooled?: Buffer; fed?: ArrayBuffer };
/** A read in flight (or done) into one of the aligned buffers. */
interface DirectJob {
  from: number;
  n: number;
  lead: number;
  want: number;
  buf: Buffer;
  got: number;
  done: boolean;
  err: NodeJS.ErrnoException | null;
}

const parentPort = port!;
const wd = workerData as DecoderData;
const send = (m: DecoderReply): void => parentPort.postMessage(m);
const b = loadZstdBinding(wd.bindingPath);
const SEALED = wd.sealedChunk,
  TAG = 16;
let failed = false,
  finished = false;
// Output slots of the shared memory (see util/slots.ts) that the main thread has given back.
const freeSlots: number[] = [];
for (let i = 0; i < wd.slots; i++) freeSlots.push(i);

function fail(kind: DecoderErrorKind, msg: string): void {
  failed = true;
  // Scanning: what was decoded before the failure goes first (the reader meets its entries,
  // then the error, in payload order).
  if (scanner !== null) post();
  send({ t: "err", kind, msg });
}

// -- tar framing and per-entry SHA-256 (wd.scan; see tar-scan.ts)
// An entry is hashed here when this thread found no free slot since the previous entry began
// (the main thread is behind), by the main thread otherwise. Measured: deciding by how much
// room is left instead had this thread hashing while the main thread was mostly idle,
// waiting for its writes (batches queue up behind a write's latency, not its CPU).
let starved = false;
const scanner = wd.scan
  ? new TarScanner(
      () => createHash("sha256"),
      () => {
        const here = starved;
        starved = false;
        return here;
      },
    )
  : null;

// -- output (tar bytes), decompressed straight into a free slot; none free: wait for one
let out: Buffer | null = null,
  outSlot = -1;
let outPos = 0;
function post(): void {
  if (outPos === 0) return;
  if (scanner !== null) {
    send({ t: "out", slot: outSlot, len: outPos, ops: scanner.ops });
    scanner.ops = [];
  } else send({ t: "out", slot: outSlot, len: outPos });
  out = null;
  outPos = 0;
}

// -- zstd
const dctx = new b.DCtx();
let lastRet = 0,
  totalIn = 0,
  totalOut = 0;
const plain: Array<{ buf: Plain; pos: number }> = []; // plaintext (zstd input) waiting
function decompressSome(): boolean {
  // Returns false when no slot is free; true when everything queued was consumed.
  while (plain.length > 0) {
    const item = plain[0]!;
    for (;;) {
      if (out === null) {
        if (freeSlots.length === 0) {
          starved = true;
          return false;
        }
        outSlot = freeSlots.shift()!;
        out = Buffer.from(wd.memory, outSlot * wd.outChunk, wd.outChunk);
      }
      const end = Math.min(out.length, outPos + (wd.maxOut - totalOut) + 1);
      const dst = out.subarray(outPos, end);
      let r: [number, number, number];
      try {
        r = dctx.decompressStream(dst, item.buf.subarray(item.pos));
      } catch (e) {
        fail("corrupt", String(e && (e as Error).message));
        return false;
      }
      if (r[1] > 0 || r[2] > 0) lastRet = r[0];
      outPos += r[1];
      totalOut += r[1];
      item.pos += r[2];
      if (totalOut > wd.maxOut) {
        outPos -= r[1];
        fail("too-big", "");
        return false;
      }
      if (scanner !== null && r[1] > 0) {
        if (totalOut > wd.scan!.tarSize) {
          outPos -= r[1];
          fail("bomb", "");
          return false;
        }
        if (!scanner.scan(out, outPos - r[1], outPos)) {
          fail("tar", scanner.error!);
          return false;
        }
      }
      if (outPos === out.length) post();
      if (item.pos === item.buf.length && (r[1] < dst.length || r[0] === 0)) break;
    }
    plain.shift();
    if (item.buf.pooled !== undefined) plainFree.push(item.buf.pooled);
    if (item.buf.fed !== undefined) giveBack(item.buf.fed);
  }
  return true;
}
function feedPlain(buf: Buffer): void {
  if (buf.length === 0) return;
  totalIn += buf.length;
  plain.push({ buf, pos: 0 });
}

// A minor GC every 4 MiB opened with node:crypto: each chunk is a fresh 64 KiB Buffer, which left
// to V8's own pacing piles up as external memory.
const collect = gcPacer(4 * 1024 * 1024, "minor");
// -- age STREAM open
const key = wd.ageKey ? Buffer.from(wd.ageKey) : null;
const sealedBuf = key ? Buffer.allocUnsafeSlow(SEALED) : null;
let used = 0,
  counter = 0,
  sealedDone = false;
const nonce = Buffer.alloc(12);
// With native/aead, chunks open into recycled 64 KiB buffers (given back once zstd has
// consumed them); node:crypto otherwise (a cipher object and a fresh buffer per chunk).
const AEAD = key ? loadAead(wd.aeadAddon) : null;
const plainFree: Buffer[] = [];
function tryOpen(sealed: Buffer, last: boolean): Plain | null {
  if (AEAD !== null) {
    const p = plainFree.pop() || Buffer.allocUnsafeSlow(SEALED - TAG);
    const n = AEAD.open(key!, counter, last, sealed, 0, sealed.length, p, 0);
    if (n < 0) {
      plainFree.push(p);
      return null;
    }
    const r: Plain = p.subarray(0, n);
    r.pooled = p;
    return r;
  }
  nonce.fill(0);
  nonce.writeUIntBE(counter, 5, 6);
  nonce[11] = last ? 1 : 0;
  const d = createDecipheriv("chacha20-poly1305", key!, nonce, { authTagLength: TAG });
  d.setAuthTag(sealed.subarray(sealed.length - TAG));
  const p = d.update(sealed.subarray(0, sealed.length - TAG));
  try {
    d.final();
  } catch {
    return null;
  }
  return p;
}
function openChunk(sealed: Buffer, last: boolean): boolean {
  const p = tryOpen(sealed, last);
  if (p !== null) {
    counter++;
    feedPlain(p);
    if (AEAD === null) collect(p.length);
    return true;
  }
  if (!last && tryOpen(sealed, true) !== null) {
    fail("decrypt", "trailing data after the final age chunk (chunk " + counter + ")");
    return false;
  }
  if (last && sealed.length === SEALED && tryOpen(sealed, false) !== null) {
    fail("decrypt", "the age payload is truncated: it ends after chunk " + counter + ", which is not marked final");
    return false;
  }
  const why = last ? " (the file is truncated or damaged)" : "";
  fail("decrypt", "age payload chunk " + counter + " does not authenticate" + why);
  return false;
}
function feedSealed(data: Buffer): boolean {
  while (data.length > 0) {
    if (used === SEALED) {
      if (!openChunk(sealedBuf!, false)) return false;
      used = 0;
    }
    if (used === 0 && data.length > SEALED) {
      if (!openChunk(data.subarray(0, SEALED), false)) return false;
      data = data.subarray(SEALED);
      continue;
    }
    const n = Math.min(SEALED - used, data.length);
    data.copy(sealedBuf!, used, 0, n);
    used += n;
    data = data.subarray(n);
  }
  return true;
}
function finishSealed(): boolean {
  if (used < TAG) {
    fail(
      "decrypt",
      used === 0 && counter === 0
        ? "the age file is truncated: it has no payload after the nonce"
        : "the age file is truncated inside a chunk",
    );
    return false;
  }
  if (used === TAG && counter > 0) {
    fail("decrypt", "the age payload ends with an empty final chunk, which is invalid");
    return false;
  }
  return openChunk(sealedBuf!.subarray(0, used), true);
}

// -- the file
const hash: Hash | null = wd.hashStored ? createHash("sha256") : null;
let fd: number;
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
let direct: { fd: number; bufs: [Buffer, Buffer]; k: number; job: DirectJob | null } | null = null;
if (key && wd.dfd >= 0 && wd.directAddon) {
  try {
    // MEMSNAP_DIRECT_IO=misaligned (tests): memory one byte off, which O_DIRECT refuses (EINVAL).
    const off = process.env.MEMSNAP_DIRECT_IO === "misaligned" ? 1 : 0;
    const addon = createRequire(import.meta.url)(wd.directAddon) as {
      alignedBuffer(size: number, align: number): ArrayBuffer;
    };
    const size = wd.readBlock + 2 * ALIGN;
    const alloc = (): Buffer => Buffer.from(addon.alignedBuffer(size + off, ALIGN), off, size);
    direct = { fd: wd.dfd, bufs: [alloc(), alloc()], k: 0, job: null };
  } catch {
    direct = null;
  }
}
let waiting = false; // pump() returned to wait for a read
let directBytes = 0; // payload bytes read with O_DIRECT
function stopDirect(): void {
  direct = null;
}
/** Start reading payload bytes [from, from + n) into the next aligned buffer. */
function startDirect(from: number): void {
  const d = direct!;
  const n = Math.min(wd.readBlock, wd.size - from);
  const pos = wd.offset + from;
  const lead = pos % ALIGN;
  const want = lead + n;
  const len = Math.ceil(want / ALIGN) * ALIGN;
  const buf = d.bufs[d.k]!;
  d.k ^= 1;
  const job: DirectJob = { from, n, lead, want, buf, got: 0, done: false, err: null };
  d.job = job;
  const step = (): void =>
    read(d.fd, buf, job.got, len - job.got, pos - lead + job.got, (err, r) => {
      if (!err && r > 0 && (job.got += r) < want) return step();
      job.err = err;
      job.done = true;
      if (waiting && direct === d) {
        waiting = false;
        pump();
      }
    });
  step();
}
/**
 * The next block through O_DIRECT: its bytes, WAIT while its read is in flight, or null when
 * O_DIRECT was refused (then off for good; the block is read through wd.fd).
 */
const WAIT = 0;
function nextDirect(n: number): Buffer | typeof WAIT | null {
  const d = direct!;
  if (d.job === null) startDirect(at);
  const job = d.job!;
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
function readBlock(): boolean | typeof WAIT {
  if (wd.feed) return readFed();
  const n = Math.min(wd.readBlock, wd.size - at);
  let buf = direct ? nextDirect(n) : null;
  if (buf === WAIT) return WAIT;
  let got = buf ? buf.length : 0;
  if (buf === null) {
    buf = readBuf ? readBuf.subarray(0, n) : Buffer.allocUnsafe(n);
    while (got < n) {
      const r = readSync(fd, buf, got, n - got, wd.offset + at + got);
      if (r === 0) break;
      got += r;
    }
  }
  if (got < n) {
    fail("short", "the bundle ends inside the payload");
    return false;
  }
  return take(buf, n);
}

// -- a remote bundle (wd.feed): the main thread streams the payload's bytes and posts them here. Up to FEED_QUEUE
// blocks are queued or asked for; "need" asks for several at once, so the worker never waits on one round trip
// through a main thread busy with the entries.
const FEED_QUEUE = 8;
const inQ: Buffer[] = [];
let inEnd = false;
let requested = 0;
function ask(): void {
  const want = FEED_QUEUE - inQ.length - requested;
  if (!inEnd && want >= FEED_QUEUE / 2) {
    requested += want;
    send({ t: "need", n: want });
  }
}
/** Move a used block back to the main thread, which fills it again. */
function giveBack(ab: ArrayBuffer): void {
  parentPort.postMessage({ t: "back", buf: ab } satisfies DecoderReply, [ab]);
}
function readFed(): boolean | typeof WAIT {
  if (inQ.length === 0) {
    if (inEnd) {
      fail("short", "the bundle ends inside the payload");
      return false;
    }
    ask();
    return WAIT;
  }
  let buf = inQ.shift()!;
  ask();
  const n = Math.min(buf.length, wd.size - at);
  if (buf.length > n) buf = buf.subarray(0, n);
  const queued = plain.length;
  const ok = take(buf, n);
  // Plaintext stays queued for zstd (a view of the block: moved back once consumed); sealed bytes were opened
  // or copied out by feedSealed.
  if (plain.length > queued && plain[plain.length - 1]!.buf.buffer === buf.buffer) {
    plain[plain.length - 1]!.buf.fed = buf.buffer as ArrayBuffer;
  } else giveBack(buf.buffer as ArrayBuffer);
  return ok;
}

/** Hash a block of payload bytes and feed it on. */
function take(buf: Buffer, n: number): boolean {
  hash?.update(buf);
  const from = at;
  at += n;
  if (wd.progress) send({ t: "stored", n: at }); // a message costs both threads ~0.1 ms
  let data = buf;
  if (from < streamStart) data = buf.subarray(Math.min(n, streamStart - from));
  if (data.length === 0) return true;
  if (key) return feedSealed(data);
  feedPlain(data);
  return true;
}

function pump(): void {
  try {
    while (!failed && !finished) {
      if (!decompressSome()) return;
      if (failed) return;
      if (at < wd.size) {
        const r = readBlock();
        if (r === WAIT) {
          waiting = true;
          return;
        }
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
      if (scanner !== null && !scanner.end()) return fail("tar", scanner.error!);
      post();
      finished = true;
      stopDirect();
      send({ t: "done", sha256: hash ? hash.digest("hex") : null, size: at, directBytes });
    }
  } catch (e) {
    fail("internal", String(e && (e as Error).message));
  }
}

parentPort.on("message", (m: DecoderRequest) => {
  if (failed) return;
  if (m.t === "free") {
    freeSlots.push(m.slot);
    pump();
  } else if (m.t === "in") {
    requested = Math.max(0, requested - 1);
    if (m.end) inEnd = true;
    else if (m.buf) inQ.push(Buffer.from(m.buf, 0, m.len ?? m.buf.byteLength));
    ask();
    if (waiting) {
      waiting = false;
      pump();
    }
  }
});

fd = wd.fd;
if (!wd.feed && fd < 0) fail("open", wd.openError);
else pump();
