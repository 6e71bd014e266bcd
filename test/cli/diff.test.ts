/**
 * `memsnap diff A B` looks inside the layers (through the real CLI, real git and SQLite): a git
 * layer's notes added, changed and deleted by path between the two HEADs, the commits between
 * them (and a history that was rewritten), the uncommitted work-tree files; SQLite rows per
 * table; files by path; encrypted snapshots with -i; an incremental snapshot whose bundle is
 * read from its base. The text ends with a newline; --json has the same structure.
 */
import { mkdirSync, readdirSync, writeFileSync, unlinkSync } from "node:fs";
import { createRequire } from "node:module";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { beforeAll, describe, expect, it } from "vitest";
import { expectCliError, expectOk, jsonOut, runCliSync, tempDir } from "../helpers/cli.js";
import { commitAll, git, initRepo, writeFiles } from "../helpers/git.js";

const Database = createRequire(import.meta.url)("better-sqlite3") as new (p: string) => {
  exec(sql: string): void;
  close(): void;
};

interface GitJson {
  head: { from: string | null; to: string | null };
  descendant: boolean | null;
  commits: { oid: string; subject: string }[];
  commits_total: number;
  commits_dropped: number;
  files: { added: string[]; changed: string[]; deleted: string[] };
  files_total: { added: number; changed: number; deleted: number };
  worktree: { added: string[]; changed: string[]; removed: string[]; deleted: string[] };
  note?: string;
}
interface LayerJson {
  layer: string;
  kind: string;
  added: { path: string }[];
  changed: { path: string }[];
  removed: { path: string }[];
  git?: GitJson;
  sqlite?: { databases: Record<string, Record<string, { from: number; to: number }>> };
}

const work = tempDir("memsnap-diff-");
const mem = join(work, "mem");
const store = join(work, "store");
const config = join(work, "memsnap.json");
const key = join(work, "key.txt");

function cli(args: string[]): ReturnType<typeof runCliSync> {
  return runCliSync(args, { cwd: work, timeoutMs: 120_000 });
}
function snap(cfg = config, extra: string[] = []): string {
  const r = cli(["snapshot", "-c", cfg, "--json", ...extra]);
  expectOk(r);
  return (jsonOut(r) as { id: string }).id;
}
function diff(a: string, b: string, extra: string[] = [], cfg = config): LayerJson[] {
  const r = cli(["diff", a, b, "-c", cfg, "--json", ...extra]);
  expectOk(r);
  return (jsonOut(r) as { layers: LayerJson[] }).layers;
}
const layer = (d: LayerJson[], name: string): LayerJson => d.find((l) => l.layer === name)!;
const db = (sql: string): void => {
  const h = new Database(join(work, "db", "memory.db"));
  h.exec(sql);
  h.close();
};
/** The memsnap-diff-* temp directories diff leaves in the temp dir (none). */
const leftovers = (): string[] => readdirSync(tmpdir()).filter((n) => n.startsWith("memsnap-diff-") && join(tmpdir(), n) !== work);

let A: string;
let B: string;
let C: string;

beforeAll(() => {
  initRepo(mem);
  writeFiles(mem, { "a.md": "alpha\n", "b.md": "beta\n", "c.md": "gamma\n" });
  commitAll(mem, "init notes");
  mkdirSync(join(work, "db"));
  db("CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT); INSERT INTO notes (body) VALUES ('a'), ('b'), ('c'); CREATE TABLE tags (t TEXT); INSERT INTO tags VALUES ('x');");
  writeFiles(join(work, "files"), { "x.txt": "x\n", "gone.txt": "bye\n" });
  writeFileSync(config, JSON.stringify({
    agent: "scribe", store, sources: [
      { kind: "git", name: "memory", path: "mem" },
      { kind: "sqlite", name: "memory-db", path: "db/memory.db" },
      { kind: "files", name: "files", path: "files" },
    ],
  }));
  A = snap();
  // B: a note changed, one deleted, two added (one with a newline in its name), over two commits; one uncommitted file.
  writeFiles(mem, { "a.md": "alpha, revised\n", "d/e.md": "epsilon\n", "we\nird.md": "odd name\n" });
  unlinkSync(join(mem, "b.md"));
  commitAll(mem, "edit notes");
  writeFiles(mem, { "f.md": "phi\n" });
  commitAll(mem, "add f\u001b[31m");
  writeFiles(mem, { "u.md": "uncommitted\n" });
  unlinkSync(join(mem, "c.md")); // deleted, not committed
  db("INSERT INTO notes (body) VALUES ('d'), ('e'); DELETE FROM tags; UPDATE notes SET body = 'A' WHERE id = 1;");
  writeFiles(join(work, "files"), { "x.txt": "x, longer\n", "y.txt": "new\n" });
  unlinkSync(join(work, "files", "gone.txt"));
  B = snap();
  // C: history rewritten: back to the first commit, then another.
  git(mem, ["reset", "-q", "--hard", "HEAD~2"]);
  writeFiles(mem, { "g.md": "gee\n" });
  commitAll(mem, "other branch of history");
  C = snap();
}, 180_000);

