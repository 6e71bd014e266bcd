/**
 * What an in-place restore (and `recover`) may touch in the live tree.
 *
 * - Only paths a configured source owns: its live root (a `dir` target, replaced whole) or a
 *   file under it that its globs and kind select (a `files` target), and memsnap's own staging
 *   and backup directories beside that root (`<root>.memsnap-new-<tag>-<k>`, `…-old-…`).
 * - Never the config file the command runs with, nor anything under the agent's control
 *   directory (`.memsnap`): those are owned by no layer.
 * - Never through a symlink: below a live root (and in staging and backups) every directory
 *   component of a path renamed or created is checked with lstat to be a real directory. A
 *   symlink, or a file, where the bundle has a directory is refused; a symlink where the bundle
 *   has a file is replaced as a node (rename replaces the link, never what it points to).
 */
import { lstatSync, mkdirSync, realpathSync, type Stats } from "node:fs";
import { basename, dirname, isAbsolute, join, normalize } from "node:path";
import type { MemsnapConfig } from "../config.js";
import type { LayerEntry } from "../format/manifest.js";
import type { LiveTarget } from "../sources/types.js";
import { controlDir } from "./lock.js";

/** True when `p` is `dir` or lies below it. */
export function under(p: string, dir: string): boolean {
  return p === dir || p.startsWith(dir.endsWith("/") ? dir : `${dir}/`);
}

/** `p` with the symlinks of its longest existing prefix resolved. */
export function realish(p: string): string {
  try {
    return realpathSync(p);
  } catch {
    const parent = dirname(p);
    return parent === p ? p : join(realish(parent), basename(p));
  }
}

/** An absolute, normalized path without NUL (what memsnap writes in a journal). */
export function plainAbsolute(p: unknown): p is string {
  return (
    typeof p === "string" &&
    p.length > 0 &&
    !p.includes("\0") &&
    isAbsolute(p) &&
    normalize(p) === p &&
    (p === "/" || !p.endsWith("/"))
  );
}

/** A relative path of plain segments (no empty, `.` or `..` segment). */
export function plainRelative(rel: string): boolean {
  return rel !== "" && !rel.includes("\0") && rel.split("/").every((s) => s !== "" && s !== "." && s !== "..");
}

/** The paths no restore writes: the config file (as named and as resolved) and the control directory. */
export class Protected {
  readonly files: string[];
  readonly dirs: string[];

  constructor(config: MemsnapConfig) {
    const files = new Set<string>();
    if (config.file) {
      files.add(config.file);
      files.add(join(realish(dirname(config.file)), basename(config.file))); // the name, its directory resolved
      files.add(realish(config.file)); // the file a symlinked config points to
    }
    const ctl = controlDir(config.baseDir);
    this.files = [...files];
    this.dirs = [...new Set([ctl, realish(ctl)])];
  }

  /**
   * True when writing `real` (a path whose directories are resolved) or `literal` would change the config or the
   * control dir.
   */
  covers(literal: string, real: string): boolean {
    return [literal, real].some((p) => this.files.includes(p) || this.dirs.some((d) => under(p, d)));
  }

  /** True when replacing the whole directory `root` would replace the config or the control dir. */
  inside(root: string): boolean {
    const real = realish(root);
    return [root, real].some(
      (r) => this.files.some((f) => under(f, r)) || this.dirs.some((d) => under(d, r) || under(r, d)),
    );
  }
}

/** A live target a config can give a layer, with its root resolved. */
export interface LiveRoot extends LiveTarget {
  layer: string;
  realRoot: string;
}

/** True when a `files` target may hold `rel`: a file it owns, or a companion of one (SQLite `-wal`). */
export function admits(t: LiveTarget, rel: string): boolean {
  if (t.owns?.(rel)) return true;
  const m = /^(.+)(-[a-z]+)$/.exec(rel);
  return !!m && !!t.owns?.(m[1]!) && !!t.companions?.(m[1]!).includes(rel);
}

/**
 * Every live target the current config can give its layers (a path-based source's root is its
 * path, or the directory of its path when the layer was one file: both are listed). What
 * `recover` accepts a journal's paths against.
 */
export async function configRoots(config: MemsnapConfig): Promise<LiveRoot[]> {
  const out: LiveRoot[] = [];
  for (const s of config.sources) {
    if (!s.impl.liveTarget) continue;
    for (const rootIsFile of [false, true]) {
      const layer: LayerEntry = {
        name: s.cfg.name,
        kind: s.impl.kind,
        schema_version: 1,
        artifacts: 0,
        bytes: 0,
        meta: { root_is_file: rootIsFile },
      };
      let t: LiveTarget;
      try {
        t = await s.impl.liveTarget(s.cfg, config.baseDir, layer);
      } catch {
        continue; // a layer of this source cannot go in place at all
      }
      out.push({ ...t, layer: s.cfg.name, realRoot: realish(t.root) });
    }
  }
  return out;
}

function lstatOrNull(p: string): Stats | null {
  try {
    return lstatSync(p);
  } catch (e) {
    const code = (e as NodeJS.ErrnoException).code;
    if (code === "ENOENT" || code === "ENOTDIR") return null;
    throw e;
  }
}

/** Why a live path cannot be used, for the caller's error. */
export interface PathProblem {
  path: string;
  why: string;
}

/**
 * Check, without changing anything, the directories between `base` and `rel`'s parent: each
 * that exists must be a real directory (no symlink, no file). `base` itself is checked too
 * unless `trustBase` (a live root the config names may be a link). `seen`: directories already
 * found fine. Returns the first problem, or null.
 */
export function parentProblem(base: string, rel: string, trustBase: boolean, seen: Set<string>): PathProblem | null {
  const parts = rel === "" ? [] : rel.split("/").slice(0, -1);
  let d = base;
  for (let i = -1; i < parts.length; i++) {
    if (i >= 0) d = join(d, parts[i]!);
    if (seen.has(d) || (i < 0 && trustBase)) continue;
    const st = lstatOrNull(d);
    if (!st) return null; // nothing below a missing directory exists
    if (st.isSymbolicLink()) return { path: d, why: "is a symlink (a restore never writes through a link)" };
    if (!st.isDirectory()) return { path: d, why: "is not a directory" };
    seen.add(d);
  }
  return null;
}

/**
 * Create the directories between `base` and `rel`'s parent one level at a time, each checked
 * with lstat to be a real directory (never followed through a link). `made`: directories known
 * to be fine. Throws `fail(problem)` for a symlink or a file in the way.
 */
export function ensureParents(
  base: string,
  rel: string,
  trustBase: boolean,
  made: Set<string>,
  fail: (p: PathProblem) => Error,
): void {
  const parts = rel === "" ? [] : rel.split("/").slice(0, -1);
  let d = base;
  for (let i = -1; i < parts.length; i++) {
    if (i >= 0) d = join(d, parts[i]!);
    if (made.has(d)) continue;
    if (i < 0 && trustBase) {
      mkdirSync(d, { recursive: true });
      made.add(d);
      continue;
    }
    let st = lstatOrNull(d);
    if (!st) {
      if (i < 0) mkdirSync(dirname(d), { recursive: true }); // beside a live root: the config's directory
      try {
        mkdirSync(d);
      } catch (e) {
        if ((e as NodeJS.ErrnoException).code !== "EEXIST") throw e;
      }
      st = lstatSync(d);
    }
    if (st.isSymbolicLink()) throw fail({ path: d, why: "is a symlink (a restore never writes through a link)" });
    if (!st.isDirectory()) throw fail({ path: d, why: "is not a directory" });
    made.add(d);
  }
}

export { lstatOrNull };
