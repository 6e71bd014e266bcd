/**
 * An incremental snapshot's redaction scan of a database read live covers only the pages that
 * changed since the last snapshot (src/sources/sqlite/worker-changed.ts), and never clears what
 * the full walk of every page would flag: a property against the full walk as the oracle, on
 * real SQLite files changed by real SQL (inserts, updates, deletes, long values on overflow
 * chains, secrets among them) and by raw writes the changed walk cannot vouch for. Then whole
 * incremental snapshots: one row costs the changed pages, a secret inserted since the base is
 * still redacted out of the bundle, and the restore is byte-exact.
 */
import { createHash, randomBytes } from "node:crypto";
import { closeSync, copyFileSync, mkdirSync, openSync, readFileSync, writeSync } from "node:fs";
import { open } from "node:fs/promises";
import { createRequire } from "node:module";
import { join } from "node:path";
import fc from "fast-check";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { parseConfig } from "../../src/config.js";
import { restoreToDir } from "../../src/restore/to-dir.js";
import { snapshot } from "../../src/snapshot/snapshot.js";
import { SqliteWorker, type LiveBeginResult } from "../../src/sources/sqlite/worker-host.js";
import type { SqliteDbMeta } from "../../src/sources/sqlite/meta.js";
import { tempDir } from "../helpers/cli.js";
import { pageTableOf } from "../helpers/page-table.js";

type Db = {
  exec(sql: string): void;
  prepare(sql: string): { run(...a: unknown[]): unknown };
  pragma(s: string): unknown;
  close(): void;
};
const Database = createRequire(import.meta.url)("better-sqlite3") as new (p: string) => Db;

const alnum = (n: number): string =>
  randomBytes(n * 2)
    .toString("base64")
    .replace(/[^A-Za-z0-9]/g, "")
    .slice(0, n);
const SECRET_HEAD = "ghp_";
const secret = (): string => SECRET_HEAD + alnum(36);

/** The table of page hashes the `pages` chunking records (16 bytes of SHA-256 a page). */
const pageTable = (file: string, ps: number): Buffer => pageTableOf(readFileSync(file), ps);

const asText = (v: string | Uint8Array): string => (typeof v === "string" ? v : Buffer.from(v).toString("latin1"));

/** The scan found a secret (or could not clear the database): it is not read live as it is. */
function flagged(r: LiveBeginResult): boolean {
  if (r.eligible) return false;
  if (r.reason !== "redaction_candidate" || !r.candidates) return true;
  return r.candidates.some((v) => asText(v).includes(SECRET_HEAD));
}

