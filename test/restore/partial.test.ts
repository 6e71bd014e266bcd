/**
 * `restore --path GLOB` (in place and with --to) and `restore --to` in the config's layout,
 * through the CLI with real files, SQLite and git: only the selected files are written, and in
 * place nothing else of the layer changes or goes; part of a layer that is rebuilt whole is
 * refused; each layer lands where the config's path puts it, overlapping places are refused
 * (or, without --layout, fall back to layer names), and nothing is written outside DIR.
 */
import { spawnSync } from "node:child_process";
import { createRequire } from "node:module";
import { existsSync, mkdirSync, readFileSync, readdirSync, statSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { beforeAll, describe, expect, it } from "vitest";
import {
  BIN, DEFAULT_FILES, expectCliError, expectOk, jsonOut, listTree, makeAgent, recipientOf, runCli, tempDir, type Agent,
} from "../helpers/cli.js";
import { requireTool } from "../helpers/tools.js";

const Database = createRequire(import.meta.url)("better-sqlite3") as typeof import("better-sqlite3");

let a: Agent;
let key: string;
let plain: string;
let enc: string;

beforeAll(async () => {
  a = makeAgent();
  expectOk(await runCli(["keygen", "-o", "key.txt"], { cwd: a.dir }));
  key = join(a.dir, "key.txt");
  plain = join(a.dir, "plain.memsnap");
  enc = join(a.dir, "enc.memsnap");
  expectOk(await runCli(["snapshot", "-c", a.config, "-o", plain], { cwd: a.dir }));
  expectOk(await runCli(["snapshot", "-c", a.config, "-o", enc, "-r", recipientOf(key)], { cwd: a.dir }));
});

describe("restore --to --path", () => {
  it("writes only the selected files, plaintext and encrypted", async () => {
    for (const [b, extra] of [[plain, []], [enc, ["-i", key]]] as const) {
      const to = join(tempDir("memsnap-partial-"), "out");
      const r = await runCli(["--json", "restore", b, "--to", to, "--path", "memory/notes/", "--path", "cursor.json", ...extra], { cwd: a.dir });
      expectOk(r);
      expect(jsonOut(r).artifacts).toBe(3);
      expect(listTree(to).filter((p) => !p.startsWith(".memsnap"))).toEqual([
        "memory", "memory/notes", "memory/notes/2024-06-01.md", "memory/notes/empty.md", "state", "state/cursor.json",
      ]);
      expect(readFileSync(join(to, "memory/notes/2024-06-01.md"), "utf8")).toBe(DEFAULT_FILES["notes/2024-06-01.md"]);
    }
  });

  it("a pattern that matches nothing is a usage error and writes nothing", async () => {
    const to = join(tempDir("memsnap-partial-"), "out");
    const r = await runCli(["restore", plain, "--to", to, "--path", "memory/nope/**"], { cwd: a.dir });
    expectCliError(r, 2, "MEMSNAP_USAGE");
    expect(r.stderr).toContain("memsnap ls");
    expect(existsSync(to)).toBe(false);
  });
});

describe("restore --path of an incremental snapshot", () => {
  it("a selected file held in the base is read from it; the others are not written", async () => {
    const b = makeAgent({ agent: "incr-partial" });
    const st = join(b.dir, "store");
    expectOk(await runCli(["snapshot", "-c", b.config, "--store", st, "--incremental"], { cwd: b.dir }));
    writeFileSync(join(b.memoryDir, "MEMORY.md"), "# changed\n");
    const second = jsonOut(await runCli(["snapshot", "-c", b.config, "--store", st, "--incremental", "--json"], { cwd: b.dir }));
    const to = join(tempDir("memsnap-partial-incr-"), "out");
    const r = await runCli(["--json", "restore", second.path, "--to", to, "--path", "memory/notes/2024-06-01.md", "--path", "memory/MEMORY.md", "--layout", "layers"]);
    expectOk(r);
    expect(jsonOut(r).artifacts).toBe(2);
    expect(listTree(to).filter((p) => !p.startsWith(".memsnap"))).toEqual(["memory", "memory/MEMORY.md", "memory/notes", "memory/notes/2024-06-01.md"]);
    expect(readFileSync(join(to, "memory/notes/2024-06-01.md"), "utf8")).toBe(DEFAULT_FILES["notes/2024-06-01.md"]);
    expect(readFileSync(join(to, "memory/MEMORY.md"), "utf8")).toBe("# changed\n");
    // In place: only the selected referenced file comes back from the base.
    writeFileSync(join(b.memoryDir, "notes/2024-06-01.md"), "edited\n");
    writeFileSync(join(b.memoryDir, "deep/a/b/c.txt"), "edited\n");
    expectOk(await runCli(["restore", second.path, "-c", b.config, "--path", "memory/notes/2024-06-01.md", "--no-safety-snapshot"], { cwd: b.dir }));
    expect(readFileSync(join(b.memoryDir, "notes/2024-06-01.md"), "utf8")).toBe(DEFAULT_FILES["notes/2024-06-01.md"]);
    expect(readFileSync(join(b.memoryDir, "deep/a/b/c.txt"), "utf8")).toBe("edited\n");
  });
});

describe("restore --path in place", () => {
  it("replaces only the selected files: other files of the layer, changed or new, stay as they are", async () => {
    const b = makeAgent({ agent: "inplace" });
    const bundle = join(b.dir, "b.memsnap");
    expectOk(await runCli(["snapshot", "-c", b.config, "-o", bundle], { cwd: b.dir }));
    writeFileSync(join(b.memoryDir, "MEMORY.md"), "changed\n");
    writeFileSync(join(b.memoryDir, "notes/2024-06-01.md"), "also changed\n");
    writeFileSync(join(b.memoryDir, "new.md"), "new since\n");
    writeFileSync(join(b.stateDir, "cursor.json"), "{\"offset\":99}");
    const dry = await runCli(["--json", "restore", bundle, "-c", b.config, "--path", "memory/MEMORY.md", "--dry-run"], { cwd: b.dir });
    expectOk(dry);
    expect(jsonOut(dry).plan.layers).toEqual([expect.objectContaining({ layer: "memory", changed: ["MEMORY.md"], removed: [], added: [] })]);
    const r = await runCli(["--json", "restore", bundle, "-c", b.config, "--path", "memory/MEMORY.md", "--no-safety-snapshot"], { cwd: b.dir });
    expectOk(r);
    expect(jsonOut(r)).toMatchObject({ layers: ["memory"], swaps: 1 });
    expect(readFileSync(join(b.memoryDir, "MEMORY.md"), "utf8")).toBe(DEFAULT_FILES["MEMORY.md"]);
    expect(readFileSync(join(b.memoryDir, "notes/2024-06-01.md"), "utf8")).toBe("also changed\n");
    expect(readFileSync(join(b.memoryDir, "new.md"), "utf8")).toBe("new since\n");
    expect(readFileSync(join(b.stateDir, "cursor.json"), "utf8")).toBe("{\"offset\":99}");
    // Patterns that select every file of the layer still remove nothing: new.md stays.
    expectOk(await runCli(["restore", bundle, "-c", b.config, "--path", "memory/", "--no-safety-snapshot"], { cwd: b.dir }));
    expect(readFileSync(join(b.memoryDir, "notes/2024-06-01.md"), "utf8")).toBe(DEFAULT_FILES["notes/2024-06-01.md"]);
    expect(readFileSync(join(b.memoryDir, "new.md"), "utf8")).toBe("new since\n");
    // --only restores the layer whole (new.md goes): the partial restores above were the difference.
    expectOk(await runCli(["restore", bundle, "-c", b.config, "--only", "memory", "--no-safety-snapshot"], { cwd: b.dir }));
    expect(existsSync(join(b.memoryDir, "new.md"))).toBe(false);
  });

  it("an encrypted bundle: the selection needs the key, then works as for plaintext", async () => {
    const b = makeAgent({ agent: "inplace-enc" });
    expectOk(await runCli(["keygen", "-o", "k.txt"], { cwd: b.dir }));
    const bundle = join(b.dir, "b.memsnap");
    expectOk(await runCli(["snapshot", "-c", b.config, "-o", bundle, "-r", recipientOf(join(b.dir, "k.txt"))], { cwd: b.dir }));
    writeFileSync(join(b.stateDir, "cursor.json"), "{}");
    writeFileSync(join(b.stateDir, "runs/dream-run.json"), "{}");
    expectOk(await runCli(["restore", bundle, "-c", b.config, "--path", "state/cursor.json", "-i", "k.txt", "--no-safety-snapshot"], { cwd: b.dir }));
    expect(JSON.parse(readFileSync(join(b.stateDir, "cursor.json"), "utf8"))).toEqual({ offset: 42, file: "log-7" });
    expect(readFileSync(join(b.stateDir, "runs/dream-run.json"), "utf8")).toBe("{}");
  });

  it("part of a sqlite layer is refused (it is restored whole); the whole layer by its prefix is not", async () => {
    const dir = tempDir("memsnap-partial-sq-");
    mkdirSync(join(dir, "db"));
    for (const n of ["a.db", "b.db"]) {
      const db = new Database(join(dir, "db", n));
      db.exec("CREATE TABLE t(x); INSERT INTO t VALUES (1);");
      db.close();
    }
    writeFileSync(join(dir, "memsnap.json"), JSON.stringify({ agent: "sq", redaction: { enabled: false }, sources: [{ kind: "sqlite", name: "dbs", path: "db" }] }));
    const bundle = join(dir, "s.memsnap");
    expectOk(await runCli(["snapshot", "-c", "memsnap.json", "-o", bundle], { cwd: dir }));
    const before = readFileSync(join(dir, "db", "a.db"));
    const r = await runCli(["restore", bundle, "-c", "memsnap.json", "--path", "dbs/a.db", "--no-safety-snapshot"], { cwd: dir });
    expectCliError(r, 2, "MEMSNAP_USAGE");
    expect(r.stderr).toMatch(/rebuilt from all of them/);
    const to = join(dir, "out");
    expectCliError(await runCli(["restore", bundle, "--to", to, "--path", "dbs/a.db"], { cwd: dir }), 2, "MEMSNAP_USAGE");
    expect(existsSync(to)).toBe(false);
    expect(readFileSync(join(dir, "db", "a.db")).equals(before)).toBe(true);
    expectOk(await runCli(["restore", bundle, "-c", "memsnap.json", "--path", "dbs/", "--no-safety-snapshot"], { cwd: dir }));
  });
});

describe("restore --to in the config's layout", () => {
  /** An agent with a SQLite file at db/memory.db and notes at notes/. */
  function sqliteAgent(extraSources: Record<string, unknown>[] = []): { dir: string; bundle: string } {
    const dir = tempDir("memsnap-layout-");
    mkdirSync(join(dir, "db"));
    mkdirSync(join(dir, "notes"));
    writeFileSync(join(dir, "notes", "n1.md"), "note one\n");
    const db = new Database(join(dir, "db", "memory.db"));
    db.exec("CREATE TABLE m(t); INSERT INTO m VALUES ('a'), ('b');");
    db.close();
    writeFileSync(join(dir, "memsnap.json"), JSON.stringify({
      agent: "lay", redaction: { enabled: false },
      sources: [{ kind: "sqlite", name: "memory-db", path: "db/memory.db" }, { kind: "files", name: "mem", path: "notes" }, ...extraSources],
    }));
    const bundle = join(dir, "s.memsnap");
    const s = spawnSync(process.execPath, [BIN, "snapshot", "-c", "memsnap.json", "-o", bundle], { cwd: dir, encoding: "utf8" });
    expect(s.status, s.stderr).toBe(0);
    return { dir, bundle };
  }

  it("puts each layer where the config's path puts it; --layout layers keeps the layer names", async () => {
    const { dir, bundle } = sqliteAgent();
    const to = join(tempDir("memsnap-layout-out-"), "out");
    const r = await runCli(["--json", "restore", bundle, "--to", to], { cwd: dir });
    expectOk(r);
    expect(jsonOut(r)).toMatchObject({ layout: "config", layers: [{ layer: "memory-db", path: "db" }, { layer: "mem", path: "notes" }] });
    expect(listTree(to).filter((p) => !p.startsWith(".memsnap"))).toEqual(["db", "db/memory.db", "notes", "notes/n1.md"]);
    const back = new Database(join(to, "db", "memory.db"), { readonly: true });
    expect((back.prepare("SELECT count(*) AS n FROM m").get() as { n: number }).n).toBe(2);
    back.close();
    // The same with -c from elsewhere, and the layer names on request.
    const to2 = join(tempDir("memsnap-layout-out-"), "out");
    expectOk(await runCli(["restore", bundle, "--to", to2, "-c", join(dir, "memsnap.json")]));
    expect(statSync(join(to2, "db", "memory.db")).isFile()).toBe(true);
    const to3 = join(tempDir("memsnap-layout-out-"), "out");
    const l = await runCli(["--json", "restore", bundle, "--to", to3, "--layout", "layers"], { cwd: dir });
    expectOk(l);
    expect(jsonOut(l).layout).toBe("layers");
    expect(readdirSync(to3).sort()).toEqual([".memsnap", "mem", "memory-db"]);
    expect(statSync(join(to3, "memory-db", "memory.db")).isFile()).toBe(true);
    // No config anywhere: the layer names, as the output says.
    const to4 = join(tempDir("memsnap-layout-out-"), "out");
    const n = await runCli(["restore", bundle, "--to", to4]);
    expectOk(n);
    expect(n.stdout).toContain("memory-db → memory-db/");
    expect(existsSync(join(to4, "memory-db", "memory.db"))).toBe(true);
  });

  it("--path with the config layout writes the selected files at their config places", async () => {
    const { dir, bundle } = sqliteAgent();
    const to = join(tempDir("memsnap-layout-out-"), "out");
    expectOk(await runCli(["restore", bundle, "--to", to, "--path", "mem/n1.md"], { cwd: dir }));
    expect(listTree(to).filter((p) => !p.startsWith(".memsnap"))).toEqual(["notes", "notes/n1.md"]);
  });

  it("overlapping places: refused with --layout config, the layer names (with a note) without it", async (ctx) => {
    if (!requireTool("git", ctx)) return;
    const { dir } = sqliteAgent();
    // A git memdir at notes-repo and a files source inside it.
    const repo = join(dir, "notes-repo");
    mkdirSync(join(repo, "sub"), { recursive: true });
    writeFileSync(join(repo, "a.md"), "a\n");
    writeFileSync(join(repo, "sub", "s.md"), "s\n");
    const g = (args: string[]): void => {
      const r = spawnSync("git", ["-C", repo, "-c", "user.name=t", "-c", "user.email=t@t", ...args], { encoding: "utf8" });
      expect(r.status, r.stderr).toBe(0);
    };
    g(["init", "-q"]);
    g(["add", "."]);
    g(["commit", "-qm", "one"]);
    writeFileSync(join(dir, "memsnap.json"), JSON.stringify({
      agent: "lay", redaction: { enabled: false },
      sources: [{ kind: "git", name: "repo", path: "notes-repo" }, { kind: "files", name: "sub", path: "notes-repo/sub" }],
    }));
    const bundle = join(dir, "g.memsnap");
    expectOk(await runCli(["snapshot", "-c", "memsnap.json", "-o", bundle], { cwd: dir }));
    const to = join(tempDir("memsnap-layout-out-"), "out");
    const r = await runCli(["restore", bundle, "--to", to, "--layout", "config"], { cwd: dir });
    expectCliError(r, 2, "MEMSNAP_USAGE");
    expect(r.stderr).toMatch(/layers repo and sub would share/);
    expect(existsSync(to)).toBe(false);
    const f = await runCli(["--json", "restore", bundle, "--to", to], { cwd: dir });
    expectOk(f);
    expect(jsonOut(f).layout).toBe("layers");
    expect(jsonOut(f).notes.join("\n")).toMatch(/under its layer name/);
    expect(readFileSync(join(to, "repo", "a.md"), "utf8")).toBe("a\n");
    expect(readFileSync(join(to, "sub", "s.md"), "utf8")).toBe("s\n");
  });

  it("two layers with a file at the same place fail the restore, nothing written", async () => {
    const dir = tempDir("memsnap-layout-clash-");
    mkdirSync(join(dir, "mem"));
    writeFileSync(join(dir, "mem", "x.json"), "{\"a\":1}");
    writeFileSync(join(dir, "top.json"), "{}");
    writeFileSync(join(dir, "memsnap.json"), JSON.stringify({
      agent: "clash", redaction: { enabled: false },
      sources: [{ kind: "state", name: "st", path: ".", include: ["*.json"], exclude: ["memsnap.json"] }, { kind: "files", name: "mem", path: "mem" }],
    }));
    const bundle = join(tempDir("memsnap-layout-b-"), "c.memsnap");
    expectOk(await runCli(["snapshot", "-c", "memsnap.json", "-o", bundle], { cwd: dir }));
    const box = tempDir("memsnap-layout-box-");
    const r = await runCli(["restore", bundle, "--to", join(box, "out"), "-c", join(dir, "memsnap.json")], { cwd: box });
    expectCliError(r, 2, "MEMSNAP_USAGE");
    expect(r.stderr).toMatch(/both have a file at mem\/x\.json/);
    expect(readdirSync(box)).toEqual([]);
  });

  it("a source path outside the config's directory is refused with --layout config: nothing is written outside DIR", async () => {
    const { dir, bundle } = sqliteAgent();
    const cfgDir = join(dir, "elsewhere");
    mkdirSync(cfgDir);
    writeFileSync(join(cfgDir, "memsnap.json"), JSON.stringify({
      agent: "lay", redaction: { enabled: false },
      sources: [{ kind: "sqlite", name: "memory-db", path: "../../db/memory.db" }, { kind: "files", name: "mem", path: "notes" }],
    }));
    const box = tempDir("memsnap-layout-box-");
    const r = await runCli(["restore", bundle, "--to", join(box, "out"), "-c", join(cfgDir, "memsnap.json"), "--layout", "config"], { cwd: box });
    expectCliError(r, 2, "MEMSNAP_USAGE");
    expect(r.stderr).toMatch(/outside the config's directory/);
    expect(readdirSync(box)).toEqual([]);
    expect(readdirSync(dir).sort()).toEqual([".memsnap", "db", "elsewhere", "memsnap.json", "notes", "s.memsnap"]);
  });

  it("--layout takes config or layers only", async () => {
    expectCliError(await runCli(["restore", plain, "--to", join(tempDir(), "o"), "--layout", "flat"]), 2, "MEMSNAP_USAGE");
    const inPlace = await runCli(["restore", plain, "-c", a.config, "--layout", "layers", "--no-safety-snapshot"], { cwd: a.dir });
    expectCliError(inPlace, 2, "MEMSNAP_USAGE");
    expect(inPlace.stderr).toContain("--layout applies to a restore --to DIR");
  });
});
