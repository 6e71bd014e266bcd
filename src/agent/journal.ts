/**
 * The restore journal: the list of renames that turn the staged state into the live state.
 *
 * Phases: `staging` (the live state is untouched; staging dirs may exist) → `swapping` (every
 * staged path is complete and hash-checked; renames may be half done) → `committed` (the live
 * state is the bundle's; only cleanup is left). Each swap is idempotent and its progress is
 * read back from the file system (a rename either happened or not), so `recover` after a
 * crash at any point finishes the restore (from `swapping` on) or rolls it back (`staging`):
 * the live state ends equal to the pre-restore state or to the bundle's, never a mix.
 */
import { hostname } from "node:os";
import { lstatSync, readdirSync, renameSync, rmSync } from "node:fs";
import { mkdir, open, readFile, rename, unlink } from "node:fs/promises";
import { basename, dirname, join } from "node:path";
import type { MemsnapConfig } from "../config.js";
import { MemsnapError } from "../errors.js";
import { crashPoint } from "../util/crash-point.js";
import { fsyncDir } from "../util/fs-atomic.js";
import {
  admits,
  configRoots,
  ensureParents,
  lstatOrNull,
  parentProblem,
  plainAbsolute,
  plainRelative,
  Protected,
  under,
  type LiveRoot,
  type PathProblem,
} from "./live-guard.js";
import { controlDir } from "./lock.js";

export interface Swap {
  layer: string;
  /** Live path replaced (a file, or a whole directory). */
  target: string;
  /** Staged replacement; null means "remove the target". */
  staged: string | null;
  /** Where the old target is moved; deleted after commit. */
  backup: string;
}

/** A swap whose paths were matched to a live root of the config and memsnap's own naming. */
export interface CheckedSwap extends Swap {
  /** The live root, and the layer's staging and backup directories beside it. */
  root: string;
  stagedRoot: string;
  backupRoot: string;
  /** The target relative to the root ("" for a whole-directory swap). */
  rel: string;
}

export interface Journal {
  version: 1;
  op: "restore";
  snapshot_id: string;
  bundle: string;
  pid: number;
  host: string;
  started_at: string;
  phase: "staging" | "swapping" | "committed";
  /** Directories created for staging (removed on rollback and after commit). */
  staging: string[];
  /** Directories holding backups (removed after commit). */
  backups: string[];
  swaps: Swap[];
}

/** The tag and index memsnap puts in a staging or backup name: `<root>.memsnap-new-<12 of [0-9a-z]>-<k>`. */
const TAG = /^[0-9a-z]{12}-\d{1,6}$/;

export function stagingName(root: string, tag: string, k: number): string {
  return `${root}.memsnap-new-${tag}-${k}`;
}

export function backupName(root: string, tag: string, k: number): string {
  return `${root}.memsnap-old-${tag}-${k}`;
}

export function journalPath(agentBase: string): string {
  return join(controlDir(agentBase), "journal.json");
}

/** Write the journal atomically and durably. */
export async function writeJournal(agentBase: string, j: Journal): Promise<void> {
  const path = journalPath(agentBase);
  await mkdir(dirname(path), { recursive: true, mode: 0o700 });
  const tmp = `${path}.tmp-${process.pid}`;
  const fh = await open(tmp, "w", 0o600);
  try {
    await fh.writeFile(JSON.stringify(j, null, 1));
    await fh.sync();
  } finally {
    await fh.close();
  }
  await rename(tmp, path);
  await fsyncDir(dirname(path));
}

const INSPECT_HINT =
  "nothing was changed. Inspect .memsnap/journal.json (was it written by hand, or was the config changed since the " +
  "restore was interrupted?): " +
  "the *.memsnap-old-* directories beside your data hold the pre-restore state; put back by hand what you need, " +
  "then remove the journal";

function untrusted(agentBase: string, why: string, path?: string): MemsnapError {
  return new MemsnapError("MEMSNAP_JOURNAL_UNTRUSTED", `restore journal ${journalPath(agentBase)} refused: ${why}`, {
    hint: INSPECT_HINT,
    ...(path ? { path } : {}),
  });
}

/**
 * The pending journal of an agent as written (not yet checked against a config), or null. Throws
 * MEMSNAP_JOURNAL_UNTRUSTED when it does not parse.
 */
export async function readJournal(agentBase: string): Promise<Journal | null> {
  let text: string;
  try {
    text = await readFile(journalPath(agentBase), "utf8");
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code === "ENOENT") return null;
    throw e;
  }
  try {
    const j = JSON.parse(text) as Journal;
    if (j === null || typeof j !== "object" || j.version !== 1 || !Array.isArray(j.swaps))
      throw new Error("unknown journal version");
    return j;
  } catch (e) {
    throw untrusted(agentBase, `unreadable: ${(e as Error).message}`);
  }
}

function exists(p: string): boolean {
  try {
    lstatSync(p);
    return true;
  } catch {
    return false;
  }
}

/** Where a journal's paths are accepted: the config's live roots, and the paths no restore writes. */
export interface JournalScope {
  roots: LiveRoot[];
  protect: Protected;
}

