/**
 * The `sqlite` source, end to end through the library (parseConfig → snapshot → restoreToDir /
 * verifyBundle) on real SQLite files, with real writer processes (test/helpers/sqlite-writer.mjs):
 * a consistent copy under a live writer, WAL-only commits, the layer meta, materialize, bad
 * inputs (each with its error code and nothing left behind), redaction in the copy (with a stub
 * Redactor standing in for src/redact/), deepVerify, and the copy running off the main thread.
 * The live read (the database file itself under a read transaction) has its own file,
 * sqlite-live.test.ts; the copy-path tests here turn it off where they need the copy.
 */
import { spawn, spawnSync, type ChildProcess } from "node:child_process";
import { createHash, randomBytes } from "node:crypto";
import { copyFileSync, existsSync, mkdirSync, readdirSync, readFileSync, statSync, writeFileSync } from "node:fs";
import { createRequire } from "node:module";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Readable } from "node:stream";
import { fileURLToPath } from "node:url";
import { describe, expect, it, vi } from "vitest";
import { isMemsnapError, parseConfig, restoreToDir, snapshot, verifyBundle, type LayerEntry } from "../../src/index.js";
import { candidate as prefilterCandidate } from "../../src/redact/prefilter.js";
import type { RedactionReport, Redactor } from "../../src/redact/types.js";
import { sqliteSource } from "../../src/sources/sqlite/source.js";
import type { SqliteDbMeta } from "../../src/sources/sqlite/meta.js";
import { SqliteWorker, type CopyResult } from "../../src/sources/sqlite/worker-host.js";
import type { Artifact } from "../../src/sources/types.js";
import { readBundle, tempDir } from "../helpers/cli.js";
import { registerSeededBlob } from "../helpers/seeded-blob.js";

// ------------------------------------------------------------------------------ redactor stub

/** The redactor the snapshot pipeline gets: none unless a test installs the stub. */
const redactorHook = vi.hoisted(() => ({ current: undefined as undefined | (() => unknown) }));
vi.mock(import("../../src/redact/index.js"), async (importOriginal) => {
  const mod = await importOriginal();
  return { ...mod, createRedactor: async () => redactorHook.current?.() as Redactor | undefined };
});

const SECRET = /sk_live_[A-Za-z0-9]{16,}/g;

/**
 * A Redactor with one rule (`stub-api-key`: `sk_live_` + 16+ alphanumerics, a Stripe key). Its
 * candidate() is the real pre-filter, as in the production redactor: the live read's scan in
 * the worker uses that pre-filter, so a stub with another candidate() would disagree with it.
 */
class StubRedactor implements Redactor {
  readonly redacted: Record<string, Record<string, number>> = {};
  total = 0;
  scanned = 0;
  candidate(text: string): boolean {
    return prefilterCandidate(text);
  }
  async redactText(text: string, artifact: string): Promise<string> {
    this.scanned += text.length;
    return text.replace(SECRET, () => {
      const r = (this.redacted[artifact] ??= {});
      r["stub-api-key"] = (r["stub-api-key"] ?? 0) + 1;
      this.total++;
      return "[REDACTED:stub-api-key]";
    });
  }
  async scanText(): Promise<void> {}
  async redactArtifact(artifact: Artifact): Promise<Artifact> {
    return artifact;
  }
  report(): RedactionReport {
    return {
      policy: "stub", rules_fired: this.total ? ["stub-api-key"] : [], redacted: this.redacted, unredacted: {},
      total_redacted: this.total, total_unredacted: 0, bytes_scanned: this.scanned,
    };
  }
  async cleanup(): Promise<void> {}
}

// ------------------------------------------------------------------------------ helpers

interface Stmt { run(...a: unknown[]): unknown; get(...a: unknown[]): unknown; all(...a: unknown[]): unknown[]; pluck(): Stmt }
interface Db { prepare(s: string): Stmt; exec(s: string): void; pragma(s: string, o?: { simple?: boolean }): unknown; close(): void; function(name: string, o: { deterministic?: boolean }, f: (...a: unknown[]) => unknown): void }
const Database = createRequire(import.meta.url)("better-sqlite3") as new (p: string, o?: { readonly?: boolean; fileMustExist?: boolean }) => Db;
const WRITER = fileURLToPath(new URL("../helpers/sqlite-writer.mjs", import.meta.url));
const ZSTD_OK = spawnSync("zstd", ["--version"]).error === undefined;
const SQLITE3_OK = spawnSync("sqlite3", ["--version"]).error === undefined;

const sha = (p: string): string => createHash("sha256").update(readFileSync(p)).digest("hex");
const q = <T = unknown>(db: Db, sql: string, ...a: unknown[]): T => db.prepare(sql).pluck().get(...a) as T;

function withDb<T>(path: string, fn: (db: Db) => T, readonly = true): T {
  const db = new Database(path, { readonly, fileMustExist: true });
  try {
    return fn(db);
  } finally {
    db.close();
  }
}

/** Snapshot one sqlite source into `<dir>/out/snap.memsnap`. */
async function snap(baseDir: string, source: Record<string, unknown>, name = "snap.memsnap") {
  const outDir = join(baseDir, "out");
  mkdirSync(outDir, { recursive: true });
  const config = parseConfig({ agent: "scribe", sources: [{ kind: "sqlite", name: "db", ...source }] }, null, baseDir);
  const r = await snapshot({ config, out: join(outDir, name) });
  return { ...r, outDir };
}

