// age decryption: buffering and opening the header, then the payload STREAM opened chunk by
// chunk, each held back until the input shows whether it is the last (see common.ts).

import { createDecipheriv } from "node:crypto";
import { Transform, type TransformCallback } from "node:stream";
import { MemsnapError } from "../../errors.js";
import { decodeIdentity } from "./bech32.js";
import {
  AGE_MAGIC,
  ARMOR_BEGIN,
  asError,
  chunkNonce,
  DAMAGED_HINT,
  decryptFailed,
  errMessage,
  HEADER_MAX,
  IDENTITY_HINT,
  NONCE_LEN,
  payloadKey,
  SEALED_CHUNK,
  TAG,
} from "./common.js";
import { openAgeHeader } from "./open-header.js";
import { scryptMaxLogN } from "./scrypt.js";

type Phase = "header" | "nonce" | "payload" | "done";

const TOO_LONG = `the age header is longer than ${HEADER_MAX} bytes or has no MAC line; the bundle is damaged`;

export class AgeDecryptStream extends Transform {
  private phase: Phase = "header";
  private readonly headerBuf = Buffer.allocUnsafe(HEADER_MAX);
  private headerLen = 0;
  private scanFrom = 0;
  private readonly nonceBuf = Buffer.allocUnsafe(NONCE_LEN);
  private nonceLen = 0;
  private fileKey: Uint8Array | undefined;
  private key: Buffer | undefined;
  /** The current sealed chunk, held back until we know whether input ends after it. */
  private readonly buf = Buffer.allocUnsafe(SEALED_CHUNK);
  private used = 0;
  private counter = 0;

  constructor(
    private readonly identities: string[],
    private readonly passphrases: string[],
    /** The highest scrypt work factor opened (see scryptMaxLogN). */
    private readonly maxLogN: number,
  ) {
    super();
  }

  override _transform(chunk: Buffer | string, _enc: BufferEncoding, callback: TransformCallback): void {
    try {
      const data = typeof chunk === "string" ? Buffer.from(chunk) : chunk;
      if (this.phase !== "header") {
        this.consume(data);
        callback();
        return;
      }
      const rest = this.takeHeader(data);
      if (rest === null) {
        callback();
        return;
      }
      this.openHeader().then(
        () => {
          try {
            this.consume(rest);
            callback();
          } catch (e) {
            callback(asError(e));
          }
        },
        (e: unknown) => callback(asError(e)),
      );
    } catch (e) {
      callback(asError(e));
    }
  }

  override _flush(callback: TransformCallback): void {
    try {
      this.finish();
      callback();
    } catch (e) {
      callback(asError(e));
    }
  }

  /** Check the magic as early as possible. */
  private checkMagic(): void {
    const n = Math.min(this.headerLen, AGE_MAGIC.length);
    if (this.headerBuf.compare(AGE_MAGIC, 0, n, 0, n) === 0) return;
    const start = this.headerBuf.subarray(0, Math.min(this.headerLen, ARMOR_BEGIN.length)).toString("latin1");
    if (ARMOR_BEGIN.startsWith(start) && start.length > 0) {
      throw new MemsnapError("MEMSNAP_PAYLOAD_MISLABELED", "the payload is ASCII-armored age, not binary age", {
        hint: "memsnap writes binary age; de-armor it with `age -d` first",
      });
    }
    const msg = "the payload is not age-encrypted (it does not start with the age v1 header)";
    throw new MemsnapError("MEMSNAP_PAYLOAD_MISLABELED", msg, {
      hint: "the bundle may be unencrypted or mislabeled; try it without an identity, or run `memsnap verify`",
    });
  }

  private configError(): MemsnapError | null {
    if (this.identities.length === 0 && this.passphrases.length === 0) {
      const msg = "the bundle is age-encrypted and no identity or passphrase was given";
      return new MemsnapError("MEMSNAP_IDENTITY_REQUIRED", msg, {
        hint: "pass --identity <key file> (or the passphrase the bundle was made with)",
      });
    }
    for (const id of this.identities) {
      if (decodeIdentity(id) === null) {
        const msg = "a given identity is not an X25519 age identity (AGE-SECRET-KEY-1…)";
        return new MemsnapError("MEMSNAP_IDENTITY_INVALID", msg, {
          hint: IDENTITY_HINT,
        });
      }
    }
    return null;
  }

