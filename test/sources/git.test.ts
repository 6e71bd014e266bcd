/**
 * The `git` source: capture (git binary and isomorphic-git), the pipeline round trip
 * (snapshot → restore --to → the same repository), deep verify, redaction of history,
 * damaged and in-progress repositories, hostile layers, and (MEMSNAP_SLOW_TESTS=1) the
 * 20,000-file / 3,000-commit timing.
 */
import { spawnSync } from "node:child_process";
import { chmodSync, existsSync, lstatSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, statSync, symlinkSync, writeFileSync } from "node:fs";
import { mkdir, writeFile } from "node:fs/promises";
import { cpus, loadavg, tmpdir } from "node:os";
import { join } from "node:path";
import { Readable } from "node:stream";
import { afterEach, beforeAll, describe, expect, it, vi } from "vitest";
import type { RedactionReport, Redactor } from "../../src/redact/types.js";
import type { Artifact } from "../../src/sources/types.js";
import { gitSource } from "../../src/sources/git/source.js";
import type { GitConfig } from "../../src/sources/git/config.js";
import { gitImpl } from "../../src/sources/git/run.js";
import { isMemsnapError, parseConfig, restoreToDir, snapshot, verifyBundle, type LayerEntry, type Manifest } from "../../src/index.js";
import { expectOk, jsonOut, runCli, tempDir, treeHashes } from "../helpers/cli.js";
import { commitAll, fastImportRepo, git, initRepo, repoRefs, statusSummary, writeFiles } from "../helpers/git.js";
import { requireTool } from "../helpers/tools.js";

// ------------------------------------------------------------------------------ a stub redactor

/** Redaction is off in these tests unless a test turns the stub on (the real redactor is someone else's). */
const redactState = vi.hoisted(() => ({ on: false }));

const SECRET = /SECRET_[A-Z0-9]{12,}/g;

function stubRedactor(): Redactor {
  const rep: RedactionReport = { policy: "stub", rules_fired: [], redacted: {}, unredacted: {}, total_redacted: 0, total_unredacted: 0, bytes_scanned: 0 };
  const hit = (where: "redacted" | "unredacted", artifact: string, n: number): void => {
    if (!n) return;
    const m = (rep[where][artifact] ??= {});
    m["stub-secret"] = (m["stub-secret"] ?? 0) + n;
    if (where === "redacted") rep.total_redacted += n;
    else rep.total_unredacted += n;
    if (!rep.rules_fired.includes("stub-secret")) rep.rules_fired.push("stub-secret");
  };
  const redactText = async (text: string, artifact: string): Promise<string> => {
    rep.bytes_scanned += text.length;
    hit("redacted", artifact, text.match(SECRET)?.length ?? 0);
    return text.replace(SECRET, "[REDACTED:stub-secret]");
  };
  return {
    candidate: (t) => t.includes("SECRET_"),
    redactText,
    scanText: async (text, artifact) => {
      rep.bytes_scanned += text.length;
      hit("unredacted", artifact, text.match(SECRET)?.length ?? 0);
    },
    redactArtifact: async (a: Artifact, payloadPath: string): Promise<Artifact> => {
      const parts: Buffer[] = [];
      const src = a.open();
      for await (const c of (src instanceof Readable ? src : Readable.from(src)) as AsyncIterable<Buffer>) parts.push(c);
      const out = Buffer.from(await redactText(Buffer.concat(parts).toString("utf8"), payloadPath), "utf8");
      return { ...a, size: out.length, open: () => Readable.from([out]), check: async () => undefined };
    },
    report: () => rep,
    cleanup: async () => undefined,
  };
}

vi.mock("../../src/redact/index.js", async (importOriginal) => {
  const orig = await importOriginal<typeof import("../../src/redact/index.js")>();
  return { ...orig, createRedactor: async (cfg: { enabled: boolean }) => (redactState.on && cfg.enabled ? stubRedactor() : undefined) };
});

// ------------------------------------------------------------------------------ helpers

const haveGit = requireTool("git");
const itGit = it.skipIf(!haveGit);
const LAYER = "mem";

afterEach(() => {
  redactState.on = false;
  delete process.env.MEMSNAP_GIT_IMPL;
});

function withImpl<T>(impl: "git" | "isomorphic" | undefined, fn: () => Promise<T>): Promise<T> {
  if (impl) process.env.MEMSNAP_GIT_IMPL = impl;
  else delete process.env.MEMSNAP_GIT_IMPL;
  return fn().finally(() => {
    delete process.env.MEMSNAP_GIT_IMPL;
  });
}

interface SnapOpts {
  source?: Record<string, unknown>;
  passphrase?: string;
  allowUnredacted?: boolean;
}

/** Snapshot `base/memdir` (or `source.path`) as a git layer named `mem`; returns the bundle path and manifest. */
async function snap(base: string, opts: SnapOpts = {}): Promise<{ out: string; manifest: Manifest; layer: LayerEntry }> {
  const config = parseConfig({ agent: "scribe", sources: [{ kind: "git", name: LAYER, path: "memdir", ...opts.source }] }, null, base);
  const out = join(tempDir("memsnap-git-out-"), "s.memsnap");
  const r = await snapshot({
    config, out,
    ...(opts.passphrase ? { passphrase: opts.passphrase, scryptLogN: 2 } : {}),
    ...(opts.allowUnredacted ? { allowUnredacted: true } : {}),
  });
  return { out, manifest: r.manifest, layer: r.manifest.layers.find((l) => l.name === LAYER)! };
}

async function restore(bundle: string, passphrase?: string): Promise<string> {
  const to = join(tempDir("memsnap-git-restore-"), "r");
  await restoreToDir(bundle, to, passphrase ? { keys: { passphrases: [passphrase] } } : {});
  return join(to, LAYER);
}

async function expectCode(p: Promise<unknown>, code: string, msg?: RegExp): Promise<Error> {
  const e = await p.then(() => null, (x: unknown) => x);
  expect(e, `expected ${code}`).not.toBeNull();
  if (!isMemsnapError(e)) throw e;
  expect(e.code, e.message).toBe(code);
  if (msg) expect(e.message).toMatch(msg);
  return e;
}

/** Run the source's capture directly and write its artifacts to a directory (for looking inside the bundle). */
async function captureDirect(root: string, redactor?: Redactor, cfg: Partial<GitConfig> = {}): Promise<{ dir: string; paths: string[]; meta: Record<string, unknown> }> {
  const tmp = tempDir("memsnap-git-cap-");
  const dir = join(tmp, "out");
  const c = gitSource.parseConfig({ kind: "git", name: LAYER, path: root, ...cfg }, "test");
  const cap = await gitSource.capture(c, { baseDir: "/", tmpDir: tmp, ...(redactor ? { redactor } : {}) });
  const paths: string[] = [];
  try {
    for await (const a of cap.artifacts) {
      const parts: Buffer[] = [];
      const src = a.open();
      for await (const ch of (src instanceof Readable ? src : Readable.from(src)) as AsyncIterable<Buffer>) parts.push(ch);
      const bytes = Buffer.concat(parts);
      expect(bytes.length, a.path).toBe(a.size);
      await a.check?.();
      await mkdir(join(dir, a.path, ".."), { recursive: true });
      await writeFile(join(dir, a.path), bytes);
      paths.push(a.path);
    }
    return { dir, paths, meta: (await cap.finish?.()) ?? {} };
  } finally {
    await cap.cleanup?.();
  }
}

