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
  constructor(
    message: string,
    readonly offset: number,
  ) {
    super(`${message} at offset ${offset}`);
  }
}

/** Nesting deeper than this is refused (the parser is recursive). */
export const MAX_DEPTH = 512;

/**
 * What {@link parseLossless} charges against {@link ParseLimits.budget} for each value and each
 * object key it makes: about what one costs in memory (a JsonNumber or Map and its slot, a Map
 * entry), so the budget bounds the parsed tree's memory, however the text spends its bytes.
 */
export const VALUE_COST = 64;

/** Bounds on what parsing one text (and then canonicalizing it) may cost. */
export interface ParseLimits {
  /** Bytes the parsed tree may take, counted as {@link VALUE_COST} per value and per key. */
  budget?: number;
  /**
   * Digits the canonical form may add to the numbers' literals (`1e4000` adds ~4000): canonical
   * numbers have no exponent, so a short text can stand for a long canonical form to hash.
   */
  expansion?: number;
}

/** A text whose parsed tree or canonical form would be over a {@link ParseLimits} bound. */
export class JsonBudgetError extends Error {
  constructor(
    readonly what: "budget" | "expansion",
    readonly limit: number,
    readonly offset: number,
  ) {
    super(
      what === "budget"
        ? `over the ${limit}-byte budget for its parsed values (${VALUE_COST} bytes per value and key) at ` +
            `offset ${offset}`
        : `its numbers' canonical form would add more than ${limit} digits (exponents) at offset ${offset}`,
    );
  }
}

/** Parse one JSON text losslessly. Duplicate keys are an error. Throws JsonBudgetError past `limits`. */
export function parseLossless(text: string, limits: ParseLimits = {}): JsonValue {
  let i = 0;
  const n = text.length;
  let budget = limits.budget ?? Infinity;
  let expansion = limits.expansion ?? Infinity;
  const charge = (): void => {
    budget -= VALUE_COST;
    if (budget < 0) throw new JsonBudgetError("budget", limits.budget!, i);
  };
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
        case '"':
          out += '"';
          break;
        case "\\":
          out += "\\";
          break;
        case "/":
          out += "/";
          break;
        case "b":
          out += "\b";
          break;
        case "f":
          out += "\f";
          break;
        case "n":
          out += "\n";
          break;
        case "r":
          out += "\r";
          break;
        case "t":
          out += "\t";
          break;
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
    charge();
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
        charge();
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
    const lit = m[0];
    const e = lit.search(/[eE]/);
    if (e >= 0) {
      // The canonical form writes the exponent out as digits (zeros or a leading `0.000…`).
      expansion -= Math.min(Math.abs(Number(lit.slice(e + 1))), MAX_NUMBER_DIGITS + 1);
      if (expansion < 0) throw new JsonBudgetError("expansion", limits.expansion!, i);
    }
    i += lit.length;
    return new JsonNumber(lit);
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
  if (!Number.isSafeInteger(exp) || Math.abs(exp) > MAX_NUMBER_DIGITS)
    throw new RangeError(`number ${text} is out of the canonical range`);
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

const SHORT: Record<number, string> = {
  0x08: "\\b",
  0x09: "\\t",
  0x0a: "\\n",
  0x0c: "\\f",
  0x0d: "\\r",
  0x22: '\\"',
  0x5c: "\\\\",
};

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

/**
 * Write the canonical JSON text of a value piece by piece to `out` (see the module comment):
 * nothing but the pieces in flight is built, so hashing a big record's canonical form costs no
 * copy of it. Throws on NFC-duplicate keys.
 */
export function writeCanonical(v: JsonValue, out: (piece: string) => void): void {
  if (v === null) return out("null");
  if (v === true) return out("true");
  if (v === false) return out("false");
  if (typeof v === "string") return out(quote(v.normalize("NFC")));
  if (v instanceof JsonNumber) return out(canonicalNumber(v.text));
  if (Array.isArray(v)) {
    out("[");
    for (let j = 0; j < v.length; j++) {
      if (j > 0) out(",");
      writeCanonical(v[j]!, out);
    }
    return out("]");
  }
  const entries: { bytes: Buffer; quoted: string; value: JsonValue }[] = [];
  for (const [k, val] of v) {
    const key = k.normalize("NFC");
    entries.push({ bytes: utf8(key), quoted: quote(key), value: val });
  }
  entries.sort((a, b) => Buffer.compare(a.bytes, b.bytes) || (a.quoted < b.quoted ? -1 : a.quoted > b.quoted ? 1 : 0));
  for (let j = 1; j < entries.length; j++) {
    if (entries[j]!.quoted === entries[j - 1]!.quoted)
      throw new TypeError(`duplicate key ${entries[j]!.quoted} after NFC normalisation`);
  }
  out("{");
  for (let j = 0; j < entries.length; j++) {
    const e = entries[j]!;
    out(j > 0 ? `,${e.quoted}:` : `${e.quoted}:`);
    writeCanonical(e.value, out);
  }
  out("}");
}

/** The canonical JSON text of a value (see the module comment). Throws on NFC-duplicate keys. */
export function canonicalize(v: JsonValue): string {
  const parts: string[] = [];
  writeCanonical(v, (p) => {
    parts.push(p);
  });
  return parts.join("");
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
  // The canonical text streams into the hash in ~64 KiB pieces, never whole.
  const h = createHash("sha256");
  let parts: string[] = [];
  let pending = 0;
  writeCanonical(payload, (p) => {
    parts.push(p);
    pending += p.length;
    if (pending >= 1 << 16) {
      h.update(parts.join(""), "utf8");
      parts = [];
      pending = 0;
    }
  });
  if (pending > 0) h.update(parts.join(""), "utf8");
  return `sha256:${h.digest("hex")}`;
}

/** Rewrite every string value (not keys) under `v` with `fn`; returns the new value and whether anything changed. */
export async function mapStrings(
  v: JsonValue,
  fn: (s: string) => Promise<string>,
): Promise<{ value: JsonValue; changed: boolean }> {
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
