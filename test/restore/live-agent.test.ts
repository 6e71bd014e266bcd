// An in-place restore and the live agent (issue 35, items 12 and 14), through the real CLI with
// real processes: a writer holding the SQLite database open, or a process working inside the
// git memdir, makes the restore refuse (MEMSNAP_LOCKED, naming it) before the safety snapshot,
// unless --ignore-open-files; --dry-run lists them. A key that does not open the bundle fails
// before the safety snapshot: retries leave the store as it was.
import { spawn, spawnSync, type ChildProcess } from "node:child_process";
import { createHash } from "node:crypto";
import { existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, afterEach, beforeEach, describe, expect, it } from "vitest";
import { commitAll, git, initRepo, writeFiles } from "../helpers/git.js";

const BIN = new URL("../../bin/memsnap.js", import.meta.url).pathname;
const WRITER = new URL("../helpers/sqlite-writer.mjs", import.meta.url).pathname;
const work = mkdtempSync(join(tmpdir(), "memsnap-live-agent-"));
afterAll(() => rmSync(work, { recursive: true, force: true }));

function cli(args: string[]) {
  const r = spawnSync(process.execPath, [BIN, ...args], { encoding: "utf8", cwd: work, timeout: 60_000 });
  return { code: r.status, stdout: r.stdout, stderr: r.stderr };
}

/** Every file under `dir` with its SHA-256 (what "nothing changed" compares). */
function tree(dir: string, rel = ""): Record<string, string> {
  const out: Record<string, string> = {};
  for (const e of readdirSync(join(dir, rel), { withFileTypes: true })) {
    const r = rel ? `${rel}/${e.name}` : e.name;
    if (e.isDirectory()) Object.assign(out, tree(dir, r));
    else if (e.isFile()) out[r] = createHash("sha256").update(readFileSync(join(dir, r))).digest("hex");
  }
  return out;
}

const bundlesIn = (store: string): string[] => Object.keys(existsSync(store) ? tree(store) : {}).filter((p) => p.endsWith(".memsnap"));

let agent = "";
let store = "";
let bundle = "";
const children: ChildProcess[] = [];

/** Start a child and wait until it prints `ready` (or a line containing it). */
function startHolder(cmd: string, args: string[], cwd: string): Promise<ChildProcess> {
  const child = spawn(cmd, args, { cwd, stdio: ["ignore", "pipe", "inherit"] });
  children.push(child);
  return new Promise((res, rej) => {
    let out = "";
    child.stdout!.on("data", (b: Buffer) => {
      out += b.toString("utf8");
      if (out.includes("ready")) res(child);
    });
    child.on("exit", (code) => rej(new Error(`holder exited ${code} before it was ready: ${out}`)));
  });
}

function stop(child: ChildProcess): Promise<void> {
  return new Promise((res) => {
    if (child.exitCode !== null || child.signalCode !== null) return res();
    child.once("exit", () => res());
    child.kill("SIGKILL");
  });
}

beforeEach(() => {
  agent = mkdtempSync(join(work, "agent-"));
  store = join(agent, "..", `${agent.split("/").pop()}-store`);
  mkdirSync(join(agent, "db"));
  const root = initRepo(join(agent, "memdir"));
  writeFiles(root, { "MEMORY.md": "# v1\n", "notes/a.md": "a\n" });
  commitAll(root, "one");
  writeFileSync(join(agent, "memsnap.json"), JSON.stringify({
    agent: "live", redaction: { enabled: false },
    sources: [{ kind: "sqlite", name: "db", path: "db" }, { kind: "git", name: "mem", path: "memdir" }],
  }));
  // A database made and closed by a short-lived writer: nothing holds it now.
  const w = spawnSync(process.execPath, ["-e", `
    const D = require(${JSON.stringify(join(process.cwd(), "node_modules/better-sqlite3"))});
    const db = new D(process.argv[1]); db.pragma("journal_mode = WAL");
    db.exec("CREATE TABLE m(id INTEGER PRIMARY KEY, t TEXT); INSERT INTO m(t) VALUES ('a'), ('b');"); db.close();`, join(agent, "db", "memory.db")], { encoding: "utf8" });
  expect(w.status, w.stderr).toBe(0);
  bundle = join(agent, "..", `${agent.split("/").pop()}.memsnap`);
  const r = cli(["snapshot", "-c", join(agent, "memsnap.json"), "--out", bundle, "--json"]);
  expect(r.code, r.stderr).toBe(0);
  writeFiles(root, { "MEMORY.md": "# v2\n" });
  commitAll(root, "two");
});

