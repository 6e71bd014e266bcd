/**
 * Positional writes that run on the libuv thread pool while the caller goes on: the main
 * thread hands over a buffer and an offset and returns at once, unless `limit` bytes are
 * already in flight (then it waits for room). Measured on a scale-1 restore: the KV pages
 * written into place with `writeSync` took 1.2 s of the main thread's 3.3 s; page-cache
 * writes on this machine run at ~350 MB/s, so they are worth running beside the hashing and
 * the tar parsing rather than between them.
 *
 * The caller must not change a buffer after handing it over (the payload reader's chunks are
 * fresh and never reused). Descriptors are closed through {@link close}, which waits for the
 * writes still in flight on them: closing one under a pending write would let the write land
 * in whatever file reuses the number. The first error (ENOSPC, EIO) is kept and thrown by the
 * next {@link write} or by {@link drain}, with the label of the write that failed.
 */
import { close as closeAsync, write } from "node:fs";

export class WriteFailed extends Error {
  constructor(readonly err: NodeJS.ErrnoException, readonly where: string) {
    super(err.message);
  }
}

export class WriteBehind {
  readonly #limit: number;
  #bytes = 0;
  readonly #pending = new Map<number, number>();
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
    this.#pending.set(fd, (this.#pending.get(fd) ?? 0) + 1);
    const go = (off: number): void => {
      write(fd, buf, off, buf.length - off, pos + off, (err, n) => {
        if (!err && n > 0 && off + n < buf.length) return go(off + n);
        if (err) this.#error ??= new WriteFailed(err, where);
        else if (n === 0) this.#error ??= new WriteFailed(Object.assign(new Error("a write made no progress"), { code: "EIO" }), where);
        this.#done(fd, buf.length);
      });
    };
    go(0);
    if (this.#bytes < this.#limit) return undefined;
    return new Promise<void>((res) => { this.#room.push(res); }).then(() => {
      if (this.#error) throw this.#error;
    });
  }

  #done(fd: number, len: number): void {
    this.#bytes -= len;
    const left = this.#pending.get(fd)! - 1;
    if (left > 0) this.#pending.set(fd, left);
    else {
      this.#pending.delete(fd);
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
  }

  #settled(): void {
    if (this.#bytes === 0 && this.#closesInFlight === 0) for (const r of this.#idle.splice(0)) r();
  }

  /** Close `fd` once every write on it is done (now when none is in flight). */
  close(fd: number, closeNow: (fd: number) => void): void {
    if (this.#pending.has(fd)) this.#closing.add(fd);
    else closeNow(fd);
  }

  /** Resolves once every write (and every deferred close) is done; rejects with the first error. */
  async drain(): Promise<void> {
    if (this.#bytes > 0 || this.#closesInFlight > 0) await new Promise<void>((res) => this.#idle.push(res));
    if (this.#error) throw this.#error;
  }
}
