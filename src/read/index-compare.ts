/**
 * Comparing what a payload held with its index and manifest (the check verify, restore and
 * diff make after ./read-payload.ts has read it): every finding is collected, not only the first.
 */
import type { Finding } from "../errors.js";
import { encodeIndex, indexHash, INDEX_PATH, isChunkedIn, refOf, storedOf, type Manifest } from "../format/manifest.js";
import type { PayloadReadResult } from "./payload-types.js";

/**
 * Compare what the payload held with the index and the manifest: the index hash bound to
 * the manifest, the index bound to this snapshot, every artifact present once with its
 * size and SHA-256, nothing extra. Returns every finding.
 */
export function compareWithIndex(manifest: Manifest, r: PayloadReadResult): Finding[] {
  const findings: Finding[] = [...r.findings];
  // (storedSha256 null: an age payload read without it, see ReadPayloadOptions.skipStoredHash)
  const hashBad = r.storedSha256 !== null && r.storedSha256 !== manifest.payload.sha256;
  if (hashBad || r.storedSize !== manifest.payload.stored_size) {
    findings.push({
      code: "MEMSNAP_PAYLOAD_HASH_MISMATCH",
      message: "the payload bytes do not match the manifest's SHA-256/size",
    });
  }
  const index = r.index;
  if (!index && !r.indexCheck) return findings;
  if (r.indexSha256 !== manifest.payload.index_sha256) {
    findings.push({
      code: "MEMSNAP_INDEX_MISMATCH",
      message: "the payload index is not the one the manifest is bound to",
      path: INDEX_PATH,
    });
  }
  const snapshotId = index ? index.snapshot_id : r.indexCheck!.snapshotId;
  if (snapshotId !== manifest.snapshot_id) {
    // (not String(): the id is the bundle's, and an array nested 200,000 deep overflows its join)
    const named =
      typeof snapshotId === "string"
        ? snapshotId.slice(0, 64)
        : `of type ${Array.isArray(snapshotId) ? "array" : typeof snapshotId}`;
    findings.push({
      code: "MEMSNAP_INDEX_MISMATCH",
      message: `the payload index belongs to snapshot ${named}`,
      path: INDEX_PATH,
    });
  }
  // The manifest's own copy (plaintext bundles) must be the same document: same canonical bytes.
  if (
    manifest.index &&
    (index
      ? encodeIndex({ format: "memsnap-index", snapshot_id: manifest.snapshot_id, artifacts: manifest.index }).compare(
          encodeIndex(index),
        ) !== 0
      : indexHash({ format: "memsnap-index", snapshot_id: manifest.snapshot_id, artifacts: manifest.index }) !==
        r.indexSha256)
  ) {
    findings.push({
      code: "MEMSNAP_INDEX_MISMATCH",
      message: "the manifest's index differs from the payload's index",
      path: INDEX_PATH,
    });
  }
  if (!index) return [...findings, ...r.indexCheck!.findings];
  const want = new Map<string, { size: number; sha256: string }>();
  const refs = new Set<string>();
  for (const a of index.artifacts) {
    if (want.has(a.path) || refs.has(a.path))
      findings.push({ code: "MEMSNAP_INDEX_MISMATCH", message: `the index lists ${a.path} twice`, path: a.path });
    if (refOf(manifest, a) !== undefined && !isChunkedIn(manifest, a))
      refs.add(a.path); // its bytes are in a base's payload
    else want.set(a.path, storedOf(manifest, a)); // (a chunked entry's payload entry holds its stored ranges)
  }
  const seen = new Set<string>();
  for (let i = 0; i < r.entries.length; i++) {
    const e = { name: r.entries.name(i), size: r.entries.size(i), sha256: r.entries.sha256(i) };
    if (seen.has(e.name)) {
      findings.push({ code: "MEMSNAP_INDEX_MISMATCH", message: `duplicate payload entry ${e.name}`, path: e.name });
      continue;
    }
    seen.add(e.name);
    const w = want.get(e.name);
    if (!w && refs.has(e.name)) {
      findings.push({
        code: "MEMSNAP_INDEX_MISMATCH",
        message: `${e.name} is both in the payload and a reference to a base`,
        path: e.name,
      });
    } else if (!w) {
      findings.push({
        code: "MEMSNAP_INDEX_MISMATCH",
        message: `payload entry ${e.name} is not in the index`,
        path: e.name,
      });
    } else if (w.size !== e.size || w.sha256 !== e.sha256) {
      findings.push({
        code: "MEMSNAP_ARTIFACT_HASH_MISMATCH",
        message:
          w.size !== e.size
            ? `${e.name}: ${e.size} bytes, index says ${w.size}`
            : `${e.name}: SHA-256 differs from the index`,
        path: e.name,
      });
    }
  }
  for (const p of want.keys()) {
    if (!seen.has(p))
      findings.push({
        code: "MEMSNAP_INDEX_MISMATCH",
        message: `indexed artifact ${p} is missing from the payload`,
        path: p,
      });
  }
  return findings;
}
