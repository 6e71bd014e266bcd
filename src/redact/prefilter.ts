/**
 * The cheap pre-filter: where in a text could any rule match?
 *
 * It over-approximates every memsnap rule and every secretlint recommend rule (a test checks
 * each fixture). It is defined by regexes ({@link SCANNERS}): every alternative of the main
 * one starts with one trigger character (`_ - . : = J A`) and checks the token prefix around
 * it with a look-behind or look-ahead; `dapi` and bearer tokens are separate literal passes.
 *
 * Those regexes are the definition, not what runs on the hot path: the regex engine steps
 * through a text one character at a time (about 1 GB/s before any trigger is evaluated), which
 * made the pre-filter the main cost of redaction on text without secrets. {@link FINDERS}
 * find exactly the same positions with `String.prototype.indexOf` on one anchor per
 * alternative (a rare character, or a literal that starts with one), which V8 runs as
 * `memchr` at memory speed; each anchor hit is rejected by a character test or two and
 * confirmed by the alternative's own regex, run sticky at that position. Their cost is
 * about 20 ns per anchor hit, so it follows how often the anchors occur: measured on this
 * project's 2-core machine (planRegions over the benchmark mix, no secrets), ~1.8 ms/MB on
 * JSONL agent traces (whose many `:` are anchors) and ~1.2 ms/MB on markdown notes, against
 * 2.2 and 1.9 ms/MB for the regexes.
 *
 * The pre-filter runs on a latin1 view of UTF-8 bytes as well as on JS strings: every anchor
 * is ASCII, so its hits (and the newlines around them) are at the same positions in both, and
 * no regex here folds case beyond ASCII.
 */

/** `[Pp][Aa]…`: ASCII case-insensitive without the `i` flag. */
const ci = (w: string): string => w.replace(/[a-z]/g, (c) => `[${c.toUpperCase()}${c}]`);

/** Key names that introduce a secret value (assignments, AWS secret key / account id). */
const KEYS = ["passw(?:or)?d", "passphrase", "pwd", "secret", "token", "key", "credentials?", "account(?:_?id)?"].map(ci).join("|");

/** The alternatives of the main scanner, each named by its trigger. */
const ALT = {
  // token prefixes ending in `_` (GitHub, Hugging Face, npm, Stripe, Shopify, Grafana, 1Password, Groq, Linear, Notion, Vercel, Docker, Figma)
  underscore: String.raw`_(?<=(?:gh[pousr]|github_pat|hf|npm|[sr]k_(?:live|test)|shp(?:pa|ca|at|ss)|glc|glsa|ops|gsk|lin_api|ntn|vc[pirak]|dckr_pat|figd)_)`,
  // PEM blocks, GitHub x-oauth-basic URLs, OpenAI / Anthropic keys, Slack and GitLab tokens
  dash: String.raw`-(?:----BEGIN|oauth-basic(?<=x-oauth-basic)|(?<=sk-)(?:(?:proj|svcacct|admin|ant)-|[a-zA-Z0-9]{20}T3BlbkFJ)|(?<=(?:xox[bpaor]|xapp|glpat)-))`,
  // SendGrid, HashiCorp Vault, Slack webhooks
  dot: String.raw`\.(?<=(?:SG|hv[sbr]|${ci("hooks")})\.)`,
  // URL credentials (scheme://user:pass@)
  url: String.raw`:\/\/[^\s\/@]{0,600}@`,
  // key = value assignments (passwords, secrets, tokens, API keys, AWS secret key / account id)
  assign: String.raw`[:=](?<=(?:${KEYS})(?:\\?["'])?\s*[:=])`,
  // JWT
  jwt: String.raw`J(?<=eyJ)`,
  // AWS access key ids
  aws: String.raw`A(?=KIA|SIA|3T[A-Z0-9]|GPA|IDA|ROA|IPA|NPA|NVA)`,
};

const MAIN_SRC = Object.values(ALT).join("|");

/** Databricks tokens and bearer tokens: literal anchors, each a separate scanner. */
const LIT_SRCS = ["dapi", "[Bb]earer|BEARER"];

/** Anchors of secretlint's rules only (decides whether a unit goes to secretlint at all). */
const SECRETLINT_SRC = [
  String.raw`_(?<=(?:gh[pousr]|github_pat|hf|npm|shp(?:pa|ca|at|ss)|glc|glsa|ops|gsk|lin_api|ntn|vc[pirak]|dckr_pat|figd)_)`,
  String.raw`-(?:(?<=sk-)(?=(?:proj|svcacct|admin|ant)-|[a-zA-Z0-9]{20}T3BlbkFJ)|(?<=(?:xox[bpaor]|xapp|glpat)-)|(?=----BEGIN)|(?<=x-)(?=oauth-basic))`,
  String.raw`\.(?<=(?:SG|hv[sbr]|${ci("hooks")})\.)`,
  String.raw`:(?=\/\/[^\s\/@]{0,600}@)`,
  String.raw`[:=](?<=(?:${ci("key")}|${ci("account")}(?:_?${ci("id")})?)["']?\s*[:=])`,
  String.raw`A(?=KIA|SIA|3T[A-Z0-9]|GPA|IDA|ROA|IPA|NPA|NVA)`,
  "dapi",
].join("|");

