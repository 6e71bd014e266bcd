/**
 * The git view of `memsnap diff`: both snapshots' bundles (or chains of bundles) unbundled into
 * one temporary bare repository, and the git binary asked for the files between the two HEAD
 * trees, the commits between the HEADs and whether one descends from the other; plus the
 * uncommitted work-tree files and deletions captured beside the bundle. What git prints is data
 * only, never a path, and each list is capped at LIST_MAX entries.
 */
import { spawn } from "node:child_process";
import { open } from "node:fs/promises";
import { tmpdir } from "node:os";
import { LIST_MAX, type GitDiff, type LayerDiff } from "./diff-types.js";

const OID = /^[0-9a-f]{40}([0-9a-f]{24})?$/;

/** The HEAD commit a git layer's meta records, when it is an object id. */
function headOf(x: Record<string, unknown>): string | null {
  const h = (x.head as { oid?: unknown } | null | undefined) ?? {};
  const oid = typeof h.oid === "string" ? h.oid : typeof x.head_oid === "string" ? x.head_oid : null;
  return oid !== null && OID.test(oid) ? oid : null;
}

/** The environment git runs with here: no inherited GIT_* variables, no system or global config. */
function gitEnv(gitDir: string): NodeJS.ProcessEnv {
  const env: NodeJS.ProcessEnv = {};
  for (const [k, v] of Object.entries(process.env)) if (!k.startsWith("GIT_") || k === "GIT_EXEC_PATH") env[k] = v;
  const cfg: Array<[string, string]> = [
    ["core.hooksPath", "/dev/null"],
    ["core.fsmonitor", "false"],
    ["gc.auto", "0"],
    ["maintenance.auto", "false"],
  ];
  Object.assign(env, {
    GIT_DIR: gitDir,
    GIT_CONFIG_NOSYSTEM: "1",
    GIT_CONFIG_GLOBAL: "/dev/null",
    GIT_TERMINAL_PROMPT: "0",
    GIT_OPTIONAL_LOCKS: "0",
    GIT_NO_REPLACE_OBJECTS: "1",
    GIT_NO_LAZY_FETCH: "1",
    GIT_PROTOCOL_FROM_USER: "0",
    GIT_CONFIG_COUNT: String(cfg.length),
  });
  cfg.forEach(([k, v], i) => {
    env[`GIT_CONFIG_KEY_${i}`] = k;
    env[`GIT_CONFIG_VALUE_${i}`] = v;
  });
  return env;
}

/** The longest record kept whole (a longer one, e.g. a huge subject, is cut). */
const RECORD_MAX = 64 * 1024;

/**
 * Run git, streaming its stdout as `sep`-terminated records to `onRecord` (as UTF-8 text, data
 * only); resolves with the exit code (rejects when it is not in `ok`, or git cannot start).
 */
function gitRecords(
  gitDir: string,
  args: string[],
  sep: number,
  onRecord: (rec: string) => void,
  ok: number[] = [0],
  cwd = tmpdir(),
): Promise<number> {
  return new Promise((res, rej) => {
    const child = spawn("git", args, {
      cwd,
      env: gitEnv(gitDir),
      stdio: ["ignore", "pipe", "pipe"],
      windowsHide: true,
    });
    let parts: Buffer[] = [];
    let len = 0;
    let err = "";
    const push = (b: Buffer): void => {
      if (len < RECORD_MAX) parts.push(b.subarray(0, RECORD_MAX - len));
      len += b.length;
    };
    child.stdout.on("data", (b: Buffer) => {
      let at = 0;
      for (let i = b.indexOf(sep); i >= 0; i = b.indexOf(sep, at)) {
        push(b.subarray(at, i));
        onRecord(Buffer.concat(parts).toString("utf8"));
        parts = [];
        len = 0;
        at = i + 1;
      }
      if (at < b.length) push(Buffer.from(b.subarray(at)));
    });
    child.stderr.on("data", (b: Buffer) => {
      if (err.length < 4096) err += b.toString("utf8");
    });
    child.on("error", rej);
    child.on("close", (code) => {
      if (len > 0) onRecord(Buffer.concat(parts).toString("utf8"));
      if (code === null || !ok.includes(code))
        rej(new Error(`git ${args[0]} exited ${code ?? "on a signal"}: ${err.trim().split("\n").slice(-1)[0] ?? ""}`));
      else res(code);
    });
  });
}

