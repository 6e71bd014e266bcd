/**
 * `memsnap init`: look at an agent's home, find what it keeps its state in, and write a
 * commented memsnap.json. Detection is conservative: a git memdir is a directory with
 * `.git`; a SQLite database is a `*.db`/`*.sqlite`/`*.sqlite3` file that starts with the
 * SQLite magic; state is small JSON files outside any memdir. Nothing is captured here.
 */
import { open, readdir, stat } from "node:fs/promises";
import { basename, join, relative } from "node:path";
import { MemsnapError } from "./errors.js";
import { ID_PATTERN } from "./format/manifest.js";

const SQLITE_MAGIC = Buffer.from("SQLite format 3\0", "latin1");
const SKIP_DIRS = new Set(["node_modules", ".git", ".venv", "venv", "__pycache__", ".cache", "dist", "build"]);
const MAX_DEPTH = 4;
const STATE_MAX_BYTES = 1 << 20;

export interface DetectedSource {
  kind: "git" | "sqlite" | "state";
  name: string;
  /** Path relative to the agent home, POSIX separators ("." for the home itself). */
  path: string;
  include?: string[];
  note: string;
}

export interface Detection {
  home: string;
  sources: DetectedSource[];
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

function layerName(raw: string, taken: Set<string>): string {
  let base = raw.toLowerCase().replace(/\.[a-z0-9]+$/, "").replace(/[^a-z0-9_-]+/g, "-").replace(/^[-_]+|[-_]+$/g, "") || "layer";
  base = base.slice(0, 56);
  let name = base;
  for (let i = 2; taken.has(name); i++) name = `${base}-${i}`;
  taken.add(name);
  return name;
}

/** Find git memdirs, SQLite databases and JSON state under `home`. Throws MEMSNAP_SOURCE_MISSING. */
export async function detectAgent(home: string): Promise<Detection> {
  const st = await stat(home).catch(() => null);
  if (!st?.isDirectory()) {
    throw new MemsnapError("MEMSNAP_SOURCE_MISSING", `agent home ${home} is not a directory`, { path: home, hint: "pass the directory the agent keeps its memory in" });
  }
  const found: DetectedSource[] = [];
  const taken = new Set<string>();
  const rel = (p: string): string => relative(home, p).split("\\").join("/") || ".";
  const walk = async (dir: string, depth: number): Promise<void> => {
    const entries = await readdir(dir, { withFileTypes: true }).catch(() => []);
    entries.sort((a, b) => (a.name < b.name ? -1 : 1));
    if (entries.some((e) => e.name === ".git")) {
      found.push({ kind: "git", name: layerName(dir === home ? "memdir" : basename(dir), taken), path: rel(dir), note: "git memdir: history as a git bundle, plus uncommitted files" });
      return; // everything under a memdir is captured by the git source
    }
    const jsons: string[] = [];
    for (const e of entries) {
      const p = join(dir, e.name);
      if (e.isDirectory()) {
        if (depth < MAX_DEPTH && !SKIP_DIRS.has(e.name)) await walk(p, depth + 1);
      } else if (e.isFile()) {
        if (/\.(db|sqlite|sqlite3)$/i.test(e.name) && (await isSqlite(p))) {
          found.push({ kind: "sqlite", name: layerName(e.name, taken), path: rel(p), note: "SQLite database: one committed state under live writers (the file under a read transaction, or a copy with the WAL folded in)" });
        } else if (/\.json$/i.test(e.name) && e.name !== "memsnap.json" && e.name !== "package.json" && e.name !== "package-lock.json") {
          const s = await stat(p).catch(() => null);
          if (s && s.size <= STATE_MAX_BYTES) jsons.push(e.name);
        }
      }
    }
    if (jsons.length) {
      found.push({
        kind: "state", name: layerName(dir === home ? "state" : basename(dir), taken), path: rel(dir), include: jsons.map((j) => `/${j}`),
        note: `JSON state (${jsons.length} file${jsons.length > 1 ? "s" : ""}), validated as JSON`,
      });
    }
  };
  await walk(home, 0);
  return { home, sources: found };
}

/** Render a commented memsnap.json for a detection. Throws MEMSNAP_USAGE for a bad agent/tenant id or when nothing was found. */
export function renderConfig(d: Detection, opts: { agent: string; tenant: string; recipients?: string[] }): string {
  for (const [k, v] of [["agent", opts.agent], ["tenant", opts.tenant]] as const) {
    if (!ID_PATTERN.test(v)) throw new MemsnapError("MEMSNAP_USAGE", `${k} must match [a-z0-9_-]{1,64}, got ${JSON.stringify(v)}`, { hint: `pass --${k} NAME` });
  }
  if (d.sources.length === 0) {
    throw new MemsnapError("MEMSNAP_SOURCE_MISSING", `found no git memdir, SQLite database or JSON state under ${d.home}`, {
      path: d.home, hint: "point init at the agent's home, or write memsnap.json by hand (see README)",
    });
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
    const obj: Record<string, unknown> = { kind: s.kind, name: s.name, path: s.path };
    if (s.include) obj.include = s.include;
    lines.push(`    ${JSON.stringify(obj).replace(/,"/g, ', "').replace(/":/g, '": ')}${i < d.sources.length - 1 ? "," : ""}`);
  });
  lines.push("  ]", "}", "");
  return lines.join("\n");
}