/** Every file of a work tree, ignoring .git and paths `skip` names. */
function worktreeHashes(dir: string, skip: string[] = []): Record<string, string> {
  return treeHashes(dir, (rel) => rel === ".git" || rel.startsWith(".git/") || skip.some((s) => rel === s || rel.startsWith(`${s}/`)));
}

const isExec = (p: string): boolean => (statSync(p).mode & 0o100) !== 0;

// ------------------------------------------------------------------------------ fixtures

interface Rich {
  base: string;
  root: string;
  status: Record<string, "modified" | "new" | "deleted">;
  refs: ReturnType<typeof repoRefs>;
  ignored: string[];
  marker: string;
}

/**
 * A repository with two branches, an annotated and a lightweight tag, staged/unstaged
 * modifications, staged/unstaged deletions, untracked files (some named like the layer's
 * artifacts), ignored files, an executable; then config, a filter driver, an fsmonitor and
 * hooks that would leave a marker file if memsnap ran them.
 */
function buildRich(): Rich {
  const base = tempDir("memsnap-git-rich-");
  const root = initRepo(join(base, "memdir"));
  writeFiles(root, {
    "MEMORY.md": "# Memory\n\n- likes tea\n",
    "notes/a.md": "note a\n",
    "notes/b.md": "note b\n",
    "bin/run.sh": "#!/bin/sh\necho run\n",
    ".gitignore": "*.log\nsecret-cache/\n",
    ".gitattributes": "*.md filter=evil\n",
    "data.bin": Buffer.from([0, 1, 2, 3, 0, 255, 254]),
  });
  chmodSync(join(root, "bin/run.sh"), 0o755);
  commitAll(root, "first memory");
  git(root, ["checkout", "-q", "-b", "feature"]);
  writeFiles(root, { "notes/a.md": "note a, feature edit\n", "feature.md": "feature work\n" });
  commitAll(root, "feature work");
  git(root, ["tag", "light"]);
  git(root, ["checkout", "-q", "main"]);
  writeFiles(root, { "MEMORY.md": "# Memory\n\n- likes tea\n- met ada\n" });
  commitAll(root, "second memory");
  git(root, ["tag", "-a", "v1", "-m", "release one"]);
  // Work-tree changes.
  writeFiles(root, {
    "MEMORY.md": "# Memory\n\n- likes tea\n- met ada\n- unstaged edit\n",
    "notes/b.md": "note b, staged edit\n",
    "inbox/new.md": "untracked note\n",
    "repo.bundle": "an untracked file named like the layer's bundle\n",
    "worktree-deleted.json": "{\"not\": \"the layer's\"}\n",
    "worktree/x.md": "an untracked file under a directory named like the layer's worktree/\n",
    "tools/new.sh": "#!/bin/sh\necho new\n",
    "staged-new.md": "added to the index, never committed\n",
    "debug.log": "ignored\n",
    "secret-cache/k.txt": "ignored too\n",
  });
  chmodSync(join(root, "tools/new.sh"), 0o755);
  git(root, ["add", "notes/b.md", "staged-new.md"]);
  rmSync(join(root, "notes/a.md"));
  git(root, ["rm", "-q", "data.bin"]);
  const status = statusSummary(root);
  const refs = repoRefs(root);
  // Now the traps: none of this may run during capture.
  const marker = join(base, "pwned");
  const hook = `#!/bin/sh\ntouch '${marker}'\n`;
  writeFiles(root, { ".git/hooks/post-checkout": hook, ".git/hooks/pre-commit": hook, ".git/hooks/fsmon": hook, ".git/hooks/reference-transaction": hook });
  for (const h of ["post-checkout", "pre-commit", "fsmon", "reference-transaction"]) chmodSync(join(root, ".git/hooks", h), 0o755);
  git(root, ["config", "filter.evil.clean", `sh -c 'touch ${marker}; cat'`]);
  git(root, ["config", "filter.evil.smudge", `sh -c 'touch ${marker}; cat'`]);
  git(root, ["config", "filter.evil.required", "true"]);
  git(root, ["config", "core.fsmonitor", join(root, ".git/hooks/fsmon")]);
  git(root, ["config", "memsnap.sourceonly", "yes"]);
  git(root, ["remote", "add", "origin", "https://user:token@example.com/agent.git"]);
  // Make every tracked file's stat info stale so status would have to run the clean filter.
  for (const f of ["MEMORY.md", "notes/b.md", "feature.md"]) if (existsSync(join(root, f))) writeFileSync(join(root, f), readFileSync(join(root, f)));
  return { base, root, status, refs, ignored: ["debug.log", "secret-cache"], marker };
}

/** Compare a restored repository with the source: fsck, refs, HEAD, status, file contents. */
function expectSameRepo(restored: string, src: { root: string; status: Record<string, string>; refs: ReturnType<typeof repoRefs>; ignored?: string[] }): void {
  git(restored, ["fsck", "--full", "--no-progress"]);
  expect(repoRefs(restored)).toEqual(src.refs);
  expect(statusSummary(restored)).toEqual(src.status);
  expect(worktreeHashes(restored)).toEqual(worktreeHashes(src.root, src.ignored ?? []));
}

// ------------------------------------------------------------------------------ tests

describe("git source: config", () => {
  it("MEMSNAP_GIT_IMPL must name an implementation", () => {
    process.env.MEMSNAP_GIT_IMPL = "libgit2";
    expect(() => gitImpl()).toThrow(expect.objectContaining({ code: "MEMSNAP_USAGE" }));
    process.env.MEMSNAP_GIT_IMPL = "isomorphic";
    expect(gitImpl()).toBe("isomorphic-git");
    process.env.MEMSNAP_GIT_IMPL = "git";
    expect(gitImpl()).toBe("git");
  });

  it("parses its keys and rejects unknown ones", () => {
    expect(gitSource.parseConfig({ kind: "git", name: "m", path: "memdir" }, "w")).toEqual({ kind: "git", name: "m", path: "memdir", worktree: true });
    expect(gitSource.parseConfig({ kind: "git", name: "m", path: "memdir", worktree: false }, "w").worktree).toBe(false);
    expect(() => gitSource.parseConfig({ kind: "git", name: "m", path: "memdir", branch: "main" }, "w")).toThrow(expect.objectContaining({ code: "MEMSNAP_CONFIG_UNKNOWN_KEY" }));
    expect(() => gitSource.parseConfig({ kind: "git", name: "m", path: "memdir", worktree: "yes" }, "w")).toThrow(expect.objectContaining({ code: "MEMSNAP_CONFIG_INVALID" }));
    expect(() => gitSource.parseConfig({ kind: "git", name: "m" }, "w")).toThrow(expect.objectContaining({ code: "MEMSNAP_CONFIG_INVALID" }));
    expect(() => parseConfig({ agent: "a", sources: [{ kind: "git", name: "m", path: "x", hooks: true }] }, null, "/")).toThrow(expect.objectContaining({ code: "MEMSNAP_CONFIG_UNKNOWN_KEY" }));
  });
});

