/**
 * Incremental snapshots: artifacts unchanged since the last incremental snapshot are referenced,
 * not read, compressed or stored again.
 *
 * After an incremental snapshot commits, a cache of its artifacts is written beside the agent
 * (`<agent dir>/.memsnap/incremental-<tenant>-<agent>.jsonl`, mode 0600: it holds artifact
 * paths and hashes, as sensitive as the agent's own files, so it never goes into the store):
 * one JSON header line, then per artifact that has a fingerprint one tab-separated line: its
 * payload path (a JSON string), kind, stored size, SHA-256, the bundle that holds its bytes
 * (this one, or the base this one referenced it from: references never chain) and the
 * source's fingerprint (Artifact.fingerprint: device, inode, size, mtime and ctime of the file
 * read; empty for an unshuffled KV page, whose fingerprint follows from its digest and size).
 *
 * A chunkable artifact (Artifact.chunking, ./chunking.ts) has a seventh field, its ChunkRecord
 * as JSON (how it is cut, its recipe when it is chunked, and where its table of chunk hashes is
 * in `<cache>.<snapshot id>.chunks`, the table file written with the cache); its fingerprint is
 * `-` when it has none (a copy), so that only its table and recipe are used.
 *
 * The next incremental snapshot loads it and references an artifact when its path, kind, size
 * and fingerprint match, as long as the bundle holding the bytes is still in the store with the
 * seal the cache recorded, the encryption is the same (same age recipients, or both plaintext;
 * never with a passphrase, which cannot be compared), and so are the redaction settings and the
 * memsnap version (redacted bytes are a function of both). Anything else is packed as usual.
 *
 * This file holds the cache's format, its key and the reading half (ReferenceSet); the writing
 * half is ./cache-writer.ts.
 */
import { createHash } from "node:crypto";
import { closeSync, openSync, readSync } from "node:fs";
import { open, type FileHandle } from "node:fs/promises";
import { join } from "node:path";
import { readLayout } from "../format/container.js";
import { bundleIn, isBundleUrl } from "../format/bundle-file.js";
import { parseManifest, checkSeal, type BaseRef, type Manifest } from "../format/manifest.js";
import type { RuleCounts } from "../redact/types.js";
import { kvPageFingerprint, type Artifact } from "../sources/types.js";
import { canonicalJson } from "../util/canonical-json.js";
import { collectNow } from "../util/gc.js";
import { TOOL_VERSION } from "../version.js";
import type { ChunkRange } from "../format/chunked.js";
import { indexRanges, type ChunkBase, type ChunkHint, type ChunkRecord } from "./chunking.js";

/** The cache file's format name and version (its header line; ./cache-writer.ts writes them). */
export const FORMAT = "memsnap-incremental-cache";
export const VERSION = 4;

/** The table file of the cache written by snapshot `id`. */
export const tableFile = (cache: string, id: string): string => `${cache}.${id}.chunks`;

/** The bytes of a ChunkRecord's table, checked against its recorded digest; null when unreadable. */
async function readTable(file: string | null, rec: ChunkRecord): Promise<Buffer | null> {
  if (!file || !rec.t) return null;
  const [off, len, digest] = rec.t;
  let fh: FileHandle | undefined;
  try {
    fh = await open(file, "r");
    const buf = Buffer.allocUnsafe(len);
    const { bytesRead } = await fh.read(buf, 0, len, off);
    if (bytesRead !== len || createHash("sha256").update(buf).digest("hex").slice(0, 32) !== digest) return null;
    return buf;
  } catch {
    return null;
  } finally {
    await fh?.close();
  }
}

const isCount = (v: unknown): v is number => Number.isSafeInteger(v) && (v as number) >= 0;