/**
 * The pre-filter's definition: global (stateful) regexes, main first; a match of any of them
 * is a candidate position. Callers reset lastIndex. The hot path uses {@link FINDERS}, which
 * find the same positions; the SQLite worker, which cannot import this module, gets these.
 */
export const MAIN_RE = new RegExp(MAIN_SRC, "g");
export const LIT_RES: readonly RegExp[] = LIT_SRCS.map((s) => new RegExp(s, "g"));
export const SCANNERS: readonly RegExp[] = [MAIN_RE, ...LIT_RES];
const SECRETLINT_TEST = new RegExp(SECRETLINT_SRC);

// ------------------------------------------------------------------------------------------ finders

/** One way into a scanner's matches: the first match at or after `from` that has this anchor, or -1. */
type Anchor = (text: string, from: number) => number;

/** The scanner's regex for one alternative, sticky: does it match right at `p`? */
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

/** Is `c` (a char code, or NaN off either end of the text) in `set`? */
const isIn = (set: Uint8Array, c: number): boolean => c < 128 && set[c] === 1;

/** JS `\s` (what the assignment look-behind skips between a key and its `:` / `=`). */
function isJsSpace(c: number): boolean {
  if (c === 0x20 || (c >= 0x09 && c <= 0x0d)) return true;
  if (c < 0xa0) return false;
  return c === 0xa0 || c === 0x1680 || (c >= 0x2000 && c <= 0x200a) || c === 0x2028 || c === 0x2029
    || c === 0x202f || c === 0x205f || c === 0x3000 || c === 0xfeff;
}

/** Does `word` (lowercase ASCII) end at `j`, in any ASCII case? */
function endsAtCi(text: string, j: number, word: string): boolean {
  const n = word.length;
  if (j + 1 < n) return false;
  for (let k = 0; k < n; k++) {
    const c = text.charCodeAt(j - k);
    if ((c >= 0x41 && c <= 0x5a ? c | 0x20 : c) !== word.charCodeAt(n - 1 - k)) return false;
  }
  return true;
}

/** Every word of {@link KEYS}, spelled out (lowercase). */
const KEY_WORDS = ["password", "passwd", "passphrase", "pwd", "secret", "token", "key", "credential", "credentials", "account", "account_id", "accountid"];

/**
 * Index of three characters in {@link KEYS_BY_END}: `& 31` folds ASCII case (and lets a few
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
 * Could a key of {@link KEYS} end just before the `:` / `=` at `p`? The look-behind reads
 * `key`, an optional quote (itself optionally after a backslash), whitespace, then `p`; none
 * of these parts can take a character of another, so the key's end is found by walking back.
 */
function keyBefore(text: string, p: number): boolean {
  let j = p - 1;
  while (j >= 0 && isJsSpace(text.charCodeAt(j))) j--;
  const q = text.charCodeAt(j);
  if (q === 0x22 || q === 0x27) j -= text.charCodeAt(j - 1) === 0x5c ? 2 : 1;
  if (j < 2) return false;
  const words = KEYS_BY_END[endIndex(text.charCodeAt(j - 2), text.charCodeAt(j - 1), text.charCodeAt(j))];
  if (words === undefined) return false;
  for (const w of words) if (endsAtCi(text, j, w)) return true;
  return false;
}

/*
 * The anchors. Each one-character rejection lists what its alternative needs next to the
 * trigger, and must be kept in step with ALT (the differential test in
 * test/redact/prefilter.test.ts walks every token prefix, key and literal).
 */
const underscoreAt = exactAt(ALT.underscore);
/** The last letter of every token prefix before `_`. */
const BEFORE_UNDERSCORE = charSet("pousrtfmeackind");
const dashAt = exactAt(ALT.dash);
/** `x-oauth-basic`, `sk-`, `xox[bpaor]-`, `xapp-`, `glpat-` (and `-----BEGIN`, by the next character). */
const BEFORE_DASH = charSet("xkbpaort");
const dotAt = exactAt(ALT.dot);
/** `SG.`, `hv[sbr].`, `hooks.` (any case). */
const BEFORE_DOT = charSet("GSsbr");
const urlAt = exactAt(ALT.url);
const assignAt = exactAt(ALT.assign);
const awsAt = exactAt(ALT.aws);
/** `AKIA`, `ASIA`, `A3T…`, `AGPA`, `AIDA`, `AROA`, `AIPA`, `ANPA`, `ANVA`. */
const AFTER_A = charSet("KS3GIRN");

