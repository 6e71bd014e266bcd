/**
 * Extract a bundle's payload into staging directories, one per layer, checking every entry's
 * name, size and SHA-256 as it is written and comparing the whole payload with the index at
 * the end. Nothing is written outside the staging roots: names are checked before any write,
 * and only regular files are created. A layer's entries must be contiguous (memsnap writes
 * them so), which is what lets a caller start on a layer as soon as the payload leaves it.
 */
import { chmodSync, closeSync, openSync, utimesSync, writeSync } from "node:fs";
import { mkdir, open } from "node:fs/promises";
import { dirname, join } from "node:path";
import { MemsnapError, destinationError } from "../errors.js";
import type { BundleLayout } from "../format/container.js";
import type { IndexEntry, Manifest } from "../format/manifest.js";
import type { EntryTable } from "./entry-table.js";
import {
  compareWithIndex,
  readPayload,
  type EntryHandler,
  type Keys,
  type PayloadEntry,
  type PayloadReadResult,
} from "./read-payload.js";
import { crashPoint } from "../util/crash-point.js";
import { alignedBuffer, SequentialDirectWriter } from "../util/directio.js";
import { pin } from "../util/slots.js";
import { checkEntryName, conflictingEntry } from "../format/safe-path.js";
import { sourceKind } from "../sources/registry.js";
import { isSpoolName } from "../sources/types.js";
import { SmallFileWriter } from "./small-writes.js";
import { currentUmask, restoredMode } from "../util/umask.js";
import { RestoreSpool } from "../sources/spool.js";

/** Entries up to this size are written with synchronous calls. */
const SMALL_ENTRY = 256 * 1024;

const WRITE_BATCH = 1 << 20;
/** Entries at least this big are written with O_DIRECT where that is possible. */
const DIRECT_MIN = 4 * 1024 * 1024;

export interface ExtractOptions {
  keys?: Keys;
  signal?: AbortSignal;
  onProgress?: (bytes: number, total: number) => void;
  /** Each entry once it is written and hashed (see readPayload). */
  onEntry?: (e: PayloadEntry) => void;
  /** The table the entries are recorded in (see readPayload's `entries`). */
  entries?: EntryTable;
  /**
   * A layer's entries are all written (the payload has moved on to the next layer, or ended).
   * Lets the caller materialize a layer while later ones are still being extracted; what it
   * builds stays in the caller's staging until the whole payload has matched the index.
   */
  onLayerDone?: (layer: string) => void;
  /**
   * Write only the entries for which this is true; the others are hashed and dropped (a base's unreferenced entries).
   */
  want?: (name: string) => boolean;
  /** The layers' spools may exist already: add to them (see RestoreSpool's `resume`). */
  resumeSpools?: boolean;
  /** Index artifacts that reference a base (manifest_version 2; see readPayload's `onRef`). */
  onRef?: (a: IndexEntry) => void;
  /** Where to note the mode and mtime of each file written for a layer that restores them (applied by the caller). */
  attributes?: RestoredAttributes;
  /**
   * Handed the bytes of each entry that is wanted (see `want`) but not written, its layer's
   * root being null: `verify --deep` checks a base's referenced artifacts so. The chunks are
   * hashed against the index whether or not it reads them.
   */
  peek?: EntryHandler;
  /**
   * An entry that is wanted and for which this returns a handler is handed to it instead of
   * being written (a base's entry that chunked artifacts read ranges of: read/chunked.ts).
   */
  divert?: (name: string) => EntryHandler | undefined;
  /**
   * A restore: an age payload's stored bytes are not hashed (readPayload's `skipStoredHash`, which says why that is
   * sound). Verify and the other readers leave it unset: they check the stored bytes too.
   */
  skipStoredHash?: boolean;
}

/**
 * The index's permission bits and mtime for the files a restore wrote in layers whose kind
 * `restoresAttributes`, applied once every file is written (and every layer materialized) and the early writeback has
 * settled: a chmod or utimes of a file whose pages are being written back waits for it (20,000
 * notes: 8 s of kernel time done while the restore's syncfs ran, 0.1 s after it).
 */