/** Snapshot expecting a MemsnapError; returns it, and checks the out dir is left empty. */
async function snapFails(baseDir: string, source: Record<string, unknown>): Promise<{ code: string; message: string; hint?: string; path?: string }> {
  const outDir = join(baseDir, "out-fail");
  mkdirSync(outDir, { recursive: true });
  const config = parseConfig({ agent: "scribe", sources: [{ kind: "sqlite", name: "db", ...source }] }, null, baseDir);
  let err: unknown;
  // Workaround: src/snapshot/snapshot.ts leaves its `outputFailed` promise unobserved when a source
  // fails before its first artifact is packed, so the same error also surfaces as an unhandled
  // rejection (before snapshot() itself rejects). Hold unhandled rejections while this snapshot
  // settles and pass on every one that is not the very error snapshot() threw.
  const others = process.listeners("unhandledRejection");
  process.removeAllListeners("unhandledRejection");
  const held: Array<[unknown, Promise<unknown>]> = [];
  const onUnhandled = (reason: unknown, p: Promise<unknown>): void => { held.push([reason, p]); };
  process.on("unhandledRejection", onUnhandled);
  try {
    try {
      await snapshot({ config, out: join(outDir, "snap.memsnap") });
    } catch (e) {
      err = e;
    }
    await new Promise((res) => setTimeout(res, 20));
  } finally {
    process.removeListener("unhandledRejection", onUnhandled);
    for (const l of others) process.on("unhandledRejection", l);
  }
  for (const [reason, p] of held) if (reason !== err) for (const l of others) l(reason, p);
  expect(isMemsnapError(err), String(err)).toBe(true);
  expect(readdirSync(outDir)).toEqual([]); // no bundle, no temp bundle, no work dir with copies
  return err as { code: string; message: string; hint?: string; path?: string };
}

function metaOf(layers: LayerEntry[], path = "memory.db"): SqliteDbMeta {
  const m = layers[0]!.meta as { databases: Record<string, SqliteDbMeta> };
  return m.databases[path]!;
}

interface Writer { child: ChildProcess; ready: string; stop(): Promise<string> }

/** Start the writer helper and wait until it prints its ready line. */
function startWriter(db: string, args: string[] = []): Promise<Writer> {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, [WRITER, db, ...args], { stdio: ["ignore", "pipe", "pipe"] });
    let out = "";
    let err = "";
    let ready: string | null = null;
    const exited = new Promise<void>((res) => child.once("exit", () => res()));
    child.stdout!.on("data", (b: Buffer) => {
      out += b.toString();
      const nl = out.indexOf("\n");
      if (ready === null && nl >= 0) {
        ready = out.slice(0, nl);
        out = out.slice(nl + 1);
        resolve({
          child, ready,
          stop: async () => {
            child.kill("SIGTERM");
            await exited;
            return out.trim();
          },
        });
      }
    });
    child.stderr!.on("data", (b: Buffer) => { err += b.toString(); });
    child.once("exit", (code) => { if (ready === null) reject(new Error(`writer exited ${code}: ${err}`)); });
  });
}

/** Make a database with `sql`, in WAL mode unless `journal` says otherwise. */
function makeDb(path: string, sql: string, journal: "wal" | "delete" = "wal"): void {
  const db = new Database(path);
  registerSeededBlob(db);
  db.pragma(`journal_mode = ${journal === "wal" ? "WAL" : "DELETE"}`);
  db.exec(sql);
  db.close();
}

/** Every table's rows (sorted), from sqlite_schema order-independent. */
function dump(path: string): Record<string, unknown[]> {
  return withDb(path, (db) => {
    const out: Record<string, unknown[]> = {};
    const names = db.prepare("SELECT name FROM sqlite_schema WHERE type = 'table' AND name NOT LIKE 'sqlite_%' ORDER BY name").pluck().all() as string[];
    for (const n of names) {
      const rows = db.prepare(`SELECT * FROM "${n}"`).all().map((r) => JSON.stringify(r, (_k, v: unknown) => (Buffer.isBuffer(v) ? v.toString("hex") : v)));
      out[n] = rows.sort();
    }
    return out;
  });
}

const randomAlnum = (n: number): string => randomBytes(n * 2).toString("base64").replace(/[^A-Za-z0-9]/g, "").slice(0, n);

// ------------------------------------------------------------------------------ config

describe("sqlite: config", () => {
  it("parses path, include, exclude, busy_timeout_ms (default 5000) and rejects unknown keys", () => {
    const c = parseConfig({ agent: "a", sources: [{ kind: "sqlite", name: "db", path: "db/" }] }, null, "/x");
    expect(c.sources[0]!.cfg).toEqual({ kind: "sqlite", name: "db", path: "db/", include: undefined, exclude: undefined, busy_timeout_ms: 5000, live_read: true });
    const c2 = parseConfig({ agent: "a", sources: [{ kind: "sqlite", name: "db", path: "m.db", busy_timeout_ms: 250, exclude: ["x.db"] }] }, null, "/x");
    expect(c2.sources[0]!.cfg).toMatchObject({ busy_timeout_ms: 250, exclude: ["x.db"] });
    const bad = (s: Record<string, unknown>): string => {
      try {
        parseConfig({ agent: "a", sources: [{ kind: "sqlite", name: "db", path: "m.db", ...s }] }, null, "/x");
      } catch (e) {
        return (e as { code: string }).code;
      }
      return "no error";
    };
    expect(bad({ wal: true })).toBe("MEMSNAP_CONFIG_UNKNOWN_KEY");
    expect(bad({ busy_timeout_ms: -1 })).toBe("MEMSNAP_CONFIG_INVALID");
    expect(bad({ busy_timeout_ms: "5s" })).toBe("MEMSNAP_CONFIG_INVALID");
    expect(bad({ include: "*.db" })).toBe("MEMSNAP_CONFIG_INVALID");
    expect(bad({ live_read: "yes" })).toBe("MEMSNAP_CONFIG_INVALID");
    const c3 = parseConfig({ agent: "a", sources: [{ kind: "sqlite", name: "db", path: "m.db", live_read: false }] }, null, "/x");
    expect(c3.sources[0]!.cfg).toMatchObject({ live_read: false });
  });
});

