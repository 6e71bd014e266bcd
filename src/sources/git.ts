/**
 * The `git` source: a memory directory that is a git repository.
 *
 * Artifacts of a layer:
 *   repo.bundle            kind `git-bundle`: a standard git bundle of every ref (and HEAD);
 *                          absent when the repository has no commit yet
 *   worktree-deleted.json  kind `json`: tracked paths missing from the work tree, and which
 *                          captured work-tree files are executable (see WorktreeDoc)
 *   worktree/<path>        kind `file`, text: modified, added and untracked files (ignored
 *                          files are not captured), byte for byte before redaction
 *
 * `.git/config`, hooks, the index, reflogs and lock files are never captured: the bundle
 * carries objects and refs only, and restore builds a fresh `.git` (in place, it then keeps
 * the live repository's own config, hooks/ and info/: keepLiveRepoFiles). A symlink of the
 * checked-out tree is written as a plain file holding its target, with core.symlinks=false:
 * restore creates no link a bundle asks for (materialize returns a note saying so).
 *
 * Every git command runs with execFile/spawn (never a shell) and an environment that drops
 * inherited GIT_* variables, ignores the system config, and overrides config a memdir could
 * use to run commands (core.hooksPath=/dev/null, core.fsmonitor=false, every filter driver's
 * clean/smudge/process emptied) through GIT_CONFIG_COUNT, which also handles key names `-c`
 * cannot. Without a git binary (or with MEMSNAP_GIT_IMPL=isomorphic) isomorphic-git does
 * the work (src/sources/git-iso.ts).
 *
 * With redaction on, history cannot be rewritten, so every blob, commit message and tag
 * message reachable from the bundle's refs is scanned (streaming: rev-list → cat-file
 * --batch-check → cat-file --batch, one object in memory at a time, binary blobs and blobs
 * over 16 MiB skipped) and findings are recorded as unredacted against `<layer>/repo.bundle`.
 */
import { execFile, spawn, type ChildProcessWithoutNullStreams } from "node:child_process";
import { createHash } from "node:crypto";
import { accessSync, constants, createReadStream, promises as fsPromises, createWriteStream, lstatSync, statSync, type Stats } from "node:fs";
import { chmod, cp, lstat, mkdir, mkdtemp, readdir, readFile, rename, rm, rmdir, stat, unlink, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { basename, delimiter, dirname, join, resolve } from "node:path";
import { Readable } from "node:stream";
import { pipeline } from "node:stream/promises";
import { MemsnapError, destinationError } from "../errors.js";
import type { LayerEntry } from "../format/manifest.js";
import type { Redactor } from "../redact/types.js";
import { optBool, rejectUnknownKeys, reqString } from "../util/config-check.js";
import {
  commitFacts, emptyScan, isoMaterialize, loadIsoGit, isoRepoFacts, isoScanObjects, isoStatus, isoVerifyBundle, isoWriteBundle,
  parseWorktreeDoc, readBundleHeader, scanObject, SCAN_MAX_BYTES, worktreePathProblem,
  type BundleHeader, type HeadFacts, type HeadSpec, type HistoryScan, type StatusEntry, type WorktreeDoc,
} from "./git-iso.js";
import type { Artifact, CaptureContext, SourceKind } from "./types.js";
import { escapeName, fileArtifact, fingerprintOf, SMALL_FILE, sourceError, walkFiles, walkNotices, type FoundFile } from "./walk.js";
import { readAhead } from "./prefetch.js";
import { CompactStats } from "../util/native-fs.js";

export interface GitConfig {
  kind: "git";
  name: string;
  /** The repository's work tree (the directory holding `.git`). */
  path: string;
  /** Capture uncommitted and untracked files too (default true). */
  worktree: boolean;
}

export const BUNDLE_ARTIFACT = "repo.bundle";
export const WORKTREE_DOC_ARTIFACT = "worktree-deleted.json";
export const WORKTREE_DIR = "worktree";
const WORKTREE_DOC_MAX = 64 * 1024 * 1024;

// ------------------------------------------------------------------------------ which implementation

type Impl = "git" | "isomorphic-git";

let gitOnPath: boolean | undefined;

function hasGitBinary(): boolean {
  gitOnPath ??= (process.env.PATH ?? "").split(delimiter).filter(Boolean).some((d) => {
    try {
      const p = join(d, "git");
      accessSync(p, constants.X_OK);
      return statSync(p).isFile();
    } catch {
      return false;
    }
  });
  return gitOnPath;
}

/** `MEMSNAP_GIT_IMPL=git|isomorphic` forces an implementation; by default the git binary when on PATH. */
export function gitImpl(): Impl {
  const forced = process.env.MEMSNAP_GIT_IMPL;
  if (forced === undefined || forced === "" || forced === "auto") return hasGitBinary() ? "git" : "isomorphic-git";
  if (forced === "git") return "git";
  if (forced === "isomorphic" || forced === "isomorphic-git") return "isomorphic-git";
  throw new MemsnapError("MEMSNAP_USAGE", `MEMSNAP_GIT_IMPL must be "git" or "isomorphic", got ${JSON.stringify(forced)}`, {
    hint: "unset MEMSNAP_GIT_IMPL to use the git binary when it is installed",
  });
}

// ------------------------------------------------------------------------------ running git safely

/** Config every git command runs with (command scope: it overrides the repository's config). */
const SAFE_CONFIG: ReadonlyArray<[string, string]> = [
  ["core.hooksPath", "/dev/null"],
  ["core.fsmonitor", "false"],
  ["core.untrackedCache", "false"],
  ["core.pager", "cat"],
  ["core.splitIndex", "false"],
  ["gc.auto", "0"],
  ["maintenance.auto", "false"],
  ["fetch.recurseSubmodules", "false"],
  ["fetch.writeCommitGraph", "false"],
  ["submodule.recurse", "false"],
  ["status.submoduleSummary", "false"],
  ["log.showSignature", "false"],
  ["color.ui", "false"],
  ["advice.detachedHead", "false"],
  ["init.defaultBranch", "main"],
  ["protocol.allow", "never"],
  ["protocol.file.allow", "always"],
];

/** Inherited variables kept: the install's exec path and the user's own global config file. */
const KEEP_ENV = new Set(["GIT_EXEC_PATH", "GIT_CONFIG_GLOBAL"]);

function gitEnv(vars: Record<string, string> = {}, extraConfig: ReadonlyArray<[string, string]> = []): NodeJS.ProcessEnv {
  const env: NodeJS.ProcessEnv = {};
  for (const [k, v] of Object.entries(process.env)) if (!k.startsWith("GIT_") || KEEP_ENV.has(k)) env[k] = v;
  Object.assign(env, {
    GIT_CONFIG_NOSYSTEM: "1",
    GIT_TERMINAL_PROMPT: "0",
    GIT_OPTIONAL_LOCKS: "0",
    GIT_NO_REPLACE_OBJECTS: "1",
    GIT_NO_LAZY_FETCH: "1",
    GIT_PROTOCOL_FROM_USER: "0",
  }, vars);
  const cfg = [...SAFE_CONFIG, ...extraConfig];
  env.GIT_CONFIG_COUNT = String(cfg.length);
  cfg.forEach(([k, v], i) => {
    env[`GIT_CONFIG_KEY_${i}`] = k;
    env[`GIT_CONFIG_VALUE_${i}`] = v;
  });
  return env;
}

interface GitCtx {
  cwd: string;
  env: NodeJS.ProcessEnv;
  signal?: AbortSignal;
}

interface GitResult {
  code: number;
  stdout: Buffer;
  stderr: string;
}

/** Run git; resolves with its exit code and output (rejects only when it cannot be started). */
function runGit(args: string[], g: GitCtx): Promise<GitResult> {
  return new Promise((res, rej) => {
    execFile("git", args, {
      cwd: g.cwd, env: g.env, encoding: "buffer", maxBuffer: 1 << 30, windowsHide: true,
      ...(g.signal ? { signal: g.signal } : {}),
    }, (err, stdout, stderr) => {
      const code = (err as NodeJS.ErrnoException & { code?: unknown } | null)?.code;
      if (err && typeof code !== "number") {
        rej(err);
        return;
      }
      res({ code: typeof code === "number" ? code : 0, stdout, stderr: stderr.toString("utf8") });
    });
  });
}

function said(stderr: string): string {
  const s = stderr.trim().split("\n").filter((l) => !/^(hint|warning): /.test(l)).join("; ");
  return s.length > 800 ? `${s.slice(0, 800)}…` : s || "no message";
}

function sourceInvalid(root: string, msg: string, hint = "check the repository with 'git fsck --full' in it"): MemsnapError {
  return new MemsnapError("MEMSNAP_SOURCE_INVALID", msg, { path: root, hint });
}

/** Run git in the source repository; a non-zero exit is MEMSNAP_SOURCE_INVALID with what git said. */
async function gitIn(root: string, g: GitCtx, args: string[], ok: number[] = [0]): Promise<GitResult> {
  let r: GitResult;
  try {
    r = await runGit(args, g);
  } catch (e) {
    g.signal?.throwIfAborted();
    throw new MemsnapError("MEMSNAP_SOURCE_UNREADABLE", `cannot run git for ${root}: ${(e as Error).message}`, {
      path: root, cause: e, hint: "check that git is installed and runnable, or set MEMSNAP_GIT_IMPL=isomorphic",
    });
  }
  if (!ok.includes(r.code)) throw sourceInvalid(root, `git ${args[0]} failed in ${root}: ${said(r.stderr)}`);
  return r;
}

/** Config overrides that empty every filter driver the repository (or the user) defines. */
async function neutralizeFilters(root: string, g: GitCtx): Promise<Array<[string, string]>> {
  const r = await gitIn(root, g, ["config", "-z", "--name-only", "--get-regexp", "^filter\\."], [0, 1]);
  const drivers = new Set<string>();
  for (const key of r.stdout.toString("utf8").split("\0")) {
    const m = /^filter\.(.+)\.[^.]+$/s.exec(key.trim());
    if (m) drivers.add(m[1]!);
  }
  const out: Array<[string, string]> = [];
  for (const d of drivers) {
    out.push([`filter.${d}.clean`, ""], [`filter.${d}.smudge`, ""], [`filter.${d}.process`, ""], [`filter.${d}.required`, "false"]);
  }
  return out;
}

// ------------------------------------------------------------------------------ the repository on disk

interface RepoPaths {
  /** `<root>/.git` (a directory, or a `gitdir:` file). */
  dotgit: string;
  /** The git directory (per-worktree). */
  gitdir: string;
  /** The common directory (objects, refs, shallow). */
  commondir: string;
}

const exists = (p: string): Promise<boolean> => lstat(p).then(() => true, () => false);

async function findRepo(root: string): Promise<RepoPaths> {
  let st: Stats;
  try {
    st = await stat(root);
  } catch (e) {
    throw sourceError(e, root);
  }
  if (!st.isDirectory()) throw sourceInvalid(root, `${root} is not a directory; a git source needs a repository's work tree`, "point the source's path at the directory that holds .git");
  const dotgit = join(root, ".git");
  let gst: Stats;
  try {
    gst = await lstat(dotgit);
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code === "ENOENT") {
      throw sourceInvalid(root, `${root} is not a git repository (it has no .git)`, "point the source's path at a repository's top directory, or use a files source");
    }
    throw sourceError(e, dotgit);
  }
  let gitdir = dotgit;
  if (gst.isFile()) {
    const m = /^gitdir: (.+)$/m.exec(await readFile(dotgit, "utf8").catch((e: unknown) => { throw sourceError(e, dotgit); }));
    if (!m) throw sourceInvalid(root, `${dotgit} is neither a directory nor a "gitdir:" file`);
    gitdir = resolve(root, m[1]!.trim());
  } else if (!gst.isDirectory()) {
    throw sourceInvalid(root, `${dotgit} is not a directory`);
  }
  let commondir = gitdir;
  const cd = await readFile(join(gitdir, "commondir"), "utf8").catch(() => null);
  if (cd !== null) commondir = resolve(gitdir, cd.trim());
  return { dotgit, gitdir, commondir };
}

