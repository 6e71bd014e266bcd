/**
 * The `sqlite` source's live read: the database file itself, streamed while the worker holds a
 * read transaction (see docs/BENCHMARK.md, "SQLite capture notes"). End to end through
 * snapshot → restoreToDir on real files, with real writer processes, and at the worker level
 * for the locking claims (a WAL checkpoint and a rollback writer cannot change the file while
 * the transaction is held). Also: when the copy path is taken instead (frames in the -wal, a
 * redaction candidate in a cell or in the stale bytes), that nothing is left held after a
 * snapshot (lock, transaction, descriptor), the look-ahead scan, and that the worker's
 * pre-filter answers as src/redact/prefilter.ts does.
 */
import { spawn, spawnSync } from "node:child_process";
import { createHash, randomBytes } from "node:crypto";
import { existsSync, mkdirSync, readdirSync, readFileSync, readlinkSync, statSync, writeFileSync } from "node:fs";
import { open } from "node:fs/promises";
import { createRequire } from "node:module";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import fc from "fast-check";
import { describe, expect, it, vi } from "vitest";
import { isMemsnapError, parseConfig, restoreToDir, snapshot, type LayerEntry } from "../../src/index.js";
import { candidate as prefilterCandidate } from "../../src/redact/prefilter.js";
import type { RedactionReport, Redactor } from "../../src/redact/types.js";
import { sqliteSource } from "../../src/sources/sqlite/source.js";
import type { SqliteDbMeta } from "../../src/sources/sqlite/meta.js";
import { SqliteWorker, type LiveBeginResult, type LiveVerifyResult } from "../../src/sources/sqlite/worker-host.js";
import type { Artifact } from "../../src/sources/types.js";
import { readBundle, tempDir } from "../helpers/cli.js";
import { registerSeededBlob } from "../helpers/seeded-blob.js";

// ------------------------------------------------------------------------------ redactor stub

const redactorHook = vi.hoisted(() => ({ current: undefined as undefined | (() => unknown) }));
vi.mock(import("../../src/redact/index.js"), async (importOriginal) => {
  const mod = await importOriginal();
  return { ...mod, createRedactor: async () => redactorHook.current?.() as Redactor | undefined };
});

const SECRET = /sk_live_[A-Za-z0-9]{16,}/g;