// ------------------------------------------------------------------------------ consistency under a live writer

describe("sqlite: copy under a live writer", () => {
  it("bundles one committed state: no torn pair, count between before and after, integrity ok", async () => {
    const dir = tempDir("memsnap-sqlite-");
    const db = join(dir, "memory.db");
    // ~45 MB: 40,000 rows of ~1 KB, in 20,000 pairs.
    makeDb(db, `CREATE TABLE pairs (id INTEGER PRIMARY KEY, pair_id INTEGER NOT NULL, side INTEGER NOT NULL, payload TEXT NOT NULL);
      WITH RECURSIVE c(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM c WHERE i < 39999)
      INSERT INTO pairs (pair_id, side, payload) SELECT i / 2 + 1, i % 2, hex(randomblob(500)) FROM c;`);
    expect(statSync(db).size).toBeGreaterThan(40e6);
    const w = await startWriter(db, ["--interval", "10,20", "--payload", "200"]);
    let before = 0, after = 0, t0 = 0, t1 = 0;
    let r!: Awaited<ReturnType<typeof snap>>;
    let report: { commits: number; times: number[] } = { commits: 0, times: [] };
    try {
      await new Promise((res) => setTimeout(res, 200));
      before = withDb(db, (d) => q<number>(d, "SELECT count(*) FROM pairs"));
      t0 = Date.now();
      r = await snap(dir, { path: "memory.db" });
      t1 = Date.now();
      after = withDb(db, (d) => q<number>(d, "SELECT count(*) FROM pairs"));
    } finally {
      report = JSON.parse(await w.stop()) as { commits: number; times: number[] };
    }
    const during = report.times.filter((t) => t >= t0 && t <= t1).length;
    const restored = join(dir, "restored");
    await restoreToDir(r.path, restored);
    const copy = join(restored, "db", "memory.db");
    const { n, torn, integrity } = withDb(copy, (d) => ({
      n: q<number>(d, "SELECT count(*) FROM pairs"),
      torn: d.prepare("SELECT pair_id, count(*) AS c FROM pairs GROUP BY pair_id HAVING c != 2").all(),
      integrity: d.prepare("PRAGMA integrity_check").pluck().all(),
    }));
    const m = metaOf(r.manifest.layers);
    console.log(`[sqlite writer test] db ${(statSync(db).size / 1e6).toFixed(1)} MB; rows before ${before} / bundled ${n} / after ${after}; ` +
      `writer commits during the snapshot: ${during} (of ${report.commits}); snapshot ${t1 - t0} ms, copy ${m.copy_ms} ms (${m.method})`);
    expect(integrity).toEqual(["ok"]);
    expect(torn).toEqual([]);
    expect(n % 2).toBe(0);
    expect(n).toBeGreaterThanOrEqual(before);
    expect(n).toBeLessThanOrEqual(after);
    expect(after).toBeGreaterThan(before); // the writer committed while the snapshot ran
    expect(during).toBeGreaterThanOrEqual(5);
    expect(m.tables.pairs).toBe(n);
    expect(m.method).toBe("vacuum_into"); // the live writer keeps frames in the -wal: no live read
    expect(m.live_read_skipped).toBe("wal_frames");
    expect(m.journal_mode).toBe("wal");
    const v = await verifyBundle(r.path, { deep: true });
    expect(v.findings).toEqual([]);
  });

  it("bundles commits that are only in the -wal file (checkpoints off, writer connection open)", async () => {
    const dir = tempDir("memsnap-sqlite-");
    const db = join(dir, "memory.db");
    const w = await startWriter(db, ["--commits", "600", "--no-checkpoint", "--payload", "300"]);
    try {
      expect(JSON.parse(w.ready)).toMatchObject({ ready: true, commits: 600 });
      expect(statSync(`${db}-wal`).size).toBeGreaterThan(statSync(db).size);
      // The .db file alone lacks those commits: copying it is not a snapshot.
      const naive = join(dir, "naive.db");
      copyFileSync(db, naive);
      const naiveRows = withDb(naive, (d) => { try { return q<number>(d, "SELECT count(*) FROM pairs"); } catch { return 0; } });
      expect(naiveRows).toBeLessThan(1200);
      const dbHash = sha(db);
      const r = await snap(dir, { path: "memory.db" });
      expect(sha(db)).toBe(dbHash); // the live file was not checkpointed into
      expect(existsSync(`${db}-wal`)).toBe(true);
      expect(r.manifest.index!.map((e) => e.path)).toEqual(["db/memory.db"]);
      const restored = join(dir, "restored");
      await restoreToDir(r.path, restored);
      const copy = join(restored, "db", "memory.db");
      expect(readdirSync(join(restored, "db"))).toEqual(["memory.db"]);
      expect(withDb(copy, (d) => q<number>(d, "SELECT count(*) FROM pairs"))).toBe(1200);
      expect(metaOf(r.manifest.layers).tables).toEqual({ pairs: 1200 });
    } finally {
      await w.stop();
    }
  });
});

