// age keys and key files: generating an identity, identity and recipients files, fingerprints.

import { createHash } from "node:crypto";
import { MemsnapError } from "../../errors.js";
import { decodeIdentity, decodeRecipient } from "./bech32.js";
import { ARMOR_BEGIN, errMessage, IDENTITY_HINT, RECIPIENT_HINT, shorten } from "./common.js";
import { recipientOfScalar } from "./x25519.js";

/**
 * typage, loaded on first use: only key generation needs it. Headers are written and opened
 * with node:crypto (header.ts, open-header.ts): the module graph typage brings (post-quantum KEMs among it) took
 * ~100 ms to load, and 70-100 ms even bundled, on every restore and keyed verify.
 */
let typageP: Promise<typeof import("age-encryption")> | undefined;
const typage = (): Promise<typeof import("age-encryption")> => (typageP ??= import("age-encryption"));

/**
 * The `age1…` recipients of X25519 identities (`AGE-SECRET-KEY-1…`), in order, without
 * duplicates. Throws MEMSNAP_IDENTITY_INVALID for a line that is not one.
 */
export function recipientsOfIdentities(identities: readonly string[]): string[] {
  const out: string[] = [];
  for (const id of identities) {
    const scalar = decodeIdentity(id);
    if (scalar === null) {
      const msg = "a given identity is not an X25519 age identity (AGE-SECRET-KEY-1…)";
      throw new MemsnapError("MEMSNAP_IDENTITY_INVALID", msg, { hint: IDENTITY_HINT });
    }
    const r = recipientOfScalar(scalar);
    if (!out.includes(r)) out.push(r);
  }
  return out;
}

/**
 * Generate a new X25519 age identity and its recipient.
 *
 * @returns `identity` (`AGE-SECRET-KEY-1…`) and `recipient` (`age1…`).
 * @throws MEMSNAP_INTERNAL if key generation fails unexpectedly.
 */
export async function generateIdentity(): Promise<{ identity: string; recipient: string }> {
  try {
    const t = await typage();
    const identity = await t.generateX25519Identity();
    const recipient = await t.identityToRecipient(identity);
    return { identity, recipient };
  } catch (e) {
    throw new MemsnapError("MEMSNAP_INTERNAL", `could not generate an age identity: ${errMessage(e)}`, { cause: e });
  }
}

/**
 * The text of an identity file in the layout `age-keygen` writes:
 * `# created: <RFC 3339>`, `# public key: age1…`, then the secret key line.
 *
 * @throws MEMSNAP_IDENTITY_INVALID if `identity` is not an X25519 age identity, or
 *   `recipient` is not the recipient of that identity.
 */
export function identityFileText(identity: string, recipient: string, createdAt: Date): string {
  const scalar = decodeIdentity(identity);
  if (scalar === null) {
    throw new MemsnapError("MEMSNAP_IDENTITY_INVALID", "not an X25519 age identity (AGE-SECRET-KEY-1…)", {
      hint: IDENTITY_HINT,
    });
  }
  if (decodeRecipient(recipient) === null || recipientOfScalar(scalar) !== recipient) {
    const msg = `recipient ${recipient} is not the public key of the given identity`;
    throw new MemsnapError("MEMSNAP_IDENTITY_INVALID", msg, {
      hint: "pass the recipient returned together with the identity by generateIdentity()",
    });
  }
  const created = createdAt.toISOString().replace(/\.\d{3}Z$/, "Z");
  return `# created: ${created}\n# public key: ${recipient}\n${identity}\n`;
}

/** Non-comment, non-blank lines of a key file, with their 1-based line numbers. */
function keyLines(text: string): Array<{ line: string; n: number }> {
  const out: Array<{ line: string; n: number }> = [];
  const lines = text.replace(/^\uFEFF/, "").split("\n");
  lines.forEach((raw, i) => {
    const line = raw.trim();
    if (line === "" || line.startsWith("#")) return;
    out.push({ line, n: i + 1 });
  });
  return out;
}

