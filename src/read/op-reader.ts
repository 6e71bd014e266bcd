/**
 * The payload decoder's batches read op by op on the main thread (./read-payload.ts reads
 * entries through it): a batch is a shared buffer and a list of ops (an entry's start, its
 * byte ranges, its end with the digest), framed by the worker's tar scanner (./tar-scan.ts).
 */
import { MemsnapError } from "../errors.js";
import type { PayloadDecoder, ScannedBatch } from "./decoder.js";
import { OP_DATA, OP_END, OP_START } from "./tar-scan.js";

const EMPTY = Buffer.alloc(0);

/**
 * The decoder's batches, op by op (see TarScanner): an entry's head, its byte ranges as
 * buffers, its digest. Sync where the current batch has the next op; the worker's framing
 * guarantees the order (start, data*, end), which is checked here too.
 */
export class OpReader {
  readonly #it: AsyncIterator<ScannedBatch>;
  #buf: Buffer = Buffer.alloc(0);
  #release: (() => void) | null = null;
  #ops: (number | string)[] = [];
  #i = 0;
  #digest: string | null = null;

  constructor(decoder: PayloadDecoder) {
    this.#it = (decoder as AsyncIterable<ScannedBatch>)[Symbol.asyncIterator]();
  }

  /** Refill from the next batch: false at the end of the payload. */
  async #fill(): Promise<boolean> {
    while (this.#i >= this.#ops.length) {
      // The batch's last chunk was handed out and its handler asks for more: the slot goes back.
      this.close();
      const r = await this.#it.next();
      if (r.done) return false;
      if ("err" in r.value) throw r.value.err;
      this.#buf = r.value.buf;
      this.#release = r.value.release;
      this.#ops = r.value.ops;
      this.#i = 0;
    }
    return true;
  }

  /** Give the current batch's slot back (at the end, or when reading stops). */
  close(): void {
    this.#release?.();
    this.#release = null;
    this.#buf = EMPTY;
  }

  #broken(what: string): never {
    throw new MemsnapError("MEMSNAP_INTERNAL", `payload framing out of order: ${what}`);
  }

  /** The next entry's head, or null at the end of the payload. */
  async start(): Promise<{ name: string; size: number; type: string; hashed: boolean } | null> {
    if (!(await this.#fill())) return null;
    const o = this.#ops;
    if (o[this.#i] !== OP_START) this.#broken(`op ${String(o[this.#i])} where an entry starts`);
    const head = {
      name: o[this.#i + 1] as string,
      size: o[this.#i + 2] as number,
      type: o[this.#i + 3] as string,
      hashed: o[this.#i + 4] === 1,
    };
    this.#i += 5;
    this.#digest = null;
    return head;
  }

  /** The entry's next bytes if the current batch has them; null at its end (see digest); undefined: call dataAsync. */
  data(): Buffer | null | undefined {
    const o = this.#ops;
    const i = this.#i;
    if (i >= o.length) return undefined;
    if (o[i] === OP_DATA) {
      this.#i = i + 3;
      const off = o[i + 1] as number;
      return this.#buf.subarray(off, off + (o[i + 2] as number));
    }
    if (o[i] === OP_END) {
      this.#digest = o[i + 1] as string;
      this.#i = i + 2;
      return null;
    }
    return this.#broken(`op ${String(o[i])} inside an entry`);
  }

  async dataAsync(): Promise<Buffer | null> {
    if (!(await this.#fill()))
      throw new MemsnapError("MEMSNAP_PAYLOAD_CORRUPT", "the payload ends inside an entry", {
        hint: "the bundle is damaged; use another copy",
      });
    return this.data()!;
  }

  /** The SHA-256 (hex) of the entry that just ended. */
  digest(): string {
    return this.#digest ?? this.#broken("no digest");
  }
}
