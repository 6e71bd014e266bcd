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
 * age: the header and payload key are made on the main thread (see age.ts
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
import { createRequire } from "node:module";
import { MemsnapError, destinationError } from "../errors.js";
import type { PayloadWritten } from "../format/container.js";
import { AEAD_LOAD_SOURCE, aeadAddonPath } from "../util/aead.js";
import { DIRECT_ALIGN, directIoAddon, memoryAddon } from "../util/directio.js";
import { WORKER_MINOR_GC_JS } from "../util/gc.js";
import { AGE_CHUNK, AGE_TAG, type AgeStreamParams } from "./age.js";

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
/** With {@link PayloadEncoderOptions.output}: batches (≤ 1 MiB each) the sink posts before the main thread has taken them. */
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
  /** Write with O_DIRECT where the native/directio addon and the file system allow it (default true; see src/util/directio.ts). */
  directIo?: boolean;
  /**
   * Instead of writing to `fd`: the sink posts the stored bytes (sealed, hashed) in order to the
   * main thread, which passes each batch to `output` (an object store upload); at most
   * OUT_UNACKED batches wait for it, so a slow `output` holds the sink, the ring and write().
   * A rejection fails the encoder with that error.
   */
  output?: (bytes: Uint8Array) => Promise<void>;
}

/**
 * Worker-source helper: native/directio's memcpy (or null: Buffer#copy). V8 copies into and out
 * of a SharedArrayBuffer with relaxed atomic word stores, several times slower than memcpy;
 * the ring's hand-over is ordered by Atomics either way (see native/directio/directio.c).
 */
const NATIVE_COPY_SOURCE = String.raw`
function nativeCopy(path) {
  if (!path) return null;
  try { return require(path).copy; } catch { return null; }
}
`;

