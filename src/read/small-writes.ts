/**
 * A restore's small files created and written in batches on the thread pool (the
 * native/directio addon's writeFiles): each file is a new one (O_EXCL, O_NOFOLLOW, mode 0600,
 * as the synchronous path makes it), its bytes copied out of the decoder's shared memory into
 * the batch. Why: restoring 20,000 notes spent ~0.4 s of the main thread in open, write and
 * close, while the main thread also hashes and parses the payload. Without the addon (or with
 * `MEMSNAP_NATIVE=0`) extract.ts writes each file synchronously as before; the files are the same.
 *
 * A file's failure surfaces at the next add() or at flush(), whichever comes first after its
 * batch finished: an existing path (a duplicate or conflicting entry) is MEMSNAP_UNSAFE_PATH,
 * anything else MEMSNAP_DEST_*. A caller must flush() before anything reads the files (a
 * layer's rebuild) and before it reports the restore done.
 */
import { destinationError } from "../errors.js";
import { getSystemErrorName } from "node:util";
import { nativeFs, type NativeFs } from "../util/native-fs.js";
import { conflictingEntry } from "../format/safe-path.js";

/** Files and bytes per batch, and batches in flight before add() makes its caller wait. */
const BATCH_FILES = 256;
const BATCH_BYTES = 1 << 20;
const IN_FLIGHT = 2;

interface Batch {
  dests: string[];
  names: string[];
  data: Buffer;
  used: number;
  offsets: number[];
}

export class SmallFileWriter {
  readonly #native: NativeFs;
  #batch: Batch | null = null;
  readonly #inFlight: Promise<void>[] = [];
  #failure: Error | null = null;
  /**
   * Batch buffers to reuse: a fresh 1 MiB per batch was external memory that only a GC freed (200,000 notes: +80 MiB of
   * RSS).
   */
  readonly #free: Buffer[] = [];

  private constructor(native: NativeFs) {
    this.#native = native;
  }

  /** A writer, or null when the addon is not there (the caller writes synchronously). */
  static create(): SmallFileWriter | null {
    const native = nativeFs();
    return native ? new SmallFileWriter(native) : null;
  }

  /**
   * Queue `dest` (payload entry `name`) with the `n` bytes of `parts`, copied before this
   * returns (the caller may release them then). Returns a promise to wait for when IN_FLIGHT
   * batches are being written, else null.
   */
  add(dest: string, name: string, parts: readonly Uint8Array[], n: number): Promise<void> | null {
    if (this.#failure) throw this.#failure;
    if (this.#batch && (this.#batch.dests.length === BATCH_FILES || this.#batch.used + n > this.#batch.data.length))
      this.#submit();
    const b = (this.#batch ??= {
      dests: [],
      names: [],
      data: n <= BATCH_BYTES ? (this.#free.pop() ?? Buffer.allocUnsafe(BATCH_BYTES)) : Buffer.allocUnsafe(n),
      used: 0,
      offsets: [0],
    });
    for (const p of parts) {
      b.data.set(p, b.used);
      b.used += p.length;
    }
    b.dests.push(dest);
    b.names.push(name);
    b.offsets.push(b.used);
    return this.#inFlight.length >= IN_FLIGHT ? this.#drain(IN_FLIGHT - 1) : null;
  }

  /** Wait until at most `max` batches are in flight; throws a file's failure. */
  async #drain(max: number): Promise<void> {
    while (this.#inFlight.length > max) await this.#inFlight[0];
    if (this.#failure) throw this.#failure;
  }

  /** Write what is queued and wait for every batch; throws the first file's failure. */
  async flush(): Promise<void> {
    this.#submit();
    await this.#drain(0);
  }

  /** Wait for the batches in flight without submitting more or throwing (a restore that failed elsewhere). */
  async settle(): Promise<void> {
    this.#batch = null;
    while (this.#inFlight.length) await this.#inFlight[0]!.catch(() => undefined);
  }

  #submit(): void {
    const b = this.#batch;
    this.#batch = null;
    if (!b || b.dests.length === 0) return;
    const count = b.dests.length;
    const paths = Buffer.from(b.dests.join("\0") + "\0", "utf8");
    const results = new Int32Array(count);
    const p = new Promise<void>((res) => {
      this.#native.writeFiles(
        paths,
        count,
        b.data.subarray(0, b.used),
        Float64Array.from(b.offsets),
        results,
        (err) => {
          for (let i = 0; i < count && !this.#failure; i++) {
            const e = results[i]!;
            if (e === 0 && err === 0) continue;
            const errno = e || err;
            const code = getSystemErrorName(-errno);
            this.#failure =
              code === "EEXIST" || code === "EISDIR" // as extract.ts's synchronous writes say it
                ? conflictingEntry(b.names[i]!)
                : destinationError(
                    Object.assign(new Error(`${code}: ${b.dests[i]}`), { code, errno: -errno, path: b.dests[i] }),
                    b.dests[i]!,
                  );
          }
          if (b.data.length === BATCH_BYTES && this.#free.length <= IN_FLIGHT) this.#free.push(b.data);
          res();
        },
      );
    });
    const tracked = p.finally(() => {
      this.#inFlight.splice(this.#inFlight.indexOf(tracked), 1);
    });
    this.#inFlight.push(tracked);
  }
}
