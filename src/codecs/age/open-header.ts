// Opening an age header: unwrapping the file key with an identity or passphrase, then the MAC.

import { createHmac, hkdfSync, timingSafeEqual } from "node:crypto";
import { HeaderMalformed, parseHeader } from "./header.js";
import { scryptMaxLogN, unwrapScrypt } from "./scrypt.js";
import { unwrapX25519, x25519Identity } from "./x25519.js";

/**
 * Open an age v1 header with node:crypto (age spec: X25519 and scrypt recipient stanzas,
 * then the header MAC): the file key, or a HeaderMalformed, "no identity matched" or "HMAC"
 * error. Stanzas of other types are skipped, as age does. An scrypt stanza must be the only
 * one. This replaces typage's Decrypter, whose module graph took ~70-100 ms to load on every
 * restore and keyed verify; interoperability with the real `age` binary is tested both ways.
 */
export async function openAgeHeader(
  header: Buffer,
  identities: string[],
  passphrases: string[],
  maxLogN: number = scryptMaxLogN(),
): Promise<Uint8Array> {
  const { stanzas, macInput, mac } = parseHeader(header);
  const hasScrypt = stanzas.some((st) => st.args[0] === "scrypt");
  if (hasScrypt && stanzas.length !== 1) {
    throw new HeaderMalformed("an scrypt stanza must be the only one in the header");
  }
  let fileKey: Uint8Array | null = null;
  if (hasScrypt) {
    for (const p of passphrases) if ((fileKey = await unwrapScrypt(stanzas[0]!, p, maxLogN)) !== null) break;
  } else {
    const ids = identities.map(x25519Identity);
    outer: for (const st of stanzas) {
      if (st.args[0] !== "X25519") continue;
      for (const id of ids) if ((fileKey = unwrapX25519(st, id)) !== null) break outer;
    }
  }
  if (fileKey === null) throw new Error("no identity matched any of the file's recipients");
  const macKey = Buffer.from(hkdfSync("sha256", fileKey, Buffer.alloc(0), "header", 32));
  const want = createHmac("sha256", macKey).update(macInput).digest();
  if (!timingSafeEqual(want, mac)) throw new Error("invalid header HMAC");
  return fileKey;
}
