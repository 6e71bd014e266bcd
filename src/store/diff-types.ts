/**
 * What `memsnap diff` reports, per layer: the files added, removed and changed, and for git
 * and SQLite layers the view inside them. Types of their own so that the files that compute
 * each part (./diff-git.ts, ./diff-sqlite.ts, ./diff.ts) share them without importing each other.
 */

/** The most entries of one list (files added, commits, …) a diff reports; the rest are counted. */
export const LIST_MAX = 1000;

/** The view inside a git layer: HEADs, the commits between them, the files of their trees and work trees. */
export interface GitDiff {
  /** HEAD's object id in A and in B (null: no commit yet, or not recorded). */
  head: { from: string | null; to: string | null };
  /** Whether B's HEAD descends from A's (null when either is missing or git could not tell). */
  descendant: boolean | null;
  /** The commits reachable from B's HEAD and not from A's, newest first (at most LIST_MAX). */
  commits: { oid: string; subject: string }[];
  commits_total: number;
  /** When B does not descend from A: how many commits of A's history are not in B's. */
  commits_dropped: number;
  /** Committed files (HEAD tree A → HEAD tree B) by path, each list at most LIST_MAX. */
  files: { added: string[]; changed: string[]; deleted: string[] };
  files_total: { added: number; changed: number; deleted: number };
  /**
   * The uncommitted work-tree files captured beside the bundle (worktree/…), by path: added,
   * changed, and removed (no longer uncommitted); and `deleted`: tracked files missing from B's
   * work tree (an uncommitted deletion) that were not missing from A's (at most LIST_MAX).
   */
  worktree: { added: string[]; changed: string[]; removed: string[]; deleted: string[] };
  /** Why the view inside the bundles is missing or partial, when it is. */
  note?: string;
}

/** The view inside a SQLite layer: per database and table, row counts and rows changed by rowid. */
export interface SqliteDiff {
  /**
   * Per database (its path in the layer), per table: the row counts in A and B (from the layer
   * meta) and, when the database changed, the rows added, removed and changed by rowid (tables
   * with a rowid in both copies), with the first changed rowids.
   */
  databases: Record<
    string,
    Record<
      string,
      { from: number; to: number; added?: number; removed?: number; changed?: number; changed_rowids?: string[] }
    >
  >;
}

/** One layer's differences (A → B): its files by path, notes, and the git or SQLite view. */
export interface LayerDiff {
  layer: string;
  kind: string;
  added: { path: string; size: number }[];
  removed: { path: string; size: number }[];
  changed: { path: string; from: number; to: number }[];
  unchanged: number;
  notes: string[];
  git?: GitDiff;
  sqlite?: SqliteDiff;
}