describe("git source: round trip", () => {
  let rich: Rich;
  beforeAll(() => {
    if (haveGit) rich = buildRich();
  });

  itGit("captures refs, HEAD, work-tree changes and no ignored or .git files; restore rebuilds the same repository", async () => {
    const { out, manifest, layer } = await snap(rich.base);
    const paths = manifest.index!.filter((e) => e.layer === LAYER).map((e) => e.path).sort();
    expect(paths).toEqual([
      "mem/repo.bundle",
      "mem/repo.idx",
      "mem/worktree-deleted.json",
      "mem/worktree/MEMORY.md",
      "mem/worktree/inbox/new.md",
      "mem/worktree/notes/b.md",
      "mem/worktree/repo.bundle",
      "mem/worktree/staged-new.md",
      "mem/worktree/tools/new.sh",
      "mem/worktree/worktree-deleted.json",
      "mem/worktree/worktree/x.md",
    ]);
    expect(paths.some((p) => /\.git\/|debug\.log|secret-cache/.test(p))).toBe(false);
    expect(manifest.index!.find((e) => e.path === "mem/repo.bundle")!.kind).toBe("git-bundle");
    expect(manifest.index!.find((e) => e.path === "mem/worktree-deleted.json")!.kind).toBe("json");
    const meta = layer.meta!;
    expect(meta).toMatchObject({
      impl: "git", object_format: "sha1", empty: false, bundle: true, branch: "main", detached: false, ref_count: 4,
      head: { oid: rich.refs.headOid, subject: "second memory", author: "Ada Lovelace <ada@example.com>", time: "2024-06-01T12:02:00.000Z" },
      state: { rebase: false, merge: false, index_lock: false },
      worktree: { captured: true, method: "status", modified: 2, untracked: 6, deleted: 2 },
      history_scan: null,
    });
    expect(existsSync(rich.marker), "a hook, filter or fsmonitor of the memdir ran").toBe(false);

    // The user's own (global) filter drivers don't run on restore either (think git-lfs smudge).
    const globalCfg = join(rich.base, "global.gitconfig");
    writeFileSync(globalCfg, `[filter "evil"]\n\tsmudge = sh -c 'touch ${rich.marker}; cat'\n\tclean = sh -c 'touch ${rich.marker}; cat'\n\trequired = true\n`);
    const saved = process.env.GIT_CONFIG_GLOBAL;
    process.env.GIT_CONFIG_GLOBAL = globalCfg;
    let restored: string;
    try {
      restored = await restore(out);
    } finally {
      if (saved === undefined) delete process.env.GIT_CONFIG_GLOBAL;
      else process.env.GIT_CONFIG_GLOBAL = saved;
    }
    expect(existsSync(rich.marker), "a filter driver ran during restore").toBe(false);
    expectSameRepo(restored, rich);
    expect(existsSync(rich.marker)).toBe(false);
    expect(readFileSync(join(restored, "repo.bundle"), "utf8")).toContain("untracked file named like");
    expect(readFileSync(join(restored, "worktree-deleted.json"), "utf8")).toContain("not");
    expect(isExec(join(restored, "tools/new.sh"))).toBe(true);
    expect(isExec(join(restored, "bin/run.sh"))).toBe(true);
    expect(isExec(join(restored, "MEMORY.md"))).toBe(false);
    expect(existsSync(join(restored, "debug.log"))).toBe(false);
    // A fresh .git: git's own default config, no hooks, no remotes or keys from the source.
    const cfg = readFileSync(join(restored, ".git/config"), "utf8");
    expect(cfg).not.toMatch(/sourceonly|evil|fsmonitor|token|origin|hooksPath/);
    const hooks = join(restored, ".git/hooks");
    expect(existsSync(hooks) ? readdirSync(hooks) : []).toEqual([]);
  });

  itGit("the bundle holds refs and objects only: it passes `git bundle verify` and lists exactly the refs", async () => {
    const { dir, paths } = await captureDirect(rich.root);
    expect(paths).toContain("repo.bundle");
    const b = join(dir, "repo.bundle");
    const v = spawnSync("git", ["bundle", "verify", b], { cwd: rich.root, encoding: "utf8" });
    expect(v.status, v.stderr).toBe(0);
    const heads = git(rich.root, ["bundle", "list-heads", b]).trim().split("\n").sort();
    const expected = [...Object.entries(rich.refs.refs).map(([n, o]) => `${o} ${n}`), `${rich.refs.headOid} HEAD`].sort();
    expect(heads).toEqual(expected);
    // Nothing of .git/config travels: the bundle bytes don't hold the source-only config.
    expect(readFileSync(b).includes("sourceonly")).toBe(false);
    const doc = JSON.parse(readFileSync(join(dir, "worktree-deleted.json"), "utf8"));
    expect(doc).toEqual({ format: "memsnap-git-worktree", version: 1, deleted: ["data.bin", "notes/a.md"], executable: ["tools/new.sh"] });
  });

  itGit("isomorphic-git (MEMSNAP_GIT_IMPL=isomorphic) writes a bundle git accepts, and round-trips", async () => {
    const { dir, meta } = await withImpl("isomorphic", () => captureDirect(rich.root));
    expect(meta).toMatchObject({ impl: "isomorphic-git", branch: "main", detached: false, ref_count: 4, head: { oid: rich.refs.headOid, subject: "second memory" } });
    expect(meta.worktree).toMatchObject({ captured: true, method: "isomorphic-git", modified: 2, untracked: 6, deleted: 2 });
    const b = join(dir, "repo.bundle");
    expect(readFileSync(b).subarray(0, 16).toString("latin1")).toBe("# v2 git bundle\n");
    const v = spawnSync("git", ["bundle", "verify", b], { cwd: rich.root, encoding: "utf8" });
    expect(v.status, v.stderr).toBe(0);
    const heads = git(rich.root, ["bundle", "list-heads", b]).trim().split("\n").sort();
    expect(heads).toEqual([...Object.entries(rich.refs.refs).map(([n, o]) => `${o} ${n}`), `${rich.refs.headOid} HEAD`].sort());
    expect(existsSync(rich.marker)).toBe(false);

    // Captured with isomorphic-git, restored with git.
    const { out } = await withImpl("isomorphic", () => snap(rich.base));
    expectSameRepo(await restore(out), rich);
    // Captured and restored with isomorphic-git.
    const restored = await withImpl("isomorphic", () => restore(out));
    expectSameRepo(restored, rich);
    expect(isExec(join(restored, "bin/run.sh"))).toBe(true);
    expect(isExec(join(restored, "tools/new.sh"))).toBe(true);
    expect(existsSync(join(restored, ".git/hooks")) ? readdirSync(join(restored, ".git/hooks")) : []).toEqual([]);
  });

  itGit("verify --deep passes on a good snapshot", async () => {
    const { out } = await snap(rich.base);
    const r = await verifyBundle(out, { deep: true });
    expect(r.findings).toEqual([]);
    expect(r.checks.find((c) => c.name === "deep")?.status).toBe("passed");
  });

  itGit("worktree: false captures the bundle only", async () => {
    const { manifest, layer } = await snap(rich.base, { source: { worktree: false } });
    expect(manifest.index!.filter((e) => e.layer === LAYER).map((e) => e.path)).toEqual(["mem/repo.bundle", "mem/repo.idx"]);
    expect(layer.meta!.worktree).toEqual({ captured: false });
  });
});

describe("git source: CLI", () => {
  itGit("snapshot -o (a relative path), verify --deep, restore --to", async () => {
    const base = tempDir("memsnap-git-cli-");
    const root = initRepo(join(base, "memdir"));
    writeFiles(root, { "MEMORY.md": "one\n", "gone.md": "bye\n" });
    commitAll(root, "one");
    git(root, ["tag", "-a", "v1", "-m", "v1"]);
    writeFiles(root, { "MEMORY.md": "two\n", "new.md": "new\n" });
    rmSync(join(root, "gone.md"));
    const src = { root, status: statusSummary(root), refs: repoRefs(root) };
    writeFileSync(join(base, "memsnap.json"), JSON.stringify({ agent: "scribe", sources: [{ kind: "git", name: LAYER, path: "memdir" }] }));
    expectOk(await runCli(["snapshot", "-o", "s.memsnap"], { cwd: base }));
    const v = await runCli(["verify", "--deep", "--json", "s.memsnap"], { cwd: base });
    expectOk(v);
    expect(JSON.stringify(jsonOut(v))).toContain("deep");
    expectOk(await runCli(["restore", "s.memsnap", "--to", "out", "--layout", "layers"], { cwd: base }));
    expectSameRepo(join(base, "out", LAYER), src);
  });
});

