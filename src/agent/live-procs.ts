/**
 * Processes that use the live files an in-place restore would replace (Linux, through /proc).
 *
 * A process that holds a live file open (or mapped) keeps writing to the copy the restore
 * renames away, and one whose working directory is inside a replaced directory works in the
 * old tree: either way what it does next is lost. An in-place restore refuses while any such
 * process runs (MEMSNAP_LOCKED, naming each), unless told to ignore them; `--dry-run` lists
 * them. What counts, per layer target:
 *   - `dir` (the whole root is replaced: git, kv): a file open or mapped under the root, or
 *     the root itself open, or a working directory at or under the root;
 *   - `files` (owned files swapped one by one: files, state, sqlite, trace): an owned file, or
 *     a companion of one (SQLite -wal/-shm/-journal), open or mapped.
 * memsnap's own process is left out, and so are processes whose /proc entries cannot be read
 * (another user's, without privileges), silently. Elsewhere than Linux nothing is found.
 */
import { readdirSync, readFileSync, readlinkSync, realpathSync } from "node:fs";
import { sep } from "node:path";
import { MemsnapError } from "../errors.js";
import type { LiveTarget } from "../sources/types.js";
import { listFiles } from "./live-files.js";

/** How a process uses a live path. */
export type LiveUse = "open" | "mapped" | "cwd";

export interface LiveProcess {
  pid: number;
  /** The command: /proc/<pid>/comm, and its command line when readable (at most 200 characters). */
  command: string;
  /** What it uses (each path once, at most 20 listed). */
  uses: Array<{ how: LiveUse; path: string }>;
}

interface Scope {
  root: string;
  mode: LiveTarget["mode"];
  owns: (rel: string) => boolean;
}

const MAX_USES = 20;

function realOrNull(p: string): string | null {
  try {
    return realpathSync(p);
  } catch {
    return null;
  }
}

async function scopeOf(t: LiveTarget): Promise<Scope | null> {
  const root = realOrNull(t.root);
  if (!root) return null;
  if (t.mode === "dir") return { root, mode: "dir", owns: () => true };
  const owns = t.owns ?? ((): boolean => true);
  let companions: Set<string> | null = null;
  if (t.companions) {
    companions = new Set();
    for (const rel of await listFiles(t.root)) if (owns(rel)) for (const c of t.companions(rel)) companions.add(c);
  }
  return { root, mode: "files", owns: (rel) => owns(rel) || (companions?.has(rel) ?? false) };
}

/** The live path `p` names, as a use of a scope, or false. */
function inScope(p: string, scopes: Scope[], how: LiveUse): boolean {
  for (const s of scopes) {
    if (p === s.root) {
      if (s.mode === "dir") return true;
      continue;
    }
    if (!p.startsWith(s.root === sep ? sep : s.root + sep)) continue;
    if (s.mode === "dir") return true;
    if (how !== "cwd" && s.owns(p.slice(s.root.length + 1))) return true;
  }
  return false;
}

function commandOf(pid: string): string {
  let comm = "";
  try {
    comm = readFileSync(`/proc/${pid}/comm`, "utf8").trim();
  } catch {
    /* gone */
  }
  let line = "";
  try {
    line = readFileSync(`/proc/${pid}/cmdline`)
      .toString("utf8")
      .replace(/\0+$/, "")
      .replace(/\0/g, " ")
      .replace(/[\x00-\x1f\x7f]/g, "?");
  } catch {
    /* gone */
  }
  if (line.length > 200) line = `${line.slice(0, 199)}…`;
  return line && comm ? `${comm} (${line})` : line || comm || "?";
}

/**
 * The processes (other than this one) that use what restoring `targets` in place replaces.
 * Processes whose /proc entries cannot be read are left out.
 */
export async function processesUsing(
  targets: readonly LiveTarget[],
  opts: { exclude?: ReadonlySet<number> } = {},
): Promise<LiveProcess[]> {
  if (process.platform !== "linux") return [];
  const scopes = (await Promise.all(targets.map(scopeOf))).filter((s): s is Scope => s !== null);
  if (!scopes.length) return [];
  let pids: string[];
  try {
    pids = readdirSync("/proc").filter((n) => /^[1-9][0-9]*$/.test(n));
  } catch {
    return [];
  }
  const out: LiveProcess[] = [];
  for (const pid of pids) {
    const n = Number(pid);
    if (n === process.pid || opts.exclude?.has(n)) continue;
    const uses: LiveProcess["uses"] = [];
    const seen = new Set<string>();
    const use = (how: LiveUse, p: string): void => {
      const key = `${how}\0${p}`;
      if (seen.has(key) || !inScope(p, scopes, how)) return;
      seen.add(key);
      if (uses.length < MAX_USES) uses.push({ how, path: p });
    };
    // Each read may fail: the process exited, or is another user's (EACCES): left out.
    try {
      use("cwd", readlinkSync(`/proc/${pid}/cwd`));
    } catch {
      /* unreadable */
    }
    let fds: string[] = [];
    try {
      fds = readdirSync(`/proc/${pid}/fd`);
    } catch {
      /* unreadable */
    }
    for (const fd of fds) {
      let p: string;
      try {
        p = readlinkSync(`/proc/${pid}/fd/${fd}`);
      } catch {
        continue;
      }
      // Sockets, pipes and anonymous inodes are not paths; a file already deleted is not live.
      if (p.startsWith("/") && !p.endsWith(" (deleted)")) use("open", p);
    }
    let maps = "";
    try {
      maps = readFileSync(`/proc/${pid}/maps`, "utf8");
    } catch {
      /* unreadable */
    }
    for (const line of maps.split("\n")) {
      // address perms offset dev inode pathname
      const m = /^\S+ \S+ \S+ \S+ \d+ +(\/.*)$/.exec(line);
      if (m && !m[1]!.endsWith(" (deleted)")) use("mapped", m[1]!);
    }
    if (uses.length) out.push({ pid: n, command: commandOf(pid), uses });
  }
  return out;
}

/** One line per process: `pid 123 node (node agent.js): open /a/db.sqlite, cwd /a/memdir`. */
export function describeProcess(p: LiveProcess): string {
  return `pid ${p.pid} ${p.command}: ${p.uses
    .map((u) => `${u.how === "cwd" ? "working directory" : u.how} ${u.path}`)
    .join(", ")}`;
}

/** MEMSNAP_LOCKED naming each process that uses a live file, or nothing when none does. */
export function refuseLiveProcesses(procs: readonly LiveProcess[]): void {
  if (!procs.length) return;
  const shown = procs.slice(0, 10).map(describeProcess);
  const more = procs.length > shown.length ? `; and ${procs.length - shown.length} more` : "";
  throw new MemsnapError(
    "MEMSNAP_LOCKED",
    `${procs.length} process${procs.length === 1 ? " uses" : "es use"} the live files this restore would replace, ` +
      `and would lose what ${procs.length === 1 ? "it writes" : "they write"} ` +
      `next: ${shown.join("; ")}${more}; nothing was changed`,
    {
      hint: "stop the agent first (a before_restore hook can do it), or pass --ignore-open-files to restore anyway",
    },
  );
}
