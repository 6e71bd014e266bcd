/**
 * The pre-filter's finders (see ./prefilter.ts, which documents them and builds {@link FINDERS}
 * from its alternatives with {@link buildFinders}; the SQLite worker imports the same): one
 * `cursor(text)(from)` per scanner → the first position at or after `from` where that scanner
 * matches, or -1. A differential test (test/redact/prefilter.test.ts) pins them to the scanners'
 * regexes.
 */

/**
 * The first position at or after `from` where a scanner matches, or -1. A cursor belongs to
 * one text; positions asked for must not decrease (each anchor's next hit is kept).
 */
export type Cursor = (from: number) => number;

/** A scanner as used on the hot path: the positions of one of ./prefilter.ts's SCANNERS, found by anchors. */
export interface Finder {
  cursor(text: string): Cursor;
}

/** The main scanner's alternatives by name: each one's regex source (./prefilter.ts ALT). */
export interface FinderAlternatives {
  underscore: string;
  dash: string;
  dot: string;
  url: string;
  assign: string;
  jwt: string;
  aws: string;
}

/** The scanner's regex for one alternative, sticky: does it match right at 'p'? */
function exactAt(src: string): (text: string, p: number) => boolean {
  const re = new RegExp(src, "y");
  return (text, p) => {
    re.lastIndex = p;
    return re.test(text);
  };
}
/** A set of ASCII characters, for the one-character rejections below. */
function charSet(chars: string): Uint8Array {
  const t = new Uint8Array(128);
  for (let i = 0; i < chars.length; i++) t[chars.charCodeAt(i)] = 1;
  return t;
}
/**
 * The char code at 'i', or -1 off either end of the text. Every read that can fall off an end
 * goes through it: an out-of-bounds charCodeAt is NaN to the language but a deoptimization to
 * V8, and with 64 KiB pieces a trigger at a piece's edge is common (measured: nextColon and
 * keyBefore compiled 9 and 5 times per snapshot across the three isolates that scan).
 */
const at = (t: string, i: number): number => (i >= 0 && i < t.length ? t.charCodeAt(i) : -1);
/** Is 'c' (a char code, or -1) in 'set'? */
const isIn = (set: Uint8Array, c: number): boolean => c >= 0 && c < 128 && set[c] === 1;
/** JS '\s' (what the assignment look-behind skips between a key and its ':' / '='). */
function isJsSpace(c: number): boolean {
  if (c === 0x20 || (c >= 0x09 && c <= 0x0d)) return true;
  if (c < 0xa0) return false;
  return (
    c === 0xa0 ||
    c === 0x1680 ||
    (c >= 0x2000 && c <= 0x200a) ||
    c === 0x2028 ||
    c === 0x2029 ||
    c === 0x202f ||
    c === 0x205f ||
    c === 0x3000 ||
    c === 0xfeff
  );
}
/** Does 'word' (lowercase ASCII) end at 'j', in any ASCII case? */
function endsAtCi(text: string, j: number, word: string): boolean {
  const n = word.length;
  if (j + 1 < n) return false;
  for (let k = 0; k < n; k++) {
    const c = text.charCodeAt(j - k);
    if ((c >= 0x41 && c <= 0x5a ? c | 0x20 : c) !== word.charCodeAt(n - 1 - k)) return false;
  }
  return true;
}
/** Every word of the KEYS of ./prefilter.ts, spelled out (lowercase). */
const KEY_WORDS = [
  "password",
  "passwd",
  "passphrase",
  "pwd",
  "secret",
  "token",
  "key",
  "credential",
  "credentials",
  "account",
  "account_id",
  "accountid",
];
/**
 * Index of three characters in KEYS_BY_END: '& 31' folds ASCII case (and lets a few
 * other characters collide, which only sends more to the exact word test).
 */