describe("git source: HEAD and history shapes", () => {
  itGit("a detached HEAD on a commit no branch holds round-trips", async () => {
    const base = tempDir("memsnap-git-det-");
    const root = initRepo(join(base, "memdir"));
    writeFiles(root, { "a.md": "1\n" });
    commitAll(root, "one");
    writeFiles(root, { "a.md": "2\n" });
    commitAll(root, "two");
    git(root, ["checkout", "-q", "--detach", "HEAD~1"]);
    writeFiles(root, { "b.md": "only on the detached HEAD\n" });
    const detached = commitAll(root, "detached work\n\nwith a body");
    writeFiles(root, { "a.md": "3, uncommitted\n", "u.md": "untracked\n" });
    const src = { root, status: statusSummary(root), refs: repoRefs(root) };
    expect(src.refs.head).toBe(detached);
    const { out, layer } = await snap(base);
    expect(layer.meta).toMatchObject({ branch: null, detached: true, ref_count: 1, head: { oid: detached, subject: "detached work" } });
    expectSameRepo(await restore(out), src);
    expectSameRepo(await withImpl("isomorphic", () => restore(out)), src);
  });

  for (const impl of ["git", "isomorphic"] as const) itGit(`a repository with no commits: no bundle, the files as untracked, HEAD on the unborn branch (${impl})`, async () => {
    process.env.MEMSNAP_GIT_IMPL = impl;
    const base = tempDir("memsnap-git-empty-");
    const root = initRepo(join(base, "memdir"));
    writeFiles(root, { "MEMORY.md": "fresh\n", "notes/x.md": "x\n", "skip.log": "ignored\n", ".gitignore": "*.log\n" });
    git(root, ["add", "notes/x.md"]);
    const src = { root, status: statusSummary(root), refs: repoRefs(root), ignored: ["skip.log"] };
    const { out, manifest, layer } = await snap(base);
    expect(manifest.index!.map((e) => e.path).filter((p) => p.startsWith("mem/")).sort()).toEqual([
      "mem/worktree-deleted.json", "mem/worktree/.gitignore", "mem/worktree/MEMORY.md", "mem/worktree/notes/x.md",
    ]);
    expect(layer.meta).toMatchObject({ empty: true, bundle: false, head: null, branch: "main", detached: false, ref_count: 0 });
    const restored = await restore(out);
    expectSameRepo(restored, src);
    expect(git(restored, ["symbolic-ref", "HEAD"]).trim()).toBe("refs/heads/main");
  });

  itGit("an unborn orphan branch next to existing refs", async () => {
    const base = tempDir("memsnap-git-orphan-");
    const root = initRepo(join(base, "memdir"));
    writeFiles(root, { "a.md": "1\n" });
    commitAll(root, "one");
    git(root, ["checkout", "-q", "--orphan", "fresh"]);
    writeFiles(root, { "new.md": "new\n" });
    const src = { root, status: statusSummary(root), refs: repoRefs(root) };
    const { out, layer } = await snap(base);
    expect(layer.meta).toMatchObject({ empty: false, bundle: true, head: null, branch: "fresh", detached: false, ref_count: 1 });
    expectSameRepo(await restore(out), src);
  });
});

describe("git source: damaged, busy and odd repositories", () => {
  itGit("a missing object is MEMSNAP_SOURCE_INVALID naming the repository and what git said", async () => {
    const base = tempDir("memsnap-git-corrupt-");
    const root = initRepo(join(base, "memdir"));
    writeFiles(root, { "a.md": "first\n", "b.md": "stays\n" });
    commitAll(root, "one");
    const blob = git(root, ["rev-parse", "HEAD:a.md"]).trim();
    writeFiles(root, { "a.md": "second\n" });
    commitAll(root, "two");
    rmSync(join(root, ".git/objects", blob.slice(0, 2), blob.slice(2)));
    const e = await expectCode(snap(base), "MEMSNAP_SOURCE_INVALID");
    expect(e.message).toContain(root);
    expect(e.message).toMatch(/git pack-objects failed.*(unable to read|pack-objects died)/);
    await withImpl("isomorphic", () => expectCode(snap(base), "MEMSNAP_SOURCE_INVALID", new RegExp(blob)));
  });

  itGit("a held index.lock: the snapshot succeeds, the work tree is captured, meta says index_lock", async () => {
    const base = tempDir("memsnap-git-lock-");
    const root = initRepo(join(base, "memdir"));
    writeFiles(root, { "a.md": "1\n", "b.md": "b\n" });
    commitAll(root, "one");
    writeFiles(root, { "a.md": "2\n", "u.md": "untracked\n" });
    rmSync(join(root, "b.md"));
    const src = { root, status: statusSummary(root), refs: repoRefs(root) };
    writeFileSync(join(root, ".git/index.lock"), "");
    const { out, layer } = await snap(base);
    expect(layer.meta).toMatchObject({ state: { index_lock: true, rebase: false }, worktree: { method: "status", modified: 1, untracked: 1, deleted: 1 } });
    expect(existsSync(join(root, ".git/index.lock"))).toBe(true);
    expectSameRepo(await restore(out), src);
  });

  itGit("an unreadable index: the work tree is compared with HEAD instead (ignore rules still apply)", async () => {
    const base = tempDir("memsnap-git-badindex-");
    const root = initRepo(join(base, "memdir"));
    writeFiles(root, { "a.md": "1\n", "b.md": "b\n", "c.md": "c\n", ".gitignore": "*.log\n" });
    commitAll(root, "one");
    writeFiles(root, { "a.md": "2\n", "u.md": "untracked\n", "x.log": "ignored\n" });
    rmSync(join(root, "b.md"));
    const src = { root, status: statusSummary(root), refs: repoRefs(root), ignored: ["x.log"] };
    writeFileSync(join(root, ".git/index"), "this is not an index");
    const { out, layer, manifest } = await snap(base);
    expect(layer.meta!.worktree).toMatchObject({ method: "compare", modified: 1, untracked: 1, deleted: 1 });
    expect(manifest.index!.map((e) => e.path).filter((p) => p.startsWith("mem/worktree/")).sort()).toEqual(["mem/worktree/a.md", "mem/worktree/u.md"]);
    expectSameRepo(await restore(out), src);
  });

  itGit("mid-rebase with a conflict: committed history plus the work tree, meta says rebase", async () => {
    const base = tempDir("memsnap-git-rebase-");
    const root = initRepo(join(base, "memdir"));
    writeFiles(root, { "f.md": "base\n" });
    commitAll(root, "base");
    git(root, ["checkout", "-q", "-b", "topic"]);
    writeFiles(root, { "f.md": "topic\n" });
    commitAll(root, "topic change");
    git(root, ["checkout", "-q", "main"]);
    writeFiles(root, { "f.md": "main\n" });
    commitAll(root, "main change");
    git(root, ["checkout", "-q", "topic"]);
    git(root, ["-c", "core.editor=true", "rebase", "main"], { allowFail: true });
    expect(existsSync(join(root, ".git/rebase-merge")) || existsSync(join(root, ".git/rebase-apply"))).toBe(true);
    const src = { root, status: statusSummary(root), refs: repoRefs(root) };
    expect(src.status["f.md"]).toBe("modified");
    const { out, layer } = await snap(base);
    expect(layer.meta).toMatchObject({ state: { rebase: true }, detached: true, branch: null });
    const restored = await restore(out);
    expectSameRepo(restored, src);
    expect(readFileSync(join(restored, "f.md"), "utf8")).toContain("<<<<<<<");
    expect(existsSync(join(restored, ".git/rebase-merge"))).toBe(false); // the operation itself is not restored
  });

  itGit("mid-merge with a conflict: meta says merge", async () => {
    const base = tempDir("memsnap-git-merge-");
    const root = initRepo(join(base, "memdir"));
    writeFiles(root, { "f.md": "base\n" });
    commitAll(root, "base");
    git(root, ["checkout", "-q", "-b", "topic"]);
    writeFiles(root, { "f.md": "topic\n" });
    commitAll(root, "topic");
    git(root, ["checkout", "-q", "main"]);
    writeFiles(root, { "f.md": "main\n" });
    commitAll(root, "main");
    git(root, ["merge", "topic"], { allowFail: true });
    expect(existsSync(join(root, ".git/MERGE_HEAD"))).toBe(true);
    const src = { root, status: statusSummary(root), refs: repoRefs(root) };
    const { out, layer } = await snap(base);
    expect(layer.meta).toMatchObject({ state: { merge: true, rebase: false }, branch: "main" });
    expectSameRepo(await restore(out), src);
  });

  itGit("a shallow clone is refused: MEMSNAP_SOURCE_INVALID, unshallow it first", async () => {
    const base = tempDir("memsnap-git-shallow-");
    const up = initRepo(join(base, "up"));
    for (let i = 0; i < 3; i++) {
      writeFiles(up, { "f.md": `${i}\n` });
      commitAll(up, `c${i}`);
    }
    git(base, ["clone", "-q", "--depth", "1", `file://${up}`, "memdir"]);
    const e = await expectCode(snap(base), "MEMSNAP_SOURCE_INVALID", /shallow clone: unshallow it first/);
    expect((e as { hint?: string }).hint).toMatch(/git fetch --unshallow/);
  });

  itGit("not a repository is MEMSNAP_SOURCE_INVALID; a missing path is MEMSNAP_SOURCE_MISSING", async () => {
    const base = tempDir("memsnap-git-notrepo-");
    writeFiles(join(base, "memdir"), { "a.md": "plain directory\n" });
    await expectCode(snap(base), "MEMSNAP_SOURCE_INVALID", /not a git repository/);
    // Inside another repository, but not its top: still refused (no upward discovery).
    const outer = initRepo(join(base, "outer"));
    writeFiles(outer, { "sub/a.md": "x\n" });
    commitAll(outer, "outer");
    await expectCode(snap(base, { source: { path: "outer/sub" } }), "MEMSNAP_SOURCE_INVALID", /not a git repository/);
    await expectCode(snap(base, { source: { path: "nope" } }), "MEMSNAP_SOURCE_MISSING");
    writeFileSync(join(base, "file"), "x");
    await expectCode(snap(base, { source: { path: "file" } }), "MEMSNAP_SOURCE_INVALID", /not a directory/);
  });

  itGit("symlinks in the work tree are skipped and counted; the tracked ones come back from the bundle as plain files holding their target", async () => {
    const base = tempDir("memsnap-git-links-");
    const root = initRepo(join(base, "memdir"));
    writeFiles(root, { "a.md": "a\n" });
    symlinkSync("a.md", join(root, "tracked-link"));
    commitAll(root, "one");
    symlinkSync("/etc/hostname", join(root, "untracked-link"));
    const { layer, out } = await snap(base);
    expect(layer.meta!.worktree).toMatchObject({ untracked: 0, skipped: { symlinks: 1 } });
    const restored = await restore(out);
    expect(lstatSync(join(restored, "tracked-link")).isFile()).toBe(true);
    expect(readFileSync(join(restored, "tracked-link"), "utf8")).toBe("a.md");
    expect(existsSync(join(restored, "untracked-link"))).toBe(false);
    expect(statusSummary(restored)).toEqual({});
  });
});

