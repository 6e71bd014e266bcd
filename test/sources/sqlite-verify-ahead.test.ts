/**
 * An incremental snapshot's live read runs quick_check and the row counts while its changed-page
 * pass hashes on the thread pool (src/sources/sqlite/worker-changed.ts, native/aead `hashRange`):
 * the pool's hashes must be node:crypto's, and live_verify must answer with a check of the very
 * state it is asked about — never with a look-ahead's check of a state a writer has moved on from.
 */
import { createHash, randomBytes } from "node:crypto";
import { closeSync, openSync, readFileSync, writeFileSync } from "node:fs";
import { open } from "node:fs/promises";
import { createRequire } from "node:module";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { aeadAddon } from "../../src/codecs/aead.js";
import { SqliteWorker, type LiveBeginResult } from "../../src/sources/sqlite/worker-host.js";
import type { LiveVerifyResult } from "../../src/sources/sqlite/worker-types.js";
import { tempDir } from "../helpers/cli.js";
import { pageTableOf } from "../helpers/page-table.js";

type Db = {
  exec(sql: string): void;
  prepare(sql: string): { run(...a: unknown[]): unknown; pluck(): { get(): unknown } };
  pragma(s: string): unknown;
  close(): void;
};
const Database = createRequire(import.meta.url)("better-sqlite3") as new (p: string) => Db;

const pageTable = pageTableOf;

const addon = aeadAddon();
// CI builds the addon (npm ci); a machine without a compiler runs the JS pass, and says so here.
const haveRange = typeof addon?.hashRange === "function";

describe("native hashRange: the page table and the whole range's SHA-256 on the thread pool", () => {
  it.skipIf(!haveRange && !process.env.CI)(
    "equals node:crypto's, for whole and short last pages, and says when the file is short",
    async () => {
      expect(haveRange).toBe(true);
      const hashRange = addon!.hashRange!.bind(addon);
      const run = (fd: number, pos: number, len: number, ps: number, out: Buffer): Promise<[number, number]> =>
        new Promise((res) => hashRange(fd, pos, len, ps, out, (errno, got) => res([errno, got])));
      const dir = tempDir("memsnap-hashrange-");
      const file = join(dir, "f.bin");
      // 3 MiB + 1,000 bytes: blocks of 1 MiB, pages of every size, a zero run among random bytes
      const bytes = Buffer.concat([randomBytes(1 << 20), Buffer.alloc(1 << 20), randomBytes((1 << 20) + 1000)]);
      writeFileSync(file, bytes);
      const fd = openSync(file, "r");
      try {
        for (const ps of [512, 4096, 65536]) {
          const out = Buffer.alloc(16 * Math.ceil(bytes.length / ps));
          expect(await run(fd, 0, bytes.length, ps, out)).toEqual([0, bytes.length]);
          expect(out.equals(pageTable(bytes, ps))).toBe(true);
          // a range that starts inside the file, on a page boundary
          const from = 5 * ps;
          const part = Buffer.alloc(16 * Math.ceil((bytes.length - from) / ps));
          expect(await run(fd, from, bytes.length - from, ps, part)).toEqual([0, bytes.length - from]);
          expect(part.equals(pageTable(bytes.subarray(from), ps))).toBe(true);
        }
        const digest = Buffer.alloc(32);
        expect(await run(fd, 0, bytes.length, 0, digest)).toEqual([0, bytes.length]);
        expect(digest.toString("hex")).toBe(createHash("sha256").update(bytes).digest("hex"));
        // asked for more than the file holds: the count read says so
        const long = Buffer.alloc(32);
        const [errno, got] = await run(fd, 0, bytes.length + 4096, 0, long);
        expect(errno).toBe(0);
        expect(got).toBe(bytes.length);
        // bad arguments are refused before any work is queued
        expect(() => hashRange(fd, 0, bytes.length, 4096, Buffer.alloc(16), () => undefined)).toThrow(/out/);
        expect(() => hashRange(fd, 0, 10, 65537, Buffer.alloc(64), () => undefined)).toThrow(/pageSize/);
        expect(() => hashRange(fd, -1, 10, 0, Buffer.alloc(32), () => undefined)).toThrow(/position/);
      } finally {
        closeSync(fd);
      }
      // a descriptor that is not open: the errno comes back
      const [bad] = await run(fd, 0, 10, 0, Buffer.alloc(32));
      expect(bad).not.toBe(0);
    },
  );
});

