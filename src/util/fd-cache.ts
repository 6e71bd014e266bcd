/**
 * A bounded set of open file descriptors by key: when it is full, the one opened first is
 * closed to make room (a key asked for again later is simply reopened). For writing or
 * reading many files in turn without holding a descriptor per file.
 */
import { closeSync } from "node:fs";

export class FdCache<K> {
  readonly #fds = new Map<K, number>();
  readonly #max: number;
  readonly #close: (fd: number) => void;

  /** `close` closes an evicted descriptor (default: at once). */
  constructor(max: number, close: (fd: number) => void = closeSync) {
    this.#max = max;
    this.#close = close;
  }

  /** The open descriptor for `key`, or `open()`'s, kept from now on. */
  get(key: K, open: () => number): number {
    const fd = this.#fds.get(key);
    if (fd !== undefined) return fd;
    if (this.#fds.size >= this.#max) {
      const [oldest, ofd] = this.#fds.entries().next().value!;
      this.#fds.delete(oldest);
      this.#close(ofd);
    }
    const opened = open();
    this.#fds.set(key, opened);
    return opened;
  }

  /** Close every descriptor. */
  closeAll(): void {
    for (const fd of this.#fds.values()) this.#close(fd);
    this.#fds.clear();
  }
}