describe("sqlite: the one-step backup fallback", () => {
  it("copies a consistent state under a live writer in one step", async () => {
    const dir = tempDir("memsnap-sqlite-");
    const db = join(dir, "memory.db");
    makeDb(db, `CREATE TABLE pairs (id INTEGER PRIMARY KEY, pair_id INTEGER NOT NULL, side INTEGER NOT NULL, payload TEXT NOT NULL);
      WITH RECURSIVE c(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM c WHERE i < 19999)
      INSERT INTO pairs (pair_id, side, payload) SELECT i / 2 + 1, i % 2, hex(randomblob(500)) FROM c;`);
    const w = await startWriter(db, ["--interval", "5,10"]);
    const dest = join(dir, "copy.db");
    let r: CopyResult;
    const worker = new SqliteWorker();
    try {
      await new Promise((res) => setTimeout(res, 100));
      r = await worker.call<CopyResult>({ op: "copy", src: db, dest, busyTimeoutMs: 5000, method: "backup" });
    } finally {
      await worker.close();
      await w.stop();
    }
    expect(r.method).toBe("backup");
    expect(r.pragmas.journal_mode).toBe("wal");
    withDb(dest, (d) => {
      expect(d.prepare("PRAGMA integrity_check").pluck().all()).toEqual(["ok"]);
      expect(d.prepare("SELECT pair_id FROM pairs GROUP BY pair_id HAVING count(*) != 2").all()).toEqual([]);
      expect(q<number>(d, "SELECT count(*) FROM pairs")).toBeGreaterThanOrEqual(20000);
    });
  });
});

// ------------------------------------------------------------------------------ meta, restore, materialize

describe("sqlite: meta, restore and materialize", () => {
  it("records the pragmas and row counts, restores WAL mode, and restores the same content", async () => {
    const dir = tempDir("memsnap-sqlite-");
    const db = join(dir, "memory.db");
    makeDb(db, `PRAGMA user_version = 42; PRAGMA application_id = 1297305168;
      CREATE TABLE facts (id INTEGER PRIMARY KEY, subject TEXT, fact TEXT, score REAL, raw BLOB);
      CREATE INDEX facts_subject ON facts (subject);
      CREATE TABLE kv (k TEXT PRIMARY KEY, v TEXT) WITHOUT ROWID;
      CREATE VIRTUAL TABLE search USING fts5 (body);
      WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c WHERE i < 500)
        INSERT INTO facts (subject, fact, score, raw) SELECT 'subj' || (i % 13), 'fact number ' || i, i / 7.0, seeded_blob(16, i) FROM c;
      INSERT INTO kv VALUES ('a', '1'), ('b', '2'), ('c', NULL);
      INSERT INTO search (body) VALUES ('the quick brown fox'), ('jumps over the lazy dog');
      DELETE FROM facts WHERE id % 5 = 0;`);
    const srcDump = dump(db);
    const srcSha = sha(db);
    const r = await snap(dir, { path: "memory.db" });
    const m = metaOf(r.manifest.layers);
    // A WAL database whose -wal is empty (closed cleanly): the file itself, under a read transaction.
    expect(m).toMatchObject({
      method: "live_read", journal_mode: "wal", page_size: 4096, user_version: 42, application_id: 1297305168,
      encoding: "UTF-8", quick_check: "ok", tables: { facts: 400, kv: 3 }, copy_ms: 0,
    });
    expect(r.manifest.index![0]!.sha256).toBe(srcSha);
    expect(m.source_bytes).toBe(statSync(db).size);
    expect(Number.isSafeInteger(m.prepare_ms)).toBe(true);
    expect(Number.isSafeInteger(m.quick_check_ms)).toBe(true);
    expect(m.schema_version).toBe(withDb(db, (d) => d.pragma("schema_version", { simple: true })));
    expect(Object.keys(m.tables)).not.toContain("search_data"); // shadow tables are not listed
    expect(m.copy_bytes).toBe(r.manifest.index![0]!.size);
    expect(Number.isSafeInteger(m.copy_ms)).toBe(true);
    expect(r.manifest.index![0]).toMatchObject({ path: "db/memory.db", kind: "sqlite" });
    const restored = join(dir, "restored");
    await restoreToDir(r.path, restored);
    const copy = join(restored, "db", "memory.db");
    expect(readdirSync(join(restored, "db"))).toEqual(["memory.db"]); // no -wal / -shm left by materialize
    expect(readFileSync(copy).subarray(18, 20)).toEqual(Buffer.from([2, 2])); // WAL in the header
    withDb(copy, (d) => {
      expect(d.pragma("journal_mode", { simple: true })).toBe("wal");
      expect(d.pragma("user_version", { simple: true })).toBe(42);
      expect(d.pragma("application_id", { simple: true })).toBe(1297305168);
      expect(d.prepare("SELECT count(*) FROM search WHERE search MATCH 'fox'").pluck().get()).toBe(1);
    });
    expect(dump(copy)).toEqual(srcDump);
    // The copy path (live reads off) restores the same content.
    const rc = await snap(dir, { path: "memory.db", live_read: false }, "copy.memsnap");
    expect(metaOf(rc.manifest.layers)).toMatchObject({ method: "vacuum_into", live_read_skipped: "disabled", tables: { facts: 400, kv: 3 } });
    await restoreToDir(rc.path, join(dir, "restored-copy"));
    expect(dump(join(dir, "restored-copy", "db", "memory.db"))).toEqual(srcDump);
    if (SQLITE3_OK) {
      const d1 = spawnSync("sqlite3", ["-readonly", db, ".dump"], { encoding: "utf8" });
      const d2 = spawnSync("sqlite3", ["-readonly", copy, ".dump"], { encoding: "utf8" });
      // Same statements; only the order of sqlite_schema rows differs (VACUUM rewrites the schema table).
      const lines = (t: string): string[] => t.split("\n").sort();
      expect(d1.status).toBe(0);
      expect(lines(d2.stdout)).toEqual(lines(d1.stdout));
    }
  });

  it("keeps a rollback-journal database in rollback mode", async () => {
    const dir = tempDir("memsnap-sqlite-");
    makeDb(join(dir, "plain.sqlite"), "CREATE TABLE t (x); INSERT INTO t VALUES (1);", "delete");
    const r = await snap(dir, { path: "plain.sqlite" });
    expect(metaOf(r.manifest.layers, "plain.sqlite").journal_mode).toBe("delete");
    await restoreToDir(r.path, join(dir, "restored"));
    withDb(join(dir, "restored", "db", "plain.sqlite"), (d) => expect(d.pragma("journal_mode", { simple: true })).toBe("delete"));
  });

  it("materialize removes stale -wal/-shm files (never replays a foreign WAL) and switches to WAL", async () => {
    const dir = tempDir("memsnap-sqlite-");
    const layerDir = join(dir, "db");
    mkdirSync(layerDir);
    const mine = join(layerDir, "memory.db");
    makeDb(mine, "CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT); INSERT INTO t (v) VALUES ('mine');", "delete");
    // A WAL from another database with the same schema: if left beside mine it would be replayed into it.
    const other = join(dir, "other.db");
    const o = new Database(other);
    o.pragma("journal_mode = WAL");
    o.pragma("wal_autocheckpoint = 0");
    o.exec("CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT); INSERT INTO t (v) VALUES ('foreign'), ('foreign');");
    copyFileSync(`${other}-wal`, `${mine}-wal`);
    copyFileSync(`${other}-shm`, `${mine}-shm`);
    o.close();
    writeFileSync(join(layerDir, "memory.db-journal"), "stale");
    const layer: LayerEntry = {
      name: "db", kind: "sqlite", schema_version: 1, artifacts: 1, bytes: 0,
      meta: { databases: { "memory.db": { journal_mode: "wal" } } },
    };
    await sqliteSource.materialize!(layerDir, layer);
    expect(readdirSync(layerDir)).toEqual(["memory.db"]);
    withDb(mine, (d) => {
      expect(d.prepare("SELECT v FROM t").pluck().all()).toEqual(["mine"]);
      expect(d.pragma("journal_mode", { simple: true })).toBe("wal");
    });
  });
});

