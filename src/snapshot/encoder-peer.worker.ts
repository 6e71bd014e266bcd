/**
 * The encoder's peer compressor (started by ./encoder.worker.ts when `threads` > 0): whole
 * segments in, one zstd frame each out (buffers go back and forth).
 */
import { parentPort as port, workerData } from "node:worker_threads";
import { loadZstdBinding } from "../codecs/zstd-binding.js";
import { applyFrameLevel } from "../codecs/zstd-profile.js";

export interface PeerData {
  bindingPath: string;
  /** Size of a frame buffer: ≥ ZSTD_compressBound(segment). */
  dstBytes: number;
  checksum: boolean;
}

/** Payload worker → peer: a segment to compress, or a frame buffer given back. */
export type PeerRequest =
  { t: "seg"; seq: number; ab: ArrayBuffer; len: number; level: number } | { t: "free"; ab: ArrayBuffer };

/** Peer → payload worker: the frame of segment `seq` (and the segment's buffer back), or a failure. */
export type PeerReply =
  { t: "frame"; seq: number; ab: ArrayBuffer; len: number; seg: ArrayBuffer } | { t: "err"; msg: string };

const parentPort = port!;
const wd = workerData as PeerData;
const b = loadZstdBinding(wd.bindingPath);
const cctx = new b.CCtx();
let cctxLevel = -1000;
cctx.setParameter(b.CParameter.checksumFlag, wd.checksum ? 1 : 0);
const free: ArrayBuffer[] = [];
parentPort.on("message", (m: PeerRequest) => {
  try {
    if (m.t === "free") {
      free.push(m.ab);
      return;
    }
    if (m.level !== cctxLevel) {
      applyFrameLevel(cctx, b.CParameter, m.level);
      cctxLevel = m.level;
    }
    const dst = free.length ? Buffer.from(free.pop()!) : Buffer.allocUnsafeSlow(wd.dstBytes);
    const n = cctx.compress2(dst, Buffer.from(m.ab, 0, m.len));
    const ab = dst.buffer as ArrayBuffer;
    parentPort.postMessage({ t: "frame", seq: m.seq, ab, len: n, seg: m.ab } satisfies PeerReply, [ab, m.ab]);
  } catch (e) {
    parentPort.postMessage({ t: "err", msg: String(e && (e as Error).message) } satisfies PeerReply);
  }
});