/** In-progress operations and locks, recorded in the layer meta. */
async function stateFlags(p: RepoPaths): Promise<Record<string, boolean>> {
  const has = (rel: string, dir = p.gitdir): Promise<boolean> => exists(join(dir, rel));
  const applying = await has("rebase-apply/applying");
  return {
    rebase: (await has("rebase-merge")) || ((await has("rebase-apply")) && !applying),
    am: applying,
    merge: await has("MERGE_HEAD"),
    cherry_pick: await has("CHERRY_PICK_HEAD"),
    revert: await has("REVERT_HEAD"),
    bisect: await has("BISECT_LOG"),
    index_lock: await has("index.lock"),
    head_lock: await has("HEAD.lock"),
  };
}

// ------------------------------------------------------------------------------ work tree listing

interface WorktreeListing {
  files: FoundFile[];
  deleted: string[];
  counts: { modified: number; untracked: number; deleted: number };
  skipped: { symlinks: number; directories: number; special: number; unsafe_names: number };
  method: "status" | "compare" | "isomorphic-git";
  /** Changed paths left out because their names are not UTF-8 (escaped as `\xNN`), for the capture's notices. */
  unsafe: string[];
}

/** The NUL-terminated records of git's `-z` output, each as text, or `bad` (escaped) when it is not UTF-8. */
function zRecords(out: Buffer): Array<{ text: string; bad?: string }> {
  const recs: Array<{ text: string; bad?: string }> = [];
  let at = 0;
  while (at < out.length) {
    let end = out.indexOf(0, at);
    if (end < 0) end = out.length;
    const raw = out.subarray(at, end);
    const text = raw.toString("utf8");
    recs.push(Buffer.from(text, "utf8").equals(raw) ? { text } : { text, bad: escapeName(raw) });
    at = end + 1;
  }
  return recs;
}

/** Turn status entries into captured files (lstat now) and deleted paths. */
async function classify(
  root: string, entries: Array<{ path: string; tracked: boolean }>, method: WorktreeListing["method"], unsafe: string[] = [],
): Promise<WorktreeListing> {
  const out: WorktreeListing = {
    files: [], deleted: [], counts: { modified: 0, untracked: 0, deleted: 0 },
    skipped: { symlinks: 0, directories: 0, special: 0, unsafe_names: unsafe.length }, method, unsafe,
  };
  const seen = new Set<string>();
  const todo: Array<{ path: string; tracked: boolean; abs: string }> = [];
  for (const { path: raw, tracked } of entries) {
    const path = raw.endsWith("/") ? raw.slice(0, -1) : raw;
    if (seen.has(path)) continue;
    seen.add(path);
    if (worktreePathProblem(path)) out.skipped.unsafe_names++;
    else todo.push({ path, tracked, abs: join(root, ...path.split("/")) });
  }
  // A fresh memdir can have tens of thousands of untracked files: synchronous lstats (20,000
  // notes: ~40 ms, where parallel batches of awaited ones were several times that), yielding to
  // the event loop between batches, and only what memsnap uses of each stat kept (CompactStats).
  for (let i = 0; i < todo.length; i += 256) {
    const batch = todo.slice(i, i + 256);
    if (i > 0) await new Promise<void>((r) => setImmediate(r));
    const stats = batch.map(({ abs }) => {
      try {
        return lstatSync(abs);
      } catch (e) {
        if ((e as NodeJS.ErrnoException).code !== "ENOENT" && (e as NodeJS.ErrnoException).code !== "ENOTDIR") throw sourceError(e, abs);
        return null;
      }
    });
    batch.forEach(({ path, tracked, abs }, j) => {
      const st = stats[j];
      if (!st || (st.isDirectory() && tracked)) {
        // Gone, or a tracked file/symlink replaced by a directory (whose files are listed on their own).
        if (tracked) {
          out.deleted.push(path);
          out.counts.deleted++;
        }
      } else if (st.isFile()) {
        out.files.push({ abs, rel: path, stats: CompactStats.of(st) });
        if (tracked) out.counts.modified++;
        else out.counts.untracked++;
      } else if (st.isSymbolicLink()) out.skipped.symlinks++;
      else if (st.isDirectory()) out.skipped.directories++; // a nested repository
      else out.skipped.special++;
    });
  }
  const byBytes = (a: string, b: string): number => Buffer.compare(Buffer.from(a), Buffer.from(b));
  out.files.sort((a, b) => byBytes(a.rel, b.rel));
  out.deleted.sort(byBytes);
  return out;
}