const endIndex = (a: number, b: number, c: number): number => ((a & 31) << 10) | ((b & 31) << 5) | (c & 31);
/** The key words by the index of their last three letters. */
const KEYS_BY_END: Array<string[] | undefined> = new Array(1 << 15);
for (const w of KEY_WORDS) {
  const n = w.length;
  (KEYS_BY_END[endIndex(w.charCodeAt(n - 3), w.charCodeAt(n - 2), w.charCodeAt(n - 1))] ??= []).push(w);
}
/**
 * The characters U+0080-U+00FF that are bytes of the UTF-8 of a non-ASCII JS space (U+00A0 C2 A0,
 * U+1680 E1 9A 80, U+2000-U+200A E2 80 80-8A, U+2028/9 E2 80 A8/A9, U+202F E2 80 AF, U+205F
 * E2 81 9F, U+3000 E3 80 80, U+FEFF EF BB BF), seen through a latin1 view: SPACE_BYTES in
 * ./prefilter.ts, and native/prefilter's skip_space.
 */
const SPACE_BYTE = new Uint8Array(256);
for (const c of [0x9a, 0x9f, 0xa0, 0xa8, 0xa9, 0xaf, 0xbb, 0xbf, 0xc2, 0xe1, 0xe2, 0xe3, 0xef]) SPACE_BYTE[c] = 1;
for (let c = 0x80; c <= 0x8a; c++) SPACE_BYTE[c] = 1;
/**
 * Could a key of KEYS end just before the ':' / '=' at 'p'? The look-behind reads
 * 'key', an optional quote (itself optionally after a backslash), whitespace or the UTF-8 bytes
 * of a non-ASCII space seen through a latin1 view (SPACE_BYTE), then 'p'; none of these parts
 * can take a character of another, so the key's end is found by walking back.
 */
function keyBefore(text: string, p: number): boolean {
  let j = p - 1;
  for (let c = at(text, j); c >= 0 && (isJsSpace(c) || (c <= 0xff && SPACE_BYTE[c] === 1)); c = at(text, j)) j--;
  const q = at(text, j);
  if (q === 0x22 || q === 0x27) j -= at(text, j - 1) === 0x5c ? 2 : 1;
  if (j < 2) return false;
  const words = KEYS_BY_END[endIndex(text.charCodeAt(j - 2), text.charCodeAt(j - 1), text.charCodeAt(j))];
  if (words === undefined) return false;
  for (const w of words) if (endsAtCi(text, j, w)) return true;
  return false;
}
/**
 * The finders of the scanners (main, dapi, bearer), in that order, each finding exactly the
 * positions its regex matches at; `ALT` gives each alternative of the main scanner its regex.
 */