/** Every symlink under `dir` (the .git directory included), as relative paths. */
function linksUnder(dir: string, rel = ""): string[] {
  const out: string[] = [];
  for (const e of readdirSync(join(dir, rel), { withFileTypes: true })) {
    const r = rel ? `${rel}/${e.name}` : e.name;
    if (e.isSymbolicLink()) out.push(r);
    else if (e.isDirectory()) out.push(...linksUnder(dir, r));
  }
  return out;
}

/** A repository whose history holds symlinks to /etc, to ../../x and, in a subdirectory, to /tmp. */
function repoWithLinks(base: string): string {
  const root = initRepo(join(base, "memdir"));
  writeFiles(root, { "a.md": "a\n", "sub/b.md": "b\n" });
  symlinkSync("/etc", join(root, "etc"));
  symlinkSync("../../x", join(root, "up"));
  symlinkSync("/tmp", join(root, "sub", "tmp"));
  commitAll(root, "links");
  writeFiles(root, { "a.md": "a, edited\n" });
  return root;
}

describe("git source: symlinks in a restored repository (issue 35, item 7)", () => {
  for (const impl of ["git", "isomorphic"] as const) {
    itGit(`restore --to creates no symlink: each is a plain file holding its target, core.symlinks=false, git status clean, and a note (${impl})`, async () => {
      const base = tempDir("memsnap-git-histlinks-");
      const root = repoWithLinks(base);
      const { out } = await snap(base);
      const to = join(tempDir("memsnap-git-histlinks-to-"), "r");
      const r = await withImpl(impl, () => restoreToDir(out, to));
      const restored = join(to, LAYER);
      expect(linksUnder(to)).toEqual([]);
      expect(readFileSync(join(restored, "etc"), "utf8")).toBe("/etc");
      expect(readFileSync(join(restored, "up"), "utf8")).toBe("../../x");
      expect(readFileSync(join(restored, "sub", "tmp"), "utf8")).toBe("/tmp");
      expect(readFileSync(join(restored, "a.md"), "utf8")).toBe("a, edited\n");
      expect(git(restored, ["config", "core.symlinks"]).trim()).toBe("false");
      expect(statusSummary(restored)).toEqual({ "a.md": "modified" });
      git(restored, ["fsck", "--full", "--no-progress"]);
      expect(r.notes).toHaveLength(1);
      expect(r.notes[0]).toMatch(/^git layer mem: 3 symlinks in the checked-out tree \("etc", "sub\/tmp", "up"\)|^git layer mem: 3 symlinks/);
      expect(r.notes[0]).toContain("core.symlinks=false");
    });
  }

  itGit("a repository without symlinks keeps git's default (no core.symlinks, no note)", async () => {
    const base = tempDir("memsnap-git-nolinks-");
    const root = initRepo(join(base, "memdir"));
    writeFiles(root, { "a.md": "a\n" });
    commitAll(root, "one");
    const { out } = await snap(base);
    const to = join(tempDir("memsnap-git-nolinks-to-"), "r");
    const r = await restoreToDir(out, to);
    expect(r.notes).toEqual([]);
    expect(git(join(to, LAYER), ["config", "core.symlinks"], { allowFail: true }).trim()).toBe("");
  });
});