const WORKER_SOURCE = String.raw`
"use strict";
const { parentPort, workerData: wd } = require("node:worker_threads");
${NATIVE_COPY_SOURCE}
const b = require(wd.bindingPath);
const EMPTY = Buffer.alloc(0);
let failed = false;
const T = { z: 0, ring: 0, idle: 0 }; // busy ms, for MEMSNAP_DEBUG_ENCODER

// -- output: the zstd frames go to the sink thread through a shared ring of wd.slots slots of
// wd.wBatch bytes each (the sink seals, hashes and writes them; see SINK_SOURCE). ctl: [0]
// slots published, [1] slots consumed, [2] 0 running / 1 sink failed / 2 stopped, [3 + i]
// length of slot i (0 marks the end of the stream).
const ring = Buffer.from(wd.ring);
const ctl = new Int32Array(wd.ctl);
const SLOTS = wd.slots, WB = wd.wBatch;
const COPY = nativeCopy(wd.memAddon);
let compressed = 0;
let slot = 0, wlen = 0, published = 0;
class SinkGone extends Error {}
/** Wait until slot number \`published\` is free (the sink has consumed the one it replaces). */
function acquire() {
  const t0 = now();
  for (;;) {
    if (Atomics.load(ctl, 2) !== 0) throw new SinkGone();
    const consumed = Atomics.load(ctl, 1);
    if (published - consumed < SLOTS) break;
    Atomics.wait(ctl, 1, consumed, 50);
  }
  T.ring += now() - t0;
}
function publish(len) {
  Atomics.store(ctl, 3 + slot, len);
  published++;
  Atomics.store(ctl, 0, published);
  Atomics.notify(ctl, 0);
  slot = published % SLOTS;
  wlen = 0;
}
function emit(buf) {
  compressed += buf.length;
  let off = 0;
  while (off < buf.length) {
    if (wlen === 0) acquire();
    const n = Math.min(WB - wlen, buf.length - off);
    if (COPY !== null) COPY(ring, slot * WB + wlen, buf, off, n);
    else buf.copy(ring, slot * WB + wlen, off, off + n);
    wlen += n;
    off += n;
    if (wlen === WB) publish(WB);
  }
}
function endOutput() {
  if (wlen > 0) publish(wlen);
  acquire();
  publish(0);
}

// -- zstd: the tar stream is cut into segments of wd.segBytes (and at every level change),
// each compressed as one complete frame; odd segments go to a second compressor thread (the
// "peer", started on the first one) so that both cores compress, and frames are emitted in order.
const cctx = new b.CCtx();
let level = wd.level;          // level of the segment being filled
let cctxLevel = level;
cctx.setParameter(b.CParameter.compressionLevel, level);
cctx.setParameter(b.CParameter.checksumFlag, wd.checksum ? 1 : 0);
const SEG = wd.segBytes;
// An input buffer at least this big that arrives with no segment open is compressed in place
// (see pump); smaller ones (posted early at a level change) are gathered into a segment.
const DIRECT_MIN = wd.directMin;
const DST = SEG + (SEG >> 7) + 1024; // ≥ ZSTD_compressBound(SEG)
let seg = Buffer.allocUnsafeSlow(SEG);
let segLen = 0;
let nextSeq = 0, emitSeq = 0, frames = 0;
const ready = new Map();       // seq → { buf, len, ab? } compressed frames waiting for their turn
const segFree = [];            // segment ArrayBuffers the peer gave back
const dstFree = [];            // this thread's frame buffers
let peer = null, peerBusy = 0;
const queue = [];              // input items in order: data / level / end
let finished = false;

function compressFrame(src, lvl) {
  if (lvl !== cctxLevel) { cctx.setParameter(b.CParameter.compressionLevel, lvl); cctxLevel = lvl; }
  const dst = dstFree.pop() || Buffer.allocUnsafeSlow(DST);
  const t0 = now();
  const n = cctx.compress2(dst, src);
  T.z += now() - t0;
  frames++;
  return { buf: dst, len: n, own: true };
}
function drain() {
  while (ready.has(emitSeq)) {
    const f = ready.get(emitSeq);
    ready.delete(emitSeq);
    emit(f.buf.subarray(0, f.len));
    if (f.own) dstFree.push(f.buf);
    else if (f.main) parentPort.postMessage({ t: "fack", ab: f.buf.buffer }, [f.buf.buffer]);
    else peer.postMessage({ t: "free", ab: f.buf.buffer }, [f.buf.buffer]);
    emitSeq++;
  }
}
function startPeer() {
  const { Worker } = require("node:worker_threads");
  peer = new Worker(wd.peerSource, {
    eval: true, execArgv: [], resourceLimits: { maxYoungGenerationSizeMb: 4 },
    workerData: { bindingPath: wd.bindingPath, dstBytes: DST, checksum: wd.checksum },
  });
  peer.on("message", (m) => {
    if (failed) return;
    if (m.t === "frame") {
      peerBusy--;
      frames++;
      segFree.push(m.seg);
      ready.set(m.seq, { buf: Buffer.from(m.ab, 0, DST), len: m.len, own: false });
      try { drain(); pump(); } catch (e) { fail(e, e && typeof e.code === "string" && e.syscall ? "io" : "internal"); }
    } else if (m.t === "err") {
      fail({ message: m.msg }, "internal");
    }
  });
  peer.on("error", (e) => fail(e, "internal"));
  peer.unref();
}
/** Close the filled segment; false when it must wait for the peer. */
function closeSegment() {
  if (segLen === 0) return true;
  const seq = nextSeq;
  if (seq % 2 === 1 && wd.parallel) {
    if (peerBusy >= 1) return false;
    if (!peer) startPeer();
    const ab = seg.buffer;
    peer.postMessage({ t: "seg", seq, ab, len: segLen, level }, [ab]);
    peerBusy++;
    const next = segFree.pop();
    seg = next === undefined ? Buffer.allocUnsafeSlow(SEG) : Buffer.from(next, 0, SEG);
  } else {
    ready.set(seq, compressFrame(seg.subarray(0, segLen), level));
  }
  nextSeq++;
  segLen = 0;
  drain();
  return true;
}

function pump() {
  while (!failed && !finished && queue.length > 0) {
    const m = queue[0];
    if (m.t === "data") {
      const src = Buffer.from(m.ab, 0, m.len);
      if (!wd.parallel && segLen === 0 && m.pos === 0 && m.len >= DIRECT_MIN) {
        // A whole input buffer with no segment open: compress it where it lies, as a frame of
        // its own, instead of copying it into the segment first.
        ready.set(nextSeq++, compressFrame(src, level));
        m.pos = m.len;
        drain();
      }
      while (m.pos < m.len) {
        if (segLen === SEG && !closeSegment()) return;
        const n = Math.min(SEG - segLen, m.len - m.pos);
        src.copy(seg, segLen, m.pos, m.pos + n);
        segLen += n;
        m.pos += n;
      }
      queue.shift();
      parentPort.postMessage({ t: "ack", ab: m.ab }, [m.ab]);
    } else if (m.t === "frame") {
      // A frame the main thread compressed itself (see PayloadEncoder.write): it follows the
      // bytes queued before it, so the segment being filled ends here.
      if (!closeSegment()) return;
      ready.set(nextSeq++, { buf: Buffer.from(m.ab, 0, m.len), len: m.len, own: false, main: true });
      frames++;
      queue.shift();
      drain();
    } else if (m.t === "level") {
      if (m.level !== level) {
        if (!closeSegment()) return;
        level = m.level;
      }
      queue.shift();
    } else if (m.t === "end") {
      if (!closeSegment()) return;
      if (nextSeq === 0) ready.set(nextSeq++, compressFrame(EMPTY, level)); // an empty payload is still one frame
      drain();
      if (emitSeq < nextSeq) return; // the peer still holds a frame
      queue.shift();
      finished = true;
      endOutput();
      if (peer) void peer.terminate();
      if (process.env.MEMSNAP_DEBUG_ENCODER) process.stderr.write("encoder worker busy ms: " + JSON.stringify(T) + " frames " + frames + "\n");
      parentPort.postMessage({ t: "done", compressed });
    }
  }
}

function now() { return Number(process.hrtime.bigint()) / 1e6; }
function fail(e, kind) {
  if (failed) return;
  failed = true;
  if (peer) void peer.terminate();
  if (e instanceof SinkGone) return; // the sink reported its own error, or the stream was stopped
  Atomics.store(ctl, 2, 2);
  Atomics.notify(ctl, 0);
  parentPort.postMessage({ t: "err", kind, code: e && e.code, msg: String(e && e.message) });
}

let idleSince = now();
const IDLE = [];
parentPort.on("message", (m) => {
  if (failed) return;
  if (idleSince !== null) { T.idle += now() - idleSince; idleSince = null; }
  try {
    if (m.t === "data") queue.push({ t: "data", ab: m.ab, len: m.len, pos: 0 });
    else queue.push(m);
    pump();
    if (queue.length === 0) idleSince = now();
  } catch (e) {
    fail(e, e && typeof e.code === "string" && e.syscall ? "io" : "internal");
  }
});
`;

