/**
 * The encoder's sink (see ./encoder.ts): seals the compressed stream (age), hashes the stored
 * bytes and writes them at their offsets, slot by slot from the shared ring the payload worker
 * (./encoder.worker.ts) fills. It does not return to its event loop before the end marker (a
 * slot of length 0): it blocks in Atomics.wait, in 50 ms steps, to see a stop.
 * A write error sets ctl[2] = 1 (the payload worker then stops at its next slot) and is
 * reported with its errno code.
 */
import { createCipheriv, createHash } from "node:crypto";
import { writeSync } from "node:fs";
import { createRequire } from "node:module";
import { constants as osConstants } from "node:os";
import { parentPort as port, workerData } from "node:worker_threads";
import { loadAead } from "../codecs/aead.js";
import { nativeCopy } from "../util/directio.js";
import { gcPacer } from "../util/gc.js";
import type { EncoderReply } from "./encoder.worker.js";

/** What the encoder gives the sink. */
export interface SinkData {
  /** The ring from the payload worker (see ./encoder.worker.ts for its control words). */
  ring: SharedArrayBuffer;
  ctl: SharedArrayBuffer;
  slots: number;
  wBatch: number;
  /**
   * The bundle's temp file (the main thread's descriptor) and the payload's offset in it; fd -1:
   * post the bytes to the main thread instead (see postOut), acknowledged in ctl[ackIdx].
   */
  fd: number;
  start: number;
  ackIdx: number;
  /** Posted batches (≤ 1 MiB each) that may wait for the main thread. */
  outUnacked: number;
  memAddon: string | null;
  aeadAddon: string | null;
  ageChunk: number;
  ageTag: number;
  /** age payload key and the header bytes that precede the STREAM, or null (plaintext). */
  ageKey: Uint8Array | null;
  agePreamble: Uint8Array | null;
  /** native/directio's path and a descriptor of the file opened with O_DIRECT (-1: none). */
  directAddon: string | null;
  dfd: number;
  /** The file's bytes from the 4 KiB block boundary before `start` up to it. */
  lead: Uint8Array;
}

/** The part of native/directio the sink uses (see native/directio/directio.c). */
interface DirectIo {
  alignedBuffer(size: number, align: number): ArrayBuffer;
  writer?(): unknown;
  writerStart(w: unknown, fd: number, buf: Uint8Array, position: number): void;
  /** Bytes written and errno (0: none) of the write in flight. */
  writerWait(w: unknown): [number, number];
}

const parentPort = port!;
const wd = workerData as SinkData;
const post = (m: EncoderReply): void => parentPort.postMessage(m);
const ring = Buffer.from(wd.ring);
const ctl = new Int32Array(wd.ctl);
const SLOTS = wd.slots,
  WB = wd.wBatch;
const COPY = nativeCopy(wd.memAddon);
const CHUNK = wd.ageChunk,
  TAG = wd.ageTag;
const now = (): number => Number(process.hrtime.bigint()) / 1e6;
const T = { seal: 0, write: 0, busy: 0 };

// -- output: SHA-256 of the stored bytes, the first 64 of them, batched positional writes.
// wbuf holds the file's bytes [base, base + wlen). With direct I/O (wd.dfd: the main thread
// opened the file again with O_DIRECT, Linux with native/directio built), wbuf is page-aligned
// memory and base starts at the 4 KiB block holding the payload's first byte (the bytes of
// that block before it, the bundle's tar header, come read back in wd.lead), so whole blocks
// go out with O_DIRECT through wd.dfd, bypassing the page cache; the last partial block is
// written through wd.fd. A file system or device that refuses O_DIRECT (EINVAL: an alignment
// it does not take) turns it off for the rest of the bundle, and the same bytes go through
// wd.fd. Both descriptors belong to the main thread, which closes wd.dfd once this thread has
// exited (and the writer thread below with it), however it ended.
const hash = createHash("sha256");
let stored = 0;
let head = Buffer.alloc(0);
const ALIGN = 4096;
const CAP = WB + ALIGN;
let directBuf: Buffer | null = null;
let dfd = -1;
let base = wd.start;
let wlen = 0;
let directBytes = 0; // written with O_DIRECT
// With direct I/O, two aligned buffers and the addon's writer thread (native/directio
// writer()): a batch's whole blocks are written on that thread while the next batch is sealed
// into the other buffer. An O_DIRECT write returns only once the device has the bytes, and
// with one buffer the sink stood still for each (~0.6 s per 550 MB bundle on the bench
// machine; the payload worker then waited for ring slots). pend: the write in flight
// ({ buf, n, at }), waited for before its buffer is filled again.
let DIO: DirectIo | null = null,
  W: unknown = null,
  spare: Buffer | null = null;
