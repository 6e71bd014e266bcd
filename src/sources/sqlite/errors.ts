/** SQLite failures as MemsnapErrors that name the database, and the sniff of a file's first bytes. */
import { open, type FileHandle } from "node:fs/promises";
import { MemsnapError } from "../../errors.js";
import { SqliteJobError } from "./worker-host.js";
import { sourceError } from "../walk.js";

const HEADER = Buffer.from("SQLite format 3\0", "latin1");

const ENCRYPTED_HINT =
  "if it is encrypted (SQLCipher or similar) memsnap cannot copy it: " +
  'exclude it ("exclude": [...]) or capture it with a files source while nothing writes it';
/** The hint of a database that fails quick_check. */
export const DAMAGED_HINT =
  "the database is damaged: check it with `sqlite3 FILE 'PRAGMA integrity_check'`, recover or exclude it";

/** Map a SQLite failure on `path` (a source database) to a MemsnapError naming it. */
export function sqliteSourceError(e: unknown, path: string, tmpDir?: string): MemsnapError {
  if (e instanceof MemsnapError) return e;
  const code = e instanceof SqliteJobError ? e.sqliteCode : (e as { code?: unknown } | undefined)?.code;
  const msg = (e as Error | undefined)?.message ?? String(e);
  const c = typeof code === "string" ? code : "";
  if (c.startsWith("SQLITE_BUSY") || c.startsWith("SQLITE_LOCKED")) {
    return new MemsnapError("MEMSNAP_LOCKED", `database ${path} is locked: ${msg}`, {
      path,
      cause: e,
      hint: "another process holds a write lock; retry or raise busy_timeout_ms",
    });
  }
  if (c === "SQLITE_READONLY_ROLLBACK") {
    const text = `database ${path} has a hot journal that a read-only reader cannot roll back: ${msg}`;
    return new MemsnapError("MEMSNAP_SOURCE_UNREADABLE", text, {
      path,
      cause: e,
      hint:
        `a writer crashed mid-transaction and left ${path}-journal: open the database once read-write ` +
        "(e.g. `sqlite3 FILE 'PRAGMA quick_check'`) to roll it back, then retry",
    });
  }
  if (c === "SQLITE_NOTADB") {
    return new MemsnapError("MEMSNAP_SOURCE_INVALID", `${path} is not a readable SQLite database: ${msg}`, {
      path,
      cause: e,
      hint: ENCRYPTED_HINT,
    });
  }
  if (c.startsWith("SQLITE_CORRUPT")) {
    return new MemsnapError("MEMSNAP_SOURCE_INVALID", `database ${path} is damaged: ${msg}`, {
      path,
      cause: e,
      hint: "check it with `sqlite3 FILE 'PRAGMA integrity_check'`; recover it (.recover) or exclude it",
    });
  }
  if (c === "SQLITE_FULL" || c === "ENOSPC") {
    const where = tmpDir ? ` in ${tmpDir}` : "";
    return new MemsnapError("MEMSNAP_DEST_FULL", `no space left for the copy of ${path}${where}`, {
      path: tmpDir ?? path,
      cause: e,
      hint: "free space beside the bundle's destination",
    });
  }
  if (c === "ENOENT") return sourceError(e, path);
  if (c === "MODULE_NOT_FOUND" || c === "ERR_DLOPEN_FAILED") {
    return new MemsnapError("MEMSNAP_INTERNAL", `the sqlite source cannot load better-sqlite3: ${msg}`, {
      cause: e,
      hint: "reinstall memsnap (npm install) so its native dependency is built for this Node",
    });
  }
  return new MemsnapError("MEMSNAP_SOURCE_UNREADABLE", `cannot read database ${path}: ${msg}`, {
    path,
    cause: e,
    hint: "check the file's and its directory's permissions (a WAL database needs its -shm file)",
  });
}

/** Look at a file's first bytes: an SQLite header, empty, or not SQLite (random-looking bytes suggest encryption). */
export async function sniff(path: string): Promise<"sqlite" | "empty" | "other" | "random"> {
  let fh;
  try {
    fh = await open(path, "r");
  } catch (e) {
    throw sourceError(e, path);
  }
  try {
    return await sniffHandle(fh, path);
  } finally {
    await fh.close();
  }
}

export async function sniffHandle(fh: FileHandle, path: string): Promise<"sqlite" | "empty" | "other" | "random"> {
  try {
    const buf = Buffer.alloc(4096);
    const { bytesRead } = await fh.read(buf, 0, buf.length, 0);
    if (bytesRead === 0) return "empty";
    if (bytesRead >= HEADER.length && buf.subarray(0, HEADER.length).equals(HEADER)) return "sqlite";
    const seen = new Set(buf.subarray(0, bytesRead));
    return bytesRead >= 1024 && seen.size >= 200 ? "random" : "other";
  } catch (e) {
    throw sourceError(e, path);
  }
}

export function notSqlite(path: string, kind: "other" | "random"): MemsnapError {
  const why =
    kind === "random"
      ? "it has no 'SQLite format 3' header and its bytes look encrypted"
      : "it has no 'SQLite format 3' header";
  return new MemsnapError("MEMSNAP_SOURCE_INVALID", `${path} is not an SQLite database: ${why}`, {
    path,
    hint:
      kind === "random"
        ? ENCRYPTED_HINT
        : 'remove it from the sqlite source ("exclude") or capture it with a files source',
  });
}