/** `git status` (no optional locks, so a held index.lock does not stop it); falls back to comparing with HEAD. */
async function listWorktreeGit(root: string, g: GitCtx, hasHead: boolean): Promise<WorktreeListing> {
  const r = await runGit(["status", "--porcelain=v1", "-z", "--untracked-files=all", "--no-renames", "--ignore-submodules=all"], g)
    .catch((e: unknown) => {
      throw new MemsnapError("MEMSNAP_SOURCE_UNREADABLE", `cannot run git for ${root}: ${(e as Error).message}`, { path: root, cause: e, hint: "check that git is installed" });
    });
  if (r.code === 0) {
    const entries: Array<{ path: string; tracked: boolean }> = [];
    const unsafe: string[] = [];
    for (const { text: rec, bad } of zRecords(r.stdout)) {
      if (rec.length < 4) continue;
      const x = rec[0]!;
      if (x === "!") continue;
      // A name that is not UTF-8: decoded, it names another file or none (a modified file would
      // be taken for deleted). Left out and reported.
      if (bad !== undefined) unsafe.push(bad.slice(3));
      else entries.push({ path: rec.slice(3), tracked: x !== "?" && x !== "A" });
    }
    return classify(root, entries, "status", unsafe);
  }
  // The index is unreadable (corrupt, or a half-written one): compare the work tree with HEAD directly.
  const tracked = new Map<string, string>();
  const gitlinks: string[] = [];
  if (hasHead) {
    const t = await gitIn(root, g, ["ls-tree", "-r", "-z", "--full-tree", "HEAD"]);
    for (const { text: rec, bad } of zRecords(t.stdout)) {
      if (bad !== undefined) continue; // its file, if still there, is among the walk's unsafe names
      const m = /^(\d+) (\w+) ([0-9a-f]+)\t(.*)$/s.exec(rec);
      if (!m) continue;
      if (m[2] === "commit") gitlinks.push(m[4]!);
      else tracked.set(m[4]!, m[3]!);
    }
  }
  const { files, unsafe } = await walkFiles(root, { exclude: ["/.git", ...gitlinks.map((p) => `/${p}/`)] });
  const present = new Set(files.map((f) => f.rel));
  const entries: Array<{ path: string; tracked: boolean }> = [];
  const both = files.filter((f) => tracked.has(f.rel)).map((f) => f.rel);
  if (both.length) {
    // Content hashes without filters (filters could run commands), against HEAD's blobs.
    const ours = (await gitStdin(root, g, ["hash-object", "--no-filters", "--stdin-paths"], both.join("\n") + "\n", [0]))
      .toString("utf8").trim().split("\n");
    both.forEach((p, i) => {
      if (ours[i] !== tracked.get(p)) entries.push({ path: p, tracked: true });
    });
  }
  for (const p of tracked.keys()) if (!present.has(p)) entries.push({ path: p, tracked: true });
  const fresh = files.filter((f) => !tracked.has(f.rel)).map((f) => f.rel);
  const ignored = fresh.length
    ? new Set((await gitStdin(root, g, ["check-ignore", "--no-index", "-z", "--stdin"], fresh.join("\0") + "\0", [0, 1]))
      .toString("utf8").split("\0").filter(Boolean))
    : new Set<string>();
  for (const p of fresh) if (!ignored.has(p)) entries.push({ path: p, tracked: false });
  return classify(root, entries, "compare", unsafe ?? []);
}

/** Run git with `input` on stdin; a non-zero exit outside `ok` is MEMSNAP_SOURCE_INVALID. */
function gitStdin(root: string, g: GitCtx, args: string[], input: string, ok: number[]): Promise<Buffer> {
  return new Promise((res, rej) => {
    const child = spawn("git", args, { cwd: g.cwd, env: g.env, stdio: ["pipe", "pipe", "pipe"], windowsHide: true });
    const out: Buffer[] = [];
    let err = "";
    child.stdout.on("data", (b: Buffer) => out.push(b));
    child.stderr.on("data", (b: Buffer) => { err += b.toString("utf8"); });
    child.stdin.on("error", () => undefined);
    child.on("error", (e) => rej(new MemsnapError("MEMSNAP_SOURCE_UNREADABLE", `cannot run git for ${root}: ${e.message}`, { path: root, cause: e, hint: "check that git is installed" })));
    child.on("close", (code) => {
      if (code === null || !ok.includes(code)) rej(sourceInvalid(root, `git ${args[0]} failed in ${root}: ${said(err)}`));
      else res(Buffer.concat(out));
    });
    child.stdin.end(input);
  });
}

// ------------------------------------------------------------------------------ history scan (git binary)

interface Spawned {
  child: ChildProcessWithoutNullStreams;
  done: Promise<void>;
}

function spawnGit(root: string, g: GitCtx, args: string[], children: Set<ChildProcessWithoutNullStreams>): Spawned {
  const child = spawn("git", args, { cwd: g.cwd, env: g.env, stdio: ["pipe", "pipe", "pipe"], windowsHide: true });
  children.add(child);
  let err = "";
  child.stderr.on("data", (b: Buffer) => {
    if (err.length < 64 * 1024) err += b.toString("utf8");
  });
  child.stdin.on("error", () => undefined); // a child that exits early; its exit code tells
  const done = new Promise<void>((res, rej) => {
    child.on("error", (e) => rej(new MemsnapError("MEMSNAP_SOURCE_UNREADABLE", `cannot run git for ${root}: ${e.message}`, { path: root, cause: e, hint: "check that git is installed" })));
    child.on("close", (code, signal) => {
      children.delete(child);
      if (code === 0) res();
      else rej(sourceInvalid(root, `git ${args[0]} failed in ${root}: ${signal ? `killed by ${signal}` : said(err)}`));
    });
  });
  done.catch(() => undefined);
  return { child, done };
}

/**
 * Scan every blob, commit message and tag message reachable from `revs` (rev-list arguments:
 * tips, and `^oid` exclusions):
 *   rev-list --objects --stdin │ cat-file --batch-check │ (node: pick blobs ≤ 16 MiB, commits, tags) │ cat-file --batch │ scan
 * Backpressure flows end to end, so memory holds one object (≤ 16 MiB) plus pipe buffers.
 */
