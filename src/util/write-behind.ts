/**
 * Positional writes that run on the libuv thread pool while the caller goes on: the main
 * thread hands over a buffer and an offset and returns at once, unless `limit` bytes are
 * already in flight (then it waits for room). Measured on a scale-1 restore: the KV pages
 * written into place with `writeSync` took 1.2 s of the main thread's 3.3 s; page-cache
 * writes on this machine run at ~350 MB/s, so they are worth running beside the hashing and
 * the tar parsing rather than between them.
 *
 * One write runs per descriptor at a time; buffers queued behind it that continue one another
 * go down as one `pwritev` (at most {@link BATCH_BYTES}). Writes to different descriptors run in
 * parallel. Before, every buffer was its own pool request, so up to four threads wrote 64 KiB
 * KV pages into the same part file at once and queued on its inode lock: perf on a scale-1
 * restore showed 3.2 % of all samples spinning in `rwsem_spin_on_owner` under `pwrite64`.
 *
 * The caller must not change a buffer after handing it over. A view of a slot pool's memory
 * (the payload reader's chunks, util/slots.ts) is pinned until its write is done or dropped,
 * so its slot is not refilled under the write. Descriptors are closed through {@link close}, which waits for the
 * writes still queued or in flight on them: closing one under a pending write would let the
 * write land in whatever file reuses the number. The first error (ENOSPC, EIO) is kept and
 * thrown by the next {@link write} or by {@link drain}, with the label of the write that
 * failed; the writes queued behind a failed one are dropped.
 */
import { close as closeAsync, writev } from "node:fs";
import { pin } from "./slots.js";

/** Bytes one `pwritev` gathers from a descriptor's queue at most. */
const BATCH_BYTES = 1024 * 1024;
/** Buffers one `pwritev` gathers at most (well under IOV_MAX, 1024 on Linux). */
const BATCH_BUFS = 64;

export class WriteFailed extends Error {
  constructor(
    readonly err: NodeJS.ErrnoException,
    readonly where: string,
  ) {
    super(err.message);
  }
}

interface Queued {
  buf: Uint8Array;
  pos: number;
  where: string;
  /** Releases the buffer's slot (util/slots.ts), or null. */
  un: (() => void) | null;
}

/**
 * A descriptor's writes: those not yet started (at most `limit` bytes of them), and whether one is on the thread pool.
 */
interface Lane {
  queue: Queued[];
  busy: boolean;
}

export class WriteBehind {
  readonly #limit: number;
  #bytes = 0;
  readonly #lanes = new Map<number, Lane>();
  readonly #closing = new Set<number>();
  #closesInFlight = 0;
  #error: WriteFailed | null = null;
  readonly #room: (() => void)[] = [];
  readonly #idle: (() => void)[] = [];

  constructor(limit: number) {
    this.#limit = limit;
  }

  /**
   * Write all of `buf` at `pos` of `fd`. Returns a promise only when the caller must wait for
   * room; throws the first error of an earlier write.
   */
  write(fd: number, buf: Uint8Array, pos: number, where: string): Promise<void> | undefined {
    if (this.#error) throw this.#error;
    if (buf.length === 0) return undefined;
    this.#bytes += buf.length;
    let lane = this.#lanes.get(fd);
    if (!lane) this.#lanes.set(fd, (lane = { queue: [], busy: false }));
    lane.queue.push({ buf, pos, where, un: pin(buf) });
    if (!lane.busy) this.#pump(fd, lane);
    if (this.#bytes < this.#limit) return undefined;
    return new Promise<void>((res) => {
      this.#room.push(res);
    }).then(() => {
      if (this.#error) throw this.#error;
    });
  }

  /** Put the next run of contiguous queued buffers of `fd` on the thread pool. */
  #pump(fd: number, lane: Lane): void {
    const q = lane.queue;
    const first = q[0]!;
    const bufs = [first.buf];
    let len = first.buf.length;
    let i = 1;
    while (i < q.length && bufs.length < BATCH_BUFS && len < BATCH_BYTES && q[i]!.pos === first.pos + len) {
      bufs.push(q[i]!.buf);
      len += q[i]!.buf.length;
      i++;
    }
    const items = q.splice(0, i); // the queue holds no buffer once it is on its way (short: `limit` bytes at most)
    lane.busy = true;
    this.#gather(fd, lane, items, bufs, first.pos, len, 0, first.where);
  }

  /**
   * Write `bufs` (`len` bytes at `pos`, those of `items`) from byte `off` on; a short write goes on where it stopped.
   */
  #gather(
    fd: number,
    lane: Lane,
    items: Queued[],
    bufs: Uint8Array[],
    pos: number,
    len: number,
    off: number,
    where: string,
  ): void {
    writev(fd, off === 0 ? bufs : rest(bufs, off), pos + off, (err, n) => {
      if (!err && n > 0 && off + n < len) return this.#gather(fd, lane, items, bufs, pos, len, off + n, where);
      if (err) this.#error ??= new WriteFailed(err, where);
      else if (n === 0)
        this.#error ??= new WriteFailed(Object.assign(new Error("a write made no progress"), { code: "EIO" }), where);
      this.#bytes -= len;
      for (const it of items) it.un?.();
      if (this.#error) {
        // Drop what was queued behind: nothing more is written after the first error.
        for (const q of lane.queue) {
          this.#bytes -= q.buf.length;
          q.un?.();
        }
        lane.queue.length = 0;
      }
      if (lane.queue.length > 0) {
        this.#pump(fd, lane);
      } else {
        this.#lanes.delete(fd);
        if (this.#closing.delete(fd)) {
          this.#closesInFlight++;
          closeAsync(fd, () => {
            this.#closesInFlight--;
            this.#settled();
          });
        }
      }
      if (this.#bytes < this.#limit || this.#error) for (const r of this.#room.splice(0)) r();
      this.#settled();
    });
  }

  #settled(): void {
    if (this.#bytes === 0 && this.#closesInFlight === 0) for (const r of this.#idle.splice(0)) r();
  }

  /** Close `fd` once every write on it is done (now when none is queued or in flight). */
  close(fd: number, closeNow: (fd: number) => void): void {
    if (this.#lanes.has(fd)) this.#closing.add(fd);
    else closeNow(fd);
  }

  /** Resolves once every write (and every deferred close) is done; rejects with the first error. */
  async drain(): Promise<void> {
    if (this.#bytes > 0 || this.#closesInFlight > 0) await new Promise<void>((res) => this.#idle.push(res));
    if (this.#error) throw this.#error;
  }
}

/** `bufs` without their first `off` bytes. */
function rest(bufs: Uint8Array[], off: number): Uint8Array[] {
  const out: Uint8Array[] = [];
  for (const b of bufs) {
    if (off >= b.length) {
      off -= b.length;
      continue;
    }
    out.push(off > 0 ? b.subarray(off) : b);
    off = 0;
  }
  return out;
}
