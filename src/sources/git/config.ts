/** The `git` source's config entry. */
import { optBool, rejectUnknownKeys, reqString } from "../../util/config-check.js";

export interface GitConfig {
  kind: "git";
  name: string;
  /** The repository's work tree (the directory holding `.git`). */
  path: string;
  /** Capture uncommitted and untracked files too (default true). */
  worktree: boolean;
}

/** Check a git source's config entry. */
export function parseGitConfig(raw: Record<string, unknown>, where: string): GitConfig {
  rejectUnknownKeys(raw, ["kind", "name", "path", "worktree"], where);
  return {
    kind: "git",
    name: reqString(raw, "name", where),
    path: reqString(raw, "path", where),
    worktree: optBool(raw, "worktree", where) ?? true,
  };
}