export class RestoredAttributes {
  // Kept compact: a restore of 200,000 notes held 80 MiB of joined path strings here. Each file
  // is its payload path (the string the index parse made) and its layer root's number.
  #roots: string[] = [];
  #paths: string[] = [];
  #root = new Uint16Array(1024);
  #modes = new Int32Array(1024);
  #mtimes = new Float64Array(1024);

  /** Whether a layer of this kind gets them. */
  static wanted(kind: string): boolean {
    return sourceKind(kind)?.restoresAttributes === true;
  }

  /** Note the file of payload path `path` (`<layer>/<rel>`), written under `root`. */
  add(root: string, path: string, a: Pick<IndexEntry, "mode" | "mtime">): void {
    const i = this.#paths.length;
    if (i === this.#modes.length) {
      const grow = <T extends Uint16Array | Int32Array | Float64Array>(x: T): T => {
        const y = new (x.constructor as new (n: number) => T)(x.length * 2);
        y.set(x);
        return y;
      };
      this.#root = grow(this.#root);
      this.#modes = grow(this.#modes);
      this.#mtimes = grow(this.#mtimes);
    }
    let r = this.#roots.lastIndexOf(root);
    if (r < 0) r = this.#roots.push(root) - 1;
    this.#paths.push(path);
    this.#root[i] = r;
    this.#modes[i] = Number.isSafeInteger(a.mode) ? a.mode & 0o777 : -1; // never setuid, setgid or sticky
    this.#mtimes[i] = Date.parse(a.mtime);
  }

