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
 *
 * The parts: reading a snapshot's index and wanted artifacts (./diff-read.ts), the git view
 * (./diff-git.ts), the SQLite view (./diff-sqlite.ts), the result types (./diff-types.ts); this
 * file decides what each side writes out and compares the files by path.
 */
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { IndexEntry, Manifest } from "../format/manifest.js";
import type { Keys } from "../read/read-payload.js";
import type { StoredSnapshot } from "./store.js";
import type { LayerDiff } from "./diff-types.js";
import { readSnapshot, type Want } from "./diff-read.js";
import { bundleNo, gitLayerDiff, isBundleName, WORKTREE_DOC } from "./diff-git.js";
import { sqliteLayerDiff } from "./diff-sqlite.js";

export { LIST_MAX, type GitDiff, type LayerDiff, type SqliteDiff } from "./diff-types.js";
export { indexOf } from "./diff-read.js";

/** A layer's meta in a manifest ({} when it has none). */
function meta(m: Manifest, layer: string): Record<string, unknown> {
  return (m.layers.find((l) => l.name === layer)?.meta ?? {}) as Record<string, unknown>;
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
    // A git layer of an incremental snapshot may be a chain: repo.bundle, then repo.1.bundle, …
    // (sources/git/chain.ts).
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
        const doc = `${layer}/${WORKTREE_DOC}`;
        await gitLayerDiff(
          d,
          xa,
          xb,
          differs.includes(layer) ? { a: chain(sa, ia), b: chain(sb, ib), repo: join(dir!, `repo${i}.git`) } : null,
          ha.get(doc) !== hb.get(doc) ? [got(sa, doc), got(sb, doc)] : null,
        );
      }
      if (kind === "sqlite")
        d.sqlite = await sqliteLayerDiff(d, xa, xb, (name) => [
          got(sa, `${layer}/${name}`),
          got(sb, `${layer}/${name}`),
        ]);
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