async function scanHistoryGit(
  root: string, g: GitCtx, revs: string[], redactor: Redactor, artifact: string, children: Set<ChildProcessWithoutNullStreams>,
): Promise<HistoryScan> {
  const st = emptyScan();
  const revList = spawnGit(root, g, ["rev-list", "--objects", "--no-object-names", "--stdin"], children);
  const check = spawnGit(root, g, ["cat-file", "--batch-check=%(objectname) %(objecttype) %(objectsize)", "--buffer"], children);
  const batch = spawnGit(root, g, ["cat-file", "--batch", "--buffer"], children);
  const all = [revList, check, batch];
  revList.child.stdin.end(`${[...new Set(revs)].join("\n")}\n`);
  revList.child.stdout.pipe(check.child.stdin);
  const stdin = batch.child.stdin;
  const writable = (): Promise<void> => new Promise((res) => {
    const done = (): void => {
      stdin.off("drain", done);
      stdin.off("close", done);
      res();
    };
    stdin.on("drain", done);
    stdin.on("close", done);
  });
  const feeder = async (): Promise<void> => {
    let rest = "";
    for await (const chunk of check.child.stdout as AsyncIterable<Buffer>) {
      const lines = (rest + chunk.toString("latin1")).split("\n");
      rest = lines.pop() ?? "";
      let out = "";
      for (const line of lines) {
        const [oid, type, size] = line.split(" ");
        if (type === "missing") throw sourceInvalid(root, `git object ${oid} is missing from ${root} (the repository is damaged)`);
        st.objects++;
        if (type === "blob") {
          if (Number(size) > SCAN_MAX_BYTES) {
            st.skipped_large++;
            continue;
          }
        } else if (type !== "commit" && type !== "tag") {
          continue;
        }
        out += `${oid}\n`;
      }
      if (out && !stdin.write(out)) await writable();
    }
    stdin.end();
  };
  const reader = async (): Promise<void> => {
    let buf: Buffer = Buffer.alloc(0);
    let need = -1; // bytes of the current object's content + its trailing LF still to read
    let type = "";
    let parts: Buffer[] = [];
    for await (const chunk of batch.child.stdout as AsyncIterable<Buffer>) {
      buf = buf.length ? Buffer.concat([buf, chunk]) : chunk;
      for (;;) {
        if (need < 0) {
          const nl = buf.indexOf(10);
          if (nl < 0) break;
          const header = buf.toString("latin1", 0, nl).split(" ");
          buf = buf.subarray(nl + 1);
          if (header[1] === "missing" || header.length !== 3) {
            throw sourceInvalid(root, `git object ${header[0]} is missing from ${root} (the repository is damaged)`);
          }
          type = header[1]!;
          need = Number(header[2]) + 1;
          parts = [];
        }
        if (buf.length === 0) break;
        const take = Math.min(need, buf.length);
        parts.push(buf.subarray(0, take));
        buf = buf.subarray(take);
        need -= take;
        if (need > 0) break;
        need = -1;
        const data = Buffer.concat(parts);
        parts = [];
        await scanObject(type, data.subarray(0, data.length - 1), redactor, artifact, st);
      }
    }
    if (need >= 0) throw sourceInvalid(root, `git cat-file ended in the middle of an object in ${root}`);
  };
  try {
    await Promise.all([feeder(), reader(), ...all.map((s) => s.done)]);
  } catch (e) {
    for (const s of all) s.child.kill("SIGKILL");
    throw e;
  }
  return st;
}

// ------------------------------------------------------------------------------ capture

interface CaptureState {
  bundle: string | null;
  bundleSize: number;
  /** The bundle's incremental fingerprint (its refs), when there is a bundle. */
  bundleFingerprint?: string;
  /** An incremental snapshot references the last one's bundle: none was written now (`bundle` is null). */
  reused?: { bytes: number; scan: HistoryScan | null };
  listing: WorktreeListing | null;
  meta: Record<string, unknown>;
  scan: Promise<HistoryScan> | null;
}

/**
 * The incremental fingerprint of a repository's bundle: its refs (names and object ids), HEAD
 * and object format. A bundle holds exactly the objects reachable from its refs, and objects are
 * named by their content, so the last snapshot's bundle of the same refs is a bundle of this
 * repository as it is now: an incremental snapshot references it instead of writing and
 * scanning the history again (a commit, a new branch or a moved tag changes the fingerprint).
 */
export function refsFingerprint(impl: string, objectFormat: string, headRef: string | null, headOid: string | null, refs: readonly string[]): string {
  const h = createHash("sha256").update(`${impl}\n${objectFormat}\nHEAD ${headRef ?? "-"} ${headOid ?? "-"}\n`);
  for (const r of [...refs].sort()) h.update(`${r}\n`);
  return `git-refs:${h.digest("hex")}`;
}

/**
 * The last incremental snapshot's bundle, when one with this fingerprint will be referenced:
 * its size and history scan, from the layer meta of the bundle holding it. A meta without them
 * (written before memsnap recorded `bundle_bytes`), or without a scan where this snapshot
 * redacts, is not reused.
 */
function reusableBundle(ctx: CaptureContext | undefined, artifact: string, fingerprint: string, redacting: boolean): CaptureState["reused"] {
  const meta = ctx?.unchanged?.(artifact, fingerprint, "git-bundle");
  const bytes = meta?.bundle_bytes;
  if (typeof bytes !== "number" || !Number.isSafeInteger(bytes) || bytes <= 0) return undefined;
  const scan = meta?.history_scan;
  if (redacting && (scan === null || typeof scan !== "object")) return undefined;
  return { bytes, scan: redacting ? scan as HistoryScan : null };
}

function worktreeDoc(listing: WorktreeListing): WorktreeDoc {
  return {
    format: "memsnap-git-worktree",
    version: 1,
    deleted: listing.deleted,
    executable: listing.files.filter((f) => (f.stats.mode & 0o111) !== 0).map((f) => f.rel),
  };
}

function worktreeMeta(cfg: GitConfig, listing: WorktreeListing | null): Record<string, unknown> {
  if (!cfg.worktree || !listing) return { captured: false };
  return { captured: true, method: listing.method, ...listing.counts, skipped: listing.skipped };
}

async function captureGit(cfg: GitConfig, root: string, repo: RepoPaths, work: string, signal: AbortSignal | undefined,
  redactor: Redactor | undefined, children: Set<ChildProcessWithoutNullStreams>, ctx?: CaptureContext): Promise<CaptureState> {
  const base: GitCtx = { cwd: root, env: gitEnv({ GIT_DIR: repo.dotgit, GIT_WORK_TREE: root }), ...(signal ? { signal } : {}) };
  // First a plain call that fails cleanly on something that is not a usable repository.
  const fmt = (await gitIn(root, base, ["rev-parse", "--show-object-format"])).stdout.toString("utf8").trim() || "sha1";
  const [partial, sym, hv, refList, filters] = await Promise.all([
    gitIn(root, base, ["config", "--get", "extensions.partialclone"], [0, 1]),
    gitIn(root, base, ["symbolic-ref", "-q", "HEAD"], [0, 1]),
    gitIn(root, base, ["rev-parse", "-q", "--verify", "HEAD"], [0, 1]),
    gitIn(root, base, ["for-each-ref", "--format=%(objectname) %(refname)"]),
    neutralizeFilters(root, base),
  ]);
  if (partial.code === 0) {
    throw sourceInvalid(root, `${root} is a partial clone (objects are missing by design)`, "fetch every object first (git fetch --refetch, or clone without --filter), then snapshot again");
  }
  const headRef = sym.code === 0 ? sym.stdout.toString("utf8").trim() : null;
  const headOid = hv.code === 0 ? hv.stdout.toString("utf8").trim() : null;
  const refLines = refList.stdout.toString("utf8").split("\n").filter(Boolean);
  const refOids = refLines.map((l) => l.slice(0, l.indexOf(" ")));
  const g: GitCtx = { ...base, env: gitEnv({ GIT_DIR: repo.dotgit, GIT_WORK_TREE: root }, filters) };
  const artifact = `${cfg.name}/${BUNDLE_ARTIFACT}`;
  const bundleFingerprint = refOids.length > 0 || headOid ? refsFingerprint("git", fmt, headRef, headOid, refLines) : undefined;
  const reused = bundleFingerprint ? reusableBundle(ctx, artifact, bundleFingerprint, !!redactor) : undefined;
  const bundle = bundleFingerprint && !reused ? join(work, BUNDLE_ARTIFACT) : null;
  // The history scan starts now, from the refs as just read, alongside the bundle; should a
  // ref move before `git bundle create` reads it, the difference is scanned afterwards.
  const tips = [...new Set([...refOids, ...(headOid ? [headOid] : [])])];
  const scan0 = redactor && bundle ? scanHistoryGit(root, g, tips, redactor, artifact, children) : null;
  scan0?.catch(() => undefined);
  // The HEAD commit, the work-tree listing and the bundle are independent: run them at once.
  const [head, listing, header] = await Promise.all([
    headOid ? gitIn(root, base, ["cat-file", "commit", headOid]).then((r) => commitFacts(headOid, r.stdout)) : null,
    cfg.worktree ? listWorktreeGit(root, g, headOid !== null) : null,
    bundle ? (async (): Promise<BundleHeader> => {
      await gitIn(root, g, ["bundle", "create", "-q", bundle, "--all"]);
      const h = await readBundleHeader(bundle);
      if (typeof h === "string") throw sourceInvalid(root, `git bundle create wrote a bad bundle for ${root}: ${h}`);
      return h;
    })() : null,
  ]);
  const bundleSize = bundle ? (await stat(bundle)).size : 0;
  let scan: Promise<HistoryScan> | null = null;
  if (scan0 && redactor && header) {
    const moved = [...new Set(header.refs.map((r) => r.oid))].filter((o) => !tips.includes(o));
    scan = !moved.length ? scan0 : (async () => {
      const [a, b] = await Promise.all([scan0, scanHistoryGit(root, g, [...moved, ...tips.map((o) => `^${o}`)], redactor, artifact, children)]);
      return Object.fromEntries(Object.entries(a).map(([k, v]) => [k, v + b[k as keyof HistoryScan]])) as unknown as HistoryScan;
    })();
  }
  return {
    bundle, bundleSize, listing, scan, ...(bundleFingerprint ? { bundleFingerprint } : {}), ...(reused ? { reused } : {}),
    meta: {
      impl: "git", object_format: fmt,
      ...headMeta(head, headRef, headOid, header ? header.refs.filter((r) => r.name !== "HEAD").length : reused ? refLines.length : 0),
    },
  };
}