describe("sqlite live read: an incremental snapshot scans only the pages that changed", () => {
  let w: SqliteWorker;
  let handle = 0;
  beforeAll(() => {
    w = new SqliteWorker();
  });
  afterAll(async () => {
    await w.close();
  });

  async function begin(path: string, base?: { table: Buffer; pageSize: number }): Promise<LiveBeginResult> {
    const fh = await open(path, "r");
    const h = ++handle;
    try {
      const job = {
        op: "live_begin" as const,
        handle: h,
        src: path,
        fd: fh.fd,
        busyTimeoutMs: 2000,
        redact: true,
        hold: false,
      };
      return await w.call<LiveBeginResult>(base ? { ...job, base } : job);
    } finally {
      await w.call({ op: "live_release", handle: h });
      await fh.close();
    }
  }

  /** A clean base: rows of prose, some long enough for overflow chains, and an index. */
  function makeBase(path: string, ps: number, rows: number): void {
    const db = new Database(path);
    db.pragma(`page_size = ${ps}`);
    db.exec(
      "CREATE TABLE t (id INTEGER PRIMARY KEY, body TEXT, b BLOB); CREATE INDEX t_body ON t (substr(body, 1, 40))",
    );
    const ins = db.prepare("INSERT INTO t (id, body, b) VALUES (?, ?, ?)");
    for (let i = 1; i <= rows; i++) {
      const long = i % 7 === 0 ? "w".repeat(3 * ps) : "";
      ins.run(
        i,
        `note ${i}: the agent learned fact ${i} ${long}`,
        i % 5 === 0 ? Buffer.alloc(ps + 100, i & 0x7f) : null,
      );
    }
    db.close();
  }

  type Op =
    | { op: "insert"; n: number; secret: boolean; blob: boolean }
    | { op: "update"; id: number; n: number; secret: boolean }
    | { op: "delete"; id: number };
  const opArb: fc.Arbitrary<Op> = fc.oneof(
    fc.record({
      op: fc.constant("insert" as const),
      n: fc.integer({ min: 0, max: 9000 }),
      secret: fc.boolean(),
      blob: fc.boolean(),
    }),
    fc.record({
      op: fc.constant("update" as const),
      id: fc.integer({ min: 1, max: 60 }),
      n: fc.integer({ min: 0, max: 9000 }),
      secret: fc.boolean(),
    }),
    fc.record({ op: fc.constant("delete" as const), id: fc.integer({ min: 1, max: 60 }) }),
  );

  function apply(path: string, ops: Op[]): void {
    const db = new Database(path);
    for (const o of ops) {
      const body = (n: number, s: boolean): string =>
        "z".repeat(n) + (s ? ` ${secret()} ` : " plain ") + "y".repeat(n % 97);
      if (o.op === "insert")
        db.prepare("INSERT INTO t (body, b) VALUES (?, ?)").run(body(o.n, o.secret), o.blob ? randomBytes(o.n) : null);
      else if (o.op === "update") db.prepare("UPDATE t SET body = ? WHERE id = ?").run(body(o.n, o.secret), o.id);
      else db.prepare("DELETE FROM t WHERE id = ?").run(o.id);
    }
    db.close();
  }

  it("property: it flags whatever the full walk flags, and mostly walks only the changes", async () => {
    const dir = tempDir("memsnap-sqlite-changed-");
    let runs = 0;
    let changedWalks = 0;
    await fc.assert(
      fc.asyncProperty(
        fc.constantFrom(1024, 4096),
        fc.array(opArb, { minLength: 1, maxLength: 6 }),
        async (ps, ops) => {
          const db = join(dir, `p${++runs}.db`);
          makeBase(db, ps, 60);
          const first = await begin(db);
          expect(first).toMatchObject({ eligible: true, scan: { free_pages: 0 } }); // a clean base, no free page
          const base = { table: pageTable(db, ps), pageSize: ps };
          apply(db, ops);
          const full = await begin(db);
          const inc = await begin(db, base);
          if (inc.scan?.walk === "changed") changedWalks++;
          // never a no where the full walk says yes
          if (flagged(full)) expect({ ops, inc: flagged(inc) }).toEqual({ ops, inc: true });
          // a yes of the full walk stays a yes (the changed walk sees fewer of the harmless candidates)
          if (full.eligible || (full.reason === "redaction_candidate" && !flagged(full))) {
            expect(inc.eligible || (inc.reason === "redaction_candidate" && !flagged(inc))).toBe(true);
          }
        },
      ),
      { numRuns: 60 },
    );
    // the changed walk did run (rather than falling back to the full one every time)
    expect(changedWalks).toBeGreaterThan(runs / 3);
  });

  it("walks only the changed pages after one row, and finds a secret in that row, local or across its overflow chain", async () => {
    const dir = tempDir("memsnap-sqlite-changed-");
    for (const n of [10, 5000, 20000]) {
      const db = join(dir, `one-${n}.db`);
      makeBase(db, 4096, 400);
      const base = { table: pageTable(db, 4096), pageSize: 4096 };
      const pages = readFileSync(db).length / 4096;
      const clean = join(dir, `clean-${n}.db`);
      copyFileSync(db, clean);
      apply(clean, [{ op: "insert", n, secret: false, blob: false }]);
      const c = await begin(clean, base);
      expect(c).toMatchObject({ eligible: true, scan: { walk: "changed" } });
      expect(c.scan!.pages_changed).toBeLessThan(pages / 10);
      // the hashes of the pass, for the pack: the whole file's and each page's, as a reader of the file computes them
      expect(c.pages!.sha256).toBe(createHash("sha256").update(readFileSync(clean)).digest("hex"));
      expect(Buffer.from(c.pages!.table).equals(pageTable(clean, 4096))).toBe(true);
      apply(db, [{ op: "insert", n, secret: true, blob: false }]);
      const r = await begin(db, base);
      expect(r.scan!.walk).toBe("changed");
      expect(flagged(r)).toBe(true);
      expect(r.candidates!.some((v) => asText(v).includes(SECRET_HEAD))).toBe(true);
    }
  });

  it("a secret left in stale space since the base (a row inserted and deleted) is found", async () => {
    const dir = tempDir("memsnap-sqlite-changed-");
    const db = join(dir, "stale.db");
    makeBase(db, 4096, 200);
    const base = { table: pageTable(db, 4096), pageSize: 4096 };
    const d = new Database(db);
    d.prepare("INSERT INTO t (id, body) VALUES (9999, ?)").run(`short ${secret()} row`);
    d.prepare("INSERT INTO t (id, body) VALUES (10000, ?)").run("x".repeat(9000) + secret());
    d.exec("DELETE FROM t WHERE id >= 9999");
    d.close();
    const r = await begin(db, base);
    expect(r.eligible).toBe(false);
    expect(r.reason).toMatch(/^stale_/);
  });

  it("a secret left in the unused tail of a new value's last overflow page is found", async () => {
    const dir = tempDir("memsnap-sqlite-changed-");
    const db = join(dir, "tail.db");
    makeBase(db, 4096, 400);
    const base = { table: pageTable(db, 4096), pageSize: 4096 };
    const d = new Database(db);
    d.prepare("INSERT INTO t (id, body) VALUES (501, ?)").run("b".repeat(16560)); // 489 bytes local, 3 full overflow pages and 3800 bytes on a 4th
    d.close();
    // SQLite zeroes a new overflow page; bytes left in its unused tail (a writer's bug, an old
    // SQLite, a tool that patched the file) are stale space all the same
    const bytes = readFileSync(db);
    let at = -1;
    for (let p = 1; p < bytes.length / 4096 && at < 0; p++) {
      const pg = bytes.subarray(p * 4096, (p + 1) * 4096);
      if (pg.readUInt32BE(0) === 0 && pg[4] === 0x62 && pg[4095] === 0 && pg.indexOf(0, 4) > 0)
        at = p * 4096 + pg.indexOf(0, 4) + 100;
    }
    expect(at).toBeGreaterThan(0);
    const fd = openSync(db, "r+");
    writeSync(fd, Buffer.from(secret()), 0, 40, at);
    closeSync(fd);
    const full = await begin(db);
    expect(full).toMatchObject({ eligible: false, reason: "stale_candidate" });
    const inc = await begin(db, base);
    expect(inc).toMatchObject({ eligible: false, reason: "stale_candidate", scan: { walk: "changed" } });
  });

  it("a table dropped since the base: its pages, unchanged but free now, are scanned as stale space", async () => {
    const dir = tempDir("memsnap-sqlite-changed-");
    const db = join(dir, "dropped.db");
    makeBase(db, 4096, 50);
    // a token-like value: clean as a cell (no rule's anchor), a token run once it is stale space
    const d = new Database(db);
    // (a row a page: the first page freed, the first row's, becomes the freelist trunk and is
    // rewritten; the others are left as they are, and only they hold the token)
    d.exec(`CREATE TABLE tok (v TEXT); WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c WHERE i < 10)
      INSERT INTO tok SELECT printf('%.*c', 3000, 'p') || iif(i > 1, ' id ${"Q7".repeat(16)} end', '') FROM c`);
    d.close();
    const first = await begin(db);
    expect(first).toMatchObject({ eligible: true, scan: { free_pages: 0 } });
    const base = { table: pageTable(db, 4096), pageSize: 4096 };
    const e = new Database(db);
    e.exec("DROP TABLE tok"); // its page goes to the freelist as it is (secure_delete is off)
    e.close();
    const full = await begin(db);
    expect(full).toMatchObject({ eligible: false, reason: "stale_token" });
    const inc = await begin(db, base);
    expect(inc).toMatchObject({ eligible: false, reason: "stale_token", scan: { walk: "changed" } });
    // the token is on a free page the drop did not change (not only on the rewritten trunk)
    const pageOf = Number(/^stale page (\d+)$/.exec(inc.scan!.found ?? "")?.[1]);
    expect(pageTable(db, 4096).subarray(16 * (pageOf - 1), 16 * pageOf)).toEqual(
      base.table.subarray(16 * (pageOf - 1), 16 * pageOf),
    );
  });

  it("falls back to the full walk for what it cannot vouch for: an overflow page written outside SQLite, a base with free pages, most pages changed", async () => {
    const dir = tempDir("memsnap-sqlite-changed-");
    // a secret written into the middle of a long value's overflow page: no changed cell's chain covers that page
    const db = join(dir, "raw.db");
    makeBase(db, 4096, 100);
    const base = { table: pageTable(db, 4096), pageSize: 4096 };
    const bytes = readFileSync(db);
    let at = -1;
    for (let p = 1; p < bytes.length / 4096 && at < 0; p++) {
      const pg = bytes.subarray(p * 4096, (p + 1) * 4096);
      if (pg[0] === 0 && pg.subarray(4, 4092).every((x) => x === 0x77)) at = p * 4096 + 1000; // 'w' x 4088: inside a body
    }
    expect(at).toBeGreaterThan(0);
    const fd = openSync(db, "r+");
    writeSync(fd, Buffer.from(secret()), 0, 40, at);
    closeSync(fd);
    const r = await begin(db, base);
    expect(r.scan!.walk).not.toBe("changed");
    expect(flagged(r)).toBe(true);

    // most pages changed: the full walk is cheaper than a read per changed page
    const many = join(dir, "many.db");
    makeBase(many, 4096, 100);
    const manyBase = { table: pageTable(many, 4096), pageSize: 4096 };
    const m = new Database(many);
    m.exec("UPDATE t SET body = body || ' edited'");
    m.close();
    expect((await begin(many, manyBase)).scan!.walk).not.toBe("changed");

    // another page size than the table's
    const other = await begin(many, { table: manyBase.table, pageSize: 1024 });
    expect(other.scan!.walk).not.toBe("changed");
    expect(other.eligible).toBe(true);

    // a damaged table (too short for the pages): a page past it is changed
    const short = await begin(many, { table: manyBase.table.subarray(0, 32), pageSize: 4096 });
    expect(short.scan!.walk).not.toBe("changed");
  });

  it("a descriptor read on the thread pool is over before live_release answers", async () => {
    const dir = tempDir("memsnap-sqlite-changed-");
    const db = join(dir, "rel.db");
    // 80 MiB in one statement: the hash pass takes long enough for the release to land inside it
    const d = new Database(db);
    d.exec(`CREATE TABLE t (id INTEGER PRIMARY KEY, body TEXT, b BLOB);
      WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c WHERE i < 2000) INSERT INTO t (b) SELECT randomblob(40000) FROM c`);
    d.close();
    const base = { table: pageTable(db, 4096), pageSize: 4096 };
    const fh = await open(db, "r");
    const h = ++handle;
    const job = {
      op: "live_begin" as const,
      handle: h,
      src: db,
      fd: fh.fd,
      busyTimeoutMs: 2000,
      redact: true,
      hold: true,
      base,
    };
    let outcome: unknown = null;
    w.call<LiveBeginResult>(job).then(
      () => (outcome = "done"),
      (e: { sqliteCode?: string }) => (outcome = e.sqliteCode),
    );
    await new Promise((r) => setTimeout(r, 15));
    await w.call({ op: "live_release", handle: h });
    // the scan was stopped by the release, and had answered by the time live_release answered
    // (the host closes the descriptor then: no read of the scan may still be on the pool)
    expect(outcome).toBe("MEMSNAP_RELEASED");
    await fh.close();
    // the worker still answers
    const again = join(dir, "again.db");
    makeBase(again, 4096, 10);
    expect((await begin(again)).eligible).toBe(true);
  });
});