export function buildFinders(ALT: Readonly<FinderAlternatives>): Finder[] {
  /*
   * The anchors. Each one-character rejection lists what its alternative needs next to the
   * trigger, and must be kept in step with ALT (the differential test in
   * test/redact/prefilter.test.ts walks every token prefix, key and literal).
   */
  const underscoreAt = exactAt(ALT.underscore);
  /** The last letter of every token prefix before '_'. */
  const BEFORE_UNDERSCORE = charSet("pousrtfmeackind");
  const dashAt = exactAt(ALT.dash);
  /** 'x-oauth-basic', 'sk-', 'xox[bpaor]-', 'xapp-', 'glpat-' (and '-----BEGIN', by the next character). */
  const BEFORE_DASH = charSet("xkbpaort");
  const dotAt = exactAt(ALT.dot);
  /** 'SG.', 'hv[sbr].', 'hooks.' (any case). */
  const BEFORE_DOT = charSet("GSsbr");
  const urlAt = exactAt(ALT.url);
  const assignAt = exactAt(ALT.assign);
  const awsAt = exactAt(ALT.aws);
  /** 'AKIA', 'ASIA', 'A3T…', 'AGPA', 'AIDA', 'AROA', 'AIPA', 'ANPA', 'ANVA'. */
  const AFTER_A = charSet("KS3GIRN");
  /*
   * One search per anchor: the first position at or after 'from' where the scanner matches and
   * the anchor is found. Each is written out with its literal, because V8 compiles
   * 'indexOf' with a constant one-character needle into a tighter loop than a shared search
   * with the needle as a parameter (~0.55 against ~0.8 ms/MB for ':' on JSONL).
   */
  function nextUnderscore(t: string, from: number): number {
    for (let p = t.indexOf("_", from); p >= 0; p = t.indexOf("_", p + 1)) {
      if (isIn(BEFORE_UNDERSCORE, at(t, p - 1)) && underscoreAt(t, p)) return p;
    }
    return -1;
  }
  function nextDash(t: string, from: number): number {
    for (let p = t.indexOf("-", from); p >= 0; p = t.indexOf("-", p + 1)) {
      if ((at(t, p + 1) === 0x2d || isIn(BEFORE_DASH, at(t, p - 1))) && dashAt(t, p)) return p;
    }
    return -1;
  }
  function nextDot(t: string, from: number): number {
    for (let p = t.indexOf(".", from); p >= 0; p = t.indexOf(".", p + 1)) {
      if (!isIn(BEFORE_DOT, at(t, p - 1))) continue;
      if ((endsAtCi(t, p - 1, "hooks") || t.startsWith("hv", p - 3) || t.startsWith("SG", p - 2)) && dotAt(t, p))
        return p;
    }
    return -1;
  }
  function nextColon(t: string, from: number): number {
    for (let p = t.indexOf(":", from); p >= 0; p = t.indexOf(":", p + 1)) {
      if ((at(t, p + 1) === 0x2f && urlAt(t, p)) || (keyBefore(t, p) && assignAt(t, p))) return p;
    }
    return -1;
  }
  function nextEquals(t: string, from: number): number {
    for (let p = t.indexOf("=", from); p >= 0; p = t.indexOf("=", p + 1)) {
      if (keyBefore(t, p) && assignAt(t, p)) return p;
    }
    return -1;
  }
  /** 'J(?<=eyJ)', tested here in full. */
  function nextJwt(t: string, from: number): number {
    for (let p = t.indexOf("J", from); p >= 0; p = t.indexOf("J", p + 1)) {
      if (at(t, p - 1) === 0x79 && at(t, p - 2) === 0x65) return p;
    }
    return -1;
  }
  function nextAws(t: string, from: number): number {
    for (let p = t.indexOf("A", from); p >= 0; p = t.indexOf("A", p + 1)) {
      if (isIn(AFTER_A, at(t, p + 1)) && awsAt(t, p)) return p;
    }
    return -1;
  }
  /** 'dapi', found by its 'pi': 'p' is rarer than 'd' in prose. */
  function nextDapi(t: string, from: number): number {
    for (let k = t.indexOf("pi", from + 2); k >= 0; k = t.indexOf("pi", k + 1)) {
      if (t.charCodeAt(k - 2) === 0x64 && t.charCodeAt(k - 1) === 0x61) return k - 2;
    }
    return -1;
  }
  /** 'Bearer' and 'BEARER', found by their capital. */
  function nextBearerCap(t: string, from: number): number {
    for (let p = t.indexOf("B", from); p >= 0; p = t.indexOf("B", p + 1)) {
      if (t.startsWith("earer", p + 1) || t.startsWith("EARER", p + 1)) return p;
    }
    return -1;
  }
  const nextBearerLow = (t: string, from: number): number => t.indexOf("bearer", from);
  function finder(anchors: Array<(t: string, from: number) => number>): Finder {
    const n = anchors.length;
    return {
      cursor(text: string): Cursor {
        // per anchor: its first match at or after the last 'from' (-1: none left; -2: not searched yet)
        const hit: number[] = new Array<number>(n).fill(-2);
        return (from) => {
          let best = -1;
          for (let i = 0; i < n; i++) {
            let h = hit[i]!;
            if (h === -1) continue;
            if (h < from) {
              h = anchors[i]!(text, from);
              hit[i] = h;
              if (h === -1) continue;
            }
            if (best === -1 || h < best) best = h;
          }
          return best;
        };
      },
    };
  }
  // SCANNERS, in the same order (main, dapi, bearer), each finding exactly the positions its regex matches at.
  return [
    finder([nextUnderscore, nextDash, nextDot, nextColon, nextEquals, nextJwt, nextAws]),
    finder([nextDapi]),
    finder([nextBearerCap, nextBearerLow]),
  ];
}
