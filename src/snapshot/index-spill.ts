/**
 * The artifact index of a snapshot, kept on disk while the payload streams.
 *
 * A bundle's index has one entry per artifact, and a KV dump alone yields one artifact per
 * distinct page (64k at the bench's scale 10), so holding the entries and then encoding the
 * whole document in memory made peak RSS grow with the data. Each entry is appended here, in
 * its canonical JSON, to a temp file in the snapshot's work directory; at the end the index
 * member is streamed from that file. The bytes are exactly `encodeIndex(doc)`:
 * `{"artifacts":[e1,e2,…],"format":"memsnap-index","snapshot_id":"<id>"}` (keys sorted, as
 * canonical JSON), so readers see no difference.
 */
import { closeSync, openSync, readSync, writeSync } from "node:fs";
import type { IndexEntry } from "../format/manifest.js";
import { canonicalJson } from "../util/canonical-json.js";

const BUF = 1024 * 1024;

const ENTRY_KEYS = 7; // kind, layer, mode, mtime, path, sha256, size

/**
 * {@link canonicalJson} of an index entry, written out for its seven keys in sorted order (a
 * KV dump adds one entry per page: the generic encoder's sort and joins were ~20 ms of the
 * main thread per 6,400 pages). An entry with other keys, or with a key missing, goes through
 * the generic encoder, so the bytes are canonical JSON either way.
 */
export function entryJson(e: IndexEntry): string {
  if (
    Object.keys(e).length !== ENTRY_KEYS ||
    !Number.isSafeInteger(e.mode) ||
    !Number.isSafeInteger(e.size) ||
    typeof e.kind !== "string" ||
    typeof e.layer !== "string" ||
    typeof e.mtime !== "string" ||
    typeof e.path !== "string" ||
    typeof e.sha256 !== "string"
  ) {
    return canonicalJson(e);
  }
  return (
    `{"kind":${JSON.stringify(e.kind)},"layer":${JSON.stringify(e.layer)},"mode":${e.mode},` +
    `"mtime":${JSON.stringify(e.mtime)},` +
    `"path":${JSON.stringify(e.path)},"sha256":${JSON.stringify(e.sha256)},"size":${e.size}}`
  );
}

export class IndexSpill {
  readonly #fd: number;
  readonly #buf = Buffer.allocUnsafe(BUF);
  #len = 0;
  #written = 0;
  /** Entries added. */
  count = 0;
  /** Bytes of the entries and their separating commas. */
  bodyBytes = 0;

  constructor(readonly path: string) {
    this.#fd = openSync(path, "wx+", 0o600);
  }

  add(e: IndexEntry): void {
    const s = (this.count > 0 ? "," : "") + entryJson(e);
    const n = Buffer.byteLength(s, "utf8");
    if (this.#len + n > BUF) this.#flush();
    if (n > BUF) {
      this.#writeAll(Buffer.from(s, "utf8"));
    } else {
      this.#buf.write(s, this.#len, "utf8");
      this.#len += n;
    }
    this.count++;
    this.bodyBytes += n;
  }

  #flush(): void {
    if (this.#len === 0) return;
    this.#writeAll(this.#buf.subarray(0, this.#len));
    this.#len = 0;
  }

  #writeAll(b: Buffer): void {
    let off = 0;
    while (off < b.length) off += writeSync(this.#fd, b, off, b.length - off, this.#written + off);
    this.#written += b.length;
  }

  /** The index document's bytes, in pieces of at most 1 MiB (the caller may not keep them). */
  *document(snapshotId: string): Generator<Buffer> {
    this.#flush();
    yield Buffer.from('{"artifacts":[', "utf8");
    const chunk = Buffer.allocUnsafe(BUF);
    for (let pos = 0; pos < this.#written;) {
      const n = readSync(this.#fd, chunk, 0, Math.min(BUF, this.#written - pos), pos);
      if (n === 0) throw new Error(`index spill ${this.path} is shorter than written`);
      pos += n;
      yield chunk.subarray(0, n);
    }
    yield Buffer.from(`],"format":"memsnap-index","snapshot_id":${JSON.stringify(snapshotId)}}`, "utf8");
  }

  /** Size of {@link document} in bytes. */
  documentBytes(snapshotId: string): number {
    return (
      Buffer.byteLength('{"artifacts":[', "utf8") +
      this.bodyBytes +
      Buffer.byteLength(`],"format":"memsnap-index","snapshot_id":${JSON.stringify(snapshotId)}}`, "utf8")
    );
  }

  close(): void {
    closeSync(this.#fd);
  }
}
