/**
 * What the SQLite worker (./jobs.worker.ts) is asked (jobs) and answers, shared by the worker's
 * modules and its host (../sqlite-worker.ts).
 */

/** What the host gives the worker. */
export interface SqliteWorkerData {
  /** better-sqlite3's resolved entry (the worker loads the same copy as the main thread). */
  bsqlPath: string;
  /** The native pre-filter's path (src/redact/native.ts), or null: the JS finders alone. */
  prefilterPath: string | null;
  /** `js` keeps the live read's page walk in JS even where the native one is built. */
  walk: "native" | "js";
  /** native/aead's path (codecs/aead.ts), or null: an incremental scan hashes pages in the worker. */
  aeadPath?: string | null;
}

/**
 * What the last incremental snapshot recorded of a database it read live and found clean: its
 * table of page hashes (16 bytes of SHA-256 a page) and their size (./worker-changed.ts).
 */
export interface PageBase {
  table: Uint8Array;
  pageSize: number;
}

/** A job and its number, host → worker. */
export interface SqliteRequest {
  id: number;
  job: SqliteJob;
}

/** The answer to job `id`: its result, or the SQLite (or Node) error code and message. */
export type SqliteReply =
  { id: number; ok: true; result: unknown } | { id: number; ok: false; code?: string; message: string };

/** Source pragmas read in one read transaction before the copy. */
export interface SourcePragmas {
  journal_mode: string;
  page_size: number;
  user_version: number;
  schema_version: number;
  application_id: number;
  encoding: string;
}

/** What the `copy` job returns. */
export interface CopyResult {
  pragmas: SourcePragmas;
  /** `vacuum_into`, or `backup` (one-step online backup) when VACUUM INTO failed with a plain SQL error. */
  method: "vacuum_into" | "backup";
  /** Wall time of the copy alone, in milliseconds. */
  ms: number;
}

/** What the `check` job returns. */
export interface CheckResult {
  /** The pragma's rows: `["ok"]` when the database is sound. */
  problems: string[];
  /** Row count of every ordinary table (not `sqlite_%`, shadow or virtual tables), when asked. */
  tables?: Record<string, number>;
}

/** What the live read's redaction scan found (counts, never content). */
export interface LiveScanStats {
  /**
   * Tables whose TEXT and BLOB cells were scanned (every real table but sqlite_schema: ordinary,
   * shadow and sqlite_stat*).
   */
  tables: number;
  cells_scanned: number;
  /** Bytes of TEXT (UTF-8) and BLOB cells scanned. */
  text_bytes: number;
  /**
   * Cells (or, when the scan stops, chunks of cells) the pre-filter flagged; the scan stops at the
   * first, unless it collects them (clean stale bytes: every candidate cell, up to a limit).
   */
  candidates: number;
  /**
   * Bytes of stale space (free pages, unallocated and freed space, overflow tails) that are not
   * all zero and were scanned.
   */
  stale_bytes: number;
  /** Pages whose whole content is stale (free pages, pages past the database's end). */
  free_pages: number;
  /** Wall time of the scan, milliseconds, and of its TEXT-cell part. */
  ms: number;
  cells_ms?: number;
  /**
   * How the TEXT cells were scanned: `pages` (parsed from the pages in the stale-byte walk), or
   * `sql` (group_concat per table: when the page walk found a candidate or could not read a page).
   */
  cells_via?: "pages" | "sql";
  /**
   * Which page walk ran: `native` (native/prefilter/sqlite_walk.c), `js` (the same walk in the
   * worker's JS), or `changed` (an incremental snapshot's walk of what changed since the last
   * one: ./worker-changed.ts).
   */
  walk?: "native" | "js" | "changed";
  /** `changed`: the pages whose bytes differ from the last snapshot's. */
  pages_changed?: number;
  /** Where the first hit is (`table`, or `stale page N`), never the text. */
  found?: string;
  /** Set by the source when the result came from a look-ahead and still held (same `data_version`, size and mtime). */
  reused?: boolean;
}

/** What `live_begin` returns. */
export interface LiveBeginResult {
  /** True when the database file itself may be captured (with `hold`: the read transaction is held). */
  eligible: boolean;
  /**
   * Why not: `journal_mode=<mode>`, `wal_frames`, `redaction_candidate`, `stale_candidate`,
   * `stale_token`, `freelist`, `size`, `encoding=<enc>` (with redaction), `scan_failed: …`.
   */
  reason?: string;
  pragmas: SourcePragmas;
  /** The file's size, read through `fd` inside the read transaction. */
  size: number;
  mtimeMs: number;
  /** `-wal` size in bytes (0 when absent). */
  walBytes: number;
  /**
   * With reason `redaction_candidate`: every cell the pre-filter flagged (TEXT as a string, a BLOB
   * as bytes), when there were few enough (../worker-cells.ts); with `hold`, the read transaction
   * is then held, as for a yes, until the host has the redactor rule on them (../capture.ts).
   */
  candidates?: Array<string | Uint8Array>;
  /**
   * An incremental scan's hashes of the file as read (./worker-changed.ts): each page's first 16
   * bytes of SHA-256 and the whole file's SHA-256, for the pack (Artifact.pageHashes).
   */
  pages?: { pageSize: number; table: Uint8Array; sha256: string };
  /** With `redact`: the scan, fresh or reused from a look-ahead (`reused`). */
  scan?: LiveScanStats;
  reused?: boolean;
  /** Virtual tables (name and declaration), for the redaction meta. */
  virtualTables: Array<{ name: string; sql: string }>;
  /** Wall time of the job, milliseconds. */
  ms: number;
}

/** What `live_verify` returns. */
export interface LiveVerifyResult {
  problems: string[];
  tables: Record<string, number>;
  quickCheckMs: number;
  countMs: number;
  /** Run by live_begin while its changed-page pass hashed (LiveBeginJob.verifyLimit), not by this live_verify. */
  ahead?: boolean;
}

/** Start (or look ahead on) a live read; see the module comment. */
export interface LiveBeginJob {
  op: "live_begin";
  handle: number;
  src: string;
  /**
   * An open read-only descriptor of `src`, owned by the caller, who closes it only after
   * `live_release` of this handle has settled (or the worker has exited).
   */
  fd: number;
  busyTimeoutMs: number;
  redact: boolean;
  hold: boolean;
  /** With `redact`, in an incremental snapshot: the last snapshot's clean scan to scan only the changes against. */
  base?: PageBase;
  /**
   * With `base`: run `quick_check(verifyLimit)` and the row counts in this read transaction
   * while the changed-page pass hashes on the thread pool; `live_verify` with the same limit
   * then answers with them (or with the look-ahead's, when this begin reuses its scan).
   */
  verifyLimit?: number;
}

export type SqliteJob =
  | { op: "copy"; src: string; dest: string; busyTimeoutMs: number; method?: "vacuum_into" | "backup" }
  | { op: "check"; path: string; pragma: "quick_check" | "integrity_check"; limit: number; counts?: boolean }
  | { op: "vacuum"; path: string }
  | { op: "materialize"; path: string; journalMode: string | null }
  | LiveBeginJob
  | { op: "live_verify"; handle: number; limit: number }
  | { op: "live_release"; handle: number }
  | { op: "probe_candidate"; texts: string[] };
