/**
 * The bundle manifest: its schema, parsing, validation and seal.
 *
 * The manifest is plaintext in every bundle so that integrity and version compatibility
 * can be checked without a key. The seal is SHA-256 over the canonical JSON of the
 * manifest without its `seal` field; it binds every field (paths, kinds, sizes, ids,
 * versions, the payload hash), not only the artifact digests. It detects damage, not
 * forgery: anyone can recompute it (signatures are a separate, later layer).
 */
import { createHash } from "node:crypto";
import { MemsnapError } from "../errors.js";
import { checkEntryName } from "./safe-path.js";
import { canonicalJson, jsonDepthOver, valueDepthOver } from "../util/canonical-json.js";
import { chunkedProblem, rangeBases, type ChunkRange } from "./chunked.js";

export const FORMAT_NAME = "memsnap";
/**
 * The newest manifest_version this build reads, and writes for a bundle with a chunked index
 * entry (./chunked.ts): an older reader would take its payload entry for the whole artifact.
 */
export const MANIFEST_VERSION = 4;
/**
 * What a plaintext bundle whose manifest leaves out the index (more artifacts than MANIFEST_INDEX_MAX) is written as.
 */
export const MANIFEST_VERSION_NO_INDEX = 3;
/** What a bundle that references a base is written as (when nothing needs version 3). */
export const MANIFEST_VERSION_INCREMENTAL = 2;
/** What a bundle without references is written as, so that every memsnap 0.1 reader still reads it. */
export const MANIFEST_VERSION_FULL = 1;
export const MANIFEST_MEMBER = "manifest.json";
export const PAYLOAD_MEMBER_PLAIN = "payload.tar.zst";
export const PAYLOAD_MEMBER_ENCRYPTED = "payload.tar.zst.age";
/** Path of the artifact index inside the payload tar (always the last member). */
export const INDEX_PATH = ".memsnap/index.json";
/** Manifests larger than this are refused before parsing (a plaintext manifest carries the index). */
export const MANIFEST_MAX_BYTES = 64 * 1024 * 1024;

export type CreatedBy = "cli" | "schedule" | "pre-restore" | "api";
export const CREATED_BY: readonly CreatedBy[] = ["cli", "schedule", "pre-restore", "api"];
export const ID_PATTERN = /^[a-z0-9_-]{1,64}$/;
/** A layer's name: the first path segment of its artifacts, and a directory in the target. */
export const LAYER_NAME_PATTERN = /^[a-z0-9][a-z0-9_-]{0,63}$/;
/** A layer's kind (a source kind; one this memsnap does not know is MEMSNAP_UNSUPPORTED_LAYER). */
export const KIND_PATTERN = /^[a-z0-9][a-z0-9_-]{0,63}$/;
/** A snapshot id: a ULID, 26 Crockford base32 characters, the first 0-7 (48 bits of time). */
export const SNAPSHOT_ID_PATTERN = /^[0-7][0-9A-HJKMNP-TV-Z]{25}$/;
/** `created_at`: an ISO-8601 UTC time as Date.toISOString writes it. */
const TIME_PATTERN = /^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d{1,9})?Z$/;
/**
 * How deeply a manifest may nest arrays and objects (the document itself is level 1; memsnap
 * writes under 10). Deeper text is refused before it is parsed, so nothing that walks a
 * manifest (the seal, inspect, list, meta readers) can be made to recurse without bound.
 */
export const MANIFEST_MAX_DEPTH = 64;

/** One artifact of the index: where it lives in the payload and what its bytes hash to. */
export interface IndexEntry {
  /** Payload path: `<layer>/<path inside the layer>`, POSIX separators, no `..`. */
  path: string;
  layer: string;
  kind: string;
  size: number;
  /** Lowercase hex SHA-256 of the artifact's bytes as stored in the payload. */
  sha256: string;
  mode: number;
  mtime: string;
  /**
   * manifest_version 2: the artifact's bytes are not in this payload but in that of the base
   * bundle with this snapshot id (one of the manifest's `bases`), at the same path, with the
   * same size and SHA-256.
   */
  ref?: string;
  /**
   * manifest_version 4, a chunked entry (./chunked.ts): the artifact's bytes are these ranges,
   * stored here (the payload entry at `path` holds them back to back, `stored_size` bytes
   * hashing to `stored_sha256`) or read from the entry at `path` in a base.
   */
  ranges?: ChunkRange[];
  stored_size?: number;
  stored_sha256?: string;
}

