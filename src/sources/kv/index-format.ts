/** The `kv` layer's bundle-side index, `kv-index.json`: its document, read and checked as it streams. */
import { createHash } from "node:crypto";
import { JsonStreamError, streamJson } from "../../util/json-stream.js";
import { isObject } from "../pfimg/format.js";
import { Grow, KV_INDEX_FORMAT, KV_MAX_PAGE_BYTES, KV_MAX_RESTORE_BYTES, KV_WORK_PREFIX, safeRel } from "./format.js";

/** A distinct page content. */
export interface KvContent {
  sha256: string;
  bytes: number;
  zero: boolean;
  /**
   * Where its bytes are in the layer: `pages/…` (raw or shuffled), `files/…` (a verbatim zstd blob), or null
   * (zero).
   */
  artifact: string | null;
  /** `zstd`: the artifact is a verbatim zstd frame (a ProcessFork blob) of the content. */
  encoding?: "zstd";
}

/** An original file of the dump. */
export interface KvIndexFile {
  path: string;
  bytes: number;
  mode: number;
  mtime: string;
  /** Verbatim files: the artifact holding its bytes (`files/<path>`). */
  artifact?: string;
  /** Data files: content indexes of its consecutive pages, which tile it exactly. */
  tiles?: number[];
}

export interface KvIndex {
  format: typeof KV_INDEX_FORMAT;
  version: 1;
  source_format: "memsnap" | "pfimg-paged" | "lmcache" | "paged";
  dtype: string;
  page_bytes: number;
  shuffle: { applied: boolean; elem_bytes: number };
  contents: KvContent[];
  /** Every original page: [label, content index]. Labels: `L<layer>/B<block>`, `<ix>/k`, `<file>#<n>`. */
  pages: [string, number][];
  files: KvIndexFile[];
}

/** The kv-index's members other than its three arrays, and how many entries each array had. */
export interface KvIndexHead {
  source_format: KvIndex["source_format"];
  dtype: string;
  page_bytes: number;
  shuffle: KvIndex["shuffle"];
  contents: number;
  pages: number;
  files: number;
}

/**
 * A kv-index that asks restore for something unsafe (a path out of its layer, a file under a
 * file, a size no dump has): restore refuses it with `code` (exit 9). Other problems of the
 * document are plain Errors (a damaged index).
 */
export class KvIndexUnsafe extends Error {
  constructor(
    message: string,
    readonly code: "MEMSNAP_UNSAFE_PATH" | "MEMSNAP_UNSAFE_BUNDLE",
  ) {
    super(message);
  }
}

/** Check one `contents` entry of a kv-index (throws a plain Error, or KvIndexUnsafe for its size). */
function checkContent(c: unknown): KvContent {
  if (
    !isObject(c) ||
    typeof c.sha256 !== "string" ||
    !/^[0-9a-f]{64}$/.test(c.sha256) ||
    !Number.isSafeInteger(c.bytes) ||
    typeof c.zero !== "boolean"
  ) {
    throw new Error("kv-index has a malformed content entry");
  }
  const bytes = c.bytes as number;
  // A page is at most KV_MAX_PAGE_BYTES (capture refuses bigger ones); a ProcessFork blob kept
  // as its zstd frame (encoding zstd) is never written from its content entry.
  if (bytes < 0 || (c.encoding !== "zstd" && bytes > KV_MAX_PAGE_BYTES)) {
    throw new KvIndexUnsafe(
      `kv-index content ${c.sha256} has ${bytes} bytes (a page has 0 to ${KV_MAX_PAGE_BYTES})`,
      "MEMSNAP_UNSAFE_BUNDLE",
    );
  }
  if (c.artifact !== null && !(typeof c.artifact === "string" && safeRel(c.artifact))) {
    throw new Error(`kv-index content artifact ${JSON.stringify(c.artifact)} is not a safe path`);
  }
  if (c.artifact === null && !c.zero) throw new Error(`kv-index content ${c.sha256} has no bytes and is not zero`);
  return c as unknown as KvContent;
}

/**
 * Check one `files` entry of a kv-index (tile indexes are range-checked by the caller); throws a plain Error or
 * KvIndexUnsafe.
 */
