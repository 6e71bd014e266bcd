/**
 * Init's accounting: after detection, every byte under the home is accounted for (one more
 * walk, lstat only). A directory below the home whose files no source takes come to
 * LARGE_BYTES (1 MiB) or more becomes a `files` source (the topmost such directory, less the
 * sources under it; a state source in it gives way, so a dump of binary files and a
 * `manifest.json` that is not a paged KV dump is not taken as JSON state), as does each such
 * file of 1 MiB or more at the home's top; the rest is `left_out`, per directory and reason,
 * with its size, and `coverage` says how many bytes the config captures of how many
 * (memsnap's own `.memsnap` and `memsnap.json` are not counted).
 */
import { lstat, readdir } from "node:fs/promises";
import { basename, join, relative } from "node:path";
import { BUNDLE, coverage, LARGE_BYTES, WHOLE_DIR_KINDS, type CoverageSource } from "./coverage.js";
import { fmtMiB } from "./render.js";
import type { DetectedSource, Detection, LeftOut } from "./types.js";

/** Directories not looked into (dependencies, caches, build output, memsnap's own). */
export const SKIP_DIRS = new Set([
  "node_modules",
  ".git",
  ".venv",
  "venv",
  "__pycache__",
  ".cache",
  "dist",
  "build",
  ".memsnap",
]);

interface WalkedFile {
  rel: string;
  bytes: number;
}

/** Every regular file under `dir` (lstat only), and the symlinks and special files met. */
async function allFiles(
  dir: string,
  home: string,
  out: { files: WalkedFile[]; links: WalkedFile[]; skipped: Map<string, WalkedFile[]> },
  skipTop: string | null,
): Promise<void> {
  const entries = await readdir(dir, { withFileTypes: true }).catch(() => []);
  for (const e of entries) {
    const p = join(dir, e.name);
    const rel = relative(home, p).split("\\").join("/");
    if (dir === home && (e.name === ".memsnap" || e.name === "memsnap.json")) continue; // memsnap's own
    if (e.isDirectory()) {
      // a skipped directory (node_modules, caches…) is left out whole, its size counted
      const top = skipTop ?? (SKIP_DIRS.has(e.name) && e.name !== ".git" ? rel : null);
      if (top && !out.skipped.has(top)) out.skipped.set(top, []);
      await allFiles(p, home, out, top);
    } else if (e.isFile()) {
      const s = await lstat(p).catch(() => null);
      if (!s) continue;
      (skipTop ? out.skipped.get(skipTop)! : out.files).push({ rel, bytes: s.size });
    } else if (!skipTop) {
      out.links.push({ rel, bytes: 0 });
    }
  }
}

const REASON_SMALL = `not recognised as agent state, and under ${LARGE_BYTES >> 20} MiB in its directory`;
const REASON_SKIPPED = "not looked into (dependencies, caches, build output)";
const REASON_BUNDLE = "a memsnap bundle (snapshots are not captured in snapshots)";
const REASON_LINK = "a symlink or special file (memsnap captures regular files)";

/** A detected source as coverage sees it. */
function asCoverage(s: DetectedSource): CoverageSource {
  return {
    kind: s.kind,
    path: s.path,
    ...(s.extra?.store ? { store: s.extra.store } : {}),
    include: s.include,
    exclude: s.exclude,
  };
}

/**
 * Account for every byte under `home`: a directory (below the home) whose uncovered files come
 * to LARGE_BYTES or more becomes a `files` source (the topmost such directory, less the other
 * sources under it; a state source in it is dropped, the files source takes its JSON too), as
 * does each uncovered file of LARGE_BYTES or more at the home's top level; the rest is left out,
 * with its reason. Mutates `found`.
 */