/** The document stored at INDEX_PATH; `payload.index_sha256` is over its canonical JSON. */
export interface IndexDocument {
  format: "memsnap-index";
  snapshot_id: string;
  artifacts: IndexEntry[];
}

export interface LayerEntry {
  name: string;
  kind: string;
  schema_version: number;
  artifacts: number;
  bytes: number;
  /**
   * manifest_version 2: how many of `artifacts` are references to a base (present when > 0);
   * since version 4 chunked entries count too.
   */
  referenced?: number;
  /** Layer-specific facts (git HEAD, SQLite pragmas, skipped files, …). */
  meta?: Record<string, unknown>;
}

export interface BaseRef {
  snapshot_id: string;
  seal: string;
}

export interface RecipientInfo {
  type: "x25519" | "scrypt";
  fingerprint?: string;
}

export interface PayloadInfo {
  member: string;
  compression: { codec: "zstd"; level: number };
  encryption: null | { scheme: "age"; recipients: RecipientInfo[] };
  /** Bytes of the payload member as stored (ciphertext when encrypted). */
  stored_size: number;
  /** SHA-256 of the stored payload bytes. */
  sha256: string;
  /** Size of the uncompressed payload tar: the decompression bound on restore. */
  tar_size: number;
  /** SHA-256 of the canonical index document (the last payload member). */
  index_sha256: string;
  artifacts: number;
  bytes: number;
}

export interface Manifest {
  format: typeof FORMAT_NAME;
  manifest_version: number;
  snapshot_id: string;
  created_at: string;
  created_by: CreatedBy;
  label: string | null;
  tenant: string;
  agent: string;
  host: string;
  tool: { name: string; version: string };
  parent: string | null;
  /**
   * manifest_version 2: the bundles whose payloads hold the artifacts this one references
   * (index entries with `ref`), each named by id and bound by its seal; they sit beside this
   * bundle (`<snapshot_id>.memsnap` in the same directory) and hold every byte they are
   * referenced for themselves (a reference never points at another reference).
   */
  bases?: BaseRef[];
  layers: LayerEntry[];
  payload: PayloadInfo;
  /** Present only in unencrypted bundles. */
  index?: IndexEntry[];
  redaction: Record<string, unknown>;
  seal: string;
  /** Optional signature over the seal (see docs/FORMAT.md §2.4); not covered by the seal. */
  signature?: Record<string, unknown>;
}

const sha256hex = (s: string | Buffer): string => createHash("sha256").update(s).digest("hex");

/**
 * The seal of a manifest: `sha256:` + hex over the canonical JSON without `seal` and without
 * `signature` (a signature signs the seal, so it cannot be inside it).
 */
export function computeSeal(m: Omit<Manifest, "seal"> | Manifest): string {
  const { seal: _ignored, signature: _sig, ...rest } = m as Manifest;
  return `sha256:${sha256hex(canonicalJson(rest))}`;
}

/** Canonical bytes of an index document; their SHA-256 is `payload.index_sha256`. */
export function encodeIndex(doc: IndexDocument): Buffer {
  return Buffer.from(canonicalJson(doc), "utf8");
}

/** SHA-256 hex of an index document's canonical bytes. */
export function indexHash(doc: IndexDocument): string {
  return sha256hex(encodeIndex(doc));
}

/**
 * Serialize a manifest for storage (stable key order, trailing newline). A manifest nested
 * deeper than {@link MANIFEST_MAX_DEPTH} (a layer's meta that holds a source's own deeply
 * nested data) is MEMSNAP_SOURCE_INVALID: no reader would accept it.
 */
