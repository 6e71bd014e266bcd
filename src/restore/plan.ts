/** restore --dry-run: what an in-place restore would change, computed without touching anything. */
import { join } from "node:path";
import type { ConfiguredSource, MemsnapConfig } from "../config.js";
import type { BundleLayout } from "../format/container.js";
import type { IndexEntry, LayerEntry, Manifest } from "../format/manifest.js";
import { readPayload, type Keys } from "../read/read-payload.js";
import type { Selection } from "../browse/index.js";
import type { LiveTarget } from "../sources/types.js";
import { listFiles } from "../agent/live-files.js";
import { lstatOrNull, parentProblem, Protected, realish } from "../agent/live-guard.js";
import { sha256File } from "../util/fs-atomic.js";

/** A layer to restore with its config source and live target. */
export interface SelectedLayer {
  layer: LayerEntry;
  source: ConfiguredSource;
  target: LiveTarget;
}

export interface LayerPlan {
  layer: string;
  kind: string;
  target: string;
  mode: "dir" | "files";
  bytes: number;
  added: string[];
  removed: string[];
  changed: string[];
  unchanged: number;
  notes: string[];
}

export interface RestorePlan {
  snapshot_id: string;
  /** False when the bundle is encrypted and no key was given: only layer totals are known. */
  file_level: boolean;
  layers: LayerPlan[];
}

/**
 * Build the plan. Reads the payload (hashing only) when the manifest does not list the index:
 * an encrypted bundle (given a key), or a plaintext one of over MANIFEST_INDEX_MAX artifacts.
 */
export async function planRestore(
  layout: BundleLayout,
  manifest: Manifest,
  config: MemsnapConfig,
  selected: SelectedLayer[],
  keys: Keys,
  signal?: AbortSignal,
  /** restore --path: only the selected artifacts; a partly selected layer removes nothing. */
  pick?: Selection,
): Promise<RestorePlan> {
  let index: IndexEntry[] | null = manifest.index ?? null;
  if (!index && (manifest.payload.encryption === null || keys.identities?.length || keys.passphrases?.length)) {
    const r = await readPayload(layout, manifest, keys, async () => undefined, signal ? { signal } : {});
    index = r.index?.artifacts ?? null;
  }
  const layers: LayerPlan[] = [];
  const protect = new Protected(config);
  for (const s of selected) {
    const p: LayerPlan = {
      layer: s.layer.name,
      kind: s.layer.kind,
      target: s.target.root,
      mode: s.target.mode,
      bytes: s.layer.bytes,
      added: [],
      removed: [],
      changed: [],
      unchanged: 0,
      notes: [],
    };
    if (s.target.mode === "dir") p.notes.push(`replaces the directory ${s.target.root}`);
    if (index && s.target.mode === "files") {
      const prefix = `${s.layer.name}/`;
      const want = new Map(
        index
          .filter((e) => e.layer === s.layer.name && (!pick || pick.want(e.path)))
          .map((e) => [e.path.slice(prefix.length), e.sha256]),
      );
      const realRoot = realish(s.target.root);
      const isProtected = (rel: string): boolean => protect.covers(join(s.target.root, rel), join(realRoot, rel));
      const live = (await listFiles(s.target.root)).filter(
        (rel) => (s.target.owns?.(rel) ?? true) && !isProtected(rel),
      );
      const liveSet = new Set(live);
      // What the restore would refuse or leave alone (see buildSwaps and checkJournal in the restore).
      const notOwned = [...want.keys()].filter((rel) => !s.target.owns?.(rel));
      if (notOwned.length) {
        p.notes.push(
          `refuses: the bundle holds ${notOwned.length} file(s) the source does not own ` +
            `(${notOwned.slice(0, 3).join(", ")}${notOwned.length > 3 ? ", …" : ""})`,
        );
      }
      const seen = new Set<string>();
      for (const [rel, sha] of want) {
        if (!s.target.owns?.(rel)) continue;
        if (isProtected(rel)) {
          p.notes.push(`keeps ${join(s.target.root, rel)}: a restore never writes the config it runs with`);
          continue;
        }
        const problem = parentProblem(s.target.root, rel, true, seen);
        if (problem) {
          p.notes.push(`refuses: ${problem.path} ${problem.why}`);
          continue;
        }
        if (lstatOrNull(join(s.target.root, rel))?.isDirectory()) {
          p.notes.push(`refuses: ${join(s.target.root, rel)} is a directory where the bundle has a file`);
          continue;
        }
        if (!liveSet.has(rel)) p.added.push(rel);
        else if ((await sha256File(join(s.target.root, rel))) !== sha) p.changed.push(rel);
        else p.unchanged++;
      }
      if (!pick?.perFile.has(s.layer.name)) for (const rel of live) if (!want.has(rel)) p.removed.push(rel);
    }
    const extra = await s.source.impl.planLayer?.(s.source.cfg, config.baseDir, s.layer);
    if (extra) p.notes.push(...extra);
    layers.push(p);
  }
  return { snapshot_id: manifest.snapshot_id, file_level: index !== null, layers };
}
