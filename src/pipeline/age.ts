/**
 * Standard age (https://age-encryption.org/v1) encryption and decryption as Node streams.
 *
 * Everything is node:crypto: the header (X25519 and scrypt recipient stanzas, the header MAC,
 * unwrapping the file key) and the payload STREAM with `chacha20-poly1305`, an order of
 * magnitude faster than the pure-JS streaming of the `age-encryption` package (typage), which
 * is loaded only to generate keys. The output is a plain age v1 file that the `age` CLI reads
 * and writes.
 *
 * Payload layout (age v1 spec): 16-byte random nonce, then chunks of 64 KiB plaintext,
 * each sealed with ChaCha20-Poly1305 under key HKDF-SHA256(fileKey, nonce, "payload")
 * and nonce = 11-byte big-endian chunk counter || last-flag byte (1 on the final chunk).
 * Only the final chunk may be shorter than 64 KiB; it is empty only for an empty file.
 */

import {
  createCipheriv, createDecipheriv, createHash, createHmac, createPrivateKey, createPublicKey, diffieHellman, generateKeyPairSync,
  hkdfSync, randomBytes, scrypt as scryptCb, timingSafeEqual, type KeyObject,
} from "node:crypto";
import { Transform, type TransformCallback } from "node:stream";

/**
 * typage, loaded on first use: only key generation needs it. Headers are written and opened
 * with node:crypto below: the module graph typage brings (post-quantum KEMs among it) took
 * ~100 ms to load, and 70-100 ms even bundled, on every restore and keyed verify.
 */
let typageP: Promise<typeof import("age-encryption")> | undefined;
const typage = (): Promise<typeof import("age-encryption")> => (typageP ??= import("age-encryption"));
import { MemsnapError } from "../errors.js";

/** The first bytes of every (binary, unarmored) age v1 file. */
export const AGE_MAGIC: Buffer = Buffer.from("age-encryption.org/v1\n", "latin1");

const CHUNK = 64 * 1024;
const TAG = 16;
const SEALED_CHUNK = CHUNK + TAG;
const NONCE_LEN = 16;
/** Largest header we buffer before giving up. */
const HEADER_MAX = 64 * 1024;
const DEFAULT_SCRYPT_LOG_N = 18;
/** Highest scrypt work factor we write or accept at all (the same cap as typage). */
const MAX_SCRYPT_LOG_N = 20;
/**
 * Highest scrypt work factor opened unless the caller raises it: 2^18 (N·r·128 = 256 MiB of
 * memory, about half a second), what memsnap and the age CLI write. A header is read before
 * anything authenticates it, so its work factor is the bundle's to choose: 2^20 cost 4.9 s and
 * 1 GiB before the MAC failed.
 */
export const DEFAULT_SCRYPT_MAX_LOG_N = 18;
/** The environment variable that raises {@link DEFAULT_SCRYPT_MAX_LOG_N} (up to 2^20). */
export const SCRYPT_MAX_LOG_N_ENV = "MEMSNAP_SCRYPT_MAX_LOG_N";

/**
 * The scrypt work factor (log2 N) a decryption accepts: `given` when set, else
 * $MEMSNAP_SCRYPT_MAX_LOG_N, else 2^18 (a string is parsed as decimal digits). Throws
 * MEMSNAP_USAGE for a value that is not an integer 1..20.
 */
export function scryptMaxLogN(given?: number | string, env: NodeJS.ProcessEnv = process.env): number {
  const num = (v: string): number => (/^[0-9]{1,3}$/.test(v.trim()) ? Number(v.trim()) : NaN);
  const raw = typeof given === "string" ? num(given) : given ?? (env[SCRYPT_MAX_LOG_N_ENV] ? num(env[SCRYPT_MAX_LOG_N_ENV]!) : DEFAULT_SCRYPT_MAX_LOG_N);
  if (!Number.isInteger(raw) || raw < 1 || raw > MAX_SCRYPT_LOG_N) {
    const what = given !== undefined ? "--scrypt-max-log-n" : SCRYPT_MAX_LOG_N_ENV;
    throw new MemsnapError("MEMSNAP_USAGE", `${what} must be an integer from 1 to ${MAX_SCRYPT_LOG_N}, got ${given ?? env[SCRYPT_MAX_LOG_N_ENV]}`, {
      hint: `the work factor is a power of two: ${DEFAULT_SCRYPT_MAX_LOG_N} (the default) opens 2^${DEFAULT_SCRYPT_MAX_LOG_N}, 20 opens 2^20 (1 GiB of memory)`,
    });
  }
  return raw;
}