afterEach(async () => {
  for (const c of children.splice(0)) await stop(c);
});

describe("in-place restore while another process uses the live files", () => {
  it("a writer holding the SQLite database open: MEMSNAP_LOCKED naming its pid, nothing changed, no safety snapshot; --dry-run lists it; --ignore-open-files restores", async () => {
    const writer = await startHolder(process.execPath, [WRITER, join(agent, "db", "memory.db"), "--commits", "3"], work);
    const before = tree(agent);
    const cfg = join(agent, "memsnap.json");
    const r = cli(["restore", bundle, "-c", cfg, "--store", store]);
    expect(r.code, r.stderr).toBe(7);
    expect(r.stderr).toMatch(/\[MEMSNAP_LOCKED\]/);
    expect(r.stderr).toContain(`pid ${writer.pid} node`);
    expect(r.stderr).toContain(join(agent, "db", "memory.db"));
    expect(r.stderr).toMatch(/memsnap: hint: .*--ignore-open-files/);
    expect(tree(agent)).toEqual(before);
    expect(bundlesIn(store)).toEqual([]);
    expect(readdirSync(agent).filter((n) => n.includes(".memsnap-"))).toEqual([]);

    const j = cli(["restore", bundle, "-c", cfg, "--store", store, "--json"]);
    expect(j.code).toBe(7);
    expect(JSON.parse(j.stdout).error.code).toBe("MEMSNAP_LOCKED");

    const plan = cli(["restore", bundle, "-c", cfg, "--dry-run"]);
    expect(plan.code, plan.stderr).toBe(0);
    expect(plan.stdout).toMatch(/1 process uses live files this restore would replace/);
    expect(plan.stdout).toContain(`pid ${writer.pid} node`);
    const pj = cli(["restore", bundle, "-c", cfg, "--dry-run", "--json"]);
    expect(pj.code, pj.stderr).toBe(0);
    const procs = JSON.parse(pj.stdout).processes as Array<{ pid: number; command: string; uses: Array<{ how: string; path: string }> }>;
    expect(procs.map((p) => p.pid)).toEqual([writer.pid]);
    expect(procs[0]!.uses).toContainEqual({ how: "open", path: join(agent, "db", "memory.db") });

    const ok = cli(["restore", bundle, "-c", cfg, "--store", store, "--ignore-open-files", "--json"]);
    expect(ok.code, ok.stderr).toBe(0);
    expect(JSON.parse(ok.stdout).safety_snapshot).not.toBeNull();
    expect(bundlesIn(store)).toHaveLength(1);
  });

  it("a process whose working directory is inside the git memdir: refused, listed, and restored with --ignore-open-files", async () => {
    mkdirSync(join(agent, "memdir", "notes", "deep"), { recursive: true });
    const sh = await startHolder(process.execPath, ["-e", "console.log('ready'); setInterval(() => {}, 1000)"], join(agent, "memdir", "notes", "deep"));
    const cfg = join(agent, "memsnap.json");
    const before = tree(agent);
    const r = cli(["restore", bundle, "-c", cfg, "--store", store]);
    expect(r.code, r.stderr).toBe(7);
    expect(r.stderr).toContain(`pid ${sh.pid} node`);
    expect(r.stderr).toContain(`working directory ${join(agent, "memdir", "notes", "deep")}`);
    expect(tree(agent)).toEqual(before);
    expect(bundlesIn(store)).toEqual([]);
    const pj = cli(["restore", bundle, "-c", cfg, "--dry-run", "--json"]);
    expect(JSON.parse(pj.stdout).processes).toEqual([
      { pid: sh.pid, command: expect.stringMatching(/^node/), uses: [{ how: "cwd", path: join(agent, "memdir", "notes", "deep") }] },
    ]);
    // --only another layer: the memdir is not replaced, so the process is no concern.
    const only = cli(["restore", bundle, "-c", cfg, "--store", store, "--only", "db"]);
    expect(only.code, only.stderr).toBe(0);
    const ok = cli(["restore", bundle, "-c", cfg, "--store", store, "--ignore-open-files"]);
    expect(ok.code, ok.stderr).toBe(0);
    expect(git(join(agent, "memdir"), ["log", "--format=%s"]).trim()).toBe("one");
  });

  it("nothing holds the live files: the restore goes ahead, and --dry-run lists no process", () => {
    const cfg = join(agent, "memsnap.json");
    const pj = cli(["restore", bundle, "-c", cfg, "--dry-run", "--json"]);
    expect(pj.code, pj.stderr).toBe(0);
    expect(JSON.parse(pj.stdout).processes).toEqual([]);
    const plan = cli(["restore", bundle, "-c", cfg, "--dry-run"]);
    expect(plan.stdout).not.toMatch(/process/);
    const r = cli(["restore", bundle, "-c", cfg, "--store", store]);
    expect(r.code, r.stderr).toBe(0);
  });
});