function checkFile(f: unknown): KvIndexFile {
  if (isObject(f) && typeof f.path === "string" && !safeRel(f.path)) {
    throw new KvIndexUnsafe(
      `kv-index file path ${JSON.stringify(f.path)} is not a safe relative path`,
      "MEMSNAP_UNSAFE_PATH",
    );
  }
  if (
    !isObject(f) ||
    !safeRel(f.path) ||
    !Number.isSafeInteger(f.bytes) ||
    !Number.isSafeInteger(f.mode) ||
    typeof f.mtime !== "string"
  ) {
    throw new Error("kv-index has a malformed file entry");
  }
  if ((f.bytes as number) < 0) {
    throw new KvIndexUnsafe(`kv-index file ${f.path} has ${f.bytes as number} bytes`, "MEMSNAP_UNSAFE_BUNDLE");
  }
  if (f.path.split("/")[0]!.startsWith(KV_WORK_PREFIX)) {
    throw new KvIndexUnsafe(`kv-index names a reserved path ${f.path}`, "MEMSNAP_UNSAFE_PATH");
  }
  if (f.tiles !== undefined) {
    if (!Array.isArray(f.tiles) || f.tiles.some((t) => !Number.isSafeInteger(t) || (t as number) < 0)) {
      throw new Error(`kv-index file ${f.path} has bad tiles`);
    }
  } else if (!(typeof f.artifact === "string" && safeRel(f.artifact))) {
    throw new Error(`kv-index file ${f.path} has neither tiles nor an artifact`);
  }
  return f as unknown as KvIndexFile;
}

/**
 * Check that the zero contents (their byte counts `lens`, digests at `32 i` of `shas`) carry
 * the SHA-256 of that many zero bytes: one pass of zeros up to the longest (at most a page),
 * the digest of each length taken from a copy of the running hash, however many there are.
 */
function checkZeroDigests(lens: Float64Array, shas: Buffer, n: number): void {
  const order = Array.from({ length: n }, (_, i) => i).sort((a, b) => lens[a]! - lens[b]!);
  const h = createHash("sha256");
  const zeros = Buffer.alloc(Math.min(1 << 20, Math.max(1, n ? lens[order[n - 1]!]! : 1)));
  let fed = 0;
  for (const i of order) {
    const len = lens[i]!;
    while (fed < len) {
      const k = Math.min(zeros.length, len - fed);
      h.update(k === zeros.length ? zeros : zeros.subarray(0, k));
      fed += k;
    }
    if (
      h
        .copy()
        .digest()
        .compare(shas, 32 * i, 32 * i + 32) !== 0
    ) {
      throw new Error(
        `kv-index content ${shas.toString("hex", 32 * i, 32 * i + 32)} is marked zero, ` +
          `but ${len} zero bytes hash to sha256:${h.copy().digest("hex")}`,
      );
    }
  }
}

/** What {@link readKvIndex} found besides the checks: the bytes of all the data files (files with tiles). */
export interface KvIndexRead extends KvIndexHead {
  dataBytes: number;
}

/**
 * Read a kv-index.json document as it streams, with the checks of {@link parseKvIndex}, handing
 * each content and each file to `on` (pages are checked for shape only and dropped): memory
 * stays bounded whatever the number of pages (the document is ~230 bytes per page). Every
 * check is done before this resolves, so a caller acts on what it collected only after:
 * - contents: sizes (0 to a page's cap), and a zero content's digest is that of its zero bytes;
 * - files: safe relative paths, none twice, none under another (a file is no directory), none
 *   in the rebuild's work directory; a data file's tiles are pages (not ProcessFork frames),
 *   in range, and add up to its `bytes`; all data files hold at most KV_MAX_RESTORE_BYTES.
 * Throws a plain Error saying what is wrong, or a {@link KvIndexUnsafe}.
 */
