/**
 * restore --to DIR: unpack a bundle into a new or empty directory.
 *
 * Everything is written into a staging directory beside DIR (same file system), every
 * artifact's size and SHA-256 is checked as it is written, and only when the whole payload
 * matched the index is staging renamed to DIR. On any failure staging is removed, so DIR
 * is either absent/empty as before or complete.
 */
import { randomBytes } from "node:crypto";
import { chmod, mkdir, readdir, rename, rm, rmdir, stat, writeFile } from "node:fs/promises";
import { basename, dirname, join, resolve } from "node:path";
import { MemsnapError, destinationError, interruptedOr } from "../errors.js";
import { readLayout } from "../format/container.js";
import { MANIFEST_MEMBER, parseManifest, referencedIn, type Manifest } from "../format/manifest.js";
import type { Keys } from "../read/read-payload.js";
import { EarlySync, fsyncDir, syncFilesystem } from "../util/fs-atomic.js";
import { checkManifest, checkManifestFindings, enforceSignature, type SignaturePolicy } from "../read/preflight.js";
import { sourceKind } from "../sources/registry.js";
import { extractPayload, RestoredAttributes } from "../read/extract.js";
import { LayerMaterializer } from "./materialize.js";
import { loadIndex, selectPaths } from "../browse/index.js";
import type { MemsnapConfig } from "../config.js";
import { arrange, layerPlaces } from "./layout.js";
import { basesNeeded, checkReferencedLayers, extractReferenced, openBases, References } from "../read/bases.js";

export interface RestoreToDirOptions extends SignaturePolicy {
  keys?: Keys;
  signal?: AbortSignal;
  onProgress?: (bytes: number, total: number) => void;
  /** Restore only these layers (by name); the others are read and checked, not written. */
  only?: string[];
  /**
   * Restore only the artifacts these patterns select (payload paths, see browse/index.ts
   * pathFilter); a layer rebuilt from all of its artifacts (git, sqlite, kv, …) only whole.
   */
  paths?: string[];
  /**
   * Where each layer goes in `to`: by default (`layers`) under its layer name; with a config,
   * where the config's source path puts it, relative to `to` (see ./layout.ts).
   */
  layout?:
    | { kind: "layers" }
    | {
        kind: "config";
        config: MemsnapConfig;
        /**
         * Where the config cannot place the layers (a layer it has no source for, paths that overlap): fall back to the
         * layer names with a note instead of MEMSNAP_USAGE.
         */
        fallback?: boolean;
      };
}

export interface RestoreToDirResult {
  path: string;
  manifest: Manifest;
  artifacts: number;
  bytes: number;
  durationMs: number;
  /** What the user should know of how a layer was restored (git: symlinks written as plain files). */
  notes: string[];
  /** Where each restored layer was put, relative to `path` (a file layer's root; "." for the top). */
  placed: { layer: string; path: string }[];
  /** The layout used: `config` unless none was asked for or the config could not place the layers. */
  layout: "config" | "layers";
}

async function isEmptyOrAbsent(dir: string): Promise<boolean> {
  try {
    return (await readdir(dir)).length === 0;
  } catch (e) {
    const code = (e as NodeJS.ErrnoException).code;
    if (code === "ENOENT") return true;
    throw destinationError(e, dir);
  }
}

/** With MEMSNAP_DEBUG_ENCODER set: when each restore step ended, on stderr. */
function debugStep(t0: number, what: string): void {
  if (process.env.MEMSNAP_DEBUG_ENCODER)
    process.stderr.write(`restore: ${what} at ${Math.round(performance.now() - t0)} ms\n`);
}

/**
 * Restore a bundle into `to`. Throws: MEMSNAP_DEST_NOT_EMPTY, MEMSNAP_DEST_UNWRITABLE/FULL,
 * the bundle's own errors (MEMSNAP_BUNDLE_*, MEMSNAP_MANIFEST_CORRUPT, MEMSNAP_SEAL_MISMATCH,
 * MEMSNAP_UNSUPPORTED_*), MEMSNAP_IDENTITY_REQUIRED / MEMSNAP_DECRYPT_FAILED, MEMSNAP_UNSAFE_PATH,
 * and MEMSNAP_ARTIFACT_HASH_MISMATCH / MEMSNAP_INDEX_MISMATCH / MEMSNAP_PAYLOAD_HASH_MISMATCH.
 */
