// In-place restore of a WAL SQLite database: the live -wal/-shm go with the old file, the
// restored database is WAL again, and --dry-run shows row-count deltas.
import { spawnSync } from "node:child_process";
import { existsSync, mkdirSync, mkdtempSync, rmSync, statSync, writeFileSync } from "node:fs";
import { createRequire } from "node:module";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { restoreOntoNewMachine } from "../helpers/cli.js";

const Database = createRequire(import.meta.url)("better-sqlite3") as typeof import("better-sqlite3");
const BIN = new URL("../../bin/memsnap.js", import.meta.url).pathname;
const work = mkdtempSync(join(tmpdir(), "memsnap-ip-sqlite-"));
afterAll(() => rmSync(work, { recursive: true, force: true }));

function cli(args: string[]) {
  const r = spawnSync(process.execPath, [BIN, ...args], { encoding: "utf8" });
  return { code: r.status, stdout: r.stdout, stderr: r.stderr };
}

describe("in-place restore of sqlite layers", () => {
  it("replaces the database, drops the live WAL, keeps WAL mode, and plans row deltas", () => {
    const agent = join(work, "agent");
    mkdirSync(join(agent, "db"), { recursive: true });
    writeFileSync(join(agent, "memsnap.json"), JSON.stringify({
      agent: "sq", redaction: { enabled: false }, sources: [{ kind: "sqlite", name: "db", path: "db" }],
    }));
    const db = new Database(join(agent, "db", "memory.db"));
    db.pragma("journal_mode = WAL");
    db.exec("CREATE TABLE m(id INTEGER PRIMARY KEY, t TEXT)");
    const ins = db.prepare("INSERT INTO m(t) VALUES (?)");
    for (let i = 0; i < 100; i++) ins.run(`row ${i}`);
    db.close();
    const snap = cli(["snapshot", "-c", join(agent, "memsnap.json"), "--out", join(work, "b.memsnap"), "--json"]);
    expect(snap.code, snap.stderr).toBe(0);

    // the live database moves on, with its latest commits only in the -wal
    const live = new Database(join(agent, "db", "memory.db"));
    live.pragma("wal_autocheckpoint = 0");
    for (let i = 0; i < 50; i++) live.prepare("INSERT INTO m(t) VALUES (?)").run(`later ${i}`);
    expect(existsSync(join(agent, "db", "memory.db-wal"))).toBe(true);
    live.close();

    const plan = cli(["restore", join(work, "b.memsnap"), "-c", join(agent, "memsnap.json"), "--dry-run", "--no-safety-snapshot"]);
    expect(plan.code, plan.stderr).toBe(0);
    expect(plan.stdout).toContain("memory.db: rows m 150 → 100 (-50)");

    const r = cli(["restore", join(work, "b.memsnap"), "-c", join(agent, "memsnap.json"), "--store", join(work, "store")]);
    expect(r.code, r.stderr).toBe(0);
    expect(existsSync(join(agent, "db", "memory.db-wal"))).toBe(false);
    const back = new Database(join(agent, "db", "memory.db"), { readonly: true });
    expect((back.prepare("SELECT count(*) AS n FROM m").get() as { n: number }).n).toBe(100);
    expect(back.pragma("journal_mode", { simple: true })).toBe("wal");
    expect(back.pragma("integrity_check", { simple: true })).toBe("ok");
    back.close();
  });

  it("onto a new machine (the config copied, nothing live): a one-file source comes back as that file", () => {
    const agent = join(work, "old-host");
    mkdirSync(join(agent, "db"), { recursive: true });
    const cfg = JSON.stringify({ agent: "sq1", redaction: { enabled: false }, sources: [{ kind: "sqlite", name: "mem", path: "db/mem.db" }] });
    writeFileSync(join(agent, "memsnap.json"), cfg);
    const db = new Database(join(agent, "db", "mem.db"));
    db.exec("CREATE TABLE m(id INTEGER PRIMARY KEY, t TEXT); INSERT INTO m(t) VALUES ('a'), ('b'), ('c');");
    db.close();
    const bundle = join(work, "one.memsnap");
    const snap = cli(["snapshot", "-c", join(agent, "memsnap.json"), "--out", bundle, "--json"]);
    expect(snap.code, snap.stderr).toBe(0);

    const fresh = join(work, "new-host");
    restoreOntoNewMachine(bundle, cfg, fresh);
    // a file, not a directory named mem.db holding it
    expect(statSync(join(fresh, "db", "mem.db")).isFile()).toBe(true);
    const back = new Database(join(fresh, "db", "mem.db"), { readonly: true });
    expect((back.prepare("SELECT count(*) AS n FROM m").get() as { n: number }).n).toBe(3);
    back.close();
  });
});
