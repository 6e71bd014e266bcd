/**
 * File names that are not UTF-8 (a Latin-1 `café.md`, a folder of them): a bundle's paths are
 * UTF-8 text and Node hands such a name over mangled, so memsnap cannot capture them. They are
 * left out and reported (never silently dropped, as they were), and an in-place restore leaves
 * them where they are (it failed with an internal error listing the live directory).
 */
import { execFileSync } from "node:child_process";
import { existsSync, mkdirSync, readFileSync, symlinkSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { walkFiles } from "../../src/sources/walk.js";
import { expectOk, jsonOut, makeAgent, runCliSync, tempDir } from "../helpers/cli.js";

const LATIN1 = Buffer.from("caf\xe9.md", "latin1"); // not UTF-8
const bad = (dir: string, name: Buffer): Buffer => Buffer.concat([Buffer.from(`${dir}/`), name]);

describe("names that are not UTF-8", () => {
  it("the walk leaves them out and names them, bad bytes escaped; everything else is walked", async () => {
    const root = tempDir("memsnap-names-");
    writeFileSync(join(root, "ok.md"), "ok\n");
    writeFileSync(bad(root, LATIN1), "latin-1 name\n");
    mkdirSync(bad(root, Buffer.from("d\xff", "latin1")));
    writeFileSync(bad(root, Buffer.from("d\xff/inner.md", "latin1")), "under a bad folder\n");
    writeFileSync(bad(root, Buffer.from("skip\xe9.txt", "latin1")), "not selected\n");
    writeFileSync(join(root, "naïve.md"), "valid UTF-8\n");
    const r = await walkFiles(root, { include: ["*.md"] });
    expect(r.files.map((f) => f.rel)).toEqual(["naïve.md", "ok.md"]);
    expect(r.skipped.unsafe_names).toBe(2);
    expect(r.unsafe).toEqual(["caf\\xe9.md", "d\\xff"]);
  });

  it("a snapshot warns and counts them; an in-place restore leaves them alone", () => {
    const a = makeAgent({ files: { "ok.md": "v1\n" } });
    writeFileSync(bad(a.memoryDir, LATIN1), "keep me\n");
    const store = join(a.dir, "store");
    const s = runCliSync(["snapshot", "-c", a.config, "--store", store]);
    expectOk(s);
    expect(s.stderr).toContain("memsnap: warning: memory: left out 1 file(s) or folder(s) whose names are not UTF-8");
    expect(s.stderr).toContain("caf\\xe9.md");
    const j = runCliSync(["snapshot", "-c", a.config, "--store", store, "--json"]);
    expectOk(j);
    const out = jsonOut(j) as { path: string; warnings: { layer: string; message: string }[] };
    expect(out.warnings).toEqual([{ layer: "memory", message: expect.stringContaining("caf\\xe9.md") }]);
    const inspect = jsonOut(runCliSync(["inspect", out.path, "--json"])) as { manifest: { layers: { name: string; meta: Record<string, any> }[] } };
    expect(inspect.manifest.layers.find((l) => l.name === "memory")!.meta.skipped).toMatchObject({ unsafe_names: 1 });

    writeFileSync(join(a.memoryDir, "ok.md"), "v2\n");
    const r = runCliSync(["restore", out.path, "-c", a.config, "--store", store, "--no-safety-snapshot"]);
    expectOk(r);
    expect(readFileSync(join(a.memoryDir, "ok.md"), "utf8")).toBe("v1\n");
    expect(readFileSync(bad(a.memoryDir, LATIN1), "utf8")).toBe("keep me\n");
    const to = join(a.dir, "restored");
    expectOk(runCliSync(["restore", out.path, "--to", to]));
    expect(readFileSync(join(to, "memory", "ok.md"), "utf8")).toBe("v1\n");
    expect(existsSync(bad(join(to, "memory"), LATIN1))).toBe(false);
  });

  it("a git memdir: changed and untracked files with such names are reported, not taken for deleted", () => {
    const home = tempDir("memsnap-names-git-");
    const mem = join(home, "mem");
    mkdirSync(mem);
    const git = (...args: string[]): void => { execFileSync("git", ["-C", mem, ...args], { stdio: "ignore" }); };
    git("init", "-q");
    writeFileSync(join(mem, "a.md"), "a\n");
    writeFileSync(bad(mem, LATIN1), "committed\n");
    git("add", "-A");
    git("-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-qm", "init");
    writeFileSync(bad(mem, LATIN1), "changed\n");
    writeFileSync(bad(mem, Buffer.from("new\xe9.md", "latin1")), "untracked\n");
    writeFileSync(join(mem, "b.md"), "untracked, fine\n");
    writeFileSync(join(home, "memsnap.json"), JSON.stringify({ agent: "g", sources: [{ kind: "git", name: "mem", path: "mem" }] }));
    const s = runCliSync(["snapshot", "-c", join(home, "memsnap.json"), "--out", join(home, "b.memsnap"), "--json"]);
    expectOk(s);
    expect((jsonOut(s) as { warnings: { message: string }[] }).warnings[0]!.message).toMatch(/left out 2 .*caf\\xe9\.md, new\\xe9\.md$/);
    const meta = (jsonOut(runCliSync(["inspect", join(home, "b.memsnap"), "--json"])) as { manifest: { layers: { meta: Record<string, any> }[] } })
      .manifest.layers[0]!.meta;
    expect(meta.worktree).toMatchObject({ untracked: 1, deleted: 0, skipped: { unsafe_names: 2 } });
    const to = join(home, "restored");
    expectOk(runCliSync(["restore", join(home, "b.memsnap"), "--to", to]));
    expect(readFileSync(join(to, "mem", "b.md"), "utf8")).toBe("untracked, fine\n");
    expect(readFileSync(bad(join(to, "mem"), LATIN1), "utf8")).toBe("committed\n"); // the history's; the change was reported
  });

  it("symlinks the globs select are named in a warning too (they were left out without one)", () => {
    const a = makeAgent({ files: { "2024-06-01.md": "today\n", "notes/x.json": "{}" } });
    symlinkSync("2024-06-01.md", join(a.memoryDir, "latest.md"));
    symlinkSync("notes/x.json", join(a.memoryDir, "x.json"));
    writeFileSync(a.config, JSON.stringify({ agent: "l", sources: [{ kind: "files", name: "memory", path: "memory", include: ["*.md"] }] }));
    const s = runCliSync(["snapshot", "-c", a.config, "--out", join(a.dir, "b.memsnap")]);
    expectOk(s);
    // latest.md is selected by *.md and named; x.json is not selected, so not mentioned
    expect(s.stderr).toContain("memsnap: warning: memory: left out 1 symlink(s): memsnap captures regular files, not links (capture their targets' folder instead): latest.md\n");
  });
});
