/**
 * JSON and JSONL: only string contents are rewritten, so the document stays valid and every
 * other byte stays where it was. A JSON text is processed line by line (a newline is never
 * inside a JSON string), and each line is split into units the rules run on separately, so a
 * match never spans a string boundary:
 *
 *  - every string's content (keys, array items, values without a key);
 *  - for `"key": "value"`, the raw pair, with matches kept only inside the value: the key is
 *    the context assignment rules need (`"password": "…"`, `"private_key": "-----BEGIN…"`);
 *  - the text between strings, as plain text (empty of anything a rule matches in valid JSON,
 *    but a damaged or commented file still gets redacted there).
 *
 * Matches inside a string are widened to whole escape sequences (`\"`, `\n`, `\u0041`), and the
 * replacement `[REDACTED:rule]` needs no escaping, so the string stays a valid JSON string.
 *
 * Escaped text: a JSON writer may escape any character (`"g\u0068p_…"` is `"ghp_…"`, and
 * `https:\/\/…` a URL), which hides a secret from rules that read the bytes. A unit whose
 * escapes decode to a candidate is a unit too ({@link escapedCandidate}), a line that holds one
 * is a region ({@link escapedLines}), and the rules run on each unit that holds an escape a
 * second time, decoded ({@link decodeJsonEscapes}), with their matches mapped back onto the
 * escaped text; the escaped form is what is replaced.
 */
import { type Decoded, decode, decodeText, hidingEscapeAt as escapeAt } from "./escapes.js";
import { candidate } from "./prefilter.js";

/**
 * Tokenizer state at a line start that continues a line cut mid-way: 0 outside a string, 1 inside, 2 inside right after
 * a backslash.
 */
export type JsonState = 0 | 1 | 2;

export interface Unit {
  /** The text the rules see. */
  text: string;
  /** Offset of `text` in the line. */
  base: number;
  /** Matches are clipped to text[a, b). */
  a: number;
  b: number;
  /** Widen matches to whole JSON escape sequences. */
  json: boolean;
}

interface Str {
  /** Opening quote, or -1 for a string continued from before the line. */
  q0: number;
  /** Content [c0, c1). */
  c0: number;
  c1: number;
  closed: boolean;
}

