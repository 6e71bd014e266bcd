/** The restore side of a kv layer's extraction spool: where each spooled page's bytes are. */
import { closeSync, openSync, readSync } from "node:fs";
import { join } from "node:path";
import { MemsnapError } from "../../errors.js";
import { readSpoolMap } from "../spool.js";
import { FdCache } from "../../util/fd-cache.js";
import { SPOOL_FILE } from "../types.js";
import { Grow } from "./format.js";

/** A damaged kv layer (exit as an artifact whose hash does not match). */
export function restoreBad(msg: string, path: string): MemsnapError {
  return new MemsnapError("MEMSNAP_ARTIFACT_HASH_MISMATCH", msg, {
    path,
    hint: "the bundle's KV layer is damaged; use another copy",
  });
}

/** Read `dst.length` bytes at `pos` of `fd`; a short read is a damaged spool. */
export function readFully(fd: number, dst: Buffer, pos: number, where: string): void {
  let got = 0;
  while (got < dst.length) {
    const r = readSync(fd, dst, got, dst.length - got, pos + got);
    if (r === 0) throw restoreBad(`${where}: the page spool is short`, where);
    got += r;
  }
}

/** Part files kept open at once while rebuilding (a part is reopened after eviction). */
const OPEN_PARTS = 16;

/**
 * The extraction spool of a layer (see SourceKind.restoreSpool), as slots: where each spooled
 * artifact's bytes are (offset, length, and the part file, or -1 for the spool file), and the
 * part files holding placed pages, each renamed to the data file it became once built.
 */
export class SpoolReader {
  /** Spooled artifact (layer path) → slot. */
  readonly slots = new Map<string, number>();
  readonly off = new Grow((n) => new Float64Array(n));
  readonly len = new Grow((n) => new Float64Array(n));
  readonly part = new Grow((n) => new Int32Array(n));
  readonly #src: string;
  #fd: number | null = null;
  readonly #parts = new FdCache<number>(OPEN_PARTS);
  /** Part file → where it is now (its spool name, or the rebuilt file it was renamed to). */
  readonly partPath = new Map<number, string>();

  constructor(src: string, names: string[]) {
    this.#src = src;
    for (const n of names) {
      const m = /^\.memsnap-spool-(0|[1-9][0-9]{0,8})$/.exec(n);
      if (m) this.partPath.set(Number(m[1]), join(src, n));
    }
  }

  /** Read the map written on extraction (a later entry for a name replaces an earlier one, as the JSON map did). */
  async load(path: string, layer: string): Promise<void> {
    try {
      for await (const [rel, at] of readSpoolMap(path)) {
        const k = this.off.push(at[0]);
        this.len.push(at[1]);
        this.part.push(at.length === 3 ? at[2] : -1);
        this.slots.set(rel, k);
      }
    } catch {
      throw restoreBad(`${layer}: the page spool map is damaged`, layer);
    }
  }

  fd(slot: number): number {
    const file = this.part.a[slot]!;
    if (file < 0) return (this.#fd ??= openSync(join(this.#src, SPOOL_FILE), "r"));
    return this.#parts.get(file, () => {
      const path = this.partPath.get(file);
      if (path === undefined) throw restoreBad(`the page spool has no part ${file}`, SPOOL_FILE);
      return openSync(path, "r");
    });
  }

  close(): void {
    if (this.#fd !== null) closeSync(this.#fd);
    this.#fd = null;
    this.#parts.closeAll();
  }
}