let pend: { buf: Buffer; n: number; at: number } | null = null;
if (wd.dfd >= 0 && wd.directAddon) {
  try {
    const dio = createRequire(import.meta.url)(wd.directAddon) as DirectIo;
    DIO = dio;
    // MEMSNAP_DIRECT_IO=misaligned (tests): memory one byte off, which O_DIRECT refuses (EINVAL).
    const aligned = (): Buffer =>
      Buffer.from(dio.alignedBuffer(CAP + 1, ALIGN), process.env.MEMSNAP_DIRECT_IO === "misaligned" ? 1 : 0, CAP);
    const first = aligned();
    const lead = Buffer.from(wd.lead);
    lead.copy(first, 0);
    if (typeof dio.writer === "function") {
      spare = aligned();
      W = dio.writer();
    }
    directBuf = first;
    dfd = wd.dfd;
    base = wd.start - lead.length;
    wlen = lead.length;
  } catch {
    directBuf = null; // built for another ABI: buffered writes
    W = null;
  }
}
let wbuf: Buffer = directBuf ?? Buffer.allocUnsafeSlow(CAP);
/** Direct I/O off for the rest of the bundle (the descriptor is the main thread's to close). */
function stopDirect(): void {
  dfd = -1;
}
// -- posting mode (wd.fd < 0): the bytes go to the main thread in order, copied into
// transferred buffers; ctl[wd.ackIdx] counts the batches it has taken, and at most
// wd.outUnacked may be ahead of it (the sink waits, as for the ring, and sees a stop meanwhile).
let posted = 0,
  postedBytes = 0;
class Stopped extends Error {}
function postOut(buf: Buffer, off: number, len: number, at: number): void {
  if (at !== wd.start + postedBytes) throw new Error(`payload bytes out of order: ${at}`);
  for (;;) {
    const acked = Atomics.load(ctl, wd.ackIdx);
    if (posted - acked < wd.outUnacked) break;
    if (Atomics.load(ctl, 2) !== 0) throw new Stopped();
    Atomics.wait(ctl, wd.ackIdx, acked, 50);
  }
  const ab = new ArrayBuffer(len);
  const dst = Buffer.from(ab);
  if (COPY !== null)
    COPY(dst, 0, buf, off, len); // buf may be the shared ring
  else buf.copy(dst, 0, off, off + len);
  parentPort.postMessage({ t: "out", ab } satisfies EncoderReply, [ab]);
  posted++;
  postedBytes += len;
}
function writeAt(buf: Buffer, off: number, len: number, at: number): void {
  if (wd.fd < 0) return postOut(buf, off, len, at);
  while (len > 0) {
    const n = writeSync(wd.fd, buf, off, len, at);
    off += n;
    at += n;
    len -= n;
  }
}
const ERRNO_NAME = new Map(Object.entries(osConstants.errno).map(([k, v]) => [v, k]));
/** Wait for the write in flight; what O_DIRECT refused (EINVAL) goes through wd.fd, and direct I/O ends. */
function waitPending(): void {
  if (pend === null) return;
  const p = pend;
  pend = null;
  const [done, errno] = DIO!.writerWait(W);
  directBytes += done;
  if (errno !== 0) {
    const code = ERRNO_NAME.get(errno) || "E" + errno;
    if (code !== "EINVAL") {
      throw Object.assign(new Error(code + ": write of the bundle failed"), { code, errno: -errno, syscall: "write" });
    }
    stopDirect();
  }
  if (done < p.n) writeAt(p.buf, done, p.n - done, p.at + done);
}
/** Write what wbuf holds; with direct I/O, all but the last partial block unless it is the final flush. */
function flushWrites(final: boolean): void {
  const t0 = now();
  let n = wlen;
  if (W !== null) waitPending(); // the other buffer is free again (or direct I/O ended)
  if (W !== null && dfd >= 0 && !final) {
    n = wlen - (wlen % ALIGN);
    if (n > 0) {
      DIO!.writerStart(W, dfd, wbuf.subarray(0, n), base);
      pend = { buf: wbuf, n, at: base };
      const next = spare!;
      spare = wbuf;
      if (n < wlen) wbuf.copy(next, 0, n, wlen); // the partial block starts the other buffer
      wbuf = next;
      base += n;
      wlen -= n;
    }
    T.write += now() - t0;
    return;
  }
  if (dfd >= 0) {
    n = wlen - (wlen % ALIGN);
    let done = 0;
    if (n > 0) {
      try {
        done = writeSync(dfd, wbuf, 0, n, base);
        directBytes += done;
      } catch (e) {
        if (!e || (e as NodeJS.ErrnoException).code !== "EINVAL") throw e;
        stopDirect();
        n = wlen;
      }
    }
    if (done < n) writeAt(wbuf, done, n - done, base + done); // a short direct write, or none
    if (final && n < wlen) {
      writeAt(wbuf, n, wlen - n, base + n);
      n = wlen;
    }
  } else {
    writeAt(wbuf, 0, wlen, base);
  }
  if (n < wlen) wbuf.copy(wbuf, 0, n, wlen); // the partial block waits for the next batch
  base += n;
  wlen -= n;
  T.write += now() - t0;
}
/** Account stored bytes: the SHA-256, the first 64 bytes, the count. */
function account(buf: Buffer): void {
  hash.update(buf);
  if (head.length < 64) head = Buffer.concat([head, buf.subarray(0, 64 - head.length)]);
  stored += buf.length;
}
function out(buf: Buffer): void {
  if (buf.length === 0) return;
  account(buf);
  if (dfd < 0 && wlen === 0 && buf.length >= WB) {
    const t0 = now();
    writeAt(buf, 0, buf.length, base); // a whole slot (plaintext): straight from the ring
    base += buf.length;
    T.write += now() - t0;
    return;
  }
  for (let off = 0; off < buf.length;) {
    if (wlen === CAP) flushWrites(false);
    const k = Math.min(CAP - wlen, buf.length - off);
    if (COPY !== null)
      COPY(wbuf, wlen, buf, off, k); // buf may be the shared ring
    else buf.copy(wbuf, wlen, off, off + k);
    wlen += k;
    off += k;
  }
}

