/** The unit a source yields and the payload stores: a file-like artifact with a declared size. */
import type { Readable } from "node:stream";

/**
 * How an incremental snapshot may store only what changed of an artifact (snapshot/chunking.ts):
 * `append` for a log only ever appended to, `pages` for a file of fixed-size pages (SQLite),
 * `cdc` for any other large file (content-defined chunks).
 */
export interface ChunkHint {
  mode: "append" | "pages" | "cdc";
  /** `pages`: the page size. */
  pageSize?: number;
}

/** The smallest file a source marks for content-defined chunking (`cdc`). */
export const CDC_MIN_FILE = 4 * 1024 * 1024;

/** How a consumer will use an artifact's chunks (see {@link Artifact.open}). */
export interface OpenOptions {
  /** The consumer keeps no chunk after asking for the next, so the source may reuse buffers. */
  reuse?: boolean;
}

/**
 * One artifact a source yields. `open()` is called once, right before its bytes are packed (a
 * {@link Artifact.rereadable} one may be opened again: the redactor reads it, then the pipeline).
 */
export interface Artifact {
  /** Path inside the layer: relative, POSIX separators, no `.`/`..` segments. */
  path: string;
  /** Artifact kind recorded in the index (`file`, `json`, …). */
  kind: string;
  /** Declared size in bytes; the bytes streamed must match it exactly. */
  size: number;
  mode: number;
  mtime: Date;
  /**
   * The artifact's bytes. At most `size + 1` bytes are read, so a growing file is detected
   * without reading it to its end. With `{ reuse: true }` the source may yield chunks that are
   * valid only until the next one is asked for (read into reused buffers, see
   * util/reused-chunks.ts); the pipeline asks for that when it packs an artifact, since it
   * keeps no chunk. A wrapper that replaces `open` needs to know nothing of it: its own `open`
   * ignores the option and yields what it yields.
   */
  open(opts?: OpenOptions): Readable | AsyncIterable<Buffer> | Iterable<Buffer>;
  /** Called after the bytes streamed; throws MEMSNAP_SOURCE_CHANGED if the source changed meanwhile. */
  check?(): Promise<void>;
  /**
   * SHA-256 (lowercase hex) of exactly the bytes `open()` yields, when the source computed it
   * from those same in-memory bytes (a KV page it hashed to deduplicate). The pipeline then
   * records it instead of hashing the bytes a second time; it still counts them. Never set it
   * for bytes that are read again from disk, and never for text that may be redacted.
   */
  sha256?: string;
  /**
   * SHA-256 (lowercase hex) the packed bytes must have: set by the redactor on a source it scanned
   * on an earlier read and passes on unchanged, to be read again by the pipeline. The pipeline
   * compares it with the hash of what it packed and fails with MEMSNAP_SOURCE_CHANGED on a
   * difference, so bytes the redactor never saw (a same-size rewrite that kept the mtime) are
   * never packed. Unlike {@link sha256} it does not spare the pipeline its own hashing.
   */
  expectSha256?: string;
  /**
   * A cheap identity of the source the bytes are read from (device, inode, size, mtime, ctime of
   * a file the source reads as is), for incremental snapshots: an artifact whose fingerprint,
   * size and kind match the last incremental snapshot's is referenced, not read. Only for bytes
   * that are a function of that file alone (never a temp copy, which is new every time).
   */
  fingerprint?: string;
  /** How an incremental snapshot may store only the changed part of it (see {@link ChunkHint}). */
  chunking?: ChunkHint;
  /**
   * Store the bytes as their byte planes of `elem`-byte elements (a KV page, see util/planes.ts):
   * the packer shuffles them into a buffer of its own (the artifact's size, at most
   * KV_MAX_PAGE_BYTES), and what it stores and hashes is the planes. With `frames`, each plane
   * is compressed as a zstd frame of its own with the plane profile (codecs/zstd-profile.ts).
   * `sha256`, when given, must be the planes' hash.
   */
  shuffle?: { elem: number; frames: boolean };
  /** True for text the pipeline should redact (memory files, JSON, JSONL) when redaction is on. */
  text?: boolean;
  /**
   * `open()` may be called again and yields the same bytes, unless `check()` then reports the
   * source changed (a file read from disk). The redactor uses it to skip spooling a big text it
   * leaves unchanged: the pipeline reads the source a second time instead.
   */
  rereadable?: boolean;
  /**
   * The absolute path of the one file whose bytes `open()` yields as they are (a file read from
   * disk): the redactor may then scan a big text there, on the thread pool, instead of through
   * `open()`. Never set it where open() transforms or assembles the bytes; a wrapper that
   * replaces `open` with one that does must drop it.
   */
  file?: string;
  /**
   * An open descriptor of the one file whose first `size` bytes are exactly what `open()` yields,
   * and stay so until `check()` returns (a SQLite database read live, under its read
   * transaction), and that file's path for messages. A consumer may read the bytes itself
   * through it (positioned reads, on the thread pool: snapshot/page-reader.ts) instead of calling
   * `open()`; it must call `check()` after, which reports a file that changed (grew included:
   * such a consumer reads `size` bytes, not one more), and it never closes the descriptor (that
   * would drop the process's locks on the file). A wrapper that replaces `open` must drop it.
   */
  descriptor?: { fd: number; path: string };
  /**
   * With `descriptor`: what a reader of every byte through it already computed, under the same
   * guarantee (a SQLite live read's incremental scan: the bytes stay as they were until
   * `check()`): the SHA-256 of the `size` bytes (hex) and each page's first 16 bytes of SHA-256
   * (pages of `pageSize` bytes, the last one short). A `pages` chunking may then read only the
   * pages it stores, checking each against its hash here, and take the whole hash as it is.
   */
  pageHashes?: { pageSize: number; table: Uint8Array; sha256: string };
}
