/**
 * The capture side of a `kv` layer's `kv-index.json`, built with memory that does not grow with
 * the number of pages written out.
 *
 * The index is one JSON document (docs/FORMAT.md, kv layer): a header, `contents` (one entry
 * per distinct page), `pages` (one `[label, content]` pair per original page) and `files`.
 * Holding it as objects and serialising it at the end cost ~1 KiB of heap per page at its
 * peak (the entries, then the JSON string, then its UTF-8 copy: 53k pages took the capture from
 * 145 to 240 MiB of RSS). Here each content entry and each page pair is appended, already
 * serialised, to one of two spill files in the capture's temp directory as the pages stream;
 * the finished document is those files between a header and the `files` member, streamed
 * from disk. What stays in memory per distinct page is the dedup key (the 32-byte digest as a
 * latin1 string) and a few bytes of counters.
 */
import { createHash } from "node:crypto";
import { createReadStream, openSync } from "node:fs";
import { join } from "node:path";
import { destinationError } from "../../errors.js";
import { BatchedWriter } from "../../util/batched-writer.js";
import { KV_INDEX_FORMAT } from "./format.js";
import type { KvContent, KvIndexFile } from "./index-format.js";

/** Serialised entries are written out in batches of about this many characters. */
const BATCH = 64 * 1024;

/** One spill file of comma-separated JSON values. */
class Spill {
  readonly #out: BatchedWriter;
  /** Values appended so far. */
  count = 0;
  /** Bytes of the comma-separated list (pending ones included). */
  bytes = 0;

  constructor(readonly path: string) {
    let fd: number;
    try {
      fd = openSync(path, "wx", 0o600);
    } catch (e) {
      throw destinationError(e, path);
    }
    this.#out = new BatchedWriter(() => fd, path, BATCH);
  }

  add(json: string): void {
    const s = this.count === 0 ? json : `,${json}`;
    this.count++;
    this.bytes += Buffer.byteLength(s);
    this.#out.write(s);
  }

  close(): void {
    this.#out.flush();
    this.#out.close();
  }
}

/** Growable array of small non-negative integers. */
class Counts {
  #a = new Float64Array(1024);
  length = 0;
  push(v: number): void {
    if (this.length === this.#a.length) {
      const b = new Float64Array(this.#a.length * 2);
      b.set(this.#a);
      this.#a = b;
    }
    this.#a[this.length++] = v;
  }
  get(i: number): number {
    return this.#a[i]!;
  }
  set(i: number, v: number): void {
    this.#a[i] = v;
  }
}

export interface KvIndexHeader {
  source_format: string;
  dtype: string;
  page_bytes: number;
  shuffle: { applied: boolean; elem_bytes: number };
}

/** Statistics of the pages listed, for the layer meta. */
export interface KvIndexStats {
  pages_total: number;
  pages_unique: number;
  pages_zero: number;
  bytes_total: number;
}

/**
 * Builds `kv-index.json` in two spill files under `dir`. Contents are deduplicated by digest
 * (raw pages and zstd frames apart, as before); labels refer to them by index.
 */
export class KvIndexWriter {
  readonly #contents: Spill;
  readonly #pages: Spill;
  readonly #raw = new Map<string, number>();
  readonly #frames = new Map<string, number>();
  /** Per content: its bytes. */
  readonly #bytes = new Counts();
  /** Per content: 0 not labelled yet, 1 labelled, 2 all zeros (see {@link addLabel}). */
  readonly #labelled = new Counts();
  #stats: KvIndexStats = { pages_total: 0, pages_unique: 0, pages_zero: 0, bytes_total: 0 };

  constructor(dir: string, tag: string) {
    this.#contents = new Spill(join(dir, `kv-contents-${tag}.spill`));
    this.#pages = new Spill(join(dir, `kv-pages-${tag}.spill`));
  }

  /** Dedup key of a hex digest. */
  static key(hex: string): string {
    return Buffer.from(hex, "hex").toString("latin1");
  }

  raw(key: string): number | undefined {
    return this.#raw.get(key);
  }

  addRaw(key: string, c: KvContent): number {
    const i = this.#add(c);
    this.#raw.set(key, i);
    return i;
  }

  frame(hex: string): number | undefined {
    return this.#frames.get(hex);
  }

  addFrame(c: KvContent): number {
    const i = this.#add(c);
    this.#frames.set(c.sha256, i);
    return i;
  }

  #add(c: KvContent): number {
    this.#contents.add(JSON.stringify(c));
    this.#bytes.push(c.bytes);
    this.#labelled.push(c.zero ? 2 : 0);
    return this.#bytes.length - 1;
  }

  /** One original page: `label` holds content `ci`. */
  addLabel(label: string, ci: number): void {
    this.#pages.add(JSON.stringify([label, ci]));
    const s = this.#stats;
    s.pages_total++;
    s.bytes_total += this.#bytes.get(ci);
    const l = this.#labelled.get(ci);
    if (l === 2) s.pages_zero++;
    else if (l === 0) {
      s.pages_unique++;
      this.#labelled.set(ci, 1);
    }
  }

  get stats(): KvIndexStats {
    return { ...this.#stats };
  }

  /**
   * Close the spill files and describe the document: its size and a function that streams it
   * (and, once streamed to the end, reports its SHA-256 to `onHash`).
   */
  finish(
    header: KvIndexHeader,
    files: KvIndexFile[],
    onHash: (hex: string) => void,
  ): { size: number; open: () => AsyncIterable<Buffer> } {
    this.#contents.close();
    this.#pages.close();
    const headJson = JSON.stringify({ format: KV_INDEX_FORMAT, version: 1, ...header });
    const head = Buffer.from(`${headJson.slice(0, -1)},"contents":[`, "utf8");
    const mid = Buffer.from('],"pages":[', "utf8");
    const tail = Buffer.from(`],"files":${JSON.stringify(files)}}\n`, "utf8");
    const size = head.length + this.#contents.bytes + mid.length + this.#pages.bytes + tail.length;
    const contents = this.#contents;
    const pages = this.#pages;
    return {
      size,
      open: () =>
        (async function* () {
          const h = createHash("sha256");
          const part = async function* (spill: Spill): AsyncGenerator<Buffer> {
            if (spill.bytes === 0) return;
            for await (const c of createReadStream(spill.path, { highWaterMark: 1 << 20 })) {
              h.update(c as Buffer);
              yield c as Buffer;
            }
          };
          h.update(head);
          yield head;
          yield* part(contents);
          h.update(mid);
          yield mid;
          yield* part(pages);
          h.update(tail);
          yield tail;
          onHash(h.digest("hex"));
        })(),
    };
  }

  /** Close the spill files (they live in the capture's temp directory, removed with it). */
  close(): void {
    this.#contents.close();
    this.#pages.close();
  }
}