export async function account(
  home: string,
  found: DetectedSource[],
): Promise<Pick<Detection, "left_out" | "coverage">> {
  const w = { files: [] as WalkedFile[], links: [] as WalkedFile[], skipped: new Map<string, WalkedFile[]>() };
  await allFiles(home, home, w, null);
  const covered0 = coverage(home, found.map(asCoverage));
  // memsnap's bundles (--out under the home, a store) are left out: snapshots are not captured in snapshots
  const bundles = w.files.filter((f) => BUNDLE.test(f.rel) && !covered0(f.rel));
  w.files = w.files.filter((f) => !bundles.includes(f));
  const uncovered = w.files.filter((f) => !covered0(f.rel));
  // uncovered bytes per directory, recursive (home excluded)
  const perDir = new Map<string, number>();
  for (const f of uncovered) {
    const parts = f.rel.split("/");
    for (let i = 1; i < parts.length; i++) {
      const d = parts.slice(0, i).join("/");
      perDir.set(d, (perDir.get(d) ?? 0) + f.bytes);
    }
  }
  const large = [...perDir]
    .filter(([, b]) => b >= LARGE_BYTES)
    .map(([d]) => d)
    .sort();
  const tops = large.filter((d) => !large.some((o) => d.startsWith(`${o}/`)));
  const inside = (p: string, d: string): boolean => p === d || p.startsWith(`${d}/`);
  for (const d of tops) {
    // a state source at or under it is the files source's now
    for (let i = found.length - 1; i >= 0; i--)
      if (found[i]!.kind === "state" && inside(found[i]!.path, d)) found.splice(i, 1);
    const exclude: string[] = [];
    for (const s of found) {
      const root = s.kind === "pfimg" ? s.extra!.store! : s.path;
      if (root !== "." && inside(root, d) && root !== d) {
        const sub = root.slice(d.length + 1);
        if (WHOLE_DIR_KINDS.has(s.kind)) exclude.push(`/${sub}/`);
        else if (s.kind === "sqlite") exclude.push(`/${sub}{,-wal,-shm,-journal}`);
        else for (const g of s.include ?? ["**"]) exclude.push(`/${sub}/${g.replace(/^\//, "")}`);
      } else if ((s.kind === "files" || s.kind === "trace") && (root === "." || inside(d, root))) {
        // a notes/logs/traces source above it keeps its files
        exclude.push(...(s.include ?? []));
      }
    }
    found.push({
      kind: "files",
      name: basename(d),
      path: d,
      ...(exclude.length ? { exclude } : {}),
      note:
        `not recognised, ${fmtMiB(perDir.get(d)!)} of other files: captured byte for byte, ` +
        "so nothing large is left out (exclude what you do not want)",
    });
  }
  const rootLarge = uncovered.filter((f) => !f.rel.includes("/") && f.bytes >= LARGE_BYTES).map((f) => `/${f.rel}`);
  if (rootLarge.length) {
    found.push({
      kind: "files",
      name: "home-files",
      path: ".",
      include: rootLarge,
      note:
        `large files at the top of the home (${LARGE_BYTES >> 20} MiB or more each), ` +
        "not recognised: captured byte for byte",
    });
  }
  const covered = coverage(home, found.map(asCoverage));
  const small = w.files.filter((f) => !covered(f.rel));
  const left: LeftOut[] = [];
  const group = (files: WalkedFile[], reason: string): void => {
    const byDir = new Map<string, WalkedFile[]>();
    for (const f of files) {
      const d = f.rel.includes("/") ? f.rel.slice(0, f.rel.lastIndexOf("/")) : ".";
      byDir.set(d, [...(byDir.get(d) ?? []), f]);
    }
    for (const [d, fs] of byDir) {
      left.push(
        fs.length === 1
          ? { path: fs[0]!.rel, bytes: fs[0]!.bytes, files: 1, reason }
          : { path: `${d}/`, bytes: fs.reduce((a, f) => a + f.bytes, 0), files: fs.length, reason },
      );
    }
  };
  group(small, REASON_SMALL);
  group(w.links, REASON_LINK);
  group(bundles, REASON_BUNDLE);
  for (const [d, fs] of w.skipped)
    left.push({ path: `${d}/`, bytes: fs.reduce((a, f) => a + f.bytes, 0), files: fs.length, reason: REASON_SKIPPED });
  left.sort((a, b) => b.bytes - a.bytes || (a.path < b.path ? -1 : 1));
  const total =
    [...w.files, ...bundles].reduce((a, f) => a + f.bytes, 0) +
    [...w.skipped.values()].flat().reduce((a, f) => a + f.bytes, 0);
  const leftBytes = left.reduce((a, l) => a + l.bytes, 0);
  return { left_out: left, coverage: { captured_bytes: total - leftBytes, total_bytes: total } };
}