export function encodeManifest(m: Manifest): Buffer {
  // (the index, a flat list of flat entries that may be long, is left out of the walk)
  if (Object.entries(m).some(([k, v]) => k !== "index" && valueDepthOver(v, MANIFEST_MAX_DEPTH - 1))) {
    const l = m.layers.find((x) => valueDepthOver(x.meta, MANIFEST_MAX_DEPTH - 3));
    throw new MemsnapError(
      "MEMSNAP_SOURCE_INVALID",
      `${l ? `layer ${l.name}: its meta` : "the manifest"} nests more than ${MANIFEST_MAX_DEPTH} levels deep in the ` +
        `manifest`,
      {
        hint:
          "a manifest nests at most 64 levels; the source's data (e.g. a KV dump's engine object) is nested too " +
          "deeply to record",
      },
    );
  }
  return Buffer.from(JSON.stringify(JSON.parse(canonicalJson(m)), null, 1) + "\n", "utf8");
}

function corrupt(msg: string): MemsnapError {
  return new MemsnapError("MEMSNAP_MANIFEST_CORRUPT", `manifest: ${msg}`, {
    hint: "the bundle is damaged; take a new snapshot or use another copy",
  });
}

/**
 * A manifest name that would become a path in the target (a layer name, an index entry's
 * path) is refused as MEMSNAP_UNSAFE_PATH, the code the same name gets when it is found in the
 * payload: a plaintext and an encrypted bundle carrying the same attack answer alike.
 */
function unsafeName(msg: string, path: string): MemsnapError {
  return new MemsnapError("MEMSNAP_UNSAFE_PATH", `manifest: ${msg}`, {
    path,
    hint: "this bundle was not written by memsnap or was tampered with; nothing was read from it or written",
  });
}

const isObj = (v: unknown): v is Record<string, unknown> => typeof v === "object" && v !== null && !Array.isArray(v);
const isHex64 = (v: unknown): v is string => typeof v === "string" && /^[0-9a-f]{64}$/.test(v);
const isCount = (v: unknown): v is number => Number.isSafeInteger(v) && (v as number) >= 0;

/**
 * Parse manifest bytes. Checks, in this order: JSON (MEMSNAP_MANIFEST_CORRUPT), format
 * name (MEMSNAP_BUNDLE_MALFORMED), manifest_version not newer than ours
 * (MEMSNAP_UNSUPPORTED_VERSION, before anything else is interpreted), then the shape of
 * every field (MEMSNAP_MANIFEST_CORRUPT). The seal is checked separately by {@link checkSeal}.
 * `readsUpTo` is the newest version read (tests pass an older one: what an older memsnap does).
 */
