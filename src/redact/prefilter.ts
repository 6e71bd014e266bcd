/**
 * The cheap pre-filter: where in a text could any rule match?
 *
 * It over-approximates every memsnap rule and every secretlint recommend rule (a test checks
 * each fixture). Speed comes from the shape of the main regex: every alternative starts with
 * one trigger character that is rare in prose (`_ - . : = J A`), and the expensive part (a
 * look-behind for a token prefix, a look-ahead for `----BEGIN`) runs only at a trigger, inside
 * the regex engine, so a trigger that does not pan out costs no JavaScript. Letters that are
 * common in prose (`d` of `dapi`, `b` of `bearer`) would slow every position down, so those
 * two anchors are searched in separate literal passes (which the regex engine runs as
 * Boyer-Moore searches). Measured on this project's 2-core machine: about 1 GB/s on prose,
 * 0.5 GB/s on JSONL (its many `:` and `_` are triggers), plus ~0.5 ms/MB for the literal passes.
 *
 * The pre-filter runs on a latin1 view of UTF-8 bytes as well as on JS strings: every anchor
 * is ASCII, so its hits (and the newlines around them) are at the same positions in both, and
 * no regex here folds case beyond ASCII.
 */

/** `[Pp][Aa]…`: ASCII case-insensitive without the `i` flag. */
const ci = (w: string): string => w.replace(/[a-z]/g, (c) => `[${c.toUpperCase()}${c}]`);

/** Key names that introduce a secret value (assignments, AWS secret key / account id). */
const KEYS = ["passw(?:or)?d", "passphrase", "pwd", "secret", "token", "key", "credentials?", "account(?:_?id)?"].map(ci).join("|");

const MAIN_SRC = [
  // token prefixes ending in `_` (GitHub, Hugging Face, npm, Stripe, Shopify, Grafana, 1Password, Groq, Linear, Notion, Vercel, Docker, Figma)
  String.raw`_(?<=(?:gh[pousr]|github_pat|hf|npm|[sr]k_(?:live|test)|shp(?:pa|ca|at|ss)|glc|glsa|ops|gsk|lin_api|ntn|vc[pirak]|dckr_pat|figd)_)`,
  // PEM blocks, GitHub x-oauth-basic URLs, OpenAI / Anthropic keys, Slack and GitLab tokens
  String.raw`-(?:----BEGIN|oauth-basic(?<=x-oauth-basic)|(?<=sk-)(?:(?:proj|svcacct|admin|ant)-|[a-zA-Z0-9]{20}T3BlbkFJ)|(?<=(?:xox[bpaor]|xapp|glpat)-))`,
  // SendGrid, HashiCorp Vault, Slack webhooks
  String.raw`\.(?<=(?:SG|hv[sbr]|${ci("hooks")})\.)`,
  // URL credentials (scheme://user:pass@)
  String.raw`:\/\/[^\s\/@]{0,600}@`,
  // key = value assignments (passwords, secrets, tokens, API keys, AWS secret key / account id)
  String.raw`[:=](?<=(?:${KEYS})(?:\\?["'])?\s*[:=])`,
  // JWT
  String.raw`J(?<=eyJ)`,
  // AWS access key ids
  String.raw`A(?=KIA|SIA|3T[A-Z0-9]|GPA|IDA|ROA|IPA|NPA|NVA)`,
].join("|");

/** Databricks tokens and bearer tokens: literal anchors, each searched in a separate pass (Boyer-Moore). */
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

/** Global (stateful) scanners; callers reset lastIndex. */
export const MAIN_RE = new RegExp(MAIN_SRC, "g");
export const LIT_RES: readonly RegExp[] = LIT_SRCS.map((s) => new RegExp(s, "g"));
/** Every scanner, main first; a hit of any of them is a candidate position. */
export const SCANNERS: readonly RegExp[] = [MAIN_RE, ...LIT_RES];
const TESTS = [MAIN_SRC, ...LIT_SRCS].map((s) => new RegExp(s));
const SECRETLINT_TEST = new RegExp(SECRETLINT_SRC);

/** False means no rule (memsnap's or secretlint's) can match anywhere in `text`. */
export function candidate(text: string): boolean {
  return TESTS.some((re) => re.test(text));
}

/** False means no secretlint rule can match in `text`. */
export function secretlintCandidate(text: string): boolean {
  return SECRETLINT_TEST.test(text);
}