describe("memsnap diff inside layers", () => {
  it("names the git notes added, changed and deleted by path, and the commits between the HEADs", () => {
    const g = layer(diff(A, B), "memory").git!;
    expect(g.files).toEqual({ added: ["d/e.md", "f.md", "we\nird.md"], changed: ["a.md"], deleted: ["b.md"] });
    expect(g.files_total).toEqual({ added: 3, changed: 1, deleted: 1 });
    expect(g.commits.map((c) => c.subject)).toEqual(["add f\u001b[31m", "edit notes"]);
    expect(g.commits.every((c) => /^[0-9a-f]{40}$/.test(c.oid))).toBe(true);
    expect(g.commits[0]!.oid).toBe(g.head.to);
    expect(g.commits_total).toBe(2);
    expect(g.descendant).toBe(true);
    expect(g.worktree).toEqual({ added: ["u.md"], changed: [], removed: [], deleted: ["c.md"] });
    expect(g.note).toBeUndefined();
    expect(leftovers()).toEqual([]);
  });

  it("says when B does not descend from A, and how many commits of A's history B lacks", () => {
    const g = layer(diff(B, C), "memory").git!;
    expect(g.descendant).toBe(false);
    expect(g.commits.map((c) => c.subject)).toEqual(["other branch of history"]);
    expect(g.commits_dropped).toBe(2);
    // (u.md was committed in C: no longer an uncommitted file, now a committed one)
    expect(g.files).toEqual({ added: ["b.md", "g.md", "u.md"], changed: ["a.md"], deleted: ["d/e.md", "f.md", "we\nird.md"] });
    expect(g.worktree).toEqual({ added: [], changed: [], removed: ["u.md"], deleted: [] });
    const text = cli(["diff", B, C, "-c", config]);
    expectOk(text);
    expect(text.stdout).toContain("does not descend from");
  });

  it("gives SQLite rows per table (counts, and added, removed and changed by rowid) and files by path", () => {
    const d = diff(A, B);
    expect(layer(d, "memory-db").sqlite!.databases).toEqual({
      "memory.db": {
        notes: { from: 3, to: 5, added: 2, removed: 0, changed: 1, changed_rowids: ["1"] },
        tags: { from: 1, to: 0, added: 0, removed: 1, changed: 0, changed_rowids: [] },
      },
    });
    const f = layer(d, "files");
    expect(f.added.map((x) => x.path)).toEqual(["files/y.txt"]);
    expect(f.changed.map((x) => x.path)).toEqual(["files/x.txt"]);
    expect(f.removed.map((x) => x.path)).toEqual(["files/gone.txt"]);
  });

  it("prints one section per layer, escapes control characters, and ends with a newline", () => {
    const r = cli(["diff", A, B, "-c", config]);
    expectOk(r);
    const out = r.stdout;
    expect(out.endsWith("\n")).toBe(true);
    expect(out.endsWith("\n\n")).toBe(false);
    expect(out).toMatch(/^memory \(git\): /m);
    expect(out).toMatch(/^memory-db \(sqlite\): /m);
    expect(out).toMatch(/^files \(files\): /m);
    expect(out).toContain("  files (committed): 3 added, 1 changed, 1 deleted\n");
    for (const l of ["    + d/e.md", "    + f.md", "    + we?ird.md", "    ~ a.md", "    - b.md", "    + u.md", "    x c.md"]) expect(out.split("\n")).toContain(l);
    expect(out).toMatch(/^ {2}commits [0-9a-f]{12}\.\.[0-9a-f]{12}: 2$/m);
    expect(out).toMatch(/^ {4}[0-9a-f]{12} add f\?\[31m$/m);
    expect(out).toMatch(/^ {4}[0-9a-f]{12} edit notes$/m);
    expect(out).not.toContain("\u001b");
    expect(out).toContain("    notes: 3 → 5 rows (+2): 2 added, 0 removed, 1 changed by rowid\n");
    expect(out).toContain("  + files/y.txt");
  });

  it("an encrypted pair needs the key (-i), then shows the same view", () => {
    const k = cli(["keygen", "-o", key]);
    expectOk(k);
    const ecfg = join(work, "enc.json");
    writeFileSync(ecfg, JSON.stringify({ agent: "scribe-enc", store, recipients: [k.stdout.trim()], sources: [{ kind: "git", name: "memory", path: "mem" }, { kind: "sqlite", name: "memory-db", path: "db/memory.db" }] }));
    const e1 = snap(ecfg);
    db("UPDATE notes SET body = 'B' WHERE id = 2;");
    writeFiles(mem, { "g.md": "gee, again\n", "h.md": "aitch\n" });
    commitAll(mem, "encrypted change");
    const e2 = snap(ecfg);
    const no = cli(["diff", e1, e2, "-c", ecfg]);
    expectCliError(no, 4, "MEMSNAP_IDENTITY_REQUIRED");
    const d = diff(e1, e2, ["-i", key], ecfg);
    const g = layer(d, "memory").git!;
    expect(g.files).toEqual({ added: ["h.md"], changed: ["g.md"], deleted: [] });
    expect(layer(d, "memory-db").sqlite!.databases["memory.db"]!.notes).toMatchObject({ from: 5, to: 5, changed: 1, changed_rowids: ["2"] });
    expect(g.commits.map((c) => c.subject)).toEqual(["encrypted change"]);
    expect(leftovers()).toEqual([]);
  });

  it("an incremental snapshot's bundle is read from its base", () => {
    const icfg = join(work, "inc.json");
    writeFiles(join(work, "files"), { "z.txt": "z\n" });
    writeFileSync(icfg, JSON.stringify({
      agent: "scribe-inc", store, sources: [{ kind: "git", name: "memory", path: "mem" }, { kind: "files", name: "files", path: "files" }],
    }));
    const i1 = snap(icfg, ["--incremental"]);
    writeFiles(mem, { "i.md": "eye\n" });
    commitAll(mem, "incremental change");
    const i2 = snap(icfg, ["--incremental"]);
    writeFiles(join(work, "files"), { "z.txt": "z, changed\n" });
    const i3r = cli(["snapshot", "-c", icfg, "--incremental", "--json"]);
    expectOk(i3r);
    const i3 = jsonOut(i3r) as { id: string; incremental: { referenced: number; bases: string[] } };
    expect(i3.incremental.bases).toContain(i2);
    const inspect = jsonOut(cli(["inspect", join(store, "default", "scribe-inc", `${i3.id}.memsnap`), "--json"])) as { manifest: { index?: { path: string; ref?: string }[] } };
    const idx = inspect.manifest.index;
    // The git layer is a chain: the full bundle's bytes are in i1's payload, the commit's link in i2's.
    expect(idx?.find((e) => e.path === "memory/repo.bundle")?.ref).toBe(i1);
    expect(idx?.find((e) => e.path === "memory/repo.1.bundle")?.ref).toBe(i2);
    const g = layer(diff(i1, i3.id, [], icfg), "memory").git!;
    expect(g.files.added).toEqual(["i.md"]);
    expect(g.commits.map((c) => c.subject)).toEqual(["incremental change"]);
  });

  it("caps each list at 1000 and counts the rest", () => {
    const big = initRepo(join(work, "big"));
    writeFiles(big, { "seed.md": "seed\n" });
    commitAll(big, "seed");
    const bcfg = join(work, "big.json");
    writeFileSync(bcfg, JSON.stringify({ agent: "scribe-big", store, sources: [{ kind: "git", name: "memory", path: "big" }] }));
    const b1 = snap(bcfg);
    const many: Record<string, string> = {};
    for (let i = 0; i < 1100; i++) many[`n/${String(i).padStart(4, "0")}.md`] = `note ${i}\n`;
    writeFiles(big, many);
    commitAll(big, "many notes");
    const b2 = snap(bcfg);
    const g = layer(diff(b1, b2, [], bcfg), "memory").git!;
    expect(g.files.added).toHaveLength(1000);
    expect(g.files.added[999]).toBe("n/0999.md");
    expect(g.files_total.added).toBe(1100);
    const r = cli(["diff", b1, b2, "-c", bcfg]);
    expectOk(r);
    expect(r.stdout).toContain("    … and 100 more\n");
    expect(r.stdout.endsWith("\n")).toBe(true);
  });
});