/**
 * The sink: seals the compressed stream (age), hashes the stored bytes and writes them at their
 * offsets, slot by slot from the shared ring the payload worker fills. It does not return to
 * its event loop before the end marker (a slot of length 0): it blocks in Atomics.wait, in
 * 50 ms steps, to see a stop.
 * A write error sets ctl[2] = 1 (the payload worker then stops at its next slot) and is
 * reported with its errno code.
 */
const SINK_SOURCE = String.raw`
"use strict";
const { parentPort, workerData: wd } = require("node:worker_threads");
${NATIVE_COPY_SOURCE}
${AEAD_LOAD_SOURCE}
const crypto = require("node:crypto");
const fs = require("node:fs");
const ring = Buffer.from(wd.ring);
const ctl = new Int32Array(wd.ctl);
const SLOTS = wd.slots, WB = wd.wBatch;
const COPY = nativeCopy(wd.memAddon);
const CHUNK = wd.ageChunk, TAG = wd.ageTag;
const now = () => Number(process.hrtime.bigint()) / 1e6;
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
const hash = crypto.createHash("sha256");
let stored = 0;
let head = Buffer.alloc(0);
const ALIGN = 4096;
const CAP = WB + ALIGN;
let wbuf = null;
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
let DIO = null, W = null, spare = null, pend = null;
if (wd.dfd >= 0 && wd.directAddon) {
  try {
    DIO = require(wd.directAddon);
    // MEMSNAP_DIRECT_IO=misaligned (tests): memory one byte off, which O_DIRECT refuses (EINVAL).
    const aligned = () => Buffer.from(DIO.alignedBuffer(CAP + 1, ALIGN), process.env.MEMSNAP_DIRECT_IO === "misaligned" ? 1 : 0, CAP);
    const first = aligned();
    const lead = Buffer.from(wd.lead);
    lead.copy(first, 0);
    if (typeof DIO.writer === "function") {
      spare = aligned();
      W = DIO.writer();
    }
    wbuf = first;
    dfd = wd.dfd;
    base = wd.start - lead.length;
    wlen = lead.length;
  } catch {
    wbuf = null; // built for another ABI: buffered writes
    W = null;
  }
}
if (wbuf === null) wbuf = Buffer.allocUnsafeSlow(CAP);
/** Direct I/O off for the rest of the bundle (the descriptor is the main thread's to close). */
function stopDirect() {
  dfd = -1;
}
// -- posting mode (wd.fd < 0): the bytes go to the main thread in order, copied into
// transferred buffers; ctl[wd.ackIdx] counts the batches it has taken, and at most wd.outUnacked
// may be ahead of it (the sink waits, as for the ring, and sees a stop while it waits).
let posted = 0, postedBytes = 0;
class Stopped extends Error {}
function postOut(buf, off, len, at) {
  if (at !== wd.start + postedBytes) throw new Error("payload bytes out of order: " + at);
  while (posted - Atomics.load(ctl, wd.ackIdx) >= wd.outUnacked) {
    if (Atomics.load(ctl, 2) !== 0) throw new Stopped();
    Atomics.wait(ctl, wd.ackIdx, Atomics.load(ctl, wd.ackIdx), 50);
  }
  const ab = new ArrayBuffer(len);
  if (COPY !== null) COPY(Buffer.from(ab), 0, buf, off, len);
  else buf.copy(Buffer.from(ab), 0, off, off + len);
  parentPort.postMessage({ t: "out", ab }, [ab]);
  posted++;
  postedBytes += len;
}
function writeAt(buf, off, len, at) {
  if (wd.fd < 0) return postOut(buf, off, len, at);
  while (len > 0) {
    const n = fs.writeSync(wd.fd, buf, off, len, at);
    off += n;
    at += n;
    len -= n;
  }
}
const ERRNO_NAME = new Map(Object.entries(require("node:os").constants.errno).map(([k, v]) => [v, k]));
/** Wait for the write in flight; what O_DIRECT refused (EINVAL) goes through wd.fd, and direct I/O ends. */
function waitPending() {
  if (pend === null) return;
  const p = pend;
  pend = null;
  const [done, errno] = DIO.writerWait(W);
  directBytes += done;
  if (errno !== 0) {
    const code = ERRNO_NAME.get(errno) || "E" + errno;
    if (code !== "EINVAL") throw Object.assign(new Error(code + ": write of the bundle failed"), { code, errno: -errno, syscall: "write" });
    stopDirect();
  }
  if (done < p.n) writeAt(p.buf, done, p.n - done, p.at + done);
}
/** Write what wbuf holds; with direct I/O, all but the last partial block unless it is the final flush. */
function flushWrites(final) {
  const t0 = now();
  let n = wlen;
  if (W !== null) waitPending(); // the other buffer is free again (or direct I/O ended)
  if (W !== null && dfd >= 0 && !final) {
    n = wlen - (wlen % ALIGN);
    if (n > 0) {
      DIO.writerStart(W, dfd, wbuf.subarray(0, n), base);
      pend = { buf: wbuf, n, at: base };
      const next = spare;
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
        done = fs.writeSync(dfd, wbuf, 0, n, base);
        directBytes += done;
      } catch (e) {
        if (!e || e.code !== "EINVAL") throw e;
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
function account(buf) {
  hash.update(buf);
  if (head.length < 64) head = Buffer.concat([head, buf.subarray(0, 64 - head.length)]);
  stored += buf.length;
}
function out(buf) {
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
    if (COPY !== null) COPY(wbuf, wlen, buf, off, k); // buf may be the shared ring
    else buf.copy(wbuf, wlen, off, off + k);
    wlen += k;
    off += k;
  }
}

// collect(n): a minor GC every 4 MiB sealed (see WORKER_MINOR_GC_JS).
${WORKER_MINOR_GC_JS}
// -- age STREAM (optional): 64 KiB chunks, each sealed under the counter nonce; a full chunk
// is held back until more bytes arrive, so only the whole payload's end is flagged last.
const key = wd.ageKey ? Buffer.from(wd.ageKey) : null;
const chunk = key ? Buffer.allocUnsafeSlow(CHUNK) : null;
let used = 0, counter = 0;
const nonce = Buffer.alloc(12);
// With native/aead, each chunk is sealed straight into the write batch (no cipher object, no
// output buffer, no copy); node:crypto otherwise.
const AEAD = key ? loadAead(wd.aeadAddon) : null;
function seal(plain, last) {
  const t0 = now();
  if (AEAD !== null) {
    if (CAP - wlen < plain.length + TAG) flushWrites(false);
    const n = AEAD.seal(key, counter, last, plain, 0, plain.length, wbuf, wlen);
    account(wbuf.subarray(wlen, wlen + n));
    wlen += n;
    counter++;
    T.seal += now() - t0;
    return;
  }
  nonce.fill(0);
  nonce.writeUIntBE(counter, 5, 6);
  nonce[11] = last ? 1 : 0;
  const c = crypto.createCipheriv("chacha20-poly1305", key, nonce, { authTagLength: TAG });
  const body = c.update(plain);
  c.final();
  T.seal += now() - t0;
  out(body);
  out(c.getAuthTag());
  counter++;
  collect(plain.length);
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

let consumed = 0, taken = 0;
try {
  if (key) out(Buffer.from(wd.agePreamble));
  for (;;) {
    if (Atomics.load(ctl, 2) !== 0) break;
    if (Atomics.load(ctl, 0) === consumed) { Atomics.wait(ctl, 0, consumed, 50); continue; }
    const t0 = now();
    const i = consumed % SLOTS;
    const len = Atomics.load(ctl, 3 + i);
    if (len === 0) {
      if (key) seal(chunk.subarray(0, used), true);
      flushWrites(true);
      stopDirect();
      if (process.env.MEMSNAP_DEBUG_ENCODER) process.stderr.write("sink busy ms: " + JSON.stringify(T) + " direct bytes " + directBytes + "\n");
      parentPort.postMessage({ t: "sunk", taken, stored, sha256: hash.digest("hex"), head, directBytes });
      break;
    }
    emit(ring.subarray(i * WB, i * WB + len));
    taken += len;
    consumed++;
    Atomics.store(ctl, 1, consumed);
    Atomics.notify(ctl, 1);
    T.busy += now() - t0;
  }
} catch (e) {
  settleWrites();
  if (!(e instanceof Stopped)) parentPort.postMessage({ t: "err", kind: typeof e.code === "string" && e.syscall ? "io" : "internal", code: e.code, msg: String(e.message) });
  Atomics.store(ctl, 2, 1);
  Atomics.notify(ctl, 1);
} finally {
  settleWrites(); // also when told to stop (ctl[2]) mid-stream
}
/** Let the write in flight finish (its error is moot now); direct I/O off. */
function settleWrites() {
  if (pend !== null) try { DIO.writerWait(W); } catch {}
  pend = null;
  stopDirect();
}
`;

