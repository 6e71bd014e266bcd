/**
 * The live read's page walk in native code (native/prefilter/sqlite_walk.c) answers exactly as
 * the JS walk in the worker: the same verdict and the same counts, on crafted databases (every
 * path of the walk: stale regions that the pre-filter clears or not, token runs, cell text
 * returned to JS, overflow chains, reserved bytes, pointer-map pages, damaged pages, bytes past
 * the database's end) and on random ones.
 */
import { spawnSync } from "node:child_process";
import { appendFileSync, closeSync, openSync, readFileSync, readSync, writeFileSync, writeSync } from "node:fs";
import { open } from "node:fs/promises";
import { createRequire } from "node:module";
import { join } from "node:path";
import fc from "fast-check";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { candidate } from "../../src/redact/prefilter.js";
import { nativePrefilter } from "../../src/redact/native.js";
import { SqliteWorker, type LiveBeginResult } from "../../src/sources/sqlite/worker-host.js";
import { tempDir } from "../helpers/cli.js";
import { registerSeededBlob } from "../helpers/seeded-blob.js";

interface Db { exec(sql: string): void; pragma(s: string): unknown; close(): void }
const Database = createRequire(import.meta.url)("better-sqlite3") as new (p: string) => Db;

const ci = process.env.CI === "true";
const walkBuilt = typeof (nativePrefilter() as unknown as { sqliteWalk?: unknown } | null)?.sqliteWalk === "function";

function makeDb(path: string, sql: string): void {
  const db = new Database(path);
  registerSeededBlob(db);
  db.exec(sql);
  db.close();
}

/** Write `text` into the unallocated space of b-tree page `page` (4096-byte pages), `at` bytes into it. */
function writeInGap(path: string, page: number, at: number, text: string): void {
  const fd = openSync(path, "r+");
  try {
    const b = Buffer.alloc(4096);
    readSync(fd, b, 0, 4096, (page - 1) * 4096);
    const ho = page === 1 ? 100 : 0;
    const type = b[ho];
    const ptrEnd = ho + (type === 2 || type === 5 ? 12 : 8) + 2 * b.readUInt16BE(ho + 3);
    const cStart = b.readUInt16BE(ho + 5) || 65536;
    const t = Buffer.from(text);
    expect(ptrEnd + at + t.length, `room in page ${page}'s gap`).toBeLessThanOrEqual(cStart);
    writeSync(fd, t, 0, t.length, (page - 1) * 4096 + ptrEnd + at);
  } finally {
    closeSync(fd);
  }
}

/** Text the native pre-filter does not clear and the finders do (a candidate), or do not. */
const SECRET = "ghp_" + "aB3dE6gH9jK2mN5pQ8sT1vW4yZ7bC0eF3hJ6";
const MAYBE = "note sk-=a and key@sk-J"; // the native scan stops here; the finders find nothing
const TOKEN = "w".repeat(19) + "_4K8x"; // a token run (24 characters, a letter and a digit), no candidate

type Outcome =
  | { ok: true; eligible: boolean; reason?: string; scan?: Record<string, unknown>; candidates?: string[] }
  | { ok: false; error: string };

async function begin(w: SqliteWorker, path: string, handle: number): Promise<Outcome> {
  const fh = await open(path, "r");
  try {
    const r = await w.call<LiveBeginResult>({ op: "live_begin", handle, src: path, fd: fh.fd, busyTimeoutMs: 2000, redact: true, hold: false });
    await w.call({ op: "live_release", handle });
    const { ms: _ms, cells_ms: _cms, walk: _walk, ...scan } = r.scan ?? ({} as Record<string, unknown>);
    // the candidate values handed to the redactor, each with its kind (TEXT or BLOB)
    const candidates = r.candidates?.map((v) => (typeof v === "string" ? "text:" + v : "blob:" + Buffer.from(v).toString("hex")));
    return { ok: true, eligible: r.eligible, reason: r.reason, scan: r.scan ? scan : undefined, candidates };
  } catch (e) {
    return { ok: false, error: String((e as Error).message) };
  } finally {
    await fh.close();
  }
}

