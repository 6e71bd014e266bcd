/**
 * JSON escapes that can hide a secret (see ./json.ts, which uses them; the SQLite worker imports
 * them too):
 *
 *  - `hidingEscapeAt(bytes, from, end)`: the first offset in [from, end) of a backslash that
 *    starts `\/`, or a `\uXXXX` for a character that pre-filter matches and their contexts are
 *    made of (letters, digits, `_ - . : = / @ \ " '`: `g\u0068p_…` is `ghp_…`) or one JS counts
 *    as whitespace (a separator between a key and its `=`); -1 if none.
 *    An escape must end by `end`. The same test as the native
 *    `hiding_escape` (native/prefilter/prefilter.c) and the regex `HIDING_ESCAPE` (./json.ts).
 *    Other escapes (`\"`, `\n`, `\u00e9`, `\u001b`, `\u003c`) stand for characters that no
 *    pre-filter match is made of (but a URL's user-info, which may hold any character and
 *    matches escaped as well as decoded), so a text without one is a candidate decoded only
 *    if it is one as it is.
 *  - `decodeText(text)`: `decode(text).text` (or `text`), without the offsets.
 *  - `decode(text)`: `{ text, at }` with every JSON escape of `text` decoded and `at[i]` the
 *    offset in `text` of decoded character i (`at[length]` = `text.length`), or null when
 *    nothing decodes. An escape that is not valid JSON stays as it is.
 */

export interface Decoded {
  /** The text with every JSON escape replaced by the character it stands for. */
  text: string;
  /** at[i]: the offset in the escaped text of decoded character i; at[text.length]: the escaped text's length. */
  at: Int32Array;
}

function hexv(c: number): number {
  return c >= 0x30 && c <= 0x39 ? c - 0x30 : c >= 0x41 && c <= 0x46 ? c - 0x37 : c >= 0x61 && c <= 0x66 ? c - 0x57 : -1;
}
// The characters pre-filter matches and their contexts are made of: letters, digits,
// _ - . : = / @ \ " ' and whitespace (JS \s).
const ALPHABET = new Uint8Array(128);
for (const c of "_-.:=/@\\\"' ") ALPHABET[c.charCodeAt(0)] = 1;
for (let c = 0x30; c <= 0x39; c++) ALPHABET[c] = 1;
for (let c = 0x41; c <= 0x5a; c++) ALPHABET[c] = ALPHABET[c + 0x20] = 1;
for (let c = 0x09; c <= 0x0d; c++) ALPHABET[c] = 1;
function hiding(u: number): boolean {
  return u < 0x80
    ? ALPHABET[u] === 1
    : u === 0xa0 ||
        u === 0x1680 ||
        (u >= 0x2000 && u <= 0x200a) ||
        u === 0x2028 ||
        u === 0x2029 ||
        u === 0x202f ||
        u === 0x205f ||
        u === 0x3000 ||
        u === 0xfeff;
}
/** See the module comment. */
export function hidingEscapeAt(b: Uint8Array, from?: number, end?: number): number {
  if (from === undefined) from = 0;
  if (end === undefined) end = b.length;
  for (let p = b.indexOf(0x5c, from); p >= 0 && p < end; p = b.indexOf(0x5c, p + 1)) {
    const c = b[p + 1];
    if (c === 0x2f && p + 1 < end) return p;
    if (c !== 0x75 || p + 6 > end) continue;
    // (p + 6 <= end <= b.length: the four digits are there)
    const h0 = hexv(b[p + 2]!),
      h1 = hexv(b[p + 3]!),
      h2 = hexv(b[p + 4]!),
      h3 = hexv(b[p + 5]!);
    if (h0 < 0 || h1 < 0 || h2 < 0 || h3 < 0) continue;
    if (hiding((h0 << 12) | (h1 << 8) | (h2 << 4) | h3)) return p;
  }
  return -1;
}
const SIMPLE: Record<string, string> = { '"': '"', "\\": "\\", "/": "/", b: "\b", f: "\f", n: "\n", r: "\r", t: "\t" };
const HEX4 = /^[0-9A-Fa-f]{4}$/;
/** See the module comment. */
export function decode(text: string): Decoded | null {
  if (text.indexOf("\\") < 0) return null;
  const out: string[] = [];
  const at: number[] = [];
  let i = 0;
  let plain = 0;
  let any = false;
  const flush = (to: number): void => {
    if (to > plain) {
      out.push(text.slice(plain, to));
      for (let k = plain; k < to; k++) at.push(k);
    }
  };
  while (i < text.length) {
    const k = text.indexOf("\\", i);
    if (k < 0) break;
    const c = text[k + 1];
    if (c === "u" && HEX4.test(text.slice(k + 2, k + 6))) {
      flush(k);
      out.push(String.fromCharCode(parseInt(text.slice(k + 2, k + 6), 16)));
      at.push(k);
      i = plain = k + 6;
      any = true;
    } else if (c !== undefined && Object.prototype.hasOwnProperty.call(SIMPLE, c)) {
      flush(k);
      out.push(SIMPLE[c]!);
      at.push(k);
      i = plain = k + 2;
      any = true;
    } else {
      i = k + 1;
    }
  }
  if (!any) return null;
  flush(text.length);
  at.push(text.length);
  return { text: out.join(""), at: Int32Array.from(at) };
}
const ESCAPE = /\\(?:u([0-9A-Fa-f]{4})|(["\\\/bfnrt]))/g;
// decode(text).text, without the offsets (for a yes/no on the decoded text).
export function decodeText(text: string): string {
  if (text.indexOf("\\") < 0) return text;
  return text.replace(ESCAPE, (_m, hex: string | undefined, c: string) =>
    hex !== undefined ? String.fromCharCode(parseInt(hex, 16)) : SIMPLE[c]!,
  );
}
