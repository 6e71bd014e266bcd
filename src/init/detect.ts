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
 * Then every byte under the home is accounted for (./account.ts); the config is written by
 * ./render.ts.
 */
import { open, readdir, stat } from "node:fs/promises";
import { basename, join, relative } from "node:path";
import { MemsnapError } from "../errors.js";
import { pagedDumpAt } from "../sources/kv/detect.js";
import { account, SKIP_DIRS } from "./account.js";
import { fmtMiB } from "./render.js";
import type { DetectedSource, Detection } from "./types.js";

const SQLITE_MAGIC = Buffer.from("SQLite format 3\0", "latin1");
const MAX_DEPTH = 4;
const STATE_MAX_BYTES = 1 << 20;

/** Whether the file starts with the SQLite magic. */
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
  // A git memdir first: layers are packed in the config's order, and a restore rebuilds a layer
  // (for git: fetch its bundle, check out the tree) while the layers after it are still being
  // extracted. Measured on the realistic home of #38 (restore --to, 2 runs each): git fifth,
  // after the KV dump, 5.96-6.02 s, its rebuild the last 2 s alone; git first 4.23-5.18 s. The
  // snapshot took as long (5.27-6.05 against 5.01-6.43 s, 3 runs each) and peaked at 192-195 MiB
  // against 178 (GNU time %M): the history scan now runs beside the SQLite layers.
  const sources = [...found.filter((f) => f.kind === "git"), ...found.filter((f) => f.kind !== "git")];
  return { home, sources, ...leftOut };
}