describe.runIf(walkBuilt)("sqlite live read: the native page walk answers as the JS walk", () => {
  let native: SqliteWorker;
  let js: SqliteWorker;
  let handle = 0;
  beforeAll(() => {
    native = new SqliteWorker({ walk: "native" });
    js = new SqliteWorker({ walk: "js" });
  });
  afterAll(async () => {
    await native.close();
    await js.close();
  });

  /** Both walks on one file: the same outcome, returned (and the native walk did run). */
  async function both(path: string): Promise<Outcome> {
    const h = ++handle;
    const a = await begin(native, path, h);
    const b = await begin(js, path, h);
    expect(a, path).toEqual(b);
    return a;
  }

  it("the pre-filter strings this test relies on behave as it says", () => {
    expect(candidate(SECRET)).toBe(true);
    expect(candidate(MAYBE)).toBe(false);
    expect(nativePrefilter()!.scan(Buffer.from(MAYBE))).toBeGreaterThanOrEqual(0);
    expect(candidate(TOKEN)).toBe(false);
  });

  it("the walk reports which engine ran", async () => {
    const dir = tempDir("memsnap-walk-");
    const db = join(dir, "one.db");
    makeDb(db, "CREATE TABLE t (x TEXT); INSERT INTO t VALUES ('hello');");
    for (const [w, name] of [[native, "native"], [js, "js"]] as const) {
      const fh = await open(db, "r");
      const r = await w.call<LiveBeginResult>({ op: "live_begin", handle: ++handle, src: db, fd: fh.fd, busyTimeoutMs: 2000, redact: true, hold: false });
      await fh.close();
      expect(r.scan?.walk).toBe(name);
    }
  });

  // Crafted databases: [file, SQL (or a function that builds the file), the outcome both walks must give]
  const crafted: Array<{ name: string; build: (path: string) => void; expect: Record<string, unknown> }> = [
    {
      name: "clean, index and WITHOUT ROWID b-trees, overflow chains",
      build: (p) => makeDb(p, `CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT, b BLOB); CREATE INDEX nb ON notes (body);
        CREATE TABLE kv (k TEXT PRIMARY KEY, v TEXT) WITHOUT ROWID;
        WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c WHERE i < 300)
          INSERT INTO notes (body, b) SELECT 'note ' || i || ' ' || printf('%.*c', i * 25, 'w'), seeded_blob(2000, i) FROM c;
        INSERT INTO kv VALUES ('a', printf('%.*c', 90000, 'v')), ('b', 'two');`),
      expect: { eligible: true, scan: expect.objectContaining({ cells_via: "pages" }) },
    },
    ...[512, 1024, 65536].map((ps) => ({
      name: `page size ${ps}, rows deleted`,
      build: (p: string) => makeDb(p, `PRAGMA page_size = ${ps}; CREATE TABLE t (id INTEGER PRIMARY KEY, x TEXT);
        WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c WHERE i < 400) INSERT INTO t (x) SELECT printf('%.*c', (i * 37) % 3000, 'q') FROM c;
        DELETE FROM t WHERE id % 3 = 0;`),
      expect: { ok: true },
    })),
    {
      name: "a secret in free space",
      build: (p) => makeDb(p, `CREATE TABLE t (id INTEGER PRIMARY KEY, x TEXT);
        WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c WHERE i < 200) INSERT INTO t (x) SELECT 'row ' || i || ' ' || printf('%.*c', 300, 'r') FROM c;
        INSERT INTO t (x) VALUES ('${SECRET}'); DELETE FROM t WHERE x LIKE 'ghp%';`),
      expect: { eligible: false, reason: "stale_candidate" },
    },
    {
      name: "a token run in free space after regions the pre-filter stops at (the walk resumes past them)",
      build: (p) => {
        makeDb(p, `CREATE TABLE a (x TEXT); CREATE TABLE b (x TEXT);
          INSERT INTO a VALUES ('one'), ('two'); INSERT INTO b VALUES ('three');`);
        writeInGap(p, 2, 0, MAYBE);
        writeInGap(p, 3, 0, MAYBE);
        writeInGap(p, 3, 100, `x${MAYBE}x`);
        writeInGap(p, 3, 300, TOKEN);
      },
      expect: { eligible: false, reason: "stale_token", scan: expect.objectContaining({ found: "stale page 3" }) },
    },
    {
      name: "text the pre-filter stops at, in cells and in free space, and nothing more",
      build: (p) => {
        makeDb(p, `CREATE TABLE t (id INTEGER PRIMARY KEY, x TEXT);
          WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c WHERE i < 300) INSERT INTO t (x) SELECT 'row ' || i || ' ' || '${MAYBE}' FROM c;
          INSERT INTO t (x) SELECT printf('%.*c', 70000, 'z') || '${MAYBE}';
          DELETE FROM t WHERE id = 299;`);
        writeInGap(p, 2, 0, MAYBE);
      },
      expect: { eligible: true, scan: expect.objectContaining({ cells_via: "pages" }) },
    },
    {
      name: "a run of 23 token characters in free space is no token",
      build: (p) => {
        makeDb(p, "CREATE TABLE a (x TEXT); INSERT INTO a VALUES ('one');");
        writeInGap(p, 2, 10, TOKEN.slice(1));
      },
      expect: { eligible: true, scan: expect.objectContaining({ cells_via: "pages" }) },
    },
    {
      name: "many short values: the text batch ends at every offset",
      build: (p) => makeDb(p, `CREATE TABLE t (x TEXT);
        WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c WHERE i < 120000) INSERT INTO t (x) SELECT printf('%.*c', (i * 7919) % 61 + 1, 'm') FROM c;`),
      expect: { eligible: true, scan: expect.objectContaining({ cells_via: "pages" }) },
    },
    {
      name: "a secret in a cell (local), and one at the end of an overflow chain",
      build: (p) => makeDb(p, `CREATE TABLE t (id INTEGER PRIMARY KEY, x TEXT);
        INSERT INTO t (x) VALUES ('a'), ('${SECRET}'), (printf('%.*c', 20000, 'z') || '${SECRET}');`),
      // both values collected by the walk for the redactor (no SQL scan)
      expect: { eligible: false, reason: "redaction_candidate", scan: expect.objectContaining({ cells_via: "pages", candidates: 2 }) },
    },
    {
      name: "a secret in a 100 KB value (a buffer of its own)",
      build: (p) => makeDb(p, `CREATE TABLE t (id INTEGER PRIMARY KEY, x TEXT); INSERT INTO t (x) VALUES (printf('%.*c', 100000, 'z') || '${SECRET}');`),
      expect: { eligible: false, reason: "redaction_candidate" },
    },
    {
      name: "auto_vacuum FULL (pointer-map pages) with overflow pages",
      build: (p) => makeDb(p, `PRAGMA auto_vacuum = FULL; CREATE TABLE t (id INTEGER PRIMARY KEY, x TEXT);
        WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c WHERE i < 60) INSERT INTO t (x) SELECT printf('%.*c', 5000 + i * 13, 'o') FROM c;`),
      expect: { ok: true },
    },
    {
      name: "a freelist with a secret on a free page (auto_vacuum NONE)",
      build: (p) => makeDb(p, `CREATE TABLE t (id INTEGER PRIMARY KEY, x TEXT);
        WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c WHERE i < 60) INSERT INTO t (x) SELECT printf('%.*c', 5000, 'o') || '${SECRET}' FROM c;
        DELETE FROM t;`),
      expect: { eligible: false, reason: "stale_candidate" },
    },
    {
      name: "an FTS5 table (its own content in shadow tables)",
      build: (p) => makeDb(p, `CREATE VIRTUAL TABLE f USING fts5(body); INSERT INTO f VALUES ('hello world'), ('${MAYBE}');`),
      expect: { eligible: true },
    },
    {
      name: "reserved bytes at the end of every page (16), with text left there",
      build: (p) => {
        const r = spawnSync("sqlite3", [p, ".filectrl reserve_bytes 16", `CREATE TABLE t (id INTEGER PRIMARY KEY, x TEXT);
          WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c WHERE i < 500) INSERT INTO t (x) SELECT printf('%.*c', 900, 'r') FROM c;`], { encoding: "utf8" });
        expect(r.status, r.stderr).toBe(0);
        // put text the pre-filter stops at into the reserved tail of page 3
        const fd = openSync(p, "r+");
        const hdr = Buffer.alloc(100);
        readSync(fd, hdr, 0, 100, 0);
        expect(hdr[20]).toBe(16);
        writeSync(fd, Buffer.from("sk-=a key@sk-J  "), 0, 16, 3 * 4096 - 16);
        closeSync(fd);
      },
      expect: { eligible: true },
    },
    {
      name: "a chain of 1,200 overlapping freed blocks (more than a page could hold apart)",
      build: (p) => {
        makeDb(p, "CREATE TABLE a (x TEXT); CREATE TABLE b (x TEXT); INSERT INTO b VALUES ('one');");
        // page 2 (table a, empty): content starts at 16; freed blocks at 16, 19, 22, …, 3 bytes
        // apart, each block's last byte also the next one's first. A block: next (2 bytes),
        // size (2 bytes): the size's high byte is 1 and its low byte the next pointer's high byte.
        const pg = Buffer.alloc(4096);
        pg[0] = 13;
        pg.writeUInt16BE(16, 1); // first freed block
        pg.writeUInt16BE(0, 3); // no cells
        pg.writeUInt16BE(16, 5); // content start
        let f = 16;
        let blocks = 1;
        for (; f + 3 <= 3700; f += 3, blocks++) {
          pg[f] = (f + 3) >> 8;
          pg[f + 1] = (f + 3) & 0xff;
          pg[f + 2] = 1;
          pg[f + 3] = (f + 6) >> 8;
        }
        pg.writeUInt16BE(0, f); // the last block: no next (the one before it is 256 bytes long)
        pg.writeUInt16BE(4, f + 2);
        expect(blocks).toBeGreaterThan(4096 / 4);
        const fd = openSync(p, "r+");
        writeSync(fd, pg, 0, 4096, 4096);
        closeSync(fd);
      },
      // the page was read as a b-tree page: its cells (none) come from the pages
      expect: { eligible: true, scan: expect.objectContaining({ cells_via: "pages" }) },
    },
    {
      name: "bytes past the database's end (a partial last page)",
      build: (p) => {
        makeDb(p, `CREATE TABLE t (x TEXT); INSERT INTO t VALUES ('${MAYBE}');`);
        appendFileSync(p, Buffer.from(`tail ${MAYBE} tail ${"k".repeat(900)}`));
      },
      expect: { eligible: true },
    },
    {
      name: "a damaged b-tree page (a cell pointer whose cell runs past the page)",
      build: (p) => {
        makeDb(p, `CREATE TABLE t (id INTEGER PRIMARY KEY, x TEXT);
          WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c WHERE i < 50) INSERT INTO t (x) SELECT printf('%.*c', 50, 'r') FROM c;`);
        const fd = openSync(p, "r+");
        // page 2's first cell pointer: 8 bytes before the page end, so that its cell (read from the
        // page's own bytes, not from past its end, whose contents vary) runs past the page
        writeSync(fd, Buffer.from([0x0f, 0xf8]), 0, 2, 4096 + 8);
        closeSync(fd);
      },
      expect: { ok: false },
    },
  ];

  for (const c of crafted) {
    it(c.name, async () => {
      const dir = tempDir("memsnap-walk-");
      const path = join(dir, "c.db");
      c.build(path);
      const out = await both(path);
      expect(out).toMatchObject(c.expect);
    });
  }

  it("property: random tables, deletes and page sizes give the same answer and counts", async () => {
    const dir = tempDir("memsnap-walk-");
    const pieces = ["plain words ", SECRET, MAYBE, TOKEN, "é ünï ", "x".repeat(700), "y".repeat(5000), "", "\n"];
    let n = 0;
    await fc.assert(
      fc.asyncProperty(
        fc.array(fc.array(fc.integer({ min: 0, max: pieces.length - 1 }), { maxLength: 5 }), { minLength: 1, maxLength: 40 }),
        fc.array(fc.integer({ min: 1, max: 40 }), { maxLength: 20 }),
        fc.constantFrom(512, 1024, 4096, 8192),
        fc.constantFrom("NONE", "FULL"),
        fc.boolean(),
        async (rows, deletes, pageSize, autoVacuum, index) => {
          const path = join(dir, `p${++n}.db`);
          const values = rows.map((r, i) => `(${i + 1}, '${r.map((k) => pieces[k]).join("")}', ${i})`);
          makeDb(path, `PRAGMA page_size = ${pageSize}; PRAGMA auto_vacuum = ${autoVacuum};
            CREATE TABLE t (id INTEGER PRIMARY KEY, x TEXT, n INT); ${index ? "CREATE INDEX tx ON t (x);" : ""}
            CREATE TABLE u (k TEXT PRIMARY KEY, v) WITHOUT ROWID;
            INSERT INTO t VALUES ${values.join(", ")};
            INSERT OR IGNORE INTO u SELECT x, n FROM t;
            ${deletes.length ? `DELETE FROM t WHERE id IN (${deletes.join(", ")}); DELETE FROM u WHERE v IN (${deletes.join(", ")});` : ""}`);
          await both(path);
        },
      ),
      { numRuns: Number(process.env.WALK_RUNS ?? 60) },
    );
  });
});