describe("git source: in-place restore keeps the live repository's own .git (issue 35, items 13 and 7)", () => {
  /** Run git as a user would, with no identity in the environment and an empty HOME: only the repository's config can help. */
  function bareGit(cwd: string, args: string[], home: string): { code: number | null; out: string } {
    const env: NodeJS.ProcessEnv = {};
    for (const [k, v] of Object.entries(process.env)) if (!k.startsWith("GIT_") && !/^(EMAIL|HOME|XDG_CONFIG_HOME)$/.test(k)) env[k] = v;
    const r = spawnSync("git", args, { cwd, env: { ...env, HOME: home, GIT_CONFIG_NOSYSTEM: "1" }, encoding: "utf8" });
    return { code: r.status, out: r.stdout + r.stderr };
  }

  for (const impl of ["git", "isomorphic"] as const) itGit(`config (identity, remote), hooks and info/exclude survive; git commit works after; no symlink is created (${impl})`, async () => {
    const base = tempDir("memsnap-git-keep-");
    const root = repoWithLinks(base);
    const home = tempDir("memsnap-git-home-");
    const marker = join(base, "hook-ran");
    git(root, ["config", "user.name", "Grace Hopper"]);
    git(root, ["config", "user.email", "grace@example.com"]);
    git(root, ["remote", "add", "origin", "https://example.com/agent-memory.git"]);
    writeFiles(root, { ".git/hooks/pre-commit": `#!/bin/sh\necho live-hook >> '${marker}'\n`, ".git/info/exclude": "scratch/\n" });
    chmodSync(join(root, ".git/hooks/pre-commit"), 0o755);
    writeFileSync(join(base, "memsnap.json"), JSON.stringify({ agent: "keeper", redaction: { enabled: false }, sources: [{ kind: "git", name: LAYER, path: "memdir" }] }));
    const bundle = join(base, "b.memsnap");
    const env = impl === "isomorphic" ? { MEMSNAP_GIT_IMPL: "isomorphic" } : {};
    expectOk(await runCli(["snapshot", "-c", join(base, "memsnap.json"), "--out", bundle], { cwd: base, env }));
    // The live repository moves on.
    writeFiles(root, { "later.md": "later\n" });
    commitAll(root, "later");
    const r = await runCli(["restore", bundle, "-c", join(base, "memsnap.json"), "--store", join(base, "store")], { cwd: base, env: { ...env, HOME: home } });
    expectOk(r);
    expect(r.stderr).toMatch(/memsnap: note: git layer mem: 3 symlinks .*restored as plain files/);
    expect(linksUnder(root)).toEqual([]);
    expect(readFileSync(join(root, "etc"), "utf8")).toBe("/etc");
    expect(existsSync(join(root, "later.md"))).toBe(false);
    // The live repository's own .git pieces.
    expect(bareGit(root, ["config", "user.name"], home).out.trim()).toBe("Grace Hopper");
    expect(bareGit(root, ["config", "user.email"], home).out.trim()).toBe("grace@example.com");
    expect(bareGit(root, ["remote", "get-url", "origin"], home).out.trim()).toBe("https://example.com/agent-memory.git");
    expect(bareGit(root, ["config", "core.symlinks"], home).out.trim()).toBe("false");
    expect(readFileSync(join(root, ".git/info/exclude"), "utf8")).toBe("scratch/\n");
    expect(isExec(join(root, ".git/hooks/pre-commit"))).toBe(true);
    writeFiles(root, { "scratch/tmp.md": "excluded by info/exclude\n" });
    expect(bareGit(root, ["status", "--porcelain"], home).out).toBe(" M a.md\n");
    // git commit works without an identity in the environment, and runs the live hook.
    const c = bareGit(root, ["commit", "-q", "-am", "after restore"], home);
    expect(c.code, c.out).toBe(0);
    expect(bareGit(root, ["log", "-1", "--format=%an <%ae>"], home).out.trim()).toBe("Grace Hopper <grace@example.com>");
    expect(readFileSync(marker, "utf8")).toBe("live-hook\n");
    git(root, ["fsck", "--full", "--no-progress"]);
  });

  itGit("a live repository with no config of its own to keep (a gitdir file) restores as before", async () => {
    const base = tempDir("memsnap-git-keep-wt-");
    const main = initRepo(join(base, "main"));
    writeFiles(main, { "a.md": "a\n" });
    commitAll(main, "one");
    git(main, ["worktree", "add", "-q", join(base, "memdir"), "-b", "side"]);
    writeFileSync(join(base, "memsnap.json"), JSON.stringify({ agent: "keeper", redaction: { enabled: false }, sources: [{ kind: "git", name: LAYER, path: "memdir" }] }));
    const bundle = join(base, "b.memsnap");
    expectOk(await runCli(["snapshot", "-c", join(base, "memsnap.json"), "--out", bundle], { cwd: base }));
    expectOk(await runCli(["restore", bundle, "-c", join(base, "memsnap.json"), "--no-safety-snapshot"], { cwd: base }));
    expect(lstatSync(join(base, "memdir", ".git")).isDirectory()).toBe(true);
    expect(readFileSync(join(base, "memdir", "a.md"), "utf8")).toBe("a\n");
  });
});

describe("git source: type changes", () => {
  itGit("a tracked symlink replaced by a directory, a tracked file replaced by a directory", async () => {
    const base = tempDir("memsnap-git-type-");
    const root = initRepo(join(base, "memdir"));
    writeFiles(root, { "target/t.md": "t\n", "plain": "was a file\n", "keep.md": "k\n" });
    symlinkSync("target", join(root, "s"));
    commitAll(root, "one");
    rmSync(join(root, "s"));
    writeFiles(root, { "s/inside.md": "now a real directory\n" });
    rmSync(join(root, "plain"));
    writeFiles(root, { "plain/inner.md": "now a directory too\n" });
    const src = { root, status: statusSummary(root), refs: repoRefs(root) };
    expect(src.status).toEqual({ s: "deleted", "s/inside.md": "new", plain: "deleted", "plain/inner.md": "new" });
    const { out, layer } = await snap(base);
    expect(layer.meta!.worktree).toMatchObject({ deleted: 2, untracked: 2 });
    expectSameRepo(await restore(out), src);
  });
});