  /** Buffer header bytes; returns the bytes after the header once it is complete, else null. */
  private takeHeader(data: Buffer): Buffer | null {
    const n = Math.min(HEADER_MAX - this.headerLen, data.length);
    data.copy(this.headerBuf, this.headerLen, 0, n);
    this.headerLen += n;
    this.checkMagic();
    // The header ends with the first line starting "--- " (base64 and "-> " lines never do).
    const have = this.headerBuf.subarray(0, this.headerLen);
    let end = -1;
    const at = have.indexOf("\n--- ", Math.max(0, this.scanFrom - 4), "latin1");
    if (at >= 0) {
      const nl = have.indexOf(0x0a, at + 5);
      if (nl >= 0) end = nl + 1;
    }
    if (end < 0) {
      this.scanFrom = at >= 0 ? at : this.headerLen;
      if (this.headerLen >= HEADER_MAX) {
        throw decryptFailed(TOO_LONG);
      }
      return null;
    }
    const fromBuf = this.headerBuf.subarray(end, this.headerLen);
    const rest = fromBuf.length > 0 ? Buffer.concat([fromBuf, data.subarray(n)]) : data.subarray(n);
    this.headerLen = end;
    this.phase = "nonce";
    return rest;
  }

  /**
   * Open the header and nonce found in `prefix` (the payload's first bytes; `whole` when that
   * is all of it) and return the payload key and where the STREAM chunks start, for a
   * decryptor that runs elsewhere (the payload worker). Throws the same errors as the stream.
   */
  async openPrefix(prefix: Buffer, whole: boolean): Promise<{ key: Buffer; offset: number }> {
    const rest = this.takeHeader(prefix);
    if (rest === null) {
      if (whole) this.finish();
      throw decryptFailed(TOO_LONG);
    }
    await this.openHeader();
    if (rest.length < NONCE_LEN) throw decryptFailed("the age file is truncated: it ends before the payload nonce");
    if (this.fileKey === undefined) throw new MemsnapError("MEMSNAP_INTERNAL", "age file key missing");
    const key = payloadKey(this.fileKey, rest.subarray(0, NONCE_LEN));
    this.fileKey = undefined;
    return { key, offset: prefix.length - rest.length + NONCE_LEN };
  }

  private async openHeader(): Promise<void> {
    const cfg = this.configError();
    if (cfg) throw cfg;
    const header = Buffer.from(this.headerBuf.subarray(0, this.headerLen));
    let fileKey: Uint8Array;
    try {
      fileKey = await openAgeHeader(header, this.identities, this.passphrases, this.maxLogN);
    } catch (e) {
      if (e instanceof MemsnapError) throw e;
      const msg = errMessage(e);
      if (/no identity matched/.test(msg)) {
        const text = this.headerBuf.subarray(0, this.headerLen).toString("latin1");
        const kinds = [...text.matchAll(/^-> (\S+)/gm)].map((m) => m[1]);
        let extra = "";
        if (kinds.includes("scrypt") && this.passphrases.length === 0) {
          extra = " (the bundle is encrypted to a passphrase, and none was given)";
        } else if (!kinds.includes("scrypt") && this.identities.length === 0) {
          extra = " (the bundle is encrypted to recipients, and only passphrases were given)";
        }
        throw decryptFailed(`no given identity or passphrase opens the bundle${extra}`, e);
      }
      if (/HMAC/i.test(msg)) {
        throw decryptFailed("the age header MAC does not verify: the header is damaged or was altered", e);
      }
      throw decryptFailed(`the age header is malformed: ${msg}`, e);
    }
    this.fileKey = fileKey;
  }

  private consume(data: Buffer): void {
    if (this.phase === "nonce" && data.length > 0) {
      const n = Math.min(NONCE_LEN - this.nonceLen, data.length);
      data.copy(this.nonceBuf, this.nonceLen, 0, n);
      this.nonceLen += n;
      data = data.subarray(n);
      if (this.nonceLen === NONCE_LEN) {
        if (this.fileKey === undefined) throw new MemsnapError("MEMSNAP_INTERNAL", "age file key missing");
        this.key = payloadKey(this.fileKey, this.nonceBuf);
        this.fileKey = undefined;
        this.phase = "payload";
      }
    }
    while (data.length > 0) {
      if (this.used === SEALED_CHUNK) {
        // More input follows the held-back full chunk, so it must not be the last one.
        this.open(this.buf, false);
        this.used = 0;
      }
      if (this.used === 0 && data.length > SEALED_CHUNK) {
        this.open(data.subarray(0, SEALED_CHUNK), false);
        data = data.subarray(SEALED_CHUNK);
        continue;
      }
      const n = Math.min(SEALED_CHUNK - this.used, data.length);
      data.copy(this.buf, this.used, 0, n);
      this.used += n;
      data = data.subarray(n);
    }
  }