/** What scrypt at work factor 2^logN (r = 8) needs in memory, for messages. */
function scryptMemory(logN: number): string {
  const mib = (128 * 8 * 2 ** logN) / (1024 * 1024);
  return mib >= 1024 ? `${mib / 1024} GiB` : `${mib} MiB`;
}
const SCRYPT_LABEL = "age-encryption.org/v1/scrypt";
const ARMOR_BEGIN = "-----BEGIN AGE ENCRYPTED FILE-----";

const DAMAGED_HINT =
  "check that the identity file (or passphrase) is the one the bundle was encrypted to; if it is, the bundle may be damaged";
const RECIPIENT_HINT =
  "a recipient is an X25519 public key starting with age1 (62 characters), as printed by `age-keygen` or `memsnap keygen`; one per line in a recipients file";
const IDENTITY_HINT =
  "an identity file holds lines starting with AGE-SECRET-KEY-1 (as written by `age-keygen -o key.txt`); lines starting with # are comments";

// ---------------------------------------------------------------------------------------
// bech32 (BIP 173), just enough to validate and encode age X25519 keys.

const BECH32_CHARSET = "qpzry9x8gf2tvdw0s3jn54khce6mua7l";
const BECH32_GEN = [0x3b6a57b2, 0x26508e6d, 0x1ea119fa, 0x3d4233dd, 0x2a1462b3] as const;

function bech32Polymod(values: readonly number[]): number {
  let chk = 1;
  for (const v of values) {
    const b = chk >>> 25;
    chk = (((chk & 0x1ffffff) << 5) ^ v) >>> 0;
    for (let i = 0; i < 5; i++) {
      if ((b >>> i) & 1) chk = (chk ^ BECH32_GEN[i]!) >>> 0;
    }
  }
  return chk;
}

function bech32HrpExpand(hrp: string): number[] {
  const out: number[] = [];
  for (let i = 0; i < hrp.length; i++) out.push(hrp.charCodeAt(i) >> 5);
  out.push(0);
  for (let i = 0; i < hrp.length; i++) out.push(hrp.charCodeAt(i) & 31);
  return out;
}

function convertBits(data: readonly number[] | Uint8Array, from: number, to: number, pad: boolean): number[] | null {
  let acc = 0;
  let bits = 0;
  const out: number[] = [];
  const maxv = (1 << to) - 1;
  for (const value of data) {
    if (value < 0 || value >> from !== 0) return null;
    acc = (acc << from) | value;
    bits += from;
    while (bits >= to) {
      bits -= to;
      out.push((acc >> bits) & maxv);
    }
    acc &= (1 << bits) - 1;
  }
  if (pad) {
    if (bits > 0) out.push((acc << (to - bits)) & maxv);
  } else if (bits >= from || ((acc << (to - bits)) & maxv) !== 0) {
    return null;
  }
  return out;
}

/** Decode a bech32 string; null when it is not valid bech32 (case, charset, checksum). */
function bech32Decode(s: string): { hrp: string; bytes: Uint8Array } | null {
  if (s !== s.toLowerCase() && s !== s.toUpperCase()) return null;
  const lower = s.toLowerCase();
  const sep = lower.lastIndexOf("1");
  if (sep < 1 || sep + 7 > lower.length) return null;
  const hrp = lower.slice(0, sep);
  for (let i = 0; i < hrp.length; i++) {
    const c = hrp.charCodeAt(i);
    if (c < 33 || c > 126) return null;
  }
  const words: number[] = [];
  for (const ch of lower.slice(sep + 1)) {
    const w = BECH32_CHARSET.indexOf(ch);
    if (w < 0) return null;
    words.push(w);
  }
  if (bech32Polymod([...bech32HrpExpand(hrp), ...words]) !== 1) return null;
  const bytes = convertBits(words.slice(0, -6), 5, 8, false);
  if (bytes === null) return null;
  return { hrp, bytes: Uint8Array.from(bytes) };
}