describe("git source: deep verify", () => {
  let good: Buffer;
  let goodIso: Buffer;
  beforeAll(async () => {
    if (!haveGit) return;
    const base = tempDir("memsnap-git-dv-");
    const root = initRepo(join(base, "memdir"));
    for (let i = 0; i < 5; i++) {
      writeFiles(root, { [`n${i}.md`]: `note ${i}\n`.repeat(200) });
      commitAll(root, `c${i}`);
    }
    git(root, ["tag", "-a", "t", "-m", "tag"]);
    good = readFileSync(join((await captureDirect(root)).dir, "repo.bundle"));
    goodIso = readFileSync(join((await withImpl("isomorphic", () => captureDirect(root))).dir, "repo.bundle"));
  });

  const dv = (bytes: Buffer, path = "mem/repo.bundle"): Promise<string | null> =>
    gitSource.deepVerify!({ entry: { path, layer: "mem" }, bytes: Readable.from([bytes]) });

  const damaged = (b: Buffer): Buffer => {
    const c = Buffer.from(b);
    const at = c.indexOf("PACK") + Math.floor((c.length - c.indexOf("PACK")) / 2);
    c[at] = c[at]! ^ 0x55;
    return c;
  };

  for (const impl of ["git", "isomorphic"] as const) {
    itGit(`accepts good bundles and names the artifact for damaged ones (${impl})`, async () => {
      await withImpl(impl, async () => {
        expect(await dv(good)).toBeNull();
        expect(await dv(goodIso)).toBeNull();
        for (const bad of [damaged(good), damaged(goodIso), good.subarray(0, good.length - 7), Buffer.from("# v2 git bundle\nnot an oid HEAD\n\nPACK"), Buffer.from("hello")]) {
          const msg = await dv(bad);
          expect(msg, bad.subarray(0, 40).toString("latin1")).toMatch(/^mem\/repo\.bundle: not a valid git bundle: /);
        }
      });
    });
  }

  it("checks worktree-deleted.json and ignores work-tree files", async () => {
    const doc = (o: unknown): Buffer => Buffer.from(JSON.stringify(o));
    const ok = { format: "memsnap-git-worktree", version: 1, deleted: ["a.md"], executable: [] };
    expect(await dv(doc(ok), "mem/worktree-deleted.json")).toBeNull();
    expect(await dv(Buffer.from("{not json"), "mem/worktree-deleted.json")).toMatch(/^mem\/worktree-deleted\.json: not valid JSON/);
    expect(await dv(doc({ ...ok, deleted: ["../../etc/passwd"] }), "mem/worktree-deleted.json")).toMatch(/unsafe path/);
    expect(await dv(doc({ ...ok, deleted: [".git/config"] }), "mem/worktree-deleted.json")).toMatch(/unsafe path/);
    expect(await dv(Buffer.from("anything"), "mem/worktree/notes.md")).toBeNull();
  });

  itGit("verify --deep reports a snapshot whose repo.bundle is damaged though its index hash matches", async () => {
    const base = tempDir("memsnap-git-dv2-");
    const root = initRepo(join(base, "memdir"));
    writeFiles(root, { "a.md": "a\n".repeat(1000) });
    commitAll(root, "one");
    const { out } = await snap(base);
    expect((await verifyBundle(out, { deep: true })).findings).toEqual([]);
    // A snapshot whose git layer carries damaged bundle bytes, hashed as they are: every
    // artifact check passes, only the deep check can tell.
    const { dir } = await captureDirect(root);
    const bad = damaged(readFileSync(join(dir, "repo.bundle")));
    const config = parseConfig({ agent: "scribe", sources: [{ kind: "git", name: LAYER, path: "memdir" }] }, null, base);
    const src = config.sources[0]!;
    config.sources[0] = {
      cfg: src.cfg,
      impl: {
        ...src.impl,
        capture: async () => ({
          artifacts: (async function* () {
            yield { path: "repo.bundle", kind: "git-bundle", size: bad.length, mode: 0o600, mtime: new Date(), open: () => Readable.from([bad]) };
          })(),
        }),
      },
    };
    const evil = join(tempDir("memsnap-git-dv3-"), "bad.memsnap");
    await snapshot({ config, out: evil });
    const shallow = await verifyBundle(evil);
    expect(shallow.ok).toBe(true);
    const deep = await verifyBundle(evil, { deep: true });
    expect(deep.ok).toBe(false);
    expect(deep.findings).toEqual([expect.objectContaining({ code: "MEMSNAP_DEEP_VERIFY_FAILED", path: "mem/repo.bundle" })]);
    expect(deep.findings[0]!.message).toMatch(/^mem\/repo\.bundle: not a valid git bundle/);
  });
});

describe("git source: restore refuses hostile layers", () => {
  async function layerDir(files: Record<string, string>): Promise<string> {
    const d = join(tempDir("memsnap-git-hostile-"), "mem");
    mkdirSync(d, { recursive: true });
    writeFiles(d, files);
    return d;
  }
  const layer = (meta: Record<string, unknown>): LayerEntry => ({ name: "mem", kind: "git", schema_version: 1, artifacts: 0, bytes: 0, meta });
  const emptyMeta = { head: null, branch: "main", detached: false };
  const doc = (o: Record<string, unknown> = {}): string => JSON.stringify({ format: "memsnap-git-worktree", version: 1, deleted: [], executable: [], ...o });

  itGit("a .git path under worktree/, a stray top-level entry, an unsafe deletion", async () => {
    await expectCode(gitSource.materialize!(await layerDir({ "worktree/.git/config": "[core]\n\thooksPath = /tmp\n" }), layer(emptyMeta)), "MEMSNAP_UNSAFE_PATH", /\.git/);
    await expectCode(gitSource.materialize!(await layerDir({ "worktree/sub/.GIT/hooks/x": "x" }), layer(emptyMeta)), "MEMSNAP_UNSAFE_PATH");
    await expectCode(gitSource.materialize!(await layerDir({ ".git/config": "x" }), layer(emptyMeta)), "MEMSNAP_UNSAFE_PATH", /not an artifact/);
    await expectCode(gitSource.materialize!(await layerDir({ "worktree-deleted.json": doc({ deleted: ["../outside"] }) }), layer(emptyMeta)), "MEMSNAP_UNSAFE_PATH", /unsafe path/);
    await expectCode(gitSource.materialize!(await layerDir({ "worktree-deleted.json": doc({ deleted: [".git/config"] }) }), layer(emptyMeta)), "MEMSNAP_UNSAFE_PATH", /'\.git' segment/);
    await expectCode(gitSource.materialize!(await layerDir({ "worktree-deleted.json": doc({ executable: ["/etc/passwd"] }) }), layer(emptyMeta)), "MEMSNAP_UNSAFE_PATH", /absolute path/);
    await expectCode(gitSource.materialize!(await layerDir({ "worktree-deleted.json": "{not json" }), layer(emptyMeta)), "MEMSNAP_DEEP_VERIFY_FAILED", /not valid JSON/);
    await expectCode(gitSource.materialize!(await layerDir({}), layer({ head: { oid: "nothex" }, branch: "main" })), "MEMSNAP_MANIFEST_CORRUPT");
    await expectCode(gitSource.materialize!(await layerDir({}), layer({ head: { oid: "a".repeat(40) }, branch: "main", detached: false })), "MEMSNAP_INDEX_MISMATCH");
  });

  itGit("never writes or deletes through a tracked symlink", async () => {
    const base = tempDir("memsnap-git-symlink-");
    const outside = join(base, "outside");
    writeFiles(outside, { "victim.txt": "keep me\n" });
    const root = initRepo(join(base, "memdir"));
    writeFiles(root, { "a.md": "a\n" });
    symlinkSync(outside, join(root, "link"));
    commitAll(root, "one");
    const { dir } = await captureDirect(root);
    const { meta } = await captureDirect(root);
    const l = layer(meta);
    const copy = async (extra: Record<string, string>): Promise<string> => {
      const d = await layerDir(extra);
      writeFileSync(join(d, "repo.bundle"), readFileSync(join(dir, "repo.bundle")));
      return d;
    };
    // The tracked link is checked out as a plain file (core.symlinks=false): a file under it
    // conflicts with that file, and a deletion under it names nothing.
    await expectCode(gitSource.materialize!(await copy({ "worktree/link/evil.txt": "x" }), l), "MEMSNAP_UNSAFE_PATH", /conflicts with the file/);
    const d = await copy({ "worktree-deleted.json": doc({ deleted: ["link/victim.txt"] }) });
    await gitSource.materialize!(d, l);
    expect(lstatSync(join(d, "link")).isFile()).toBe(true);
    expect(readFileSync(join(outside, "victim.txt"), "utf8")).toBe("keep me\n");
    expect(existsSync(join(outside, "evil.txt"))).toBe(false);
  });
});