/** A git layer's bundle: `repo.bundle`, or a link of its chain, `repo.<n>.bundle`. */
export function isBundleName(layer: string, name: string): boolean {
  return name.startsWith(`${layer}/`) && /^repo(\.[1-9][0-9]{0,5})?\.bundle$/.test(name.slice(layer.length + 1));
}
/** The place of a bundle in its chain: 0 for repo.bundle, n for repo.<n>.bundle. */
export function bundleNo(name: string): number {
  const m = /\.([0-9]+)\.bundle$/.exec(name);
  return m ? Number(m[1]) : 0;
}
/** Unbundle a chain in order (each link's prerequisites come from the bundles before it); the last one's HEAD. */
async function unbundleChain(repo: string, chain: string[]): Promise<string | null> {
  let head: string | null = null;
  for (const b of chain) head = (await unbundle(repo, b)) ?? head;
  return head;
}

/** Unbundle into the bare repository; returns the bundle's HEAD, if it lists one. */
async function unbundle(repo: string, bundle: string): Promise<string | null> {
  let head: string | null = null;
  await gitRecords(repo, ["bundle", "unbundle", bundle], 0x0a, (rec) => {
    const m = /^([0-9a-f]{40}(?:[0-9a-f]{24})?) HEAD$/.exec(rec);
    if (m) head = m[1]!;
  });
  return head;
}

class Capped {
  readonly items: string[] = [];
  total = 0;
  add(x: string): void {
    if (this.items.length < LIST_MAX) this.items.push(x);
    this.total++;
  }
}
/** The git layer's document of uncommitted deletions (see sources/git/format.ts WorktreeDoc). */
export const WORKTREE_DOC = "worktree-deleted.json";
/** The largest such document read. */
const WORKTREE_DOC_MAX = 16 * 1024 * 1024;

/** The tracked paths a worktree document lists as missing ([] without a file: none; null: unreadable). */
async function deletedIn(file: string | null): Promise<string[] | null> {
  if (file === null) return [];
  try {
    const fh = await open(file, "r");
    try {
      const { size } = await fh.stat();
      if (size > WORKTREE_DOC_MAX) return null;
      const doc = JSON.parse((await fh.readFile()).toString("utf8")) as { deleted?: unknown };
      return Array.isArray(doc.deleted) && doc.deleted.every((p) => typeof p === "string")
        ? (doc.deleted as string[])
        : null;
    } finally {
      await fh.close();
    }
  } catch {
    return null;
  }
}

/**
 * The git view of one layer: worktree overlay from the index, and with both bundles, the files and commits between the
 * HEADs.
 */
