// `memsnap init` through the real CLI, on an agent home that holds every kind of state memsnap
// captures (real git, SQLite, KV dump, ProcessFork store, CRIU dump, agentlog trace): what it
// finds, what it leaves alone, and that the config it writes snapshots and restores the home.
import { mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import Database from "better-sqlite3";
import { beforeAll, describe, expect, it } from "vitest";
import { loadConfig } from "../../src/index.js";
import { agentlogId, parseLossless } from "../../src/util/canonical-agentlog.js";
import { expectCliError, expectOk, jsonOut, runCliSync, sha256, tempDir, treeHashes } from "../helpers/cli.js";
import { genCriuDump } from "../helpers/criu-dump.js";
import { git, writeFiles } from "../helpers/git.js";
import { generateKvDump } from "../helpers/kv-dump.js";
import { generatePfimgStore } from "../helpers/pfimg-store.js";

type Found = { kind: string; name: string; path: string; include?: string[]; exclude?: string[]; extra?: Record<string, string> };

let home = "";

beforeAll(() => {
  home = join(tempDir("memsnap-init-"), "scribe");
  // a git memdir (its notes are the git layer's)
  writeFiles(join(home, "memory"), { "MEMORY.md": "# memory\n", "people/ada.md": "ada\n" });
  git(join(home, "memory"), ["init", "-q"]);
  git(join(home, "memory"), ["add", "-A"]);
  git(join(home, "memory"), ["-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-qm", "one"]);
  // notes outside git, with a memdir inside them that they must not take a second copy of
  writeFiles(join(home, "notes"), { "today.md": "today\n", "2024/june.md": "june\n", "inner/keep.md": "inner\n" });
  git(join(home, "notes", "inner"), ["init", "-q"]);
  // SQLite (by magic: a .db that is not SQLite is left alone)
  mkdirSync(join(home, "db"));
  const db = new Database(join(home, "db", "long-term.db"));
  db.exec("CREATE TABLE m(id INTEGER PRIMARY KEY, t TEXT); INSERT INTO m(t) VALUES ('a'), ('b');");
  db.close();
  writeFileSync(join(home, "db", "fake.db"), "not sqlite at all\n");
  // state, logs, an agentlog trace
  writeFiles(join(home, "state"), { "cursor.json": '{"c":1}', "big.json": `"${"x".repeat(1 << 20)}"` });
  writeFiles(join(home, "logs"), { "session-1.jsonl": '{"role":"user","content":"hi"}\n' });
  const meta = { agent: "scribe" };
  const first = { version: "0.1", id: agentlogId(parseLossless(JSON.stringify(meta))), kind: "metadata", ts: "2024-06-01T00:00:00Z", parent: null, payload: meta };
  const ask = { q: "hello" };
  const second = { version: "0.1", id: agentlogId(parseLossless(JSON.stringify(ask))), kind: "chat_request", ts: "2024-06-01T00:00:01Z", parent: first.id, payload: ask };
  writeFiles(join(home, "traces"), { "run.agentlog": `${JSON.stringify(first)}\n${JSON.stringify(second)}\n` });
  // runtime: a KV dump, a ProcessFork store and a CRIU dump, whose JSON is theirs, not state
  generateKvDump({ dir: join(home, "runtime", "kv"), nLayers: 2, sequences: 2, prefixBlocks: 1, ownBlocks: 1, zeroBlocks: 1 });
  generatePfimgStore({ root: join(home, "runtime", "pf"), pages: 2 });
  genCriuDump(join(home, "runtime", "dump"), { pids: [7], pagesPerProcess: 4 });
  // memsnap's own directory and node_modules are never looked into
  writeFiles(join(home, ".memsnap"), { "cache.json": "{}" });
  writeFiles(join(home, "node_modules", "x"), { "package.json": "{}", "README.md": "x\n" });
});

describe("memsnap init", () => {
  it("finds every kind of state, each once, and nothing that is not", () => {
    const r = runCliSync(["init", home, "--print", "--json"]);
    expectOk(r);
    const { sources: found, left_out: leftOut } = jsonOut(r) as { sources: Found[]; left_out: { path: string; reason: string }[] };
    // every other byte is in a source: only the fake database and node_modules are left out
    expect(leftOut.map((l) => l.path).sort()).toEqual(["db/fake.db", "node_modules/"]);
    const by = (path: string): Found | undefined => found.find((s) => s.path === path);
    expect(by("memory")).toMatchObject({ kind: "git", name: "memory" });
    expect(by("notes/inner")).toMatchObject({ kind: "git" });
    // git memdirs come first: a restore rebuilds them while the layers after them extract
    const kinds = found.map((s) => s.kind);
    expect(kinds.slice(0, 2)).toEqual(["git", "git"]);
    expect(kinds.lastIndexOf("git")).toBe(1);
    expect(by("db/long-term.db")).toMatchObject({ kind: "sqlite", name: "long-term" });
    // big.json is over 1 MiB, too big for state: the directory is captured whole, as files, not left out
    expect(by("state")).toMatchObject({ kind: "files", name: "state" });
    expect(by("state")!.include).toBeUndefined();
    expect(by("notes")).toMatchObject({ kind: "files", include: ["**/*.md"], exclude: ["/inner/"] });
    expect(by("logs")).toMatchObject({ kind: "files", include: ["**/*.jsonl", "**/*.ndjson"], append: ["**/*.jsonl", "**/*.ndjson"] });
    expect(by("traces")).toMatchObject({ kind: "trace", include: ["**/*.agentlog"] });
    expect(by("runtime/kv")).toMatchObject({ kind: "kv", extra: { format: "memsnap" } });
    expect(by("runtime/pf")).toMatchObject({ kind: "pfimg", extra: { store: "runtime/pf" } });
    expect(by("runtime/dump")).toMatchObject({ kind: "criu" });
    expect(found).toHaveLength(10);
    expect(new Set(found.map((s) => s.name)).size).toBe(10);
    // nothing from inside the dumps, the store, .memsnap or node_modules; no fake database
    expect(found.filter((s) => /runtime\/|\.memsnap|node_modules|fake/.test(s.path) && !/^runtime\/(kv|pf|dump)$/.test(s.path))).toEqual([]);
  });

  it("a memdir keeps its directory's name over a database of the same stem found first", () => {
    // db/ is walked before memory/: the database file used to take "memory" and the memdir get "memory-2"
    const h = join(tempDir("memsnap-init-names-"), "agent");
    writeFiles(join(h, "memory"), { "MEMORY.md": "# m\n" });
    git(join(h, "memory"), ["init", "-q"]);
    mkdirSync(join(h, "db"));
    for (const f of ["memory.db", "state.db"]) {
      const d = new Database(join(h, "db", f));
      d.exec("CREATE TABLE t(x)");
      d.close();
    }
    writeFiles(join(h, "state"), { "cursor.json": "{}" });
    const r = runCliSync(["init", h, "--print", "--json"]);
    expectOk(r);
    const names = Object.fromEntries((jsonOut(r) as { sources: Found[] }).sources.map((s) => [s.path, s.name]));
    expect(names).toEqual({ "memory": "memory", "db/memory.db": "memory-db", "db/state.db": "state-db", "state": "state" });
  });

  it("writes a config that parses, snapshots the whole home and restores it byte for byte", async () => {
    const keyFile = join(home, "..", "key.txt");
    const k = runCliSync(["keygen", "-o", keyFile]);
    expectOk(k);
    const w = runCliSync(["init", home, "-r", k.stdout.trim()]);
    expectOk(w);
    expect(w.stdout).toContain(`wrote ${join(home, "memsnap.json")}`);
    const cfgText = readFileSync(join(home, "memsnap.json"), "utf8");
    expect(cfgText).toContain("// CRIU process dump: process memory, which cannot be redacted");
    const cfg = await loadConfig(join(home, "memsnap.json"));
    expect(cfg.sources).toHaveLength(10);
    const store = join(home, "..", "store");
    const s = runCliSync(["snapshot", "-c", join(home, "memsnap.json"), "--store", store, "--no-redact", "--json"]);
    expectOk(s);
    const out = join(home, "..", "restored");
    const r = runCliSync(["restore", (jsonOut(s) as { path: string }).path, "--to", out, "-i", keyFile, "--json"]);
    expectOk(r);
    // every layer's files are back (each under its layer's directory)
    const live = treeHashes(home, (rel) => rel.startsWith(".memsnap") || rel.startsWith("node_modules") || rel.includes("/.git/") || rel === "memsnap.json");
    const back = treeHashes(out, (rel) => rel.startsWith(".memsnap") || rel.includes("/.git/"));
    expect(back["notes/today.md"]).toBe(live["notes/today.md"]);
    expect(back["notes/2024/june.md"]).toBe(live["notes/2024/june.md"]);
    expect(back["notes/inner/keep.md"]).toBeUndefined(); // the inner memdir's, not the notes layer's
    expect(back["inner/keep.md"]).toBe(sha256("inner\n"));
    expect(back["logs/session-1.jsonl"]).toBe(live["logs/session-1.jsonl"]);
    expect(back["traces/run.agentlog"]).toBe(live["traces/run.agentlog"]);
    expect(back["state/cursor.json"]).toBe(live["state/cursor.json"]);
    expect(back["state/big.json"]).toBe(live["state/big.json"]);
    expect(back["long-term/long-term.db"]).toBe(live["db/long-term.db"]);
    expect(back["memory/people/ada.md"]).toBe(live["memory/people/ada.md"]);
    for (const [rel, h] of Object.entries(live).filter(([rel]) => rel.startsWith("runtime/kv/"))) expect(back[rel.replace("runtime/", "")]).toBe(h);
  });

  it("a log being written: its config takes the JSONL logs as append-only, the snapshot says what it left out", () => {
    const top = tempDir("memsnap-init-logs-");
    const h = join(top, "home");
    writeFiles(join(h, "logs"), { "done.jsonl": '{"n":1}\n', "live.jsonl": '{"n":1}\n{"n":2}\n{"n":' });
    expectOk(runCliSync(["init", h]));
    const s = runCliSync(["snapshot", "-c", join(h, "memsnap.json"), "--store", join(top, "store")]);
    expectOk(s);
    expect(s.stdout).toMatch(/partial +1 last line\(s\) still being written left out \(5 B\): logs\/live\.jsonl\n/);
    const j = runCliSync(["snapshot", "-c", join(h, "memsnap.json"), "--store", join(top, "store"), "--json"]);
    expectOk(j);
    const bundle = (jsonOut(j) as { path: string; partial_tail_bytes: Record<string, number> });
    expect(bundle.partial_tail_bytes).toEqual({ "logs/live.jsonl": 5 });
    const out = join(top, "restored");
    expectOk(runCliSync(["restore", bundle.path, "--to", out]));
    expect(readFileSync(join(out, "logs", "live.jsonl"), "utf8")).toBe('{"n":1}\n{"n":2}\n');
    expect(readFileSync(join(out, "logs", "done.jsonl"), "utf8")).toBe('{"n":1}\n');
  });

  it("refuses a home with nothing to capture, and an existing config unless --force", () => {
    const empty = tempDir("memsnap-init-empty-");
    writeFileSync(join(empty, "notes.txt"), "plain text is not looked at\n");
    expectCliError(runCliSync(["init", empty]), 6, "MEMSNAP_SOURCE_MISSING");
    const again = runCliSync(["init", home]);
    expectCliError(again, 8, "MEMSNAP_DEST_EXISTS");
    const forced = runCliSync(["init", home, "--force"]);
    expectOk(forced);
    // no recipients, and a CRIU dump among the sources: it says how to encrypt, and why it must
    expect(forced.stdout).toContain("no recipients: snapshots will not be encrypted (and a CRIU dump is refused in plaintext)");
    expect(forced.stdout).toMatch(/\n {2}memsnap keygen -o \S+ +# prints age1…\n/);
    expect(forced.stdout.trimEnd().split("\n").pop()).toBe(`next: memsnap snapshot -c ${join(home, "memsnap.json")}`);
    const recipient = runCliSync(["keygen", "-o", join(tempDir("memsnap-init-key-"), "k")]).stdout.trim();
    const withKey = runCliSync(["init", home, "--force", "-r", recipient]);
    expectOk(withKey);
    expect(withKey.stdout).not.toContain("no recipients");
  });
});
