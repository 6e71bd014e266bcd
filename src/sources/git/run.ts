/**
 * Running git safely: every git command runs with execFile/spawn (never a shell) and an
 * environment that drops inherited GIT_* variables, ignores the system config, and overrides
 * config a memdir could use to run commands (core.hooksPath=/dev/null, core.fsmonitor=false,
 * every filter driver's clean/smudge/process emptied) through GIT_CONFIG_COUNT, which also
 * handles key names `-c` cannot. Without a git binary (or with MEMSNAP_GIT_IMPL=isomorphic)
 * isomorphic-git does the work (./iso.ts).
 */
import { execFile, spawn, type ChildProcessWithoutNullStreams } from "node:child_process";
import { accessSync, constants, statSync } from "node:fs";
import { delimiter, join } from "node:path";
import { MemsnapError } from "../../errors.js";

// ------------------------------------------------------------------------------ which implementation

export type Impl = "git" | "isomorphic-git";

let gitOnPath: boolean | undefined;

function hasGitBinary(): boolean {
  gitOnPath ??= (process.env.PATH ?? "")
    .split(delimiter)
    .filter(Boolean)
    .some((d) => {
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
  const msg = `MEMSNAP_GIT_IMPL must be "git" or "isomorphic", got ${JSON.stringify(forced)}`;
  throw new MemsnapError("MEMSNAP_USAGE", msg, {
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

/**
 * Config for the git processes a snapshot runs (the bundle, the history scan) and a restore runs, to bound their
 * memory: git's cache of delta bases is 96 MiB by default, and it is most of what these
 * processes hold; the pack's mapped windows are the rest. Measured on the realistic home's
 * memdir (20k notes, 3k commits, a 26 MiB pack): `git bundle create --all` peaked at 133 MiB
 * (its pack-objects 115), 78 MiB with 16 MiB of delta cache, in the same CPU time (0.40
 * against 0.36-0.46 CPU-s) and to the same bytes (8 MiB of cache cost 0.3 CPU-s more); and
 * pack-objects alone 59 → 51 MiB with 4 MiB windows and 16 MiB of them mapped, CPU the same
 * (0.73-0.79 CPU-s, 6 runs; 8 MiB mapped cost 0.4 CPU-s more). The bytes written do not
 * depend on these.
 *
 * A restore's git processes (fetch with its index-pack and connectivity walk, reset --hard) run
 * with them too: with the memdir rebuilt while the other layers extract (init lists it first),
 * rev-list's 105 MiB beside the extracting process put the tree at 235-239 MiB; with these
 * settings 164-173 MiB, and the restore took as long (4 alternating runs each: 3.88-4.18 s,
 * 4.42-4.84 user CPU-s, against 3.52-4.28 s, 3.96-4.79 user CPU-s).
 *
 * The windows are 16 MiB, 32 MiB of them mapped (they were 4 and 16): the history scan's
 * `cat-file --batch` of every blob version reads delta bases all over the pack, and with 4 MiB
 * windows under a 16 MiB limit it spent most of its time mapping and unmapping them. On the same
 * memdir, alone, 3 runs each: the scan 0.56-0.61 s (0.22-0.24 s of it system time) → 0.33 s
 * (0.01 s), 9 → 30 MiB; pack-objects 0.62-0.86 s (0.13-0.21 s system) → 0.55-0.66 s (0.06-0.08 s),
 * 53 → 66 MiB. The mapped bytes stay bounded by the limit whatever the pack's size.
 */
export const GIT_MEMORY_CONFIG: ReadonlyArray<[string, string]> = [
  ["core.deltaBaseCacheLimit", "16m"],
  ["core.packedGitWindowSize", "16m"],
  ["core.packedGitLimit", "32m"],
];

/** Inherited variables kept: the install's exec path and the user's own global config file. */
const KEEP_ENV = new Set(["GIT_EXEC_PATH", "GIT_CONFIG_GLOBAL"]);

export function gitEnv(
  vars: Record<string, string> = {},
  extraConfig: ReadonlyArray<[string, string]> = [],
): NodeJS.ProcessEnv {
  const env: NodeJS.ProcessEnv = {};
  for (const [k, v] of Object.entries(process.env)) if (!k.startsWith("GIT_") || KEEP_ENV.has(k)) env[k] = v;
  Object.assign(
    env,
    {
      GIT_CONFIG_NOSYSTEM: "1",
      GIT_TERMINAL_PROMPT: "0",
      GIT_OPTIONAL_LOCKS: "0",
      GIT_NO_REPLACE_OBJECTS: "1",
      GIT_NO_LAZY_FETCH: "1",
      GIT_PROTOCOL_FROM_USER: "0",
    },
    vars,
  );
  const cfg = [...SAFE_CONFIG, ...extraConfig];
  env.GIT_CONFIG_COUNT = String(cfg.length);
  cfg.forEach(([k, v], i) => {
    env[`GIT_CONFIG_KEY_${i}`] = k;
    env[`GIT_CONFIG_VALUE_${i}`] = v;
  });
  return env;
}

export interface GitCtx {
  cwd: string;
  env: NodeJS.ProcessEnv;
  signal?: AbortSignal;
}

export interface GitResult {
  code: number;
  stdout: Buffer;
  stderr: string;
}

/** Run git (`input` on its stdin); resolves with its exit code and output (rejects only when it cannot be started). */
export function runGit(args: string[], g: GitCtx, input?: string): Promise<GitResult> {
  return new Promise((res, rej) => {
    const child = execFile(
      "git",
      args,
      {
        cwd: g.cwd,
        env: g.env,
        encoding: "buffer",
        maxBuffer: 1 << 30,
        windowsHide: true,
        ...(g.signal ? { signal: g.signal } : {}),
      },
      (err, stdout, stderr) => {
        const code = (err as (NodeJS.ErrnoException & { code?: unknown }) | null)?.code;
        if (err && typeof code !== "number") {
          rej(err);
          return;
        }
        res({ code: typeof code === "number" ? code : 0, stdout, stderr: stderr.toString("utf8") });
      },
    );
    if (input !== undefined) {
      child.stdin?.on("error", () => undefined); // a child that exits early; its exit code tells
      child.stdin?.end(input);
    }
  });
}

export function said(stderr: string): string {
  const s = stderr
    .trim()
    .split("\n")
    .filter((l) => !/^(hint|warning): /.test(l))
    .join("; ");
  return s.length > 800 ? `${s.slice(0, 800)}…` : s || "no message";
}

export function sourceInvalid(
  root: string,
  msg: string,
  hint = "check the repository with 'git fsck --full' in it",
): MemsnapError {
  return new MemsnapError("MEMSNAP_SOURCE_INVALID", msg, { path: root, hint });
}

/** Run git in the source repository; a non-zero exit is MEMSNAP_SOURCE_INVALID with what git said. */
export async function gitIn(root: string, g: GitCtx, args: string[], ok: number[] = [0]): Promise<GitResult> {
  let r: GitResult;
  try {
    r = await runGit(args, g);
  } catch (e) {
    g.signal?.throwIfAborted();
    throw new MemsnapError("MEMSNAP_SOURCE_UNREADABLE", `cannot run git for ${root}: ${(e as Error).message}`, {
      path: root,
      cause: e,
      hint: "check that git is installed and runnable, or set MEMSNAP_GIT_IMPL=isomorphic",
    });
  }
  if (!ok.includes(r.code)) throw sourceInvalid(root, `git ${args[0]} failed in ${root}: ${said(r.stderr)}`);
  return r;
}

/** Config overrides that empty every filter driver the repository (or the user) defines. */
export async function neutralizeFilters(root: string, g: GitCtx): Promise<Array<[string, string]>> {
  const r = await gitIn(root, g, ["config", "-z", "--name-only", "--get-regexp", "^filter\\."], [0, 1]);
  const drivers = new Set<string>();
  for (const key of r.stdout.toString("utf8").split("\0")) {
    const m = /^filter\.(.+)\.[^.]+$/s.exec(key.trim());
    if (m) drivers.add(m[1]!);
  }
  const out: Array<[string, string]> = [];
  for (const d of drivers) {
    out.push(
      [`filter.${d}.clean`, ""],
      [`filter.${d}.smudge`, ""],
      [`filter.${d}.process`, ""],
      [`filter.${d}.required`, "false"],
    );
  }
  return out;
}

/** Run git with `input` on stdin; a non-zero exit outside `ok` is MEMSNAP_SOURCE_INVALID. */
export function gitStdin(root: string, g: GitCtx, args: string[], input: string, ok: number[]): Promise<Buffer> {
  return new Promise((res, rej) => {
    const child = spawn("git", args, { cwd: g.cwd, env: g.env, stdio: ["pipe", "pipe", "pipe"], windowsHide: true });
    const out: Buffer[] = [];
    let err = "";
    child.stdout.on("data", (b: Buffer) => out.push(b));
    child.stderr.on("data", (b: Buffer) => {
      err += b.toString("utf8");
    });
    child.stdin.on("error", () => undefined);
    child.on("error", (e) =>
      rej(
        new MemsnapError("MEMSNAP_SOURCE_UNREADABLE", `cannot run git for ${root}: ${e.message}`, {
          path: root,
          cause: e,
          hint: "check that git is installed",
        }),
      ),
    );
    child.on("close", (code) => {
      if (code === null || !ok.includes(code)) {
        rej(sourceInvalid(root, `git ${args[0]} failed in ${root}: ${said(err)}`));
      } else {
        res(Buffer.concat(out));
      }
    });
    child.stdin.end(input);
  });
}

// ------------------------------------------------------------------------------ streaming git

export interface Spawned {
  child: ChildProcessWithoutNullStreams;
  done: Promise<void>;
}

export function spawnGit(
  root: string,
  g: GitCtx,
  args: string[],
  children: Set<ChildProcessWithoutNullStreams>,
): Spawned {
  const child = spawn("git", args, { cwd: g.cwd, env: g.env, stdio: ["pipe", "pipe", "pipe"], windowsHide: true });
  children.add(child);
  let err = "";
  child.stderr.on("data", (b: Buffer) => {
    if (err.length < 64 * 1024) err += b.toString("utf8");
  });
  child.stdin.on("error", () => undefined); // a child that exits early; its exit code tells
  const done = new Promise<void>((res, rej) => {
    child.on("error", (e) =>
      rej(
        new MemsnapError("MEMSNAP_SOURCE_UNREADABLE", `cannot run git for ${root}: ${e.message}`, {
          path: root,
          cause: e,
          hint: "check that git is installed",
        }),
      ),
    );
    child.on("close", (code, signal) => {
      children.delete(child);
      if (code === 0) res();
      else rej(sourceInvalid(root, `git ${args[0]} failed in ${root}: ${signal ? `killed by ${signal}` : said(err)}`));
    });
  });
  done.catch(() => undefined);
  return { child, done };
}
