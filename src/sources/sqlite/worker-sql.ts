/** The SQLite worker's access to better-sqlite3, and the SQL helpers its jobs share. */
import { createRequire } from "node:module";
import { workerData } from "node:worker_threads";
import type { SqliteWorkerData } from "./worker-types.js";

export type DatabaseCtor = typeof import("better-sqlite3");
export type Db = import("better-sqlite3").Database;
/** A row of `PRAGMA table_list`. */
export interface TableListRow {
  schema: string;
  name: string;
  type: string;
  ncol: number;
  wr: number;
  strict: number;
}

let Database: DatabaseCtor | null = null;
/** better-sqlite3, loaded on first use from the path the host resolved. */
export function load(): DatabaseCtor {
  if (!Database) Database = createRequire(import.meta.url)((workerData as SqliteWorkerData).bsqlPath) as DatabaseCtor;
  return Database;
}

/** An SQL identifier, quoted. */
export const qi = (s: unknown): string => '"' + String(s).replace(/"/g, '""') + '"';

/** The ordinary tables of `main` (not `sqlite_%`, shadow or virtual tables), sorted by name. */
export function ordinaryTables(db: Db): string[] {
  return (db.pragma("table_list") as TableListRow[])
    .filter((t) => t.schema === "main" && t.type === "table" && !/^sqlite_/i.test(t.name))
    .map((t) => t.name)
    .sort((a, b) => (a < b ? -1 : a > b ? 1 : 0));
}
