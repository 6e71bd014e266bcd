/**
 * Standard age (https://age-encryption.org/v1) encryption and decryption as Node streams.
 *
 * Everything is node:crypto: the header (X25519 and scrypt recipient stanzas, the header MAC,
 * unwrapping the file key) and the payload STREAM with `chacha20-poly1305`, an order of
 * magnitude faster than the pure-JS streaming of the `age-encryption` package (typage), which
 * is loaded only to generate keys. The output is a plain age v1 file that the `age` CLI reads
 * and writes.
 *
 * This file holds what the others share: sizes, hints, base64 and error helpers, STREAM nonces.
 * bech32.ts and keys.ts: keys and key files; header.ts: the header's grammar and MAC;
 * x25519.ts and scrypt.ts: the two stanza types; open-header.ts: unwrapping the file key;
 * stream-seal.ts and stream-open.ts: the payload STREAM; rekey.ts: a new header for a file key.
 */

import { hkdfSync } from "node:crypto";
import { MemsnapError } from "../../errors.js";

/** The first bytes of every (binary, unarmored) age v1 file. */
export const AGE_MAGIC: Buffer = Buffer.from("age-encryption.org/v1\n", "latin1");

export const CHUNK = 64 * 1024;
export const TAG = 16;
export const SEALED_CHUNK = CHUNK + TAG;
export const NONCE_LEN = 16;
/** Largest header we buffer before giving up. */
export const HEADER_MAX = 64 * 1024;

export const ARMOR_BEGIN = "-----BEGIN AGE ENCRYPTED FILE-----";

export const DAMAGED_HINT =
  "check that the identity file (or passphrase) is the one the bundle was encrypted to; " +
  "if it is, the bundle may be damaged";
export const RECIPIENT_HINT =
  "a recipient is an X25519 public key starting with age1 (62 characters), as printed by `age-keygen` or " +
  "`memsnap keygen`; one per line in a recipients file";
export const IDENTITY_HINT =
  "an identity file holds lines starting with AGE-SECRET-KEY-1 (as written by `age-keygen -o key.txt`); " +
  "lines starting with # are comments";

export const base64NoPad = (b: Uint8Array): string => Buffer.from(b).toString("base64").replace(/=+$/, "");

/** Canonical unpadded standard base64 of `s`, or null (age rejects padding and non-canonical trailing bits). */
export function b64Strict(s: string): Buffer | null {
  if (!/^[A-Za-z0-9+/]*$/.test(s) || s.length % 4 === 1) return null;
  const b = Buffer.from(s, "base64");
  return base64NoPad(b) === s ? b : null;
}

/** A recipient shortened for messages (never a secret). */
export function shorten(s: string): string {
  return s.length > 24 ? `${s.slice(0, 20)}…` : s;
}

// ---------------------------------------------------------------------------------------
// STREAM helpers.
//
// Payload layout (age v1 spec): 16-byte random nonce, then chunks of 64 KiB plaintext,
// each sealed with ChaCha20-Poly1305 under key HKDF-SHA256(fileKey, nonce, "payload")
// and nonce = 11-byte big-endian chunk counter || last-flag byte (1 on the final chunk).
// Only the final chunk may be shorter than 64 KiB; it is empty only for an empty file.

export function payloadKey(fileKey: Uint8Array, nonce: Uint8Array): Buffer {
  return Buffer.from(hkdfSync("sha256", fileKey, nonce, "payload", 32));
}

export function chunkNonce(counter: number, last: boolean): Buffer {
  const n = Buffer.alloc(12);
  // 11-byte big-endian counter; 2^48 chunks (16 EiB) is far beyond any bundle.
  n.writeUIntBE(counter, 5, 6);
  n[11] = last ? 1 : 0;
  return n;
}

export function errMessage(e: unknown): string {
  return e instanceof Error ? e.message : String(e);
}

export function decryptFailed(message: string, cause?: unknown): MemsnapError {
  return new MemsnapError("MEMSNAP_DECRYPT_FAILED", message, {
    hint: DAMAGED_HINT,
    ...(cause === undefined ? {} : { cause }),
  });
}

export function asError(e: unknown): Error {
  if (e instanceof MemsnapError) return e;
  return new MemsnapError("MEMSNAP_INTERNAL", `age stream failed: ${errMessage(e)}`, { cause: e });
}