/**
 * Parse a recipients file (one `age1…` X25519 recipient per line, `#` comments and blank
 * lines ignored) or a single recipient string.
 *
 * @returns the recipients in file order, without duplicates.
 * @throws MEMSNAP_IDENTITY_INVALID if a line is not an X25519 age recipient (SSH keys,
 *   post-quantum and plugin recipients are not supported), or there is none.
 */
export function parseRecipients(text: string): string[] {
  const out: string[] = [];
  for (const { line, n } of keyLines(text)) {
    if (decodeRecipient(line) === null) {
      let what = `line ${n} is not an age X25519 recipient: ${shorten(line)}`;
      if (line.startsWith("AGE-SECRET-KEY-")) what = `line ${n} is a secret identity, not a recipient`;
      else if (line.startsWith("ssh-")) what = `line ${n} is an SSH key; memsnap supports only age X25519 recipients`;
      else if (line.startsWith("age1") && line.length !== 62) {
        what =
          `line ${n} is not an X25519 age recipient (post-quantum, tag and plugin recipients are not ` +
          `supported): ${shorten(line)}`;
      }
      throw new MemsnapError("MEMSNAP_IDENTITY_INVALID", what, { hint: RECIPIENT_HINT });
    }
    if (!out.includes(line)) out.push(line);
  }
  if (out.length === 0) {
    throw new MemsnapError("MEMSNAP_IDENTITY_INVALID", "no age recipient found", { hint: RECIPIENT_HINT });
  }
  return out;
}

/**
 * Parse an identity file as `age-keygen` writes it: `AGE-SECRET-KEY-1…` lines, `#`
 * comments and blank lines ignored.
 *
 * @returns the identities in file order, without duplicates.
 * @throws MEMSNAP_IDENTITY_INVALID if a line is not an X25519 age identity, the file is
 *   itself age-encrypted, or it holds no identity.
 */
export function parseIdentities(text: string): string[] {
  const trimmed = text.replace(/^\uFEFF/, "").trimStart();
  if (trimmed.startsWith("age-encryption.org/") || trimmed.startsWith(ARMOR_BEGIN)) {
    throw new MemsnapError("MEMSNAP_IDENTITY_INVALID", "the identity file is itself age-encrypted", {
      hint: "decrypt it first (age -d -o key.txt key.txt.age) and pass the plain identity file",
    });
  }
  const out: string[] = [];
  for (const { line, n } of keyLines(text)) {
    if (decodeIdentity(line) === null) {
      let what = `line ${n} of the identity file is not an age X25519 identity`;
      if (line.startsWith("age1")) what = `line ${n} of the identity file is a recipient (public key), not an identity`;
      else if (line.startsWith("AGE-SECRET-KEY-PQ-") || line.startsWith("AGE-PLUGIN-")) {
        what = `line ${n} is a post-quantum or plugin identity; memsnap supports only X25519 identities`;
      } else if (line.startsWith("-----BEGIN")) {
        what = `line ${n} looks like a PEM/SSH key; memsnap supports only age X25519 identities`;
      }
      throw new MemsnapError("MEMSNAP_IDENTITY_INVALID", what, { hint: IDENTITY_HINT });
    }
    if (!out.includes(line)) out.push(line);
  }
  if (out.length === 0) {
    throw new MemsnapError("MEMSNAP_IDENTITY_INVALID", "the identity file holds no AGE-SECRET-KEY-1 line", {
      hint: IDENTITY_HINT,
    });
  }
  return out;
}

/**
 * A short, stable, non-secret fingerprint of a recipient for manifests:
 * `"sha256:" + the first 16 hex characters of SHA-256(recipient string)`.
 * (For passphrase bundles the caller records `scrypt` instead.) Never throws.
 */
export function recipientFingerprint(recipient: string): string {
  return "sha256:" + createHash("sha256").update(recipient, "utf8").digest("hex").slice(0, 16);
}