function bech32Encode(hrp: string, bytes: Uint8Array): string {
  const words = convertBits(bytes, 8, 5, true) ?? [];
  const mod = bech32Polymod([...bech32HrpExpand(hrp), ...words, 0, 0, 0, 0, 0, 0]) ^ 1;
  let out = hrp + "1";
  for (const w of words) out += BECH32_CHARSET[w];
  for (let i = 0; i < 6; i++) out += BECH32_CHARSET[(mod >>> (5 * (5 - i))) & 31];
  return out;
}

/** The 32 public-key bytes of an `age1…` X25519 recipient, or null when it is not one. */
function decodeRecipient(s: string): Uint8Array | null {
  if (!/^age1[qpzry9x8gf2tvdw0s3jn54khce6mua7l]{58}$/.test(s)) return null;
  const d = bech32Decode(s);
  if (d === null || d.hrp !== "age" || d.bytes.length !== 32) return null;
  return d.bytes;
}

/** The 32 scalar bytes of an `AGE-SECRET-KEY-1…` X25519 identity, or null when it is not one. */
function decodeIdentity(s: string): Uint8Array | null {
  if (!/^AGE-SECRET-KEY-1[QPZRY9X8GF2TVDW0S3JN54KHCE6MUA7L]{58}$/.test(s)) return null;
  const d = bech32Decode(s);
  if (d === null || d.hrp !== "age-secret-key-" || d.bytes.length !== 32) return null;
  return d.bytes;
}

/**
 * The `age1…` recipients of X25519 identities (`AGE-SECRET-KEY-1…`), in order, without
 * duplicates. Throws MEMSNAP_IDENTITY_INVALID for a line that is not one.
 */
export function recipientsOfIdentities(identities: readonly string[]): string[] {
  const out: string[] = [];
  for (const id of identities) {
    const scalar = decodeIdentity(id);
    if (scalar === null) throw new MemsnapError("MEMSNAP_IDENTITY_INVALID", "a given identity is not an X25519 age identity (AGE-SECRET-KEY-1…)", { hint: IDENTITY_HINT });
    const r = recipientOfScalar(scalar);
    if (!out.includes(r)) out.push(r);
  }
  return out;
}

/** PKCS#8 DER prefix of a raw X25519 private key (RFC 8410). */
const X25519_PKCS8_PREFIX = Buffer.from("302e020100300506032b656e04220420", "hex");

/** The `age1…` recipient of a decoded X25519 scalar, computed synchronously with node:crypto. */
function recipientOfScalar(scalar: Uint8Array): string {
  const key = createPrivateKey({ key: Buffer.concat([X25519_PKCS8_PREFIX, scalar]), format: "der", type: "pkcs8" });
  const jwk = createPublicKey(key).export({ format: "jwk" });
  if (typeof jwk.x !== "string") throw new MemsnapError("MEMSNAP_INTERNAL", "could not derive an X25519 public key");
  return bech32Encode("age", Buffer.from(jwk.x, "base64url"));
}