/** The peer compressor: whole segments in, one zstd frame each out (buffers go back and forth). */
const PEER_SOURCE = String.raw`
"use strict";
const { parentPort, workerData: wd } = require("node:worker_threads");
const b = require(wd.bindingPath);
const cctx = new b.CCtx();
let cctxLevel = -1000;
cctx.setParameter(b.CParameter.checksumFlag, wd.checksum ? 1 : 0);
const free = [];
parentPort.on("message", (m) => {
  try {
    if (m.t === "free") { free.push(m.ab); return; }
    if (m.level !== cctxLevel) { cctx.setParameter(b.CParameter.compressionLevel, m.level); cctxLevel = m.level; }
    const dst = free.length ? Buffer.from(free.pop()) : Buffer.allocUnsafeSlow(wd.dstBytes);
    const n = cctx.compress2(dst, Buffer.from(m.ab, 0, m.len));
    parentPort.postMessage({ t: "frame", seq: m.seq, ab: dst.buffer, len: n, seg: m.ab }, [dst.buffer, m.ab]);
  } catch (e) {
    parentPort.postMessage({ t: "err", msg: String(e && e.message) });
  }
});
`;

let bindingPathCache: string | undefined;
function bindingPath(): string {
  bindingPathCache ??= createRequire(import.meta.url).resolve("zstd-napi/binding");
  return bindingPathCache;
}

