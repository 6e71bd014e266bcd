/**
 * A layer's restore spool (see SourceKind.restoreSpool): artifacts that are not written as
 * files of their own but appended to one spool file, or put at a given offset in a part file,
 * with a map of where each one went that the layer's materialize reads.
 *
 * Part files are created sparse and written with positional writes, so a page lands where
 * the rebuilt file needs it. A place must end below PLACE_MAX_END, and a part file is only
 * ever created once (EEXIST is a conflicting entry, as for every staged name).
 */
import { closeSync, createReadStream, fstatSync, openSync } from "node:fs";
import { BatchedWriter } from "../util/batched-writer.js";
import { join } from "node:path";
import { MemsnapError, destinationError } from "../errors.js";
import { createHash } from "node:crypto";
import { PLACE_MAX_END } from "./kv/format.js";
import { PLANES_MAX_BYTES, unshuffle } from "../util/planes.js";
import { SPOOL_FILE, SPOOL_MAP, spoolPart, type SpoolAt, type SpoolPlace } from "./types.js";
import { FdCache } from "../util/fd-cache.js";
import { WriteBehind, WriteFailed } from "../util/write-behind.js";
import { conflictingEntry } from "../format/safe-path.js";

/** Part files kept open at once; a part seen again after eviction is reopened. */
const OPEN_PARTS = 16;
/** The gather buffer of placed planes is kept for the next page up to this size. */
const GATHER_KEEP_BYTES = 4 * 1024 * 1024;
/** Map lines are written in batches of about this many characters. */
const MAP_BATCH = 64 * 1024;
/** Bytes of artifact writes in flight on the thread pool at most (see WriteBehind). */
const WRITES_IN_FLIGHT = 4 * 1024 * 1024;

/**
 * The map is written as it grows, one JSON array per line: `["<rel>",offset,length]` or
 * `["<rel>",offset,length,file]` (see {@link readSpoolMap}); only the names are kept, to refuse
 * a name seen twice.
 */
export class RestoreSpool {
  readonly #names = new Set<string>();
  readonly #map: BatchedWriter;
  readonly #root: string;
  readonly #layer: string;
  #fd: number | null = null;
  #pos = 0;
  readonly #writes = new WriteBehind(WRITES_IN_FLIGHT);
  readonly #parts = new FdCache<number>(OPEN_PARTS, (fd) => this.#writes.close(fd, closeSync));
  readonly #made = new Set<number>();
  #gather: Buffer = Buffer.alloc(0);

  readonly #resume: boolean;

  /**
   * With `resume`, the layer's spool, map and parts may exist already (an incremental restore:
   * the bundle's own entries first, then those it references from a base): they are added to,
   * never recreated. The names are distinct by construction (the index lists each path once).
   */
  constructor(root: string, layer: string, resume = false) {
    this.#root = root;
    this.#layer = layer;
    this.#resume = resume;
    this.#map = new BatchedWriter(() => this.#open(SPOOL_MAP, resume ? "a" : "wx"), join(root, SPOOL_MAP), MAP_BATCH);
  }

