/**
 * restore --to DIR: unpack a bundle into a new or empty directory.
 *
 * Everything is written into a staging directory beside DIR (same file system), every
 * artifact's size and SHA-256 is checked as it is written, and only when the whole payload
 * matched the index is staging renamed to DIR. On any failure staging is removed, so DIR
 * is either absent/empty as before or complete.
 */
import { randomBytes } from "node:crypto";
import { mkdir, readdir, rename, rm, rmdir, writeFile } from "node:fs/promises";
import { basename, dirname, join, resolve } from "node:path";
import { MemsnapError, destinationError, interruptedOr } from "../errors.js";
import { readLayout } from "../format/container.js";
import { MANIFEST_MEMBER, parseManifest, referencedIn, type Manifest } from "../format/manifest.js";
import type { Keys } from "../pipeline/read-payload.js";
import { EarlySync, fsyncDir, syncFilesystem } from "../util/fs-atomic.js";
import { checkManifest, checkManifestFindings, enforceSignature, type SignaturePolicy } from "./preflight.js";
import { sourceKind } from "../sources/registry.js";
import { extractPayload } from "./extract.js";
import { LayerMaterializer } from "./materialize.js";
import { checkReferencedLayers, extractReferenced, openBases, References } from "./bases.js";

export interface RestoreToDirOptions extends SignaturePolicy {
  keys?: Keys;
  signal?: AbortSignal;
  onProgress?: (bytes: number, total: number) => void;
}

export interface RestoreToDirResult {
  path: string;
  manifest: Manifest;
  artifacts: number;
  bytes: number;
  durationMs: number;
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
  const bases = await openBases(bundle, manifest); // an incremental bundle's: checked before anything is written
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
  const mat = new LayerMaterializer(async (name, verified) => {
    const layer = layers.get(name);
    const impl = layer ? sourceKind(layer.kind) : undefined;
    if (!layer || !impl?.materialize) return;
    const dir = join(staging, name);
    debugStep(t0, `layer ${name} materializing`);
    opts.signal?.throwIfAborted();
    await mkdir(dir, { recursive: true });
    await impl.materialize(dir, layer, verified, opts.signal);
    debugStep(t0, `layer ${name} materialized`);
    early.kick();
  });
  // A layer with references to a base is complete only once the base has been read.
  const deferred = new Set(manifest.layers.filter((l) => referencedIn(manifest, l) > 0).map((l) => l.name));
  const refs = new References();
  try {
    let r;
    try {
      r = await extractPayload(layout, manifest, (layer) => join(staging, layer), {
        ...opts, onLayerDone: (l) => { if (!deferred.has(l)) mat.layerDone(l); }, entries: mat.verified,
        onEntry: (e) => early.bytes(e.size), onRef: refs.add,
      });
      checkReferencedLayers(manifest, refs);
      if (refs.count) {
        let done = r.entries.bytes();
        await extractReferenced(bases, refs, (layer) => join(staging, layer), {
          ...(opts.keys ? { keys: opts.keys } : {}), ...(opts.signal ? { signal: opts.signal } : {}), verified: mat.verified,
          onProgress: (n) => { done += n; early.bytes(n); opts.onProgress?.(done, manifest.payload.bytes); },
        });
        debugStep(t0, "referenced artifacts extracted from the bases");
      }
    } catch (e) {
      await mat.settle();
      throw e;
    }
    debugStep(t0, "payload extracted");
    await mat.finish(layers.keys());
    await mkdir(join(staging, ".memsnap"), { recursive: true });
    await writeFile(join(staging, ".memsnap", MANIFEST_MEMBER), layout.manifestBytes, { mode: 0o600 });
    // One syncfs for the whole tree instead of an fsync per file.
    await early.settle();
    await syncFilesystem(staging);
    debugStep(t0, "synced");
    await rmdir(target).catch((e: NodeJS.ErrnoException) => {
      if (e.code !== "ENOENT") throw destinationError(e, target);
    });
    await rename(staging, target).catch((e: unknown) => { throw destinationError(e, target); });
    await fsyncDir(dirname(target));
    // (the referenced artifacts were recorded in the same table as the bundle's own)
    return { path: target, manifest, artifacts: r.entries.length, bytes: r.entries.bytes(), durationMs: performance.now() - t0 };
  } catch (e) {
    await rm(staging, { recursive: true, force: true });
    throw interruptedOr(e, opts.signal, "restore interrupted", "nothing was restored");
  }
}