export function parseManifest(bytes: Buffer, readsUpTo = MANIFEST_VERSION): Manifest {
  if (jsonDepthOver(bytes, MANIFEST_MAX_DEPTH)) throw corrupt(`nested more than ${MANIFEST_MAX_DEPTH} levels deep`);
  let raw: unknown;
  try {
    raw = JSON.parse(bytes.toString("utf8"));
  } catch {
    throw corrupt("not valid JSON");
  }
  if (!isObj(raw)) throw corrupt("not a JSON object");
  if (raw.format !== FORMAT_NAME) {
    throw new MemsnapError(
      "MEMSNAP_BUNDLE_MALFORMED",
      `manifest format is ${JSON.stringify(raw.format)}, not "memsnap"`,
      {
        hint: "this file is not a memsnap bundle",
      },
    );
  }
  const v = raw.manifest_version;
  if (!Number.isSafeInteger(v) || (v as number) < 1) throw corrupt("manifest_version is not a positive integer");
  if ((v as number) > readsUpTo) {
    throw new MemsnapError(
      "MEMSNAP_UNSUPPORTED_VERSION",
      `bundle manifest_version ${String(v)} is newer than this memsnap reads (${readsUpTo})`,
      { hint: "upgrade memsnap to read this bundle" },
    );
  }
  const m = raw as unknown as Manifest;
  for (const k of ["snapshot_id", "created_at", "host", "tenant", "agent", "seal"] as const) {
    if (typeof m[k] !== "string") throw corrupt(`${k} is missing or not a string`);
  }
  if (!SNAPSHOT_ID_PATTERN.test(m.snapshot_id))
    throw corrupt(`snapshot_id ${JSON.stringify(m.snapshot_id.slice(0, 40))} is not a ULID`);
  if (!TIME_PATTERN.test(m.created_at) || !Number.isFinite(Date.parse(m.created_at)))
    throw corrupt("created_at is not an ISO-8601 UTC time");
  if (!ID_PATTERN.test(m.tenant) || !ID_PATTERN.test(m.agent))
    throw corrupt("tenant or agent id is not [a-z0-9_-]{1,64}");
  if (!CREATED_BY.includes(m.created_by)) throw corrupt("created_by is not one of " + CREATED_BY.join(", "));
  if (m.label !== null && typeof m.label !== "string") throw corrupt("label is not a string or null");
  if (m.parent !== null && (typeof m.parent !== "string" || !SNAPSHOT_ID_PATTERN.test(m.parent)))
    throw corrupt("parent is not a ULID or null");
  if (!isObj(m.tool) || typeof m.tool.name !== "string" || typeof m.tool.version !== "string")
    throw corrupt("tool is malformed");
  if (!isObj(m.redaction)) throw corrupt("redaction is not an object");
  if (!Array.isArray(m.layers)) throw corrupt("layers is not an array");
  const layerNames = new Set<string>();
  for (const l of m.layers) {
    if (
      !isObj(l) ||
      typeof l.name !== "string" ||
      typeof l.kind !== "string" ||
      !isCount(l.schema_version) ||
      !isCount(l.artifacts) ||
      !isCount(l.bytes)
    )
      throw corrupt("a layer entry is malformed");
    if (!LAYER_NAME_PATTERN.test(l.name))
      throw unsafeName(`layer name ${JSON.stringify(l.name.slice(0, 80))} is not [a-z0-9][a-z0-9_-]{0,63}`, l.name);
    if (layerNames.has(l.name)) throw unsafeName(`layer ${l.name} is listed twice`, l.name);
    layerNames.add(l.name);
    if (!KIND_PATTERN.test(l.kind))
      throw corrupt(`layer ${l.name}: kind ${JSON.stringify(l.kind.slice(0, 80))} is not [a-z0-9][a-z0-9_-]{0,63}`);
    if (l.meta !== undefined && !isObj(l.meta)) throw corrupt(`layer ${l.name}: meta is not an object`);
  }
  const p = m.payload;
  if (!isObj(p)) throw corrupt("payload is missing");
  if (p.member !== PAYLOAD_MEMBER_PLAIN && p.member !== PAYLOAD_MEMBER_ENCRYPTED)
    throw corrupt("payload.member is unknown");
  if (!isObj(p.compression) || p.compression.codec !== "zstd") throw corrupt("payload.compression is not zstd");
  if (
    p.encryption !== null &&
    (!isObj(p.encryption) || p.encryption.scheme !== "age" || !Array.isArray(p.encryption.recipients))
  ) {
    throw corrupt("payload.encryption is malformed");
  }
  if (!isCount(p.stored_size) || !isCount(p.tar_size) || !isCount(p.artifacts) || !isCount(p.bytes))
    throw corrupt("payload sizes are malformed");
  if (!isHex64(p.sha256) || !isHex64(p.index_sha256)) throw corrupt("payload hashes are malformed");
  const version = v as number;
  if (version >= 2 && m.bases !== undefined) {
    if (!Array.isArray(m.bases)) throw corrupt("bases is not an array");
    const ids = new Set<string>();
    for (const b of m.bases) {
      if (
        !isObj(b) ||
        typeof b.snapshot_id !== "string" ||
        !SNAPSHOT_ID_PATTERN.test(b.snapshot_id) ||
        typeof b.seal !== "string" ||
        !/^sha256:[0-9a-f]{64}$/.test(b.seal)
      )
        throw corrupt("a base entry is malformed");
      if (ids.has(b.snapshot_id) || b.snapshot_id === m.snapshot_id)
        throw corrupt(`base ${b.snapshot_id} is listed twice or is the bundle itself`);
      ids.add(b.snapshot_id);
    }
  }
  // (In a version-1 manifest `bases`, `referenced` and `ref` are unknown keys: ignored, never
  // acted on; see basesOf and referencedIn. They stay in the object, which the seal covers.)
  for (const l of m.layers) {
    if (version >= 2 && l.referenced !== undefined && (!isCount(l.referenced) || l.referenced > l.artifacts))
      throw corrupt(`layer ${l.name}: referenced is malformed`);
  }
  if (m.index !== undefined) {
    if (!Array.isArray(m.index)) throw corrupt("index is not an array");
    for (const e of m.index) {
      if (
        !isObj(e) ||
        typeof e.path !== "string" ||
        typeof e.layer !== "string" ||
        typeof e.kind !== "string" ||
        !isCount(e.size) ||
        !isHex64(e.sha256)
      )
        throw corrupt("an index entry is malformed");
      // Where the entry would be written: a safe path under the layer the entry names.
      checkEntryName(e.path, layerNames);
      if (!layerNames.has(e.layer))
        throw unsafeName(
          `index entry ${JSON.stringify(e.path)} names layer ${JSON.stringify(e.layer.slice(0, 80))}, which is not ` +
            `in the manifest`,
          e.path,
        );
      if (!e.path.startsWith(`${e.layer}/`))
        throw unsafeName(`index entry ${JSON.stringify(e.path)} is not under its layer ${e.layer}`, e.path);
      if (version >= 2 && e.ref !== undefined && !m.bases?.some((b) => b.snapshot_id === e.ref))
        throw corrupt(`index entry ${e.path} references a bundle that is not a base`);
      if (version >= 4 && e.ranges !== undefined) {
        const problem = chunkedProblem(e as unknown as Record<string, unknown>);
        if (problem) throw corrupt(`index entry ${e.path}: ${problem}`);
        for (const id of rangeBases(e.ranges)) {
          if (!m.bases?.some((b) => b.snapshot_id === id))
            throw corrupt(`index entry ${e.path} reads a bundle that is not a base`);
        }
      }
    }
  }
  return m;
}

