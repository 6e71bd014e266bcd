// Rekeying: a new header around the same file key (the payload STREAM stays as it is).

import { createHmac, hkdfSync, timingSafeEqual } from "node:crypto";
import { MemsnapError } from "../../errors.js";
import { decodeRecipient } from "./bech32.js";
import { AGE_MAGIC, decryptFailed, HEADER_MAX, NONCE_LEN, RECIPIENT_HINT, shorten } from "./common.js";
import { ageHeader, parseHeader, type StanzaOut } from "./header.js";
import { DEFAULT_SCRYPT_LOG_N, MAX_SCRYPT_LOG_N, scryptMaxLogN, scryptStanza, unwrapScrypt } from "./scrypt.js";
import { AgeDecryptStream, type AgeDecryptOptions } from "./stream-open.js";
import { unwrapX25519, x25519Identity, x25519Stanza } from "./x25519.js";

/** One recipient stanza of an existing header, kept opaque so it can be written back as it was. */
export interface AgeStanza {
  /** The stanza type (`X25519`, `scrypt`, or another age recipient type). */
  readonly type: string;
  readonly args: readonly string[];
  readonly body: Buffer;
}

/** An age header opened for rekeying. */
export interface OpenedAgeHeader {
  /** Bytes of the header, through the MAC line's newline; the nonce and STREAM chunks follow. */
  headerLength: number;
  /** The file key the header wraps (secret: keep it only while the new header is built). */
  fileKey: Uint8Array;
  stanzas: AgeStanza[];
  /** Which stanza the given identity or passphrase opened. */
  opened: number;
}

/**
 * Open the age header at the start of `prefix` (the payload's first bytes, up to
 * {@link AGE_PREFIX_MAX}) with the given identities or passphrases, and return the file key,
 * the stanzas and which of them opened: what {@link writeAgeHeader} needs to wrap the same file
 * key for other recipients. Errors as {@link createAgeDecryptor}'s (MEMSNAP_DECRYPT_FAILED when
 * no key opens it or the MAC fails, MEMSNAP_PAYLOAD_MISLABELED when it is not age).
 */
export async function openAgeHeaderForRekey(prefix: Buffer, opts: AgeDecryptOptions): Promise<OpenedAgeHeader> {
  const ids = [...(opts.identities ?? [])];
  const s = new AgeDecryptStream(ids, [...(opts.passphrases ?? [])], scryptMaxLogN(opts.scryptMaxLogN));
  // The stream's own header reader (magic, MAC-line search, the same errors), then its opener.
  const bytes = prefix.subarray(0, Math.min(prefix.length, HEADER_MAX));
  const at = bytes.indexOf("\n--- ", 0, "latin1");
  const nl = at >= 0 ? bytes.indexOf(0x0a, at + 5) : -1;
  if (bytes.subarray(0, AGE_MAGIC.length).compare(AGE_MAGIC) !== 0 || nl < 0) {
    await s.openPrefix(prefix, true); // throws the precise error (mislabeled, truncated, too long)
    throw decryptFailed("the age header has no MAC line; the bundle is damaged");
  }
  const header = prefix.subarray(0, nl + 1);
  if (prefix.length < header.length + NONCE_LEN) {
    throw decryptFailed("the age file is truncated: it ends before the payload nonce");
  }
  // The precise error (no key given, wrong key, malformed, MAC) as a restore would give it.
  const fail = async (): Promise<never> => {
    await s.openPrefix(prefix, false);
    throw decryptFailed("the age header does not open");
  };
  let parsed: ReturnType<typeof parseHeader>;
  try {
    parsed = parseHeader(header);
  } catch {
    return fail();
  }
  const { stanzas, macInput, mac } = parsed;
  const hasScrypt = stanzas.some((st) => st.args[0] === "scrypt");
  if (hasScrypt && stanzas.length !== 1) return fail();
  let fileKey: Uint8Array | null = null;
  let opened = -1;
  try {
    if (hasScrypt) {
      for (const p of opts.passphrases ?? []) {
        if ((fileKey = await unwrapScrypt(stanzas[0]!, p, scryptMaxLogN(opts.scryptMaxLogN))) !== null) {
          opened = 0;
          break;
        }
      }
    } else {
      const ids = (opts.identities ?? []).map(x25519Identity);
      outer: for (let i = 0; i < stanzas.length; i++) {
        if (stanzas[i]!.args[0] !== "X25519") continue;
        for (const id of ids) {
          if ((fileKey = unwrapX25519(stanzas[i]!, id)) !== null) {
            opened = i;
            break outer;
          }
        }
      }
    }
  } catch (e) {
    if (e instanceof MemsnapError) throw e;
    return fail();
  }
  if (fileKey === null) return fail();
  const macKey = Buffer.from(hkdfSync("sha256", fileKey, Buffer.alloc(0), "header", 32));
  const want = createHmac("sha256", macKey).update(macInput).digest();
  if (!timingSafeEqual(want, mac)) return fail();
  return {
    headerLength: header.length,
    fileKey,
    stanzas: stanzas.map((st) => ({ type: st.args[0]!, args: [...st.args], body: Buffer.from(st.body) })),
    opened,
  };
}

