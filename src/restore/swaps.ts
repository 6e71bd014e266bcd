/**
 * Where an in-place restore puts each layer, and how: the bundle's layers matched to the
 * config's sources and their live targets, the live roots it must not take, and the swaps that
 * make a layer's live files the staged ones (with the errors for a live path it refuses).
 * Split from ./in-place.ts, which stages, journals and swaps.
 */
import { join } from "node:path";
import type { MemsnapConfig } from "../config.js";
import { MemsnapError } from "../errors.js";
import type { Manifest } from "../format/manifest.js";
import { listFiles } from "../agent/live-files.js";
import type { Swap } from "../agent/journal.js";
import { realish, type PathProblem, type Protected } from "../agent/live-guard.js";
import type { SelectedLayer } from "./plan.js";

/** Match the bundle's layers to the config's sources. Throws MEMSNAP_USAGE for a layer with no place to go. */
export async function selectLayers(
  manifest: Manifest,
  config: MemsnapConfig,
  only?: string[],
): Promise<SelectedLayer[]> {
  const wanted = only?.length ? new Set(only) : null;
  if (wanted) {
    for (const name of wanted) {
      if (!manifest.layers.some((l) => l.name === name)) {
        throw new MemsnapError("MEMSNAP_USAGE", `--only ${name}: the bundle has no such layer`, {
          hint: `its layers: ${manifest.layers.map((l) => l.name).join(", ")}`,
        });
      }
    }
  }
  const out: SelectedLayer[] = [];
  for (const layer of manifest.layers) {
    if (wanted && !wanted.has(layer.name)) continue;
    const source = config.sources.find((s) => s.cfg.name === layer.name);
    if (!source || source.impl.kind !== layer.kind) {
      throw new MemsnapError(
        "MEMSNAP_USAGE",
        `layer ${layer.name} (${layer.kind}) has no ${layer.kind} source named ${layer.name} in the config`,
        {
          hint: "restore it with --to DIR, or leave it out with --only",
        },
      );
    }
    if (!source.impl.liveTarget) {
      // The way out spelled: the --only flags for every other layer that can go in place.
      const others = manifest.layers.filter(
        (l) =>
          l.name !== layer.name &&
          (!wanted || wanted.has(l.name)) &&
          config.sources.find((s) => s.cfg.name === l.name && s.impl.kind === l.kind)?.impl.liveTarget,
      );
      throw new MemsnapError(
        "MEMSNAP_USAGE",
        `layer ${layer.name}: ${layer.kind} layers cannot be restored in place yet`,
        {
          hint: others.length
            ? `restore it with --to DIR; the others in place with ${others.map((l) => `--only ${l.name}`).join(" ")}`
            : "restore it with --to DIR",
        },
      );
    }
    out.push({ layer, source, target: await source.impl.liveTarget(source.cfg, config.baseDir, layer) });
  }
  return out;
}

/**
 * The swaps that make a layer's live files the staged ones. Only what the source owns is
 * swapped in: a staged file outside its globs and kind (a `files` source with include
 * `**\/*.md` and a bundle holding `run.sh`) is MEMSNAP_UNSAFE_PATH, before anything live is
 * touched. The config file this restore runs with is owned by no layer: never replaced, never
 * removed (its path goes to `kept` when the bundle has a copy).
 */
export async function buildSwaps(
  sel: SelectedLayer,
  staged: string,
  backup: string,
  protect: Protected,
  kept: string[],
  partial = false,
): Promise<Swap[]> {
  const { target, layer } = sel;
  if (target.mode === "dir") return [{ layer: layer.name, target: target.root, staged, backup }];
  const realRoot = realish(target.root);
  const isProtected = (rel: string): boolean => protect.covers(join(target.root, rel), join(realRoot, rel));
  const swaps: Swap[] = [];
  const newFiles = await listFiles(staged, { withPrivate: true });
  const have = new Set(newFiles);
  const removals = new Set<string>();
  for (const rel of newFiles) {
    if (!target.owns?.(rel)) {
      throw new MemsnapError(
        "MEMSNAP_UNSAFE_PATH",
        `layer ${layer.name}: the bundle holds ${rel}, which the ${layer.kind} source ${layer.name} does not own ` +
          "(outside its include/exclude globs or its kind's files)",
        {
          path: `${layer.name}/${rel}`,
          hint:
            "nothing was changed: an in-place restore writes only what the configured source owns; " +
            "look at the bundle with `restore --to DIR`",
        },
      );
    }
    if (isProtected(rel)) {
      kept.push(join(target.root, rel));
      continue;
    }
    swaps.push({
      layer: layer.name,
      target: join(target.root, rel),
      staged: join(staged, rel),
      backup: join(backup, rel),
    });
    for (const c of target.companions?.(rel) ?? []) removals.add(c);
  }
  // restore --path of part of a layer: the selected files are written, nothing else is touched.
  if (partial) return swaps;
  for (const rel of await listFiles(target.root)) {
    if (!have.has(rel) && target.owns?.(rel)) {
      removals.add(rel);
      for (const c of target.companions?.(rel) ?? []) removals.add(c);
    }
  }
  for (const rel of removals) {
    if (!have.has(rel) && !isProtected(rel))
      swaps.push({ layer: layer.name, target: join(target.root, rel), staged: null, backup: join(backup, rel) });
  }
  return swaps;
}

/** How the restore itself reports a live path it will not use (before the swap phase, nothing changed). */
export function refusedPath(why: string, path?: string): MemsnapError {
  return new MemsnapError("MEMSNAP_UNSAFE_PATH", `in-place restore refused: ${why}`, {
    ...(path ? { path } : {}),
    hint:
      "nothing was changed: an in-place restore never renames or creates through a symlink, " +
      "nor puts a file where a directory is; " +
      "move that path out of the way and restore again, or restore with --to DIR",
  });
}

/** A live path found unusable during the swap phase (the live tree changed under the restore). */
export function swapFailure(p: PathProblem): MemsnapError {
  return new MemsnapError("MEMSNAP_UNSAFE_PATH", `in-place restore stopped: ${p.path} ${p.why}`, {
    path: p.path,
    hint:
      "the live tree changed during the restore: move that path out of the way, " +
      "then run `memsnap recover` to finish the restore",
  });
}

/**
 * Live roots this restore must not take: one inside the control dir, or a whole directory
 * swapped in that holds the config or the control dir. MEMSNAP_USAGE, before the lock.
 */
export function checkTargets(selected: SelectedLayer[], protect: Protected): void {
  for (const s of selected) {
    const root = s.target.root;
    if (protect.covers(root, realish(root)) || (s.target.mode === "dir" && protect.inside(root))) {
      throw new MemsnapError(
        "MEMSNAP_USAGE",
        `layer ${s.layer.name}: its live root ${root} ${s.target.mode === "dir" ? "holds or is" : "is"} ` +
          "the config or memsnap's .memsnap directory, which a restore never replaces",
        {
          hint: "point the source at a directory that holds neither, or restore the layer with --to DIR",
        },
      );
    }
  }
}