describe("sqlite live read: quick_check and the row counts while the changed pages are hashed", () => {
  let w: SqliteWorker;
  let handle = 0;
  beforeAll(() => {
    w = new SqliteWorker();
  });
  afterAll(async () => {
    await w.close();
  });

  function makeDb(path: string, rows: number): void {
    const db = new Database(path);
    db.pragma("page_size = 4096");
    db.exec("CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT, e BLOB); CREATE TABLE tags (t TEXT)");
    const ins = db.prepare("INSERT INTO notes (body, e) VALUES (?, ?)");
    db.exec("BEGIN");
    for (let i = 0; i < rows; i++) ins.run(`note ${i}: the agent learned fact ${i}`, randomBytes(600));
    db.exec("COMMIT");
    db.prepare("INSERT INTO tags (t) VALUES (?)").run("x");
    db.close();
  }
  const addRow = (path: string): void => {
    const db = new Database(path);
    db.prepare("INSERT INTO notes (body, e) VALUES (?, ?)").run("one more note", randomBytes(600));
    db.close();
  };
  const count = (path: string): number => {
    const db = new Database(path);
    try {
      return db.prepare("SELECT count(*) FROM notes").pluck().get() as number;
    } finally {
      db.close();
    }
  };

  /** One live read on one handle: begins (look-ahead and/or held, as `steps` says), then live_verify. */
  async function read(
    path: string,
    base: { table: Buffer; pageSize: number } | undefined,
    steps: Array<{ hold: boolean; between?: () => void }>,
    verifyLimit: number | undefined,
    limit = 10,
  ): Promise<{ begins: LiveBeginResult[]; v: LiveVerifyResult }> {
    const fh = await open(path, "r");
    const h = ++handle;
    const begins: LiveBeginResult[] = [];
    try {
      for (const s of steps) {
        s.between?.();
        begins.push(
          await w.call<LiveBeginResult>({
            op: "live_begin",
            handle: h,
            src: path,
            fd: fh.fd,
            busyTimeoutMs: 2000,
            redact: true,
            hold: s.hold,
            ...(base ? { base } : {}),
            ...(verifyLimit !== undefined ? { verifyLimit } : {}),
          }),
        );
      }
      const v = await w.call<LiveVerifyResult>({ op: "live_verify", handle: h, limit });
      return { begins, v };
    } finally {
      await w.call({ op: "live_release", handle: h });
      await fh.close();
    }
  }

  it("answers with the check run during the pass, the same as one run after it", async () => {
    const dir = tempDir("memsnap-sqlite-ahead-");
    const db = join(dir, "a.db");
    makeDb(db, 3000);
    const base = { table: pageTable(readFileSync(db), 4096), pageSize: 4096 };
    addRow(db);
    const ahead = await read(db, base, [{ hold: true }], 10);
    expect(ahead.begins[0]!.eligible).toBe(true);
    expect(ahead.begins[0]!.scan!.walk).toBe("changed");
    expect(ahead.v.ahead).toBe(true);
    expect(ahead.v.problems).toEqual(["ok"]);
    expect(ahead.v.tables).toEqual({ notes: 3001, tags: 1 });
    // without verifyLimit (no base: a full snapshot) live_verify runs it itself: the same answer
    const after = await read(db, base, [{ hold: true }], undefined);
    expect(after.v.ahead).toBeFalsy();
    expect(after.v.problems).toEqual(["ok"]);
    expect(after.v.tables).toEqual(ahead.v.tables);
    // asked with another limit than the one checked: checked again
    const other = await read(db, base, [{ hold: true }], 10, 3);
    expect(other.v.ahead).toBeFalsy();
    expect(other.v.tables).toEqual(ahead.v.tables);
  });

  it("a look-ahead's check is reused only for the state it checked", async () => {
    const dir = tempDir("memsnap-sqlite-ahead-");
    const db = join(dir, "b.db");
    makeDb(db, 2000);
    const base = { table: pageTable(readFileSync(db), 4096), pageSize: 4096 };
    addRow(db);
    // look-ahead (its own short transaction), then the held read of the same state: reused
    const same = await read(db, base, [{ hold: false }, { hold: true }], 10);
    expect(same.begins[1]!.reused).toBe(true);
    expect(same.v.ahead).toBe(true);
    expect(same.v.tables.notes).toBe(2001);
    // a writer commits between the look-ahead and the held read: the held read scans and
    // checks again, and its counts are the new state's
    const moved = await read(db, base, [{ hold: false }, { hold: true, between: () => addRow(db) }], 10);
    expect(moved.begins[0]!.scan!.walk).toBe("changed");
    expect(moved.begins[1]!.reused).toBeFalsy();
    expect(moved.v.tables.notes).toBe(2002);
    expect(count(db)).toBe(2002);
  });

  it("a page damaged since the base: the check run during the pass reports it", async () => {
    const dir = tempDir("memsnap-sqlite-ahead-");
    const db = join(dir, "c.db");
    makeDb(db, 2000);
    const bytes = readFileSync(db);
    const base = { table: pageTable(bytes, 4096), pageSize: 4096 };
    // an interior page of the notes b-tree loses its right-child pointer: a clean scan (no text
    // changed), but pages of the tree become unreachable and quick_check says so
    const ps = 4096;
    let damaged = -1;
    for (let p = 1; p * ps < bytes.length && damaged < 0; p++) {
      const off = (p - 1) * ps + (p === 1 ? 100 : 0);
      if (bytes[off] === 5) damaged = p;
    }
    expect(damaged).toBeGreaterThan(0);
    const off = (damaged - 1) * ps + (damaged === 1 ? 100 : 0);
    const fd = openSync(db, "r+");
    try {
      const b = Buffer.from(bytes.subarray((damaged - 1) * ps, damaged * ps));
      b.writeUInt32BE(0, off - (damaged - 1) * ps + 8);
      const { writeSync } = await import("node:fs");
      writeSync(fd, b, 0, ps, (damaged - 1) * ps);
    } finally {
      closeSync(fd);
    }
    // the answer (here SQLite's own error on the damaged tree) is the one a check after the pass gives
    const outcome = (limit: number | undefined): Promise<string> =>
      read(db, base, [{ hold: true }], limit).then(
        (r) => `problems: ${r.v.problems.join("; ")}`,
        (e: Error & { code?: string }) => `error ${e.code}: ${e.message}`,
      );
    const after = await outcome(undefined);
    expect(after).not.toBe("problems: ok");
    expect(await outcome(10)).toBe(after);
    // and on a damage quick_check lists (a page left out of every tree), with the check run ahead
    const db2 = join(dir, "d.db");
    makeDb(db2, 2000);
    const base2 = { table: pageTable(readFileSync(db2), 4096), pageSize: 4096 };
    const d = new Database(db2);
    d.exec("DELETE FROM notes WHERE id > 1500");
    d.close();
    // the freed pages are put back on no list: the freelist count is zeroed in the header
    const hdr = Buffer.alloc(100);
    const fd2 = openSync(db2, "r+");
    try {
      const { readSync, writeSync } = await import("node:fs");
      readSync(fd2, hdr, 0, 100, 0);
      hdr.writeUInt32BE(0, 32);
      hdr.writeUInt32BE(0, 36);
      writeSync(fd2, hdr, 0, 100, 0);
    } finally {
      closeSync(fd2);
    }
    const r = await read(db2, base2, [{ hold: true }], 10);
    expect(r.v.ahead).toBe(true);
    expect(r.v.problems.join("\n")).toMatch(/never used/);
  });
});
