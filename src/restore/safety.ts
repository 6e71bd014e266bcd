/**
 * The safety snapshot an in-place restore takes of the live state first: whom it is encrypted
 * to, and which of its errors come from the live state itself. Split from ./in-place.ts.
 */
import type { MemsnapConfig } from "../config.js";
import type { Manifest } from "../format/manifest.js";
import { recipientFingerprint, recipientsOfIdentities } from "../codecs/age/keys.js";
import type { Keys } from "../read/read-payload.js";

/** Errors of the safety snapshot that come from the live state itself (see restoreInPlace). */
export const SAFETY_SOURCE_CODES = new Set<string>([
  "MEMSNAP_SOURCE_MISSING",
  "MEMSNAP_SOURCE_UNREADABLE",
  "MEMSNAP_SOURCE_INVALID",
  "MEMSNAP_SOURCE_DIGEST_MISMATCH",
  "MEMSNAP_TRACE_INVALID",
]);

/**
 * Whom the safety snapshot is encrypted to. It keeps the live files exactly (no redaction), so
 * it must not be weaker than what it sits beside: the config's recipients when it names any;
 * else the key that opens the bundle being restored: the recipients of the given identities
 * that the bundle was encrypted to (all given ones if none of their fingerprints is in its
 * manifest), or its passphrase; a plaintext bundle and no recipients in the config give a
 * plaintext safety snapshot (the CLI warns).
 */
export function safetyEncryption(
  config: MemsnapConfig,
  manifest: Manifest,
  keys: Keys,
): { recipients: string[] } | { passphrase: string } | Record<string, never> {
  if (config.recipients.length) return { recipients: config.recipients };
  const enc = manifest.payload.encryption;
  if (!enc) return {};
  if (enc.recipients.some((r) => r.type === "scrypt")) {
    const p = keys.passphrases?.[0];
    return p ? { passphrase: p } : {};
  }
  const mine = recipientsOfIdentities(keys.identities ?? []);
  const theirs = new Set(enc.recipients.map((r) => r.fingerprint));
  const opening = mine.filter((r) => theirs.has(recipientFingerprint(r)));
  return mine.length ? { recipients: opening.length ? opening : mine } : {};
}