// ---------------------------------------------------------------------------------------
// Keys and key files.

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
    throw new MemsnapError("MEMSNAP_IDENTITY_INVALID", "not an X25519 age identity (AGE-SECRET-KEY-1…)", { hint: IDENTITY_HINT });
  }
  if (decodeRecipient(recipient) === null || recipientOfScalar(scalar) !== recipient) {
    throw new MemsnapError("MEMSNAP_IDENTITY_INVALID", `recipient ${recipient} is not the public key of the given identity`, {
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

/** A recipient shortened for messages (never a secret). */
function shorten(s: string): string {
  return s.length > 24 ? `${s.slice(0, 20)}…` : s;
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
      else if (line.startsWith("age1") && line.length !== 62) what = `line ${n} is not an X25519 age recipient (post-quantum, tag and plugin recipients are not supported): ${shorten(line)}`;
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
      else if (line.startsWith("AGE-SECRET-KEY-PQ-") || line.startsWith("AGE-PLUGIN-")) what = `line ${n} is a post-quantum or plugin identity; memsnap supports only X25519 identities`;
      else if (line.startsWith("-----BEGIN")) what = `line ${n} looks like a PEM/SSH key; memsnap supports only age X25519 identities`;
      throw new MemsnapError("MEMSNAP_IDENTITY_INVALID", what, { hint: IDENTITY_HINT });
    }
    if (!out.includes(line)) out.push(line);
  }
  if (out.length === 0) {
    throw new MemsnapError("MEMSNAP_IDENTITY_INVALID", "the identity file holds no AGE-SECRET-KEY-1 line", { hint: IDENTITY_HINT });
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

// ---------------------------------------------------------------------------------------
// scrypt recipient / identity on node:crypto (async: runs on the libuv thread pool).

function scryptKey(passphrase: string, salt: Uint8Array, logN: number): Promise<Buffer> {
  const N = 2 ** logN;
  const r = 8;
  return new Promise((resolve, reject) => {
    scryptCb(
      Buffer.from(passphrase, "utf8"),
      Buffer.concat([Buffer.from(SCRYPT_LABEL, "latin1"), salt]),
      32,
      { N, r, p: 1, maxmem: 128 * r * N + 64 * 1024 * 1024 },
      (err, key) => (err ? reject(err) : resolve(key)),
    );
  });
}

const ZERO_NONCE = Buffer.alloc(12);

function sealFileKey(key: Buffer, fileKey: Uint8Array): Buffer {
  const c = createCipheriv("chacha20-poly1305", key, ZERO_NONCE, { authTagLength: TAG });
  return Buffer.concat([c.update(fileKey), c.final(), c.getAuthTag()]);
}

function openFileKey(key: Buffer, body: Uint8Array): Uint8Array | null {
  if (body.length !== 16 + TAG) return null;
  try {
    const d = createDecipheriv("chacha20-poly1305", key, ZERO_NONCE, { authTagLength: TAG });
    d.setAuthTag(body.subarray(16));
    return new Uint8Array(Buffer.concat([d.update(body.subarray(0, 16)), d.final()]));
  } catch {
    return null;
  }
}

const base64NoPad = (b: Uint8Array): string => Buffer.from(b).toString("base64").replace(/=+$/, "");

/** One recipient stanza of an age header: `-> <args…>` and its body. */
interface StanzaOut {
  args: string[];
  body: Buffer;
}

/** age scrypt recipient: `-> scrypt <salt> <logN>`, body = sealed file key. */
async function scryptStanza(passphrase: string, logN: number, fileKey: Uint8Array): Promise<StanzaOut> {
  const salt = randomBytes(16);
  const key = await scryptKey(passphrase, salt, logN);
  return { args: ["scrypt", base64NoPad(salt), String(logN)], body: sealFileKey(key, fileKey) };
}

/**
 * age X25519 recipient (age spec, "X25519 recipient stanza"): an ephemeral key pair, the
 * shared secret with the recipient, wrap key = HKDF-SHA-256(shared, salt = ephemeral share ‖
 * recipient, "age-encryption.org/v1/X25519"), body = the file key sealed under it.
 */
function x25519Stanza(recipient: Uint8Array, fileKey: Uint8Array): StanzaOut {
  const { publicKey, privateKey } = generateKeyPairSync("x25519");
  const share = Buffer.from(publicKey.export({ format: "jwk" }).x!, "base64url");
  const their = createPublicKey({ key: { kty: "OKP", crv: "X25519", x: Buffer.from(recipient).toString("base64url") }, format: "jwk" });
  const shared = diffieHellman({ privateKey, publicKey: their });
  if (shared.every((b) => b === 0)) throw new MemsnapError("MEMSNAP_IDENTITY_INVALID", "the recipient is a low-order point", { hint: RECIPIENT_HINT });
  const wrap = Buffer.from(hkdfSync("sha256", shared, Buffer.concat([share, recipient]), "age-encryption.org/v1/X25519", 32));
  return { args: ["X25519", base64NoPad(share)], body: sealFileKey(wrap, fileKey) };
}

/**
 * The age v1 header for `stanzas`: the version line, each stanza (its body in base64 lines of
 * 64 columns, the last one shorter), then `---` and the header MAC, HMAC-SHA-256 under
 * HKDF-SHA-256(file key, "", "header") over everything up to and including `---`.
 */
function ageHeader(fileKey: Uint8Array, stanzas: StanzaOut[]): Buffer {
  let h = "age-encryption.org/v1\n";
  for (const st of stanzas) {
    h += `-> ${st.args.join(" ")}\n`;
    const b64 = base64NoPad(st.body);
    for (let i = 0; i < b64.length; i += 64) h += `${b64.slice(i, i + 64)}\n`;
    if (b64.length % 64 === 0) h += "\n";
  }
  h += "---";
  const macKey = Buffer.from(hkdfSync("sha256", fileKey, Buffer.alloc(0), "header", 32));
  const mac = createHmac("sha256", macKey).update(h, "latin1").digest();
  return Buffer.from(`${h} ${base64NoPad(mac)}\n`, "latin1");
}

/** One stanza of a parsed age header. */
interface StanzaIn {
  args: string[];
  body: Buffer;
}

/** Thrown for a header that does not follow the age v1 grammar (the message says where). */
class HeaderMalformed extends Error {}

const B64_LINE = 64;
/** Canonical unpadded standard base64 of `s`, or null (age rejects padding and non-canonical trailing bits). */
function b64Strict(s: string): Buffer | null {
  if (!/^[A-Za-z0-9+/]*$/.test(s) || s.length % 4 === 1) return null;
  const b = Buffer.from(s, "base64");
  return base64NoPad(b) === s ? b : null;
}

/**
 * Parse an age v1 header (the bytes up to and including the MAC line's newline): the stanzas,
 * the bytes the MAC covers (through `---`) and the MAC. Strict like age and typage: arguments
 * are 1+ visible ASCII characters, bodies are canonical unpadded base64 in 64-column lines
 * ending with a shorter one (possibly empty).
 */
function parseHeader(header: Buffer): { stanzas: StanzaIn[]; macInput: Buffer; mac: Buffer } {
  const text = header.toString("latin1");
  const lines = text.split("\n");
  if (lines.pop() !== "") throw new HeaderMalformed("the header does not end with a newline");
  if (lines[0] !== "age-encryption.org/v1") throw new HeaderMalformed("unknown version line");
  const stanzas: StanzaIn[] = [];
  let i = 1;
  for (;;) {
    const line = lines[i];
    if (line === undefined) throw new HeaderMalformed("the header has no MAC line");
    if (line.startsWith("--- ")) break;
    if (!line.startsWith("-> ")) throw new HeaderMalformed(`unexpected line ${i + 1}`);
    const args = line.slice(3).split(" ");
    if (args.some((a) => !/^[\x21-\x7e]+$/.test(a))) throw new HeaderMalformed(`invalid stanza arguments on line ${i + 1}`);
    i++;
    let b64 = "";
    for (;;) {
      const l = lines[i];
      if (l === undefined) throw new HeaderMalformed("a stanza body is not terminated");
      if (l.length > B64_LINE) throw new HeaderMalformed(`stanza body line ${i + 1} is longer than 64 columns`);
      b64 += l;
      i++;
      if (l.length < B64_LINE) break;
    }
    const body = b64Strict(b64);
    if (body === null) throw new HeaderMalformed("a stanza body is not canonical base64");
    stanzas.push({ args, body });
  }
  if (i !== lines.length - 1) throw new HeaderMalformed("bytes follow the MAC line");
  const macB64 = lines[i]!.slice(4);
  const mac = macB64.length === 43 ? b64Strict(macB64) : null;
  if (mac === null || mac.length !== 32) throw new HeaderMalformed("the header MAC is not 32 bytes of base64");
  if (stanzas.length === 0) throw new HeaderMalformed("the header has no recipient stanza");
  const macLen = text.length - lines[i]!.length - 1 + 3; // through "---"
  return { stanzas, macInput: header.subarray(0, macLen), mac };
}

/** An X25519 identity ready to unwrap stanzas: its private key and its recipient's public bytes. */
function x25519Identity(id: string): { key: KeyObject; recipient: Buffer } {
  const scalar = decodeIdentity(id);
  if (scalar === null) throw new MemsnapError("MEMSNAP_IDENTITY_INVALID", "a given identity is not an X25519 age identity (AGE-SECRET-KEY-1…)", { hint: IDENTITY_HINT });
  const key = createPrivateKey({ key: Buffer.concat([X25519_PKCS8_PREFIX, scalar]), format: "der", type: "pkcs8" });
  const x = createPublicKey(key).export({ format: "jwk" }).x;
  if (typeof x !== "string") throw new MemsnapError("MEMSNAP_INTERNAL", "could not derive an X25519 public key");
  return { key, recipient: Buffer.from(x, "base64url") };
}

/** The file key from an X25519 stanza for `id`, or null when the stanza is not for it. */
function unwrapX25519(st: StanzaIn, id: { key: KeyObject; recipient: Buffer }): Uint8Array | null {
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
  const wrap = Buffer.from(hkdfSync("sha256", shared, Buffer.concat([share, id.recipient]), "age-encryption.org/v1/X25519", 32));
  return openFileKey(wrap, st.body);
}

/**
 * The file key from the (only) scrypt stanza for `passphrase`, or null when it does not open
 * it. A work factor over `maxLogN` is MEMSNAP_UNSAFE_BUNDLE before any scrypt work is done.
 */
async function unwrapScrypt(st: StanzaIn, passphrase: string, maxLogN: number): Promise<Uint8Array | null> {
  const [, saltB64, logNStr] = st.args;
  if (st.args.length !== 3 || saltB64 === undefined || logNStr === undefined || !/^[1-9][0-9]*$/.test(logNStr)) throw new HeaderMalformed("invalid scrypt stanza");
  const salt = b64Strict(saltB64);
  if (salt === null || salt.length !== 16) throw new HeaderMalformed("invalid scrypt stanza");
  if (st.body.length !== 16 + TAG) throw new HeaderMalformed("invalid scrypt stanza body");
  const logN = Number(logNStr);
  if (logN > maxLogN) {
    const big = logN > 64 ? `${logNStr.length > 12 ? `${logNStr.slice(0, 12)}…` : logNStr}` : String(logN);
    throw new MemsnapError("MEMSNAP_UNSAFE_BUNDLE",
      `the bundle's passphrase stanza asks for an scrypt work factor of 2^${big}${logN <= 64 ? ` (${scryptMemory(logN)} of memory)` : ""}, over the limit of 2^${maxLogN} (${scryptMemory(maxLogN)}); nothing was decrypted`, {
        hint: logN > MAX_SCRYPT_LOG_N
          ? `memsnap opens work factors up to 2^${MAX_SCRYPT_LOG_N} at most; memsnap and age write 2^${DEFAULT_SCRYPT_LOG_N}: this bundle was not written by either, or was altered`
          : `memsnap and age write 2^${DEFAULT_SCRYPT_LOG_N}; if you trust this bundle, raise the limit with --scrypt-max-log-n ${logN} (or ${SCRYPT_MAX_LOG_N_ENV}=${logN})`,
      });
  }
  return openFileKey(await scryptKey(passphrase, salt, logN), st.body);
}

/**
 * Open an age v1 header with node:crypto (age spec: X25519 and scrypt recipient stanzas,
 * then the header MAC): the file key, or a HeaderMalformed, "no identity matched" or "HMAC"
 * error. Stanzas of other types are skipped, as age does. An scrypt stanza must be the only
 * one. This replaces typage's Decrypter, whose module graph took ~70-100 ms to load on every
 * restore and keyed verify; interoperability with the real `age` binary is tested both ways.
 */
export async function openAgeHeader(header: Buffer, identities: string[], passphrases: string[], maxLogN: number = scryptMaxLogN()): Promise<Uint8Array> {
  const { stanzas, macInput, mac } = parseHeader(header);
  const hasScrypt = stanzas.some((st) => st.args[0] === "scrypt");
  if (hasScrypt && stanzas.length !== 1) throw new HeaderMalformed("an scrypt stanza must be the only one in the header");
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
  const want = createHmac("sha256", Buffer.from(hkdfSync("sha256", fileKey, Buffer.alloc(0), "header", 32))).update(macInput).digest();
  if (!timingSafeEqual(want, mac)) throw new Error("invalid header HMAC");
  return fileKey;
}

// ---------------------------------------------------------------------------------------
// STREAM helpers.

function payloadKey(fileKey: Uint8Array, nonce: Uint8Array): Buffer {
  return Buffer.from(hkdfSync("sha256", fileKey, nonce, "payload", 32));
}

function chunkNonce(counter: number, last: boolean): Buffer {
  const n = Buffer.alloc(12);
  // 11-byte big-endian counter; 2^48 chunks (16 EiB) is far beyond any bundle.
  n.writeUIntBE(counter, 5, 6);
  n[11] = last ? 1 : 0;
  return n;
}

function errMessage(e: unknown): string {
  return e instanceof Error ? e.message : String(e);
}

function decryptFailed(message: string, cause?: unknown): MemsnapError {
  return new MemsnapError("MEMSNAP_DECRYPT_FAILED", message, { hint: DAMAGED_HINT, ...(cause === undefined ? {} : { cause }) });
}

function asError(e: unknown): Error {
  if (e instanceof MemsnapError) return e;
  return new MemsnapError("MEMSNAP_INTERNAL", `age stream failed: ${errMessage(e)}`, { cause: e });
}

// ---------------------------------------------------------------------------------------
// Encryption.

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
    throw new MemsnapError("MEMSNAP_USAGE", hasRecipients
      ? "encrypt to recipients or to a passphrase, not both"
      : "encryption needs at least one recipient or a passphrase", {
      hint: "pass --recipient/--recipients-file, or --passphrase, but not both",
    });
  }
  if (hasPassphrase && opts.passphrase === "") {
    throw new MemsnapError("MEMSNAP_USAGE", "the passphrase is empty", { hint: "use a long random passphrase" });
  }
  const logN = opts.scryptLogN ?? DEFAULT_SCRYPT_LOG_N;
  if (!Number.isInteger(logN) || logN < 1 || logN > MAX_SCRYPT_LOG_N) {
    throw new MemsnapError("MEMSNAP_USAGE", `scrypt work factor must be an integer 1..${MAX_SCRYPT_LOG_N}, got ${logN}`);
  }

  const fileKey = randomBytes(16);
  const stanzas: StanzaOut[] = [];
  if (hasRecipients) {
    for (const r of opts.recipients ?? []) {
      const pub = decodeRecipient(r);
      if (pub === null) {
        throw new MemsnapError("MEMSNAP_IDENTITY_INVALID", `not an age X25519 recipient: ${shorten(r)}`, { hint: RECIPIENT_HINT });
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

// ---------------------------------------------------------------------------------------
// Decryption.

type Phase = "header" | "nonce" | "payload" | "done";

class AgeDecryptStream extends Transform {
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
    throw new MemsnapError("MEMSNAP_PAYLOAD_MISLABELED", "the payload is not age-encrypted (it does not start with the age v1 header)", {
      hint: "the bundle may be unencrypted or mislabeled; try it without an identity, or run `memsnap verify`",
    });
  }

  private configError(): MemsnapError | null {
    if (this.identities.length === 0 && this.passphrases.length === 0) {
      return new MemsnapError("MEMSNAP_IDENTITY_REQUIRED", "the bundle is age-encrypted and no identity or passphrase was given", {
        hint: "pass --identity <key file> (or the passphrase the bundle was made with)",
      });
    }
    for (const id of this.identities) {
      if (decodeIdentity(id) === null) {
        return new MemsnapError("MEMSNAP_IDENTITY_INVALID", "a given identity is not an X25519 age identity (AGE-SECRET-KEY-1…)", {
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
        throw decryptFailed(`the age header is longer than ${HEADER_MAX} bytes or has no MAC line; the bundle is damaged`);
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
      throw decryptFailed(`the age header is longer than ${HEADER_MAX} bytes or has no MAC line; the bundle is damaged`);
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
        const kinds = [...this.headerBuf.subarray(0, this.headerLen).toString("latin1").matchAll(/^-> (\S+)/gm)].map((m) => m[1]);
        let extra = "";
        if (kinds.includes("scrypt") && this.passphrases.length === 0) extra = " (the bundle is encrypted to a passphrase, and none was given)";
        else if (!kinds.includes("scrypt") && this.identities.length === 0) extra = " (the bundle is encrypted to recipients, and only passphrases were given)";
        throw decryptFailed(`no given identity or passphrase opens the bundle${extra}`, e);
      }
      if (/HMAC/i.test(msg)) throw decryptFailed("the age header MAC does not verify: the header is damaged or was altered", e);
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
      throw decryptFailed(`the age payload is truncated: it ends after chunk ${this.counter}, which is not marked final`);
    }
    throw decryptFailed(`age payload chunk ${this.counter} does not authenticate${last ? " (the file is truncated or damaged)" : ""}`);
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
      throw decryptFailed(this.headerLen === 0 ? "the age payload is empty" : "the age file is truncated inside its header");
    }
    if (this.phase === "nonce") throw decryptFailed("the age file is truncated: it ends before the payload nonce");
    if (this.phase === "done") return;
    if (this.used < TAG) {
      throw decryptFailed(this.used === 0 && this.counter === 0
        ? "the age file is truncated: it has no payload after the nonce"
        : "the age file is truncated inside a chunk");
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
export async function openAgePrefix(prefix: Buffer, whole: boolean, opts: AgeDecryptOptions): Promise<{ key: Buffer; offset: number }> {
  return new AgeDecryptStream([...(opts.identities ?? [])], [...(opts.passphrases ?? [])], scryptMaxLogN(opts.scryptMaxLogN)).openPrefix(prefix, whole);
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
  return new AgeDecryptStream([...(opts.identities ?? [])], [...(opts.passphrases ?? [])], scryptMaxLogN(opts.scryptMaxLogN));
}

// ---------------------------------------------------------------------------------------
// Rekeying: a new header around the same file key (the payload STREAM stays as it is).

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
  const s = new AgeDecryptStream([...(opts.identities ?? [])], [...(opts.passphrases ?? [])], scryptMaxLogN(opts.scryptMaxLogN));
  // The stream's own header reader (magic, MAC-line search, the same errors), then its opener.
  const bytes = prefix.subarray(0, Math.min(prefix.length, HEADER_MAX));
  const at = bytes.indexOf("\n--- ", 0, "latin1");
  const nl = at >= 0 ? bytes.indexOf(0x0a, at + 5) : -1;
  if (bytes.subarray(0, AGE_MAGIC.length).compare(AGE_MAGIC) !== 0 || nl < 0) {
    await s.openPrefix(prefix, true); // throws the precise error (mislabeled, truncated, too long)
    throw decryptFailed("the age header has no MAC line; the bundle is damaged");
  }
  const header = prefix.subarray(0, nl + 1);
  if (prefix.length < header.length + NONCE_LEN) throw decryptFailed("the age file is truncated: it ends before the payload nonce");
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
  const want = createHmac("sha256", Buffer.from(hkdfSync("sha256", fileKey, Buffer.alloc(0), "header", 32))).update(macInput).digest();
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
export async function writeAgeHeader(fileKey: Uint8Array, opts: { keep?: readonly AgeStanza[]; recipients?: readonly string[]; passphrase?: string; scryptLogN?: number }): Promise<Buffer> {
  const stanzas: StanzaOut[] = (opts.keep ?? []).map((st) => ({ args: [...st.args], body: Buffer.from(st.body) }));
  for (const r of opts.recipients ?? []) {
    const pub = decodeRecipient(r);
    if (pub === null) throw new MemsnapError("MEMSNAP_IDENTITY_INVALID", `not an age X25519 recipient: ${shorten(r)}`, { hint: RECIPIENT_HINT });
    stanzas.push(x25519Stanza(pub, fileKey));
  }
  if (opts.passphrase !== undefined) {
    if (opts.passphrase === "") throw new MemsnapError("MEMSNAP_USAGE", "the passphrase is empty", { hint: "use a long random passphrase" });
    if (stanzas.length) throw new MemsnapError("MEMSNAP_USAGE", "a passphrase must be the only recipient of an age file", { hint: "encrypt to recipients or to a passphrase, not both" });
    const logN = opts.scryptLogN ?? DEFAULT_SCRYPT_LOG_N;
    if (!Number.isInteger(logN) || logN < 1 || logN > MAX_SCRYPT_LOG_N) throw new MemsnapError("MEMSNAP_USAGE", `scrypt work factor must be an integer 1..${MAX_SCRYPT_LOG_N}, got ${logN}`);
    stanzas.push(await scryptStanza(opts.passphrase, logN, fileKey));
  }
  if (stanzas.some((st) => st.args[0] === "scrypt") && stanzas.length > 1) {
    throw new MemsnapError("MEMSNAP_USAGE", "a passphrase must be the only recipient of an age file", { hint: "replace the passphrase, or encrypt to recipients instead" });
  }
  if (stanzas.length === 0) throw new MemsnapError("MEMSNAP_USAGE", "the age file would have no recipient", { hint: "keep at least one recipient, or give a new one with -r" });
  return ageHeader(fileKey, stanzas);
}
