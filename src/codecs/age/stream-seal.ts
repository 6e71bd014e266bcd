// age encryption: the header for recipients or a passphrase, then the payload STREAM sealed in
// 64 KiB chunks (see common.ts for the layout).

import { createCipheriv, randomBytes } from "node:crypto";
import { Transform, type TransformCallback } from "node:stream";
import { MemsnapError } from "../../errors.js";
import { decodeRecipient } from "./bech32.js";
import { asError, CHUNK, chunkNonce, NONCE_LEN, payloadKey, RECIPIENT_HINT, shorten, TAG } from "./common.js";
import { ageHeader, type StanzaOut } from "./header.js";
import { DEFAULT_SCRYPT_LOG_N, MAX_SCRYPT_LOG_N, scryptStanza } from "./scrypt.js";
import { x25519Stanza } from "./x25519.js";

class AgeEncryptStream extends Transform {
  private readonly key: Buffer;
  /** Pending plaintext of the current chunk (held back until we know whether it is last). */
  private readonly buf = Buffer.allocUnsafe(CHUNK);
  private used = 0;
  private counter = 0;

  constructor(preamble: Buffer, key: Buffer) {
    super();
    this.key = key;
    this.push(preamble);
  }

  private seal(plain: Buffer, last: boolean): void {
    const c = createCipheriv("chacha20-poly1305", this.key, chunkNonce(this.counter, last), { authTagLength: TAG });
    const ct = c.update(plain);
    c.final();
    this.push(ct);
    this.push(c.getAuthTag());
    this.counter++;
  }

  override _transform(chunk: Buffer | string, _enc: BufferEncoding, callback: TransformCallback): void {
    try {
      let data = typeof chunk === "string" ? Buffer.from(chunk) : chunk;
      while (data.length > 0) {
        if (this.used === CHUNK) {
          // More input follows, so the held-back full chunk is not the last one.
          this.seal(this.buf, false);
          this.used = 0;
        }
        if (this.used === 0 && data.length > CHUNK) {
          // Fast path: a whole chunk followed by more bytes, sealed in place.
          this.seal(data.subarray(0, CHUNK), false);
          data = data.subarray(CHUNK);
          continue;
        }
        const n = Math.min(CHUNK - this.used, data.length);
        data.copy(this.buf, this.used, 0, n);
        this.used += n;
        data = data.subarray(n);
      }
      callback();
    } catch (e) {
      callback(asError(e));
    }
  }

  override _flush(callback: TransformCallback): void {
    try {
      this.seal(this.buf.subarray(0, this.used), true);
      this.used = 0;
      callback();
    } catch (e) {
      callback(asError(e));
    }
  }
}

/**
 * Create a Transform that turns plaintext into a standard age v1 file, encrypted either to
 * X25519 recipients (`age1…`) or to a passphrase (scrypt, work factor 2^`scryptLogN`,
 * default 2^18). Readable by `age -d` and by {@link createAgeDecryptor}.
 *
 * @throws MEMSNAP_USAGE (rejects) unless exactly one of a non-empty `recipients` or a
 *   non-empty `passphrase` is given, or when `scryptLogN` is not an integer in 1..20.
 * @throws MEMSNAP_IDENTITY_INVALID (rejects) if a recipient is not an X25519 age recipient.
 * @throws MEMSNAP_INTERNAL (rejects) if building the header fails unexpectedly.
 */
export async function createAgeEncryptor(opts: AgeEncryptOptions): Promise<Transform> {
  const { preamble, key } = await prepareAgeEncryption(opts);
  return new AgeEncryptStream(preamble, key);
}

export interface AgeEncryptOptions {
  recipients?: string[];
  passphrase?: string;
  scryptLogN?: number;
}

/** What a STREAM encryptor needs: the bytes before the first chunk, and the payload key. */
export interface AgeStreamParams {
  /** The age header (with its MAC line) followed by the 16-byte payload nonce. */
  preamble: Buffer;
  /** The ChaCha20-Poly1305 payload key (HKDF of the file key and the nonce). */
  key: Buffer;
}

/** STREAM chunk size (plaintext bytes per sealed chunk) and tag size, for encryptors outside this module. */
export const AGE_CHUNK = CHUNK;
export const AGE_TAG = TAG;

/**
 * Build the age header for the recipients or passphrase and derive the payload key, so that
 * the STREAM part can run elsewhere (the snapshot's payload worker). Same checks and errors as
 * {@link createAgeEncryptor}.
 */
export async function prepareAgeEncryption(opts: AgeEncryptOptions): Promise<AgeStreamParams> {
  const hasRecipients = opts.recipients !== undefined && opts.recipients.length > 0;
  const hasPassphrase = opts.passphrase !== undefined;
  if (hasRecipients === hasPassphrase) {
    throw new MemsnapError(
      "MEMSNAP_USAGE",
      hasRecipients
        ? "encrypt to recipients or to a passphrase, not both"
        : "encryption needs at least one recipient or a passphrase",
      {
        hint: "pass --recipient/--recipients-file, or --passphrase, but not both",
      },
    );
  }
  if (hasPassphrase && opts.passphrase === "") {
    throw new MemsnapError("MEMSNAP_USAGE", "the passphrase is empty", { hint: "use a long random passphrase" });
  }
  const logN = opts.scryptLogN ?? DEFAULT_SCRYPT_LOG_N;
  if (!Number.isInteger(logN) || logN < 1 || logN > MAX_SCRYPT_LOG_N) {
    throw new MemsnapError(
      "MEMSNAP_USAGE",
      `scrypt work factor must be an integer 1..${MAX_SCRYPT_LOG_N}, got ${logN}`,
    );
  }

  const fileKey = randomBytes(16);
  const stanzas: StanzaOut[] = [];
  if (hasRecipients) {
    for (const r of opts.recipients ?? []) {
      const pub = decodeRecipient(r);
      if (pub === null) {
        throw new MemsnapError("MEMSNAP_IDENTITY_INVALID", `not an age X25519 recipient: ${shorten(r)}`, {
          hint: RECIPIENT_HINT,
        });
      }
      stanzas.push(x25519Stanza(pub, fileKey));
    }
  } else {
    stanzas.push(await scryptStanza(opts.passphrase ?? "", logN, fileKey));
  }
  const header = ageHeader(fileKey, stanzas);
  const nonce = randomBytes(NONCE_LEN);
  return { preamble: Buffer.concat([header, nonce]), key: payloadKey(fileKey, nonce) };
}