describe("git source: redaction of history", () => {
  interface Hist { base: string; root: string }
  let hist: Hist;
  const secret = "SECRET_ABCDEFGHIJKLMNOP";
  beforeAll(() => {
    if (!haveGit) return;
    const base = tempDir("memsnap-git-secret-");
    const root = initRepo(join(base, "memdir"));
    writeFiles(root, { "MEMORY.md": `api key ${secret}\n`, "bin.dat": Buffer.concat([Buffer.from([0]), Buffer.from(secret)]) });
    commitAll(root, "oops");
    writeFiles(root, { "big.txt": Buffer.concat([Buffer.alloc(17 * 1024 * 1024, 0x61), Buffer.from(` ${secret}\n`)]) });
    commitAll(root, "big");
    writeFiles(root, { "MEMORY.md": "clean now\n" });
    commitAll(root, `remove the key ${secret.replace("SECRET_", "SECRET_X")}`);
    writeFiles(root, { "inbox.md": `untracked with ${secret}\n` });
    hist = { base, root };
  });

  itGit("a secret in history refuses a plaintext bundle with MEMSNAP_UNREDACTED_SECRETS", async () => {
    redactState.on = true;
    const e = await expectCode(snap(hist.base), "MEMSNAP_UNREDACTED_SECRETS", /mem\/repo\.bundle/);
    expect(e.message).not.toContain(secret);
  });

  itGit("--allow-unredacted writes it and records the findings; the work-tree copy is redacted", async () => {
    redactState.on = true;
    const { manifest, layer, out } = await snap(hist.base, { allowUnredacted: true });
    const rep = manifest.redaction as unknown as RedactionReport;
    // One in the first MEMORY.md blob; the commit subject's; the binary and the > 16 MiB blob are skipped.
    expect(rep.unredacted["mem/repo.bundle"]).toEqual({ "stub-secret": 2 });
    expect(rep.redacted["mem/worktree/inbox.md"]).toEqual({ "stub-secret": 1 });
    expect(rep.redacted["manifest.json"]).toEqual({ "stub-secret": 1 });
    expect(layer.meta!.history_scan).toMatchObject({ skipped_binary: 1, skipped_large: 1, candidates: 2 });
    expect((layer.meta!.head as { subject: string }).subject).toBe("remove the key [REDACTED:stub-secret]");
    const restored = await restore(out);
    expect(readFileSync(join(restored, "inbox.md"), "utf8")).toBe("untracked with [REDACTED:stub-secret]\n");
  });

  itGit("an encrypted bundle is written and the report records the history findings", async () => {
    redactState.on = true;
    const { manifest, out } = await snap(hist.base, { passphrase: "correct horse" });
    const rep = manifest.redaction as unknown as RedactionReport;
    expect(rep.total_unredacted).toBe(2);
    expect(rep.unredacted["mem/repo.bundle"]).toEqual({ "stub-secret": 2 });
    expect(JSON.stringify(manifest)).not.toContain(secret);
    const restored = await restore(out, "correct horse");
    git(restored, ["fsck", "--full", "--no-progress"]);
    expect(git(restored, ["log", "--format=%s"]).trim().split("\n")).toHaveLength(3);
  });

  itGit("the scan counts what the bundle holds: from the object store when it holds just that, else by walking the refs", async () => {
    redactState.on = true;
    // A copy of the repository, so the objects added below do not reach the other tests.
    const root = join(tempDir("memsnap-git-unreach-"), "memdir");
    git(hist.base, ["clone", "-q", "--no-local", hist.root, root]);
    git(root, ["repack", "-a", "-d", "-q"]);
    const reachable = (): number => git(root, ["rev-list", "--objects", "--all"]).trim().split("\n").length;
    const inStore = (): number =>
      git(root, ["cat-file", "--batch-all-objects", "--batch-check"]).trim().split("\n").length;
    expect(inStore()).toBe(reachable());
    let r = stubRedactor();
    let { meta } = await captureDirect(root, r);
    expect((meta.history_scan as { objects: number }).objects).toBe(reachable());
    expect(r.report().unredacted["mem/repo.bundle"]).toEqual({ "stub-secret": 2 });
    // An object no ref reaches (a blob written but never committed) is in the store, not in the
    // bundle: its secret must not be reported, and the count is still the bundle's.
    git(root, ["hash-object", "-w", "--stdin"], { input: `dangling ${secret}\n` });
    expect(inStore()).toBe(reachable() + 1);
    r = stubRedactor();
    ({ meta } = await captureDirect(root, r));
    expect((meta.history_scan as { objects: number }).objects).toBe(reachable());
    expect(r.report().unredacted["mem/repo.bundle"]).toEqual({ "stub-secret": 2 });
  });

  itGit("the isomorphic-git scan finds the same", async () => {
    redactState.on = true;
    const r = stubRedactor();
    const { meta } = await withImpl("isomorphic", () => captureDirect(hist.root, r));
    expect(r.report().unredacted["mem/repo.bundle"]).toEqual({ "stub-secret": 2 });
    expect(meta.history_scan).toMatchObject({ skipped_binary: 1, skipped_large: 1, candidates: 2 });
  });
});

describe.skipIf(!process.env.MEMSNAP_SLOW_TESTS)("git source: performance (MEMSNAP_SLOW_TESTS=1)", () => {
  itGit("20,000 files and 3,000 commits capture in a few seconds, with and without the history scan", async () => {
    // Its own directory, removed here: the shared afterAll should not have to delete 100k files.
    const base = mkdtempSync(join(tmpdir(), "memsnap-git-perf-"));
    try {
      const root = join(base, "memdir");
      let t = performance.now();
      fastImportRepo(root, { files: 20_000, commits: 3_000 });
      const buildMs = performance.now() - t;
      for (let i = 0; i < 100; i++) writeFiles(root, { [`notes/d0001/n${String(100 + i).padStart(6, "0")}.md`]: `edited ${i}\n`, [`inbox/u${i}.md`]: `untracked ${i}\n` });
      const regexStub = (): Redactor => ({ ...stubRedactor(), candidate: (s) => /SECRET_|AKIA|ghp_|-----BEGIN/.test(s) });
      const runs = { plain: [] as number[], scanned: [] as number[] };
      for (let i = 0; i < 3; i++) {
        for (const kind of ["plain", "scanned"] as const) {
          const t0 = performance.now();
          const { meta } = await captureDirect(root, kind === "scanned" ? regexStub() : undefined);
          runs[kind].push(performance.now() - t0);
          if (i === 0) console.log(`[git perf] ${kind}:`, JSON.stringify({ worktree: meta.worktree, history_scan: meta.history_scan }));
        }
      }
      const min = (xs: number[]): number => Math.min(...xs);
      const med = (xs: number[]): number => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;
      t = performance.now();
      redactState.on = true;
      const config = parseConfig({ agent: "scribe", sources: [{ kind: "git", name: LAYER, path: "memdir" }] }, null, base);
      const out = join(base, "s.memsnap");
      await snapshot({ config, out, allowUnredacted: true });
      const snapMs = performance.now() - t;
      t = performance.now();
      await restoreToDir(out, join(base, "restored"));
      const restoreMs = performance.now() - t;
      console.log(`[git perf] load ${loadavg()[0]!.toFixed(1)} on ${cpus().length} CPUs; fixture build ${buildMs.toFixed(0)} ms`);
      console.log(`[git perf] capture without history scan: min ${min(runs.plain).toFixed(0)} ms, median ${med(runs.plain).toFixed(0)} ms`);
      console.log(`[git perf] capture with history scan:    min ${min(runs.scanned).toFixed(0)} ms, median ${med(runs.scanned).toFixed(0)} ms`);
      console.log(`[git perf] full snapshot (redaction on) ${snapMs.toFixed(0)} ms; restore --to ${restoreMs.toFixed(0)} ms`);
      expect(min(runs.plain)).toBeLessThan(10_000);
      expect(min(runs.scanned)).toBeLessThan(15_000);
    } finally {
      rmSync(base, { recursive: true, force: true });
    }
  }, 600_000);
});
