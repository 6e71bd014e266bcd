/**
 * `memsnap init`: look at an agent's home, find what it keeps its state in, and write a
 * commented memsnap.json. Nothing is captured here. Detection is conservative, by layout and
 * magic, never by guessing at content:
 * - a git memdir is a directory with `.git`;
 * - a KV dump (memsnap format) is a directory with `kv-manifest.json`; a paged KV dump of another
 *   engine, a directory with a `manifest.json` giving `page_bytes` and binary files beside it that
 *   are each a whole number of such pages (`layer_NN.kvpages`), is a kv source of format `paged`;
 * - a ProcessFork store is a directory with `images/` and `blobs/sha256/`;
 * - a CRIU dump is a directory with `inventory.img`;
 * - a SQLite database is a `*.db`/`*.sqlite`/`*.sqlite3` file that starts with the SQLite magic;
 * - state is small JSON files (each directory's, listed by name);
 * - notes (`*.md`), JSONL logs (`*.jsonl`, `*.ndjson`) and agentlog traces (`*.agentlog`) are
 *   taken from the topmost directory that holds such files, with everything below it, less
 *   the directories above (a memdir's notes are the git layer's, not a second copy).
 * Everything under a memdir, dump or store belongs to that source; `node_modules`, caches,
 * build output and memsnap's own `.memsnap` directory are not looked into.
 *
 * Then every byte under the home is accounted for (one more walk, lstat only): a directory
 * below the home whose files no source takes come to LARGE_BYTES (1 MiB) or more becomes a
 * `files` source (the topmost such directory, less the sources under it; a state source in it
 * gives way, so a dump of binary files and a `manifest.json` that is not a paged KV dump is not
 * taken as JSON state), as does each such file of 1 MiB or more at the home's top; the rest is
 * `left_out`, per directory and reason, with its size, and `coverage` says how many bytes the
 * config captures of how many (memsnap's own `.memsnap` and `memsnap.json` are not counted).
 */
import { lstat, open, readdir, stat } from "node:fs/promises";
import { basename, isAbsolute, join, relative, resolve } from "node:path";
import { MemsnapError } from "./errors.js";
import { ID_PATTERN } from "./format/manifest.js";
import { pagedDumpAt } from "./sources/kv/detect.js";
import { selector } from "./sources/walk.js";