describe.runIf(walkBuilt)("sqlite live read: the native page walk on damaged pages", () => {
  it("property: bytes overwritten anywhere in the b-tree pages give the same answer in both walks (and no crash)", async () => {
    const native = new SqliteWorker({ walk: "native" });
    const js = new SqliteWorker({ walk: "js" });
    const dir = tempDir("memsnap-walk-fuzz-");
    const base = join(dir, "base.db");
    makeDb(base, `PRAGMA page_size = 1024; PRAGMA secure_delete = ON; CREATE TABLE t (id INTEGER PRIMARY KEY, x TEXT); CREATE INDEX tx ON t (x);
      CREATE TABLE u (k TEXT PRIMARY KEY, v) WITHOUT ROWID;
      WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c WHERE i < 120)
        INSERT INTO t (x) SELECT 'row ' || i || ' ' || printf('%.*c', (i * 53) % 1500, 'f') FROM c;
      INSERT INTO u SELECT x, id FROM t WHERE id % 3 = 0; DELETE FROM t WHERE id % 7 = 0;`);
    const bytes = readFileSync(base);
    let n = 0;
    try {
      await fc.assert(
        fc.asyncProperty(
          // (offset in the file past page 1, value): header bytes, cell pointers, record headers, freed-block chains
          fc.array(fc.tuple(fc.integer({ min: 1024, max: bytes.length - 1 }), fc.integer({ min: 0, max: 255 }), fc.boolean()), { minLength: 1, maxLength: 12 }),
          async (edits) => {
            const b = Buffer.from(bytes);
            // half the edits land in the first 16 bytes of a page (its header), the rest anywhere
            for (const [off, v, head] of edits) b[head ? off - (off % 1024) + (off % 16) : off] = v;
            const path = join(dir, `f${++n}.db`);
            writeFileSync(path, b);
            const a = await begin(native, path, n);
            const c = await begin(js, path, n);
            expect(a).toEqual(c);
          },
        ),
        { numRuns: Number(process.env.WALK_RUNS ?? 80) },
      );
    } finally {
      await native.close();
      await js.close();
    }
  });
});

describe("sqlite live read: the native page walk is built", () => {
  it.runIf(ci)("native/prefilter has sqliteWalk in CI", () => {
    expect(walkBuilt, "npm ci builds native/prefilter (prefilter.c and sqlite_walk.c) with node-gyp").toBe(true);
  });
});