export async function journalScope(config: MemsnapConfig, extra: LiveRoot[] = []): Promise<JournalScope> {
  return { roots: [...(await configRoots(config)), ...extra], protect: new Protected(config) };
}

/** How a check reports a problem: `live` for one found in the file system (a symlink, a directory in the way). */
export type JournalFail = (why: string, path: string | undefined, live: boolean) => MemsnapError;

/**
 * Check a journal against the config before anything is done with it: every staging and backup
 * directory is memsnap's name beside a live root of the config; every swap is a live root (a
 * `dir` target) or a file its source owns under it (a `files` target), with the staged and
 * backup paths memsnap derives for it, touching neither the config nor the control dir; and,
 * in the file system, no directory on the way is a symlink or a file. Throws `fail(…)` on the
 * first problem; returns the swaps with their roots.
 */
export function checkJournal(j: Journal, scope: JournalScope, fail: JournalFail): CheckedSwap[] {
  if (j.op !== "restore" || !["staging", "swapping", "committed"].includes(j.phase))
    throw fail(`unknown op or phase ${JSON.stringify(j.phase)}`, undefined, false);
  if (!Array.isArray(j.staging) || !Array.isArray(j.backups)) throw fail("no staging or backup list", undefined, false);
  const named = (p: unknown, kind: "new" | "old"): boolean =>
    plainAbsolute(p) &&
    scope.roots.some(
      (r) => p.startsWith(`${r.root}.memsnap-${kind}-`) && TAG.test(p.slice(`${r.root}.memsnap-${kind}-`.length)),
    ) &&
    !scope.protect.covers(p, p);
  for (const p of j.staging)
    if (!named(p, "new"))
      throw fail(
        `staging entry ${JSON.stringify(p)} is not a memsnap staging directory beside a live root of this config`,
        String(p),
        false,
      );
  for (const p of j.backups)
    if (!named(p, "old"))
      throw fail(
        `backup entry ${JSON.stringify(p)} is not a memsnap backup directory beside a live root of this config`,
        String(p),
        false,
      );
  if (j.phase === "staging" && j.swaps.length) throw fail("swaps listed before the swap phase", undefined, false);
  const staging = new Set(j.staging);
  const backups = new Set(j.backups);
  const seen = new Set<string>();
  const out: CheckedSwap[] = [];
  for (const s of j.swaps) {
    if (
      s === null ||
      typeof s !== "object" ||
      typeof s.layer !== "string" ||
      !plainAbsolute(s.target) ||
      !plainAbsolute(s.backup) ||
      (s.staged !== null && !plainAbsolute(s.staged))
    ) {
      throw fail(`malformed swap ${JSON.stringify(s)}`, undefined, false);
    }
    let match: CheckedSwap | null = null;
    for (const r of scope.roots) {
      if (r.layer !== s.layer) continue;
      let rel = "";
      if (r.mode === "files") {
        if (!under(s.target, r.root) || s.target === r.root) continue;
        rel = s.target.slice(r.root.endsWith("/") ? r.root.length : r.root.length + 1);
        if (!plainRelative(rel) || !admits(r, rel)) continue;
      } else if (s.target !== r.root || scope.protect.inside(r.root)) continue;
      const prefix = `${r.root}.memsnap-old-`;
      if (!s.backup.startsWith(prefix)) continue;
      const tag = s.backup.slice(prefix.length).split("/")[0]!;
      if (!TAG.test(tag)) continue;
      const stagedRoot = `${r.root}.memsnap-new-${tag}`;
      const backupRoot = `${prefix}${tag}`;
      if (join(backupRoot, rel) !== s.backup || (s.staged !== null && join(stagedRoot, rel) !== s.staged)) continue;
      if (!staging.has(stagedRoot) || !backups.has(backupRoot)) continue;
      if (scope.protect.covers(s.target, join(r.realRoot, rel))) continue;
      match = {
        layer: s.layer,
        target: s.target,
        staged: s.staged,
        backup: s.backup,
        root: r.root,
        stagedRoot,
        backupRoot,
        rel,
      };
      break;
    }
    if (!match) {
      throw fail(
        `swap of ${s.target} (layer ${s.layer}) is not one an in-place restore of this config makes`,
        s.target,
        false,
      );
    }
    out.push(match);
    // In the file system: nothing on the way is a link or a file; what is swapped is a file (or the whole root).
    // (A whole-directory swap renames the root and its staging and backup names themselves: no directory on the way but
    // the config's.)
    if (match.rel !== "") {
      const problem: PathProblem | null =
        parentProblem(match.root, match.rel, true, seen) ??
        parentProblem(match.backupRoot, match.rel, false, seen) ??
        (match.staged !== null ? parentProblem(match.stagedRoot, match.rel, false, seen) : null);
      if (problem) throw fail(`${problem.path} ${problem.why}`, problem.path, true);
      if (lstatOrNull(match.target)?.isDirectory()) {
        throw fail(
          `${match.target} is a directory ` +
            `where ${match.staged === null ? "a file is to be removed" : "the bundle has a file"}`,
          match.target,
          true,
        );
      }
      const st = match.staged === null ? null : lstatOrNull(match.staged);
      if (st && !st.isFile()) throw fail(`staged ${match.staged} is not a regular file`, match.staged!, true);
    }
  }
  return out;
}

