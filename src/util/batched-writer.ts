/**
 * Text appended to a file in batches: strings are joined in memory up to about `batch`
 * characters, then written with one positional-free `writeSync` loop. The file is opened on the
 * first flush (by `open`, which may throw its own error); a write error is
 * MEMSNAP_DEST_* for `path`. Used for the spill files and maps that grow with the number of
 * artifacts (a KV layer's index at capture, a restore spool's map), never held whole.
 */
import { closeSync, writeSync } from "node:fs";
import { destinationError } from "../errors.js";

export class BatchedWriter {
  #fd: number | null = null;
  #parts: string[] = [];
  #chars = 0;

  constructor(
    private readonly open: () => number,
    readonly path: string,
    private readonly batch = 64 * 1024,
  ) {}

  write(s: string): void {
    this.#parts.push(s);
    this.#chars += s.length;
    if (this.#chars >= this.batch) this.flush();
  }

  /** Write what is pending (opening the file if it is not yet). */
  flush(): void {
    this.#fd ??= this.open();
    if (this.#chars === 0) return;
    const buf = Buffer.from(this.#parts.join(""), "utf8");
    this.#parts = [];
    this.#chars = 0;
    try {
      let off = 0;
      while (off < buf.length) off += writeSync(this.#fd, buf, off, buf.length - off);
    } catch (e) {
      throw destinationError(e, this.path);
    }
  }

  /** Close the file, dropping anything not flushed (call flush() first to keep it). */
  close(): void {
    if (this.#fd !== null) closeSync(this.#fd);
    this.#fd = null;
    this.#parts = [];
    this.#chars = 0;
  }
}
