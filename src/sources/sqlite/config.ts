/** The `sqlite` source's config entry. */
import { optBool, optInt, optStringArray, rejectUnknownKeys, reqString } from "../../util/config-check.js";

export interface SqliteConfig {
  kind: "sqlite";
  name: string;
  /** A database file, or a directory scanned for `*.db`, `*.sqlite`, `*.sqlite3`. */
  path: string;
  include?: string[];
  exclude?: string[];
  /** How long to wait for a lock before MEMSNAP_LOCKED. Default 5000. */
  busy_timeout_ms: number;
  /** Capture the database file itself under a read transaction when that is sound (./index.ts). Default true. */
  live_read: boolean;
}

export const SQLITE_DEFAULT_INCLUDE = ["*.db", "*.sqlite", "*.sqlite3"];
export const SQLITE_DEFAULT_BUSY_TIMEOUT_MS = 5000;
/** SQLite's side files: never captured, removed beside restored databases. */
export const SIDE_FILE = /-(wal|shm|journal)$/;

/** Check a sqlite source's config entry. */
export function parseSqliteConfig(raw: Record<string, unknown>, where: string): SqliteConfig {
  rejectUnknownKeys(raw, ["kind", "name", "path", "include", "exclude", "busy_timeout_ms", "live_read"], where);
  return {
    kind: "sqlite",
    name: reqString(raw, "name", where),
    path: reqString(raw, "path", where),
    include: optStringArray(raw, "include", where),
    exclude: optStringArray(raw, "exclude", where),
    busy_timeout_ms: optInt(raw, "busy_timeout_ms", where, 0, 3_600_000) ?? SQLITE_DEFAULT_BUSY_TIMEOUT_MS,
    live_read: optBool(raw, "live_read", where) ?? true,
  };
}
