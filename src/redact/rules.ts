/**
 * memsnap's own redaction rules: what secretlint's recommend preset misses or only matches in
 * one exact format. Each rule has a stable id (`memsnap/…`, used in `[REDACTED:<id>]`, the
 * report and `redaction.rules.disable`) and a priority that decides the label when matches of
 * several rules overlap (see {@link resolveOverlaps}): the more specific rule wins.
 *
 * Every rule is written so that
 *  - a match lies on one line, except PEM blocks (which the region logic extends to their END line);
 *  - its anchor (the text the pre-filter looks for) lies inside the match or its key context;
 *  - it never matches its own replacement or a value that is already `[REDACTED:…]`, so a
 *    second pass changes nothing (idempotence);
 *  - no regex uses the `iu` flag pair (it would fold `ſ`/`K` onto ASCII letters the ASCII-only
 *    pre-filter does not look for).
 */

/** A match before overlap resolution: the span to replace and the full match it came from. */
export interface Candidate {
  start: number;
  end: number;
  rule: string;
  priority: number;
  /** The rule's full match (e.g. `password=hunter2` for the value `hunter2`); used by allow-list entries. */
  ctxStart: number;
  ctxEnd: number;
}

/** A final, non-overlapping match. */
export interface Finding {
  start: number;
  end: number;
  rule: string;
}

export interface MemsnapRule {
  id: string;
  /** Higher wins when matches overlap; secretlint's rules have {@link SECRETLINT_PRIORITY}. */
  priority: number;
  /** What it finds, for the docs and the config error hint. */
  description: string;
  find(text: string, out: Candidate[]): void;
}

/** Priority of every secretlint rule. */
export const SECRETLINT_PRIORITY = 2;

/** The replacement text of a match. */
export const replacement = (rule: string): string => `[REDACTED:${rule}]`;

export const REDACTED_PREFIX = "[REDACTED:";

/** Secretlint's recommend preset rules (v12.0.0), checked against the installed preset by a test. */
export const SECRETLINT_RULE_IDS = [
  "@secretlint/secretlint-rule-aws",
  "@secretlint/secretlint-rule-gcp",
  "@secretlint/secretlint-rule-privatekey",
  "@secretlint/secretlint-rule-npm",
  "@secretlint/secretlint-rule-basicauth",
  "@secretlint/secretlint-rule-slack",
  "@secretlint/secretlint-rule-sendgrid",
  "@secretlint/secretlint-rule-shopify",
  "@secretlint/secretlint-rule-github",
  "@secretlint/secretlint-rule-gitlab",
  "@secretlint/secretlint-rule-grafana",
  "@secretlint/secretlint-rule-openai",
  "@secretlint/secretlint-rule-anthropic",
  "@secretlint/secretlint-rule-groq",
  "@secretlint/secretlint-rule-huggingface",
  "@secretlint/secretlint-rule-linear",
  "@secretlint/secretlint-rule-notion",
  "@secretlint/secretlint-rule-1password",
  "@secretlint/secretlint-rule-database-connection-string",
  "@secretlint/secretlint-rule-hashicorp-vault",
  "@secretlint/secretlint-rule-vercel",
  "@secretlint/secretlint-rule-databricks",
  "@secretlint/secretlint-rule-docker",
  "@secretlint/secretlint-rule-figma",
] as const;

/**
 * Secretlint's comment filter (`secretlint-disable` in the scanned text) is always off: the
 * text is agent memory, not code under review, and must not be able to switch redaction off.
 */
export const SECRETLINT_FILTER_COMMENTS = "@secretlint/secretlint-rule-filter-comments";

// ------------------------------------------------------------------------------------------ helpers

function eachMatch(re: RegExp, text: string, fn: (m: RegExpExecArray) => void): void {
  re.lastIndex = 0;
  for (let m = re.exec(text); m; m = re.exec(text)) {
    fn(m);
    if (m[0].length === 0) re.lastIndex++;
  }
}

/** A rule whose whole match (or one capture group, for regexes with the `d` flag) is the secret. */
function tokenRule(
  id: string,
  priority: number,
  description: string,
  re: RegExp,
  group = 0,
  ok: (v: string) => boolean = () => true,
): MemsnapRule {
  if (group > 0 && !re.hasIndices) throw new Error(`${id}: a group rule needs the d flag`);
  return {
    id,
    priority,
    description,
    find(text, out) {
      eachMatch(re, text, (m) => {
        const v = m[group];
        if (!v || !ok(v)) return;
        const s = group === 0 ? m.index : m.indices![group]![0];
        out.push({ start: s, end: s + v.length, rule: id, priority, ctxStart: m.index, ctxEnd: m.index + m[0].length });
      });
    },
  };
}