// ------------------------------------------------------------------------------ directories

describe("sqlite: directories", () => {
  it("captures *.db, *.sqlite, *.sqlite3 below a directory, never the side files", async () => {
    const dir = tempDir("memsnap-sqlite-");
    const dbs = join(dir, "dbs");
    mkdirSync(join(dbs, "sub"), { recursive: true });
    makeDb(join(dbs, "a.db"), "CREATE TABLE t (x); INSERT INTO t VALUES (1);");
    makeDb(join(dbs, "b.sqlite"), "CREATE TABLE t (x); INSERT INTO t VALUES (1), (2);", "delete");
    makeDb(join(dbs, "sub", "c.sqlite3"), "CREATE TABLE t (x);");
    writeFileSync(join(dbs, "notes.txt"), "not a database");
    const w = await startWriter(join(dbs, "live.db"), ["--commits", "3"]); // holds live.db-wal and -shm
    try {
      expect(existsSync(join(dbs, "live.db-wal"))).toBe(true);
      const r = await snap(dir, { path: "dbs" });
      expect(r.manifest.index!.map((e) => e.path)).toEqual(["db/a.db", "db/b.sqlite", "db/live.db", "db/sub/c.sqlite3"]);
      const meta = r.manifest.layers[0]!.meta as { databases: Record<string, SqliteDbMeta> };
      expect(Object.keys(meta.databases).sort()).toEqual(["a.db", "b.sqlite", "live.db", "sub/c.sqlite3"]);
      expect(meta.databases["live.db"]!.tables).toEqual({ pairs: 6 });
      // An include that matches everything still never takes the -wal/-shm files (but rejects non-databases).
      const e = await snapFails(dir, { path: "dbs", include: ["*"] });
      expect(e.code).toBe("MEMSNAP_SOURCE_INVALID");
      expect(e.message).toContain("notes.txt");
      const r2 = await snap(dir, { path: "dbs", include: ["*"], exclude: ["*.txt"] }, "all.memsnap");
      expect(r2.manifest.index!.map((x) => x.path)).toEqual(["db/a.db", "db/b.sqlite", "db/live.db", "db/sub/c.sqlite3"]);
      // live.db's -wal/-shm, and those a read-only reader of a WAL database creates (SQLite needs them to read).
      const sideFiles = [...readdirSync(dbs), ...readdirSync(join(dbs, "sub"))].filter((n) => /-(wal|shm)$/.test(n));
      expect(sideFiles).toEqual(expect.arrayContaining(["live.db-wal", "live.db-shm"]));
      expect((r2.manifest.layers[0]!.meta as { skipped: { side_files: number } }).skipped.side_files).toBe(sideFiles.length);
    } finally {
      await w.stop();
    }
  });
});

// ------------------------------------------------------------------------------ bad input

