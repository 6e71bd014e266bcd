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
import type { Keys } from "../pipeline/read-payload.js";
import { EarlySync, fsyncDir, syncFilesystem } from "../util/fs-atomic.js";
import { checkManifest, checkManifestFindings, enforceSignature, type SignaturePolicy } from "./preflight.js";
import { sourceKind } from "../sources/registry.js";
import { extractPayload, RestoredAttributes } from "./extract.js";
import { LayerMaterializer } from "./materialize.js";
import { basesNeeded, checkReferencedLayers, extractReferenced, openBases, References } from "./bases.js";

export interface RestoreToDirOptions extends SignaturePolicy {
  keys?: Keys;
  signal?: AbortSignal;
  onProgress?: (bytes: number, total: number) => void;
  /** Restore only these layers (by name); the others are read and checked, not written. */
  only?: string[];
}

export interface RestoreToDirResult {
  path: string;
  manifest: Manifest;
  artifacts: number;
  bytes: number;
  durationMs: number;
  /** What the user should know of how a layer was restored (git: symlinks written as plain files). */
  notes: string[];
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
  if (process.env.MEMSNAP_DEBUG_ENCODER) process.stderr.write(`restore: ${what} at ${Math.round(performance.now() - t0)} ms\n`);
}

/**
 * Restore a bundle into `to`. Throws: MEMSNAP_DEST_NOT_EMPTY, MEMSNAP_DEST_UNWRITABLE/FULL,
 * the bundle's own errors (MEMSNAP_BUNDLE_*, MEMSNAP_MANIFEST_CORRUPT, MEMSNAP_SEAL_MISMATCH,
 * MEMSNAP_UNSUPPORTED_*), MEMSNAP_IDENTITY_REQUIRED / MEMSNAP_DECRYPT_FAILED, MEMSNAP_UNSAFE_PATH,
 * and MEMSNAP_ARTIFACT_HASH_MISMATCH / MEMSNAP_INDEX_MISMATCH / MEMSNAP_PAYLOAD_HASH_MISMATCH.
 */
export async function restoreToDir(bundle: string, to: string, opts: RestoreToDirOptions = {}): Promise<RestoreToDirResult> {
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
  const partial = opts.only?.length ? new Set(opts.only) : null;
  for (const name of partial ?? []) {
    if (!manifest.layers.some((l) => l.name === name)) {
      throw new MemsnapError("MEMSNAP_USAGE", `--only ${name}: the bundle has no such layer`, { hint: `its layers: ${manifest.layers.map((l) => l.name).join(", ")}` });
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
      path: target, hint: "restore into a new or empty directory",
    });
  }
  const staging = join(dirname(target), `.${basename(target)}.memsnap-staging-${process.pid}-${randomBytes(4).toString("hex")}`);
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
  const notes: string[] = [];
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
  const attributes = new RestoredAttributes();
  try {
    let r;
    try {
      r = await extractPayload(layout, manifest, (layer) => (selected(layer) ? join(staging, layer) : null), {
        ...opts, onLayerDone: (l) => { if (!deferred.has(l)) mat.layerDone(l); }, entries: mat.verified,
        onEntry: (e) => early.bytes(e.size), onRef: refs.add, attributes,
      });
      checkReferencedLayers(manifest, refs);
      if (refs.count) {
        let done = r.entries.bytes();
        bases ??= await openBases(bundle, manifest, refs.basesIn(partial ?? undefined));
        await extractReferenced(bases, refs, (layer) => (selected(layer) ? join(staging, layer) : null), {
          ...(opts.keys ? { keys: opts.keys } : {}), ...(opts.signal ? { signal: opts.signal } : {}), verified: mat.verified, ...(partial ? { layers: partial } : {}),
          onProgress: (n) => { done += n; early.bytes(n); opts.onProgress?.(done, manifest.payload.bytes); }, attributes,
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
    // An empty directory made for the restore keeps its permissions (staging is made 0700).
    const made = await stat(target).catch(() => null);
    if (made?.isDirectory()) await chmod(staging, made.mode & 0o7777).catch((e: unknown) => { throw destinationError(e, staging); });
    await syncFilesystem(staging);
    debugStep(t0, "synced");
    await rmdir(target).catch((e: NodeJS.ErrnoException) => {
      if (e.code !== "ENOENT") throw destinationError(e, target);
    });
    await rename(staging, target).catch((e: unknown) => { throw destinationError(e, target); });
    await fsyncDir(dirname(target));
    // (the referenced artifacts were recorded in the same table as the bundle's own)
    const mine = (name: string): boolean => selected(name.slice(0, name.indexOf("/")));
    let artifacts = r.entries.length;
    if (partial) {
      artifacts = 0;
      for (let i = 0; i < r.entries.length; i++) if (mine(r.entries.name(i))) artifacts++;
    }
    return { path: target, manifest, artifacts, bytes: r.entries.bytes(partial ? mine : undefined), durationMs: performance.now() - t0, notes };
  } catch (e) {
    await rm(staging, { recursive: true, force: true });
    throw interruptedOr(e, opts.signal, "restore interrupted", "nothing was restored");
  }
}