/**
 * Values that are not secrets: templates (`${X}`, `$X`, `{{x}}`, `<x>`, `%X%`), masks
 * (`***`, `xxxx`, `...`), already-redacted values and type/placeholder words.
 */
const PLACEHOLDER = new RegExp(
  String.raw`^(?:\$\{.*\}|\$\(.*\)|\$[A-Za-z_][A-Za-z0-9_]*|\{\{.*\}\}|\{[A-Za-z_][A-Za-z0-9_.]*\}|` +
    String.raw`<[^>]*>|%[A-Za-z_][A-Za-z0-9_]*%|\*+|[xX]+|\.+|•+|-+|_+|#+|\?+|null|none|nil|true|false|` +
    String.raw`undefined|empty|redacted|hidden|masked|placeholder|string|str|required|optional|password|` +
    String.raw`secret|token|your[_-]?\w*|changeme|change[_-]me|todo|tbd|example|xxx+\w*)$`,
  "i",
);

export function isPlaceholder(v: string): boolean {
  return v.startsWith(REDACTED_PREFIX) || v.startsWith("${") || v.startsWith("{{") || PLACEHOLDER.test(v);
}

/*
 * `key = value` assignments. The key is an identifier (`DB_PASSWORD`, `db.password`,
 * `"password"`, `\"password\"` inside a JSON string) ending in one of the keywords; the
 * operator is `=`, `:`, `:=` or `=>`; the value is double-quoted (JSON escapes allowed),
 * backslash-escaped-double-quoted (a JSON string inside a JSON string), single-quoted, or a
 * bare run that stops at whitespace, quotes, `,;` and brackets. Only the value is replaced.
 */
const VALUE =
  String.raw`(?:\\"((?:[^"\\\r\n]|\\[^"\r\n])+)\\"` + // \"…\" (inside a JSON string)
  String.raw`|"((?:[^"\\\r\n]|\\[^\r\n])+)"` + // "…"
  String.raw`|'([^'\r\n]+)'` + // '…'
  String.raw`|([^\s"'\x60,;\\\[\]<>{}()=:|>][^\s"'\x60,;\\\[\]<>{}()]*))`; // bare; never starts with [ (a redaction)
const OP = String.raw`(\\?["'])?[^\S\r\n]*(?::=|=>|=|:)[^\S\r\n]*`;

