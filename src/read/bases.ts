/**
 * Restoring and verifying an incremental bundle (manifest_version 2): the artifacts it references
 * are read from its bases, the bundles beside it that hold their bytes.
 *
 * A base is found by id in the bundle's own directory and must be the bundle the reference was
 * made against: its seal equal to the one recorded in `bases`, the same tenant and agent. Its
 * payload is read whole and checked against its own index as any payload is (every entry's
 * size and SHA-256, the payload hash, the index binding), and each referenced artifact must be
 * one of its entries with the size and SHA-256 the referencing index records. Only the
 * referenced entries are written; the others are hashed and dropped.
 */
import { mkdir, open } from "node:fs/promises";
import { dirname, join } from "node:path";
import { MemsnapError } from "../errors.js";
import { readLayout, type BundleLayout } from "../format/container.js";
import { siblingBundle } from "../format/bundle-file.js";
import { rangeBases, type ChunkRange } from "../format/chunked.js";
import {
  basesOf,
  checkSeal,
  isChunkedIn,
  parseManifest,
  referencedIn,
  type IndexEntry,
  type Manifest,
} from "../format/manifest.js";
import { sourceKind } from "../sources/registry.js";
import type { EntryTable } from "./entry-table.js";
import type { EntryHandler, Keys } from "./read-payload.js";
import { extractPayload, RestoredAttributes } from "./extract.js";
import { checkManifest, checkManifestFindings } from "./preflight.js";
import { checkAssembled, fileChunks, PiecePlacer, spreadStored, type ChunkedTarget } from "./chunked.js";

export interface OpenBase {
  id: string;
  layout: BundleLayout;
  manifest: Manifest;
}

/** Where a bundle's base `id` must be: beside it. */
export function basePath(bundle: string, id: string): string {
  return siblingBundle(bundle, id);
}

/**
 * Open and check the bases of `manifest` (the bundle at `bundle`), every one or those in `ids`:
 * present, readable, sealed as recorded, the same agent. Throws MEMSNAP_BASE_MISSING or
 * MEMSNAP_BASE_MISMATCH.
 */
export async function openBases(bundle: string, manifest: Manifest, ids?: ReadonlySet<string>): Promise<OpenBase[]> {
  const out: OpenBase[] = [];
  for (const b of basesOf(manifest)) {
    if (ids && !ids.has(b.snapshot_id)) continue;
    const path = basePath(bundle, b.snapshot_id);
    let layout: BundleLayout;
    try {
      layout = await readLayout(path);
    } catch (e) {
      if ((e as { code?: string }).code === "MEMSNAP_SOURCE_MISSING") {
        throw new MemsnapError(
          "MEMSNAP_BASE_MISSING",
          `snapshot ${manifest.snapshot_id} is incremental and its base ${b.snapshot_id} is not beside it (${path})`,
          {
            path,
            hint:
              "copy the base bundle next to it (memsnap export copies a snapshot with its bases), or restore " +
              "another snapshot",
          },
        );
      }
      throw e;
    }
    const m = parseManifest(layout.manifestBytes);
    if (
      m.snapshot_id !== b.snapshot_id ||
      m.seal !== b.seal ||
      !checkSeal(m) ||
      m.tenant !== manifest.tenant ||
      m.agent !== manifest.agent
    ) {
      throw new MemsnapError(
        "MEMSNAP_BASE_MISMATCH",
        `${path} is not the base snapshot ${manifest.snapshot_id} was taken against (its seal or agent differs)`,
        {
          path,
          hint: "the base was replaced or damaged; restore another snapshot",
        },
      );
    }
    checkManifestFindings(checkManifest(m, layout));
    out.push({ id: b.snapshot_id, layout, manifest: m });
  }
  return out;
}

/** What a reference records of its artifact: its bytes' size and hash, and the file's mode and mtime. */
type Reference = Pick<IndexEntry, "size" | "sha256" | "mode" | "mtime">;

type Chunked = IndexEntry & { ranges: ChunkRange[] };