/**
 * Perform one checked swap; safe to repeat after a crash at any point inside it. Synchronous
 * calls: as thread-pool round trips, a swap's five to seven calls made 20,000 swaps (an
 * in-place restore of 20,000 notes) take ~9 s. Every directory on the way is checked (lstat)
 * before anything is renamed through it, and created one level at a time, never through a
 * link. `made`: directories known to be real.
 */
export function applySwap(s: CheckedSwap, made: Set<string>, fail: (p: PathProblem) => Error): void {
  if (s.rel !== "") {
    const p = parentProblem(s.root, s.rel, true, made);
    if (p) throw fail(p);
  }
  const toBackup = (): void => {
    if (s.rel !== "") ensureParents(s.backupRoot, s.rel, false, made, fail);
    renameSync(s.target, s.backup);
  };
  if (s.staged === null) {
    if (exists(s.target)) toBackup();
    return;
  }
  if (!exists(s.staged)) return; // already moved into place
  if (exists(s.target)) {
    if (exists(s.backup)) {
      throw new MemsnapError("MEMSNAP_INTERNAL", `cannot swap ${s.target}: both it and its backup ${s.backup} exist`, {
        hint: "something changed the live state during the restore; inspect both paths",
      });
    }
    toBackup();
  }
  if (s.rel !== "") ensureParents(s.root, s.rel, true, made, fail);
  else ensureParents(dirname(s.root), "", true, made, fail);
  renameSync(s.staged, s.target);
}

/** Run every swap, then commit and clean up. */
export async function rollForward(
  agentBase: string,
  j: Journal,
  swaps: CheckedSwap[],
  fail: (p: PathProblem) => Error,
): Promise<void> {
  const dirs = new Set<string>();
  const made = new Set<string>();
  let slice = performance.now();
  for (const s of swaps) {
    applySwap(s, made, fail);
    dirs.add(dirname(s.target));
    crashPoint("restore:swap");
    if (performance.now() - slice > 8) {
      await new Promise<void>((r) => setImmediate(r)); // the event loop's turn (signals, timers)
      slice = performance.now();
    }
  }
  for (const d of dirs) await fsyncDir(d).catch(() => undefined);
  j.phase = "committed";
  await writeJournal(agentBase, j);
  crashPoint("restore:committed");
  await cleanup(agentBase, j);
}

/**
 * Remove staging dirs (with the scratch a layer's rebuild made beside one, named after it:
 * `.<staging name>.…`, git's `.git-restore-…`) and, once committed, the backups; then the journal.
 */
export async function cleanup(agentBase: string, j: Journal): Promise<void> {
  const beside = new Map<string, string[]>();
  for (const d of j.staging) {
    const parent = dirname(d);
    let names = beside.get(parent);
    if (!names) {
      try {
        names = readdirSync(parent);
      } catch {
        names = [];
      }
      beside.set(parent, names);
    }
    const prefix = `.${basename(d)}.`;
    for (const n of names) {
      if (n.startsWith(prefix)) rmSync(join(parent, n), { recursive: true, force: true });
    }
  }
  for (const d of [...j.staging, ...(j.phase === "committed" ? j.backups : [])]) {
    rmSync(d, { recursive: true, force: true }); // (a tree of thousands of backups: async, one round trip per file)
    crashPoint("restore:cleanup");
  }
  await unlink(journalPath(agentBase)).catch(() => undefined);
}

/** A live-tree problem met while recover rolls forward. */
function recoverFail(agentBase: string): (p: PathProblem) => MemsnapError {
  return (p) => untrusted(agentBase, `${p.path} ${p.why}`, p.path);
}

/**
 * Finish or undo an interrupted restore of the agent `config` describes. Returns what was done,
 * or null when no journal was pending. The journal is checked first (see checkJournal): one
 * that names anything else is MEMSNAP_JOURNAL_UNTRUSTED and nothing is touched.
 * `staging` → rolled back (staging removed, live state untouched); `swapping`/`committed` → finished.
 */
export async function recoverJournal(
  config: MemsnapConfig,
): Promise<{ action: "rolled-back" | "completed"; journal: Journal } | null> {
  const agentBase = config.baseDir;
  const j = await readJournal(agentBase);
  if (!j) return null;
  const swaps = checkJournal(j, await journalScope(config), (why, path) => untrusted(agentBase, why, path));
  if (j.phase === "staging") {
    await cleanup(agentBase, j);
    return { action: "rolled-back", journal: j };
  }
  await rollForward(agentBase, j, swaps, recoverFail(agentBase));
  return { action: "completed", journal: j };
}

export function newJournal(snapshotId: string, bundle: string): Journal {
  return {
    version: 1,
    op: "restore",
    snapshot_id: snapshotId,
    bundle,
    pid: process.pid,
    host: hostname(),
    started_at: new Date().toISOString(),
    phase: "staging",
    staging: [],
    backups: [],
    swaps: [],
  };
}