// A minor GC every 4 MiB sealed with node:crypto: each chunk is a fresh 64 KiB Buffer (node:crypto
// has no update-into), which left to V8's own pacing piles up as external memory (measured:
// +38 MiB of peak RSS on a 1 GiB snapshot).
const collect = gcPacer(4 * 1024 * 1024, "minor");
// -- age STREAM (optional): 64 KiB chunks, each sealed under the counter nonce; a full chunk
// is held back until more bytes arrive, so only the whole payload's end is flagged last.
const key = wd.ageKey ? Buffer.from(wd.ageKey) : null;
const chunk = key ? Buffer.allocUnsafeSlow(CHUNK) : null;
let used = 0,
  counter = 0;
const nonce = Buffer.alloc(12);
// With native/aead, each chunk is sealed straight into the write batch (no cipher object, no
// output buffer, no copy); node:crypto otherwise.
const AEAD = key ? loadAead(wd.aeadAddon) : null;
function seal(plain: Buffer, last: boolean): void {
  const t0 = now();
  if (AEAD !== null) {
    if (CAP - wlen < plain.length + TAG) flushWrites(false);
    const n = AEAD.seal(key!, counter, last, plain, 0, plain.length, wbuf, wlen);
    account(wbuf.subarray(wlen, wlen + n));
    wlen += n;
    counter++;
    T.seal += now() - t0;
    return;
  }
  nonce.fill(0);
  nonce.writeUIntBE(counter, 5, 6);
  nonce[11] = last ? 1 : 0;
  const c = createCipheriv("chacha20-poly1305", key!, nonce, { authTagLength: TAG });
  const body = c.update(plain);
  c.final();
  T.seal += now() - t0;
  out(body);
  out(c.getAuthTag());
  counter++;
  collect(plain.length);
}
function emit(data: Buffer): void {
  if (!key) return out(data);
  while (data.length > 0) {
    if (used === CHUNK) {
      seal(chunk!, false);
      used = 0;
    }
    if (used === 0 && data.length > CHUNK) {
      seal(data.subarray(0, CHUNK), false);
      data = data.subarray(CHUNK);
      continue;
    }
    const n = Math.min(CHUNK - used, data.length);
    data.copy(chunk!, used, 0, n);
    used += n;
    data = data.subarray(n);
  }
}

let consumed = 0,
  taken = 0;
try {
  if (key) out(Buffer.from(wd.agePreamble!));
  for (;;) {
    if (Atomics.load(ctl, 2) !== 0) break;
    if (Atomics.load(ctl, 0) === consumed) {
      Atomics.wait(ctl, 0, consumed, 50);
      continue;
    }
    const t0 = now();
    const i = consumed % SLOTS;
    const len = Atomics.load(ctl, 3 + i);
    if (len === 0) {
      if (key) seal(chunk!.subarray(0, used), true);
      flushWrites(true);
      stopDirect();
      if (process.env.MEMSNAP_DEBUG_ENCODER) {
        process.stderr.write("sink busy ms: " + JSON.stringify(T) + " direct bytes " + directBytes + "\n");
      }
      post({ t: "sunk", taken, stored, sha256: hash.digest("hex"), head, directBytes });
      break;
    }
    emit(ring.subarray(i * WB, i * WB + len));
    taken += len;
    consumed++;
    Atomics.store(ctl, 1, consumed);
    Atomics.notify(ctl, 1);
    T.busy += now() - t0;
  }
} catch (err) {
  const e = err as NodeJS.ErrnoException;
  settleWrites();
  const kind = typeof e.code === "string" && e.syscall ? "io" : "internal";
  // Stopped: told to stop while waiting for the main thread, whose error is the one to report.
  if (!(err instanceof Stopped)) post({ t: "err", kind, code: e.code, msg: String(e.message) });
  Atomics.store(ctl, 2, 1);
  Atomics.notify(ctl, 1);
} finally {
  settleWrites(); // also when told to stop (ctl[2]) mid-stream
}
/** Let the write in flight finish (its error is moot now); direct I/O off. */
function settleWrites(): void {
  if (pend !== null)
    try {
      DIO!.writerWait(W);
    } catch {
      /* moot */
    }
  pend = null;
  stopDirect();
}
