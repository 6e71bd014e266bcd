// age X25519 stanzas on node:crypto: a recipient's key from its identity, wrapping and unwrapping.

import {
  createPrivateKey,
  createPublicKey,
  diffieHellman,
  generateKeyPairSync,
  hkdfSync,
  type KeyObject,
} from "node:crypto";
import { MemsnapError } from "../../errors.js";
import { bech32Encode, decodeIdentity } from "./bech32.js";
import { b64Strict, base64NoPad, IDENTITY_HINT, RECIPIENT_HINT, TAG } from "./common.js";
import { HeaderMalformed, openFileKey, sealFileKey, type StanzaIn, type StanzaOut } from "./header.js";

/** PKCS#8 DER prefix of a raw X25519 private key (RFC 8410). */
const X25519_PKCS8_PREFIX = Buffer.from("302e020100300506032b656e04220420", "hex");
/** The HKDF info of an X25519 stanza's wrap key. */
const X25519_LABEL = "age-encryption.org/v1/X25519";

/** The `age1…` recipient of a decoded X25519 scalar, computed synchronously with node:crypto. */
export function recipientOfScalar(scalar: Uint8Array): string {
  const key = createPrivateKey({ key: Buffer.concat([X25519_PKCS8_PREFIX, scalar]), format: "der", type: "pkcs8" });
  const jwk = createPublicKey(key).export({ format: "jwk" });
  if (typeof jwk.x !== "string") throw new MemsnapError("MEMSNAP_INTERNAL", "could not derive an X25519 public key");
  return bech32Encode("age", Buffer.from(jwk.x, "base64url"));
}

/**
 * age X25519 recipient (age spec, "X25519 recipient stanza"): an ephemeral key pair, the
 * shared secret with the recipient, wrap key = HKDF-SHA-256(shared, salt = ephemeral share ‖
 * recipient, "age-encryption.org/v1/X25519"), body = the file key sealed under it.
 */
export function x25519Stanza(recipient: Uint8Array, fileKey: Uint8Array): StanzaOut {
  const { publicKey, privateKey } = generateKeyPairSync("x25519");
  const share = Buffer.from(publicKey.export({ format: "jwk" }).x!, "base64url");
  const their = createPublicKey({
    key: { kty: "OKP", crv: "X25519", x: Buffer.from(recipient).toString("base64url") },
    format: "jwk",
  });
  const shared = diffieHellman({ privateKey, publicKey: their });
  if (shared.every((b) => b === 0)) {
    throw new MemsnapError("MEMSNAP_IDENTITY_INVALID", "the recipient is a low-order point", { hint: RECIPIENT_HINT });
  }
  const wrap = Buffer.from(hkdfSync("sha256", shared, Buffer.concat([share, recipient]), X25519_LABEL, 32));
  return { args: ["X25519", base64NoPad(share)], body: sealFileKey(wrap, fileKey) };
}

/** An X25519 identity ready to unwrap stanzas: its private key and its recipient's public bytes. */
export function x25519Identity(id: string): { key: KeyObject; recipient: Buffer } {
  const scalar = decodeIdentity(id);
  if (scalar === null) {
    const msg = "a given identity is not an X25519 age identity (AGE-SECRET-KEY-1…)";
    throw new MemsnapError("MEMSNAP_IDENTITY_INVALID", msg, { hint: IDENTITY_HINT });
  }
  const key = createPrivateKey({ key: Buffer.concat([X25519_PKCS8_PREFIX, scalar]), format: "der", type: "pkcs8" });
  const x = createPublicKey(key).export({ format: "jwk" }).x;
  if (typeof x !== "string") throw new MemsnapError("MEMSNAP_INTERNAL", "could not derive an X25519 public key");
  return { key, recipient: Buffer.from(x, "base64url") };
}

/** The file key from an X25519 stanza for `id`, or null when the stanza is not for it. */
export function unwrapX25519(st: StanzaIn, id: { key: KeyObject; recipient: Buffer }): Uint8Array | null {
  const share = st.args.length === 2 ? b64Strict(st.args[1]!) : null;
  if (share === null || share.length !== 32) throw new HeaderMalformed("invalid X25519 stanza");
  if (st.body.length !== 16 + TAG) throw new HeaderMalformed("invalid X25519 stanza body");
  const their = createPublicKey({ key: { kty: "OKP", crv: "X25519", x: share.toString("base64url") }, format: "jwk" });
  let shared: Buffer;
  try {
    shared = diffieHellman({ privateKey: id.key, publicKey: their }); // OpenSSL refuses an all-zero result itself
  } catch {
    throw new HeaderMalformed("the X25519 stanza's share is a low-order point");
  }
  if (shared.every((b) => b === 0)) throw new HeaderMalformed("the X25519 stanza's share is a low-order point");
  const wrap = Buffer.from(hkdfSync("sha256", shared, Buffer.concat([share, id.recipient]), X25519_LABEL, 32));
  return openFileKey(wrap, st.body);
}