/** A cache line's ChunkRecord, or null when it is not one this memsnap wrote. */
function parseRecord(json: string): ChunkRecord | null {
  let v: ChunkRecord;
  try {
    v = JSON.parse(json) as ChunkRecord;
  } catch {
    return null;
  }
  if (typeof v !== "object" || v === null || !["append", "pages", "cdc"].includes(v.m) || !isCount(v.g)) return null;
  if (v.p !== undefined && !isCount(v.p)) return null;
  if (
    v.r !== undefined &&
    (!Array.isArray(v.r) ||
      !v.r.every((p) => Array.isArray(p) && isCount(p[0]) && typeof p[1] === "string" && isCount(p[2])))
  )
    return null;
  if (v.t !== undefined && (!Array.isArray(v.t) || !isCount(v.t[0]) || !isCount(v.t[1]) || typeof v.t[2] !== "string"))
    return null;
  return v;
}

/** What must be equal for the last snapshot's bytes to stand for this one's. */
export interface IncrementalKey {
  tenant: string;
  agent: string;
  /** `none`, or the sorted age recipient fingerprints. */
  encryption: string;
  /** The redaction settings in force (or `off`) with the secretlint versions, and the memsnap version. */
  redaction: string;
}

/** The key for a snapshot's settings (null when references are not allowed: a passphrase). */
export function incrementalKey(
  tenant: string,
  agent: string,
  recipientFingerprints: string[] | null,
  redaction: unknown,
): IncrementalKey | null {
  if (recipientFingerprints === null) return null;
  const encryption = recipientFingerprints.length ? [...recipientFingerprints].sort().join(",") : "none";
  const r = createHash("sha256")
    .update(canonicalJson({ redaction: redaction ?? "off", tool: TOOL_VERSION }))
    .digest("hex");
  return { tenant, agent, encryption, redaction: r };
}

/** The cache file of an agent (in its base directory's `.memsnap`, beside the lock and the journal). */
export function cachePath(baseDir: string, tenant: string, agent: string): string {
  return join(baseDir, ".memsnap", `incremental-${tenant}-${agent}.jsonl`);
}

/**
 * A copy of `s` that holds on to nothing else: a piece split from a chunk of the file is a
 * slice of the whole chunk's string in V8, and kept, it would keep the chunk.
 */
const own = (s: string): string => Buffer.from(s, "utf8").toString("utf8");

/** Bytes per artifact in the reference set's record buffer: SHA-256, size, base, kind. */
const REC = 32 + 8 + 2 + 1;
/**
 * Cache file bytes read at a time: the text of a chunk stays a young-generation string (V8 puts strings over 128 KiB in
 * large-object space, freed only by a full collection).
 */
const READ_CHUNK = 64 * 1024;

/** What the cache keeps of a chunkable artifact, carried over when it is referenced. */
export interface CarriedChunk {
  rec: ChunkRecord;
  table: () => Promise<Buffer | null>;
}

/** A reference decided for one artifact. */
export interface Reference {
  base: string;
  size: number;
  sha256: string;
  /** The artifact is chunked (its bytes in several bundles): these are its index ranges, every one in a base. */
  ranges?: ChunkRange[];
  /** Its chunk record, for the next cache. */
  chunk?: CarriedChunk;
  redacted?: RuleCounts;
  /** Secrets the last snapshot found in these bytes and could not redact (a git bundle's history). */
  unredacted?: RuleCounts;
}

/**
 * The last incremental snapshot's artifacts, restricted to those whose bytes are in a bundle
 * still present in `storeDir` with the recorded seal. Empty when there is no cache or it does
 * not match `key` (then the snapshot is a full one and writes the first cache).
 *
 * Held compactly (tens of thousands of KV pages at scale 10): per path one string,
 * `<kind index>,<size>,<base index>,<sha256 as 32 latin1 characters><fingerprint>`, where the fingerprint is left out
 * when it is the one an unshuffled KV page of that digest and size has. Each entry is dropped
 * once matched (a path is packed once per snapshot), so the set shrinks as the snapshot runs.
 */