describe("sqlite: incremental snapshots with redaction scan the changes", () => {
  function metaOf(manifest: { layers: Array<{ name: string; meta?: unknown }> }, rel: string): SqliteDbMeta {
    const l = manifest.layers.find((x) => x.name === "db")!;
    return (l.meta as { databases: Record<string, SqliteDbMeta> }).databases[rel]!;
  }

  it("one row: only the changed pages scanned; a secret since the base: copied and redacted; restores byte-exact", async () => {
    const dir = tempDir("memsnap-sqlite-changed-");
    const file = join(dir, "db", "memory.db");
    mkdirSync(join(dir, "db"));
    const d = new Database(file);
    d.pragma("journal_mode = WAL");
    d.exec("CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT, embedding BLOB)");
    const ins = d.prepare("INSERT INTO notes (body, embedding) VALUES (?, ?)");
    for (let i = 0; i < 3000; i++) ins.run(`note ${i} about the garden`, Buffer.alloc(1536, i & 0x3f));
    d.close();
    const config = parseConfig({ agent: "inc", sources: [{ kind: "sqlite", name: "db", path: "db" }] }, null, dir);
    const store = join(dir, "store");
    const opts = { config, store, incremental: true, redact: true };
    const first = await snapshot(opts);
    expect(metaOf(first.manifest, "memory.db").redaction!.live_scan!.walk).not.toBe("changed");

    const add = (body: string): void => {
      const c = new Database(file);
      c.prepare("INSERT INTO notes (body, embedding) VALUES (?, ?)").run(body, Buffer.alloc(1536, 7));
      c.close();
    };
    add("one more note");
    const second = await snapshot(opts);
    const m2 = metaOf(second.manifest, "memory.db");
    expect(m2.method).toBe("live_read");
    expect(m2.redaction!.live_scan).toMatchObject({ walk: "changed" });
    expect(m2.redaction!.live_scan!.pages_changed).toBeLessThan(10);
    const out = join(dir, "restored");
    await restoreToDir(second.path, out, {});
    const sha = (p: string): string => createHash("sha256").update(readFileSync(p)).digest("hex");
    expect(sha(join(out, "db", "memory.db"))).toBe(sha(file));

    const s = secret();
    add(`the token is ${s}`);
    const third = await snapshot(opts);
    const m3 = metaOf(third.manifest, "memory.db");
    expect(m3).toMatchObject({ method: "vacuum_into", live_read_skipped: "redaction_candidate" });
    expect(m3.redaction!.cells_redacted).toBe(1);
    const out3 = join(dir, "restored3");
    await restoreToDir(third.path, out3, {});
    const restored = readFileSync(join(out3, "db", "memory.db"));
    expect(restored.includes(Buffer.from(s))).toBe(false);
    expect(restored.includes(Buffer.from("[REDACTED"))).toBe(true);
  });
});