describe("sqlite: bad input", () => {
  it("a file that is not SQLite is MEMSNAP_SOURCE_INVALID naming it", async () => {
    const dir = tempDir("memsnap-sqlite-");
    writeFileSync(join(dir, "memory.db"), "# just some markdown\n".repeat(200));
    const e = await snapFails(dir, { path: "memory.db" });
    expect(e.code).toBe("MEMSNAP_SOURCE_INVALID");
    expect(e.message).toContain(join(dir, "memory.db"));
    expect(e.message).toContain("not an SQLite database");
  });

  it("an encrypted database (random bytes, or a valid header over encrypted pages) is MEMSNAP_SOURCE_INVALID with a hint", async () => {
    const dir = tempDir("memsnap-sqlite-");
    writeFileSync(join(dir, "secret.db"), randomBytes(64 * 1024));
    const e = await snapFails(dir, { path: "secret.db" });
    expect(e.code).toBe("MEMSNAP_SOURCE_INVALID");
    expect(e.message).toContain(join(dir, "secret.db"));
    expect(e.message).toMatch(/encrypted/);
    expect(e.hint).toMatch(/SQLCipher/);
    // A header that claims SQLite over pages that are not (what a damaged or half-encrypted file looks like).
    const fake = Buffer.concat([Buffer.from("SQLite format 3\0", "latin1"), randomBytes(8192 - 16)]);
    writeFileSync(join(dir, "fake.db"), fake);
    const e2 = await snapFails(dir, { path: "fake.db" });
    expect(e2.code).toBe("MEMSNAP_SOURCE_INVALID");
    expect(e2.message).toContain(join(dir, "fake.db"));
  });

  it("a database another process holds an EXCLUSIVE lock on is MEMSNAP_LOCKED after busy_timeout_ms", async () => {
    const dir = tempDir("memsnap-sqlite-");
    const db = join(dir, "memory.db");
    makeDb(db, "CREATE TABLE pairs (id INTEGER PRIMARY KEY, pair_id INTEGER NOT NULL, side INTEGER NOT NULL, payload TEXT NOT NULL);", "delete");
    const w = await startWriter(db, ["--journal", "delete", "--lock", "exclusive"]);
    try {
      const t0 = Date.now();
      const e = await snapFails(dir, { path: "memory.db", busy_timeout_ms: 400 });
      const ms = Date.now() - t0;
      expect(e.code).toBe("MEMSNAP_LOCKED");
      expect(e.message).toContain(db);
      expect(e.hint).toBe("another process holds a write lock; retry or raise busy_timeout_ms");
      expect(ms).toBeGreaterThanOrEqual(350); // it waited for the lock
    } finally {
      await w.stop();
    }
  });

  it("a WAL database held in exclusive locking mode is MEMSNAP_LOCKED", async () => {
    const dir = tempDir("memsnap-sqlite-");
    const db = join(dir, "memory.db");
    const w = await startWriter(db, ["--lock", "wal-exclusive"]);
    try {
      const e = await snapFails(dir, { path: "memory.db", busy_timeout_ms: 200 });
      expect(e.code).toBe("MEMSNAP_LOCKED");
      expect(e.message).toContain(db);
    } finally {
      await w.stop();
    }
  });

  it("a missing database or directory is MEMSNAP_SOURCE_MISSING", async () => {
    const dir = tempDir("memsnap-sqlite-");
    const e = await snapFails(dir, { path: "nope.db" });
    expect(e.code).toBe("MEMSNAP_SOURCE_MISSING");
    expect(e.message).toContain(join(dir, "nope.db"));
    const e2 = await snapFails(dir, { path: "no-dir/" });
    expect(e2.code).toBe("MEMSNAP_SOURCE_MISSING");
  });
});

// ------------------------------------------------------------------------------ redaction

