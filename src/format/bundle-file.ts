/**
 * A stored bundle opened for reading, wherever it is: a local file (positioned reads on one
 * descriptor, as before) or an object in an S3 store (`s3://bucket/key`: HeadObject for the
 * size, ranged GETs, a sequential stream with bounded read-ahead; ../objstore/object-reader.ts).
 *
 * Every reader of stored bundles goes through {@link openBundle}: the container's layout, the
 * payload's stream (the decoder worker reads a local file itself, by descriptor, and is fed
 * the bytes of a remote one), the keyless payload hash, a base beside an incremental bundle.
 * The S3 code (and the SDK) is loaded only when a bundle URL is opened.
 */
import { open, type FileHandle } from "node:fs/promises";
import { dirname, join } from "node:path";
import { MemsnapError } from "../errors.js";
import { reusedChunks } from "../util/reused-chunks.js";

export interface BundleFile {
  /** The path or URL it was opened with. */
  readonly path: string;
  readonly size: number;
  /** True for a local file (the decoder's fd fast path applies). */
  readonly local: boolean;
  /** Read up to `len` bytes at `pos` into `buf` at `off`; fewer only at the end of the bundle. */
  read(buf: Buffer, off: number, len: number, pos: number): Promise<number>;
  /**
   * The bytes [start, end) in order. A chunk is valid until the next one is asked for (a
   * consumer that keeps one copies it).
   */
  stream(start: number, end: number): AsyncIterable<Buffer>;
  close(): Promise<void>;
}

/** A bundle in an object store (`s3://…`) rather than a local path. */
export function isBundleUrl(path: string): boolean {
  return /^s3:\/\//i.test(path);
}

/**
 * The bundle `id` beside `bundle` (same directory, or same key prefix): where an incremental
 * bundle's bases are.
 */
export function siblingBundle(bundle: string, id: string): string {
  if (isBundleUrl(bundle)) return `${bundle.slice(0, bundle.lastIndexOf("/") + 1)}${id}.memsnap`;
  return join(dirname(bundle), `${id}.memsnap`);
}

/** The bundle `<id>.memsnap` in an agent's directory or key prefix (`dir` as agentDir returns it). */
export function bundleIn(dir: string, id: string): string {
  return isBundleUrl(dir) ? `${dir.replace(/\/+$/, "")}/${id}.memsnap` : join(dir, `${id}.memsnap`);
}

class LocalBundle implements BundleFile {
  readonly local = true;
  constructor(
    readonly path: string,
    readonly size: number,
    readonly fh: FileHandle,
  ) {}

  async read(buf: Buffer, off: number, len: number, pos: number): Promise<number> {
    let got = 0;
    while (got < len) {
      const { bytesRead } = await this.fh.read(buf, off + got, len - got, pos + got);
      if (bytesRead === 0) break;
      got += bytesRead;
    }
    return got;
  }

  stream(start: number, end: number): AsyncIterable<Buffer> {
    return end > start
      ? reusedChunks(this.fh, start, end - 1)
      : (async function* () {
          /* empty */
        })();
  }

  async close(): Promise<void> {
    await this.fh.close().catch(() => undefined);
  }
}

/**
 * Open a bundle for reading. Throws MEMSNAP_SOURCE_MISSING when there is none at `path`,
 * MEMSNAP_SOURCE_UNREADABLE when it cannot be read, MEMSNAP_BUNDLE_MALFORMED for a local path
 * that is not a regular file; an object store's own failures as its MEMSNAP_STORE_* errors.
 * `knownSize`: the size a listing gave (saves the HeadObject of a remote bundle).
 */
export async function openBundle(path: string, knownSize?: number): Promise<BundleFile> {
  if (isBundleUrl(path)) {
    const { openObjectBundle } = await import("../objstore/object-reader.js");
    return openObjectBundle(path, knownSize);
  }
  let fh: FileHandle;
  try {
    fh = await open(path, "r");
  } catch (e) {
    const code = (e as NodeJS.ErrnoException).code;
    throw new MemsnapError(
      code === "ENOENT" ? "MEMSNAP_SOURCE_MISSING" : "MEMSNAP_SOURCE_UNREADABLE",
      `cannot open bundle ${path}: ${(e as Error).message}`,
      { path, hint: "check the bundle path" },
    );
  }
  try {
    const st = await fh.stat();
    if (!st.isFile()) {
      throw new MemsnapError("MEMSNAP_BUNDLE_MALFORMED", `${path}: not a memsnap bundle (not a regular file)`, {
        path,
        hint: "memsnap bundles are tar files holding payload.tar.zst[.age] and manifest.json",
      });
    }
    return new LocalBundle(path, st.size, fh);
  } catch (e) {
    await fh.close().catch(() => undefined);
    throw e;
  }
}

/** Run `fn` on the opened bundle, closing it after. */
export async function withBundle<T>(path: string, fn: (f: BundleFile) => Promise<T>, knownSize?: number): Promise<T> {
  const f = await openBundle(path, knownSize);
  try {
    return await fn(f);
  } finally {
    await f.close();
  }
}
