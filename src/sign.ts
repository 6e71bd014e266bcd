/**
 * Signed manifests: an Ed25519 signature over the manifest's seal.
 *
 * The seal is SHA-256 over the canonical manifest without `seal` and `signature`, and the
 * manifest holds the payload's SHA-256, so the signature commits to every manifest field
 * and every stored payload byte. Verification recomputes the seal from the content (never
 * trusts the stored one), so a changed byte anywhere in the manifest fails the signature;
 * a changed payload byte fails the payload hash the signature vouches for. It needs no
 * decryption key: `verify --trust` proves offline who made a bundle.
 */
import {
  createHash,
  createPrivateKey,
  createPublicKey,
  generateKeyPairSync,
  sign,
  verify,
  type KeyObject,
} from "node:crypto";
import { readFile } from "node:fs/promises";
import { MemsnapError } from "./errors.js";
import { computeSeal, type Manifest } from "./format/manifest.js";
import { readKeyFile } from "./keys.js";

export const PUBKEY_PREFIX = "memsnap-ed25519:";

export interface ManifestSignature {
  alg: "ed25519";
  /** `ed25519:` + first 16 hex of SHA-256 over the raw 32-byte public key. */
  key_id: string;
  /** The signer's public key, `memsnap-ed25519:<base64 raw 32 bytes>`. */
  public_key: string;
  /** base64 Ed25519 signature over the UTF-8 bytes of the seal string. */
  sig: string;
}

function rawPublic(key: KeyObject): Buffer {
  const jwk = key.export({ format: "jwk" }) as { x?: string };
  if (!jwk.x) throw new MemsnapError("MEMSNAP_IDENTITY_INVALID", "not an Ed25519 key");
  return Buffer.from(jwk.x, "base64url");
}

/** The text form of a public key. */
export function publicKeyString(key: KeyObject): string {
  return PUBKEY_PREFIX + rawPublic(key).toString("base64");
}

export function keyId(publicKey: string): string {
  const raw = Buffer.from(publicKey.slice(PUBKEY_PREFIX.length), "base64");
  return `ed25519:${createHash("sha256").update(raw).digest("hex").slice(0, 16)}`;
}

/** Parse `memsnap-ed25519:<base64>` into a key object. Throws MEMSNAP_IDENTITY_INVALID. */
export function parsePublicKey(text: string): KeyObject {
  const t = text.trim();
  const raw = t.startsWith(PUBKEY_PREFIX) ? Buffer.from(t.slice(PUBKEY_PREFIX.length), "base64") : null;
  if (!raw || raw.length !== 32) {
    throw new MemsnapError("MEMSNAP_IDENTITY_INVALID", `not a memsnap public key: ${t.slice(0, 40)}`, {
      hint: "public keys look like memsnap-ed25519:<base64>; `memsnap keygen --sign` prints one",
    });
  }
  return createPublicKey({ key: { kty: "OKP", crv: "Ed25519", x: raw.toString("base64url") }, format: "jwk" });
}

/** A new signing key pair: PKCS#8 PEM private key text and the public key string. */
export function generateSigningKey(): { privatePem: string; publicKey: string } {
  const { privateKey, publicKey } = generateKeyPairSync("ed25519");
  return {
    privatePem: privateKey.export({ type: "pkcs8", format: "pem" }) as string,
    publicKey: publicKeyString(publicKey),
  };
}

/** Load a signing key file (PKCS#8 PEM). Throws MEMSNAP_IDENTITY_INVALID. */
export async function loadSigningKey(path: string): Promise<KeyObject> {
  const text = await readKeyFile(path, "signing key", true);
  try {
    const key = createPrivateKey(text);
    if (key.asymmetricKeyType !== "ed25519") throw new Error(`a ${key.asymmetricKeyType} key, not ed25519`);
    return key;
  } catch (e) {
    // The keys users mix up, said in their terms rather than OpenSSL's ("DECODER routines::unsupported").
    const why = text.trimStart().startsWith(PUBKEY_PREFIX)
      ? "it holds a public key (the .pub file); signing needs the private key beside it"
      : /AGE-SECRET-KEY-1/.test(text)
        ? "it is an age identity (for encryption), not a signing key"
        : /^error:|DECODER|unsupported|PEM/i.test((e as Error).message)
          ? "not an Ed25519 private key in PEM"
          : (e as Error).message;
    throw new MemsnapError("MEMSNAP_IDENTITY_INVALID", `cannot use signing key ${path}: ${why}`, {
      path,
      cause: e,
      hint: "pass the file `memsnap keygen --sign -o FILE` wrote (FILE, not FILE.pub), or make one that way",
    });
  }
}

/** Load trusted public keys given inline or as files holding one key per line. */
export async function loadTrusted(items: readonly string[]): Promise<KeyObject[]> {
  const out: KeyObject[] = [];
  for (const it of items) {
    if (it.startsWith(PUBKEY_PREFIX)) {
      out.push(parsePublicKey(it));
      continue;
    }
    let text: string;
    try {
      text = await readFile(it, "utf8");
    } catch (e) {
      throw new MemsnapError("MEMSNAP_IDENTITY_INVALID", `cannot read trusted key ${it}: ${(e as Error).message}`, {
        path: it,
      });
    }
    for (const line of text
      .split(/\r?\n/)
      .map((l) => l.trim())
      .filter((l) => l && !l.startsWith("#")))
      out.push(parsePublicKey(line));
  }
  return out;
}

/** The signature block for a sealed manifest. */
export function signManifest(m: Omit<Manifest, "signature">, key: KeyObject): ManifestSignature {
  const pub = publicKeyString(createPublicKey(key));
  return {
    alg: "ed25519",
    key_id: keyId(pub),
    public_key: pub,
    sig: sign(null, Buffer.from(computeSeal(m), "utf8"), key).toString("base64"),
  };
}

export type SignatureStatus =
  | { state: "unsigned" }
  | { state: "invalid"; reason: string; key_id?: string }
  | { state: "valid"; key_id: string; trusted: boolean };

/** Check a manifest's signature against its recomputed seal, and whether its key is trusted. */
export function checkSignature(m: Manifest, trusted: readonly KeyObject[]): SignatureStatus {
  const s = m.signature as Partial<ManifestSignature> | undefined;
  if (!s) return { state: "unsigned" };
  if (s.alg !== "ed25519" || typeof s.public_key !== "string" || typeof s.sig !== "string")
    return { state: "invalid", reason: "malformed signature block" };
  let pub: KeyObject;
  try {
    pub = parsePublicKey(s.public_key);
  } catch {
    return { state: "invalid", reason: "malformed public key" };
  }
  const id = keyId(s.public_key);
  if (s.key_id !== id) return { state: "invalid", reason: "key_id does not match the public key", key_id: id };
  const ok = verify(null, Buffer.from(computeSeal(m), "utf8"), pub, Buffer.from(s.sig, "base64"));
  if (!ok) return { state: "invalid", reason: "the signature does not match the manifest", key_id: id };
  const raw = rawPublic(pub);
  return { state: "valid", key_id: id, trusted: trusted.some((t) => rawPublic(t).equals(raw)) };
}
