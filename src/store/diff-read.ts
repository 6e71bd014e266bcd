/**
 * Reading a snapshot for `memsnap diff`: its index (checked against the payload, as verify
 * does), and the artifacts a diff looks inside (git bundles, SQLite databases) written to
 * private temp files, those an incremental snapshot references read from its bases.
 */
import { open } from "node:fs/promises";
import { MemsnapError } from "../errors.js";
import { readLayout } from "../format/container.js";
import { isChunkedIn, type IndexEntry, type Manifest } from "../format/manifest.js";
import { compareWithIndex, readPayload, type EntryHandler, type Keys } from "../read/read-payload.js";
import { extractReferenced, openBases, References } from "../read/bases.js";
import type { StoredSnapshot } from "./store.js";

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
export type Want = (name: string) => string | undefined;

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
export async function readSnapshot(
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