function headMeta(head: HeadFacts | null, headRef: string | null, headOid: string | null, refCount: number): Record<string, unknown> {
  return {
    empty: headOid === null && refCount === 0,
    bundle: headOid !== null || refCount > 0,
    head,
    branch: headRef === null ? null : headRef.startsWith("refs/heads/") ? headRef.slice(11) : headRef,
    detached: headRef === null,
    ref_count: refCount,
  };
}

async function captureIso(cfg: GitConfig, root: string, repo: RepoPaths, work: string, signal: AbortSignal | undefined,
  redactor: Redactor | undefined, ctx?: CaptureContext): Promise<CaptureState> {
  const wrap = async <T>(what: string, p: () => Promise<T>): Promise<T> => {
    try {
      return await p();
    } catch (e) {
      if (e instanceof MemsnapError) throw e;
      throw sourceInvalid(root, `isomorphic-git could not ${what} ${root}: ${(e as Error).message}`);
    }
  };
  const facts = await wrap("read", () => isoRepoFacts(repo.gitdir));
  const listing = cfg.worktree
    ? await classify(root, (await wrap("list the work tree of", () => isoStatus(root, repo.gitdir)))
      .map((s: StatusEntry) => ({ path: s.path, tracked: s.change !== "new" })), "isomorphic-git")
    : null;
  let bundle: string | null = null;
  let bundleSize = 0;
  let scan: Promise<HistoryScan> | null = null;
  const artifact = `${cfg.name}/${BUNDLE_ARTIFACT}`;
  const bundleFingerprint = facts.refs.length > 0 || facts.headOid
    ? refsFingerprint("isomorphic-git", "sha1", facts.headRef, facts.headOid, facts.refs.map((r) => `${r.oid} ${r.name}`))
    : undefined;
  const reused = bundleFingerprint ? reusableBundle(ctx, artifact, bundleFingerprint, !!redactor) : undefined;
  if (bundleFingerprint && !reused) {
    bundle = join(work, BUNDLE_ARTIFACT);
    const out = bundle;
    const objects = await wrap("bundle", () => isoWriteBundle(repo.gitdir, facts, out));
    bundleSize = (await stat(bundle)).size;
    if (redactor) {
      scan = wrap("scan the history of", () => isoScanObjects(repo.gitdir, objects, redactor, artifact, signal));
    }
  }
  return {
    bundle, bundleSize, listing, scan, ...(bundleFingerprint ? { bundleFingerprint } : {}), ...(reused ? { reused } : {}),
    meta: { impl: "isomorphic-git", object_format: "sha1", ...headMeta(facts.head, facts.headRef, facts.headOid, facts.refs.length) },
  };
}

// ------------------------------------------------------------------------------ restore