/** The bases a bundle references (none before manifest_version 2). */
export function basesOf(m: Manifest): BaseRef[] {
  return m.manifest_version >= 2 && Array.isArray(m.bases) ? m.bases : [];
}

/** How many of a layer's artifacts are references to a base (0 before manifest_version 2). */
export function referencedIn(m: Manifest, l: LayerEntry): number {
  return m.manifest_version >= 2 && typeof l.referenced === "number" ? l.referenced : 0;
}

/** The base an index entry references, if any (never before manifest_version 2). */
export function refOf(m: Manifest, e: { ref?: unknown }): string | undefined {
  return m.manifest_version >= 2 && typeof e.ref === "string" ? e.ref : undefined;
}

/** Whether an index entry is chunked (never before manifest_version 4). */
export function isChunkedIn(m: Pick<Manifest, "manifest_version">, e: { ranges?: unknown }): boolean {
  return m.manifest_version >= 4 && e.ranges !== undefined;
}

/** What the payload entry of an index entry holds: the stored ranges of a chunked one, else the artifact. */
export function storedOf(m: Pick<Manifest, "manifest_version">, e: IndexEntry): { size: number; sha256: string } {
  return isChunkedIn(m, e) ? { size: e.stored_size!, sha256: e.stored_sha256! } : e;
}

/** True when the manifest's seal matches its content. */
export function checkSeal(m: Manifest): boolean {
  return m.seal === computeSeal(m);
}
