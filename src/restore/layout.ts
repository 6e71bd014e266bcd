/**
 * restore --to DIR in the agent's own layout: each layer where the config's source path puts it,
 * relative to DIR (a SQLite layer of `db/memory.db` → DIR/db/memory.db), as an in-place restore
 * would put it relative to the config's directory.
 *
 * The places are worked out (and refused) before anything is written: every source path must be
 * inside the config's directory (relative, no `..` out of it), and a layer replaced whole (git,
 * kv) may share its directory with no other layer. The layers are extracted under their names
 * in staging as always, then moved into place inside staging (renames, after modes and mtimes
 * are set); a file that two layers both put at one path, or that lands inside a whole-layer
 * directory, fails the restore with nothing written. A layer of a kind that has no live place
 * (pfimg, criu, exec) goes under its layer name.
 */
import { mkdir, readdir, rename, rm } from "node:fs/promises";
import { isAbsolute, join, relative, resolve, sep } from "node:path";
import type { MemsnapConfig } from "../config.js";
import { MemsnapError, destinationError } from "../errors.js";
import type { Manifest } from "../format/manifest.js";
import { lexists } from "../util/fs-atomic.js";

export interface LayerPlace {
  layer: string;
  /** Relative to DIR, POSIX-free native separators; "" for DIR itself. */
  rel: string;
  mode: "dir" | "files";
}

const clash = (what: string): MemsnapError =>
  new MemsnapError("MEMSNAP_USAGE", `restore --to in the config's layout: ${what}`, {
    hint: "restore with --layout layers (each layer under its own name), or restore the layers apart with --only",
  });

const inside = (a: string, b: string): boolean => b === "" || a === b || a.startsWith(b + sep);

/**
 * Where each of `layers` goes in `target` by the config. Throws MEMSNAP_USAGE: a layer with no
 * source of its name and kind in the config, a source path outside the config's directory, or
 * whole-layer directories that overlap another layer's place.
 */
export async function layerPlaces(
  manifest: Manifest,
  config: MemsnapConfig,
  target: string,
  layers: string[],
): Promise<LayerPlace[]> {
  const out: LayerPlace[] = [];
  for (const name of layers) {
    const layer = manifest.layers.find((l) => l.name === name)!;
    const source = config.sources.find((s) => s.cfg.name === name && s.impl.kind === layer.kind);
    if (!source) throw clash(`the config has no ${layer.kind} source named ${name}`);
    if (!source.impl.liveTarget || typeof source.cfg.path !== "string") {
      out.push({ layer: name, rel: name, mode: "dir" });
      continue;
    }
    const rel = relative(config.baseDir, resolve(config.baseDir, source.cfg.path));
    if (rel === ".." || rel.startsWith(`..${sep}`) || isAbsolute(rel)) {
      throw clash(`the ${name} source's path ${source.cfg.path} is outside the config's directory ${config.baseDir}`);
    }
    let t;
    try {
      t = await source.impl.liveTarget(
        { ...source.cfg, path: rel === "" ? "." : rel } as typeof source.cfg,
        target,
        layer,
      );
    } catch {
      out.push({ layer: name, rel: name, mode: "dir" }); // no live place (a pfimg page manifest's kv layer)
      continue;
    }
    const r = relative(target, t.root);
    if (r === ".." || r.startsWith(`..${sep}`) || isAbsolute(r))
      throw clash(`layer ${name} would go to ${t.root}, outside ${target}`);
    if (r === ".memsnap" || r.startsWith(`.memsnap${sep}`))
      throw clash(`layer ${name} would go into ${join(target, ".memsnap")}, where the restore keeps the manifest`);
    out.push({ layer: name, rel: r, mode: t.mode });
  }
  for (const a of out) {
    if (a.mode !== "dir") continue;
    for (const b of out) {
      if (a === b) continue;
      // A whole-layer directory holds nothing of another layer: not the same directory, not one
      // inside it; and it is not inside another whole-layer one.
      if (inside(b.rel, a.rel) || (b.mode === "dir" && inside(a.rel, b.rel))) {
        throw clash(`layers ${a.layer} and ${b.layer} would share ${join(target, a.rel)}`);
      }
    }
  }
  return out;
}

/** Every non-directory under `dir`, relative to it. */
async function filesUnder(dir: string, rel = ""): Promise<string[]> {
  const out: string[] = [];
  for (const d of await readdir(join(dir, rel), { withFileTypes: true })) {
    const r = rel ? join(rel, d.name) : d.name;
    if (d.isDirectory()) out.push(...(await filesUnder(dir, r)));
    else out.push(r);
  }
  return out;
}

/**
 * Move the layers staged under their names in `staging` to their places (inside `staging`).
 * Throws MEMSNAP_USAGE for two layers' files at one path, or a file inside a whole-layer
 * directory; the caller removes staging.
 */
export async function arrange(staging: string, places: LayerPlace[]): Promise<{ layer: string; path: string }[]> {
  const aside = join(staging, ".memsnap-arrange");
  await mkdir(aside).catch((e: unknown) => {
    throw destinationError(e, aside);
  });
  const present: LayerPlace[] = [];
  for (const p of places) {
    if (!(await lexists(join(staging, p.layer)))) continue; // a layer with nothing selected to write
    await rename(join(staging, p.layer), join(aside, p.layer));
    present.push(p);
  }
  const dirs = present.filter((p) => p.mode === "dir");
  const owner = new Map<string, string>();
  for (const p of dirs) {
    const dest = join(staging, p.rel);
    if (p.rel === "") {
      for (const f of await readdir(join(aside, p.layer))) {
        if (await lexists(join(staging, f))) throw clash(`layer ${p.layer}'s ${f} would replace ${f} of the restore`);
        await rename(join(aside, p.layer, f), join(staging, f));
      }
      continue;
    }
    if (await lexists(dest)) throw clash(`layer ${p.layer} would go to ${p.rel}, where something else already is`);
    await mkdir(join(dest, ".."), { recursive: true });
    await rename(join(aside, p.layer), dest);
  }
  for (const p of present.filter((x) => x.mode === "files")) {
    for (const f of await filesUnder(join(aside, p.layer))) {
      const rel = p.rel ? join(p.rel, f) : f;
      const inDir = dirs.find((d) => inside(rel, d.rel));
      if (inDir) throw clash(`layer ${p.layer}'s ${f} would go to ${rel}, inside layer ${inDir.layer}'s directory`);
      if (rel === ".memsnap" || rel.startsWith(`.memsnap${sep}`))
        throw clash(`layer ${p.layer}'s ${f} would go to ${rel}, where the restore keeps the manifest`);
      const dest = join(staging, rel);
      if (owner.has(rel) || (await lexists(dest)))
        throw clash(`layers ${owner.get(rel) ?? "?"} and ${p.layer} both have a file at ${rel}`);
      try {
        await mkdir(join(dest, ".."), { recursive: true });
      } catch (e) {
        const code = (e as NodeJS.ErrnoException).code;
        if (code === "EEXIST" || code === "ENOTDIR")
          throw clash(`layer ${p.layer}'s ${f} would go to ${rel}, below a file of another layer`);
        throw destinationError(e, dest);
      }
      await rename(join(aside, p.layer, f), dest);
      owner.set(rel, p.layer);
    }
  }
  await rm(aside, { recursive: true, force: true });
  return present.map((p) => ({ layer: p.layer, path: p.rel === "" ? "." : p.rel.split(sep).join("/") }));
}