/** What HEAD should be, from the layer meta (checked: it is untrusted input). */
function headSpec(layer: LayerEntry): HeadSpec {
  const meta = layer.meta ?? {};
  const bad = (why: string): MemsnapError => new MemsnapError("MEMSNAP_MANIFEST_CORRUPT", `git layer ${layer.name}: ${why}`, {
    hint: "the manifest's layer meta is damaged; use another snapshot",
  });
  const head = meta.head as { oid?: unknown } | null | undefined;
  let oid: string | null = null;
  if (head !== null && head !== undefined) {
    if (typeof head.oid !== "string" || !/^[0-9a-f]{40}([0-9a-f]{24})?$/.test(head.oid)) throw bad("meta.head.oid is not an object id");
    oid = head.oid;
  }
  const branch = meta.branch;
  // git's own ref-name rules (check-ref-format): a name with `..` or a leading `-` would
  // leave refs/ or be taken for an option.
  if (branch !== null && branch !== undefined && (typeof branch !== "string" || branch === "" || /[\0-\x20\x7f~^:?*[\\]|\.\.|@\{|\/\/|^[-/.]|\/\.|[/.]$|\.lock(\/|$)/.test(branch))) {
    throw bad("meta.branch is not a branch name");
  }
  if (meta.detached === true || typeof branch !== "string") {
    if (!oid) throw bad("a detached HEAD needs meta.head.oid");
    return { ref: null, oid };
  }
  return { ref: branch.startsWith("refs/") ? branch : `refs/heads/${branch}`, oid };
}

/** How many symlinks the checked-out tree holds, and the first few of their paths. */
export interface LinksWritten {
  count: number;
  paths: string[];
}

/**
 * The symlinks (mode 120000) of HEAD's tree, streamed from `git ls-tree -r -z` (one record in
 * memory at a time, whatever the tree's size).
 */
function symlinksInHead(g: GitCtx, artifact: string): Promise<LinksWritten> {
  return new Promise((res, rej) => {
    const child = spawn("git", ["ls-tree", "-r", "-z", "--full-tree", "HEAD"], { cwd: g.cwd, env: g.env, stdio: ["ignore", "pipe", "pipe"], windowsHide: true });
    const out: LinksWritten = { count: 0, paths: [] };
    let rest = Buffer.alloc(0);
    let err = "";
    const record = (rec: Buffer): void => {
      if (rec.subarray(0, 7).toString("latin1") !== "120000 ") return;
      out.count++;
      if (out.paths.length < 5) out.paths.push(rec.subarray(rec.indexOf(9) + 1).toString("utf8"));
    };
    child.stdout.on("data", (b: Buffer) => {
      let buf = rest.length ? Buffer.concat([rest, b]) : b;
      for (let nul = buf.indexOf(0); nul >= 0; nul = buf.indexOf(0)) {
        record(buf.subarray(0, nul));
        buf = buf.subarray(nul + 1);
      }
      rest = Buffer.from(buf);
    });
    child.stderr.on("data", (b: Buffer) => { if (err.length < 64 * 1024) err += b.toString("utf8"); });
    child.on("error", (e) => rej(new MemsnapError("MEMSNAP_INTERNAL", `cannot run git to restore ${artifact}: ${e.message}`, {
      path: artifact, cause: e, hint: "install git, or set MEMSNAP_GIT_IMPL=isomorphic",
    })));
    child.on("close", (code) => {
      if (code === 0) res(out);
      else rej(new MemsnapError("MEMSNAP_DEEP_VERIFY_FAILED", `restoring ${artifact}: git ls-tree failed: ${said(err)}`, {
        path: artifact, hint: "the git bundle in this snapshot is damaged; run 'memsnap verify --deep' and use another snapshot",
      }));
    });
  });
}

/** The note a restore prints when the checked-out tree held symlinks (written as plain files). */
export function linksNote(layer: string, links: LinksWritten): string {
  const some = links.paths.map((p) => JSON.stringify(p)).join(", ") + (links.count > links.paths.length ? ", …" : "");
  return `git layer ${layer}: ${links.count} symlink${links.count === 1 ? "" : "s"} in the checked-out tree (${some}) ` +
    `${links.count === 1 ? "was" : "were"} restored as plain files holding the link target, and the repository has core.symlinks=false ` +
    "(restore creates no link a bundle asks for); to have links again: git config core.symlinks true, then git checkout -- PATH";
}

async function materializeGit(dir: string, bundle: string | null, head: HeadSpec, objectFormat: string, artifact: string): Promise<LinksWritten> {
  const init: GitCtx = { cwd: dir, env: gitEnv() };
  let g: GitCtx = { cwd: dir, env: gitEnv({ GIT_DIR: join(dir, ".git"), GIT_WORK_TREE: dir }) };
  const run = async (args: string[], ctx: GitCtx, damaged: boolean): Promise<void> => {
    let r: GitResult;
    try {
      r = await runGit(args, ctx);
    } catch (e) {
      throw new MemsnapError("MEMSNAP_INTERNAL", `cannot run git to restore ${artifact}: ${(e as Error).message}`, {
        path: artifact, cause: e, hint: "install git, or set MEMSNAP_GIT_IMPL=isomorphic",
      });
    }
    if (r.code === 0) return;
    throw new MemsnapError(damaged ? "MEMSNAP_DEEP_VERIFY_FAILED" : "MEMSNAP_DEST_UNWRITABLE",
      `restoring ${artifact}: git ${args[0]} failed: ${said(r.stderr)}`, {
        path: artifact, hint: damaged ? "the git bundle in this snapshot is damaged; run 'memsnap verify --deep' and use another snapshot" : "check the destination",
      });
  };
  // A fresh .git: no template (no hooks, no info/), the default config git writes, nothing from the bundle.
  await run(["init", "-q", "--template=", ...(objectFormat !== "sha1" ? [`--object-format=${objectFormat}`] : []), dir], init, false);
  // The user's own filter drivers (git-lfs, …) must not run on checkout either: files come back as the blobs hold them.
  const filters = await neutralizeFilters(dir, g);
  g = { ...g, env: gitEnv({ GIT_DIR: join(dir, ".git"), GIT_WORK_TREE: dir }, filters) };
  if (bundle) {
    await run(["fetch", "-q", "--no-write-fetch-head", "--update-head-ok", "--no-tags", bundle, "refs/*:refs/*"], g, true);
  }
  if (head.ref) await run(["symbolic-ref", "HEAD", head.ref], g, true);
  else if (head.oid) await run(["update-ref", "--no-deref", "HEAD", head.oid], g, true);
  const links: LinksWritten = head.oid ? await symlinksInHead(g, artifact) : { count: 0, paths: [] };
  // A symlink in the tree is checked out as a plain file holding its target (as git does on a
  // file system without links): restore creates no link a bundle asks for, wherever it points.
  // The repository keeps core.symlinks=false so that `git status` sees those files as the links.
  if (links.count) await run(["config", "core.symlinks", "false"], g, false);
  const checkout: GitCtx = { ...g, env: gitEnv({ GIT_DIR: join(dir, ".git"), GIT_WORK_TREE: dir }, [...filters, ["core.symlinks", "false"]]) };
  if (head.oid) await run(["reset", "-q", "--hard", "HEAD"], checkout, true);
  return links;
}

// ------------------------------------------------------------------------------ in place: what the live repository keeps

/** Keys of the rebuilt repository's config that say how it is laid out on disk: they win over the live config's. */
const FORMAT_KEYS = /^(core\.repositoryformatversion|core\.symlinks|extensions\..+)$/i;
/** The extensions isomorphic-git may find in a live config (it writes none itself). */
const ISO_EXTENSIONS = ["objectformat", "compatobjectformat", "refstorage", "worktreeconfig", "partialclone", "preciousobjects", "noop"];

/** `git config --file FILE args…` (never a repository's config: only the file named). */
async function configFile(file: string, args: string[], ok: number[] = [0]): Promise<Buffer> {
  let r: GitResult;
  try {
    r = await runGit(["config", "--file", file, ...args], { cwd: dirname(file), env: gitEnv() });
  } catch (e) {
    throw new MemsnapError("MEMSNAP_INTERNAL", `cannot run git config on ${file}: ${(e as Error).message}`, { path: file, cause: e, hint: "install git, or set MEMSNAP_GIT_IMPL=isomorphic" });
  }
  if (!ok.includes(r.code)) {
    throw new MemsnapError("MEMSNAP_DEST_UNWRITABLE", `git config --file ${file} ${args[0]} failed: ${said(r.stderr)}`, {
      path: file, hint: "check the live repository's .git/config (git config --list in it)",
    });
  }
  return r.stdout;
}

/**
 * In-place restore of a git layer: the repository rebuilt in `staged` keeps the live
 * repository's own `.git/config` (remotes, user identity, …), `.git/hooks/` and `.git/info/`
 * (exclude): a bundle never carries them (restore builds a fresh `.git`), and losing them
 * broke the next `git commit`. The config's layout keys (core.repositoryformatversion,
 * extensions.*, core.symlinks) are the rebuilt repository's, which describe how it was
 * written. Only a live `.git` that is a real directory is read (a `gitdir:` file keeps its
 * config elsewhere); links under hooks/ and info/ are the live repository's own and are
 * copied as links. Called on staging, before anything live changes.
 */
export async function keepLiveRepoFiles(root: string, staged: string): Promise<void> {
  const live = join(root, ".git");
  const dest = join(staged, ".git");
  if (!(await lstat(live).catch(() => null))?.isDirectory() || !(await lstat(dest).catch(() => null))?.isDirectory()) return;
  for (const name of ["hooks", "info"]) {
    const from = join(live, name);
    if (!(await lstat(from).catch(() => null))) continue;
    const to = join(dest, name);
    await rm(to, { recursive: true, force: true });
    await cp(from, to, { recursive: true, verbatimSymlinks: true, preserveTimestamps: true, errorOnExist: true, force: false })
      .catch((e: unknown) => { throw destinationError(e, to); });
  }
  const liveConfig = join(live, "config");
  const st = await lstat(liveConfig).catch(() => null);
  if (!st?.isFile()) return;
  const fresh = join(dest, "config");
  const tmp = `${fresh}.memsnap-live`;
  await writeFile(tmp, await readFile(liveConfig), { mode: st.mode & 0o777 }).catch((e: unknown) => { throw destinationError(e, tmp); });
  if (gitImpl() === "git") {
    const layout: Array<[string, string]> = [];
    for (const rec of (await configFile(fresh, ["-z", "--get-regexp", FORMAT_KEYS.source], [0, 1])).toString("utf8").split("\0")) {
      const nl = rec.indexOf("\n");
      if (nl > 0) layout.push([rec.slice(0, nl), rec.slice(nl + 1)]);
    }
    await configFile(tmp, ["--remove-section", "extensions"], [0, 128]);
    await configFile(tmp, ["--unset-all", "core.symlinks"], [0, 5]);
    for (const [k, v] of layout) await configFile(tmp, [k, v]);
  } else {
    const git = await loadIsoGit();
    const fs = { promises: fsPromises };
    const get = (g: string, path: string): Promise<unknown> => git.getConfig({ fs, gitdir: g, path });
    const version = await get(dest, "core.repositoryformatversion");
    const symlinks = await get(dest, "core.symlinks");
    // isomorphic-git edits `<gitdir>/config`: the copy is edited in a scratch gitdir beside it.
    const scratch = await mkdtemp(join(dest, ".memsnap-config-"));
    try {
      await rename(tmp, join(scratch, "config"));
      for (const x of ISO_EXTENSIONS) await git.setConfig({ fs, gitdir: scratch, path: `extensions.${x}`, value: undefined });
      await git.setConfig({ fs, gitdir: scratch, path: "core.repositoryformatversion", value: version === undefined ? undefined : String(version) });
      await git.setConfig({ fs, gitdir: scratch, path: "core.symlinks", value: symlinks === undefined ? undefined : String(symlinks) });
      await rename(join(scratch, "config"), tmp);
    } finally {
      await rm(scratch, { recursive: true, force: true });
    }
  }
  await rename(tmp, fresh).catch((e: unknown) => { throw destinationError(e, fresh); });
}

function unsafe(artifact: string, why: string): MemsnapError {
  return new MemsnapError("MEMSNAP_UNSAFE_PATH", `${artifact}: ${why}`, {
    path: artifact, hint: "this bundle was not written by memsnap or was tampered with",
  });
}

/** Make sure every parent of `rel` under `dir` is a real directory (never a symlink); create missing ones when `create`. */
async function realParents(dir: string, rel: string, artifact: string, create: boolean): Promise<boolean> {
  const segs = rel.split("/");
  let cur = dir;
  for (const seg of segs.slice(0, -1)) {
    cur = join(cur, seg);
    let st: Stats;
    try {
      st = await lstat(cur);
    } catch {
      if (!create) return false;
      await mkdir(cur).catch((e: unknown) => { throw destinationError(e, cur); });
      continue;
    }
    if (st.isSymbolicLink()) throw unsafe(artifact, `${rel} would be written through the symlink ${cur}`);
    if (!st.isDirectory()) {
      if (!create) return false;
      throw unsafe(artifact, `${rel} conflicts with the file ${cur}`);
    }
  }
  return true;
}

/** Remove empty directories from `rel`'s parent up to (not including) `dir`. */
async function pruneEmpty(dir: string, rel: string): Promise<void> {
  const segs = rel.split("/").slice(0, -1);
  while (segs.length) {
    const p = join(dir, ...segs);
    try {
      await rmdir(p);
    } catch {
      return;
    }
    segs.pop();
  }
}

/** Relative paths of the regular files under `root`. */
async function listFiles(root: string, rel = ""): Promise<string[]> {
  const out: string[] = [];
  for (const e of await readdir(join(root, rel), { withFileTypes: true })) {
    const r = rel ? `${rel}/${e.name}` : e.name;
    if (e.isDirectory()) out.push(...await listFiles(root, r));
    else if (e.isFile()) out.push(r);
    else throw unsafe(`${WORKTREE_DIR}/${r}`, "not a regular file");
  }
  return out;
}

/** True when `p` is a directory holding no files (only empty directories). */
async function emptyTree(p: string): Promise<boolean> {
  for (const e of await readdir(p, { withFileTypes: true })) {
    if (!e.isDirectory() || !(await emptyTree(join(p, e.name)))) return false;
  }
  return true;
}

/** Lay the captured work-tree state over the checked-out repository. */
async function applyWorktree(dir: string, layer: string, worktree: string | null, doc: WorktreeDoc): Promise<void> {
  const docArt = `${layer}/${WORKTREE_DOC_ARTIFACT}`;
  for (const rel of doc.deleted) {
    if (!(await realParents(dir, rel, docArt, false))) continue;
    const p = join(dir, ...rel.split("/"));
    const st = await lstat(p).catch(() => null);
    if (!st || st.isDirectory()) continue;
    await unlink(p).catch((e: unknown) => { throw destinationError(e, p); });
    await pruneEmpty(dir, rel);
  }
  if (worktree) {
    for (const rel of await listFiles(worktree)) {
      const art = `${layer}/${WORKTREE_DIR}/${rel}`;
      const why = worktreePathProblem(rel);
      if (why) throw unsafe(art, why);
      await realParents(dir, rel, art, true);
      const dest = join(dir, ...rel.split("/"));
      const st = await lstat(dest).catch(() => null);
      if (st?.isDirectory()) {
        if (!(await emptyTree(dest))) throw unsafe(art, `${rel} conflicts with a directory of the checked-out tree`);
        await rm(dest, { recursive: true });
      }
      await rename(join(worktree, ...rel.split("/")), dest).catch((e: unknown) => { throw destinationError(e, dest); });
      await chmod(dest, doc.executable.includes(rel) ? 0o700 : 0o600).catch((e: unknown) => { throw destinationError(e, dest); });
    }
  }
}

// ------------------------------------------------------------------------------ deep verify

async function verifyBundleFile(path: string): Promise<string | null> {
  if (gitImpl() === "isomorphic-git") return isoVerifyBundle(path);
  const h = await readBundleHeader(path);
  if (typeof h === "string") return h;
  if (h.prerequisites.length) return `needs ${h.prerequisites.length} prerequisite commit(s); memsnap writes complete bundles`;
  const repo = join(dirname(path), "r");
  const g: GitCtx = { cwd: dirname(path), env: gitEnv({ GIT_DIR: repo }) };
  const step = async (args: string[]): Promise<string | null> => {
    const r = await runGit(args, g);
    return r.code === 0 ? null : `git ${args.slice(0, 2).join(" ")} failed: ${said(r.stderr)}`;
  };
  return (await step(["init", "-q", "--bare", "--template=", ...(h.objectFormat !== "sha1" ? [`--object-format=${h.objectFormat}`] : []), repo]))
    ?? (await step(["bundle", "verify", "-q", path]))
    // Unbundling indexes the packfile (every object inflated and hashed) and checks that each ref's history is complete.
    ?? (await step(["fetch", "-q", "--no-write-fetch-head", "--no-tags", path, "refs/*:refs/*"]))
    ?? (await (async () => {
      for (const r of h.refs) {
        const bad = await step(["cat-file", "-e", r.oid]);
        if (bad) return `${r.name} points at ${r.oid}, which the bundle lacks`;
      }
      return null;
    })());
}

// ------------------------------------------------------------------------------ the source kind

/** A git repository: a bundle of every ref, plus the uncommitted and untracked files. */
export const gitSource: SourceKind<GitConfig> = {
  kind: "git",
  schemaVersion: 1,
  parseConfig(raw, where) {
    rejectUnknownKeys(raw, ["kind", "name", "path", "worktree"], where);
    return {
      kind: "git",
      name: reqString(raw, "name", where),
      path: reqString(raw, "path", where),
      worktree: optBool(raw, "worktree", where) ?? true,
    };
  },

  async capture(cfg, ctx) {
    const root = resolve(ctx.baseDir, cfg.path);
    const repo = await findRepo(root);
    if (await exists(join(repo.commondir, "shallow"))) {
      throw sourceInvalid(root, `${root} is a shallow clone: unshallow it first (its bundle would lack history)`,
        `run 'git fetch --unshallow' in ${root}, then snapshot again`);
    }
    const state = await stateFlags(repo);
    const impl = gitImpl();
    // Absolute: git runs with the repository as its working directory.
    const work = await mkdtemp(join(resolve(ctx.tmpDir), "git-"));
    const children = new Set<ChildProcessWithoutNullStreams>();
    const redactor = ctx.redactor;
    let cap: CaptureState;
    try {
      cap = impl === "git"
        ? await captureGit(cfg, root, repo, work, ctx.signal, redactor, children, ctx)
        : await captureIso(cfg, root, repo, work, ctx.signal, redactor, ctx);
      cap.scan?.catch(() => undefined); // awaited in finish(); don't let an early failure go unhandled
      const head = cap.meta.head as HeadFacts | null;
      if (head && redactor?.candidate(head.subject)) {
        // The subject lands in the manifest, which is plaintext even in an encrypted bundle.
        head.subject = await redactor.redactText(head.subject, "manifest.json");
      }
    } catch (e) {
      for (const c of children) c.kill("SIGKILL");
      await rm(work, { recursive: true, force: true });
      throw e;
    }
    const listing = cap.listing;
    const docBytes = listing ? Buffer.from(`${JSON.stringify(worktreeDoc(listing), null, 1)}\n`, "utf8") : null;
    const now = new Date();
    return {
      estimatedBytes: cap.bundleSize + (docBytes?.length ?? 0) + (listing?.files.reduce((n, f) => n + f.stats.size, 0) ?? 0),
      notices: () => walkNotices(listing ?? {}),
      artifacts: (async function* (): AsyncGenerator<Artifact> {
        const fingerprint = cap.bundleFingerprint;
        if (cap.bundle) {
          const path = cap.bundle;
          yield {
            path: BUNDLE_ARTIFACT, kind: "git-bundle", size: cap.bundleSize, mode: 0o600, mtime: now, ...(fingerprint ? { fingerprint } : {}),
            open: () => createReadStream(path, { highWaterMark: 1 << 20 }),
          };
        } else if (cap.reused && fingerprint) {
          yield {
            path: BUNDLE_ARTIFACT, kind: "git-bundle", size: cap.reused.bytes, mode: 0o600, mtime: now, fingerprint,
            open: () => {
              throw new MemsnapError("MEMSNAP_INTERNAL", `${cfg.name}/${BUNDLE_ARTIFACT} was to be referenced by the incremental snapshot, not read`);
            },
          };
        }
        if (docBytes) {
          yield { path: WORKTREE_DOC_ARTIFACT, kind: "json", size: docBytes.length, mode: 0o600, mtime: now, open: () => Readable.from([docBytes]) };
        }
        // The work tree's small files are read ahead in batches off the main thread, as a files
        // layer's are (./prefetch.ts), except those an incremental snapshot will reference.
        const files = (async function* (): AsyncGenerator<FoundFile> {
          yield* listing?.files ?? [];
        })();
        for await (const { f, pre } of readAhead(files, root, (x) => {
          if (x.stats.size >= SMALL_FILE) return null;
          if (ctx.unchanged?.(`${cfg.name}/${WORKTREE_DIR}/${x.rel}`, fingerprintOf(x.stats), "file") != null) return null;
          return x.stats.size + 1;
        })) {
          const a = fileArtifact(f, "file", `${WORKTREE_DIR}/${f.rel}`, undefined, pre);
          a.text = true;
          a.fingerprint = fingerprintOf(f.stats);
          yield a;
        }
      })(),
      finish: async () => {
        const scan = cap.reused ? cap.reused.scan : cap.scan ? await cap.scan : null;
        const bundleBytes = cap.reused?.bytes ?? (cap.bundle ? cap.bundleSize : undefined);
        return {
          root, ...cap.meta, state, worktree: worktreeMeta(cfg, listing), history_scan: scan,
          ...(bundleBytes !== undefined ? { bundle_bytes: bundleBytes } : {}), ...(cap.reused ? { bundle_reused: true } : {}),
        };
      },
      cleanup: async () => {
        for (const c of children) c.kill("SIGKILL");
        await cap.scan?.catch(() => undefined);
        await rm(work, { recursive: true, force: true });
      },
    };
  },

  async deepVerify({ entry, bytes }) {
    const rel = entry.path.startsWith(`${entry.layer}/`) ? entry.path.slice(entry.layer.length + 1) : entry.path;
    if (rel === WORKTREE_DOC_ARTIFACT) {
      const parts: Buffer[] = [];
      let n = 0;
      for await (const c of bytes) {
        n += c.length;
        if (n > WORKTREE_DOC_MAX) return `${entry.path}: over ${WORKTREE_DOC_MAX} bytes`;
        parts.push(c);
      }
      const doc = parseWorktreeDoc(Buffer.concat(parts));
      return typeof doc === "string" ? `${entry.path}: ${doc}` : null;
    }
    if (rel !== BUNDLE_ARTIFACT) return null;
    const scratch = await mkdtemp(join(tmpdir(), "memsnap-gitverify-"));
    try {
      const file = join(scratch, BUNDLE_ARTIFACT);
      await pipeline(Readable.from(bytes), createWriteStream(file, { mode: 0o600 }));
      const problem = await verifyBundleFile(file);
      return problem ? `${entry.path}: not a valid git bundle: ${problem}` : null;
    } finally {
      await rm(scratch, { recursive: true, force: true });
    }
  },

  async liveTarget(cfg, baseDir) {
    // The whole memdir is replaced by the rebuilt repository: a fresh .git (never the bundle's
    // config or hooks) that keeps the live repository's own config, hooks and info/.
    const root = resolve(baseDir, cfg.path);
    return { root, mode: "dir", keepLive: (staged: string) => keepLiveRepoFiles(root, staged) };
  },

  async planLayer(cfg, baseDir, layer) {
    const root = resolve(baseDir, cfg.path);
    const after = (layer.meta?.head as { oid?: string; subject?: string } | null | undefined) ?? null;
    const before = await new Promise<string | null>((res) => {
      execFile("git", ["-C", root, "-c", "core.hooksPath=/dev/null", "rev-parse", "--verify", "-q", "HEAD"], {
        env: { PATH: process.env.PATH ?? "", HOME: process.env.HOME ?? "", GIT_CONFIG_NOSYSTEM: "1", GIT_TERMINAL_PROMPT: "0", GIT_OPTIONAL_LOCKS: "0" },
        encoding: "utf8",
      }, (err, out) => res(err ? null : out.trim() || null));
    });
    const short = (o: string | null | undefined): string => (o ? o.slice(0, 12) : "(none)");
    const branch = typeof layer.meta?.branch === "string" ? ` on ${layer.meta.branch}` : "";
    return [`git HEAD ${short(before)} → ${short(after?.oid)}${branch}${after?.subject ? ` (${after.subject})` : ""}`];
  },

  async materialize(layerDir, layer) {
    const dir = resolve(layerDir);
    const art = (p: string): string => `${layer.name}/${p}`;
    const names = await readdir(dir);
    for (const n of names) {
      if (n !== BUNDLE_ARTIFACT && n !== WORKTREE_DIR && n !== WORKTREE_DOC_ARTIFACT) throw unsafe(art(n), "not an artifact of a git layer");
    }
    const head = headSpec(layer);
    let doc: WorktreeDoc = { format: "memsnap-git-worktree", version: 1, deleted: [], executable: [] };
    if (names.includes(WORKTREE_DOC_ARTIFACT)) {
      const parsed = parseWorktreeDoc(await readFile(join(dir, WORKTREE_DOC_ARTIFACT)));
      if (typeof parsed === "string") {
        // A path that leaves the work tree or names .git is an attack, not damage.
        if (/ holds an unsafe path /.test(parsed)) throw unsafe(art(WORKTREE_DOC_ARTIFACT), parsed);
        throw new MemsnapError("MEMSNAP_DEEP_VERIFY_FAILED", `${art(WORKTREE_DOC_ARTIFACT)}: ${parsed}`, {
          path: art(WORKTREE_DOC_ARTIFACT), hint: "the snapshot's git layer is damaged; use another snapshot",
        });
      }
      doc = parsed;
    }
    const hasBundle = names.includes(BUNDLE_ARTIFACT);
    if (head.oid && !hasBundle) {
      throw new MemsnapError("MEMSNAP_INDEX_MISMATCH", `git layer ${layer.name} records HEAD ${head.oid} but has no ${BUNDLE_ARTIFACT}`, {
        path: art(BUNDLE_ARTIFACT), hint: "the bundle is damaged or was altered; use another snapshot",
      });
    }
    const objectFormat = typeof layer.meta?.object_format === "string" && /^sha(1|256)$/.test(layer.meta.object_format) ? layer.meta.object_format : "sha1";
    // Move the artifacts aside so `dir` is empty and becomes the work tree; a work-tree file
    // named like an artifact (`repo.bundle`) lives under worktree/ and can't collide.
    const aside = await mkdtemp(join(dirname(dir), `.${basename(dir)}.git-restore-`)).catch((e: unknown) => { throw destinationError(e, dirname(dir)); });
    try {
      const bundle = hasBundle ? join(aside, BUNDLE_ARTIFACT) : null;
      if (bundle) await rename(join(dir, BUNDLE_ARTIFACT), bundle);
      const worktree = names.includes(WORKTREE_DIR) ? join(aside, WORKTREE_DIR) : null;
      if (worktree) await rename(join(dir, WORKTREE_DIR), worktree);
      await rm(join(dir, WORKTREE_DOC_ARTIFACT), { force: true });
      let links: LinksWritten;
      if (gitImpl() === "git") links = await materializeGit(dir, bundle, head, objectFormat, art(BUNDLE_ARTIFACT));
      else {
        try {
          links = await isoMaterialize(dir, bundle, head, art(BUNDLE_ARTIFACT));
        } catch (e) {
          if (e instanceof MemsnapError) throw e;
          throw new MemsnapError("MEMSNAP_DEEP_VERIFY_FAILED", `restoring ${art(BUNDLE_ARTIFACT)} with isomorphic-git failed: ${(e as Error).message}`, {
            path: art(BUNDLE_ARTIFACT), hint: "install git and retry, or use another snapshot",
          });
        }
      }
      await applyWorktree(dir, layer.name, worktree, doc);
      return links.count ? [linksNote(layer.name, links)] : [];
    } finally {
      await rm(aside, { recursive: true, force: true });
    }
  },
};
