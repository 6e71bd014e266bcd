/**
 * Lossless JSON and the agentlog canonical form.
 *
 * agentlog record ids are `sha256:` + hex SHA-256 of the canonical JSON of the record's
 * `payload`. The canonical form is the agentlog project's own, close to RFC 8785 but not equal:
 *
 *  - no insignificant whitespace;
 *  - object keys sorted by the bytes of their UTF-8 encoding (after NFC); duplicate keys
 *    (after NFC) are an error;
 *  - strings and keys NFC-normalised; `"` and `\` escaped, the short escapes `\b \f \n \r \t`,
 *    other control characters as `\u00xx` (lowercase hex), lone surrogates as `\udxxx`,
 *    everything else literal UTF-8 (no `\/`, no escaping of non-ASCII);
 *  - numbers as their exact decimal value without an exponent: `1.5e-7` → `0.00000015`,
 *    `1E3` → `1000`, `1.50` → `1.5`, `-0` → `0`; integers of any size keep every digit
 *    (`time_unix_nano` exceeds 2^53, so numbers are never converted to doubles).
 *
 * The parser keeps numbers as their source text and objects as ordered Maps, so a record can
 * be re-serialised exactly (key order and number spelling kept) after a string is rewritten.
 */
import { createHash } from "node:crypto";

/** A JSON number kept as its source text. */
export class JsonNumber {
  constructor(readonly text: string) {}
  /** True when the literal has no fraction and no exponent. */
  get isInteger(): boolean {
    return !/[.eE]/.test(this.text);
  }
  /** The value as a bigint, when it is an integer literal. */
  toBigInt(): bigint {
    if (!this.isInteger) throw new TypeError(`${this.text} is not an integer literal`);
    return BigInt(this.text);
  }
}

export type JsonValue = null | boolean | string | JsonNumber | JsonValue[] | JsonObject;
/** An object: keys in source order. */
export type JsonObject = Map<string, JsonValue>;

export class JsonSyntaxError extends Error {
  constructor(message: string, readonly offset: number) {
    super(`${message} at offset ${offset}`);
  }
}

/** Nesting deeper than this is refused (the parser is recursive). */
export const MAX_DEPTH = 512;