const SQLITE_MAGIC = Buffer.from("SQLite format 3\0", "latin1");
const SKIP_DIRS = new Set([
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
const MAX_DEPTH = 4;
const STATE_MAX_BYTES = 1 << 20;

export interface DetectedSource {
  kind: "git" | "sqlite" | "state" | "files" | "trace" | "kv" | "pfimg" | "criu";
  name: string;
  /** Path relative to the agent home, POSIX separators ("." for the home itself). */
  path: string;
  include?: string[];
  exclude?: string[];
  /** A `files` source's append-only logs (globs), captured up to their last complete line. */
  append?: string[];
  /** The config keys other than kind, name, path, include and exclude (`format`, `store`). */
  extra?: Record<string, string>;
  note: string;
}

/** Files init left out of every source, aggregated per directory and reason. */
export interface LeftOut {
  /** Relative path: a file, or a directory (ending in `/`) when several files in it share the reason. */
  path: string;
  bytes: number;
  files: number;
  reason: string;
}

export interface Detection {
  home: string;
  sources: DetectedSource[];
  /** What no source covers (memsnap's own `.memsnap` and `memsnap.json` are not counted). */
  left_out: LeftOut[];
  coverage: { captured_bytes: number; total_bytes: number };
}

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

const WHOLE_DIR_KINDS = new Set(["git", "kv", "criu", "pfimg"]);

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

async function isSqlite(path: string): Promise<boolean> {
  const fh = await open(path, "r").catch(() => null);
  if (!fh) return false;
  try {
    const buf = Buffer.alloc(16);
    const { bytesRead } = await fh.read(buf, 0, 16, 0);
    return bytesRead === 16 && buf.equals(SQLITE_MAGIC);
  } finally {
    await fh.close();
  }
}

/** A unique layer name from `raw`; when taken, `<base>-<kindSuffix>` is tried before `<base>-2`, `-3`, … */
function layerName(raw: string, taken: Set<string>, kindSuffix?: string): string {
  let base =
    raw
      .toLowerCase()
      .replace(/\.[a-z0-9]+$/, "")
      .replace(/[^a-z0-9_-]+/g, "-")
      .replace(/^[-_]+|[-_]+$/g, "") || "layer";
  base = base.slice(0, 56);
  let name = base;
  if (taken.has(name) && kindSuffix) name = `${base}-${kindSuffix}`;
  for (let i = 2; taken.has(name); i++) name = `${base}-${i}`;
  taken.add(name);
  return name;
}

/** Files taken from the topmost directory that holds them, with everything below it. */
const FILE_GROUPS = [
  {
    ext: /\.md$/i,
    include: ["**/*.md"],
    kind: "files" as const,
    home: "notes",
    note: "Markdown notes, byte for byte (secrets redacted in the bundle)",
  },
  {
    ext: /\.(jsonl|ndjson)$/i,
    include: ["**/*.jsonl", "**/*.ndjson"],
    append: ["**/*.jsonl", "**/*.ndjson"],
    kind: "files" as const,
    home: "logs",
    note:
      "JSONL logs, redacted value by value; " +
      "append-only: captured up to the last complete line, so a writer may go on appending",
  },
  {
    ext: /\.agentlog$/i,
    include: ["**/*.agentlog"],
    kind: "trace" as const,
    home: "traces",
    note: "agentlog traces: every record validated; a redacted record is re-sealed",
  },
];

/** What one directory is, if it is a whole source of its own. */
async function specialDir(
  dir: string,
  names: Set<string>,
): Promise<Pick<DetectedSource, "kind" | "extra" | "note"> | null> {
  if (names.has(".git")) return { kind: "git", note: "git memdir: history as a git bundle, plus uncommitted files" };
  if (names.has("kv-manifest.json")) {
    return {
      kind: "kv",
      extra: { format: "memsnap" },
      note: "KV-cache page dump: each distinct page stored once, zero pages as flags",
    };
  }
  if (names.has("inventory.img")) {
    return {
      kind: "criu",
      note:
        "CRIU process dump: process memory, which cannot be redacted " +
        "(snapshots of it must be encrypted: name recipients)",
    };
  }
  if (
    names.has("images") &&
    names.has("blobs") &&
    (await stat(join(dir, "blobs", "sha256")).then(
      (s) => s.isDirectory(),
      () => false,
    ))
  ) {
    return { kind: "pfimg", note: "ProcessFork image store: every image's manifest and blobs" };
  }
  if (names.has("manifest.json")) {
    const pageBytes = await pagedDumpAt(dir);
    if (pageBytes !== null) {
      return {
        kind: "kv",
        extra: { format: "paged" },
        note:
          `paged KV dump (manifest.json: ${fmtMiB(pageBytes)} pages): ` +
          "each distinct page stored once, zero pages as flags",
      };
    }
  }
  return null;
}

/** Find what an agent keeps its state in under `home` (see the module comment). Throws MEMSNAP_SOURCE_MISSING. */
export async function detectAgent(home: string): Promise<Detection> {
  const st = await stat(home).catch(() => null);
  if (!st?.isDirectory()) {
    throw new MemsnapError("MEMSNAP_SOURCE_MISSING", `agent home ${home} is not a directory`, {
      path: home,
      hint: "pass the directory the agent keeps its memory in",
    });
  }
  // Each source is found with the name it would like (its directory's or file's); names are
  // made unique at the end.
  const found: DetectedSource[] = [];
  const rel = (p: string): string => relative(home, p).split("\\").join("/") || ".";
  /** Directories that are a source of their own (below them, nothing else is looked for). */
  const specials: string[] = [];
  /** Per file group, the directories that hold such files themselves. */
  const holders: Set<string>[] = FILE_GROUPS.map(() => new Set<string>());
  const walk = async (dir: string, depth: number): Promise<void> => {
    const entries = await readdir(dir, { withFileTypes: true }).catch(() => []);
    entries.sort((a, b) => (a.name < b.name ? -1 : 1));
    const special = await specialDir(dir, new Set(entries.map((e) => e.name)));
    if (special) {
      const name = dir === home ? (special.kind === "git" ? "memdir" : special.kind) : basename(dir);
      // a ProcessFork store is named by `store`, the others by `path`
      found.push(
        special.kind === "pfimg"
          ? { kind: "pfimg", name, path: rel(dir), extra: { store: rel(dir) }, note: special.note }
          : { ...special, name, path: rel(dir) },
      );
      specials.push(dir);
      return;
    }
    const jsons: string[] = [];
    for (const e of entries) {
      const p = join(dir, e.name);
      if (e.isDirectory()) {
        if (depth < MAX_DEPTH && !SKIP_DIRS.has(e.name)) await walk(p, depth + 1);
      } else if (e.isFile()) {
        if (/\.(db|sqlite|sqlite3)$/i.test(e.name) && (await isSqlite(p))) {
          found.push({
            kind: "sqlite",
            name: e.name,
            path: rel(p),
            note:
              "SQLite database: one committed state under live writers " +
              "(the file under a read transaction, or a copy with the WAL folded in)",
          });
        } else if (
          /\.json$/i.test(e.name) &&
          e.name !== "memsnap.json" &&
          e.name !== "package.json" &&
          e.name !== "package-lock.json"
        ) {
          const s = await stat(p).catch(() => null);
          if (s && s.size <= STATE_MAX_BYTES) jsons.push(e.name);
        }
        FILE_GROUPS.forEach((g, i) => {
          if (g.ext.test(e.name)) holders[i]!.add(dir);
        });
      }
    }
    if (jsons.length) {
      found.push({
        kind: "state",
        name: dir === home ? "state" : basename(dir),
        path: rel(dir),
        include: jsons.map((j) => `/${j}`),
        note: `JSON state (${jsons.length} file${jsons.length > 1 ? "s" : ""}), validated as JSON`,
      });
    }
  };
  await walk(home, 0);
  const under = (d: string, top: string): boolean => d !== top && (top === home || d.startsWith(`${top}/`));
  FILE_GROUPS.forEach((g, i) => {
    const dirs = [...holders[i]!].sort();
    for (const top of dirs.filter((d) => !dirs.some((o) => under(d, o)))) {
      const exclude = specials.filter((s) => under(s, top)).map((s) => `/${relative(top, s).split("\\").join("/")}/`);
      found.push({
        kind: g.kind,
        name: top === home ? g.home : basename(top),
        path: rel(top),
        include: g.include,
        ...(exclude.length ? { exclude } : {}),
        ...("append" in g ? { append: g.append } : {}),
        note: g.note,
      });
    }
  });
  const leftOut = await account(home, found);
  // A memdir, dump, store or notes directory keeps its own name before a database or state
  // file of the same stem takes it: for memory/ (git) and db/memory.db, "memory" and
  // "memory-db", not "memory-2" for the memdir.
  const taken = new Set<string>();
  const order = found
    .map((_, i) => i)
    .sort((a, b) => NAME_PRIORITY[found[a]!.kind] - NAME_PRIORITY[found[b]!.kind] || a - b);
  for (const i of order)
    found[i]!.name = layerName(found[i]!.name, taken, found[i]!.kind === "sqlite" ? "db" : undefined);
  return { home, sources: found, ...leftOut };
}

const REASON_SMALL = `not recognised as agent state, and under ${LARGE_BYTES >> 20} MiB in its directory`;
const REASON_SKIPPED = "not looked into (dependencies, caches, build output)";
const REASON_BUNDLE = "a memsnap bundle (snapshots are not captured in snapshots)";
const BUNDLE = /\.memsnap$/;
const REASON_LINK = "a symlink or special file (memsnap captures regular files)";

/**
 * Account for every byte under `home`: a directory (below the home) whose uncovered files come
 * to LARGE_BYTES or more becomes a `files` source (the topmost such directory, less the other
 * sources under it; a state source in it is dropped, the files source takes its JSON too), as
 * does each uncovered file of LARGE_BYTES or more at the home's top level; the rest is left out,
 * with its reason. Mutates `found`.
 */
function asCoverage(s: DetectedSource): CoverageSource {
  return {
    kind: s.kind,
    path: s.path,
    ...(s.extra?.store ? { store: s.extra.store } : {}),
    include: s.include,
    exclude: s.exclude,
  };
}

async function account(home: string, found: DetectedSource[]): Promise<Pick<Detection, "left_out" | "coverage">> {
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

/** Bytes in binary units, for init's text ("861 MiB"). */
export function fmtMiB(n: number): string {
  if (n < 1024) return `${n} B`;
  const units = ["KiB", "MiB", "GiB", "TiB"];
  let v = n / 1024;
  let i = 0;
  while (v >= 1024 && i < units.length - 1) {
    v /= 1024;
    i++;
  }
  return `${v < 10 ? v.toFixed(1) : Math.round(v)} ${units[i]}`;
}

/** Who keeps a contested name: directory-shaped sources first, then state, then database files. */
const NAME_PRIORITY: Record<DetectedSource["kind"], number> = {
  git: 0,
  kv: 1,
  pfimg: 1,
  criu: 1,
  files: 2,
  trace: 2,
  state: 3,
  sqlite: 4,
};

/**
 * Render a commented memsnap.json for a detection. Throws MEMSNAP_USAGE for a bad agent/tenant id or when nothing was
 * found.
 */
export function renderConfig(d: Detection, opts: { agent: string; tenant: string; recipients?: string[] }): string {
  for (const [k, v] of [
    ["agent", opts.agent],
    ["tenant", opts.tenant],
  ] as const) {
    if (!ID_PATTERN.test(v))
      throw new MemsnapError("MEMSNAP_USAGE", `${k} must match [a-z0-9_-]{1,64}, got ${JSON.stringify(v)}`, {
        hint: `pass --${k} NAME`,
      });
  }
  if (d.sources.length === 0) {
    throw new MemsnapError(
      "MEMSNAP_SOURCE_MISSING",
      `found no memdir, database, state, notes, logs, traces or runtime dump under ${d.home}`,
      {
        path: d.home,
        hint: "point init at the agent's home, or write memsnap.json by hand (see README)",
      },
    );
  }
  const lines: string[] = [
    "// memsnap.json, written by `memsnap init`. JSON with comments; unknown keys are errors.",
    "// Edit freely: see the README's Configuration section for every key.",
    "{",
    `  "tenant": ${JSON.stringify(opts.tenant)},`,
    `  "agent": ${JSON.stringify(opts.agent)},`,
    "  // Encrypt every snapshot to these age recipients (memsnap keygen -o key.txt prints one).",
    `  "recipients": ${JSON.stringify(opts.recipients ?? [])},`,
    "  // Secrets in text artifacts are replaced by [REDACTED:<rule>] in the bundle; live files are untouched.",
    '  "redaction": { "enabled": true, "allow": [] },',
    '  "compression": { "level": 3 },',
    '  "sources": [',
  ];
  d.sources.forEach((s, i) => {
    lines.push(`    // ${s.note}`);
    const obj: Record<string, unknown> =
      s.kind === "pfimg" ? { kind: s.kind, name: s.name } : { kind: s.kind, name: s.name, path: s.path };
    if (s.extra) Object.assign(obj, s.extra);
    if (s.include) obj.include = s.include;
    if (s.exclude) obj.exclude = s.exclude;
    if (s.append) obj.append = s.append;
    lines.push(
      `    ${JSON.stringify(obj).replace(/,"/g, ', "').replace(/":/g, '": ')}${i < d.sources.length - 1 ? "," : ""}`,
    );
  });
  lines.push("  ]", "}", "");
  return lines.join("\n");
}

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
