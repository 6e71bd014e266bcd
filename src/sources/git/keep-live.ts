/** In-place restore of a git layer: what the rebuilt repository keeps of the live one. */
import { promises as fsPromises } from "node:fs";
import { cp, lstat, mkdtemp, readFile, rename, rm, writeFile } from "node:fs/promises";
import { dirname, join } from "node:path";
import { MemsnapError, destinationError } from "../../errors.js";
import { loadIsoGit } from "./iso.js";
import { gitEnv, gitImpl, runGit, said, type GitResult } from "./run.js";

/** Keys of the rebuilt repository's config that say how it is laid out on disk: they win over the live config's. */
const FORMAT_KEYS = /^(core\.repositoryformatversion|core\.symlinks|extensions\..+)$/i;
/** The extensions isomorphic-git may find in a live config (it writes none itself). */
const ISO_EXTENSIONS = [
  "objectformat",
  "compatobjectformat",
  "refstorage",
  "worktreeconfig",
  "partialclone",
  "preciousobjects",
  "noop",
];

/** `git config --file FILE args…` (never a repository's config: only the file named). */
async function configFile(file: string, args: string[], ok: number[] = [0]): Promise<Buffer> {
  let r: GitResult;
  try {
    r = await runGit(["config", "--file", file, ...args], { cwd: dirname(file), env: gitEnv() });
  } catch (e) {
    throw new MemsnapError("MEMSNAP_INTERNAL", `cannot run git config on ${file}: ${(e as Error).message}`, {
      path: file,
      cause: e,
      hint: "install git, or set MEMSNAP_GIT_IMPL=isomorphic",
    });
  }
  if (!ok.includes(r.code)) {
    const msg = `git config --file ${file} ${args[0]} failed: ${said(r.stderr)}`;
    throw new MemsnapError("MEMSNAP_DEST_UNWRITABLE", msg, {
      path: file,
      hint: "check the live repository's .git/config (git config --list in it)",
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
  const isDir = async (p: string): Promise<boolean> => (await lstat(p).catch(() => null))?.isDirectory() ?? false;
  if (!(await isDir(live)) || !(await isDir(dest))) return;
  for (const name of ["hooks", "info"]) {
    const from = join(live, name);
    if (!(await lstat(from).catch(() => null))) continue;
    const to = join(dest, name);
    await rm(to, { recursive: true, force: true });
    await cp(from, to, {
      recursive: true,
      verbatimSymlinks: true,
      preserveTimestamps: true,
      errorOnExist: true,
      force: false,
    }).catch((e: unknown) => {
      throw destinationError(e, to);
    });
  }
  const liveConfig = join(live, "config");
  const st = await lstat(liveConfig).catch(() => null);
  if (!st?.isFile()) return;
  const fresh = join(dest, "config");
  const tmp = `${fresh}.memsnap-live`;
  await writeFile(tmp, await readFile(liveConfig), { mode: st.mode & 0o777 }).catch((e: unknown) => {
    throw destinationError(e, tmp);
  });
  if (gitImpl() === "git") {
    const layout: Array<[string, string]> = [];
    const keys = await configFile(fresh, ["-z", "--get-regexp", FORMAT_KEYS.source], [0, 1]);
    for (const rec of keys.toString("utf8").split("\0")) {
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
      for (const x of ISO_EXTENSIONS) {
        await git.setConfig({ fs, gitdir: scratch, path: `extensions.${x}`, value: undefined });
      }
      await git.setConfig({
        fs,
        gitdir: scratch,
        path: "core.repositoryformatversion",
        value: version === undefined ? undefined : String(version),
      });
      await git.setConfig({
        fs,
        gitdir: scratch,
        path: "core.symlinks",
        value: symlinks === undefined ? undefined : String(symlinks),
      });
      await rename(join(scratch, "config"), tmp);
    } finally {
      await rm(scratch, { recursive: true, force: true });
    }
  }
  await rename(tmp, fresh).catch((e: unknown) => {
    throw destinationError(e, fresh);
  });
}