  #open(name: string, flags: string): number {
    if (this.#resume && flags === "wx") {
      try {
        const fd = openSync(join(this.#root, name), "r+");
        if (name === SPOOL_FILE) this.#pos = fstatSync(fd).size;
        return fd;
      } catch (e) {
        if ((e as NodeJS.ErrnoException).code !== "ENOENT") throw destinationError(e, join(this.#root, name));
      }
    }
    try {
      return openSync(join(this.#root, name), flags, 0o600);
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code === "EEXIST") throw conflictingEntry(`${this.#layer}/${name}`);
      throw destinationError(e, join(this.#root, name));
    }
  }

  #part(file: number): number {
    return this.#parts.get(file, () => {
      const fd = this.#open(spoolPart(file), this.#made.has(file) ? "r+" : "wx");
      this.#made.add(file);
      return fd;
    });
  }

  /**
   * Write one artifact's bytes (at most `size`) to the spool, or to its place. Throws
   * MEMSNAP_UNSAFE_PATH for a name seen before, MEMSNAP_UNSAFE_BUNDLE for a place past
   * PLACE_MAX_END, MEMSNAP_ARTIFACT_HASH_MISMATCH for more bytes than declared, MEMSNAP_DEST_*.
   */
  async put(
    name: string,
    rel: string,
    size: number,
    chunks: AsyncIterable<Buffer>,
    place: SpoolPlace | null,
    onBytes: (n: number) => void,
  ): Promise<void> {
    if (this.#names.has(rel)) throw conflictingEntry(name);
    if (place && place.offset + size > PLACE_MAX_END) {
      throw new MemsnapError(
        "MEMSNAP_UNSAFE_BUNDLE",
        `${name} is placed at byte ${place.offset}, past what a restore writes`,
        {
          path: name,
          hint: "this bundle was not written by memsnap or was tampered with; nothing was restored",
        },
      );
    }
    if (!place) this.#fd ??= this.#open(SPOOL_FILE, "wx"); // (resumed: sets #pos to the spool's end)
    const start = place ? place.offset : this.#pos;
    let n = 0;
    try {
      if (place?.planes) {
        n = await this.#putPlanes(name, size, chunks, place, place.planes, onBytes);
      } else {
        for await (const c of chunks) {
          if (n + c.length > size)
            throw new MemsnapError("MEMSNAP_ARTIFACT_HASH_MISMATCH", `${name} is longer than its header declares`, {
              path: name,
            });
          // The fd is looked up for every chunk: another artifact's part may have evicted it.
          const fd = place ? this.#part(place.file) : (this.#fd ??= this.#open(SPOOL_FILE, "wx"));
          const w = this.#writes.write(fd, c, start + n, place ? spoolPart(place.file) : SPOOL_FILE);
          n += c.length;
          onBytes(c.length);
          if (w) await w;
        }
      }
    } catch (e) {
      throw this.#writeError(e, place ? spoolPart(place.file) : SPOOL_FILE);
    }
    this.#names.add(rel);
    if (place) {
      this.#record([rel, start, n, place.file]);
    } else {
      this.#fd ??= this.#open(SPOOL_FILE, "wx"); // an empty artifact still gets a spool
      this.#record([rel, start, n]);
      this.#pos += n;
    }
  }

  /**
   * A placed artifact of byte planes: gathered whole (it is at most `size`, which the caller
   * bounds), put back in element order, checked against the digest its name gives, then
   * written at its place as the page it was.
   */
  async #putPlanes(
    name: string,
    size: number,
    chunks: AsyncIterable<Buffer>,
    place: SpoolPlace,
    planes: { elem: number; sha256: string },
    onBytes: (n: number) => void,
  ): Promise<number> {
    const long = (): MemsnapError =>
      new MemsnapError("MEMSNAP_ARTIFACT_HASH_MISMATCH", `${name} is longer than its header declares`, { path: name });
    if (size > PLANES_MAX_BYTES) throw long();
    // One gather buffer for every page (pages have one size); the page put back in order is new,
    // since its write may still be in flight when the next page arrives.
    let buf: Buffer;
    if (size > GATHER_KEEP_BYTES) buf = Buffer.allocUnsafe(size);
    else {
      if (this.#gather.length < size) this.#gather = Buffer.allocUnsafeSlow(size);
      buf = this.#gather;
    }
    let n = 0;
    for await (const c of chunks) {
      if (n + c.length > size) throw long();
      c.copy(buf, n);
      n += c.length;
      onBytes(c.length);
    }
    const bad = (why: string): MemsnapError =>
      new MemsnapError("MEMSNAP_ARTIFACT_HASH_MISMATCH", `${name}: ${why}`, {
        path: name,
        hint: "the bundle is damaged or was altered; nothing was restored",
      });
    if (n % planes.elem !== 0) throw bad(`${n} bytes is not a whole number of ${planes.elem}-byte elements`);
    const page = unshuffle(buf.subarray(0, n), planes.elem);
    if (createHash("sha256").update(page).digest("hex") !== planes.sha256) {
      throw bad("its bytes put back in element order do not hash to the digest in its name");
    }
    const w = this.#writes.write(this.#part(place.file), page, place.offset, spoolPart(place.file));
    if (w) await w;
    return n;
  }

  #record(e: [string, ...number[]]): void {
    this.#map.write(`${JSON.stringify(e)}\n`);
  }

  #writeError(e: unknown, name: string): Error {
    if (e instanceof MemsnapError) return e;
    if (e instanceof WriteFailed) return destinationError(e.err, join(this.#root, e.where));
    return destinationError(e, join(this.#root, name));
  }

  /** Wait for every write, write the rest of the map and close every file. */
  async close(): Promise<void> {
    try {
      await this.#writes.drain().catch((e: unknown) => {
        throw this.#writeError(e, SPOOL_FILE);
      });
      this.#map.flush();
    } finally {
      await this.release();
    }
  }

  /** Close every file once its writes are done (on failure, without finishing the map: the layer is not rebuilt). */
  async release(): Promise<void> {
    if (this.#fd !== null) this.#writes.close(this.#fd, closeSync);
    this.#fd = null;
    this.#map.close();
    this.#parts.closeAll();
    this.#names.clear();
    await this.#writes.drain().catch(() => undefined);
  }
}

/**
 * Read a spool map written by {@link RestoreSpool}, one entry at a time, in the order written.
 * Throws (a plain Error) on a line that is not a well-formed entry.
 */
export async function* readSpoolMap(path: string): AsyncGenerator<[string, SpoolAt]> {
  let tail = "";
  const parse = (line: string): [string, SpoolAt] => {
    let v: unknown;
    try {
      v = JSON.parse(line);
    } catch {
      throw new Error("a spool map line is not JSON");
    }
    if (
      !Array.isArray(v) ||
      (v.length !== 3 && v.length !== 4) ||
      typeof v[0] !== "string" ||
      !v.slice(1).every((x) => Number.isSafeInteger(x) && (x as number) >= 0)
    ) {
      throw new Error("a spool map line is not an entry");
    }
    return [v[0], v.slice(1) as SpoolAt];
  };
  for await (const c of createReadStream(path, { encoding: "utf8", highWaterMark: 1 << 16 })) {
    const lines = (tail + (c as string)).split("\n");
    tail = lines.pop()!;
    for (const l of lines) yield parse(l);
  }
  if (tail !== "") throw new Error("the spool map ends mid-line");
}
