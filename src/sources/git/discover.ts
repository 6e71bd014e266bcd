/** Finding the repository of a git source on disk, and the operations in progress in it. */
import { lstat, readFile, stat } from "node:fs/promises";
import type { Stats } from "node:fs";
import { join, resolve } from "node:path";
import { sourceError } from "../walk.js";
import { sourceInvalid } from "./run.js";
import { lexists } from "../../util/fs-atomic.js";

export interface RepoPaths {
  /** `<root>/.git` (a directory, or a `gitdir:` file). */
  dotgit: string;
  /** The git directory (per-worktree). */
  gitdir: string;
  /** The common directory (objects, refs, shallow). */
  commondir: string;
}

export async function findRepo(root: string): Promise<RepoPaths> {
  let st: Stats;
  try {
    st = await stat(root);
  } catch (e) {
    throw sourceError(e, root);
  }
  if (!st.isDirectory()) {
    throw sourceInvalid(
      root,
      `${root} is not a directory; a git source needs a repository's work tree`,
      "point the source's path at the directory that holds .git",
    );
  }
  const dotgit = join(root, ".git");
  let gst: Stats;
  try {
    gst = await lstat(dotgit);
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code === "ENOENT") {
      throw sourceInvalid(
        root,
        `${root} is not a git repository (it has no .git)`,
        "point the source's path at a repository's top directory, or use a files source",
      );
    }
    throw sourceError(e, dotgit);
  }
  let gitdir = dotgit;
  if (gst.isFile()) {
    const text = await readFile(dotgit, "utf8").catch((e: unknown) => {
      throw sourceError(e, dotgit);
    });
    const m = /^gitdir: (.+)$/m.exec(text);
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
export async function stateFlags(p: RepoPaths): Promise<Record<string, boolean>> {
  const has = (rel: string, dir = p.gitdir): Promise<boolean> => lexists(join(dir, rel));
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