/** Parse one JSON text losslessly. Duplicate keys are an error. */
export function parseLossless(text: string): JsonValue {
  let i = 0;
  const n = text.length;
  const ws = (): void => {
    while (i < n) {
      const c = text.charCodeAt(i);
      if (c === 0x20 || c === 0x0a || c === 0x0d || c === 0x09) i++;
      else break;
    }
  };
  const fail = (msg: string): never => {
    throw new JsonSyntaxError(msg, i);
  };
  const str = (): string => {
    // at the opening quote
    i++;
    let out = "";
    let start = i;
    for (;;) {
      if (i >= n) fail("unterminated string");
      const c = text.charCodeAt(i);
      if (c === 0x22) {
        out += text.slice(start, i);
        i++;
        return out;
      }
      if (c < 0x20) fail("control character in string");
      if (c !== 0x5c) {
        i++;
        continue;
      }
      out += text.slice(start, i);
      const e = text[i + 1];
      i += 2;
      switch (e) {
        case '"': out += '"'; break;
        case "\\": out += "\\"; break;
        case "/": out += "/"; break;
        case "b": out += "\b"; break;
        case "f": out += "\f"; break;
        case "n": out += "\n"; break;
        case "r": out += "\r"; break;
        case "t": out += "\t"; break;
        case "u": {
          const h = text.slice(i, i + 4);
          if (!/^[0-9a-fA-F]{4}$/.test(h)) fail("bad \\u escape");
          out += String.fromCharCode(parseInt(h, 16));
          i += 4;
          break;
        }
        default:
          i -= 2;
          fail("bad escape");
      }
      start = i;
    }
  };
  const NUM = /-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?/y;
  const value = (depth: number): JsonValue => {
    if (depth > MAX_DEPTH) fail("nesting too deep");
    ws();
    if (i >= n) fail("unexpected end");
    const c = text[i]!;
    if (c === "{") {
      i++;
      const obj: JsonObject = new Map();
      ws();
      if (text[i] === "}") {
        i++;
        return obj;
      }
      for (;;) {
        ws();
        if (text[i] !== '"') fail("expected a key");
        const at = i;
        const k = str();
        if (obj.has(k)) {
          i = at;
          fail(`duplicate key ${JSON.stringify(k)}`);
        }
        ws();
        if (text[i] !== ":") fail("expected ':'");
        i++;
        obj.set(k, value(depth + 1));
        ws();
        if (text[i] === ",") {
          i++;
          continue;
        }
        if (text[i] === "}") {
          i++;
          return obj;
        }
        fail("expected ',' or '}'");
      }
    }
    if (c === "[") {
      i++;
      const arr: JsonValue[] = [];
      ws();
      if (text[i] === "]") {
        i++;
        return arr;
      }
      for (;;) {
        arr.push(value(depth + 1));
        ws();
        if (text[i] === ",") {
          i++;
          continue;
        }
        if (text[i] === "]") {
          i++;
          return arr;
        }
        fail("expected ',' or ']'");
      }
    }
    if (c === '"') return str();
    if (text.startsWith("true", i)) {
      i += 4;
      return true;
    }
    if (text.startsWith("false", i)) {
      i += 5;
      return false;
    }
    if (text.startsWith("null", i)) {
      i += 4;
      return null;
    }
    NUM.lastIndex = i;
    const m = NUM.exec(text);
    if (!m) return fail("unexpected character");
    i += m[0].length;
    return new JsonNumber(m[0]);
  };
  const v = value(0);
  ws();
  if (i < n) fail("trailing characters");
  return v;
}

/** Longest canonical number memsnap writes (guards `1e999999999`). */
export const MAX_NUMBER_DIGITS = 4096;

/** The canonical spelling of a JSON number literal: exact decimal, no exponent. */
export function canonicalNumber(text: string): string {
  const m = /^(-?)(0|[1-9][0-9]*)(?:\.([0-9]+))?(?:[eE]([+-]?[0-9]+))?$/.exec(text);
  if (!m) throw new TypeError(`not a JSON number: ${text}`);
  const [, sign, int, frac = "", expText = "0"] = m;
  const exp = Number(expText);
  if (!Number.isSafeInteger(exp) || Math.abs(exp) > MAX_NUMBER_DIGITS) throw new RangeError(`number ${text} is out of the canonical range`);
  let digits = int! + frac;
  let point = int!.length + exp; // decimal point position from the left of `digits`
  let lead = 0;
  while (lead < digits.length && digits[lead] === "0") lead++;
  digits = digits.slice(lead);
  point -= lead;
  let end = digits.length;
  while (end > 0 && digits[end - 1] === "0") end--;
  digits = digits.slice(0, end);
  if (digits === "") return "0";
  let out: string;
  if (point <= 0) out = `0.${"0".repeat(-point)}${digits}`;
  else if (point >= digits.length) out = digits + "0".repeat(point - digits.length);
  else out = `${digits.slice(0, point)}.${digits.slice(point)}`;
  if (out.length > MAX_NUMBER_DIGITS) throw new RangeError(`number ${text} is out of the canonical range`);
  return sign === "-" ? `-${out}` : out;
}

const SHORT: Record<number, string> = { 0x08: "\\b", 0x09: "\\t", 0x0a: "\\n", 0x0c: "\\f", 0x0d: "\\r", 0x22: '\\"', 0x5c: "\\\\" };