async function gitDiff(
  d: LayerDiff,
  xa: Record<string, unknown>,
  xb: Record<string, unknown>,
  bundles: { a: string[] | null; b: string[] | null; repo: string } | null,
): Promise<GitDiff> {
  const wt = (p: string): string | null => {
    const rel = p.slice(d.layer.length + 1);
    return rel.startsWith("worktree/") ? rel.slice("worktree/".length) : null;
  };
  const worktree = {
    added: d.added.map((x) => wt(x.path)).filter((x): x is string => x !== null),
    changed: d.changed.map((x) => wt(x.path)).filter((x): x is string => x !== null),
    removed: d.removed.map((x) => wt(x.path)).filter((x): x is string => x !== null),
    deleted: [] as string[],
  };
  const g: GitDiff = {
    head: { from: headOf(xa), to: headOf(xb) },
    descendant: null,
    commits: [],
    commits_total: 0,
    commits_dropped: 0,
    files: { added: [], changed: [], deleted: [] },
    files_total: { added: 0, changed: 0, deleted: 0 },
    worktree,
  };
  if (g.head.from !== null && g.head.from === g.head.to) g.descendant = true;
  if (!bundles) return g;
  const fmt = (x: Record<string, unknown>): string => (x.object_format === "sha256" ? "sha256" : "sha1");
  if (bundles.a && bundles.b && fmt(xa) !== fmt(xb)) {
    g.note = "the two repositories use different object formats; files and commits not compared";
    return g;
  }
  try {
    await gitRecords(
      bundles.repo,
      ["init", "--bare", "-q", `--object-format=${fmt(bundles.b ? xb : xa)}`],
      0x0a,
      () => undefined,
    );
    const ha = bundles.a ? ((await unbundleChain(bundles.repo, bundles.a)) ?? g.head.from) : null;
    const hb = bundles.b ? ((await unbundleChain(bundles.repo, bundles.b)) ?? g.head.to) : null;
    g.head = { from: ha, to: hb };
    const isCommit = async (oid: string | null): Promise<string | null> =>
      oid !== null &&
      (await gitRecords(bundles.repo, ["cat-file", "-e", `${oid}^{commit}`], 0x0a, () => undefined, [0, 1, 128])) === 0
        ? oid
        : null;
    const [ca, cb] = [await isCommit(ha), await isCommit(hb)];
    let empty = "";
    await gitRecords(
      bundles.repo,
      ["mktree", "--missing"],
      0x0a,
      (r) => {
        if (r) empty = r.trim();
      },
      [0],
    );
    // diff-tree (plumbing: no external diff, no textconv), no rename detection: paths as git names them.
    const files = { A: new Capped(), M: new Capped(), D: new Capped() };
    let status: string | null = null;
    await gitRecords(
      bundles.repo,
      ["diff-tree", "-r", "-z", "--no-renames", "--name-status", ca ?? empty, cb ?? empty],
      0x00,
      (rec) => {
        if (status === null) {
          status = rec;
          return;
        }
        const k = status === "A" ? "A" : status === "D" ? "D" : "M";
        files[k].add(rec);
        status = null;
      },
    );
    g.files = { added: files.A.items, changed: files.M.items, deleted: files.D.items };
    g.files_total = { added: files.A.total, changed: files.M.total, deleted: files.D.total };
    if (cb !== null) {
      const commits: { oid: string; subject: string }[] = [];
      let total = 0;
      await gitRecords(
        bundles.repo,
        [
          "log",
          "--no-color",
          "--no-decorate",
          "--no-mailmap",
          "-z",
          "--format=%H %s",
          ...(ca ? [`${ca}..${cb}`] : [cb]),
          "--",
        ],
        0x00,
        (rec) => {
          const sp = rec.indexOf(" ");
          if (sp < 0) return;
          if (commits.length < LIST_MAX) commits.push({ oid: rec.slice(0, sp), subject: rec.slice(sp + 1) });
          total++;
        },
      );
      g.commits = commits;
      g.commits_total = total;
    }
    if (ca !== null && cb !== null) {
      const code = await gitRecords(
        bundles.repo,
        ["merge-base", "--is-ancestor", ca, cb],
        0x0a,
        () => undefined,
        [0, 1],
      );
      g.descendant = code === 0;
      if (!g.descendant) {
        await gitRecords(bundles.repo, ["rev-list", "--count", `${cb}..${ca}`, "--"], 0x0a, (r) => {
          if (/^\d+$/.test(r)) g.commits_dropped = Number(r);
        });
      }
    }
  } catch (e) {
    const msg = (e as NodeJS.ErrnoException).code === "ENOENT" ? "git is not installed" : (e as Error).message;
    g.note = `could not look inside the bundles: ${msg}`;
  }
  return g;
}

/**
 * A git layer's whole view: {@link gitDiff}, the uncommitted deletions when the two worktree
 * documents differ (`docs`: their temp files, null when they are the same), and the HEAD note.
 */
export async function gitLayerDiff(
  d: LayerDiff,
  xa: Record<string, unknown>,
  xb: Record<string, unknown>,
  bundles: { a: string[] | null; b: string[] | null; repo: string } | null,
  docs: [string | null, string | null] | null,
): Promise<void> {
  d.git = await gitDiff(d, xa, xb, bundles);
  if (docs) {
    const [da, db] = [await deletedIn(docs[0]), await deletedIn(docs[1])];
    if (da === null || db === null) d.notes.push(`${WORKTREE_DOC} is not readable; uncommitted deletions not compared`);
    else {
      const before = new Set(da);
      d.git.worktree.deleted = db.filter((p) => !before.has(p)).slice(0, LIST_MAX);
    }
  }
  const oa = d.git.head.from;
  const ob = d.git.head.to;
  const subj = (xb.head as { subject?: unknown } | undefined)?.subject;
  d.notes.push(
    oa === ob
      ? `HEAD unchanged at ${String(oa ?? "-").slice(0, 12)}`
      : `HEAD ${String(oa ?? "-").slice(0, 12)} ` +
          `→ ${String(ob ?? "-").slice(0, 12)}${typeof subj === "string" && subj ? ` (${subj})` : ""}`,
  );
}
