/**
 * Browsing a snapshot: its artifact index (`ls`, `find`), one artifact's bytes (`cat`), and the
 * artifacts a `restore --path` selects.
 *
 * The index comes from the manifest when it holds one (a plaintext bundle of up to
 * MANIFEST_INDEX_MAX artifacts; the seal binds it): nothing of the payload is read. Otherwise
 * (an encrypted bundle, or a manifest_version 3 one without the index) the index is the
 * payload tar's last member: the payload is streamed (decrypted with the key, decompressed,
 * every entry hashed and dropped) and checked against it as a restore checks it.
 */
import { createHash, randomBytes } from "node:crypto";
import { createReadStream } from "node:fs";
import { mkdtemp, open, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { pipeline } from "node:stream/promises";
import type { Writable } from "node:stream";
import { MemsnapError } from "../errors.js";
import { readLayout, type BundleLayout } from "../format/container.js";
import { isChunkedIn, parseManifest, refOf, storedOf, type IndexEntry, type Manifest } from "../format/manifest.js";
import { compareWithIndex, readPayload, type Keys } from "../read/read-payload.js";
import { checkManifest, checkManifestFindings, enforceSignature, type SignaturePolicy } from "../read/preflight.js";
import { extractReferenced, openBases, References } from "../read/bases.js";
import { compileGlobs } from "../util/glob.js";
import { sourceKind } from "../sources/registry.js";

export interface OpenedSnapshot {
  path: string;
  layout: BundleLayout;
  manifest: Manifest;
}

/** Open a bundle and check its manifest (seal, version, layers) and signature policy. */
export async function openSnapshot(bundle: string, policy: SignaturePolicy = {}): Promise<OpenedSnapshot> {
  const layout = await readLayout(bundle);
  const manifest = parseManifest(layout.manifestBytes);
  checkManifestFindings(checkManifest(manifest, layout));
  enforceSignature(manifest, policy);
  return { path: bundle, layout, manifest };
}

const hasKey = (keys: Keys): boolean => !!(keys.identities?.length || keys.passphrases?.length);

/** Whether listing this snapshot's files needs its payload (and, encrypted, the key). */
export function indexNeedsPayload(manifest: Manifest): boolean {
  return !manifest.index;
}

function integrityError(findings: ReturnType<typeof compareWithIndex>, what: string): MemsnapError {
  const f = findings[0]!;
  return new MemsnapError(
    f.code,
    findings.length === 1 ? f.message : `${findings.length} problems, first: ${f.message}`,
    {
      findings,
      ...(f.path ? { path: f.path } : {}),
      hint: `the bundle is damaged or was altered; ${what}`,
    },
  );
}

/**
 * The snapshot's artifact index: the manifest's copy, else the payload's (streamed, every entry
 * hashed and checked against it). Throws MEMSNAP_IDENTITY_REQUIRED for an encrypted bundle
 * without a key, the key and integrity errors of a payload read.
 */
export async function loadIndex(s: OpenedSnapshot, keys: Keys = {}, signal?: AbortSignal): Promise<IndexEntry[]> {
  if (s.manifest.index) return s.manifest.index;
  if (s.manifest.payload.encryption && !hasKey(keys)) {
    throw new MemsnapError(
      "MEMSNAP_IDENTITY_REQUIRED",
      `snapshot ${s.manifest.snapshot_id} is encrypted: its file list is in the encrypted payload`,
      {
        hint: "pass --identity FILE (an age identity file) or --passphrase-file FILE",
      },
    );
  }
  const r = await readPayload(s.layout, s.manifest, keys, async () => undefined, signal ? { signal } : {});
  const findings = compareWithIndex(s.manifest, r);
  if (findings.length) throw integrityError(findings, "its file list cannot be trusted");
  if (!r.index)
    throw new MemsnapError("MEMSNAP_INDEX_MISMATCH", `snapshot ${s.manifest.snapshot_id} has no readable index`);
  return r.index.artifacts;
}

/**
 * A path filter as `ls`, `find` and `restore --path` take them, over payload paths
 * (`<layer>/<path>`): a path equal to a pattern or under it (a directory prefix, with or
 * without a trailing `/`), or matching it as a glob (src/util/glob.ts: a pattern without `/`
 * matches a name at any depth; `**` any depth; `{a,b}` alternatives).
 */
export function pathFilter(patterns: readonly string[]): (path: string) => boolean {
  if (!patterns.length) return () => true;
  const norm = patterns.map((p) => p.replace(/^\.\//, "").replace(/^\/+/, ""));
  const glob = compileGlobs(norm);
  const prefixes = norm.map((p) => p.replace(/\/+$/, "")).filter((p) => p.length > 0);
  return (path) => prefixes.some((p) => path === p || path.startsWith(`${p}/`)) || glob(path);
}

/** A layer kind whose files can be restored one by one (no rebuild from all of its artifacts). */
export function perFileKind(kind: string): boolean {
  return !sourceKind(kind)?.materialize;
}

export interface Selection {
  /** The payload paths selected. */
  paths: Set<string>;
  /** Every layer with a selected artifact. */
  layers: Set<string>;
  /** Those of them of which only some artifacts are selected. */
  partial: Set<string>;
  /**
   * Those of them restored file by file (files, state, trace): in place, a --path restore writes
   * their selected files and removes nothing, even where the patterns select every file.
   */
  perFile: Set<string>;
  /** Whether an artifact is to be written: every artifact of a whole layer, the selected ones of a partial one. */
  want: (name: string) => boolean;
}

/**
 * What `restore --path` selects from a snapshot's index (within `only`'s layers when given).
 * Throws MEMSNAP_USAGE when nothing matches, or when a pattern selects part of a layer whose
 * kind is rebuilt from all of its artifacts (git, sqlite, kv, …): select such a layer whole.
 */
export function selectPaths(
  manifest: Manifest,
  index: readonly IndexEntry[],
  patterns: readonly string[],
  only?: readonly string[],
): Selection {
  const match = pathFilter(patterns);
  const onlySet = only?.length ? new Set(only) : null;
  const paths = new Set<string>();
  const total = new Map<string, number>();
  const hit = new Map<string, number>();
  for (const e of index) {
    if (onlySet && !onlySet.has(e.layer)) continue;
    total.set(e.layer, (total.get(e.layer) ?? 0) + 1);
    if (!match(e.path)) continue;
    paths.add(e.path);
    hit.set(e.layer, (hit.get(e.layer) ?? 0) + 1);
  }
  if (!paths.size) {
    throw new MemsnapError(
      "MEMSNAP_USAGE",
      `--path ${patterns.join(" ")}: no file of snapshot ${manifest.snapshot_id} matches`,
      {
        hint: `paths are <layer>/<path> as 'memsnap ls ${manifest.snapshot_id}' shows them`,
      },
    );
  }
  const layers = new Set(hit.keys());
  const partial = new Set<string>();
  for (const [layer, n] of hit) {
    if (n === total.get(layer)) continue;
    const kind = manifest.layers.find((l) => l.name === layer)?.kind ?? "";
    if (!perFileKind(kind)) {
      throw new MemsnapError(
        "MEMSNAP_USAGE",
        `--path selects ${n} of the ${total.get(layer)} artifacts of layer ${layer}, and a ${kind} layer is rebuilt ` +
          `from all of them`,
        {
          hint:
            `select the whole layer (--path ${layer}/ or --only ${layer}); files, state and trace layers ` +
            `restore file by file`,
        },
      );
    }
    partial.add(layer);
  }
  const layerOf = (p: string): string => p.slice(0, p.indexOf("/"));
  const perFile = new Set(
    [...layers].filter((l) => perFileKind(manifest.layers.find((x) => x.name === l)?.kind ?? "")),
  );
  return {
    paths,
    layers,
    partial,
    perFile,
    want: (name) => paths.has(name) || (layers.has(layerOf(name)) && !partial.has(layerOf(name))),
  };
}

/** The index entry of `path` (as `ls` shows it). Throws MEMSNAP_SOURCE_MISSING. */
export function entryOf(manifest: Manifest, index: readonly IndexEntry[], path: string): IndexEntry {
  const p = path.replace(/^\.\//, "").replace(/^\/+/, "");
  const e = index.find((x) => x.path === p);
  if (!e) {
    throw new MemsnapError("MEMSNAP_SOURCE_MISSING", `snapshot ${manifest.snapshot_id} has no file ${p}`, {
      path: p,
      hint: `paths are <layer>/<path> as 'memsnap ls ${manifest.snapshot_id}' shows them`,
    });
  }
  return e;
}

/**
 * Write one artifact's bytes to `out` once they are checked: the payload (or, for a reference
 * of an incremental bundle, its base's payload beside it) is streamed, the artifact's bytes
 * spooled to a private temp file (0600, in os.tmpdir(), removed after) while hashed and
 * compared with the index, and only then is the file copied to `out`: a damaged artifact
 * writes nothing. With the index in the (sealed) manifest the read stops once the artifact is
 * read; otherwise the whole payload is read and checked against its own index. Throws MEMSNAP_SOURCE_MISSING (no such
 * file),
 * MEMSNAP_ARTIFACT_HASH_MISMATCH, the bundle's key and integrity errors.
 */
export async function catArtifact(
  s: OpenedSnapshot,
  path: string,
  keys: Keys,
  out: Writable,
  signal?: AbortSignal,
): Promise<{ entry: IndexEntry; base: string | null }> {
  if (s.manifest.payload.encryption && !hasKey(keys)) {
    throw new MemsnapError("MEMSNAP_IDENTITY_REQUIRED", `snapshot ${s.manifest.snapshot_id} is encrypted`, {
      hint: "pass --identity FILE (an age identity file) or --passphrase-file FILE",
    });
  }
  const want = path.replace(/^\.\//, "").replace(/^\/+/, "");
  // A plaintext index says up front whether the file exists and where its bytes are.
  let entry: IndexEntry | null = s.manifest.index ? entryOf(s.manifest, s.manifest.index, want) : null;
  const dir = await mkdtemp(join(tmpdir(), "memsnap-cat-"));
  const spool = join(dir, `a-${randomBytes(4).toString("hex")}`);
  try {
    const read = async (layout: BundleLayout, manifest: Manifest): Promise<{ size: number; sha256: string } | null> => {
      let got: { size: number; sha256: string } | null = null;
      // The sealed manifest index already says what the artifact's bytes must hash to: once they
      // are read (and checked below against that entry), the rest of the payload is not needed.
      const early = manifest === s.manifest && entry !== null && refOf(manifest, entry) === undefined;
      const stop = new AbortController();
      const sig = signal ? AbortSignal.any([signal, stop.signal]) : stop.signal;
      let r;
      try {
        r = await readPayload(
          layout,
          manifest,
          keys,
          async (info, chunks) => {
            if (info.name !== want) return;
            if (got)
              throw new MemsnapError("MEMSNAP_INDEX_MISMATCH", `duplicate payload entry ${want}`, {
                path: want,
                hint: "the bundle is damaged or was altered; nothing was written",
              });
            const h = createHash("sha256");
            const fh = await open(spool, "wx", 0o600);
            let n = 0;
            try {
              for await (const c of chunks) {
                h.update(c);
                n += c.length;
                if (entry && n > entry.size)
                  throw new MemsnapError(
                    "MEMSNAP_ARTIFACT_HASH_MISMATCH",
                    `${want} is longer than the index declares (${entry.size} bytes)`,
                    { path: want, hint: "the bundle is damaged or was altered; nothing was written" },
                  );
                await fh.write(c);
              }
            } finally {
              await fh.close();
            }
            got = { size: n, sha256: h.digest("hex") };
            if (early) stop.abort();
          },
          { signal: sig },
        );
      } catch (e) {
        if (stop.signal.aborted && !signal?.aborted && got) return got;
        throw e;
      }
      const findings = compareWithIndex(manifest, r);
      if (findings.length) throw integrityError(findings, "nothing was written");
      if (manifest === s.manifest) entry ??= r.index ? entryOf(manifest, r.index.artifacts, want) : null;
      return got;
    };
    let got = await read(s.layout, s.manifest);
    if (!entry)
      throw new MemsnapError("MEMSNAP_INDEX_MISMATCH", `snapshot ${s.manifest.snapshot_id} has no readable index`);
    const ref = refOf(s.manifest, entry) ?? null;
    if (isChunkedIn(s.manifest, entry)) {
      // A chunked artifact: its stored ranges were spooled; the rest is read from its bases into place.
      const stored = storedOf(s.manifest, entry);
      if (!got || got.size !== stored.size || got.sha256 !== stored.sha256) {
        throw new MemsnapError("MEMSNAP_ARTIFACT_HASH_MISMATCH", `${want}: its stored ranges differ from the index`, {
          path: want,
          hint: "the bundle is damaged or was altered; nothing was written",
        });
      }
      const refs = new References();
      refs.add(entry);
      const bases = await openBases(s.path, s.manifest, refs.basesIn());
      await extractReferenced(bases, refs, () => null, { keys, ...(signal ? { signal } : {}), chunkFile: () => spool });
      got = { size: entry.size, sha256: entry.sha256 };
    } else if (ref !== null) {
      if (got)
        throw new MemsnapError("MEMSNAP_INDEX_MISMATCH", `${want} is both in the payload and a reference to a base`, {
          path: want,
        });
      const [base] = await openBases(s.path, s.manifest, new Set([ref]));
      got = await read(base!.layout, base!.manifest);
    }
    if (!got || got.size !== entry.size || got.sha256 !== entry.sha256) {
      throw new MemsnapError(
        "MEMSNAP_ARTIFACT_HASH_MISMATCH",
        got
          ? `${want}: its bytes (${got.size}, SHA-256 ${got.sha256.slice(0, 12)}…) differ from the index ` +
              `(${entry.size}, ${entry.sha256.slice(0, 12)}…)`
          : `${want} is missing from the payload`,
        {
          path: want,
          hint: "the bundle is damaged or was altered; nothing was written",
        },
      );
    }
    try {
      await pipeline(createReadStream(spool), out, { end: false });
    } catch (e) {
      // A reader that went away (`memsnap cat … | head -c 100`) ends the copy, not the command.
      if ((e as NodeJS.ErrnoException).code !== "EPIPE") throw e;
    }
    return { entry, base: ref };
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
}
