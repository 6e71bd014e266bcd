/**
 * The worker of a zstd stream (see ./zstd.ts): compresses or decompresses what the main thread
 * posts, within the output credit it is given. Messages:
 * main → worker: `{ t: "data", ab, len }` (ab transferred), `{ t: "end" }`,
 * `{ t: "credit", n, ab? }` (ab: an output buffer given back for reuse, transferred);
 * worker → main: `{ t: "out", ab, len }` (ab transferred), `{ t: "ack", ab }` (the input
 * buffer, transferred back for reuse), `{ t: "done" }`,
 * `{ t: "err", kind: "corrupt" | "truncated" | "too-big" | "internal", msg }`.
 */
import { parentPort as port, workerData as data } from "node:worker_threads";
import { loadZstdBinding, type ZstdBinding } from "./zstd-binding.js";

/** What a zstd stream gives its worker. */
export interface ZstdWorkerData {
  mode: "compress" | "decompress";
  bindingPath: string;
  outChunk: number;
  outCredit: number;
  /** zstd `jobSize` when `threads` > 0. */
  jobSize: number;
  /** Compression only. */
  level?: number;
  threads?: number;
  checksum?: boolean;
  /** Decompression: the most output bytes (a zstd-bomb guard), or null. */
  maxOutputBytes?: number | null;
}

export type ZstdRequest =
  { t: "data"; ab: ArrayBuffer; len: number } | { t: "end" } | { t: "credit"; n: number; ab?: ArrayBuffer };

export type ZstdReply =
  | { t: "out"; ab: ArrayBuffer; len: number }
  | { t: "ack"; ab: ArrayBuffer }
  | { t: "done" }
  | { t: "err"; kind: "corrupt" | "truncated" | "too-big" | "internal"; msg: string };

type Item = { buf: Buffer; pos: number; end?: undefined } | { end: true };

const parentPort = port!;
const workerData = data as ZstdWorkerData;
const b = loadZstdBinding(workerData.bindingPath);
const OUT_CHUNK = workerData.outChunk;
const EMPTY = Buffer.alloc(0);
const compress = workerData.mode === "compress";
let credit = workerData.outCredit;
const freeOut: ArrayBuffer[] = []; // output buffers the main thread gave back
let out = Buffer.allocUnsafeSlow(OUT_CHUNK);
let outPos = 0;
const queue: Item[] = [];
let failed = false;
let cctx: InstanceType<ZstdBinding["CCtx"]> | null = null,
  dctx: InstanceType<ZstdBinding["DCtx"]> | null = null;
let lastRet = 0,
  totalIn = 0,
  totalOut = 0;
const maxOut = workerData.maxOutputBytes ?? null;

function fail(kind: Extract<ZstdReply, { t: "err" }>["kind"], msg: string): void {
  failed = true;
  queue.length = 0;
  parentPort.postMessage({ t: "err", kind, msg } satisfies ZstdReply);
}
function post(): void {
  if (outPos === 0) return;
  const ab = out.buffer as ArrayBuffer;
  parentPort.postMessage({ t: "out", ab, len: outPos } satisfies ZstdReply, [ab]);
  credit -= outPos;
  const next = freeOut.pop();
  out = next === undefined ? Buffer.allocUnsafeSlow(OUT_CHUNK) : Buffer.from(next);
  outPos = 0;
}

try {
  if (compress) {
    cctx = new b.CCtx();
    cctx.setParameter(b.CParameter.compressionLevel, workerData.level!);
    cctx.setParameter(b.CParameter.checksumFlag, workerData.checksum ? 1 : 0);
    if (workerData.threads! > 0) {
      cctx.setParameter(b.CParameter.nbWorkers, workerData.threads!);
      // zstd's default job is 4x the window (8 MiB at level 3, 32 MiB at 19) and it keeps
      // several jobs' buffers per thread; 4 MiB jobs halve that memory at no measured cost.
      cctx.setParameter(b.CParameter.jobSize, workerData.jobSize);
    }
  } else {
    dctx = new b.DCtx();
  }
} catch (e) {
  fail("internal", "zstd setup failed: " + (e && (e as Error).message));
}

// Compress queue[0] (a data item) as far as credit allows; true when fully consumed.
function compressItem(item: { buf: Buffer; pos: number }): boolean {
  while (item.pos < item.buf.length) {
    if (credit <= 0) return false;
    const r = cctx!.compressStream2(out.subarray(outPos), item.buf.subarray(item.pos), b.EndDirective.continue);
    outPos += r[1];
    item.pos += r[2];
    if (outPos === OUT_CHUNK) post();
  }
  return true;
}
// End the frame as far as credit allows; true when the frame is complete.
function compressEnd(): boolean {
  for (;;) {
    if (credit <= 0) return false;
    const r = cctx!.compressStream2(out.subarray(outPos), EMPTY, b.EndDirective.end);
    outPos += r[1];
    if (outPos === OUT_CHUNK) post();
    if (r[0] === 0) return true;
  }
}
function decompressItem(item: { buf: Buffer; pos: number }): boolean {
  for (;;) {
    if (credit <= 0) return false;
    let end = OUT_CHUNK;
    if (maxOut !== null) end = Math.min(end, outPos + (maxOut - totalOut) + 1);
    const dst = out.subarray(outPos, end);
    let r: [number, number, number];
    try {
      r = dctx!.decompressStream(dst, item.buf.subarray(item.pos));
    } catch (e) {
      fail("corrupt", String(e && (e as Error).message));
      return false;
    }
    // A call that neither reads nor writes says nothing about frame state (after a frame
    // ends, an empty call already returns the next header's size hint).
    if (r[1] > 0 || r[2] > 0) lastRet = r[0];
    outPos += r[1];
    totalOut += r[1];
    item.pos += r[2];
    if (maxOut !== null && totalOut > maxOut) {
      fail("too-big", "");
      return false;
    }
    if (outPos === OUT_CHUNK) post();
    if (item.pos === item.buf.length && (r[1] < dst.length || r[0] === 0)) return true;
  }
}

function pump(): void {
  try {
    while (!failed && queue.length > 0) {
      const item = queue[0]!;
      if (item.end) {
        if (compress) {
          if (!compressEnd()) return;
        } else if (totalIn === 0) {
          return fail("truncated", "the input is empty (no zstd frame)");
        } else if (lastRet !== 0) {
          return fail("truncated", "the input ends inside a zstd frame");
        }
        post();
        queue.shift();
        parentPort.postMessage({ t: "done" } satisfies ZstdReply);
        return;
      }
      if (!(compress ? compressItem(item) : decompressItem(item))) return;
      queue.shift();
      const ab = item.buf.buffer as ArrayBuffer;
      parentPort.postMessage({ t: "ack", ab } satisfies ZstdReply, [ab]);
    }
  } catch (e) {
    fail("internal", "zstd failed: " + (e && (e as Error).message));
  }
}

parentPort.on("message", (m: ZstdRequest) => {
  if (failed) return;
  if (m.t === "data") {
    const buf = Buffer.from(m.ab, 0, m.len);
    totalIn += buf.length;
    queue.push({ buf, pos: 0 });
  } else if (m.t === "end") {
    queue.push({ end: true });
  } else if (m.t === "credit") {
    credit += m.n;
    if (m.ab !== undefined) freeOut.push(m.ab);
  }
  pump();
});