/** The part of zstd-napi's native compression context the main thread uses. */
interface ZstdCCtx {
  setParameter(param: number, value: number): void;
  compress2(dst: Uint8Array, src: Uint8Array): number;
}

type Msg =
  | { t: "ack"; ab: ArrayBuffer }
  | { t: "fack"; ab: ArrayBuffer }
  | { t: "done"; compressed: number }
  | { t: "sunk"; taken: number; stored: number; sha256: string; head: Uint8Array; directBytes: number }
  | { t: "err"; kind: "io" | "internal"; code?: string; msg: string }
  | { t: "out"; ab: ArrayBuffer };

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
  #levelParam = 0;
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
    // ctl: the ring's words (see WORKER_SOURCE), then the count of output batches taken.
    const ctl = new SharedArrayBuffer((3 + W_SLOTS + 1) * 4);
    this.#ctl = new Int32Array(ctl);
    this.#output = opts.output;
    const shared = {
      ring, ctl, slots: W_SLOTS, wBatch: W_BATCH, fd: opts.output ? -1 : opts.fd, start: opts.start,
      memAddon: memoryAddon(), aeadAddon: aeadAddonPath(), ackIdx: 3 + W_SLOTS, outUnacked: OUT_UNACKED,
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
      this.#sink = sink = new Worker(SINK_SOURCE, {
        eval: true,
        execArgv: [],
        resourceLimits: { maxYoungGenerationSizeMb: 4 },
        workerData: {
          ...shared, ageChunk: AGE_CHUNK, ageTag: AGE_TAG,
          ageKey: opts.age ? Uint8Array.from(opts.age.key) : null,
          agePreamble: opts.age ? Uint8Array.from(opts.age.preamble) : null,
          directAddon: dfd >= 0 ? direct : null, dfd, lead,
        },
      });
      this.#worker = new Worker(WORKER_SOURCE, {
        eval: true,
        execArgv: [],
        // The worker's JS only moves buffers: a small young generation keeps its heap small.
        resourceLimits: { maxYoungGenerationSizeMb: 4 },
        workerData: {
          ...shared, bindingPath: bindingPath(), level: opts.level, threads: opts.threads ?? 0,
          segBytes: SEG_BYTES, parallel: (opts.threads ?? 0) > 0, peerSource: PEER_SOURCE, checksum: this.#checksum,
          directMin: IN_BUF / 4,
        },
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
    this.#exited = Promise.all([this.#worker, this.#sink].map((w) => new Promise<void>((res) => w.once("exit", () => res())))).then(() => {
      if (dfd >= 0) closeSync(dfd);
    });
    for (const [w, what] of [[this.#worker, "payload worker"], [this.#sink, "payload writer"]] as const) {
      w.on("message", (m: Msg) => this.#onMessage(m));
      w.on("error", (e: Error) => this.#fail(new MemsnapError("MEMSNAP_INTERNAL", `${what} failed: ${e.message}`, { cause: e })));
      w.on("exit", (code: number) => {
        // The sink ends on its own once it has written the end of the stream and said so, or
        // when told to stop (by the payload worker, whose own error message is the one to report).
        if (w === this.#sink && (this.#sunk !== null || Atomics.load(this.#ctl, 2) === 2)) return;
        if (this.#finish !== null || this.#waiter !== null) this.#fail(new MemsnapError("MEMSNAP_INTERNAL", `${what} exited unexpectedly (code ${code})`));
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
      f?.reject(new MemsnapError("MEMSNAP_INTERNAL", `payload writer took ${this.#sunk.taken} bytes of ${this.#done.compressed}`));
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
    this.#worker.postMessage({ t: "data", ab, len: this.#len }, [ab]);
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
      this.#fail(new MemsnapError("MEMSNAP_INTERNAL", `payload encoding failed: ${(e as Error).message}`, { cause: e }));
    }
  }

  #compressHere(): void {
    if (!this.#cctx) {
      const b = createRequire(import.meta.url)(bindingPath()) as { CCtx: new () => ZstdCCtx; CParameter: Record<string, number> };
      this.#cctx = new b.CCtx();
      this.#cctx.setParameter(b.CParameter.checksumFlag!, this.#checksum ? 1 : 0);
      this.#levelParam = b.CParameter.compressionLevel!;
    }
    if (this.#cctxLevel !== this.#level) {
      this.#cctx.setParameter(this.#levelParam, this.#level);
      this.#cctxLevel = this.#level;
    }
    const ab = this.#frameFree.pop() ?? new ArrayBuffer(FRAME_BYTES);
    const len = this.#cctx.compress2(new Uint8Array(ab), this.#buf.subarray(0, this.#len));
    this.#stolen++;
    this.stolenFrames++;
    this.#worker.postMessage({ t: "frame", ab, len }, [ab]);
    this.#len = 0;
  }

  /** Resolves when another input buffer may be posted. */
  #room(): Promise<void> | undefined {
    if (this.#error) return Promise.reject(this.#error);
    if (this.#inFlight < IN_FLIGHT_BUFS || this.#stolen < STOLEN_FRAMES) return undefined;
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
        if (this.#inFlight >= IN_FLIGHT_BUFS && this.#stolen < STOLEN_FRAMES) {
          this.#steal();
          continue;
        }
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
    if (this.#error) return Promise.reject(this.#error); // compressing the last buffer here failed
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
    this.#stop();
    await Promise.all([this.#worker.terminate(), this.#sink.terminate()]).catch(() => undefined);
    await this.#exited;
  }
}