  /** Decrypt one sealed chunk and push its plaintext; throws MEMSNAP_DECRYPT_FAILED. */
  private open(sealed: Buffer, last: boolean): void {
    const plain = this.tryOpen(sealed, last);
    if (plain !== null) {
      this.push(plain);
      this.counter++;
      return;
    }
    if (!last && this.tryOpen(sealed, true) !== null) {
      throw decryptFailed(`trailing data after the final age chunk (chunk ${this.counter})`);
    }
    if (last && sealed.length === SEALED_CHUNK && this.tryOpen(sealed, false) !== null) {
      throw decryptFailed(
        `the age payload is truncated: it ends after chunk ${this.counter}, which is not marked final`,
      );
    }
    const why = last ? " (the file is truncated or damaged)" : "";
    throw decryptFailed(`age payload chunk ${this.counter} does not authenticate${why}`);
  }

  private tryOpen(sealed: Buffer, last: boolean): Buffer | null {
    if (this.key === undefined) throw new MemsnapError("MEMSNAP_INTERNAL", "age payload key missing");
    const d = createDecipheriv("chacha20-poly1305", this.key, chunkNonce(this.counter, last), { authTagLength: TAG });
    d.setAuthTag(sealed.subarray(sealed.length - TAG));
    const plain = d.update(sealed.subarray(0, sealed.length - TAG));
    try {
      d.final();
    } catch {
      return null;
    }
    return plain;
  }

  private finish(): void {
    if (this.phase === "header") {
      if (this.headerLen > 0) this.checkMagic();
      const cfg = this.headerLen >= AGE_MAGIC.length ? this.configError() : null;
      if (cfg) throw cfg;
      throw decryptFailed(
        this.headerLen === 0 ? "the age payload is empty" : "the age file is truncated inside its header",
      );
    }
    if (this.phase === "nonce") throw decryptFailed("the age file is truncated: it ends before the payload nonce");
    if (this.phase === "done") return;
    if (this.used < TAG) {
      throw decryptFailed(
        this.used === 0 && this.counter === 0
          ? "the age file is truncated: it has no payload after the nonce"
          : "the age file is truncated inside a chunk",
      );
    }
    if (this.used === TAG && this.counter > 0) {
      throw decryptFailed("the age payload ends with an empty final chunk, which is invalid");
    }
    this.open(this.buf.subarray(0, this.used), true);
    this.used = 0;
    this.phase = "done";
    this.key = undefined;
  }
}

/** The keys a decryption is given, and the highest scrypt work factor it opens (see scryptMaxLogN). */
export interface AgeDecryptOptions {
  identities?: string[];
  passphrases?: string[];
  scryptMaxLogN?: number;
}

/** How many payload bytes {@link openAgePrefix} needs at most (the longest header plus the nonce). */
export const AGE_PREFIX_MAX = HEADER_MAX + NONCE_LEN;
export const AGE_SEALED_CHUNK = SEALED_CHUNK;
export { DAMAGED_HINT as AGE_DAMAGED_HINT };

/**
 * Open an age file's header and nonce from its first bytes (up to {@link AGE_PREFIX_MAX};
 * `whole` when `prefix` is the entire file): returns the STREAM payload key and the offset of
 * the first sealed chunk. Errors as {@link createAgeDecryptor}'s.
 */
export async function openAgePrefix(
  prefix: Buffer,
  whole: boolean,
  opts: AgeDecryptOptions,
): Promise<{ key: Buffer; offset: number }> {
  const ids = [...(opts.identities ?? [])];
  const s = new AgeDecryptStream(ids, [...(opts.passphrases ?? [])], scryptMaxLogN(opts.scryptMaxLogN));
  return s.openPrefix(prefix, whole);
}

/**
 * Create a Transform that turns an age v1 file into its plaintext, opening it with the
 * given X25519 identities (`AGE-SECRET-KEY-1…`) and/or passphrases. All errors come out as
 * stream errors, so `stream/promises` `pipeline` rejects with the MemsnapError:
 *
 * @throws MEMSNAP_PAYLOAD_MISLABELED if the input does not start with {@link AGE_MAGIC}
 *   (checked first, e.g. a zstd stream or an armored age file).
 * @throws MEMSNAP_IDENTITY_REQUIRED if neither identities nor passphrases were given.
 * @throws MEMSNAP_IDENTITY_INVALID if a given identity is not an X25519 age identity.
 * @throws MEMSNAP_DECRYPT_FAILED if no identity/passphrase matches, the header is
 *   malformed or its MAC fails, a chunk does not authenticate, the file is truncated
 *   (header, nonce, inside a chunk or at a chunk boundary), or data follows the final chunk.
 * @throws MEMSNAP_UNSAFE_BUNDLE if a passphrase is tried on an scrypt stanza whose work
 *   factor is over `scryptMaxLogN` (default 2^18; see {@link scryptMaxLogN}).
 */
export function createAgeDecryptor(opts: AgeDecryptOptions): Transform {
  const ids = [...(opts.identities ?? [])];
  return new AgeDecryptStream(ids, [...(opts.passphrases ?? [])], scryptMaxLogN(opts.scryptMaxLogN));
}
