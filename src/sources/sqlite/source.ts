/**
 * The `sqlite` source: SQLite databases, each captured as exactly one committed state even
 * while other processes write to them. Every database is opened read-only in a worker thread
 * (../sqlite-worker.ts) and captured inside a read transaction, in one of two ways:
 * - live read (the default where sound; `"live_read": false` turns it off): the database file
 *   itself streams while the worker holds the transaction. Taken for a rollback-journal
 *   database, or a WAL database whose `-wal` is empty, and with redaction only when no cell and
 *   no stale byte holds a redaction candidate (./live-read.ts);
 * - copy: `VACUUM INTO` a temporary file (or a one-step online backup), redacted in the copy
 *   and then rebuilt (./redact-copy.ts).
 * `PRAGMA quick_check` must pass on what is captured; `-wal`/`-shm`/`-journal` never are.
 * The layer meta records per database how it was captured and why (./meta.ts). Why each way
 * is sound, and what it costs: docs/BENCHMARK.md, "SQLite capture notes".
 */
import { createWriteStream } from "node:fs";
import { mkdtemp, rm } from "node:fs/promises";
import { createRequire } from "node:module";
import { tmpdir } from "node:os";
import { basename, join, resolve } from "node:path";
import { Readable } from "node:stream";
import { pipeline } from "node:stream/promises";
import { isPlainObject } from "../../util/config-check.js";
import { runSqliteJob, SqliteJobError, type CheckResult } from "./worker-host.js";
import { pathTarget } from "../live-target.js";
import type { SourceKind } from "../types.js";
import { captureLayer } from "./capture.js";
import { parseSqliteConfig, SIDE_FILE, SQLITE_DEFAULT_INCLUDE, type SqliteConfig } from "./config.js";
import { materializeLayer } from "./materialize.js";

/** SQLite databases, each captured as one committed state under live writers (see the module comment). */
export const sqliteSource: SourceKind<SqliteConfig> = {
  kind: "sqlite",
  schemaVersion: 1,
  // A restored database gets its captured mode (less the umask) and mtime, set after materialize.
  restoresAttributes: true,
  parseConfig: parseSqliteConfig,
  capture: captureLayer,

  async deepVerify({ entry, bytes }) {
    const dir = await mkdtemp(join(tmpdir(), "memsnap-sqlite-verify-"));
    try {
      const file = join(dir, "check.db");
      await pipeline(Readable.from(bytes), createWriteStream(file, { mode: 0o600 }));
      let r: CheckResult;
      try {
        r = await runSqliteJob<CheckResult>({ op: "check", path: file, pragma: "integrity_check", limit: 10 });
      } catch (e) {
        if (e instanceof SqliteJobError) return `${entry.path}: not a sound SQLite database: ${e.message}`;
        throw e;
      }
      if (r.problems.length === 1 && r.problems[0] === "ok") return null;
      const shown = r.problems.slice(0, 3).map((p) => p.replace(/\s+/g, " ").trim());
      const count = r.problems.length >= 10 ? "10+" : r.problems.length;
      return `${entry.path}: integrity_check found ${count} problem(s): ${shown.join("; ")}`;
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  },

  async liveTarget(cfg, baseDir, layer) {
    const abs = resolve(baseDir, cfg.path);
    const dbs =
      isPlainObject(layer.meta) && isPlainObject(layer.meta.databases) ? Object.keys(layer.meta.databases) : [];
    // Whether the layer was one database file (not a directory of them): what matters when the
    // live path is missing (a new machine), else the live path says. Bundles before root_is_file
    // tell by the captured root, a file whose name is the one database's.
    const root = layer.meta?.root;
    const capturedFile =
      typeof layer.meta?.root_is_file === "boolean"
        ? layer.meta.root_is_file
        : dbs.length === 1 && dbs[0] === basename(abs) && typeof root === "string" && basename(root) === dbs[0];
    const t = await pathTarget(abs, capturedFile, {
      include: cfg.include ?? SQLITE_DEFAULT_INCLUDE,
      exclude: cfg.exclude,
    });
    const owns = t.owns!;
    return {
      ...t,
      owns: (rel) => !SIDE_FILE.test(rel) && owns(rel),
      // A restored database never keeps the live -wal/-shm/-journal: they belong to the old file.
      companions: (rel) => ["-wal", "-shm", "-journal"].map((x) => rel + x),
    };
  },

  async planLayer(cfg, baseDir, layer) {
    const dbs = isPlainObject(layer.meta) && isPlainObject(layer.meta.databases) ? layer.meta.databases : {};
    const t = await this.liveTarget!(cfg, baseDir, layer);
    const Database = createRequire(import.meta.url)("better-sqlite3") as typeof import("better-sqlite3");
    const lines: string[] = [];
    for (const [rel, m] of Object.entries(dbs)) {
      const want = isPlainObject(m) && isPlainObject(m.tables) ? (m.tables as Record<string, number>) : {};
      const live: Record<string, number> = {};
      try {
        const db = new Database(join(t.root, rel), { readonly: true, fileMustExist: true });
        try {
          for (const name of Object.keys(want)) {
            try {
              const count = db.prepare(`SELECT count(*) AS n FROM "${name.replace(/"/g, '""')}"`);
              live[name] = (count.get() as { n: number }).n;
            } catch {
              /* table absent live */
            }
          }
        } finally {
          db.close();
        }
      } catch {
        lines.push(`${rel}: not present live (will be created)`);
        continue;
      }
      const deltas = Object.entries(want).map(([name, n]) => {
        const before = live[name];
        if (before === undefined) return `${name} +${n} (new table)`;
        return `${name} ${before} → ${n} (${n - before >= 0 ? "+" : ""}${n - before})`;
      });
      lines.push(`${rel}: rows ${deltas.join(", ") || "(no tables)"}`);
    }
    return lines;
  },

  materialize: materializeLayer,
};
