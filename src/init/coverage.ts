/**
 * Coverage: which files under a home a config's sources capture (a predicate by path), and the
 * large files none captures, which `snapshot` warns about. Used by init's accounting
 * (./account.ts) and by `snapshot`, with the config's sources.
 */
import { lstat, readdir } from "node:fs/promises";
import { isAbsolute, join, relative, resolve } from "node:path";
import { selector } from "../sources/walk.js";

/**
 * "Large": a directory whose files no source covers, together this many bytes or more, becomes
 * a `files` source of its own (and a file at the home's top level this large, one of a `files`
 * source of the home); `snapshot` warns about each uncovered file this large.
 */
export const LARGE_BYTES = 1 << 20;

/** A source as coverage sees it: its kind and the keys that say which paths it takes. */
export interface CoverageSource {
  kind: string;
  path?: string;
  store?: string;
  include?: string[];
  exclude?: string[];
}

/** Kinds of source that take their whole directory. */
export const WHOLE_DIR_KINDS = new Set(["git", "kv", "criu", "pfimg"]);

/**
 * A predicate "this file (path relative to `base`, POSIX) is captured by one of `sources`":
 * a memdir, KV dump, CRIU dump or ProcessFork store takes its whole directory; a SQLite
 * database its file with its -wal/-shm/-journal; files, state and trace sources what their
 * include/exclude globs select under their path. An exec plugin names no path: it covers nothing here.
 */
export function coverage(base: string, sources: readonly CoverageSource[]): (rel: string) => boolean {
  const tests = sources.flatMap((s) => {
    const raw = s.kind === "pfimg" ? s.store : s.path;
    if (raw === undefined) return [];
    const root = relative(base, resolve(base, raw)).split("\\").join("/");
    if (root.startsWith("..") || isAbsolute(root)) return [];
    const within = (rel: string): string | null =>
      root === "" ? rel : rel === root ? "" : rel.startsWith(`${root}/`) ? rel.slice(root.length + 1) : null;
    if (WHOLE_DIR_KINDS.has(s.kind)) return [(rel: string) => within(rel) !== null];
    const sel = selector({ include: s.include, exclude: s.exclude });
    const one = (rel: string): boolean => {
      const sub = within(rel);
      return sub === "" || (sub !== null && sel(sub));
    };
    if (s.kind === "sqlite") return [(rel: string) => one(rel) || one(rel.replace(/-(wal|shm|journal)$/, ""))];
    return [one];
  });
  return (rel) => tests.some((t) => t(rel));
}

/** memsnap's own bundles, never captured (snapshots are not captured in snapshots). */
export const BUNDLE = /\.memsnap$/;

/**
 * The files of LARGE_BYTES or more under `home` (the config's directory) that none of
 * `sources` covers, for snapshot's warning. One walk, lstat only; `.git` directories, a
 * whole-directory source's tree (a memdir, dump or store), `.memsnap` and `skip` (the store)
 * are not looked into; memsnap's own bundles (`*.memsnap`) are not reported.
 */
export async function uncoveredLargeFiles(
  home: string,
  sources: readonly CoverageSource[],
  skip: readonly string[] = [],
): Promise<{ path: string; bytes: number }[]> {
  const covered = coverage(home, sources);
  const wholeDirs = new Set(
    sources
      .filter((s) => WHOLE_DIR_KINDS.has(s.kind))
      .map((s) => resolve(home, (s.kind === "pfimg" ? s.store : s.path) ?? "\0")),
  );
  const skipped = new Set(skip.map((p) => resolve(p)));
  const out: { path: string; bytes: number }[] = [];
  const walk = async (dir: string, depth: number): Promise<void> => {
    const entries = await readdir(dir, { withFileTypes: true }).catch(() => []);
    for (const e of entries) {
      const p = join(dir, e.name);
      if (e.isDirectory()) {
        if (depth < 64 && e.name !== ".git" && e.name !== ".memsnap" && !wholeDirs.has(p) && !skipped.has(p))
          await walk(p, depth + 1);
      } else if (e.isFile()) {
        const s = await lstat(p).catch(() => null);
        if (!s || s.size < LARGE_BYTES || BUNDLE.test(e.name)) continue;
        const rel = relative(home, p).split("\\").join("/");
        if (!covered(rel)) out.push({ path: rel, bytes: s.size });
      }
    }
  };
  await walk(resolve(home), 0);
  return out.sort((a, b) => b.bytes - a.bytes || (a.path < b.path ? -1 : 1));
}
