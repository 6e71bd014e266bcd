// The age v1 header: its stanzas, sealing a file key into a stanza body, writing the header with
// its MAC, and parsing one strictly.

import { createCipheriv, createDecipheriv, createHmac, hkdfSync } from "node:crypto";
import { b64Strict, base64NoPad, TAG } from "./common.js";

const ZERO_NONCE = Buffer.alloc(12);

export function sealFileKey(key: Buffer, fileKey: Uint8Array): Buffer {
  const c = createCipheriv("chacha20-poly1305", key, ZERO_NONCE, { authTagLength: TAG });
  return Buffer.concat([c.update(fileKey), c.final(), c.getAuthTag()]);
}

export function openFileKey(key: Buffer, body: Uint8Array): Uint8Array | null {
  if (body.length !== 16 + TAG) return null;
  try {
    const d = createDecipheriv("chacha20-poly1305", key, ZERO_NONCE, { authTagLength: TAG });
    d.setAuthTag(body.subarray(16));
    return new Uint8Array(Buffer.concat([d.update(body.subarray(0, 16)), d.final()]));
  } catch {
    return null;
  }
}

/** One recipient stanza of an age header: `-> <args…>` and its body. */
export interface StanzaOut {
  args: string[];
  body: Buffer;
}

/**
 * The age v1 header for `stanzas`: the version line, each stanza (its body in base64 lines of
 * 64 columns, the last one shorter), then `---` and the header MAC, HMAC-SHA-256 under
 * HKDF-SHA-256(file key, "", "header") over everything up to and including `---`.
 */
export function ageHeader(fileKey: Uint8Array, stanzas: StanzaOut[]): Buffer {
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
export interface StanzaIn {
  args: string[];
  body: Buffer;
}

/** Thrown for a header that does not follow the age v1 grammar (the message says where). */
export class HeaderMalformed extends Error {}

const B64_LINE = 64;
/**
 * Parse an age v1 header (the bytes up to and including the MAC line's newline): the stanzas,
 * the bytes the MAC covers (through `---`) and the MAC. Strict like age and typage: arguments
 * are 1+ visible ASCII characters, bodies are canonical unpadded base64 in 64-column lines
 * ending with a shorter one (possibly empty).
 */
export function parseHeader(header: Buffer): { stanzas: StanzaIn[]; macInput: Buffer; mac: Buffer } {
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
    if (args.some((a) => !/^[\x21-\x7e]+$/.test(a))) {
      throw new HeaderMalformed(`invalid stanza arguments on line ${i + 1}`);
    }
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
