/**
 * Finishing a snapshot: the index as the payload's last member (its hashes are known only once
 * every artifact has streamed), the refusal of a plaintext bundle with unredactable secrets,
 * the manifest (its version, payload fields, seal and signature), and the cache the next
 * incremental snapshot references. Split from ./snapshot.ts, which calls these in this order.
 */
import { createHash } from "node:crypto";
import { hostname } from "node:os";
import { MemsnapError } from "../errors.js";
import { encodeEntryHeader, padding } from "../format/tar-header.js";
import {
  computeSeal,
  INDEX_PATH,
  MANIFEST_VERSION,
  MANIFEST_VERSION_NO_INDEX,
  MANIFEST_VERSION_FULL,
  MANIFEST_VERSION_INCREMENTAL,
  PAYLOAD_MEMBER_ENCRYPTED,
  PAYLOAD_MEMBER_PLAIN,
  type BaseRef,
  type IndexEntry,
  type LayerEntry,
  type Manifest,
  type RecipientInfo,
} from "../format/manifest.js";
import type { RedactionReport } from "../redact/types.js";
import { signManifest } from "../sign.js";
import { TOOL_NAME, TOOL_VERSION } from "../version.js";
import { recipientFingerprint } from "../codecs/age/keys.js";
import type { PayloadEncoder } from "./encoder.js";
import type { CacheWriter } from "./cache-writer.js";
import type { IncrementalKey } from "./incremental.js";
import type { IndexSpill } from "./index-spill.js";
import type { LevelPolicy } from "./levels.js";
import type { SnapshotOptions } from "./options.js";
import { ZEROS } from "./pack.js";

/**
 * Write the index as the payload's last member, then the end-of-archive blocks; returns the
 * index member's SHA-256 (hex).
 */
export async function writeIndexMember(
  enc: PayloadEncoder,
  levels: LevelPolicy,
  spill: IndexSpill,
  id: string,
  createdAt: Date,
  level: number,
): Promise<string> {
  const indexSize = spill.documentBytes(id);
  const indexHash = createHash("sha256");
  levels.start("", indexSize, undefined);
  enc.setLevel(level);
  await enc.write(encodeEntryHeader(INDEX_PATH, indexSize, createdAt, 0o644));
  for (const c of spill.document(id)) {
    indexHash.update(c);
    await enc.write(c);
  }
  // padding, then the end-of-archive blocks
  await enc.write(Buffer.concat([ZEROS.subarray(0, padding(indexSize)), ZEROS]));
  return indexHash.digest("hex");
}

/** Throw MEMSNAP_UNREDACTED_SECRETS for a plaintext bundle with secrets that could not be redacted. */
export function refuseUnredacted(redaction: RedactionReport | null, encrypted: boolean, allow: boolean): void {
  if (redaction && redaction.total_unredacted > 0 && !encrypted && !allow) {
    const where = Object.keys(redaction.unredacted);
    throw new MemsnapError(
      "MEMSNAP_UNREDACTED_SECRETS",
      `${redaction.total_unredacted} secret(s) found in content that cannot be redacted ` +
        `(${where.slice(0, 3).join(", ")}${where.length > 3 ? ", …" : ""}); refusing a plaintext bundle`,
      { hint: "encrypt the bundle (-r age1… or --passphrase-file), or pass --allow-unredacted" },
    );
  }
}

/** What a snapshot's manifest is made of, besides its options. */
export interface ManifestParts {
  id: string;
  createdAt: Date;
  parent: string | null;
  recipients: string[];
  encrypted: boolean;
  /** Artifacts stored as chunked entries (they need the newest manifest version). */
  chunked: number;
  /** The index the manifest lists, or null when it leaves it out. */
  index: IndexEntry[] | null;
  bases: BaseRef[];
  layers: LayerEntry[];
  level: number;
  payload: { storedSize: number; sha256: string };
  tarSize: number;
  indexSha256: string;
  artifacts: number;
  /** Bytes of the artifacts, referenced ones included. */
  bytes: number;
  redaction: RedactionReport | null;
}

/** The snapshot's manifest: sealed, and signed when the options carry a key. */
export function buildManifest(opts: SnapshotOptions, p: ManifestParts): Manifest {
  const cfg = opts.config;
  const { encrypted, index, bases, level, payload, redaction } = p;
  const recipientInfo: RecipientInfo[] = opts.passphrase
    ? [{ type: "scrypt" }]
    : p.recipients.map((r) => ({ type: "x25519", fingerprint: recipientFingerprint(r) }));
  const body: Omit<Manifest, "seal"> = {
    format: "memsnap",
    // The oldest version that says what this bundle is (so older readers read what they can).
    manifest_version: p.chunked
      ? MANIFEST_VERSION
      : !encrypted && !index
        ? MANIFEST_VERSION_NO_INDEX
        : bases.length
          ? MANIFEST_VERSION_INCREMENTAL
          : MANIFEST_VERSION_FULL,
    snapshot_id: p.id,
    created_at: p.createdAt.toISOString(),
    created_by: opts.createdBy ?? "api",
    label: opts.label ?? null,
    tenant: cfg.tenant,
    agent: cfg.agent,
    host: hostname(),
    tool: { name: TOOL_NAME, version: TOOL_VERSION },
    parent: p.parent,
    ...(bases.length ? { bases } : {}),
    layers: p.layers,
    payload: {
      member: encrypted ? PAYLOAD_MEMBER_ENCRYPTED : PAYLOAD_MEMBER_PLAIN,
      compression: { codec: "zstd", level },
      encryption: encrypted ? { scheme: "age", recipients: recipientInfo } : null,
      stored_size: payload.storedSize,
      sha256: payload.sha256,
      tar_size: p.tarSize,
      index_sha256: p.indexSha256,
      artifacts: p.artifacts,
      bytes: p.bytes,
    },
    ...(index ? { index } : {}),
    redaction: redaction ? { ...redaction } : { policy: "off" },
  };
  const sealed: Manifest = { ...body, seal: computeSeal(body) };
  return opts.signKey ? { ...sealed, signature: { ...signManifest(sealed, opts.signKey) } } : sealed;
}

/**
 * Commit the cache the next incremental snapshot references: this bundle, and the bases it
 * referenced. Returns why it could not be written (then it is aborted; the bundle is fine).
 */
export async function commitCache(
  cache: CacheWriter,
  key: IncrementalKey,
  manifest: Manifest,
  bases: BaseRef[],
  redaction: RedactionReport | null,
): Promise<string | undefined> {
  const id = manifest.snapshot_id;
  const holders = Object.fromEntries([[id, manifest.seal], ...bases.map((b) => [b.snapshot_id, b.seal])]);
  try {
    await cache.commit(
      id,
      key,
      holders,
      (redaction?.redacted ?? {}) as Record<string, Record<string, number>>,
      (redaction?.unredacted ?? {}) as Record<string, Record<string, number>>,
    );
  } catch (e) {
    const message = (e as Error).message;
    await cache.abort();
    return message;
  }
  return undefined;
}