function assignmentRule(
  id: string,
  priority: number,
  description: string,
  key: string,
  minLen: number,
  ok: (v: string) => boolean,
): MemsnapRule {
  const re = new RegExp(String.raw`(?<![A-Za-z0-9])(?:${key})${OP}${VALUE}`, "gi");
  return {
    id,
    priority,
    description,
    find(text, out) {
      eachMatch(re, text, (m) => {
        const v = m[2] ?? m[3] ?? m[4] ?? m[5];
        if (v === undefined || v.length < minLen || isPlaceholder(v) || !ok(v)) return;
        const end = m.index + m[0].length;
        // A bare value followed by `(` or `[` is code (`password = getpass()`), not a secret.
        if (m[5] !== undefined && /[([]/.test(text[end] ?? "")) return;
        const quoteLen = m[2] !== undefined ? 2 : m[3] !== undefined || m[4] !== undefined ? 1 : 0;
        const s = end - quoteLen - v.length;
        out.push({ start: s, end: s + v.length, rule: id, priority, ctxStart: m.index, ctxEnd: end });
      });
    },
  };
}

// ------------------------------------------------------------------------------------------ PEM

/** How far a PEM block may reach from its BEGIN line (region extension and END search). */
export const PEM_MAX = 64 * 1024;

const PEM_BEGIN = /-----BEGIN ((?:[A-Z0-9]+ )*)PRIVATE KEY(?: BLOCK)?-----/y;
const PEM_END = /-----END ((?:[A-Z0-9]+ )*)PRIVATE KEY(?: BLOCK)?-----/y;
/** Rest of the BEGIN line in the single-line (JSON-escaped) form: base64 and `\n` escapes. */
const PEM_INLINE = /(?:\\[nr]|\\\/|[A-Za-z0-9+/=])*/y;
/** A following line that belongs to the block when it has no END: base64, or a PEM header. */
const PEM_LINE = /(?:[A-Za-z0-9+/=]+|(?:Proc-Type|DEK-Info|Comment|Version): ?[^\r\n]*)\r?(?=\n|$)/y;

/**
 * Where the private-key block that begins at `p` (`-----BEGIN`) ends: just after the END
 * marker that closes it (markers nest like brackets) when one follows within {@link PEM_MAX},
 * else after the last END within reach, else after the base64 lines that follow.
 * `null` when `p` is not a private-key BEGIN. `-1` when it cannot be decided yet because
 * `text` ends before the block does and more text may follow (`final` false).
 */
export function pemExtent(text: string, p: number, final: boolean): number | null {
  PEM_BEGIN.lastIndex = p;
  if (!PEM_BEGIN.test(text)) return null;
  const afterBegin = PEM_BEGIN.lastIndex;
  const limit = p + PEM_MAX;
  // BEGIN and END markers pair up like brackets: a block pasted inside another (BEGIN, BEGIN,
  // …, END, …, END) ends at the END that closes the first BEGIN, so the outer block's rest is
  // not left behind after the inner block's END. Unbalanced (a BEGIN whose END is missing):
  // up to the last END within reach.
  let depth = 1;
  let lastEnd = -1;
  for (let q = afterBegin; q < limit;) {
    const e = text.indexOf("-----END", q);
    if (e < 0 || e >= limit) break;
    const b = text.indexOf("-----BEGIN", q);
    if (b >= 0 && b < e) {
      PEM_BEGIN.lastIndex = b;
      if (PEM_BEGIN.test(text)) depth++;
      q = b + 10;
      continue;
    }
    PEM_END.lastIndex = e;
    if (PEM_END.test(text)) {
      lastEnd = PEM_END.lastIndex;
      if (--depth === 0) return lastEnd;
      q = lastEnd;
    } else q = e + 8;
  }
  if (!final && text.length < limit + 64) return -1;
  if (lastEnd >= 0) return lastEnd;
  // No END marker: the block is what looks like key material after BEGIN.
  PEM_INLINE.lastIndex = afterBegin;
  PEM_INLINE.test(text);
  let end = PEM_INLINE.lastIndex;
  while (end < limit) {
    let nl = end;
    if (text[nl] === "\r") nl++;
    if (text[nl] !== "\n") break;
    PEM_LINE.lastIndex = nl + 1;
    if (!PEM_LINE.test(text)) break;
    end = PEM_LINE.lastIndex;
  }
  if (!final && end >= text.length) return -1;
  return Math.min(end, limit);
}

const pemRule: MemsnapRule = {
  id: "memsnap/pem-private-key",
  priority: 1,
  description:
    "PEM private-key blocks (-----BEGIN … PRIVATE KEY----- … -----END … PRIVATE KEY-----), " +
    "multi-line or with \\n escapes",
  find(text, out) {
    for (let p = text.indexOf("-----BEGIN"); p >= 0; p = text.indexOf("-----BEGIN", p + 10)) {
      const end = pemExtent(text, p, true);
      if (end === null || end === -1) continue;
      out.push({ start: p, end, rule: this.id, priority: this.priority, ctxStart: p, ctxEnd: end });
      p = Math.max(p, end - 10);
    }
  },
};

// ------------------------------------------------------------------------------------------ the rules

const B = String.raw`(?<![A-Za-z0-9_\-])`; // token start boundary

export const MEMSNAP_RULES: readonly MemsnapRule[] = [
  tokenRule(
    "memsnap/jwt",
    1,
    "JSON Web Tokens (eyJ….eyJ….sig)",
    new RegExp(String.raw`${B}eyJ[A-Za-z0-9_\-]{5,}\.eyJ[A-Za-z0-9_\-]{5,}\.[A-Za-z0-9_\-]*`, "g"),
  ),
  tokenRule(
    "memsnap/openai-project-key",
    1,
    "OpenAI project, service-account and admin keys (sk-proj-…, sk-svcacct-…, sk-admin-…)",
    new RegExp(String.raw`${B}sk-(?:proj|svcacct|admin)-[A-Za-z0-9_\-]{20,}`, "g"),
  ),
  tokenRule(
    "memsnap/anthropic-key",
    1,
    "Anthropic API and admin keys in any length (sk-ant-api03-…, sk-ant-admin01-…)",
    new RegExp(String.raw`${B}sk-ant-[a-z]{3,8}\d{2}-[A-Za-z0-9_\-]{20,}`, "g"),
  ),
  tokenRule(
    "memsnap/aws-temporary-id",
    3,
    "AWS temporary (STS) access key ids (ASIA + 16)",
    /(?<![A-Za-z0-9])ASIA[0-9A-Z]{16}(?![A-Za-z0-9])/g,
  ),
  tokenRule(
    "memsnap/github-fine-grained-pat",
    1,
    "GitHub fine-grained personal access tokens (github_pat_…) in any length",
    /(?<![A-Za-z0-9_])github_pat_[A-Za-z0-9_]{22,}(?![A-Za-z0-9_])/g,
  ),
  tokenRule(
    "memsnap/stripe-key",
    1,
    "Stripe secret and restricted keys (sk_live_…, rk_live_…, sk_test_…, rk_test_…)",
    /(?<![A-Za-z0-9])[sr]k_(?:live|test)_[A-Za-z0-9]{16,}(?![A-Za-z0-9])/g,
  ),
  tokenRule(
    "memsnap/gcp-service-account-key",
    3,
    "the private_key of a GCP service-account JSON (escaped newlines)",
    new RegExp(
      String.raw`"private_key"[^\S\r\n]*:[^\S\r\n]*"(-----BEGIN [A-Z ]*PRIVATE KEY-----(?:\\[nr/]|` +
        String.raw`[A-Za-z0-9+/=\s])*?-----END [A-Z ]*PRIVATE KEY-----(?:\\[nr]|\s)*)"`,
      "dg",
    ),
    1,
  ),
  pemRule,
  tokenRule(
    "memsnap/url-credentials",
    1,
    "the password in a URL's user-info (scheme://user:password@host)",
    /(?<![A-Za-z0-9+.\-])[A-Za-z][A-Za-z0-9+.\-]{1,30}:\/\/[^\s/:@]{0,256}:([^\s/@]{1,256})@/dg,
    1,
    (v) => v.length >= 3 && !isPlaceholder(v),
  ),
  tokenRule(
    "memsnap/bearer-token",
    1,
    "HTTP bearer tokens (Authorization: Bearer …)",
    new RegExp(
      String.raw`(?<![A-Za-z0-9])[Bb](?:earer|` +
        String.raw`EARER)[^\S\r\n]+((?=[A-Za-z0-9\-._~+/]*\d)[A-Za-z0-9\-._~+/]{16,}=*)(?![A-Za-z0-9\-._~+/=])`,
      "dg",
    ),
    1,
  ),
  assignmentRule(
    "memsnap/password-assignment",
    0,
    'password assignments (password=…, passwd: …, "password": "…", DB_PASSWORD=…, db_pwd=…): the value only',
    String.raw`[A-Za-z0-9_.\-]{0,64}?(?:password|passwd|passphrase|[A-Za-z0-9]{1,32}[_.\-]pwd)`,
    3,
    () => true,
  ),
  assignmentRule(
    "memsnap/secret-assignment",
    0,
    'secret/token/API-key assignments (secret: …, api_key=…, "access_token": "…", _authToken=…): the value only',
    String.raw`[A-Za-z0-9_.\-]{0,64}?(?:secret|token|secret[_\-]?key|api[_\-]?key|access[_\-]?key|` +
      String.raw`private[_\-]?key|auth[_\-]?key|credentials?)`,
    8,
    (v) => !/^\d+$/.test(v),
  ),
];

export const MEMSNAP_RULE_IDS: readonly string[] = MEMSNAP_RULES.map((r) => r.id);

/** Every rule id `redaction.rules.disable` accepts. */
export const ALL_RULE_IDS: readonly string[] = [...MEMSNAP_RULE_IDS, ...SECRETLINT_RULE_IDS];

// ------------------------------------------------------------------------------------------ resolution

/**
 * Turn possibly overlapping candidates into disjoint findings. Overlapping candidates form one
 * finding spanning their union (so no part of any secret survives), labelled with the rule of
 * highest priority, then the longest match, then the earliest.
 */
export function resolveOverlaps(cands: Candidate[]): Finding[] {
  if (cands.length === 0) return [];
  cands.sort((a, b) => a.start - b.start || b.end - a.end);
  const out: Finding[] = [];
  let cur = cands[0]!;
  let start = cur.start;
  let end = cur.end;
  let best = cur;
  const better = (c: Candidate, b: Candidate): boolean =>
    c.priority !== b.priority
      ? c.priority > b.priority
      : c.end - c.start !== b.end - b.start
        ? c.end - c.start > b.end - b.start
        : c.start < b.start;
  for (let i = 1; i < cands.length; i++) {
    cur = cands[i]!;
    if (cur.start < end) {
      if (cur.end > end) end = cur.end;
      if (better(cur, best)) best = cur;
    } else {
      out.push({ start, end, rule: best.rule });
      start = cur.start;
      end = cur.end;
      best = cur;
    }
  }
  out.push({ start, end, rule: best.rule });
  return out;
}

/** Replace every finding (sorted, disjoint) in `text`. */
export function applyFindings(text: string, findings: readonly Finding[], offset = 0): string {
  if (findings.length === 0) return text;
  let out = "";
  let at = 0;
  for (const f of findings) {
    out += text.slice(at, f.start - offset) + replacement(f.rule);
    at = f.end - offset;
  }
  return out + text.slice(at);
}