/*
 * One search per anchor: the first position at or after `from` where the scanner matches and
 * the anchor is found. Each is written out with its literal, because V8 compiles
 * `indexOf` with a constant one-character needle into a tighter loop than a shared search
 * with the needle as a parameter (~0.55 against ~0.8 ms/MB for `:` on JSONL).
 */

function nextUnderscore(t: string, from: number): number {
  for (let p = t.indexOf("_", from); p >= 0; p = t.indexOf("_", p + 1)) {
    if (isIn(BEFORE_UNDERSCORE, t.charCodeAt(p - 1)) && underscoreAt(t, p)) return p;
  }
  return -1;
}

function nextDash(t: string, from: number): number {
  for (let p = t.indexOf("-", from); p >= 0; p = t.indexOf("-", p + 1)) {
    if ((t.charCodeAt(p + 1) === 0x2d || isIn(BEFORE_DASH, t.charCodeAt(p - 1))) && dashAt(t, p)) return p;
  }
  return -1;
}

function nextDot(t: string, from: number): number {
  for (let p = t.indexOf(".", from); p >= 0; p = t.indexOf(".", p + 1)) {
    if (!isIn(BEFORE_DOT, t.charCodeAt(p - 1))) continue;
    if ((endsAtCi(t, p - 1, "hooks") || t.startsWith("hv", p - 3) || t.startsWith("SG", p - 2)) && dotAt(t, p)) return p;
  }
  return -1;
}

function nextColon(t: string, from: number): number {
  for (let p = t.indexOf(":", from); p >= 0; p = t.indexOf(":", p + 1)) {
    if ((t.charCodeAt(p + 1) === 0x2f && urlAt(t, p)) || (keyBefore(t, p) && assignAt(t, p))) return p;
  }
  return -1;
}

function nextEquals(t: string, from: number): number {
  for (let p = t.indexOf("=", from); p >= 0; p = t.indexOf("=", p + 1)) {
    if (keyBefore(t, p) && assignAt(t, p)) return p;
  }
  return -1;
}

/** `J(?<=eyJ)`, tested here in full. */
function nextJwt(t: string, from: number): number {
  for (let p = t.indexOf("J", from); p >= 0; p = t.indexOf("J", p + 1)) {
    if (t.charCodeAt(p - 1) === 0x79 && t.charCodeAt(p - 2) === 0x65) return p;
  }
  return -1;
}

function nextAws(t: string, from: number): number {
  for (let p = t.indexOf("A", from); p >= 0; p = t.indexOf("A", p + 1)) {
    if (isIn(AFTER_A, t.charCodeAt(p + 1)) && awsAt(t, p)) return p;
  }
  return -1;
}

/** `dapi`, found by its `pi`: `p` is rarer than `d` in prose. */
function nextDapi(t: string, from: number): number {
  for (let k = t.indexOf("pi", from + 2); k >= 0; k = t.indexOf("pi", k + 1)) {
    if (t.charCodeAt(k - 2) === 0x64 && t.charCodeAt(k - 1) === 0x61) return k - 2;
  }
  return -1;
}

/** `Bearer` and `BEARER`, found by their capital. */
function nextBearerCap(t: string, from: number): number {
  for (let p = t.indexOf("B", from); p >= 0; p = t.indexOf("B", p + 1)) {
    if (t.startsWith("earer", p + 1) || t.startsWith("EARER", p + 1)) return p;
  }
  return -1;
}

const nextBearerLow = (t: string, from: number): number => t.indexOf("bearer", from);

/**
 * The first position at or after `from` where a scanner matches, or -1. A cursor belongs to
 * one text; positions asked for must not decrease (each anchor's next hit is kept).
 */
export type Cursor = (from: number) => number;

/** A scanner as used on the hot path: {@link SCANNERS}' positions, found by anchors. */
export interface Finder {
  cursor(text: string): Cursor;
}

function finder(anchors: readonly Anchor[]): Finder {
  const n = anchors.length;
  return {
    cursor(text) {
      // per anchor: its first match at or after the last `from` (-1: none left; -2: not searched yet)
      const hit = new Array<number>(n).fill(-2);
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

/** {@link SCANNERS}, in the same order, each finding exactly the positions its regex matches at. */
export const FINDERS: readonly Finder[] = [
  finder([nextUnderscore, nextDash, nextDot, nextColon, nextEquals, nextJwt, nextAws]),
  finder([nextDapi]),
  finder([nextBearerCap, nextBearerLow]),
];

/** False means no rule (memsnap's or secretlint's) can match anywhere in `text`. */
export function candidate(text: string): boolean {
  return FINDERS.some((f) => f.cursor(text)(0) >= 0);
}

/** False means no secretlint rule can match in `text`. */
export function secretlintCandidate(text: string): boolean {
  return SECRETLINT_TEST.test(text);
}
