/**
 * Helpers for tests of the `git` source: run git with a fixed identity and dates and no
 * user/system config, build repositories (by hand or with `git fast-import` for the big
 * fixture), and describe a repository's refs, HEAD and `git status` so two can be compared.
 */
import { spawnSync } from "node:child_process";
import { mkdirSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";

/** The environment test git commands run with: no system/global config, fixed identity and clock. */
export function testGitEnv(extra: Record<string, string> = {}): NodeJS.ProcessEnv {
  const env: NodeJS.ProcessEnv = {};
  for (const [k, v] of Object.entries(process.env)) if (!k.startsWith("GIT_")) env[k] = v;
  return {
    ...env,
    GIT_CONFIG_NOSYSTEM: "1",
    GIT_CONFIG_GLOBAL: "/dev/null",
    GIT_AUTHOR_NAME: "Ada Lovelace",
    GIT_AUTHOR_EMAIL: "ada@example.com",
    GIT_COMMITTER_NAME: "Ada Lovelace",
    GIT_COMMITTER_EMAIL: "ada@example.com",
    GIT_AUTHOR_DATE: "2024-06-01T12:00:00Z",
    GIT_COMMITTER_DATE: "2024-06-01T12:00:00Z",
    ...extra,
  };
}

/** Run `git args…` in `cwd`; throws with git's stderr on a non-zero exit. Returns stdout. */
export function git(cwd: string, args: string[], opts: { input?: string | Buffer; env?: Record<string, string>; allowFail?: boolean } = {}): string {
  const r = spawnSync("git", ["-c", "init.defaultBranch=main", "-c", "core.hooksPath=/dev/null", ...args], {
    cwd, env: testGitEnv(opts.env), input: opts.input, maxBuffer: 1 << 30,
  });
  if (r.error) throw r.error;
  if (r.status !== 0 && !opts.allowFail) {
    throw new Error(`git ${args.join(" ")} failed in ${cwd} (exit ${r.status}): ${r.stderr.toString("utf8")}`);
  }
  return r.stdout.toString("utf8");
}

/** Write files (path → content) under `root`, making directories. */
export function writeFiles(root: string, files: Record<string, string | Buffer>): void {
  for (const [rel, content] of Object.entries(files)) {
    const p = join(root, rel);
    mkdirSync(dirname(p), { recursive: true });
    writeFileSync(p, content);
  }
}

/** `git init` a repository at `dir` (created if missing). */
export function initRepo(dir: string): string {
  mkdirSync(dir, { recursive: true });
  git(dir, ["init", "-q"]);
  return dir;
}

let tick = 0;

/** Stage everything and commit with `message` (dates advance one minute per commit). */
export function commitAll(dir: string, message: string): string {
  git(dir, ["add", "-A"]);
  const date = new Date(Date.UTC(2024, 5, 1, 12, tick++)).toISOString();
  git(dir, ["commit", "-q", "--allow-empty", "-m", message], { env: { GIT_AUTHOR_DATE: date, GIT_COMMITTER_DATE: date } });
  return git(dir, ["rev-parse", "HEAD"]).trim();
}

/**
 * Build the performance fixture with one `git fast-import` run: a first commit of `files`
 * small text files spread over directories, then `commits - 1` commits each changing a few
 * of them; then check the work tree out. Far faster than `git commit` in a loop.
 */
export function fastImportRepo(dir: string, opts: { files: number; commits: number; perCommit?: number }): void {
  initRepo(dir);
  const perDir = 100;
  const pathOf = (i: number): string => `notes/d${String(Math.floor(i / perDir)).padStart(4, "0")}/n${String(i).padStart(6, "0")}.md`;
  const parts: string[] = [];
  const data = (s: string): string => `data ${Buffer.byteLength(s)}\n${s}\n`;
  const t0 = Date.UTC(2024, 0, 1) / 1000;
  const per = opts.perCommit ?? 5;
  for (let c = 0; c < opts.commits; c++) {
    parts.push(`commit refs/heads/main\ncommitter Ada Lovelace <ada@example.com> ${t0 + c * 60} +0000\n${data(`memory update ${c}`)}`);
    if (c === 0) {
      for (let i = 0; i < opts.files; i++) {
        parts.push(`M 100644 inline ${pathOf(i)}\n${data(`# note ${i}\n\nthe agent remembered fact number ${i}; revision 0\n`)}`);
      }
    } else {
      for (let k = 0; k < per; k++) {
        const i = (c * 7919 + k * 104729) % opts.files;
        parts.push(`M 100644 inline ${pathOf(i)}\n${data(`# note ${i}\n\nthe agent remembered fact number ${i}; revision ${c}\n`)}`);
      }
    }
    parts.push("\n");
  }
  git(dir, ["fast-import", "--quiet"], { input: parts.join("") });
  git(dir, ["reset", "-q", "--hard", "main"]);
}

/** A repository's refs (`refname → oid`), HEAD (`ref:` target or oid) and HEAD oid. */
export interface RepoRefs {
  refs: Record<string, string>;
  head: string;
  headOid: string | null;
}

export function repoRefs(dir: string): RepoRefs {
  const refs: Record<string, string> = {};
  for (const line of git(dir, ["for-each-ref", "--format=%(refname) %(objectname)"]).split("\n").filter(Boolean)) {
    const [name, oid] = line.split(" ");
    refs[name!] = oid!;
  }
  const sym = git(dir, ["symbolic-ref", "-q", "HEAD"], { allowFail: true }).trim();
  const oid = git(dir, ["rev-parse", "-q", "--verify", "HEAD"], { allowFail: true }).trim();
  return { refs, head: sym ? `ref: ${sym}` : oid, headOid: oid || null };
}

/**
 * `git status` reduced to what a restore can reproduce: path → `modified` | `new` | `deleted`
 * (staged and unstaged changes look alike, and `A` counts as `new`, because the index is
 * not captured).
 */
export function statusSummary(dir: string): Record<string, "modified" | "new" | "deleted"> {
  const out: Record<string, "modified" | "new" | "deleted"> = {};
  const raw = git(dir, ["status", "--porcelain=v1", "-z", "--untracked-files=all", "--no-renames"]);
  for (const rec of raw.split("\0")) {
    if (rec.length < 4) continue;
    const x = rec[0]!;
    const y = rec[1]!;
    const path = rec.slice(3);
    out[path] = x === "?" || x === "A" ? "new" : x === "D" || y === "D" ? "deleted" : "modified";
  }
  return out;
}