export async function restoreToDir(
  bundle: string,
  to: string,
  opts: RestoreToDirOptions = {},
): Promise<RestoreToDirResult> {
  const t0 = performance.now();
  const target = resolve(to);
  const layout = await readLayout(bundle);
  const manifest = parseManifest(layout.manifestBytes);
  checkManifestFindings(checkManifest(manifest, layout));
  enforceSignature(manifest, opts);
  if (manifest.payload.encryption && !(opts.keys?.identities?.length || opts.keys?.passphrases?.length)) {
    throw new MemsnapError("MEMSNAP_IDENTITY_REQUIRED", "the bundle is encrypted and no identity was given", {
      hint: "pass --identity FILE (an age identity file) or --passphrase-file FILE",
    });
  }
  for (const name of opts.only ?? []) {
    if (!manifest.layers.some((l) => l.name === name)) {
      throw new MemsnapError("MEMSNAP_USAGE", `--only ${name}: the bundle has no such layer`, {
        hint: `its layers: ${manifest.layers.map((l) => l.name).join(", ")}`,
      });
    }
  }
  // --path: which artifacts, from the index (the manifest's, else a first read of the payload).
  const selection = opts.paths?.length
    ? selectPaths(
        manifest,
        await loadIndex({ path: bundle, layout, manifest }, opts.keys ?? {}, opts.signal),
        opts.paths,
        opts.only,
      )
    : null;
  const partial = selection ? selection.layers : opts.only?.length ? new Set(opts.only) : null;
  const want = selection?.want;
  // The config layout: every selected layer's place in `to`, checked before anything is written.
  const notes: string[] = [];
  let places = null;
  if (opts.layout?.kind === "config") {
    try {
      places = await layerPlaces(manifest, opts.layout.config, target, [
        ...(partial ?? manifest.layers.map((l) => l.name)),
      ]);
    } catch (e) {
      if (!opts.layout.fallback || !(e instanceof MemsnapError) || e.code !== "MEMSNAP_USAGE") throw e;
      notes.push(
        `${e.message.replace(/^restore --to in the config's layout: /, "")}: ` +
          "each layer was restored under its layer name instead (--layout layers)",
      );
    }
  }
  const selected = (layer: string): boolean => !partial || partial.has(layer);
  // An incremental bundle's bases: checked before anything is written. A partial restore needs
  // only those its layers reference: known here from a plaintext index, else once the bundle's
  // own payload is read (into staging).
  const needed = partial ? basesNeeded(manifest, partial) : undefined;
  let bases = needed === null ? null : await openBases(bundle, manifest, needed);
  if (!(await isEmptyOrAbsent(target))) {
    throw new MemsnapError("MEMSNAP_DEST_NOT_EMPTY", `${target} exists and is not empty`, {
      path: target,
      hint: "restore into a new or empty directory",
    });
  }
  const staging = join(
    dirname(target),
    `.${basename(target)}.memsnap-staging-${process.pid}-${randomBytes(4).toString("hex")}`,
  );
  try {
    await mkdir(staging, { recursive: false, mode: 0o700 });
  } catch (e) {
    throw destinationError(e, staging);
  }
  // Writeback of what is staged starts while later layers extract (see EarlySync).
  const early = new EarlySync(() => [staging]);
  // Turn each layer's raw artifacts into their live form (a git repo from its bundle, …) as
  // soon as extraction has moved past it; see ./materialize.ts.
  const layers = new Map(manifest.layers.map((l) => [l.name, l]));
  const mat = new LayerMaterializer(async (name, verified) => {
    if (!selected(name)) return;
    const layer = layers.get(name);
    const impl = layer ? sourceKind(layer.kind) : undefined;
    if (!layer || !impl?.materialize) return;
    const dir = join(staging, name);
    debugStep(t0, `layer ${name} materializing`);
    opts.signal?.throwIfAborted();
    await mkdir(dir, { recursive: true });
    notes.push(...((await impl.materialize(dir, layer, verified, opts.signal)) ?? []));
    debugStep(t0, `layer ${name} materialized`);
    early.kick();
  });
  // A layer with references to a base is complete only once the base has been read.
  const deferred = new Set(manifest.layers.filter((l) => referencedIn(manifest, l) > 0).map((l) => l.name));
  const refs = new References();
  const wanted = want ? new References() : refs; // the references --path selects
  const attributes = new RestoredAttributes();
  try {
    let r;
    try {
      r = await extractPayload(layout, manifest, (layer) => (selected(layer) ? join(staging, layer) : null), {
        ...opts,
        onLayerDone: (l) => {
          if (!deferred.has(l)) mat.layerDone(l);
        },
        entries: mat.verified,
        onEntry: (e) => early.bytes(e.size),
        onRef: (a) => {
          refs.add(a);
          if (!want || want(a.path)) wanted.add(a);
        },
        attributes,
        ...(want ? { want } : {}),
        // A keyed restore: the AEAD tags and the sealed index prove what the stored bytes' hash
        // would (ReadPayloadOptions.skipStoredHash); a plaintext payload is hashed all the same.
        skipStoredHash: true,
      });
      checkReferencedLayers(manifest, refs);
      if (wanted.count) {
        let done = r.entries.bytes();
        bases ??= await openBases(bundle, manifest, wanted.basesIn(partial ?? undefined));
        await extractReferenced(bases, wanted, (layer) => (selected(layer) ? join(staging, layer) : null), {
          ...(opts.keys ? { keys: opts.keys } : {}),
          ...(opts.signal ? { signal: opts.signal } : {}),
          verified: mat.verified,
          ...(partial ? { layers: partial } : {}),
          skipStoredHash: true,
          onProgress: (n) => {
            done += n;
            early.bytes(n);
            opts.onProgress?.(done, manifest.payload.bytes);
          },
          attributes,
        });
        debugStep(t0, "referenced artifacts extracted from the bases");
      }
    } catch (e) {
      await mat.settle();
      throw e;
    }
    debugStep(t0, "payload extracted");
    await mat.finish([...layers.keys()].filter(selected));
    await mkdir(join(staging, ".memsnap"), { recursive: true });
    await writeFile(join(staging, ".memsnap", MANIFEST_MEMBER), layout.manifestBytes, { mode: 0o600 });
    // One syncfs for the whole tree instead of an fsync per file.
    await early.settle();
    attributes.apply(); // modes and mtimes, synced with the rest
    // The config layout: the layers moved from their names to their places (after the modes are set on the names).
    const placed = places
      ? await arrange(staging, places)
      : [...layers.keys()].filter(selected).map((l) => ({ layer: l, path: l }));
    // An empty directory made for the restore keeps its permissions (staging is made 0700).
    const made = await stat(target).catch(() => null);
    if (made?.isDirectory())
      await chmod(staging, made.mode & 0o7777).catch((e: unknown) => {
        throw destinationError(e, staging);
      });
    await syncFilesystem(staging);
    debugStep(t0, "synced");
    await rmdir(target).catch((e: NodeJS.ErrnoException) => {
      if (e.code !== "ENOENT") throw destinationError(e, target);
    });
    await rename(staging, target).catch((e: unknown) => {
      throw destinationError(e, target);
    });
    await fsyncDir(dirname(target));
    // (the referenced artifacts were recorded in the same table as the bundle's own)
    const mine = (name: string): boolean => selected(name.slice(0, name.indexOf("/"))) && (!want || want(name));
    let artifacts = r.entries.length;
    if (partial) {
      artifacts = 0;
      for (let i = 0; i < r.entries.length; i++) if (mine(r.entries.name(i))) artifacts++;
    }
    return {
      path: target,
      manifest,
      artifacts,
      bytes: r.entries.bytes(partial ? mine : undefined),
      durationMs: performance.now() - t0,
      notes,
      placed,
      layout: places ? "config" : "layers",
    };
  } catch (e) {
    await rm(staging, { recursive: true, force: true });
    throw interruptedOr(e, opts.signal, "restore interrupted", "nothing was restored");
  }
}