export class ReferenceSet {
  /** Payload path → entry number. */
  readonly #byPath = new Map<string, number>();
  /** Per entry REC bytes: SHA-256, size (float64), base index (u16), kind index (u8). */
  #rec = Buffer.alloc(0);
  /** Per entry the fingerprint, or undefined where it is an unshuffled KV page's (derived). */
  readonly #fps: (string | undefined)[] = [];
  readonly #kinds: string[] = [];
  readonly #ids: string[] = [];
  readonly #bases = new Map<string, string>(); // id → seal, of bundles present
  readonly #manifests = new Map<string, Manifest>();
  readonly #used = new Set<string>();
  readonly #redacted = new Map<string, RuleCounts>();
  readonly #unredacted = new Map<string, RuleCounts>();
  /** Per entry number, the chunk record of a chunkable artifact. */
  readonly #chunks = new Map<number, ChunkRecord>();
  /** The table file of the cache loaded. */
  #tables: string | null = null;
  /** Why nothing could be referenced, when that is so (for the snapshot's report). */
  reason: string | null = null;
  /** The snapshot the cache was written by. */
  from: string | null = null;

  static empty(reason: string): ReferenceSet {
    const r = new ReferenceSet();
    r.reason = reason;
    return r;
  }

  /**
   * Read the cache a chunk at a time into the compact form above: no object per artifact, so
   * loading tens of thousands of them leaves little garbage behind (a JSON object per line grew
   * the heap by ~35 MiB at scale 10).
   */
  static async load(file: string, key: IncrementalKey, storeDir: string): Promise<ReferenceSet> {
    const out = new ReferenceSet();
    let header: Record<string, unknown> | null = null;
    const seals = new Map<string, string>();
    let redacted: Record<string, unknown> = {};
    let unredacted: Record<string, unknown> = {};
    const kindIdx = new Map<string, number>();
    const idIdx = new Map<string, number>();
    let n = 0;
    // Per line as little as will do (64k lines at scale 10: 140-150 -> 100-117 ms a load): no regular
    // expressions (the digest is checked by decoding it), and the findings looked up only
    // when the header has any.
    let findings = false;
    const entry = (line: string): void => {
      const t = line.split("\t");
      if (t.length !== 6 && t.length !== 7) return;
      const [pj, kind, size, sha, base, fp] = t as [string, string, string, string, string, string];
      const rec = t.length === 7 ? parseRecord(t[6]!) : null;
      if (t.length === 7 && !rec) return;
      const bytes = Number(size);
      if (sha.length !== 64 || !seals.has(base) || !Number.isSafeInteger(bytes) || bytes < 0 || String(bytes) !== size)
        return;
      let path: unknown;
      try {
        path = JSON.parse(pj);
      } catch {
        return;
      }
      if (typeof path !== "string") return;
      if ((n + 1) * REC > out.#rec.length) {
        const grown = Buffer.alloc(Math.max(64 * REC, out.#rec.length * 2));
        out.#rec.copy(grown);
        out.#rec = grown;
      }
      const at = n * REC;
      if (out.#rec.write(sha, at, "hex") !== 32) return; // not a hex digest
      let k = kindIdx.get(kind);
      if (k === undefined) kindIdx.set(kind, (k = out.#kinds.push(own(kind)) - 1));
      let b = idIdx.get(base);
      if (b === undefined) idIdx.set(base, (b = out.#ids.push(own(base)) - 1));
      out.#rec.writeDoubleLE(bytes, at + 32);
      out.#rec.writeUInt16LE(b, at + 40);
      out.#rec.writeUInt8(k, at + 42);
      out.#fps[n] = fp === "" ? undefined : own(fp);
      out.#byPath.set(path, n);
      if (rec) out.#chunks.set(n, rec);
      if (findings) {
        const r = redacted[path];
        if (r !== null && typeof r === "object") out.#redacted.set(path, r as RuleCounts);
        const u = unredacted[path];
        if (u !== null && typeof u === "object") out.#unredacted.set(path, u as RuleCounts);
      }
      n++;
    };
    let fd: number;
    try {
      fd = openSync(file, "r");
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code === "ENOENT")
        return ReferenceSet.empty("no earlier incremental snapshot of this agent");
      return ReferenceSet.empty(`the incremental cache is unreadable (${(e as Error).message})`);
    }
    try {
      const buf = Buffer.allocUnsafe(READ_CHUNK);
      let carry = "";
      for (;;) {
        const got = readSync(fd, buf, 0, buf.length, null);
        const text = carry + buf.toString("utf8", 0, got);
        const lines = text.split("\n");
        carry = got === 0 ? "" : lines.pop()!;
        for (const line of lines) {
          if (!line) continue;
          if (header) {
            entry(line);
            continue;
          }
          const v = JSON.parse(line) as Record<string, unknown>;
          header = v;
          if (v.format !== FORMAT || v.version !== VERSION)
            return ReferenceSet.empty("the incremental cache is of another format");
          if (v.tenant !== key.tenant || v.agent !== key.agent)
            return ReferenceSet.empty("the incremental cache is another agent's");
          if (v.encryption !== key.encryption)
            return ReferenceSet.empty("the last incremental snapshot was encrypted differently");
          if (v.redaction !== key.redaction)
            return ReferenceSet.empty(
              "the redaction settings, the secretlint rules' version or the memsnap version changed",
            );
          for (const [id, seal] of Object.entries((v.bundles ?? {}) as Record<string, unknown>))
            if (typeof seal === "string") seals.set(id, seal);
          out.from = typeof v.snapshot_id === "string" ? v.snapshot_id : null;
          if (out.from && /^[0-9A-Z]{26}$/.test(out.from)) out.#tables = tableFile(file, out.from);
          if (v.redacted !== null && typeof v.redacted === "object") redacted = v.redacted as Record<string, unknown>;
          if (v.unredacted !== null && typeof v.unredacted === "object")
            unredacted = v.unredacted as Record<string, unknown>;
          findings = Object.keys(redacted).length > 0 || Object.keys(unredacted).length > 0;
        }
        if (got === 0) break;
      }
    } catch (e) {
      return ReferenceSet.empty(`the incremental cache is unreadable (${(e as Error).message})`);
    } finally {
      closeSync(fd);
    }
    if (!header) return ReferenceSet.empty("the incremental cache is empty");
    // A base must still be in the store, whole and sealed as recorded (the manifest alone:
    // restore and verify check its payload).
    // In an s3 store, a bundle a prune condemned is deleted once the grace has passed: never a new base
    // (store/s3/store.ts).
    const condemned = isBundleUrl(storeDir)
      ? await (await import("../store/s3/store.js")).condemnedIds(storeDir).catch(() => null)
      : new Map<string, number>();
    for (const [id, seal] of seals) {
      if (condemned === null || condemned.has(id)) continue; // (the markers unreadable: no bases)
      try {
        const m = parseManifest((await readLayout(bundleIn(storeDir, id))).manifestBytes);
        if (
          m.snapshot_id === id &&
          m.seal === seal &&
          checkSeal(m) &&
          m.tenant === key.tenant &&
          m.agent === key.agent
        ) {
          out.#bases.set(id, seal);
          // the layers' meta is what is kept (a plaintext one's index can be large)
          out.#manifests.set(id, { ...m, index: [] });
        }
      } catch {
        // pruned or damaged: its artifacts are packed again
      }
    }
    const gone = new Set(out.#ids.map((id, i) => (out.#bases.has(id) ? -1 : i)).filter((i) => i >= 0));
    if (gone.size)
      for (const [p, i] of out.#byPath) if (gone.has(out.#rec.readUInt16LE(i * REC + 40))) out.#byPath.delete(p);
    // A chunked artifact needs every bundle its recipe reads.
    for (const [p, i] of out.#byPath) {
      const r = out.#chunks.get(i)?.r;
      if (r && !r.every((x) => out.#bases.has(x[1]))) out.#byPath.delete(p);
    }
    if (!out.#byPath.size) out.reason = "the bundles of the last incremental snapshot are no longer in the store";
    collectNow("major"); // what the parse left goes now, before the captures' own peaks
    return out;
  }

  #decode(i: number): { kind: string; size: number; base: number; sha256: string; fingerprint: string } {
    const at = i * REC;
    const sha256 = this.#rec.toString("hex", at, at + 32);
    const size = this.#rec.readDoubleLE(at + 32);
    return {
      kind: this.#kinds[this.#rec.readUInt8(at + 42)]!,
      size,
      base: this.#rec.readUInt16LE(at + 40),
      sha256,
      fingerprint: this.#fps[i] ?? kvPageFingerprint(sha256, size),
    };
  }

  get size(): number {
    return this.#byPath.size;
  }

  /** The reference for `a` (at payload path `path`), or null when it must be packed. */
  match(path: string, a: Artifact): Reference | null {
    if (a.fingerprint === undefined) return null;
    const i = this.#byPath.get(path);
    if (i === undefined) return null;
    const e = this.#decode(i);
    if (e.fingerprint !== a.fingerprint || e.kind !== a.kind) return null;
    // A stored size differs from the source's only where redaction rewrote the text.
    if (!a.text && e.size !== a.size) return null;
    this.#byPath.delete(path);
    const base = this.#ids[e.base]!;
    const rec = this.#chunks.get(i);
    const tables = this.#tables;
    const chunk = rec ? { chunk: { rec, table: () => readTable(tables, rec) } } : {};
    const r = this.#redacted.get(path);
    const u = this.#unredacted.get(path);
    const findings = { ...(r ? { redacted: r } : {}), ...(u ? { unredacted: u } : {}) };
    if (rec?.r) {
      // Chunked last time and unchanged since: the same ranges, every one now in a base.
      for (const p of rec.r) this.#used.add(p[1]);
      return { base, size: e.size, sha256: e.sha256, ranges: indexRanges(rec.r, ""), ...chunk, ...findings };
    }
    this.#used.add(base);
    return { base, size: e.size, sha256: e.sha256, ...chunk, ...findings };
  }

  /**
   * For an artifact that changed (match() gave null) and that its source says may be chunked:
   * what the last snapshot recorded of the artifact at `path`, to chunk it against; null when
   * nothing usable was recorded. Each path is handed out once.
   */
  async chunkBase(path: string, a: Artifact, hint: ChunkHint): Promise<ChunkBase | null> {
    const i = this.#byPath.get(path);
    if (i === undefined) return null;
    const rec = this.#chunks.get(i);
    const e = this.#decode(i);
    if (!rec || rec.m !== hint.mode || e.kind !== a.kind) return null;
    this.#byPath.delete(path);
    return {
      size: e.size,
      sha256: e.sha256,
      holder: this.#ids[e.base]!,
      rec,
      table: await readTable(this.#tables, rec),
    };
  }

  /**
   * For a source (CaptureContext.pageTable): the table of page hashes the last snapshot recorded
   * of the `pages`-chunked artifact at `path`, with its page size; null when there is none. It
   * hands nothing out (chunkBase still does).
   */
  async pageTable(path: string): Promise<{ table: Buffer; pageSize: number } | null> {
    const i = this.#byPath.get(path);
    const rec = i === undefined ? undefined : this.#chunks.get(i);
    if (!rec || rec.m !== "pages" || !rec.p) return null;
    const table = await readTable(this.#tables, rec);
    return table ? { table, pageSize: rec.p } : null;
  }

  /** Bundles a chunked artifact reads: bases of this snapshot. */
  use(ids: Iterable<string>): void {
    for (const id of ids) if (this.#bases.has(id)) this.#used.add(id);
  }

  /**
   * For a source (CaptureContext.unchanged): the layer meta of the bundle holding the artifact
   * at `path`, when one with this fingerprint and kind will be referenced; null otherwise.
   */
  unchanged(path: string, fingerprint: string, kind: string): Record<string, unknown> | null {
    const i = this.#byPath.get(path);
    if (i === undefined) return null;
    const e = this.#decode(i);
    if (e.fingerprint !== fingerprint || e.kind !== kind) return null;
    const layer = path.slice(0, path.indexOf("/"));
    return this.#manifests.get(this.#ids[e.base]!)?.layers.find((l) => l.name === layer)?.meta ?? null;
  }

  /**
   * For a source (CaptureContext.lastMeta): the meta of `layer` in the last incremental snapshot, when it is a base.
   */
  lastLayerMeta(layer: string): Record<string, unknown> | null {
    return (this.from && this.#manifests.get(this.from)?.layers.find((l) => l.name === layer)?.meta) || null;
  }

  /** The bases referenced so far, for the manifest. */
  bases(): BaseRef[] {
    return [...this.#used].sort().map((id) => ({ snapshot_id: id, seal: this.#bases.get(id)! }));
  }
}