describe("in-place restore with a key that does not open the bundle", () => {
  it("fails with the key error before the safety snapshot: three retries leave the store empty and the agent unchanged", () => {
    const keys = mkdtempSync(join(work, "keys-"));
    const mine = cli(["keygen", "-o", join(keys, "mine.key")]).stdout.trim();
    cli(["keygen", "-o", join(keys, "other.key")]);
    const cfg = join(agent, "memsnap.json");
    const enc = join(keys, "enc.memsnap");
    const s = cli(["snapshot", "-c", cfg, "--out", enc, "-r", mine, "--json"]);
    expect(s.code, s.stderr).toBe(0);
    const before = tree(agent);
    for (let i = 0; i < 3; i++) {
      const r = cli(["restore", enc, "-c", cfg, "--store", store, "-i", join(keys, "other.key"), "--json"]);
      expect(r.code, r.stdout + r.stderr).toBe(4);
      expect(JSON.parse(r.stdout).error.code).toBe("MEMSNAP_DECRYPT_FAILED");
    }
    expect(bundlesIn(store)).toEqual([]);
    expect(tree(agent)).toEqual(before);
    // A passphrase bundle and the wrong passphrase: the same.
    const pass = join(keys, "pass.memsnap");
    writeFileSync(join(keys, "right.txt"), "correct horse battery\n");
    writeFileSync(join(keys, "wrong.txt"), "wrong horse\n");
    expect(cli(["snapshot", "-c", cfg, "--out", pass, "--passphrase-file", join(keys, "right.txt")]).code).toBe(0);
    const w = cli(["restore", pass, "-c", cfg, "--store", store, "--passphrase-file", join(keys, "wrong.txt")]);
    expect(w.code, w.stderr).toBe(4);
    expect(w.stderr).toMatch(/\[MEMSNAP_DECRYPT_FAILED\]/);
    expect(bundlesIn(store)).toEqual([]);
    // The right key: one safety snapshot, the restore done.
    const ok = cli(["restore", enc, "-c", cfg, "--store", store, "-i", join(keys, "mine.key")]);
    expect(ok.code, ok.stderr).toBe(0);
    expect(bundlesIn(store)).toHaveLength(1);
  });
});