describe("sqlite: redaction in the copy", () => {
  it("rewrites TEXT cells in the copy only; no secret byte remains anywhere in the bundle", async () => {
    const dir = tempDir("memsnap-sqlite-");
    const db = join(dir, "memory.db");
    const secrets = Array.from({ length: 8 }, () => `sk_live_${randomAlnum(24)}`);
    const [s0, s1, s2, s3, s4, s5, s6, s7] = secrets as [string, string, string, string, string, string, string, string];
    makeDb(db, `
      CREATE TABLE notes (id INTEGER PRIMARY KEY, title TEXT, body TEXT, data BLOB);
      CREATE INDEX notes_body ON notes (body);
      CREATE TABLE audit (id INTEGER PRIMARY KEY, old TEXT);
      CREATE TRIGGER notes_audit AFTER UPDATE ON notes BEGIN INSERT INTO audit (old) VALUES (old.body); END;
      CREATE TABLE kv (k TEXT PRIMARY KEY, v TEXT) WITHOUT ROWID;
      CREATE TABLE uniq (id INTEGER PRIMARY KEY, token TEXT UNIQUE);
      CREATE VIRTUAL TABLE fts_own USING fts5 (body);
      CREATE TABLE docs (id INTEGER PRIMARY KEY, content TEXT);
      CREATE VIRTUAL TABLE fts_ext USING fts5 (content, content = 'docs', content_rowid = 'id');
      CREATE TRIGGER docs_ai AFTER INSERT ON docs BEGIN INSERT INTO fts_ext (rowid, content) VALUES (new.id, new.content); END;
    `);
    withDb(db, (d) => {
      const ins = d.prepare("INSERT INTO notes (title, body, data) VALUES (?, ?, ?)");
      d.exec("BEGIN");
      // 3,000 rows, every other one with a secret: more candidates than one batch.
      for (let i = 0; i < 3000; i++) ins.run(`note ${i}`, i % 2 ? `call the api with ${s0} please (${i})` : `plain note ${i}`, randomBytes(8));
      ins.run("big", `${"x".repeat(30_000)} key=${s1} ${"y".repeat(30_000)}`, null); // overflow pages
      ins.run("gone", `deleted ${s7}`, null);
      d.exec("COMMIT");
      d.exec("DELETE FROM notes WHERE title = 'gone'");
      d.prepare("INSERT INTO kv VALUES (?, ?), ('plain', ?)").run(s2, "value", `json {"token":"${s3}"}`);
      d.prepare("INSERT INTO uniq (token) VALUES (?), (?)").run(s4, s5);
      d.prepare("INSERT INTO fts_own (body) VALUES (?), ('nothing here')").run(`remember ${s6} forever`);
      d.prepare("INSERT INTO docs (content) VALUES (?), ('harmless doc')").run(`doc with ${s3}`);
    }, false);
    // (A read-only reader of a WAL database may create an empty -wal and a -shm; the content files must not change.)
    const live = () => ({ db: sha(db), wal: existsSync(`${db}-wal`) && statSync(`${db}-wal`).size > 0 ? sha(`${db}-wal`) : null });
    const liveBefore = live();
    const stub = new StubRedactor();
    redactorHook.current = () => stub;
    let r!: Awaited<ReturnType<typeof snap>>;
    try {
      r = await snap(dir, { path: "memory.db" });
    } finally {
      redactorHook.current = undefined;
    }
    expect(live()).toEqual(liveBefore); // the live database was not touched
    withDb(db, (d) => expect(q<number>(d, `SELECT count(*) FROM notes WHERE body LIKE '%${s0}%'`)).toBe(1500));

    const m = metaOf(r.manifest.layers);
    expect(m).toMatchObject({ method: "vacuum_into", live_read_skipped: "redaction_candidate" });
    expect(m.redaction).toMatchObject({ scrub: "secure_delete+vacuum", cells_redacted: 1500 + 1 + 2 + 2 + 1 + 1 });
    expect(m.redaction!.fts_optimized).toEqual(["fts_own"]);
    expect(m.redaction!.fts_rebuilt).toEqual(["fts_ext"]);
    expect(r.manifest.redaction).toMatchObject({ total_redacted: 1500 + 1 + 2 + 2 + 1 + 1 });

    const restored = join(dir, "restored");
    await restoreToDir(r.path, restored);
    const copy = join(restored, "db", "memory.db");
    withDb(copy, (d) => {
      expect(q<number>(d, "SELECT count(*) FROM notes WHERE body LIKE '%[REDACTED:stub-api-key]%'")).toBe(1501);
      expect(q<string>(d, "SELECT body FROM notes WHERE id = 2")).toBe("call the api with [REDACTED:stub-api-key] please (1)");
      expect(q<string>(d, "SELECT body FROM notes WHERE id = 1")).toBe("plain note 0");
      expect(q<number>(d, "SELECT count(*) FROM audit")).toBe(0); // the audit trigger did not fire …
      expect(q<number>(d, "SELECT count(*) FROM sqlite_schema WHERE type = 'trigger'")).toBe(2); // … and is back
      expect(d.prepare("SELECT k, v FROM kv ORDER BY k").all()).toEqual([
        { k: "[REDACTED:stub-api-key]", v: "value" }, { k: "plain", v: 'json {"token":"[REDACTED:stub-api-key]"}' },
      ]);
      expect(d.prepare("SELECT token FROM uniq ORDER BY id").pluck().all()).toEqual(["[REDACTED:stub-api-key]", "[REDACTED:stub-api-key]#2"]);
      expect(q<string>(d, "SELECT body FROM fts_own WHERE fts_own MATCH 'remember'")).toBe("remember [REDACTED:stub-api-key] forever");
      expect(q<number>(d, "SELECT count(*) FROM fts_own WHERE fts_own MATCH 'REDACTED'")).toBe(1);
      expect(q<number>(d, "SELECT count(*) FROM fts_ext WHERE fts_ext MATCH 'REDACTED'")).toBe(1);
      expect(q<number>(d, `SELECT count(*) FROM fts_own WHERE fts_own MATCH '"${s6.slice(8)}"'`)).toBe(0);
      expect(d.prepare("PRAGMA integrity_check").pluck().all()).toEqual(["ok"]);
    }, false);
    withDb(copy, (d) => {
      d.exec("INSERT INTO fts_own (fts_own) VALUES ('integrity-check'); INSERT INTO fts_ext (fts_ext) VALUES ('integrity-check');");
    }, false);
    // Not one secret (nor its random part, which FTS would index as a token) in the file's bytes.
    const needles = ["sk_live_", ...secrets.map((s) => s.slice(8))];
    const raw = readFileSync(copy);
    for (const n of needles) expect(raw.includes(n), `${n} in the restored file`).toBe(false);
    if (ZSTD_OK) {
      const tar = spawnSync("zstd", ["-dc"], { input: readBundle(r.path).payload, maxBuffer: 1 << 30 });
      expect(tar.status).toBe(0);
      for (const n of needles) expect(tar.stdout.includes(n), `${n} in the payload`).toBe(false);
    }
  });

  it("leaves a database without candidates byte-identical to the plain copy (no rewrite, no VACUUM)", async () => {
    const dir = tempDir("memsnap-sqlite-");
    makeDb(join(dir, "memory.db"), "CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT); CREATE TRIGGER tr AFTER UPDATE ON t BEGIN SELECT 1; END; INSERT INTO t (v) VALUES ('clean'), ('also clean');");
    const stub = new StubRedactor();
    redactorHook.current = () => stub;
    let r!: Awaited<ReturnType<typeof snap>>;
    let live!: Awaited<ReturnType<typeof snap>>;
    try {
      r = await snap(dir, { path: "memory.db", live_read: false });
      live = await snap(dir, { path: "memory.db" }, "live.memsnap");
    } finally {
      redactorHook.current = undefined;
    }
    expect(metaOf(r.manifest.layers).redaction).toMatchObject({ cells_scanned: 2, candidates: 0, cells_redacted: 0, fts_rebuilt: [], fts_optimized: [] });
    expect(metaOf(r.manifest.layers)).toMatchObject({ method: "vacuum_into", live_read_skipped: "disabled" });
    const plain = await snap(dir, { path: "memory.db", live_read: false }, "plain.memsnap");
    expect(r.manifest.index![0]!.size).toBe(plain.manifest.index![0]!.size);
    // With the live read (the default) the scan runs in the worker and the file itself is bundled.
    const lm = metaOf(live.manifest.layers);
    expect(lm.method).toBe("live_read");
    expect(lm.redaction).toMatchObject({ scrub: "none", candidates: 0, cells_redacted: 0, skipped: [] });
    // read from the pages: the 2 cells, plus the schema's own text (type, name, tbl_name, sql of the table and the trigger)
    expect(lm.redaction!.cells_scanned).toBe(2 + 2 * 4);
    expect(live.manifest.index![0]!.sha256).toBe(sha(join(dir, "memory.db")));
    expect(stub.scanned).toBe(0); // nothing reached the redactor on the main thread
  });
});

