// `memsnap init` accounts for every byte under the agent's home (issue #38): each file is in a
// source or listed as left out with its reason and size; a large directory init does not
// recognise becomes a `files` source (a KV dump of `layer_NN.kvpages` files plus a
// `manifest.json` is not taken for JSON state); `snapshot` warns about large files no source covers.
import { randomBytes } from "node:crypto";
import { lstatSync, mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import Database from "better-sqlite3";
import { describe, expect, it } from "vitest";
import { expectOk, jsonOut, listTree, runCliSync, sha256, tempDir } from "../helpers/cli.js";
import { git, writeFiles } from "../helpers/git.js";

type Found = { kind: string; name: string; path: string; include?: string[]; exclude?: string[]; extra?: Record<string, string> };
type LeftOut = { path: string; bytes: number; files: number; reason: string };
type InitJson = { sources: Found[]; left_out: LeftOut[]; coverage: { captured_bytes: number; total_bytes: number } };

const MiB = 1 << 20;

/** Bytes of the regular files under `dir`, less `.git` internals and memsnap's own files. */
function treeBytes(dir: string): number {
  let n = 0;
  for (const rel of listTree(dir)) {
    if (rel.split("/").some((s) => s === ".git" || s === ".memsnap") || rel === "memsnap.json") continue;
    const s = lstatSync(join(dir, rel));
    if (s.isFile()) n += s.size;
  }
  return n;
}

describe("memsnap init: every byte under the home", () => {
  it("a KV dump of .kvpages files and a manifest.json is captured whole, as a paged KV dump, not as JSON state; the config covers every byte", () => {
    const top = tempDir("memsnap-init-cov-");
    const home = join(top, "agent");
    writeFiles(join(home, "memory"), { "MEMORY.md": "# memory\n", "people/ada.md": "ada\n" });
    git(join(home, "memory"), ["init", "-q"]);
    git(join(home, "memory"), ["add", "-A"]);
    git(join(home, "memory"), ["-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-qm", "one"]);
    mkdirSync(join(home, "db"));
    const db = new Database(join(home, "db", "memory.db"));
    db.exec("CREATE TABLE m(id INTEGER PRIMARY KEY, t TEXT, e BLOB)");
    const ins = db.prepare("INSERT INTO m(t, e) VALUES (?, ?)");
    for (let i = 0; i < 50; i++) ins.run(`row ${i}`, randomBytes(4096));
    db.close();
    writeFiles(join(home, "state"), { "cursor.json": '{"c":1}' });
    writeFiles(join(home, "notes"), { "today.md": "today\n" });
    const kv: Record<string, Buffer | string> = { "manifest.json": JSON.stringify({ page_bytes: 65536, layers: 3 }) };
    for (const l of ["00", "01", "02"]) kv[`layer_${l}.kvpages`] = randomBytes(2 * MiB);
    writeFiles(join(home, "kv"), kv);

    const j = runCliSync(["init", home, "--print", "--json"]);
    expectOk(j);
    const d = jsonOut(j) as InitJson;
    const kvSources = d.sources.filter((s) => s.path === "kv" || s.path.startsWith("kv/"));
    // not a state source of manifest.json alone: a paged KV dump (its manifest gives page_bytes, the files are whole pages)
    expect(kvSources).toEqual([expect.objectContaining({ kind: "kv", path: "kv", extra: { format: "paged" } })]);
    expect(kvSources[0]!.include).toBeUndefined();
    expect(d.sources.find((s) => s.path === "state")).toMatchObject({ kind: "state", include: ["/cursor.json"] });
    expect(d.left_out).toEqual([]);
    expect(d.coverage.captured_bytes).toBe(d.coverage.total_bytes);
    expect(d.coverage.total_bytes).toBeGreaterThan(treeBytes(home)); // the memdir's .git counts too

    const w = runCliSync(["init", home]);
    expectOk(w);
    expect(w.stdout).toMatch(/\ncaptures (\S+ \S+) of \1\n/);
    expect(w.stdout).not.toContain("left out");

    // the config snapshots every byte: restore --to has as many bytes, and each KV file
    const s = runCliSync(["snapshot", "-c", join(home, "memsnap.json"), "--store", join(top, "store"), "--no-redact", "--json"]);
    expectOk(s);
    expect(s.stderr).not.toContain("warning");
    expect((jsonOut(s) as { uncovered?: unknown }).uncovered).toBeUndefined();
    const out = join(top, "restored");
    expectOk(runCliSync(["restore", (jsonOut(s) as { path: string }).path, "--to", out]));
    expect(treeBytes(out)).toBe(treeBytes(home));
    for (const [rel, b] of Object.entries(kv)) expect(sha256(readFileSync(join(out, "kv", rel)))).toBe(sha256(b));
    expect(sha256(readFileSync(join(out, "memory-db", "memory.db")))).toBe(sha256(readFileSync(join(home, "db", "memory.db"))));
  });

  it("a large unknown file becomes a files source, a small one is left out with its reason and size", () => {
    const home = join(tempDir("memsnap-init-unknown-"), "agent");
    writeFiles(join(home, "notes"), { "a.md": "a\n" });
    // a large unknown binary at the top, one in a directory beside a memdir, small unknowns
    writeFileSync(join(home, "weights.bin"), randomBytes(3 * MiB));
    writeFiles(join(home, "runtime", "mem"), { "x.md": "x\n" });
    git(join(home, "runtime", "mem"), ["init", "-q"]);
    writeFiles(join(home, "runtime", "cache", "blobs"), { "b1.bin": randomBytes(MiB), "b2.bin": randomBytes(MiB) });
    writeFiles(join(home, "misc"), { "one.txt": "1\n", "two.txt": "22\n" });
    writeFileSync(join(home, "lone.txt"), "lone\n");
    writeFiles(join(home, "node_modules", "p"), { "index.js": "x\n" });
    writeFiles(join(home, "backups"), { "old.memsnap": randomBytes(2 * MiB) }); // a bundle: not a source of its own

    const r = runCliSync(["init", home, "--print", "--json"]);
    expectOk(r);
    const d = jsonOut(r) as InitJson;
    expect(d.sources.find((s) => s.include?.includes("/weights.bin"))).toMatchObject({ kind: "files", path: "." });
    // the topmost directory with 1 MiB or more uncovered, less the memdir under it (captured once)
    expect(d.sources.find((s) => s.path === "runtime")).toMatchObject({ kind: "files", exclude: ["/mem/"] });
    expect(d.sources.find((s) => s.path === "runtime/mem")).toMatchObject({ kind: "git" });
    const small = "not recognised as agent state, and under 1 MiB in its directory";
    expect(d.sources.find((s) => s.path === "backups")).toBeUndefined();
    expect(d.left_out).toEqual([
      { path: "backups/old.memsnap", bytes: 2 * MiB, files: 1, reason: "a memsnap bundle (snapshots are not captured in snapshots)" },
      { path: "lone.txt", bytes: 5, files: 1, reason: small },
      { path: "misc/", bytes: 5, files: 2, reason: small },
      { path: "node_modules/", bytes: 2, files: 1, reason: "not looked into (dependencies, caches, build output)" },
    ]);
    expect(d.coverage.total_bytes - d.coverage.captured_bytes).toBe(2 * MiB + 12);

    const t = runCliSync(["init", home]);
    expectOk(t);
    expect(t.stdout).toMatch(/\ncaptures 5\.\d MiB of 7\.\d MiB; left out 2\.0 MiB in 5 file\(s\):\n/);
    expect(t.stdout).toMatch(/ +5 B {2}misc\/ \(2 files\): not recognised as agent state/);
    expect(t.stdout).toMatch(/ +2 B {2}node_modules\/: not looked into/);
  });

  it("snapshot warns, naming it, about a large file that no source of the config covers", () => {
    const top = tempDir("memsnap-snap-uncovered-");
    const home = join(top, "agent");
    writeFiles(join(home, "notes"), { "a.md": "a\n", "dump.bin": randomBytes(2 * MiB), "small.bin": randomBytes(1000) });
    writeFiles(join(home, "repo"), { "x.md": "x\n" });
    git(join(home, "repo"), ["init", "-q"]);
    writeFileSync(join(home, "repo", ".git", "big-pack"), randomBytes(2 * MiB)); // .git internals are the memdir's
    writeFileSync(join(home, "last.memsnap"), randomBytes(2 * MiB)); // a bundle written with --out: not warned about
    writeFileSync(join(home, "memsnap.json"), JSON.stringify({
      tenant: "t", agent: "a",
      sources: [{ kind: "files", name: "notes", path: "notes", include: ["**/*.md"] }, { kind: "git", name: "repo", path: "repo" }],
    }));
    const store = join(home, "store"); // the store under the home is not looked into
    mkdirSync(store);
    const s = runCliSync(["snapshot", "-c", join(home, "memsnap.json"), "--store", store, "--no-redact"]);
    expectOk(s);
    expect(s.stderr).toMatch(/warning: 1 large file\(s\) in \S+ \(2\.0 MiB\) are in no source, so not in this snapshot: notes\/dump\.bin \(2\.0 MiB\)/);
    const again = runCliSync(["snapshot", "-c", join(home, "memsnap.json"), "--store", store, "--no-redact", "--json"]);
    expectOk(again);
    expect((jsonOut(again) as { uncovered: unknown }).uncovered).toEqual([{ path: "notes/dump.bin", bytes: 2 * MiB }]);
    // covered: no warning
    writeFileSync(join(home, "memsnap.json"), JSON.stringify({
      tenant: "t", agent: "a", sources: [{ kind: "files", name: "notes", path: "notes" }, { kind: "git", name: "repo", path: "repo" }],
    }));
    const ok = runCliSync(["snapshot", "-c", join(home, "memsnap.json"), "--store", store, "--no-redact", "--json"]);
    expectOk(ok);
    expect(ok.stderr).not.toContain("no source");
    expect((jsonOut(ok) as { uncovered?: unknown }).uncovered).toBeUndefined();
  });
});