  /**
   * Set them (MEMSNAP_DEST_* when a file refuses). A mode is the captured permission bits less
   * the process umask (see restoredMode): a bundle cannot make a file more open than the
   * restoring user's umask allows. A file its layer's materialize removed (an SQLite side file
   * a bundle carried) is skipped.
   */
  apply(): void {
    const umask = currentUmask();
    for (let i = 0; i < this.#paths.length; i++) {
      const rel = this.#paths[i]!;
      const p = join(this.#roots[this.#root[i]!]!, ...rel.slice(rel.indexOf("/") + 1).split("/"));
      try {
        if (this.#modes[i]! >= 0) chmodSync(p, restoredMode(this.#modes[i]!, umask));
        const t = this.#mtimes[i]!;
        // Seconds as a double land a few hundred ns either side of the millisecond; half a
        // microsecond more keeps the file's mtime in the millisecond the index records.
        if (Number.isFinite(t)) utimesSync(p, (t + 0.0005) / 1000, (t + 0.0005) / 1000);
      } catch (e) {
        if ((e as NodeJS.ErrnoException).code === "ENOENT") continue;
        throw destinationError(e, p);
      }
    }
    this.#paths = [];
    this.#roots = [];
  }
}

/** Write a small entry's bytes to a new file `dest` in one synchronous write (MEMSNAP_UNSAFE_PATH, MEMSNAP_DEST_*). */
function writeSmall(dest: string, name: string, parts: Buffer[], n: number): void {
  let fd: number;
  try {
    fd = openSync(dest, "wx", 0o600);
  } catch (e) {
    const code = (e as NodeJS.ErrnoException).code;
    if (code === "EEXIST" || code === "EISDIR") throw conflictingEntry(name);
    throw destinationError(e, dest);
  }
  try {
    const body = parts.length === 1 ? parts[0]! : Buffer.concat(parts, n);
    let off = 0;
    while (off < body.length) off += writeSync(fd, body, off, body.length - off);
  } catch (e) {
    throw destinationError(e, dest);
  } finally {
    closeSync(fd);
  }
}

/**
 * Stream the payload, writing each selected layer's entries under `rootFor(layer)`; entries
 * of layers for which it returns null are hashed and dropped. Throws MEMSNAP_UNSAFE_PATH,
 * MEMSNAP_DEST_*, key and integrity errors; on a throw, what was written stays for the
 * caller to remove (it owns the roots).
 */
export async function extractPayload(
  layout: BundleLayout,
  manifest: Manifest,
  rootFor: (layer: string) => string | null,
  opts: ExtractOptions = {},
): Promise<PayloadReadResult> {
  const layers = new Set(manifest.layers.map((l) => l.name));
  const spoolFor = new Map(manifest.layers.map((l) => [l.name, sourceKind(l.kind)?.restoreSpool]));
  const attributed = new Set(manifest.layers.filter((l) => RestoredAttributes.wanted(l.kind)).map((l) => l.name));
  // A file written for such a layer gets the index's mode and mtime (see RestoredAttributes),
  // noted as the index (last in the payload) confirms its bytes.
  const onMatch = (a: IndexEntry): void => {
    if (!opts.attributes || !attributed.has(a.layer) || (opts.want && !opts.want(a.path))) return;
    const root = rootFor(a.layer);
    if (root !== null) opts.attributes.add(root, a.path, a);
  };
  const spools = new Map<string, RestoreSpool>();
  const total = manifest.payload.bytes;
  let written = 0;
  let direct: Buffer[] | null | undefined; // aligned buffers for the big files, written one at a time
  const made = new Set<string>();
  const declared = manifest.index ? new Map(manifest.index.map((e) => [e.path, e.size])) : null;
  let current: string | null = null;
  const closed = new Set<string>();
  // Small files go to the thread pool in batches where the addon is built (./small-writes.ts).
  const batched = SmallFileWriter.create();
  const closeLayer = async (layer: string): Promise<void> => {
    closed.add(layer);
    await batched?.flush(); // a layer's rebuild reads its files
    const sp = spools.get(layer);
    spools.delete(layer);
    await sp?.close();
    opts.onLayerDone?.(layer);
  };
  try {
    const r = await readPayload(
      layout,
      manifest,
      opts.keys ?? {},
      async (info, chunks) => {
        checkEntryName(info.name, layers);
        if (info.layer !== current) {
          if (closed.has(info.layer)) {
            throw new MemsnapError(
              "MEMSNAP_UNSAFE_BUNDLE",
              `entry ${info.name} comes after entries of another layer; a layer's entries must be contiguous`,
              {
                path: info.name,
                hint: "this bundle was not written by memsnap or was tampered with; nothing was restored",
              },
            );
          }
          if (current !== null) await closeLayer(current);
          current = info.layer;
        }
        const want = declared?.get(info.name);
        if (want !== undefined && info.size > want) {
          throw new MemsnapError(
            "MEMSNAP_UNSAFE_BUNDLE",
            `entry ${info.name} is ${info.size} bytes, the index declares ${want}`,
            {
              path: info.name,
              hint: "this bundle was not written by memsnap or was tampered with; nothing was restored",
            },
          );
        }
        const root = rootFor(info.layer);
        if (opts.want && !opts.want(info.name)) return;
        const diverted = opts.divert?.(info.name);
        if (diverted) {
          await diverted(info, chunks);
          return;
        }
        if (root === null) {
          await opts.peek?.(info, chunks);
          return;
        }
        const spooled = spoolFor.get(info.layer);
        if (spooled && isSpoolName(info.rel)) throw conflictingEntry(info.name);
        const tooLong = (): MemsnapError =>
          new MemsnapError("MEMSNAP_ARTIFACT_HASH_MISMATCH", `${info.name} is longer than its header declares`, {
            path: info.name,
          });

        // Spooled artifacts (KV pages): into the layer's spool, or straight into place in a
        // spool part, for materialize (./spool.ts).
        const spool = spooled?.(info.rel);
        if (spool) {
          let sp = spools.get(info.layer);
          if (!sp) {
            if (!made.has(root)) {
              await mkdir(root, { recursive: true }).catch((e: unknown) => {
                throw destinationError(e, root);
              });
              made.add(root);
            }
            sp = new RestoreSpool(root, info.layer, !!opts.resumeSpools);
            spools.set(info.layer, sp);
          }
          await sp.put(info.name, info.rel, info.size, chunks, spool === true ? null : spool, (n) => {
            written += n;
            opts.onProgress?.(written, total);
          });
          crashPoint("restore:staged-entry");
          return;
        }

        const dest = join(root, ...info.rel.split("/"));
        const dir = dirname(dest);
        if (!made.has(dir)) {
          try {
            await mkdir(dir, { recursive: true });
          } catch (e) {
            const code = (e as NodeJS.ErrnoException).code;
            if (code === "EEXIST" || code === "ENOTDIR")
              throw new MemsnapError("MEMSNAP_UNSAFE_PATH", `entry ${info.name} conflicts with an earlier entry`, {
                path: info.name,
              });
            throw destinationError(e, dir);
          }
          made.add(dir);
        }
        // Small entries are written synchronously (open, one write, close): three thread-pool
        // round trips per file cost more than the write itself.
        if (info.size <= SMALL_ENTRY) {
          const parts: Buffer[] = [];
          const pins: (() => void)[] = []; // an entry that spans batches keeps its first ones' slots
          let n = 0;
          let wait: Promise<void> | null = null;
          try {
            for await (const c of chunks) {
              n += c.length;
              if (n > info.size) throw tooLong();
              parts.push(c);
              const un = pin(c);
              if (un) pins.push(un);
            }
            if (batched)
              wait = batched.add(dest, info.name, parts, n); // the bytes are copied before it returns
            else writeSmall(dest, info.name, parts, n);
          } finally {
            for (const un of pins) un();
          }
          if (wait) await wait;
          written += n;
          opts.onProgress?.(written, total);
          crashPoint("restore:staged-entry");
          return;
        }
        let fh;
        try {
          fh = await open(dest, "wx", 0o600);
        } catch (e) {
          const code = (e as NodeJS.ErrnoException).code;
          if (code === "EEXIST" || code === "EISDIR") throw conflictingEntry(info.name);
          throw destinationError(e, dest);
        }
        // Big files go out with O_DIRECT where the addon and the file system allow it (see
        // src/util/directio.ts): the restore is CPU-bound, and the page cache's copy and
        // writeback are CPU the hashing and decompression need.
        // Two buffers: one fills while the other is written (see SequentialDirectWriter).
        if (direct === undefined) {
          const a = alignedBuffer(WRITE_BATCH);
          const b = a && alignedBuffer(WRITE_BATCH);
          direct = a && b ? [a, b] : a && [a];
        }
        const dw = direct && info.size >= DIRECT_MIN ? new SequentialDirectWriter(dest, fh.fd, direct) : null;
        const pins: (() => void)[] = []; // the slots of the chunks gathered in `batch`
        try {
          let n = 0;
          // Coalesce the tar parser's small chunks into ~1 MiB writes.
          let batch: Buffer[] = [];
          let batched = 0;
          for await (const c of chunks) {
            n += c.length;
            if (n > info.size) throw tooLong();
            if (dw) {
              await dw.write(c); // copied into the aligned buffers
            } else {
              batch.push(c);
              const un = pin(c);
              if (un) pins.push(un);
              batched += c.length;
              if (batched >= WRITE_BATCH) {
                await fh.writev(batch);
                batch = [];
                batched = 0;
                for (const u of pins.splice(0)) u();
              }
            }
            written += c.length;
            opts.onProgress?.(written, total);
          }
          if (dw) await dw.end();
          if (batched) await fh.writev(batch);
        } catch (e) {
          if (e instanceof MemsnapError) throw e;
          throw destinationError(e, dest);
        } finally {
          for (const u of pins.splice(0)) u();
          await dw?.settle(); // no write in flight when the descriptors close
          await fh.close();
        }
        crashPoint("restore:staged-entry");
      },
      {
        streamIndex: true,
        ...(opts.skipStoredHash ? { skipStoredHash: true } : {}),
        ...(opts.signal ? { signal: opts.signal } : {}),
        ...(opts.onEntry ? { onEntry: opts.onEntry } : {}),
        ...(opts.entries ? { entries: opts.entries } : {}),
        ...(opts.onRef ? { onRef: opts.onRef } : {}),
        onMatch,
      },
    );
    if (current !== null) await closeLayer(current);
    const findings = compareWithIndex(manifest, r);
    if (findings.length) {
      const f = findings[0]!;
      throw new MemsnapError(
        f.code,
        findings.length === 1 ? f.message : `${findings.length} problems, first: ${f.message}`,
        {
          findings,
          hint: "the bundle is damaged or was altered; nothing was restored",
        },
      );
    }
    return r;
  } finally {
    await batched?.settle(); // no write in flight when the caller removes what was written
    for (const sp of spools.values()) await sp.release();
  }
}