/** A JSON string literal: minimal escapes (see the module comment); no normalisation. */
export function quote(s: string): string {
  let out = '"';
  let start = 0;
  for (let i = 0; i < s.length; i++) {
    const c = s.charCodeAt(i);
    let esc: string | undefined;
    if (c < 0x20 || c === 0x22 || c === 0x5c) {
      esc = SHORT[c] ?? `\\u${c.toString(16).padStart(4, "0")}`;
    } else if (c >= 0xd800 && c <= 0xdfff) {
      const hi = c <= 0xdbff;
      const next = s.charCodeAt(i + 1);
      if (hi && next >= 0xdc00 && next <= 0xdfff) {
        i++; // a well-formed pair stays literal
        continue;
      }
      esc = `\\u${c.toString(16)}`;
    }
    if (esc !== undefined) {
      out += s.slice(start, i) + esc;
      start = i + 1;
    }
  }
  return `${out}${s.slice(start)}"`;
}

const utf8 = (s: string): Buffer => Buffer.from(s, "utf8");

/** The canonical JSON text of a value (see the module comment). Throws on NFC-duplicate keys. */
export function canonicalize(v: JsonValue): string {
  if (v === null) return "null";
  if (v === true) return "true";
  if (v === false) return "false";
  if (typeof v === "string") return quote(v.normalize("NFC"));
  if (v instanceof JsonNumber) return canonicalNumber(v.text);
  if (Array.isArray(v)) return `[${v.map(canonicalize).join(",")}]`;
  const entries: { key: string; bytes: Buffer; quoted: string; value: JsonValue }[] = [];
  for (const [k, val] of v) {
    const key = k.normalize("NFC");
    entries.push({ key, bytes: utf8(key), quoted: quote(key), value: val });
  }
  entries.sort((a, b) => Buffer.compare(a.bytes, b.bytes) || (a.quoted < b.quoted ? -1 : a.quoted > b.quoted ? 1 : 0));
  for (let j = 1; j < entries.length; j++) {
    if (entries[j]!.quoted === entries[j - 1]!.quoted) throw new TypeError(`duplicate key ${entries[j]!.quoted} after NFC normalisation`);
  }
  return `{${entries.map((e) => `${e.quoted}:${canonicalize(e.value)}`).join(",")}}`;
}

/** Compact JSON keeping key order, key spelling and number text (for records memsnap rewrites). */
export function serializeFaithful(v: JsonValue): string {
  if (v === null) return "null";
  if (v === true) return "true";
  if (v === false) return "false";
  if (typeof v === "string") return quote(v);
  if (v instanceof JsonNumber) return v.text;
  if (Array.isArray(v)) return `[${v.map(serializeFaithful).join(",")}]`;
  return `{${[...v].map(([k, val]) => `${quote(k)}:${serializeFaithful(val)}`).join(",")}}`;
}

/** `sha256:` + hex SHA-256 of the canonical JSON of `payload`: an agentlog record id. */
export function agentlogId(payload: JsonValue): string {
  return `sha256:${createHash("sha256").update(canonicalize(payload), "utf8").digest("hex")}`;
}

/** Rewrite every string value (not keys) under `v` with `fn`; returns the new value and whether anything changed. */
export async function mapStrings(v: JsonValue, fn: (s: string) => Promise<string>): Promise<{ value: JsonValue; changed: boolean }> {
  if (typeof v === "string") {
    const s = await fn(v);
    return { value: s, changed: s !== v };
  }
  if (Array.isArray(v)) {
    let changed = false;
    const out: JsonValue[] = [];
    for (const x of v) {
      const r = await mapStrings(x, fn);
      changed ||= r.changed;
      out.push(r.value);
    }
    return { value: changed ? out : v, changed };
  }
  if (v instanceof Map) {
    let changed = false;
    const out: JsonObject = new Map();
    for (const [k, x] of v) {
      const r = await mapStrings(x, fn);
      changed ||= r.changed;
      out.set(k, r.value);
    }
    return { value: changed ? out : v, changed };
  }
  return { value: v, changed: false };
}
