/**
 * `memsnap diff A B`: what changed between two snapshots, per layer, and inside the layers
 * where memsnap can look: a git layer's notes (files by path between the two HEAD trees, the
 * uncommitted work-tree files) and the commits between the two HEADs; a SQLite layer's rows per
 * table; other layers' files by path.
 *
 * The git view extracts both snapshots' `<layer>/repo.bundle` (from the payload, or from a base
 * bundle for an incremental snapshot that references it) into a private temp directory (0700,
 * files 0600, removed after), unbundles both into one temporary bare repository and asks the
 * git binary (`diff-tree`, `log`, `merge-base`). A bundle may come from a hostile source: what
 * git prints (paths, subjects) is data only, never a file system path, and each list is capped
 * at {@link LIST_MAX} entries (the rest counted). Each bundle's bytes are checked against the
 * snapshot's index (its payload read whole and compared, as verify does) before git sees them.
 */
import { spawn } from "node:child_process";
import { createRequire } from "node:module";
import { mkdtemp, open, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { MemsnapError } from "../errors.js";
import { readLayout } from "../format/container.js";
import { isChunkedIn, type IndexEntry, type Manifest } from "../format/manifest.js";
import { compareWithIndex, readPayload, type EntryHandler, type Keys } from "../read/read-payload.js";
import { extractReferenced, openBases, References } from "../read/bases.js";
import type { StoredSnapshot } from "./store.js";

/** The most entries of one list (files added, commits, …) a diff reports; the rest are counted. */
export const LIST_MAX = 1000;

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

/**
 * The artifact index of a snapshot: from the manifest, or by reading the payload (with a key
 * when it is encrypted; a plaintext manifest leaves out an index of over MANIFEST_INDEX_MAX
 * artifacts). Throws MEMSNAP_IDENTITY_REQUIRED.
 */
export async function indexOf(s: StoredSnapshot, keys: Keys): Promise<IndexEntry[]> {
  if (s.manifest.index) return s.manifest.index;
  return (await readSnapshot(s, keys, null)).index;
}

function needKey(s: StoredSnapshot, keys: Keys, what: string): void {
  if (s.manifest.payload.encryption !== null && !(keys.identities?.length || keys.passphrases?.length)) {
    throw new MemsnapError("MEMSNAP_IDENTITY_REQUIRED", `snapshot ${s.id} is encrypted: ${what} needs the key`, {
      hint: "pass --identity FILE (or --passphrase-file)",
    });
  }
}

function checked(id: string, manifest: Manifest, r: Awaited<ReturnType<typeof readPayload>>): void {
  const f = compareWithIndex(manifest, r)[0];
  if (f) {
    throw new MemsnapError(f.code, `snapshot ${id}: ${f.message}`, {
      ...(f.path ? { path: f.path } : {}),
      hint: "the bundle is damaged or was altered; run memsnap verify on it",
    });
  }
}

/** Which payload entries to write out, and where: a temp file, or undefined to skip. */
type Want = (name: string) => string | undefined;

/** A handler that writes the wanted entries (payload name → temp file) and skips the others. */
function writer(want: Want, written: Set<string>): EntryHandler {
  return async (info, chunks) => {
    const to = want(info.name);
    if (to === undefined || written.has(to)) return;
    written.add(to);
    const fh = await open(to, "wx", 0o600);
    try {
      for await (const c of chunks) await fh.write(c);
    } finally {
      await fh.close();
    }
  };
}

/**
 * Read a snapshot's payload once: its checked index, and the artifacts in `want` (payload name
 * → temp file path) written out, those an incremental snapshot references read from its base.
 */
async function readSnapshot(
  s: StoredSnapshot,
  keys: Keys,
  want: Want | null,
): Promise<{ index: IndexEntry[]; written: Set<string> }> {
  const written = new Set<string>();
  needKey(s, keys, want ? "looking inside its layers" : "its file list");
  const layout = await readLayout(s.path);
  const r = await readPayload(layout, s.manifest, keys, writer(want ?? (() => undefined), written));
  checked(s.id, s.manifest, r);
  if (!r.index)
    throw new MemsnapError("MEMSNAP_INDEX_MISMATCH", `snapshot ${s.id} has no readable index`, {
      hint: "the bundle is damaged; run memsnap verify on it",
    });
  const index = r.index.artifacts;
  // Wanted chunked artifacts (their stored ranges are written): the rest of their bytes is read from their bases.
  const chunked = new References();
  for (const e of index) if (isChunkedIn(s.manifest, e) && want?.(e.path) !== undefined) chunked.add(e);
  if (chunked.count) {
    const bases = await openBases(s.path, s.manifest, chunked.basesIn());
    await extractReferenced(bases, chunked, () => null, { keys, chunkFile: (e) => want!(e.path) ?? null });
  }
  // Wanted artifacts whose bytes are in a base (references never chain).
  const byBase = new Map<string, Map<string, IndexEntry>>();
  for (const e of index) {
    if (e.ref === undefined || isChunkedIn(s.manifest, e) || !want || want(e.path) === undefined) continue;
    if (!byBase.has(e.ref)) byBase.set(e.ref, new Map());
    byBase.get(e.ref)!.set(e.path, e);
  }
  for (const [id, refs] of byBase) {
    const [base] = await openBases(s.path, s.manifest, new Set([id]));
    if (!base)
      throw new MemsnapError(
        "MEMSNAP_BASE_MISSING",
        `snapshot ${s.id} references base ${id}, which it does not declare`,
        { hint: "the bundle is damaged; run memsnap verify on it" },
      );
    const found = new Set<string>();
    const rb = await readPayload(
      base.layout,
      base.manifest,
      keys,
      writer((n) => (refs.has(n) ? want!(n) : undefined), written),
      {
        onEntry: (e) => {
          const w = refs.get(e.name);
          if (!w) return;
          if (w.size !== e.size || w.sha256 !== e.sha256) {
            throw new MemsnapError(
              "MEMSNAP_ARTIFACT_HASH_MISMATCH",
              `${e.name}: base ${id} holds other bytes than the reference records`,
              {
                path: e.name,
                hint: "the bundle or its base is damaged or was altered",
              },
            );
          }
          found.add(e.name);
        },
      },
    );
    checked(id, base.manifest, rb);
    for (const p of refs.keys()) {
      if (!found.has(p))
        throw new MemsnapError("MEMSNAP_INDEX_MISMATCH", `${p} is referenced from base ${id}, which does not hold it`, {
          path: p,
          hint: "the bundle or its base is damaged or was altered",
        });
    }
  }
  return { index, written };
}

function meta(m: Manifest, layer: string): Record<string, unknown> {
  return (m.layers.find((l) => l.name === layer)?.meta ?? {}) as Record<string, unknown>;
}

const OID = /^[0-9a-f]{40}([0-9a-f]{24})?$/;

function headOf(x: Record<string, unknown>): string | null {
  const h = (x.head as { oid?: unknown } | null | undefined) ?? {};
  const oid = typeof h.oid === "string" ? h.oid : typeof x.head_oid === "string" ? x.head_oid : null;
  return oid !== null && OID.test(oid) ? oid : null;
}

/** Per-layer differences between two snapshots (A → B), looking inside git and SQLite layers. */
export async function diffSnapshots(a: StoredSnapshot, b: StoredSnapshot, keys: Keys): Promise<LayerDiff[]> {
  const kinds = [...a.manifest.layers, ...b.manifest.layers];
  const gitLayers = [...new Set(kinds.filter((l) => l.kind === "git").map((l) => l.name))];
  const sqliteLayers = new Set(kinds.filter((l) => l.kind === "sqlite").map((l) => l.name));
  let dir: string | null = null;
  try {
    if (gitLayers.length || sqliteLayers.size) dir = await mkdtemp(join(tmpdir(), "memsnap-diff-"));
    // What each side writes out: every git layer's repo.bundle and every SQLite database, to
    // temp files named by side and a counter (never by a payload path); `only` narrows it.
    const side = (
      tag: string,
    ): {
      want: (only: ReadonlySet<string> | ((name: string) => boolean) | null) => Want;
      files: Map<string, string>;
      written: Set<string>;
    } => {
      const files = new Map<string, string>();
      let n = 0;
      return {
        files,
        written: new Set(),
        want: (only) => (name) => {
          if (only && !(typeof only === "function" ? only(name) : only.has(name))) return undefined;
          const slash = name.indexOf("/");
          const l = name.slice(0, slash);
          if (!(
            sqliteLayers.has(l) ||
            (gitLayers.includes(l) && (isBundleName(l, name) || name === `${l}/${WORKTREE_DOC}`))
          ))
            return undefined;
          let f = files.get(name);
          if (f === undefined) files.set(name, (f = join(dir!, `${tag}${n++}`)));
          return f;
        },
      };
    };
    const [sa, sb] = [side("a"), side("b")];
    // A snapshot whose index is only in its payload is read for it, its git bundles written as
    // they pass (they are wanted unless the history is the same); its databases, which may be
    // large and unchanged, wait for a second pass once the index says which changed.
    const bundles = (name: string): boolean =>
      gitLayers.some((l) => isBundleName(l, name) || name === `${l}/${WORKTREE_DOC}`);
    const first = async (s: StoredSnapshot, x: typeof sa): Promise<IndexEntry[]> => {
      if (s.manifest.index) return s.manifest.index;
      const r = await readSnapshot(s, keys, gitLayers.length ? x.want(bundles) : null);
      for (const f of r.written) x.written.add(f);
      return r.index;
    };
    const [ia, ib] = [await first(a, sa), await first(b, sb)];
    const bySha = (ix: IndexEntry[]): Map<string, string> => new Map(ix.map((e) => [e.path, e.sha256]));
    const [ha, hb] = [bySha(ia), bySha(ib)];
    // The git layers whose bundles differ (the same bytes: the same history), and the databases in both that differ.
    // A git layer of an incremental snapshot may be a chain: repo.bundle, then repo.1.bundle, … (sources/git/chain.ts).
    const chainIn = (ix: IndexEntry[], l: string): string[] =>
      ix
        .map((e) => e.path)
        .filter((p) => isBundleName(l, p))
        .sort((x, y) => bundleNo(x) - bundleNo(y));
    const chainSha = (ix: IndexEntry[], h: Map<string, string>, l: string): string =>
      chainIn(ix, l)
        .map((p) => h.get(p))
        .join(",");
    const differs = gitLayers.filter((l) => chainSha(ia, ha, l) !== chainSha(ib, hb, l));
    const needed = new Set<string>(differs.flatMap((l) => [...chainIn(ia, l), ...chainIn(ib, l)]));
    for (const l of gitLayers)
      if (ha.get(`${l}/${WORKTREE_DOC}`) !== hb.get(`${l}/${WORKTREE_DOC}`)) needed.add(`${l}/${WORKTREE_DOC}`);
    for (const e of ib)
      if (sqliteLayers.has(e.layer) && ha.has(e.path) && ha.get(e.path) !== e.sha256) needed.add(e.path);
    // A payload is read (again) only for those not written yet.
    for (const [s, x, h] of [
      [a, sa, ha],
      [b, sb, hb],
    ] as const) {
      const only = new Set([...needed].filter((p) => h.has(p) && !(x.files.has(p) && x.written.has(x.files.get(p)!))));
      if (only.size) for (const f of (await readSnapshot(s, keys, x.want(only))).written) x.written.add(f);
    }
    const got = (x: typeof sa, name: string): string | null => {
      const f = x.files.get(name);
      return f !== undefined && x.written.has(f) ? f : null;
    };
    const layers = [...new Set([...a.manifest.layers, ...b.manifest.layers].map((l) => `${l.name}\0${l.kind}`))].map(
      (k) => k.split("\0") as [string, string],
    );
    const out: LayerDiff[] = [];
    for (const [layer, kind] of layers) {
      const d = artifactDiff(layer, kind, ia, ib);
      const [xa, xb] = [meta(a.manifest, layer), meta(b.manifest, layer)];
      if (kind === "git") {
        const i = gitLayers.indexOf(layer);
        const chain = (x: typeof sa, ix: IndexEntry[]): string[] | null => {
          const fs = chainIn(ix, layer).map((p) => got(x, p));
          return fs.length && fs.every((f) => f !== null) ? (fs as string[]) : null;
        };
        d.git = await gitDiff(
          d,
          xa,
          xb,
          differs.includes(layer) ? { a: chain(sa, ia), b: chain(sb, ib), repo: join(dir!, `repo${i}.git`) } : null,
        );
        const doc = `${layer}/${WORKTREE_DOC}`;
        if (ha.get(doc) !== hb.get(doc)) {
          const [da, db] = [await deletedIn(got(sa, doc)), await deletedIn(got(sb, doc))];
          if (da === null || db === null)
            d.notes.push(`${WORKTREE_DOC} is not readable; uncommitted deletions not compared`);
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
            : `HEAD ${String(oa ?? "-").slice(0, 12)} → ${String(ob ?? "-").slice(0, 12)}${typeof subj === "string" && subj ? ` (${subj})` : ""}`,
        );
      }
      if (kind === "sqlite") {
        const da = (xa.databases ?? {}) as Record<string, { tables?: Record<string, number> }>;
        const db = (xb.databases ?? {}) as Record<string, { tables?: Record<string, number> }>;
        const sq: SqliteDiff = { databases: {} };
        for (const name of new Set([...Object.keys(da), ...Object.keys(db)])) {
          const ta = da[name]?.tables ?? {};
          const tb = db[name]?.tables ?? {};
          const tables: SqliteDiff["databases"][string] = {};
          for (const t of new Set([...Object.keys(ta), ...Object.keys(tb)])) {
            const from = typeof ta[t] === "number" ? ta[t] : 0;
            const to = typeof tb[t] === "number" ? tb[t] : 0;
            tables[t] = { from, to };
          }
          // Both copies at hand (the database changed): rows added, removed and changed by rowid.
          const [fa, fb] = [got(sa, `${layer}/${name}`), got(sb, `${layer}/${name}`)];
          if (fa !== null && fb !== null) {
            try {
              for (const [t, r] of Object.entries(await rowDiff(fa, fb))) if (tables[t]) Object.assign(tables[t], r);
            } catch (e) {
              d.notes.push(`${name}: rows not compared (${(e as Error).message})`);
            }
          }
          sq.databases[name] = tables;
        }
        d.sqlite = sq;
      }
      if (kind === "kv") {
        const pa = new Set(ia.filter((e) => e.layer === layer && /\/pages?\//.test(e.path)).map((e) => e.sha256));
        const pb = ib.filter((e) => e.layer === layer && /\/pages?\//.test(e.path)).map((e) => e.sha256);
        const shared = pb.filter((h) => pa.has(h)).length;
        d.notes.push(`pages: ${shared} shared, ${pb.length - shared} new`);
      }
      out.push(d);
    }
    return out;
  } finally {
    if (dir) await rm(dir, { recursive: true, force: true });
  }
}

/** Artifacts added, changed and removed in one layer, by payload path. */
function artifactDiff(layer: string, kind: string, ia: IndexEntry[], ib: IndexEntry[]): LayerDiff {
  const ma = new Map(ia.filter((e) => e.layer === layer).map((e) => [e.path, e]));
  const mb = new Map(ib.filter((e) => e.layer === layer).map((e) => [e.path, e]));
  const d: LayerDiff = { layer, kind, added: [], removed: [], changed: [], unchanged: 0, notes: [] };
  for (const [p, e] of mb) {
    const o = ma.get(p);
    if (!o) d.added.push({ path: p, size: e.size });
    else if (o.sha256 !== e.sha256) d.changed.push({ path: p, from: o.size, to: e.size });
    else d.unchanged++;
  }
  for (const [p, e] of ma) if (!mb.has(p)) d.removed.push({ path: p, size: e.size });
  return d;
}

// ------------------------------------------------------------------------------ git

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
function isBundleName(layer: string, name: string): boolean {
  return name.startsWith(`${layer}/`) && /^repo(\.[1-9][0-9]{0,5})?\.bundle$/.test(name.slice(layer.length + 1));
}

/** The place of a bundle in its chain: 0 for repo.bundle, n for repo.<n>.bundle. */
function bundleNo(name: string): number {
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
const WORKTREE_DOC = "worktree-deleted.json";
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

// ------------------------------------------------------------------------------ sqlite rows

interface Bs {
  prepare(sql: string): {
    raw(on: boolean): { safeIntegers(on: boolean): { iterate(): IterableIterator<unknown[]> } };
    all(): unknown[];
  };
  pragma(s: string): unknown;
  close(): void;
}

/** A cell as comparable text (type-tagged: 1 and '1' differ). */
function cell(v: unknown): string {
  if (v === null) return "n";
  if (typeof v === "bigint") return `i${v}`;
  if (typeof v === "number") return `r${v}`;
  if (typeof v === "string") return `s${v.length}:${v}`;
  if (Buffer.isBuffer(v)) return `b${v.toString("hex")}`;
  return `?${String(v)}`;
}

/**
 * Rows added, removed and changed by rowid in each table present (with a rowid) in both copies:
 * two ordered scans merged, one row of each in memory at a time. The copies are private temp
 * files; each is opened with untrusted schema off and queries only.
 */
async function rowDiff(
  fa: string,
  fb: string,
): Promise<Record<string, { added: number; removed: number; changed: number; changed_rowids: string[] }>> {
  const Database = createRequire(import.meta.url)("better-sqlite3") as new (p: string, o: object) => Bs;
  const open = (f: string): Bs => {
    const db = new Database(f, { fileMustExist: true });
    db.pragma("trusted_schema = OFF");
    db.pragma("query_only = ON");
    return db;
  };
  const [A, B] = [open(fa), open(fb)];
  try {
    const tables = (db: Bs): Map<string, string> =>
      new Map(
        (
          db
            .prepare(
              "SELECT name, sql FROM sqlite_schema WHERE type = 'table' AND name NOT LIKE 'sqlite\\_%' ESCAPE '\\'",
            )
            .all() as { name: string; sql: string | null }[]
        )
          .filter(
            (t) => !/^\s*CREATE\s+VIRTUAL\b/i.test(t.sql ?? "") && !/\bWITHOUT\s+ROWID\s*[;,)]?\s*$/i.test(t.sql ?? ""),
          )
          .map((t) => [t.name, t.sql ?? ""]),
      );
    const [ta, tb] = [tables(A), tables(B)];
    const out: Record<string, { added: number; removed: number; changed: number; changed_rowids: string[] }> = {};
    let turn = performance.now();
    for (const t of ta.keys()) {
      if (!tb.has(t)) continue;
      const q = `SELECT _rowid_, * FROM "${t.replace(/"/g, '""')}" ORDER BY _rowid_`;
      let ia: IterableIterator<unknown[]>;
      let ib: IterableIterator<unknown[]>;
      try {
        ia = A.prepare(q).raw(true).safeIntegers(true).iterate();
        ib = B.prepare(q).raw(true).safeIntegers(true).iterate();
      } catch {
        continue; // no rowid to compare by
      }
      const r = { added: 0, removed: 0, changed: 0, changed_rowids: [] as string[] };
      let x = ia.next();
      let y = ib.next();
      while (!x.done || !y.done) {
        if (performance.now() - turn > 50) {
          await new Promise<void>((res) => setImmediate(res));
          turn = performance.now();
        }
        const kx = x.done ? null : (x.value[0] as bigint);
        const ky = y.done ? null : (y.value[0] as bigint);
        if (ky === null || (kx !== null && kx < ky)) {
          r.removed++;
          x = ia.next();
        } else if (kx === null || ky < kx) {
          r.added++;
          y = ib.next();
        } else {
          const va = x.value as unknown[];
          const vb = y.value as unknown[];
          if (va.length !== vb.length || va.some((v, i) => i > 0 && cell(v) !== cell(vb[i]))) {
            r.changed++;
            if (r.changed_rowids.length < 100) r.changed_rowids.push(String(kx));
          }
          x = ia.next();
          y = ib.next();
        }
      }
      out[t] = r;
    }
    return out;
  } finally {
    for (const db of [A, B]) {
      try {
        db.close();
      } catch {
        // a statement left mid-scan by an error: the process ends it
      }
    }
  }
}