const STR = /"((?:[^"\\\r\n]|\\[^\r\n])*)(")?/g;
const CONT = /(?:[^"\\\r\n]|\\[^\r\n])*/y;
const WS = /[ \t\r]*/y;

function strings(line: string, state: JsonState): Str[] {
  const out: Str[] = [];
  let pos = 0;
  if (state !== 0) {
    CONT.lastIndex = state === 2 ? Math.min(1, line.length) : 0;
    CONT.test(line);
    const c1 = CONT.lastIndex;
    const closed = line[c1] === '"';
    out.push({ q0: -1, c0: 0, c1, closed });
    pos = closed ? c1 + 1 : c1;
  }
  STR.lastIndex = pos;
  for (let m = STR.exec(line); m; m = STR.exec(line)) {
    const c0 = m.index + 1;
    out.push({ q0: m.index, c0, c1: c0 + m[1]!.length, closed: m[2] !== undefined });
  }
  return out;
}

function skipWs(line: string, p: number): number {
  WS.lastIndex = p;
  WS.test(line);
  return WS.lastIndex;
}

/** The units of one JSON line that may hold a match (the pre-filter is applied to each). */
export function jsonUnits(line: string, state: JsonState): Unit[] {
  const strs = strings(line, state);
  const units: Unit[] = [];
  const isValue = new Set<number>();
  let gapFrom = 0;
  const gap = (to: number): void => {
    if (to > gapFrom) {
      const text = line.slice(gapFrom, to);
      if (candidate(text)) units.push({ text, base: gapFrom, a: 0, b: text.length, json: false });
    }
  };
  for (let i = 0; i < strs.length; i++) {
    const s = strs[i]!;
    if (s.q0 >= 0) gap(s.q0);
    gapFrom = s.closed ? s.c1 + 1 : s.c1;
    if (!isValue.has(i)) {
      const text = line.slice(s.c0, s.c1);
      if (candidate(text) || escapedCandidate(text)) units.push({ text, base: s.c0, a: 0, b: text.length, json: true });
    }
    if (!s.closed || s.q0 < 0) continue;
    const colon = skipWs(line, s.c1 + 1);
    if (line[colon] !== ":") continue;
    const v = strs[i + 1];
    if (!v || v.q0 !== skipWs(line, colon + 1)) continue;
    isValue.add(i + 1);
    const end = v.closed ? v.c1 + 1 : v.c1;
    const text = line.slice(s.q0, end);
    if (candidate(text) || escapedCandidate(text))
      units.push({ text, base: s.q0, a: v.c0 - s.q0, b: v.c1 - s.q0, json: true });
  }
  gap(line.length);
  return units;
}

/** The tokenizer state at the end of `line` (for a line cut before its newline). */
export function jsonEndState(line: string, state: JsonState): JsonState {
  const strs = strings(line, state);
  const last = strs[strs.length - 1];
  if (!last || last.closed || last.c1 < line.length - 1) return 0;
  if (last.c1 === line.length) return 1;
  return line[last.c1] === "\\" ? 2 : 0;
}

/**
 * Widen [s, e) (inside the content of one JSON string, `text[a, b)`) so that it neither starts
 * nor ends inside an escape sequence.
 */
export function snapToEscapes(text: string, a: number, b: number, s: number, e: number): [number, number] {
  const cover = (p: number): [number, number] | null => {
    for (let q = p - 1; q >= a && q >= p - 5; q--) {
      if (text.charCodeAt(q) !== 0x5c) continue;
      let k = 0;
      while (q - 1 - k >= a && text.charCodeAt(q - 1 - k) === 0x5c) k++;
      if (k % 2 !== 0) continue; // this backslash is itself escaped
      const len = text[q + 1] === "u" ? 6 : 2;
      if (q + len > p) return [q, Math.min(b, q + len)];
      return null;
    }
    return null;
  };
  const cs = cover(s);
  const ce = cover(e);
  return [cs ? cs[0] : s, ce ? ce[1] : e];
}

const ESCAPE = /\\([nrtbf])|\\[\s\S]/g;

/**
 * What the rules see of a text that may hold JSON string escapes: the same length, with `\n`
 * and `\r` as a line break ("\r\n") and `\t`, `\b`, `\f` as two spaces, so that the letter of
 * an escape does not glue onto what follows (`…\nAKIA…`, `…\tghp_…` would not be at a word
 * boundary). `\"`, `\\`, `\/` and `\uXXXX` stay as they are. Offsets are unchanged.
 */
export function escapeView(text: string): string {
  if (!text.includes("\\")) return text;
  return text.replace(ESCAPE, (m, c: string | undefined) =>
    c === undefined ? m : c === "n" || c === "r" ? "\r\n" : "  ",
  );
}

// ------------------------------------------------------------------------------ escaped text

/**
 * A JSON escape that can hide what a rule looks for (./escapes.ts, where the bytes version
 * is): `\/`, and a `\uXXXX` that stands for a letter, a digit, one of `_ - . : = / @ \ " '`
 * (`g\u0068p_…` is `ghp_…`) or a character JS counts as whitespace (a separator between a key
 * and its `=`). Other escapes (`\"`, `\n`, `\u00e9`, `\u001b`, Go's `\u003c`) stand for
 * characters no pre-filter match is made of, so a text without one of these is a candidate
 * decoded only if it is one as it is (the rules, once a text is a candidate, still see every
 * escape decoded: {@link decodeJsonEscapes}).
 */
export const HIDING_ESCAPE = new RegExp(
  String.raw`\\(?:\/|u(?:00(?:2[027dDeEfF]|3[0-9aAdD]|4[0-9A-Fa-f]|5[0-9aAcCfF]|6[1-9A-Fa-f]|7[0-9aA])|` +
    String.raw`000[9A-Da-d]|00[Aa]0|1680|200[0-9Aa]|202[89Ff]|205[Ff]|3000|[Ff][Ee][Ff][Ff]))`,
);
const HIDING_ESCAPE_G = new RegExp(HIDING_ESCAPE.source, "g");

/** Does `text` hold a {@link HIDING_ESCAPE}? */
export function hasHidingEscape(text: string): boolean {
  return text.includes("\\") && HIDING_ESCAPE.test(text);
}

export type { Decoded } from "./escapes.js";

/**
 * The first offset in `b` at or after `from` (and before `end`) where a {@link HIDING_ESCAPE}
 * starts, or -1: the same test on bytes (UTF-8, or any ASCII-compatible encoding).
 */
export function hidingEscapeAt(b: Uint8Array, from = 0, end = b.length): number {
  return escapeAt(b, from, end);
}

/**
 * Decode the JSON escapes of `text` (a string's content, or a line of JSON: outside strings a
 * valid document has no backslash), mapping each decoded character back to where it came
 * from. An escape that is not valid JSON stays as it is. Null when there is nothing to decode.
 */
export function decodeJsonEscapes(text: string): Decoded | null {
  return decode(text);
}

/** Is `text` a pre-filter candidate once its JSON escapes are decoded (and not already as it is)? */
export function escapedCandidate(text: string): boolean {
  return hasHidingEscape(text) && candidate(decodeText(text));
}

/**
 * Lines of `text` before `end` that are a candidate only once their JSON escapes are decoded,
 * as regions (whole lines, [line start, newline)), for the JSON region plan.
 */
export function escapedLines(text: string, end: number): Array<{ start: number; end: number }> {
  const out: Array<{ start: number; end: number }> = [];
  if (!text.includes("\\")) return out;
  HIDING_ESCAPE_G.lastIndex = 0;
  for (let m = HIDING_ESCAPE_G.exec(text); m && m.index < end; m = HIDING_ESCAPE_G.exec(text)) {
    const ls = text.lastIndexOf("\n", m.index) + 1;
    let le = text.indexOf("\n", m.index);
    if (le < 0 || le > end) le = end;
    if (candidate(decodeText(text.slice(ls, le)))) out.push({ start: ls, end: le });
    HIDING_ESCAPE_G.lastIndex = le + 1;
  }
  return out;
}
