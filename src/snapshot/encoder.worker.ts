/**
 * The payload worker of the encoder (./encoder.ts): tar bytes in, zstd frames out into the
 * shared ring that the sink (./encoder-sink.worker.ts) drains. Started from its compiled file
 * (util/worker-path.ts); everything it needs comes in workerData.
 */
import { Worker, parentPort as port, workerData } from "node:worker_threads";
import { nativeCopy } from "../util/directio.js";
import { loadZstdBinding } from "../codecs/zstd-binding.js";
import type { PeerData, PeerReply, PeerRequest } from "./encoder-peer.worker.js";
import { applyFrameLevel } from "../codecs/zstd-profile.js";

/** What the encoder gives the payload worker. */
export interface PayloadWorkerData {
  /** The ring to the sink: `slots` slots of `wBatch` bytes; `ctl` its control words (see below). */
  ring: SharedArrayBuffer;
  ctl: SharedArrayBuffer;
  slots: number;
  wBatch: number;
  /** native/directio's path, for its memcpy (null: Buffer#copy). */
  memAddon: string | null;
  bindingPath: string;
  level: number;
  segBytes: number;
  /** Odd segments go to a peer compressor thread, started from `peerUrl`. */
  parallel: boolean;
  peerUrl: string;
  /** zstd frame checksums on. */
  checksum: boolean;
  /** An input buffer at least this big that arrives with no segment open is compressed in place. */
  directMin: number;
}

/** Main thread → payload worker. */
export type PayloadRequest =
  /** `cuts`: ascending offsets in the buffer where a zstd frame must end (see PayloadEncoder.cut). */
  | { t: "data"; ab: ArrayBuffer; len: number; cuts?: number[] }
  | { t: "frame"; ab: ArrayBuffer; len: number }
  | { t: "level"; level: number }
  | { t: "end" };

/** Payload worker (and sink) → main thread. */
export type EncoderReply =
  | { t: "ack"; ab: ArrayBuffer }
  | { t: "fack"; ab: ArrayBuffer }
  | { t: "done"; compressed: number }
  | { t: "sunk"; taken: number; stored: number; sha256: string; head: Uint8Array; directBytes: number }
  | { t: "err"; kind: "io" | "internal"; code?: string; msg: string }
  /** The sink's stored bytes, in order, when it posts them instead of writing a file (SinkData.fd < 0). */
  | { t: "out"; ab: ArrayBuffer };

type Queued =
  | { t: "data"; ab: ArrayBuffer; len: number; pos: number; cuts: number[] | undefined; ci: number }
  | Exclude<PayloadRequest, { t: "data" }>;
/**
 * A compressed frame waiting for its turn: `own` buffers are this thread's, `main` ones go back
 * to the main thread, others to the peer.
 */
interface Frame {
  buf: Buffer;
  len: number;
  own: boolean;
  main?: boolean;
}

const parentPort = port!;
const wd = workerData as PayloadWorkerData;
const b = loadZstdBinding(wd.bindingPath);
const EMPTY = Buffer.alloc(0);
let failed = false;
const T = { z: 0, ring: 0, idle: 0 }; // busy ms, for MEMSNAP_DEBUG_ENCODER

// -- output: the zstd frames go to the sink thread through a shared ring of wd.slots slots of
// wd.wBatch bytes each (the sink seals, hashes and writes them; see encoder-sink.worker.ts). ctl:
// [0] slots published, [1] slots consumed, [2] 0 running / 1 sink failed / 2 stopped, [3 + i]
// length of slot i (0 marks the end of the stream).
const ring = Buffer.from(wd.ring);
const ctl = new Int32Array(wd.ctl);
const SLOTS = wd.slots,
  WB = wd.wBatch;
const COPY = nativeCopy(wd.memAddon);
let compressed = 0;
let slot = 0,
  wlen = 0,
  published = 0;
