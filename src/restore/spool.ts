/**
 * A layer's restore spool (see SourceKind.restoreSpool): artifacts that are not written as
 * files of their own but appended to one spool file, or put at a given offset in a part file,
 * with a map of where each one went that the layer's materialize reads.
 *
 * Part files are created sparse and written with positional writes, so a page lands where
 * the rebuilt file needs it. A place must end below PLACE_MAX_END, and a part file is only
 * ever created once (EEXIST is a conflicting entry, as for every staged name).
 */
import { closeSync, openSync, writeFileSync, writeSync } from "node:fs";
import { join } from "node:path";
import { MemsnapError, destinationError } from "../errors.js";
import { PLACE_MAX_END } from "../sources/kv-format.js";
import { SPOOL_FILE, SPOOL_MAP, spoolPart, type SpoolAt, type SpoolPlace } from "../sources/types.js";
import { FdCache } from "../util/fd-cache.js";
import { conflictingEntry } from "./safe-path.js";

/** Part files kept open at once; a part seen again after eviction is reopened. */
const OPEN_PARTS = 16;

export class RestoreSpool {
  readonly map: Record<string, SpoolAt> = {};
  readonly #root: string;
  readonly #layer: string;
  #fd: number | null = null;
  #pos = 0;
  readonly #parts = new FdCache<number>(OPEN_PARTS);
  readonly #made = new Set<number>();

  constructor(root: string, layer: string) {
    this.#root = root;
    this.#layer = layer;
  }

  #open(name: string, flags: string): number {
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
  async put(name: string, rel: string, size: number, chunks: AsyncIterable<Buffer>, place: SpoolPlace | null, onBytes: (n: number) => void): Promise<void> {
    if (Object.hasOwn(this.map, rel)) throw conflictingEntry(name);
    if (place && place.offset + size > PLACE_MAX_END) {
      throw new MemsnapError("MEMSNAP_UNSAFE_BUNDLE", `${name} is placed at byte ${place.offset}, past what a restore writes`, {
        path: name, hint: "this bundle was not written by memsnap or was tampered with; nothing was restored",
      });
    }
    const start = place ? place.offset : this.#pos;
    let n = 0;
    try {
      for await (const c of chunks) {
        if (n + c.length > size) throw new MemsnapError("MEMSNAP_ARTIFACT_HASH_MISMATCH", `${name} is longer than its header declares`, { path: name });
        // The fd is looked up for every chunk: another artifact's part may have evicted it.
        const fd = place ? this.#part(place.file) : (this.#fd ??= this.#open(SPOOL_FILE, "wx"));
        let off = 0;
        while (off < c.length) off += writeSync(fd, c, off, c.length - off, start + n + off);
        n += c.length;
        onBytes(c.length);
      }
    } catch (e) {
      if (e instanceof MemsnapError) throw e;
      throw destinationError(e, join(this.#root, place ? spoolPart(place.file) : SPOOL_FILE));
    }
    if (place) {
      this.map[rel] = [start, n, place.file];
    } else {
      this.#fd ??= this.#open(SPOOL_FILE, "wx"); // an empty artifact still gets a spool
      this.map[rel] = [start, n];
      this.#pos += n;
    }
  }

  /** Write the map and close every file. */
  close(): void {
    try {
      writeFileSync(join(this.#root, SPOOL_MAP), JSON.stringify(this.map), { mode: 0o600, flag: "wx" });
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code === "EEXIST") throw conflictingEntry(`${this.#layer}/${SPOOL_MAP}`);
      throw destinationError(e, this.#root);
    } finally {
      this.release();
    }
  }

  /** Close every file without writing the map (on failure). */
  release(): void {
    if (this.#fd !== null) closeSync(this.#fd);
    this.#fd = null;
    this.#parts.closeAll();
  }
}