// ------------------------------------------------------------------------------ deepVerify

describe("sqlite: deepVerify", () => {
  const bytesOf = (b: Buffer): AsyncIterable<Buffer> => Readable.from([b.subarray(0, 1000), b.subarray(1000)]);
  const spools = (): string[] => readdirSync(tmpdir()).filter((n) => n.startsWith("memsnap-sqlite-verify-"));

  it("passes a sound copy and names the artifact of a damaged one; leaves no spool file", async () => {
    const dir = tempDir("memsnap-sqlite-");
    const db = join(dir, "memory.db");
    makeDb(db, `CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT); CREATE INDEX t_v ON t (v);
      WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c WHERE i < 2000) INSERT INTO t (v) SELECT hex(randomblob(40)) FROM c;`, "delete");
    const before = spools().length;
    const good = readFileSync(db);
    const entry = { path: "db/memory.db", layer: "db" };
    expect(await sqliteSource.deepVerify!({ entry, bytes: bytesOf(good) })).toBeNull();
    // Damage b-tree pages in the middle of the file (keep the header intact).
    const bad = Buffer.from(good);
    const pageSize = bad.readUInt16BE(16);
    for (let p = 3; p < 8; p++) bad.fill(0x5a, p * pageSize + 8, p * pageSize + 200);
    const msg = await sqliteSource.deepVerify!({ entry, bytes: bytesOf(bad) });
    expect(msg).toContain("db/memory.db");
    const junk = await sqliteSource.deepVerify!({ entry, bytes: bytesOf(randomBytes(8192)) });
    expect(junk).toContain("db/memory.db");
    expect(spools().length).toBe(before);
  });
});

// ------------------------------------------------------------------------------ off the main thread

describe("sqlite: the copy runs off the main thread", () => {
  it("a timer keeps ticking while VACUUM INTO copies a ~100 MB database", async () => {
    const dir = tempDir("memsnap-sqlite-");
    const db = join(dir, "big.db");
    makeDb(db, `CREATE TABLE notes (id INTEGER PRIMARY KEY, topic TEXT, body TEXT);
      WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c WHERE i < 190000)
      INSERT INTO notes (topic, body) SELECT 't' || (i % 97), hex(randomblob(256)) FROM c;`);
    const mb = (statSync(db).size + (existsSync(`${db}-wal`) ? statSync(`${db}-wal`).size : 0)) / 1e6;
    expect(mb).toBeGreaterThan(90);
    const cfg = sqliteSource.parseConfig({ kind: "sqlite", name: "db", path: "big.db", live_read: false }, "test");
    const work = join(dir, "work");
    mkdirSync(work);
    const cap = await sqliteSource.capture(cfg, { baseDir: dir, tmpDir: work });
    const gaps: number[] = [];
    let last = performance.now();
    const timer = setInterval(() => {
      const now = performance.now();
      gaps.push(now - last);
      last = now;
    }, 5);
    const t0 = performance.now();
    let a: Artifact;
    try {
      const it = cap.artifacts[Symbol.asyncIterator]();
      a = (await it.next()).value as Artifact; // the copy (worker), then quick_check (worker)
      const ms = performance.now() - t0;
      clearInterval(timer);
      const maxGap = Math.max(...gaps);
      const meta = ((await cap.finish!()) as { databases: Record<string, SqliteDbMeta> }).databases["big.db"]!;
      console.log(`[sqlite copy] ${mb.toFixed(1)} MB: VACUUM INTO ${meta.copy_ms} ms = ${(mb / (meta.copy_ms / 1000)).toFixed(0)} MB/s; ` +
        `copy + quick_check ${ms.toFixed(0)} ms; timer ticks ${gaps.length}, longest gap ${maxGap.toFixed(1)} ms`);
      expect(meta.copy_ms).toBeGreaterThan(100);
      expect(maxGap).toBeLessThan(Math.max(100, ms / 4));
      expect(gaps.length).toBeGreaterThan(ms / 5 / 4);
      expect(a.size).toBe(meta.copy_bytes);
      expect(a.kind).toBe("sqlite");
    } finally {
      clearInterval(timer);
      await cap.cleanup?.();
    }
    expect(readdirSync(work)).toEqual([]); // cleanup removed the copy
  }, 120_000);
});
