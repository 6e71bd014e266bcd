/** The layer meta of a sqlite layer: the facts recorded per database, and the redaction's counts. */
import type { LiveScanStats, SourcePragmas } from "./worker-host.js";

/** Per-database facts in the layer meta (`meta.databases[<artifact path>]`). */
export interface SqliteDbMeta extends SourcePragmas {
  /** `live_read`: the database file itself, read under a read transaction; otherwise a copy. */
  method: "vacuum_into" | "backup" | "live_read";
  source_bytes: number;
  /** Bytes captured (the copy's size, or with `live_read` the file's). */
  copy_bytes: number;
  /** Time of the copy; 0 with `live_read`. */
  copy_ms: number;
  /** An incremental snapshot referenced the database unchanged: this meta is that snapshot's (nothing was read now). */
  reused?: boolean;
  /** `live_read`: time to start the read transaction and decide (journal mode, `-wal`, the redaction scan). */
  prepare_ms?: number;
  quick_check: "ok";
  /** `live_read`: time of quick_check, run in the same read transaction while the file streamed. */
  quick_check_ms?: number;
  /**
   * A copy method: why the database file could not be captured as it is (`wal_frames`,
   * `redaction_candidate`, `disabled`, …).
   */
  live_read_skipped?: string;
  tables: Record<string, number>;
  redaction?: SqliteRedactionStats;
}

export interface SqliteRedactionStats {
  /**
   * How old bytes are scrubbed from the copy; `none` for a `live_read` (no candidate in any cell
   * or in the stale bytes, or only candidates the redactor cleared), and for a copy whose scan
   * found the same (it is kept as made).
   */
  scrub: "secure_delete+vacuum" | "none";
  tables: number;
  /** TEXT cells (and, on the copy path, BLOB cells: see `blob_cells`) read. */
  cells_scanned: number;
  candidates: number;
  cells_redacted: number;
  /**
   * The copy path's BLOB cells: `scanned`; `redacted`, those that are text (valid UTF-8 without
   * control characters but tab and line breaks) and were rewritten as TEXT cells are (the cell
   * stays a BLOB); `unredacted`, binary ones in which a rule matched: they are kept byte for
   * byte (rewriting could corrupt an embedding or a serialized object) and their findings are
   * in the report's `unredacted`, so a plaintext snapshot is refused without `--allow-unredacted`.
   */
  blob_cells?: { scanned: number; redacted: number; unredacted: number };
  fts_rebuilt: string[];
  fts_optimized: string[];
  stat4_cleared: boolean;
  skipped: Array<{ table: string; reason: string }>;
  /** `live_read`: what the worker's scan of the live file covered; a copy kept as made: of the copy. */
  live_scan?: LiveScanStats;
}