class SinkGone extends Error {}
/** Wait until slot number `published` is free (the sink has consumed the one it replaces). */
function acquire(): void {
  const t0 = now();
  for (;;) {
    if (Atomics.load(ctl, 2) !== 0) throw new SinkGone();
    const consumed = Atomics.load(ctl, 1);
    if (published - consumed < SLOTS) break;
    Atomics.wait(ctl, 1, consumed, 50);
  }
  T.ring += now() - t0;
}
function publish(len: number): void {
  Atomics.store(ctl, 3 + slot, len);
  published++;
  Atomics.store(ctl, 0, published);
  Atomics.notify(ctl, 0);
  slot = published % SLOTS;
  wlen = 0;
}
function emit(buf: Buffer): void {
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
function endOutput(): void {
  if (wlen > 0) publish(wlen);
  acquire();
  publish(0);
}

// -- zstd: the tar stream is cut into segments of wd.segBytes (and at every level change),
// each compressed as one complete frame; odd segments go to a second compressor thread (the
// "peer", started on the first one) so that both cores compress, and frames are emitted in order.
const cctx = new b.CCtx();
let level = wd.level; // level of the segment being filled
let cctxLevel = level;
applyFrameLevel(cctx, b.CParameter, level);
cctx.setParameter(b.CParameter.checksumFlag, wd.checksum ? 1 : 0);
const SEG = wd.segBytes;
// An input buffer at least this big that arrives with no segment open is compressed in place
// (see pump); smaller ones (posted early at a level change) are gathered into a segment.
const DIRECT_MIN = wd.directMin;
const DST = SEG + (SEG >> 7) + 1024; // ≥ ZSTD_compressBound(SEG)
let seg = Buffer.allocUnsafeSlow(SEG);
let segLen = 0;
let nextSeq = 0,
  emitSeq = 0,
  frames = 0;
const ready = new Map<number, Frame>(); // seq → compressed frames waiting for their turn
const segFree: ArrayBuffer[] = []; // segment ArrayBuffers the peer gave back
const dstFree: Buffer[] = []; // this thread's frame buffers
let peer: Worker | null = null,
  peerBusy = 0;
const queue: Queued[] = []; // input items in order: data / frame / level / end
let finished = false;

function compressFrame(src: Buffer, lvl: number): Frame {
  if (lvl !== cctxLevel) {
    applyFrameLevel(cctx, b.CParameter, lvl);
    cctxLevel = lvl;
  }
  const dst = dstFree.pop() || Buffer.allocUnsafeSlow(DST);
  const t0 = now();
  const n = cctx.compress2(dst, src);
  T.z += now() - t0;
  frames++;
  return { buf: dst, len: n, own: true };
}
function drain(): void {
  while (ready.has(emitSeq)) {
    const f = ready.get(emitSeq)!;
    ready.delete(emitSeq);
    emit(f.buf.subarray(0, f.len));
    const ab = f.buf.buffer as ArrayBuffer;
    if (f.own) dstFree.push(f.buf);
    else if (f.main) parentPort.postMessage({ t: "fack", ab } satisfies EncoderReply, [ab]);
    else peer!.postMessage({ t: "free", ab } satisfies PeerRequest, [ab]);
    emitSeq++;
  }
}
function startPeer(): void {
  const p = new Worker(new URL(wd.peerUrl), {
    execArgv: [],
    resourceLimits: { maxYoungGenerationSizeMb: 4 },
    workerData: { bindingPath: wd.bindingPath, dstBytes: DST, checksum: wd.checksum } satisfies PeerData,
  });
  peer = p;
  p.on("message", (m: PeerReply) => {
    if (failed) return;
    if (m.t === "frame") {
      peerBusy--;
      frames++;
      segFree.push(m.seg);
      ready.set(m.seq, { buf: Buffer.from(m.ab, 0, DST), len: m.len, own: false });
      try {
        drain();
        pump();
      } catch (e) {
        fail(e, errKind(e));
      }
    } else if (m.t === "err") {
      fail({ message: m.msg }, "internal");
    }
  });
  p.on("error", (e) => fail(e, "internal"));
  p.unref();
}
/** Close the filled segment; false when it must wait for the peer. */
function closeSegment(): boolean {
  if (segLen === 0) return true;
  const seq = nextSeq;
  if (seq % 2 === 1 && wd.parallel) {
    if (peerBusy >= 1) return false;
    if (!peer) startPeer();
    const ab = seg.buffer;
    peer!.postMessage({ t: "seg", seq, ab, len: segLen, level } satisfies PeerRequest, [ab]);
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

function pump(): void {
  while (!failed && !finished && queue.length > 0) {
    const m = queue[0]!;
    if (m.t === "data") {
      const src = Buffer.from(m.ab, 0, m.len);
      const cuts = m.cuts;
      for (;;) {
        // A cut reached ends the segment being filled (a frame of its own: a KV page's byte plane).
        while (cuts !== undefined && m.ci < cuts.length && cuts[m.ci]! <= m.pos) {
          if (!closeSegment()) return;
          m.ci++;
        }
        if (m.pos >= m.len) break;
        const stop = cuts !== undefined && m.ci < cuts.length ? cuts[m.ci]! : m.len;
        if (!wd.parallel && segLen === 0 && stop - m.pos >= DIRECT_MIN) {
          // A stretch with no segment open, up to a cut or the buffer's end: compress it where it
          // lies, as a frame of its own, instead of copying it into the segment first.
          ready.set(nextSeq++, compressFrame(src.subarray(m.pos, stop), level));
          m.pos = stop;
          drain();
          continue;
        }
        while (m.pos < stop) {
          if (segLen === SEG && !closeSegment()) return;
          const n = Math.min(SEG - segLen, stop - m.pos);
          src.copy(seg, segLen, m.pos, m.pos + n);
          segLen += n;
          m.pos += n;
        }
      }
      queue.shift();
      parentPort.postMessage({ t: "ack", ab: m.ab } satisfies EncoderReply, [m.ab]);
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
      if (process.env.MEMSNAP_DEBUG_ENCODER) {
        process.stderr.write("encoder worker busy ms: " + JSON.stringify(T) + " frames " + frames + "\n");
      }
      parentPort.postMessage({ t: "done", compressed } satisfies EncoderReply);
    }
  }
}

function now(): number {
  return Number(process.hrtime.bigint()) / 1e6;
}
/** "io" for a failed system call (it carries its errno code), else "internal". */
function errKind(e: unknown): "io" | "internal" {
  const x = e as { code?: unknown; syscall?: unknown } | null;
  return x && typeof x.code === "string" && x.syscall ? "io" : "internal";
}
function fail(e: unknown, kind: "io" | "internal"): void {
  if (failed) return;
  failed = true;
  if (peer) void peer.terminate();
  if (e instanceof SinkGone) return; // the sink reported its own error, or the stream was stopped
  Atomics.store(ctl, 2, 2);
  Atomics.notify(ctl, 0);
  const x = e as { code?: string; message?: unknown } | null;
  parentPort.postMessage({ t: "err", kind, code: x?.code, msg: String(x && x.message) } as EncoderReply);
}

let idleSince: number | null = now();
parentPort.on("message", (m: PayloadRequest) => {
  if (failed) return;
  if (idleSince !== null) {
    T.idle += now() - idleSince;
    idleSince = null;
  }
  try {
    if (m.t === "data") queue.push({ t: "data", ab: m.ab, len: m.len, pos: 0, cuts: m.cuts, ci: 0 });
    else queue.push(m);
    pump();
    if (queue.length === 0) idleSince = now();
  } catch (e) {
    fail(e, errKind(e));
  }
});
