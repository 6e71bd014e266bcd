/**
 * The native/directio addon's file-system calls for sources with many small files (see
 * native/directio/directio.c): `scanDir` lists a directory and lstats its entries relative to it
 * in one call, `readFiles` reads a batch of small files on the thread pool, `writeFiles` creates
 * and writes a batch of them there (a restore's). Why: a memory of
 * 200,000 notes spent ~2.5 s of its snapshot's main thread in Node's synchronous fs calls
 * (lstat 5 µs, open 3.6 µs, each resolving the whole path), against 1.2 s for all of
 * `tar | zstd`. Without the addon (not built, another platform, `MEMSNAP_NATIVE=0`) the walk
 * and the reads use node:fs as before; the bytes and stats are the same.
 */
import { createRequire } from "node:module";
import type { Stats } from "node:fs";
import { memoryAddon } from "./directio.js";

/** scanDir's numbers per entry (native/directio/directio.c, SD_*). */
export const SD = {
  OFF: 0,
  LEN: 1,
  UTF8: 2,
  ERR: 3,
  FMT: 4,
  DEV: 5,
  INO: 6,
  MODE: 7,
  SIZE: 8,
  MSEC: 9,
  MNSEC: 10,
  CSEC: 11,
  CNSEC: 12,
  FIELDS: 13,
} as const;
/** readFiles' numbers per file (RF_*). */
export const RF = {
  ERR: 0,
  OFF: 1,
  LEN: 2,
  DEV: 3,
  INO: 4,
  MODE: 5,
  SIZE: 6,
  MSEC: 7,
  MNSEC: 8,
  CSEC: 9,
  CNSEC: 10,
  FIELDS: 11,
} as const;

export interface NativeFs {
  scanDir(path: string): [number, Buffer?, Float64Array?];
  readFiles(
    root: string,
    paths: Uint8Array,
    count: number,
    limits: Float64Array,
    out: Uint8Array,
    meta: Float64Array,
    cb: (errno: number) => void,
  ): void;
  writeFiles(
    paths: Uint8Array,
    count: number,
    data: Uint8Array,
    offsets: Float64Array,
    results: Int32Array,
    cb: (errno: number) => void,
  ): void;
}

let loaded: NativeFs | null | undefined;

/** The addon's calls, or null where it is not built, lacks them (an older build) or `MEMSNAP_NATIVE=0`. */
export function nativeFs(): NativeFs | null {
  const path = memoryAddon(); // null with MEMSNAP_NATIVE=0 or when not built
  if (path === null) return null;
  if (loaded === undefined) {
    try {
      const m = createRequire(import.meta.url)(path) as Partial<NativeFs>;
      loaded =
        typeof m.scanDir === "function" && typeof m.readFiles === "function" && typeof m.writeFiles === "function"
          ? (m as NativeFs)
          : null;
    } catch {
      loaded = null; // built for another ABI
    }
  }
  return loaded;
}

/**
 * Milliseconds from seconds and nanoseconds, computed as Node computes `Stats.mtimeMs`, so fingerprints compare equal.
 */
export function msFromTimeSpec(sec: number, nsec: number): number {
  return sec * 1000 + nsec / 1_000_000;
}

/** What memsnap uses of a file's stat (a `Stats` is one). */
export type FileStats = Pick<Stats, "dev" | "ino" | "mode" | "size" | "mtimeMs" | "ctimeMs" | "mtime">;

/**
 * The fields of {@link FileStats} and nothing else: ~70 bytes per file, where a `Stats` with its
 * four Dates is ~1 KB. A walk of 200,000 notes held 201 MiB of Stats (V8's mark-compacts of that
 * heap were 2/3 of the snapshot). `mtime` is derived when asked for.
 */
export class CompactStats implements FileStats {
  constructor(
    readonly dev: number,
    readonly ino: number,
    readonly mode: number,
    readonly size: number,
    readonly mtimeMs: number,
    readonly ctimeMs: number,
  ) {}

  static of(st: Stats): CompactStats {
    return new CompactStats(st.dev, st.ino, st.mode, st.size, st.mtimeMs, st.ctimeMs);
  }

  /** From the addon's numbers at `f[base + …]`, `F` naming the fields (SD or RF). */
  static at(
    f: Float64Array,
    base: number,
    F: {
      DEV: number;
      INO: number;
      MODE: number;
      SIZE: number;
      MSEC: number;
      MNSEC: number;
      CSEC: number;
      CNSEC: number;
    },
  ): CompactStats {
    return new CompactStats(
      f[base + F.DEV]!,
      f[base + F.INO]!,
      f[base + F.MODE]!,
      f[base + F.SIZE]!,
      msFromTimeSpec(f[base + F.MSEC]!, f[base + F.MNSEC]!),
      msFromTimeSpec(f[base + F.CSEC]!, f[base + F.CNSEC]!),
    );
  }

  /** As Node's `Stats.mtime`: the milliseconds rounded (a Date of a fractional time would truncate). */
  get mtime(): Date {
    return new Date(Math.round(this.mtimeMs));
  }
}