/**
 * A new age v1 header for `fileKey`: the `keep` stanzas of an old header as they were (they
 * wrap the same file key), then a new X25519 stanza per recipient, or one scrypt stanza for a
 * passphrase (which must then be the only stanza), and a new header MAC.
 *
 * @throws MEMSNAP_USAGE when the result would have no stanza, or a passphrase beside others.
 * @throws MEMSNAP_IDENTITY_INVALID for a recipient that is not an age X25519 recipient.
 */
export async function writeAgeHeader(
  fileKey: Uint8Array,
  opts: { keep?: readonly AgeStanza[]; recipients?: readonly string[]; passphrase?: string; scryptLogN?: number },
): Promise<Buffer> {
  const stanzas: StanzaOut[] = (opts.keep ?? []).map((st) => ({ args: [...st.args], body: Buffer.from(st.body) }));
  for (const r of opts.recipients ?? []) {
    const pub = decodeRecipient(r);
    if (pub === null) {
      throw new MemsnapError("MEMSNAP_IDENTITY_INVALID", `not an age X25519 recipient: ${shorten(r)}`, {
        hint: RECIPIENT_HINT,
      });
    }
    stanzas.push(x25519Stanza(pub, fileKey));
  }
  if (opts.passphrase !== undefined) {
    if (opts.passphrase === "") {
      throw new MemsnapError("MEMSNAP_USAGE", "the passphrase is empty", { hint: "use a long random passphrase" });
    }
    if (stanzas.length) {
      throw new MemsnapError("MEMSNAP_USAGE", "a passphrase must be the only recipient of an age file", {
        hint: "encrypt to recipients or to a passphrase, not both",
      });
    }
    const logN = opts.scryptLogN ?? DEFAULT_SCRYPT_LOG_N;
    if (!Number.isInteger(logN) || logN < 1 || logN > MAX_SCRYPT_LOG_N) {
      throw new MemsnapError(
        "MEMSNAP_USAGE",
        `scrypt work factor must be an integer 1..${MAX_SCRYPT_LOG_N}, got ${logN}`,
      );
    }
    stanzas.push(await scryptStanza(opts.passphrase, logN, fileKey));
  }
  if (stanzas.some((st) => st.args[0] === "scrypt") && stanzas.length > 1) {
    throw new MemsnapError("MEMSNAP_USAGE", "a passphrase must be the only recipient of an age file", {
      hint: "replace the passphrase, or encrypt to recipients instead",
    });
  }
  if (stanzas.length === 0) {
    throw new MemsnapError("MEMSNAP_USAGE", "the age file would have no recipient", {
      hint: "keep at least one recipient, or give a new one with -r",
    });
  }
  return ageHeader(fileKey, stanzas);
}