/** One rule (`stub-api-key`: a Stripe key); candidate() is the real pre-filter, as in production. */
class StubRedactor implements Redactor {
  total = 0;
  scanned = 0;
  readonly redacted: Record<string, Record<string, number>> = {};
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
const BSQL = createRequire(import.meta.url).resolve("better-sqlite3");
const Database = createRequire(import.meta.url)("better-sqlite3") as new (p: string, o?: { readonly?: boolean; fileMustExist?: boolean; timeout?: number }) => Db;
const WRITER = fileURLToPath(new URL("../helpers/sqlite-writer.mjs", import.meta.url));
const ZSTD_OK = spawnSync("zstd", ["--version"]).error === undefined;

const sha = (p: string): string => createHash("sha256").update(readFileSync(p)).digest("hex");
const q = <T = unknown>(db: Db, sql: string, ...a: unknown[]): T => db.prepare(sql).pluck().get(...a) as T;
const randomAlnum = (n: number): string => randomBytes(n * 2).toString("base64").replace(/[^A-Za-z0-9]/g, "").slice(0, n);

function withDb<T>(path: string, fn: (db: Db) => T, readonly = true): T {
  const db = new Database(path, { readonly, fileMustExist: true });
  try {
    return fn(db);
  } finally {
    db.close();
  }
}

function makeDb(path: string, sql: string, journal: "wal" | "delete" = "delete"): void {
  const db = new Database(path);
  registerSeededBlob(db);
  db.pragma(`journal_mode = ${journal === "wal" ? "WAL" : "DELETE"}`);
  db.exec(sql);
  db.close();
}

async function snap(baseDir: string, source: Record<string, unknown>, name = "snap.memsnap", redactor?: Redactor) {
  const outDir = join(baseDir, "out");
  mkdirSync(outDir, { recursive: true });
  const config = parseConfig({ agent: "scribe", sources: [{ kind: "sqlite", name: "db", ...source }] }, null, baseDir);
  redactorHook.current = redactor ? () => redactor : undefined;
  try {
    return await snapshot({ config, out: join(outDir, name) });
  } finally {
    redactorHook.current = undefined;
  }
}

/** Snapshot expecting a MemsnapError (see the note in sqlite.test.ts on the unobserved rejection). */
async function snapFails(baseDir: string, source: Record<string, unknown>): Promise<{ code: string; message: string }> {
  return snapFailsWith(baseDir, source);
}

/** {@link snapFails}, with `redactor` as the snapshot's redactor when given. */
async function snapFailsWith(baseDir: string, source: Record<string, unknown>, redactor?: Redactor): Promise<{ code: string; message: string }> {
  const outDir = join(baseDir, "out-fail");
  mkdirSync(outDir, { recursive: true });
  const config = parseConfig({ agent: "scribe", sources: [{ kind: "sqlite", name: "db", ...source }] }, null, baseDir);
  let err: unknown;
  const others = process.listeners("unhandledRejection");
  process.removeAllListeners("unhandledRejection");
  const held: Array<[unknown, Promise<unknown>]> = [];
  const onUnhandled = (reason: unknown, p: Promise<unknown>): void => { held.push([reason, p]); };
  process.on("unhandledRejection", onUnhandled);
  redactorHook.current = redactor ? () => redactor : undefined;
  try {
    try {
      await snapshot({ config, out: join(outDir, "snap.memsnap") });
    } catch (e) {
      err = e;
    }
    await new Promise((res) => setTimeout(res, 20));
  } finally {
    redactorHook.current = undefined;
    process.removeListener("unhandledRejection", onUnhandled);
    for (const l of others) process.on("unhandledRejection", l);
  }
  for (const [reason, p] of held) if (reason !== err) for (const l of others) l(reason, p);
  expect(isMemsnapError(err), String(err)).toBe(true);
  expect(readdirSync(outDir)).toEqual([]);
  return err as { code: string; message: string };
}

function metaOf(layers: LayerEntry[], path = "memory.db"): SqliteDbMeta {
  return (layers[0]!.meta as { databases: Record<string, SqliteDbMeta> }).databases[path]!;
}

/** The bundle's tar payload (plaintext bundles), for grepping. */
function payloadOf(bundle: string): Buffer {
  const tar = spawnSync("zstd", ["-dc"], { input: readBundle(bundle).payload, maxBuffer: 1 << 30 });
  expect(tar.status).toBe(0);
  return tar.stdout;
}

/** True when another connection can take an EXCLUSIVE lock at once: nothing of ours holds the file. */
function exclusiveFree(path: string): boolean {
  const db = new Database(path, { fileMustExist: true, timeout: 0 });
  try {
    db.exec("BEGIN EXCLUSIVE");
    db.exec("COMMIT");
    return true;
  } catch {
    return false;
  } finally {
    db.close();
  }
}

/** Descriptors of this process open on `path` (Linux; [] elsewhere). */
function openFds(path: string): string[] {
  if (!existsSync("/proc/self/fd")) return [];
  const out: string[] = [];
  for (const fd of readdirSync("/proc/self/fd")) {
    try {
      if (readlinkSync(`/proc/self/fd/${fd}`) === path) out.push(fd);
    } catch { /* closed meanwhile */ }
  }
  return out;
}

/**
 * Run a short SQLite script in a child process (better-sqlite3, not this process: POSIX locks
 * are per process). `body` is the body of a function (db, out) run after opening `dbPath`;
 * `out(x)` prints a JSON line. Resolves with the printed lines once the child exits.
 */
function child(dbPath: string, body: string, timeoutMs = 10_000): Promise<unknown[]> {
  const src = `const D = require(${JSON.stringify(BSQL)}); const db = new D(${JSON.stringify(dbPath)}, { timeout: ${timeoutMs} });
    const out = (x) => process.stdout.write(JSON.stringify(x) + "\\n");
    try { (function (db, out) { ${body} })(db, out); } catch (e) { out({ error: e.code || String(e) }); }`;
  return new Promise((resolve, reject) => {
    const c = spawn(process.execPath, ["-e", src], { stdio: ["ignore", "pipe", "pipe"] });
    let o = "";
    let e = "";
    c.stdout.on("data", (b: Buffer) => { o += b.toString(); });
    c.stderr.on("data", (b: Buffer) => { e += b.toString(); });
    c.once("exit", (code) => (code === 0 ? resolve(o.trim().split("\n").filter(Boolean).map((l) => JSON.parse(l) as unknown)) : reject(new Error(`child exited ${code}: ${e}`))));
  });
}

/** A child that runs `setup`, prints `{"ready":true}` and holds its connection open until killed. */
function holder(dbPath: string, setup: string): Promise<{ stop(): Promise<void> }> {
  const src = `const D = require(${JSON.stringify(BSQL)}); const db = new D(${JSON.stringify(dbPath)}, { timeout: 10000 });
    ${setup}
    process.stdout.write(JSON.stringify({ ready: true }) + "\\n");
    setInterval(() => {}, 1 << 30); process.on("SIGTERM", () => process.exit(0));`;
  return new Promise((resolve, reject) => {
    const c = spawn(process.execPath, ["-e", src], { stdio: ["ignore", "pipe", "pipe"] });
    const exited = new Promise<void>((res) => c.once("exit", () => res()));
    let e = "";
    c.stderr.on("data", (b: Buffer) => { e += b.toString(); });
    c.stdout.once("data", () => resolve({ stop: async () => { c.kill("SIGTERM"); await exited; } }));
    c.once("exit", (code) => reject(new Error(`holder exited ${code}: ${e}`)));
  });
}

interface Writer { stop(): Promise<{ commits: number; times: number[] }> }
function startWriter(db: string, args: string[]): Promise<Writer> {
  return new Promise((resolve, reject) => {
    const c = spawn(process.execPath, [WRITER, db, ...args], { stdio: ["ignore", "pipe", "pipe"] });
    let out = "";
    let ready = false;
    const exited = new Promise<void>((res) => c.once("exit", () => res()));
    c.stdout.on("data", (b: Buffer) => {
      out += b.toString();
      const nl = out.indexOf("\n");
      if (!ready && nl >= 0) {
        ready = true;
        out = out.slice(nl + 1);
        resolve({ stop: async () => { c.kill("SIGTERM"); await exited; return (out.trim() ? JSON.parse(out.trim()) : { commits: 0, times: [] }) as { commits: number; times: number[] }; } });
      }
    });
    c.once("exit", (code) => { if (!ready) reject(new Error(`writer exited ${code}`)); });
  });
}

const PAIRS = `CREATE TABLE pairs (id INTEGER PRIMARY KEY, pair_id INTEGER NOT NULL, side INTEGER NOT NULL, payload TEXT NOT NULL);`;
const fillPairs = (n: number, bytes = 500): string => `WITH RECURSIVE c(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM c WHERE i < ${2 * n - 1})
  INSERT INTO pairs (pair_id, side, payload) SELECT i / 2 + 1, i % 2, hex(randomblob(${bytes / 2})) FROM c;`;

// ------------------------------------------------------------------------------ the fast path

describe("sqlite live read: the database file itself", () => {
  it("a rollback-journal database: the bundled bytes are the file's; nothing stays held afterwards", async () => {
    const dir = tempDir("memsnap-sqlite-live-");
    const db = join(dir, "memory.db");
    makeDb(db, `${PAIRS} ${fillPairs(3000)} DELETE FROM pairs WHERE pair_id % 7 = 0;`);
    const before = sha(db);
    const r = await snap(dir, { path: "memory.db" });
    const m = metaOf(r.manifest.layers);
    expect(m).toMatchObject({ method: "live_read", journal_mode: "delete", quick_check: "ok", copy_ms: 0, copy_bytes: statSync(db).size });
    expect(m.tables).toEqual({ pairs: withDb(db, (d) => q<number>(d, "SELECT count(*) FROM pairs")) });
    expect(m.redaction).toBeUndefined();
    expect(m.live_read_skipped).toBeUndefined();
    expect(r.manifest.index![0]).toMatchObject({ path: "db/memory.db", kind: "sqlite", sha256: before });
    expect(sha(db)).toBe(before); // untouched
    expect(exclusiveFree(db)).toBe(true); // the read transaction was released …
    expect(openFds(db)).toEqual([]); // … and every descriptor closed
    await restoreToDir(r.path, join(dir, "restored"));
    const copy = join(dir, "restored", "db", "memory.db");
    expect(sha(copy)).toBe(before);
    withDb(copy, (d) => expect(d.prepare("PRAGMA integrity_check").pluck().all()).toEqual(["ok"]));
  });

  it("a WAL database checkpointed (TRUNCATE) while its writer stays connected: live read; the file restores and passes integrity_check without its -wal", async () => {
    const dir = tempDir("memsnap-sqlite-live-");
    const db = join(dir, "memory.db");
    const h = await holder(db, `db.pragma("journal_mode = WAL"); db.exec(${JSON.stringify(`${PAIRS} ${fillPairs(500, 200)}`)});
      db.pragma("wal_checkpoint(TRUNCATE)");`);
    try {
      expect(statSync(`${db}-wal`).size).toBe(0); // checkpointed, the writer still holds the database open
      const r = await snap(dir, { path: "memory.db" });
      const m = metaOf(r.manifest.layers);
      expect(m).toMatchObject({ method: "live_read", journal_mode: "wal", tables: { pairs: 1000 } });
      expect(r.manifest.index![0]!.sha256).toBe(sha(db));
      // The bundled file alone, without any -wal, is a sound database.
      const alone = join(dir, "alone");
      mkdirSync(alone);
      writeFileSync(join(alone, "memory.db"), readFileSync(db));
      expect(readFileSync(join(alone, "memory.db")).subarray(18, 20)).toEqual(Buffer.from([2, 2]));
      withDb(join(alone, "memory.db"), (d) => {
        expect(d.prepare("PRAGMA integrity_check").pluck().all()).toEqual(["ok"]);
        expect(q<number>(d, "SELECT count(*) FROM pairs")).toBe(1000);
      });
      await restoreToDir(r.path, join(dir, "restored"));
      expect(readdirSync(join(dir, "restored", "db"))).toEqual(["memory.db"]);
      withDb(join(dir, "restored", "db", "memory.db"), (d) => {
        expect(d.pragma("journal_mode", { simple: true })).toBe("wal");
        expect(d.prepare("PRAGMA integrity_check").pluck().all()).toEqual(["ok"]);
        expect(q<number>(d, "SELECT count(DISTINCT pair_id) FROM pairs")).toBe(500);
      });
    } finally {
      await h.stop();
    }
  });

  it("a WAL database with committed frames in its -wal (writer holding it open): the copy, with the frames", async () => {
    const dir = tempDir("memsnap-sqlite-live-");
    const db = join(dir, "memory.db");
    const w = await startWriter(db, ["--commits", "300", "--no-checkpoint"]);
    try {
      expect(statSync(`${db}-wal`).size).toBeGreaterThan(0);
      const r = await snap(dir, { path: "memory.db" });
      expect(metaOf(r.manifest.layers)).toMatchObject({ method: "vacuum_into", live_read_skipped: "wal_frames", tables: { pairs: 600 } });
      await restoreToDir(r.path, join(dir, "restored"));
      withDb(join(dir, "restored", "db", "memory.db"), (d) => expect(q<number>(d, "SELECT count(*) FROM pairs")).toBe(600));
    } finally {
      await w.stop();
    }
  });

  it("a writer process committing throughout a live read: the bundle is one committed state; the writer waits, then goes on", async () => {
    const dir = tempDir("memsnap-sqlite-live-");
    const db = join(dir, "memory.db");
    makeDb(db, `${PAIRS} ${fillPairs(15000)}`); // ~20 MB, rollback journal
    const w = await startWriter(db, ["--journal", "delete", "--interval", "5,10", "--payload", "200"]);
    let report = { commits: 0, times: [] as number[] };
    let r!: Awaited<ReturnType<typeof snap>>;
    let before = 0;
    let after = 0;
    let t0 = 0;
    let t1 = 0;
    try {
      await new Promise((res) => setTimeout(res, 150));
      before = withDb(db, (d) => q<number>(d, "SELECT count(*) FROM pairs"));
      t0 = Date.now();
      r = await snap(dir, { path: "memory.db" });
      t1 = Date.now();
      await new Promise((res) => setTimeout(res, 150));
      after = withDb(db, (d) => q<number>(d, "SELECT count(*) FROM pairs"));
    } finally {
      report = await w.stop();
    }
    const m = metaOf(r.manifest.layers);
    expect(m.method).toBe("live_read");
    await restoreToDir(r.path, join(dir, "restored"));
    const copy = join(dir, "restored", "db", "memory.db");
    const { n, torn, integrity } = withDb(copy, (d) => ({
      n: q<number>(d, "SELECT count(*) FROM pairs"),
      torn: d.prepare("SELECT pair_id FROM pairs GROUP BY pair_id HAVING count(*) != 2").all(),
      integrity: d.prepare("PRAGMA integrity_check").pluck().all(),
    }));
    expect(integrity).toEqual(["ok"]);
    expect(torn).toEqual([]);
    expect(n).toBeGreaterThanOrEqual(before);
    expect(n).toBeLessThanOrEqual(after);
    expect(m.tables.pairs).toBe(n);
    expect(after).toBeGreaterThan(n); // the writer went on after the read transaction ended
    expect(report.times.filter((t) => t > t1).length).toBeGreaterThan(0);
    // While the file streamed, the writer (committing every 5-10 ms) waited for the lock.
    const during = report.times.filter((t) => t >= t0 && t <= t1 + 50);
    const gap = Math.max(0, ...during.slice(1).map((t, k) => t - during[k]!));
    console.log(`[sqlite live writer] rows before ${before} / bundled ${n} / after ${after}; commits during the snapshot ${during.length}, longest wait ${gap} ms; snapshot ${t1 - t0} ms`);
    expect(gap).toBeGreaterThan(20);
  });
});

// ------------------------------------------------------------------------------ the locking claims, at the worker level

describe("sqlite live read: the held read transaction keeps the file fixed", () => {
  // While the transaction is held the file is read only through the descriptor it was begun with:
  // closing any other descriptor of it in this process would drop the process's POSIX locks.
  const hold = async (w: SqliteWorker, db: string, handle: number) => {
    const fh = await open(db, "r");
    const r = await w.call<LiveBeginResult>({ op: "live_begin", handle, src: db, fd: fh.fd, busyTimeoutMs: 2000, redact: false, hold: true });
    const hash = async (): Promise<string> => {
      const { size } = await fh.stat();
      const buf = Buffer.alloc(size);
      await fh.read(buf, 0, size, 0);
      return createHash("sha256").update(buf).digest("hex");
    };
    return { r, hash, release: async () => { await w.call({ op: "live_release", handle }); await fh.close(); } };
  };

  it("WAL: commits go to the -wal and no checkpoint (PASSIVE, automatic or TRUNCATE) writes the file until the release", async () => {
    const dir = tempDir("memsnap-sqlite-live-");
    const db = join(dir, "memory.db");
    makeDb(db, `${PAIRS} ${fillPairs(200, 100)}`, "wal");
    const w = new SqliteWorker();
    try {
      const h = await hold(w, db, 1);
      expect(h.r).toMatchObject({ eligible: true, walBytes: 0 });
      const fixed = await h.hash();
      const res = await child(db, `db.pragma("wal_autocheckpoint = 1");
        const ins = db.prepare("INSERT INTO pairs (pair_id, side, payload) VALUES (?, 0, 'x')");
        const cps = [];
        for (let i = 0; i < 50; i++) { ins.run(100000 + i); cps.push(db.pragma("wal_checkpoint(PASSIVE)")[0]); }
        db.pragma("busy_timeout = 300");
        let trunc; try { trunc = db.pragma("wal_checkpoint(TRUNCATE)")[0]; } catch (e) { trunc = { error: e.code }; }
        out({ cps: cps.slice(-1), trunc, n: db.prepare("SELECT count(*) FROM pairs").pluck().get() });`);
      const x = res[0] as { cps: Array<{ busy: number; log: number; checkpointed: number }>; trunc: { busy?: number; error?: string }; n: number };
      expect(x.n).toBe(450);
      expect(x.cps[0]!.checkpointed).toBe(0); // nothing could be backfilled …
      expect(x.trunc.busy === 1 || x.trunc.error === "SQLITE_BUSY").toBe(true);
      expect(await h.hash()).toBe(fixed); // … so the file did not change
      expect(statSync(`${db}-wal`).size).toBeGreaterThan(0);
      const v = await w.call<LiveVerifyResult>({ op: "live_verify", handle: 1, limit: 10 });
      expect(v.problems).toEqual(["ok"]);
      expect(v.tables).toEqual({ pairs: 400 }); // the state the transaction began on
      await h.release();
      const res2 = await child(db, `out(db.pragma("wal_checkpoint(TRUNCATE)")[0]);`);
      expect(res2[0]).toMatchObject({ busy: 0 });
      expect(sha(db)).not.toBe(fixed); // released: the checkpoint now writes the file
    } finally {
      await w.close();
    }
  });

  it("rollback journal: a writer cannot commit until the release, then it can", async () => {
    const dir = tempDir("memsnap-sqlite-live-");
    const db = join(dir, "memory.db");
    makeDb(db, `${PAIRS} ${fillPairs(200, 100)}`);
    const w = new SqliteWorker();
    try {
      const h = await hold(w, db, 1);
      expect(h.r.eligible).toBe(true);
      const fixed = await h.hash();
      const res = await child(db, `db.exec("INSERT INTO pairs (pair_id, side, payload) VALUES (-1, 0, 'w')"); out({ ok: true });`, 300);
      expect(res[0]).toEqual({ error: "SQLITE_BUSY" });
      expect(await h.hash()).toBe(fixed);
      await h.release();
      const res2 = await child(db, `db.exec("INSERT INTO pairs (pair_id, side, payload) VALUES (-1, 0, 'w')"); out({ ok: true });`, 300);
      expect(res2[0]).toEqual({ ok: true });
      expect(sha(db)).not.toBe(fixed);
    } finally {
      await w.close();
    }
  });
});

// ------------------------------------------------------------------------------ redaction

describe("sqlite live read: redaction", () => {
  it("a clean database is scanned in the worker and bundled as it is", async () => {
    const dir = tempDir("memsnap-sqlite-live-");
    const db = join(dir, "memory.db");
    makeDb(db, `CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT, n REAL, b BLOB);
      CREATE TABLE kv (k TEXT PRIMARY KEY, v TEXT) WITHOUT ROWID;
      CREATE VIRTUAL TABLE fts USING fts5 (body);
      CREATE VIRTUAL TABLE ftsc USING fts5 (body, content = '');
      WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c WHERE i < 3000)
        INSERT INTO notes (body, n, b) SELECT 'plain note number ' || i, i / 3.0, seeded_blob(64, i) FROM c;
      INSERT INTO kv VALUES ('a', 'one'), ('b', 'two');
      INSERT INTO fts (body) VALUES ('hello there'), ('general kenobi');
      DELETE FROM notes WHERE id % 10 = 0;`);
    const stub = new StubRedactor();
    const r = await snap(dir, { path: "memory.db" }, "snap.memsnap", stub);
    const m = metaOf(r.manifest.layers);
    expect(m.method).toBe("live_read");
    expect(m.redaction).toMatchObject({
      scrub: "none", candidates: 0, cells_redacted: 0,
      skipped: [{ table: "ftsc", reason: "contentless fts5 table: its text cannot be read back" }],
    });
    // 2700 notes, 2 × 2 kv cells, and the FTS table's own content (its shadow table fts_content) among the rest.
    expect(m.redaction!.cells_scanned).toBeGreaterThanOrEqual(2700 + 4 + 2);
    expect(m.redaction!.live_scan).toMatchObject({ candidates: 0 });
    expect(m.redaction!.live_scan!.stale_bytes).toBeGreaterThan(0); // the deleted rows' space was looked at
    expect(r.manifest.index![0]!.sha256).toBe(sha(db));
    expect(stub.scanned).toBe(0);
  });

  it("a candidate in a cell: the copy path, and the secret is redacted in the bundle", async () => {
    const dir = tempDir("memsnap-sqlite-live-");
    const db = join(dir, "memory.db");
    const secret = `sk_live_${randomAlnum(24)}`;
    makeDb(db, `CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT);
      WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c WHERE i < 2000) INSERT INTO notes (body) SELECT 'note ' || i FROM c;
      INSERT INTO notes (body) VALUES ('the key is ${secret} ok');`);
    const stub = new StubRedactor();
    const r = await snap(dir, { path: "memory.db" }, "snap.memsnap", stub);
    const m = metaOf(r.manifest.layers);
    expect(m).toMatchObject({ method: "vacuum_into", live_read_skipped: "redaction_candidate" });
    expect(m.redaction).toMatchObject({ scrub: "secure_delete+vacuum", cells_redacted: 1 });
    await restoreToDir(r.path, join(dir, "restored"));
    withDb(join(dir, "restored", "db", "memory.db"), (d) => expect(q<string>(d, "SELECT body FROM notes WHERE id = 2001")).toBe("the key is [REDACTED:stub-api-key] ok"));
    if (ZSTD_OK) expect(payloadOf(r.path).includes(secret.slice(8))).toBe(false);
  });

  it("a candidate only in an FTS table's own content (a shadow table): the copy path", async () => {
    const dir = tempDir("memsnap-sqlite-live-");
    const db = join(dir, "memory.db");
    const secret = `sk_live_${randomAlnum(24)}`;
    makeDb(db, `CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT); INSERT INTO notes (body) VALUES ('clean');
      CREATE VIRTUAL TABLE search USING fts5 (body); INSERT INTO search (body) VALUES ('remember ${secret} forever'), ('nothing');`);
    const r = await snap(dir, { path: "memory.db" }, "snap.memsnap", new StubRedactor());
    const m = metaOf(r.manifest.layers);
    expect(m).toMatchObject({ method: "vacuum_into", live_read_skipped: "redaction_candidate" });
    expect(m.redaction).toMatchObject({ cells_redacted: 1, fts_optimized: ["search"] });
    if (ZSTD_OK) expect(payloadOf(r.path).includes(secret.slice(8))).toBe(false);
  });

  it("a secret left in free space by a deleted row: the copy path drops it (and a token whose start was overwritten too)", async () => {
    const dir = tempDir("memsnap-sqlite-live-");
    const db = join(dir, "memory.db");
    const secret = `sk_live_${randomAlnum(24)}`;
    makeDb(db, `CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT);
      WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c WHERE i < 500) INSERT INTO notes (body) SELECT 'note ' || i FROM c;
      INSERT INTO notes (id, body) VALUES (10000, 'old: ${secret}');
      DELETE FROM notes WHERE id = 10000;`);
    expect(readFileSync(db).includes(secret)).toBe(true); // the precondition: the bytes are still in the file
    const stub = new StubRedactor();
    const r = await snap(dir, { path: "memory.db" }, "snap.memsnap", stub);
    expect(metaOf(r.manifest.layers)).toMatchObject({ method: "vacuum_into", live_read_skipped: "stale_candidate" });
    if (ZSTD_OK) expect(payloadOf(r.path).includes(secret.slice(8))).toBe(false);

    // No anchor left (what remains when the start of a deleted secret was overwritten): a long token run.
    const db2 = join(dir, "tokens.db");
    const body = `k${randomAlnum(38)}7`;
    makeDb(db2, `CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT);
      INSERT INTO notes (body) VALUES ('keep me'), ('${body}'); DELETE FROM notes WHERE id = 2;`);
    expect(readFileSync(db2).includes(body)).toBe(true);
    const r2 = await snap(dir, { path: "tokens.db" }, "tokens.memsnap", new StubRedactor());
    expect(metaOf(r2.manifest.layers, "tokens.db")).toMatchObject({ method: "vacuum_into", live_read_skipped: "stale_token" });

    // A UTF-16 database with redaction on: its stale text would not show in a latin1 view, so it is copied.
    const db4 = join(dir, "utf16.db");
    const d4 = new Database(db4);
    d4.pragma("encoding = 'UTF-16le'");
    d4.exec("CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT); INSERT INTO notes (body) VALUES ('hello');");
    d4.close();
    const r4 = await snap(dir, { path: "utf16.db" }, "utf16.memsnap", new StubRedactor());
    expect(metaOf(r4.manifest.layers, "utf16.db")).toMatchObject({ method: "vacuum_into", live_read_skipped: "encoding=UTF-16le", encoding: "UTF-16le" });
    expect(metaOf((await snap(dir, { path: "utf16.db" }, "utf16-plain.memsnap")).manifest.layers, "utf16.db").method).toBe("live_read");

    // Deleted prose is no reason to copy.
    const db3 = join(dir, "prose.db");
    makeDb(db3, `CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT);
      INSERT INTO notes (body) VALUES ('keep me'), ('an old thought about lunch, long gone'); DELETE FROM notes WHERE id = 2;`);
    const r3 = await snap(dir, { path: "prose.db" }, "prose.memsnap", new StubRedactor());
    expect(metaOf(r3.manifest.layers, "prose.db").method).toBe("live_read");
  });

  it("look-ahead: the first database is scanned at capture start and the next while one streams; a scan is reused only while nothing changed", async () => {
    const dir = tempDir("memsnap-sqlite-live-");
    const dbs = join(dir, "dbs");
    mkdirSync(dbs);
    for (const n of ["a.db", "b.db", "c.db"]) makeDb(join(dbs, n), `CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT); INSERT INTO t (v) VALUES ('${n} one'), ('${n} two');`, n === "b.db" ? "wal" : "delete");
    const r = await snap(dir, { path: "dbs" }, "snap.memsnap", new StubRedactor());
    const meta = (r.manifest.layers[0]!.meta as { databases: Record<string, SqliteDbMeta> }).databases;
    expect(Object.values(meta).map((m) => m.method)).toEqual(["live_read", "live_read", "live_read"]);
    // The first database is scanned when the capture starts (before its turn), the others while the one before streams.
    expect(meta["a.db"]!.redaction!.live_scan!.reused).toBe(true);
    expect(meta["b.db"]!.redaction!.live_scan!.reused).toBe(true);
    expect(meta["c.db"]!.redaction!.live_scan!.reused).toBe(true);
    for (const n of ["a.db", "b.db", "c.db"]) expect(exclusiveFree(join(dbs, n))).toBe(true);

    // At the worker level: a commit between the look-ahead and the transaction means a new scan.
    const db = join(dbs, "a.db");
    const w = new SqliteWorker();
    const fh = await open(db, "r");
    try {
      const job = { op: "live_begin" as const, handle: 1, src: db, fd: fh.fd, busyTimeoutMs: 2000, redact: true };
      const ahead = await w.call<LiveBeginResult>({ ...job, hold: false });
      expect(ahead).toMatchObject({ eligible: true });
      expect(exclusiveFree(db)).toBe(true); // a look-ahead holds no transaction
      withDb(db, (d) => d.prepare("INSERT INTO t (v) VALUES (?)").run(`sk_live_${randomAlnum(24)}`), false);
      const held = await w.call<LiveBeginResult>({ ...job, hold: true });
      expect(held.reused).toBeUndefined();
      expect(held).toMatchObject({ eligible: false, reason: "redaction_candidate" });
      const again = await w.call<LiveBeginResult>({ ...job, handle: 2, hold: false });
      expect(again.reason).toBe("redaction_candidate");
      const same = await w.call<LiveBeginResult>({ ...job, handle: 2, hold: true });
      expect(same).toMatchObject({ reused: true, reason: "redaction_candidate" });
    } finally {
      await w.close();
      await fh.close();
    }
  });

  it("a source of one database starts one worker; of three, two (the look-ahead's)", async () => {
    for (const n of [1, 3]) {
      const dir = tempDir("memsnap-sqlite-live-");
      const dbs = join(dir, "dbs");
      mkdirSync(dbs);
      for (let i = 0; i < n; i++) makeDb(join(dbs, `d${i}.db`), `CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT); INSERT INTO t (v) VALUES ('row ${i}');`);
      const before = SqliteWorker.started;
      const r = await snap(dir, { path: "dbs" }, "snap.memsnap", new StubRedactor());
      const meta = (r.manifest.layers[0]!.meta as { databases: Record<string, SqliteDbMeta> }).databases;
      expect(Object.values(meta).map((m) => m.method)).toEqual(Array(n).fill("live_read"));
      expect(SqliteWorker.started - before, `${n} database(s)`).toBe(Math.min(n, 2));
    }
  });

  it("look-ahead of a database whose WAL holds frames: it is copied (VACUUM INTO) while the one before streams, then redacted at its turn", async () => {
    const dir = tempDir("memsnap-sqlite-live-");
    const dbs = join(dir, "dbs");
    mkdirSync(dbs);
    makeDb(join(dbs, "a.db"), `${PAIRS} ${fillPairs(2000)}`); // ~2 MB, read live
    const b = join(dbs, "b.db");
    const token = `sk_live_${randomAlnum(24)}`;
    const h = await holder(b, `db.pragma("journal_mode = WAL"); db.pragma("wal_autocheckpoint = 0");
      db.exec(${JSON.stringify(`${PAIRS} ${fillPairs(300, 200)}`)}); db.prepare("INSERT INTO pairs (pair_id, side, payload) VALUES (?, 0, ?)").run(9999, ${JSON.stringify(`key ${token}`)});`);
    const cfg = sqliteSource.parseConfig({ kind: "sqlite", name: "db", path: "dbs" }, "test");
    const work = join(dir, "work");
    mkdirSync(work);
    const copies = (): string[] => readdirSync(work).filter((n) => /^sqlite-.*\.db$/.test(n));
    try {
      expect(statSync(`${b}-wal`).size).toBeGreaterThan(0);
      const cap = await sqliteSource.capture(cfg, { baseDir: dir, tmpDir: work, redactor: new StubRedactor() });
      try {
        const it = cap.artifacts[Symbol.asyncIterator]();
        const a = (await it.next()).value as Artifact;
        expect(a.path).toBe("a.db");
        for await (const _ of a.open() as AsyncIterable<Buffer>) void _;
        await a.check?.();
        // b.db's turn has not come, and its copy is being made (before this change, only then).
        let seen = copies().length;
        for (let i = 0; i < 250 && !seen; i++) {
          await new Promise((res) => setTimeout(res, 20));
          seen = copies().length;
        }
        expect(seen).toBe(1);
        const bArt = (await it.next()).value as Artifact;
        expect(bArt.path).toBe("b.db");
        const bytes: Buffer[] = [];
        for await (const c of bArt.open() as AsyncIterable<Buffer>) bytes.push(Buffer.from(c));
        await bArt.check?.();
        expect((await it.next()).done).toBe(true);
        const m = ((await cap.finish!()) as { databases: Record<string, SqliteDbMeta> }).databases;
        expect(m["a.db"]).toMatchObject({ method: "live_read" });
        expect(m["b.db"]).toMatchObject({ method: "vacuum_into", live_read_skipped: "wal_frames", tables: { pairs: 601 } });
        expect(m["b.db"]!.redaction!.cells_redacted).toBe(1);
        const out = join(dir, "b-copy.db");
        writeFileSync(out, Buffer.concat(bytes));
        withDb(out, (d) => {
          expect(d.prepare("PRAGMA integrity_check").pluck().all()).toEqual(["ok"]);
          expect(q<string>(d, "SELECT payload FROM pairs WHERE pair_id = 9999")).toBe("key [REDACTED:stub-api-key]");
        });
      } finally {
        await cap.cleanup?.();
      }
      expect(copies()).toEqual([]);
    } finally {
      await h.stop();
    }
  });

  it("a copy (hot WAL) is scanned in the worker as a live read is: clean, it is kept as made, no cell goes through the main thread; a secret, or live_read off: rewritten", async () => {
    const dir = tempDir("memsnap-sqlite-live-");
    const db = join(dir, "m.db");
    // notes with float32 embeddings (as sqlite-candidates.test.ts writes them): random-looking
    // bytes that read "Key=V9" in one vector and a URL with a user name in one note are candidates
    // that the redactor clears
    const h = await holder(db, `db.pragma("journal_mode = WAL"); db.pragma("wal_autocheckpoint = 0");
      db.exec("CREATE TABLE chunks (id INTEGER PRIMARY KEY, text TEXT NOT NULL, embedding BLOB NOT NULL)");
      const ins = db.prepare("INSERT INTO chunks (text, embedding) VALUES (?, ?)");
      for (let i = 0; i < 600; i++) {
        const b = Buffer.alloc(1536);
        for (let k = 0; k < 384; k++) b.writeFloatLE(Math.sin(i * 7.1 + k) * 0.01, k * 4);
        if (i === 40) Buffer.from([0xb3, 0x4b, 0x65, 0x79, 0x3d, 0x56, 0x39, 0xf1, 0x00, 0x9a]).copy(b, 100);
        ins.run(i === 200 ? "clone it from ssh://git@example.com/team/notes" : "note " + i + " about the garden", b);
      }`);
    try {
      expect(statSync(`${db}-wal`).size).toBeGreaterThan(0);
      // (a redactor that can say whether a rule matches, as memsnap's does: it clears the BLOBs' candidates)
      class Clearing extends StubRedactor {
        asked = 0;
        async matches(text: string): Promise<boolean> {
          this.asked++;
          return new RegExp(SECRET.source).test(text);
        }
      }
      const clean = new Clearing();
      const r = await snap(dir, { path: "m.db" }, "clean.memsnap", clean);
      const m = metaOf(r.manifest.layers, "m.db");
      expect(m).toMatchObject({ method: "vacuum_into", live_read_skipped: "wal_frames", tables: { chunks: 600 } });
      expect(m.redaction).toMatchObject({ scrub: "none", cells_redacted: 0 });
      expect(m.redaction!.live_scan!.walk).toBeDefined();
      expect(m.redaction!.live_scan!.cells_scanned).toBeGreaterThanOrEqual(1200);
      expect(m.redaction!.candidates).toBeGreaterThanOrEqual(2);
      expect(clean.scanned).toBe(0); // no cell was read as a row and redacted on the main thread
      expect(m.redaction!.candidates).toBe(clean.asked); // the BLOBs' candidates, each cleared
      // restored: the same rows as the live database (WAL folded in)
      const to = join(dir, "restored");
      await restoreToDir(r.path, to);
      const rows = (p: string): string => withDb(p, (d) => `${q(d, "SELECT count(*) FROM chunks")}/${q(d, "SELECT group_concat(text) FROM chunks")}/${q(d, "SELECT hex(embedding) FROM chunks WHERE id = 41")}`);
      expect(rows(join(to, "db", "m.db"))).toBe(rows(db));

      // a secret in the WAL: the scan of the copy finds it, and the copy is rewritten as before
      const token = `sk_live_${randomAlnum(24)}`;
      const w = new Database(db, { timeout: 10000 });
      w.prepare("INSERT INTO chunks (text, embedding) VALUES (?, ?)").run(`key ${token}`, Buffer.alloc(16));
      w.close();
      const found = new Clearing();
      const s = await snap(dir, { path: "m.db" }, "secret.memsnap", found);
      const sm = metaOf(s.manifest.layers, "m.db");
      expect(sm).toMatchObject({ method: "vacuum_into", live_read_skipped: "wal_frames" });
      expect(sm.redaction).toMatchObject({ scrub: "secure_delete+vacuum", cells_redacted: 1 });
      expect(found.total).toBe(1);
      // and with live_read off the copy path is the SQL one, scan or not
      const off = new StubRedactor();
      const o = await snap(dir, { path: "m.db", live_read: false }, "off.memsnap", off);
      expect(metaOf(o.manifest.layers, "m.db").redaction!.live_scan).toBeUndefined();
      expect(off.total).toBe(1);
      expect(off.scanned).toBeGreaterThan(0);
    } finally {
      await h.stop();
    }
  });

  it("a database whose WAL holds frames but whose file is not SQLite: MEMSNAP_SOURCE_INVALID at its turn, as before the look-ahead copied it; nothing left", async () => {
    const dir = tempDir("memsnap-sqlite-live-");
    const dbs = join(dir, "dbs");
    mkdirSync(dbs);
    makeDb(join(dbs, "a.db"), `${PAIRS} ${fillPairs(200)}`);
    writeFileSync(join(dbs, "b.db"), Buffer.from("not a database, just words, words and words\n".repeat(200)));
    writeFileSync(join(dbs, "b.db-wal"), randomBytes(8192));
    const e = await snapFailsWith(dir, { path: "dbs" }, new StubRedactor());
    expect(e.code).toBe("MEMSNAP_SOURCE_INVALID");
    expect(e.message).toContain(join(dbs, "b.db"));
    expect(e.message).toContain("is not an SQLite database");
  });

  it("the worker's pre-filter answers as src/redact/prefilter.ts; joining cells never loses a candidate", async () => {
    const secrets = [
      `sk_live_${randomAlnum(24)}`, `ghp_${randomAlnum(36)}`, "AKIAIOSFODNN7EXAMPLE", `xoxb-123456789012-${randomAlnum(24)}`,
      "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.c2lnbmF0dXJl", "password = hunter2!", '{"api_key": "abc123def456"}',
      "https://bob:s3cret@example.com/x", `Authorization: Bearer ${randomAlnum(32)}1`, "-----BEGIN PRIVATE KEY-----",
      `dapi${randomAlnum(32)}`, `sk-proj-${randomAlnum(40)}`, `glpat-${randomAlnum(20)}`, `SG.${randomAlnum(22)}.${randomAlnum(43)}`,
    ];
    for (const s of secrets) expect(prefilterCandidate(s), s).toBe(true);
    const w = new SqliteWorker();
    try {
      const texts = [...secrets, "plain prose, nothing here", "key", "", "naïve café ☕ 日本語", ...fc.sample(fc.string({ maxLength: 80 }), 300),
        ...fc.sample(fc.string({ unit: fc.constantFrom(..."_-.:=JAKIeyS/@ kpasswordtoken\"'\n"), maxLength: 40 }), 500)];
      const fromWorker = await w.call<boolean[]>({ op: "probe_candidate", texts });
      expect(fromWorker).toEqual(texts.map((t) => prefilterCandidate(t)));
    } finally {
      await w.close();
    }
    // The scan joins cells with a newline: a candidate stays a candidate whatever surrounds it.
    fc.assert(fc.property(fc.array(fc.string({ maxLength: 60 }), { maxLength: 5 }), fc.constantFrom(...secrets), fc.array(fc.string({ maxLength: 60 }), { maxLength: 5 }),
      (pre, s, post) => prefilterCandidate([...pre, s, ...post].join("\n"))), { numRuns: 500 });
  });
});

// ------------------------------------------------------------------------------ failures and release

describe("sqlite live read: the TEXT of every cell is read from the pages", () => {
  // live_begin on one database file (a look-ahead: no transaction held afterwards).
  async function begin(w: SqliteWorker, path: string, handle: number): Promise<LiveBeginResult> {
    const fh = await open(path, "r");
    try {
      const r = await w.call<LiveBeginResult>({ op: "live_begin", handle, src: path, fd: fh.fd, busyTimeoutMs: 2000, redact: true, hold: false });
      await w.call({ op: "live_release", handle });
      return r;
    } finally {
      await fh.close();
    }
  }

  it("a clean database is decided from the pages alone, index b-trees and WITHOUT ROWID tables included", async () => {
    const dir = tempDir("memsnap-sqlite-pages-");
    const db = join(dir, "clean.db");
    makeDb(db, `CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT, b BLOB);
      CREATE INDEX notes_body ON notes (body);
      CREATE TABLE kv (k TEXT PRIMARY KEY, v TEXT) WITHOUT ROWID;
      WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c WHERE i < 500)
        INSERT INTO notes (body, b) SELECT 'note ' || i || ' ' || printf('%.*c', i * 20, 'w'), seeded_blob(3000, i) FROM c;
      INSERT INTO kv VALUES ('a', printf('%.*c', 9000, 'v')), ('b', 'two');`);
    const w = new SqliteWorker();
    try {
      const r = await begin(w, db, 1);
      expect(r).toMatchObject({ eligible: true });
      expect(r.scan).toMatchObject({ cells_via: "pages", candidates: 0 });
      // 500 bodies in the table and 500 more in its index, 2 × 2 kv cells, the schema's own text
      expect(r.scan!.cells_scanned).toBeGreaterThanOrEqual(1000 + 4);
      // the long values were followed onto their overflow pages
      const textBytes = 2 * (500 * 5 + 20 * (500 * 501) / 2) + 9000;
      expect(r.scan!.text_bytes).toBeGreaterThan(textBytes);
    } finally {
      await w.close();
    }
  });

  it("a secret split by a page boundary (local part / overflow page, overflow / overflow, in a table and in an index b-tree) is found", async () => {
    const dir = tempDir("memsnap-sqlite-pages-");
    const secret = `sk_live_${randomAlnum(24)}`;
    // Page size 4096: a table leaf keeps 489..4061 bytes of a long payload local; each overflow
    // page holds 4092. The payload's first bytes are the record header, so a value starting at
    // payload offset h puts the boundary at value offset (local - h); we slide the secret
    // across every such boundary, one database per position (one hit would decide a database).
    const cases: Array<{ name: string; sql: string }> = [];
    const len = 12000;
    for (const table of ["rowid", "without_rowid"] as const) {
      for (const boundary of [0, 1]) {
        for (const shift of [-30, -17, -9, -4, -1, 0, 3]) {
          const name = `${table}-${boundary}-${shift}.db`;
          // where the boundary lands in the value, computed from the payload size
          const P = len + 8; // header (<= 4 bytes) + value, an upper bound good to a few bytes
          const maxLocal = table === "rowid" ? 4061 : 1002;
          const minLocal = 489;
          let k = minLocal + ((P - minLocal) % 4092);
          if (k > maxLocal) k = minLocal;
          const at = Math.max(0, k + boundary * 4092 + shift - 4);
          const body = "x".repeat(at) + secret + "y".repeat(len - at - secret.length);
          const create = table === "rowid" ? "CREATE TABLE t (id INTEGER PRIMARY KEY, body TEXT)" : "CREATE TABLE t (body TEXT PRIMARY KEY) WITHOUT ROWID";
          cases.push({ name, sql: `${create}; INSERT INTO t (body) VALUES ('${body}');` });
        }
      }
    }
    const w = new SqliteWorker();
    try {
      let handle = 0;
      for (const c of cases) {
        const db = join(dir, c.name);
        makeDb(db, c.sql);
        const r = await begin(w, db, ++handle);
        // found by the page walk, which hands the whole value (reassembled from its pages) to the redactor
        const held = (r.candidates ?? []).some((v) => (typeof v === "string" ? v : Buffer.from(v).toString("utf8")).includes(secret));
        expect({ name: c.name, eligible: r.eligible, reason: r.reason, via: r.scan?.cells_via, held }).toEqual({
          name: c.name, eligible: false, reason: "redaction_candidate", via: "pages", held: true,
        });
      }
    } finally {
      await w.close();
    }
  });

  it("a hit in the pages that no rule confirms (the schema's own text) is handed to the redactor, and the file is read live", async () => {
    const dir = tempDir("memsnap-sqlite-pages-");
    const db = join(dir, "schema.db");
    makeDb(db, `CREATE TABLE notes (id INTEGER PRIMARY KEY, token TEXT CHECK (token = lower(token)));
      INSERT INTO notes (token) VALUES ('abc'), ('def');`);
    expect(prefilterCandidate("token = lower(token)")).toBe(true); // the precondition
    const w = new SqliteWorker();
    try {
      const r = await begin(w, db, 1);
      // the walk goes on past the candidate and collects it (no SQL scan of the cells)
      expect(r).toMatchObject({ eligible: false, reason: "redaction_candidate" });
      expect(r.scan).toMatchObject({ cells_via: "pages", candidates: 1 });
      expect(r.candidates).toHaveLength(1);
      expect(String(r.candidates![0])).toContain("token = lower(token)");
    } finally {
      await w.close();
    }
    // (the real redactor finds no rule in it, and the file is read live: sqlite-candidates.test.ts)
  });

  it("property: the page walk never says no where the SQL scan says yes", async () => {
    const dir = tempDir("memsnap-sqlite-pages-");
    const w = new SqliteWorker();
    let handle = 0;
    try {
      await fc.assert(
        fc.asyncProperty(
          fc.array(fc.tuple(fc.integer({ min: 0, max: 20000 }), fc.boolean()), { minLength: 1, maxLength: 6 }),
          fc.integer({ min: 0, max: 5 }),
          fc.constantFrom(1024, 4096, 8192),
          fc.constantFrom("NONE", "FULL"), // FULL: pointer-map pages among the b-tree pages
          async (rows, secretRow, pageSize, autoVacuum) => {
            const db = join(dir, `p${++handle}.db`);
            const secret = `ghp_${randomAlnum(36)}`;
            const values = rows.map(([n, blob], i) => {
              const v = `row${i} ` + (i === secretRow % rows.length ? "z".repeat(n) + secret : "z".repeat(n + 40)); // unique: u's key
              return `(${i}, '${v}', ${blob ? `randomblob(${n})` : "NULL"})`;
            });
            makeDb(db, `PRAGMA page_size = ${pageSize}; PRAGMA auto_vacuum = ${autoVacuum}; CREATE TABLE t (id INTEGER PRIMARY KEY, b TEXT, x BLOB);
              CREATE TABLE u (b TEXT PRIMARY KEY, n INT) WITHOUT ROWID;
              INSERT INTO t VALUES ${values.join(", ")};
              INSERT INTO u SELECT b, id FROM t;`);
            const r = await begin(w, db, handle);
            expect(r).toMatchObject({ eligible: false, reason: "redaction_candidate" });
            // the walk found it, and the value holding it is among the candidates for the redactor
            // (unless the stale bytes hit first: the unused tail of an overflow page can hold a
            // random blob's bytes; then the SQL scan counts the cells, and the file is copied)
            if (r.scan!.cells_via === "pages") {
              const texts = (r.candidates ?? []).map((v) => (typeof v === "string" ? v : Buffer.from(v).toString("utf8")));
              expect(texts.some((t) => t.includes(secret))).toBe(true);
            } else {
              expect(r.scan!.cells_via).toBe("sql");
              expect(r.candidates).toBeUndefined();
            }
          },
        ),
        { numRuns: 40 },
      );
    } finally {
      await w.close();
    }
  });
});

describe("sqlite live read: failures release everything", () => {
  it("a damaged database (sound schema, damaged pages) is MEMSNAP_SOURCE_INVALID, and no lock is left", async () => {
    const dir = tempDir("memsnap-sqlite-live-");
    const db = join(dir, "memory.db");
    makeDb(db, `CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT); CREATE INDEX t_v ON t (v);
      WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c WHERE i < 3000) INSERT INTO t (v) SELECT hex(randomblob(40)) FROM c;`);
    const bad = readFileSync(db);
    const pageSize = bad.readUInt16BE(16);
    for (let p = 3; p < 8; p++) bad.fill(0x5a, p * pageSize + 8, p * pageSize + 200);
    writeFileSync(db, bad);
    const e = await snapFails(dir, { path: "memory.db" });
    expect(e.code).toBe("MEMSNAP_SOURCE_INVALID");
    expect(e.message).toContain(db);
    expect(exclusiveFree(db)).toBe(true);
    expect(openFds(db)).toEqual([]);
  });

  it("a hot journal left by a crashed writer: MEMSNAP_SOURCE_UNREADABLE naming it; the database and journal are left as they are", async () => {
    const dir = tempDir("memsnap-sqlite-live-");
    const db = join(dir, "memory.db");
    makeDb(db, `${PAIRS} ${fillPairs(2000, 200)}`);
    // A writer whose transaction spills pages into the file (tiny cache), killed before it commits.
    const src = `const D = require(${JSON.stringify(BSQL)}); const db = new D(${JSON.stringify(db)});
      db.pragma("cache_size = 10"); db.exec("BEGIN"); db.exec("UPDATE pairs SET payload = payload || 'x'");
      process.stdout.write("ready\\n"); setInterval(() => {}, 1 << 30);`;
    const c = spawn(process.execPath, ["-e", src], { stdio: ["ignore", "pipe", "inherit"] });
    const exited = new Promise<void>((res) => c.once("exit", () => res()));
    await Promise.race([new Promise<void>((res) => c.stdout.once("data", () => res())), exited.then(() => { throw new Error("the writer exited early"); })]);
    c.kill("SIGKILL");
    await exited;
    expect(statSync(`${db}-journal`).size).toBeGreaterThan(0);
    const before = { db: sha(db), journal: sha(`${db}-journal`) };
    for (const live_read of [true, false]) {
      const e = await snapFails(dir, { path: "memory.db", live_read });
      expect(e.code).toBe("MEMSNAP_SOURCE_UNREADABLE");
      expect(e.message).toContain("hot journal");
      expect(e.message).toContain(db);
    }
    expect({ db: sha(db), journal: sha(`${db}-journal`) }).toEqual(before);
  });

  it("an abandoned stream releases the read transaction at once; cleanup closes the rest", async () => {
    const dir = tempDir("memsnap-sqlite-live-");
    const db = join(dir, "memory.db");
    makeDb(db, `${PAIRS} ${fillPairs(3000)}`);
    const cfg = sqliteSource.parseConfig({ kind: "sqlite", name: "db", path: "memory.db" }, "test");
    const work = join(dir, "work");
    mkdirSync(work);
    const cap = await sqliteSource.capture(cfg, { baseDir: dir, tmpDir: work });
    try {
      const a = (await cap.artifacts[Symbol.asyncIterator]().next()).value as Artifact;
      expect(a.size).toBe(statSync(db).size);
      expect(exclusiveFree(db)).toBe(false); // held while the artifact is pending
      const it = (a.open() as AsyncIterable<Buffer>)[Symbol.asyncIterator]();
      const first = await it.next();
      expect((first.value as Buffer).subarray(0, 16).toString("latin1")).toBe("SQLite format 3\0");
      await it.return!();
      let free = false;
      for (let i = 0; i < 100 && !free; i++) {
        await new Promise((res) => setTimeout(res, 20));
        free = exclusiveFree(db);
      }
      expect(free).toBe(true);
    } finally {
      await cap.cleanup?.();
    }
    expect(openFds(db)).toEqual([]);
    expect(readdirSync(work)).toEqual([]);
  });

  it("the redaction scan runs in the worker: a timer keeps ticking while a ~60 MB database is scanned", async () => {
    const dir = tempDir("memsnap-sqlite-live-");
    const db = join(dir, "big.db");
    makeDb(db, `CREATE TABLE notes (id INTEGER PRIMARY KEY, topic TEXT, body TEXT);
      WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c WHERE i < 110000)
      INSERT INTO notes (topic, body) SELECT 't' || (i % 97), 'words and more words ' || hex(randomblob(240)) FROM c;`);
    expect(statSync(db).size).toBeGreaterThan(55e6);
    const cfg = sqliteSource.parseConfig({ kind: "sqlite", name: "db", path: "big.db" }, "test");
    const work = join(dir, "work");
    mkdirSync(work);
    const cap = await sqliteSource.capture(cfg, { baseDir: dir, tmpDir: work, redactor: new StubRedactor() });
    const gaps: number[] = [];
    let last = performance.now();
    const timer = setInterval(() => {
      const now = performance.now();
      gaps.push(now - last);
      last = now;
    }, 5);
    const t0 = performance.now();
    try {
      const a = (await cap.artifacts[Symbol.asyncIterator]().next()).value as Artifact;
      const ms = performance.now() - t0;
      clearInterval(timer);
      const m = ((await cap.finish!()) as { databases: Record<string, SqliteDbMeta> }).databases;
      expect(a.size).toBe(statSync(db).size);
      const maxGap = Math.max(...gaps);
      console.log(`[sqlite live scan] ${(statSync(db).size / 1e6).toFixed(1)} MB: scan + begin ${ms.toFixed(0)} ms; longest timer gap ${maxGap.toFixed(1)} ms`);
      expect(maxGap).toBeLessThan(Math.max(100, ms / 4));
      expect(m["big.db"]).toBeUndefined(); // recorded when the artifact is checked
    } finally {
      clearInterval(timer);
      await cap.cleanup?.();
    }
    expect(exclusiveFree(db)).toBe(true);
  }, 120_000);
});
