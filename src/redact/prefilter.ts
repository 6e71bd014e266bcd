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

import { buildFinders, type Finder, type FinderAlternatives } from "./finders.js";

export type { Cursor, Finder } from "./finders.js";

/** `[Pp][Aa]…`: ASCII case-insensitive without the `i` flag. */
const ci = (w: string): string => w.replace(/[a-z]/g, (c) => `[${c.toUpperCase()}${c}]`);

/** Key names that introduce a secret value (assignments, AWS secret key / account id). */
const KEYS = ["passw(?:or)?d", "passphrase", "pwd", "secret", "token", "key", "credentials?", "account(?:_?id)?"]
  .map(ci)
  .join("|");

/**
 * Every byte of the UTF-8 of a non-ASCII JS space, as latin1 characters (a regex class body):
 * U+00A0 C2 A0, U+1680 E1 9A 80, U+2000-U+200A E2 80 80-8A, U+2028/9 E2 80 A8/A9, U+202F E2 80 AF,
 * U+205F E2 81 9F, U+3000 E3 80 80, U+FEFF EF BB BF. (It was all of U+0080-U+00FF, until float32
 * embeddings, whose exponent bytes read as '=' after such "spaces", made most of a vector a
 * candidate position; issue #38.)
 */
const SPACE_BYTES = String.raw`\x80-\x8a\x9a\x9f\xa0\xa8\xa9\xaf\xbb\xbf\xc2\xe1-\xe3\xef`;

/** The alternatives of the main scanner, each named by its trigger. */
const ALT: FinderAlternatives = {
  // token prefixes ending in `_` (GitHub, Hugging Face, npm, Stripe, Shopify, Grafana, 1Password, Groq, Linear, Notion,
  // Vercel, Docker, Figma)
  underscore:
    String.raw`_(?<=(?:gh[pousr]|github_pat|hf|npm|[sr]k_(?:live|test)|shp(?:pa|ca|at|ss)|` +
    String.raw`glc|glsa|ops|gsk|lin_api|ntn|vc[pirak]|dckr_pat|figd)_)`,
  // PEM blocks, GitHub x-oauth-basic URLs, OpenAI / Anthropic keys, Slack and GitLab tokens
  dash:
    String.raw`-(?:----BEGIN|oauth-basic(?<=x-oauth-basic)|` +
    String.raw`(?<=sk-)(?:(?:proj|svcacct|admin|ant)-|[a-zA-Z0-9]{20}T3BlbkFJ)|(?<=(?:xox[bpaor]|xapp|glpat)-))`,
  // SendGrid, HashiCorp Vault, Slack webhooks
  dot: String.raw`\.(?<=(?:SG|hv[sbr]|${ci("hooks")})\.)`,
  // URL credentials (scheme://user:pass@)
  url: String.raw`:\/\/[^\s\/@]{0,600}@`,
  // key = value assignments (passwords, secrets, tokens, API keys, AWS secret key / account id).
  // Between the key and the operator: JS whitespace, or the UTF-8 bytes of a non-ASCII space
  // (U+00A0 = C2 A0, U+3000 = E3 80 80, …; SPACE_BYTES) in a latin1 view, where the rules (on
  // decoded text) see one \s character.
  assign: String.raw`[:=](?<=(?:${KEYS})(?:\\?["'])?[\s${SPACE_BYTES}]*[:=])`,
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
  String.raw`_(?<=(?:gh[pousr]|github_pat|hf|npm|shp(?:pa|ca|at|ss)|` +
    String.raw`glc|glsa|ops|gsk|lin_api|ntn|vc[pirak]|dckr_pat|figd)_)`,
  String.raw`-(?:(?<=sk-)(?=(?:proj|svcacct|admin|ant)-|[a-zA-Z0-9]{20}T3BlbkFJ)|` +
    String.raw`(?<=(?:xox[bpaor]|xapp|glpat)-)|(?=----BEGIN)|(?<=x-)(?=oauth-basic))`,
  String.raw`\.(?<=(?:SG|hv[sbr]|${ci("hooks")})\.)`,
  String.raw`:(?=\/\/[^\s\/@]{0,600}@)`,
  String.raw`[:=](?<=(?:${ci("key")}|${ci("account")}(?:_?${ci("id")})?)["']?\s*[:=])`,
  String.raw`A(?=KIA|SIA|3T[A-Z0-9]|GPA|IDA|ROA|IPA|NPA|NVA)`,
  // secretlint's Databricks rule needs 32 hex digits after `dapi`; the bare prefix sent the
  // units of every trace whose random ids hold it (`call_…dapi7`) to secretlint.
  String.raw`dapi(?=[A-Fa-f0-9]{32})`,
].join("|");

/**
 * The pre-filter's definition: global (stateful) regexes, main first; a match of any of them
 * is a candidate position. Callers reset lastIndex. The hot path uses {@link FINDERS}, which
 * find the same positions (the SQLite worker runs them too).
 */
export const MAIN_RE = new RegExp(MAIN_SRC, "g");
export const LIT_RES: readonly RegExp[] = LIT_SRCS.map((s) => new RegExp(s, "g"));
export const SCANNERS: readonly RegExp[] = [MAIN_RE, ...LIT_RES];
const SECRETLINT_TEST = new RegExp(SECRETLINT_SRC);

// ------------------------------------------------------------------------------------------ finders

/**
 * {@link SCANNERS}, in the same order, each finding exactly the positions its regex matches at
 * (./finders.ts, which the SQLite worker runs too): one anchor per alternative found with
 * `indexOf`, rejected by a character test or two, confirmed by the alternative's own regex run
 * sticky at that position.
 */
export const FINDERS: readonly Finder[] = buildFinders(ALT);

/** False means no rule (memsnap's or secretlint's) can match anywhere in `text`. */
export function candidate(text: string): boolean {
  return FINDERS.some((f) => f.cursor(text)(0) >= 0);
}

/** False means no secretlint rule can match in `text`. */
export function secretlintCandidate(text: string): boolean {
  return SECRETLINT_TEST.test(text);
}
