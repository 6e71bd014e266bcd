/** The work tree's uncommitted and untracked files, listed with `git status` (or by comparing with HEAD). */
import { lstatSync } from "node:fs";
import { join } from "node:path";
import { MemsnapError } from "../../errors.js";
import { CompactStats } from "../../util/native-fs.js";
import { escapeName, sourceError, walkFiles, type FoundFile } from "../walk.js";
import { worktreePathProblem } from "./format.js";
import { gitIn, gitStdin, runGit, type GitCtx } from "./run.js";

export interface WorktreeListing {
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
export async function classify(
  root: string,
  entries: Array<{ path: string; tracked: boolean }>,
  method: WorktreeListing["method"],
  unsafe: string[] = [],
): Promise<WorktreeListing> {
  const out: WorktreeListing = {
    files: [],
    deleted: [],
    counts: { modified: 0, untracked: 0, deleted: 0 },
    skipped: { symlinks: 0, directories: 0, special: 0, unsafe_names: unsafe.length },
    method,
    unsafe,
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
        const code = (e as NodeJS.ErrnoException).code;
        if (code !== "ENOENT" && code !== "ENOTDIR") throw sourceError(e, abs);
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
      else if (st.isDirectory())
        out.skipped.directories++; // a nested repository
      else out.skipped.special++;
    });
  }
  const byBytes = (a: string, b: string): number => Buffer.compare(Buffer.from(a), Buffer.from(b));
  out.files.sort((a, b) => byBytes(a.rel, b.rel));
  out.deleted.sort(byBytes);
  return out;
}

/** `git status` (no optional locks, so a held index.lock does not stop it); falls back to comparing with HEAD. */
export async function listWorktreeGit(root: string, g: GitCtx, hasHead: boolean): Promise<WorktreeListing> {
  const status = ["status", "--porcelain=v1", "-z", "--untracked-files=all", "--no-renames", "--ignore-submodules=all"];
  const r = await runGit(status, g).catch((e: unknown) => {
    throw new MemsnapError("MEMSNAP_SOURCE_UNREADABLE", `cannot run git for ${root}: ${(e as Error).message}`, {
      path: root,
      cause: e,
      hint: "check that git is installed",
    });
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
    const hashArgs = ["hash-object", "--no-filters", "--stdin-paths"];
    const hashed = await gitStdin(root, g, hashArgs, both.join("\n") + "\n", [0]);
    const ours = hashed.toString("utf8").trim().split("\n");
    both.forEach((p, i) => {
      if (ours[i] !== tracked.get(p)) entries.push({ path: p, tracked: true });
    });
  }
  for (const p of tracked.keys()) if (!present.has(p)) entries.push({ path: p, tracked: true });
  const fresh = files.filter((f) => !tracked.has(f.rel)).map((f) => f.rel);
  const checkIgnore = ["check-ignore", "--no-index", "-z", "--stdin"];
  const ignored = fresh.length
    ? new Set(
        (await gitStdin(root, g, checkIgnore, fresh.join("\0") + "\0", [0, 1]))
          .toString("utf8")
          .split("\0")
          .filter(Boolean),
      )
    : new Set<string>();
  for (const p of fresh) if (!ignored.has(p)) entries.push({ path: p, tracked: false });
  return classify(root, entries, "compare", unsafe ?? []);
}