/**
 * The references an incremental bundle's index lists, by base (collected as its payload is
 * read), and its chunked artifacts (manifest_version 4), whose stored ranges its payload held.
 */
export class References {
  readonly #byBase = new Map<string, Map<string, Reference>>();
  /** Chunked artifacts by payload path. */
  readonly chunked = new Map<string, Chunked>();
  count = 0;
  bytes = 0;

  /** Pass as extractPayload's / readPayload's `onRef`. */
  readonly add = (a: IndexEntry): void => {
    // (only a version 4 index hands over chunked entries, which never have a `ref`: see IndexComparer)
    if (a.ref === undefined && a.ranges !== undefined) {
      this.chunked.set(a.path, a as Chunked);
      this.count++;
      this.bytes += a.size - (a.stored_size ?? 0);
      return;
    }
    let m = this.#byBase.get(a.ref!);
    if (!m) this.#byBase.set(a.ref!, (m = new Map()));
    m.set(a.path, { size: a.size, sha256: a.sha256, mode: a.mode, mtime: a.mtime });
    this.count++;
    this.bytes += a.size;
  };

  of(base: string): Map<string, Reference> | undefined {
    return this.#byBase.get(base);
  }

  /** How many references (and chunked artifacts) each layer has. */
  perLayer(): Map<string, number> {
    const out = new Map<string, number>();
    const count = (p: string): void => {
      const l = layerOf(p);
      out.set(l, (out.get(l) ?? 0) + 1);
    };
    for (const m of this.#byBase.values()) for (const p of m.keys()) count(p);
    for (const p of this.chunked.keys()) count(p);
    return out;
  }

  /** The bases referenced, or read by chunked artifacts, from these layers (every layer's without `layers`). */
  basesIn(layers?: ReadonlySet<string>): Set<string> {
    const out = new Set<string>();
    for (const [id, m] of this.#byBase) if (!layers || [...m.keys()].some((p) => layers.has(layerOf(p)))) out.add(id);
    for (const e of this.chunked.values())
      if (!layers || layers.has(e.layer)) for (const id of rangeBases(e.ranges)) out.add(id);
    return out;
  }
}

const layerOf = (path: string): string => path.slice(0, path.indexOf("/"));

/**
 * The bases a restore of `layers` needs, when the manifest says (a plaintext bundle's index is
 * in it, up to MANIFEST_INDEX_MAX artifacts); null when only the payload's index can tell.
 */
export function basesNeeded(manifest: Manifest, layers: ReadonlySet<string>): Set<string> | null {
  if (!manifest.index) return null;
  const out = new Set<string>();
  for (const e of manifest.index) {
    if (!layers.has(e.layer)) continue;
    if (isChunkedIn(manifest, e)) for (const id of rangeBases(e.ranges!)) out.add(id);
    else if (e.ref !== undefined) out.add(e.ref);
  }
  return out;
}

export interface ReferencedOptions {
  keys?: Keys;
  signal?: AbortSignal;
  onProgress?: (bytes: number) => void;
  /** Record each referenced entry written (path → SHA-256) for materialize, as the bundle's own are. */
  verified?: EntryTable;
  /** Only these layers (a partial restore); others are not written. */
  layers?: Set<string>;
  /** The bytes of each referenced artifact not written (its layer has no root): see ExtractOptions.peek. */
  peek?: EntryHandler;
  /**
   * Where to note the mode and mtime (the referencing index's) of each referenced file written, as extractPayload does.
   */
  attributes?: RestoredAttributes;
  /**
   * The file a chunked artifact is reassembled in, holding its stored ranges (see
   * {@link extractStored}); by default `<rootFor(layer)>/<path in the layer>`, where extractPayload
   * wrote its payload entry. Null: the artifact is not reassembled (its layer is not restored).
   */
  chunkFile?: (e: IndexEntry) => string | null;
  /** Handed each reassembled chunked artifact's bytes, once they matched the index (verify --deep). */
  assembled?: EntryHandler;
  /** A restore: the bases' age payloads are read without the stored bytes' hash (ExtractOptions.skipStoredHash). */
  skipStoredHash?: boolean;
}

/**
 * Write every referenced artifact from its base into `rootFor(layer)`, each base read once and
 * checked whole against its own index. Throws MEMSNAP_INDEX_MISMATCH (a reference its base does
 * not hold), MEMSNAP_ARTIFACT_HASH_MISMATCH (held with other bytes), and the base's own errors.
 */
export async function extractReferenced(
  bases: OpenBase[],
  refs: References,
  rootFor: (layer: string) => string | null,
  opts: ReferencedOptions = {},
): Promise<void> {
  const unopened = [...refs.basesIn(opts.layers)].filter((id) => !bases.some((b) => b.id === id));
  if (unopened.length)
    throw new MemsnapError("MEMSNAP_INTERNAL", `base ${unopened[0]} is referenced but was not opened`);
  const layerOk = (layer: string): boolean => !opts.layers || opts.layers.has(layer);
  // Chunked artifacts: their stored ranges are moved into place first, then their bases fill the rest.
  const chunkFile =
    opts.chunkFile ??
    ((e: IndexEntry): string | null => {
      const root = rootFor(e.layer);
      return root === null ? null : join(root, ...e.path.slice(e.layer.length + 1).split("/"));
    });
  const targets: ChunkedTarget[] = [];
  for (const e of refs.chunked.values()) {
    if (!layerOk(e.layer)) continue;
    const file = chunkFile(e);
    if (file !== null) targets.push({ entry: e, file });
  }
  for (const t of targets) await spreadStored(t);
  const placer = new PiecePlacer(targets);
  const pieceBases = placer.bases();
  const read = new Set<string>();
  for (const base of bases) {
    const wanted = refs.of(base.id) ?? new Map<string, Reference>();
    // (a partial restore reads only the bases that hold artifacts of its layers)
    const whole = wanted.size > 0 && (!opts.layers || [...wanted.keys()].some((p) => layerOk(layerOf(p))));
    if (!whole && !pieceBases.has(base.id)) continue;
    read.add(base.id);
    const found = new Set<string>();
    const attributed = new Set(
      base.manifest.layers.filter((l) => RestoredAttributes.wanted(l.kind)).map((l) => l.name),
    );
    const pieces = placer.handler(base.id);
    await extractPayload(base.layout, base.manifest, (layer) => (layerOk(layer) ? rootFor(layer) : null), {
      ...(opts.keys ? { keys: opts.keys } : {}),
      ...(opts.signal ? { signal: opts.signal } : {}),
      want: (name) => wanted.has(name) || placer.has(base.id, name),
      resumeSpools: true,
      ...(opts.skipStoredHash ? { skipStoredHash: true } : {}),
      ...(opts.peek ? { peek: opts.peek } : {}),
      divert: (name) => (placer.has(base.id, name) ? pieces : undefined),
      onEntry: (e) => {
        const w = wanted.get(e.name);
        if (!w || placer.has(base.id, e.name)) return;
        if (w.size !== e.size || w.sha256 !== e.sha256) {
          throw new MemsnapError(
            "MEMSNAP_ARTIFACT_HASH_MISMATCH",
            `${e.name}: base ${base.id} holds other bytes than the reference records`,
            {
              path: e.name,
              hint: "the bundle or its base is damaged or was altered; nothing was restored",
            },
          );
        }
        found.add(e.name);
        const layer = layerOf(e.name);
        const root = opts.attributes && attributed.has(layer) && layerOk(layer) ? rootFor(layer) : null;
        if (root !== null) opts.attributes!.add(root, e.name, w);
        if (layerOk(layerOf(e.name))) {
          opts.verified?.add(e.name, e.size, Buffer.from(e.sha256, "hex"));
          opts.onProgress?.(e.size);
        }
      },
    });
    for (const p of wanted.keys()) {
      if (!found.has(p)) {
        throw new MemsnapError(
          "MEMSNAP_INDEX_MISMATCH",
          `${p} is referenced from base ${base.id}, which does not hold it`,
          {
            path: p,
            hint: "the bundle or its base is damaged or was altered; nothing was restored",
          },
        );
      }
    }
  }
  placer.finish(read);
  for (const t of targets) {
    const unread = [...rangeBases(t.entry.ranges)].find((id) => !read.has(id));
    if (unread !== undefined)
      throw new MemsnapError("MEMSNAP_INTERNAL", `base ${unread} is read by ${t.entry.path} but was not opened`);
    const digest = await checkAssembled(t);
    opts.verified?.replace(t.entry.path, t.entry.size, digest);
    opts.onProgress?.(t.entry.size - t.entry.stored_size!);
    if (opts.assembled) {
      await opts.assembled(
        {
          name: t.entry.path,
          size: t.entry.size,
          layer: t.entry.layer,
          rel: t.entry.path.slice(t.entry.layer.length + 1),
        },
        fileChunks(t.file),
      );
    }
  }
}

/**
 * A bundle's own payload read again for the stored ranges of the chunked artifacts in `refs`,
 * each written to `fileFor(entry)` (a new file) and checked against the index with the rest of
 * the payload: what {@link extractReferenced} needs where the first read kept nothing (verify).
 */
export async function extractStored(
  layout: BundleLayout,
  manifest: Manifest,
  refs: References,
  fileFor: (e: IndexEntry) => string,
  keys: Keys,
  signal?: AbortSignal,
): Promise<void> {
  await extractPayload(layout, manifest, () => null, {
    keys,
    ...(signal ? { signal } : {}),
    want: (name) => refs.chunked.has(name),
    divert: (name) => {
      const e = refs.chunked.get(name);
      if (!e) return undefined;
      return async (_info, chunks) => {
        const file = fileFor(e);
        await mkdir(dirname(file), { recursive: true });
        const fh = await open(file, "wx", 0o600);
        try {
          for await (const c of chunks) await fh.write(c);
        } finally {
          await fh.close();
        }
      };
    },
  });
}

/**
 * The index's references must be exactly what the manifest's layers declare (`referenced`):
 * a restore holds back the materialization of those layers only, so a reference in another
 * layer would be written after that layer was rebuilt. Throws MEMSNAP_INDEX_MISMATCH.
 */
export function checkReferencedLayers(manifest: Manifest, refs: References): void {
  const declared = new Set(basesOf(manifest).map((b) => b.snapshot_id));
  const unknown = [...refs.basesIn()].find((id) => !declared.has(id));
  if (unknown !== undefined) {
    throw new MemsnapError(
      "MEMSNAP_INDEX_MISMATCH",
      `the index references ${unknown}, which is not one of the bundle's bases`,
      {
        hint: "the bundle is damaged or was altered; nothing was restored",
      },
    );
  }
  for (const e of refs.chunked.values()) {
    // A layer whose restore spools its artifacts (KV pages) writes no file to reassemble.
    const kind = manifest.layers.find((l) => l.name === e.layer)?.kind;
    if (kind !== undefined && sourceKind(kind)?.restoreSpool) {
      throw new MemsnapError(
        "MEMSNAP_UNSAFE_BUNDLE",
        `${e.path} is chunked, which a ${kind} layer's artifacts never are`,
        {
          path: e.path,
          hint: "the bundle is damaged or was altered; nothing was restored",
        },
      );
    }
  }
  const got = refs.perLayer();
  for (const l of manifest.layers) {
    const want = referencedIn(manifest, l);
    if ((got.get(l.name) ?? 0) !== want) {
      throw new MemsnapError(
        "MEMSNAP_INDEX_MISMATCH",
        `layer ${l.name}: the index references ${got.get(l.name) ?? 0} artifact(s) in bases, the manifest says ${want}`,
        {
          hint: "the bundle is damaged or was altered; nothing was restored",
        },
      );
    }
    got.delete(l.name);
  }
  const stray = [...got.keys()][0];
  if (stray !== undefined) {
    throw new MemsnapError(
      "MEMSNAP_INDEX_MISMATCH",
      `the index references artifacts of ${stray}, which is not a layer of this bundle`,
      {
        hint: "the bundle is damaged or was altered; nothing was restored",
      },
    );
  }
}