export async function readKvIndex(
  chunks: AsyncIterable<Uint8Array> | Iterable<Uint8Array>,
  on: { content?: (c: KvContent, i: number) => void; file?: (f: KvIndexFile, i: number) => void },
): Promise<KvIndexRead> {
  let maxTile = -1;
  let badTiles: string | null = null;
  // Per content: its bytes, and 1 when it is a zstd frame (not a page a tile can use).
  const cBytes = new Grow((n) => new Float64Array(n));
  const cFrame = new Grow((n) => new Uint8Array(n));
  // Zero contents up to a page: bytes and declared digest, checked at the end.
  const zLens = new Grow((n) => new Float64Array(n));
  let zShas = Buffer.alloc(32 * 64);
  const paths = new Set<string>();
  let dataBytes = 0;
  /** Data files whose tiles name contents not read yet (another member order): summed at the end. */
  const later: KvIndexFile[] = [];
  const sumTiles = (f: KvIndexFile): void => {
    let n = 0;
    for (const t of f.tiles!) {
      if (cFrame.a[t] === 1) throw new Error(`kv-index file ${f.path} has a tile that is not a page`);
      n += cBytes.a[t]!;
    }
    if (n !== f.bytes) {
      throw new KvIndexUnsafe(
        `kv-index file ${f.path} has ${f.bytes} bytes, its tiles hold ${n}`,
        "MEMSNAP_UNSAFE_BUNDLE",
      );
    }
  };
  let doc: Record<string, unknown>;
  try {
    doc = await streamJson(chunks, {
      arrays: {
        contents: (raw, i) => {
          const c = checkContent(raw);
          cBytes.push(c.bytes);
          cFrame.push(c.encoding === "zstd" ? 1 : 0);
          if (c.zero && c.bytes <= KV_MAX_PAGE_BYTES) {
            const k = zLens.push(c.bytes);
            if (zShas.length < 32 * (k + 1)) {
              const b = Buffer.alloc(zShas.length * 2);
              zShas.copy(b);
              zShas = b;
            }
            zShas.write(c.sha256, 32 * k, "hex");
          }
          on.content?.(c, i);
        },
        pages: () => undefined,
        files: (raw, i) => {
          const f = checkFile(raw);
          if (paths.has(f.path)) throw new KvIndexUnsafe(`kv-index names ${f.path} twice`, "MEMSNAP_UNSAFE_PATH");
          paths.add(f.path);
          if (f.tiles) {
            for (const t of f.tiles) {
              if (t > maxTile) {
                maxTile = t;
                badTiles = f.path;
              }
            }
            dataBytes += f.bytes;
            if (f.bytes > KV_MAX_RESTORE_BYTES || dataBytes > KV_MAX_RESTORE_BYTES) {
              throw new KvIndexUnsafe(
                `kv-index data files hold more than ${KV_MAX_RESTORE_BYTES} bytes (at ${f.path})`,
                "MEMSNAP_UNSAFE_BUNDLE",
              );
            }
            if (maxTile < cBytes.length) sumTiles(f);
            else later.push(f);
          }
          on.file?.(f, i);
        },
      },
    });
  } catch (e) {
    if (e instanceof JsonStreamError) throw new Error(`kv-index is not valid JSON: ${e.message}`);
    throw e;
  }
  if (doc.format !== KV_INDEX_FORMAT) throw new Error(`not a ${KV_INDEX_FORMAT} document`);
  if (doc.version !== 1) throw new Error(`kv-index version ${JSON.stringify(doc.version)}; this memsnap reads 1`);
  if (typeof doc.contents !== "number" || typeof doc.files !== "number" || typeof doc.pages !== "number") {
    throw new Error("kv-index needs contents, pages and files arrays");
  }
  if (maxTile >= doc.contents) throw new Error(`kv-index file ${String(badTiles)} has bad tiles`);
  for (const f of later) sumTiles(f);
  // A file under another file (`a` and `a/b`): the rebuild would need `a` as a directory too.
  for (const p of paths) {
    for (let k = p.indexOf("/"); k !== -1; k = p.indexOf("/", k + 1)) {
      if (paths.has(p.slice(0, k))) {
        throw new KvIndexUnsafe(`kv-index names ${p} under the file ${p.slice(0, k)}`, "MEMSNAP_UNSAFE_PATH");
      }
    }
  }
  checkZeroDigests(zLens.a, zShas, zLens.length);
  return { ...(doc as unknown as KvIndexHead), dataBytes };
}

/** Parse and check a whole kv-index.json document held in memory (shape only): {@link readKvIndex}, collected. */
export async function parseKvIndex(bytes: Buffer): Promise<KvIndex> {
  const contents: KvContent[] = [];
  const files: KvIndexFile[] = [];
  const head = await readKvIndex([bytes], {
    content: (c) => {
      contents.push(c);
    },
    file: (f) => {
      files.push(f);
    },
  });
  const pages = (JSON.parse(bytes.toString("utf8")) as { pages: [string, number][] }).pages;
  return {
    format: KV_INDEX_FORMAT,
    version: 1,
    source_format: head.source_format,
    dtype: head.dtype,
    page_bytes: head.page_bytes,
    shuffle: head.shuffle,
    contents,
    pages,
    files,
  };
}
