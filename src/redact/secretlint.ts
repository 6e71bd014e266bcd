/**
 * secretlint's recommend preset through `@secretlint/core`'s `lintSource`, loaded on first use.
 *
 * Units are linted in one batch per call, joined by "\n\0\n": no rule of the preset can match
 * across it (every pattern stops at a newline or cannot consume NUL), so a match never spans
 * two units and each unit sees the same boundaries as when linted alone.
 *
 * Two quirks of v12 are handled here:
 *  - some rules report the start of the whole pattern with the length of the secret (AWS
 *    secret access key: `aws_secret_access_key = "wJalr…` is reported from `aws_`); for those
 *    the secret's own position is found from the message data, so only the value is replaced;
 *  - `@secretlint/profiler` records performance marks for every rule of every call and
 *    searches them linearly, so lint time grows without bound (≈1 ms per call after a few
 *    thousand calls, and unbounded memory). Its `mark` is replaced by a no-op.
 */
import { createRequire } from "node:module";
import { MemsnapError } from "../errors.js";
import type { Candidate } from "./rules.js";
import { SECRETLINT_FILTER_COMMENTS, SECRETLINT_PRIORITY, SECRETLINT_RULE_IDS } from "./rules.js";

export interface SecretlintScanner {
  /** Candidates per text, in that text's offsets. */
  scan(texts: readonly string[]): Promise<Candidate[][]>;
}

/** Message ids whose `range` is not the secret, and the data field that holds it. */
const VALUE_FIELD: Record<string, string> = {
  AWSSecretAccessKey: "KEY",
  PackageJSON_xOauthToken: "TOKEN",
  Npmrc_authToken: "TOKEN",
};

const SEP = "\n\u0000\n";

/**
 * Rules whose URI patterns run on over any non-space character, so they take what follows a
 * URL along (`…/app\``, `…/app",`, the next JSON string); the match is cut at the first
 * quote, bracket or space after the credentials, and trailing punctuation is kept.
 */
const URI_RULES = new Set(["@secretlint/secretlint-rule-database-connection-string"]);
const TRAILING = /[`"'()[\]{}<>,.;:!?]+$/;

type LintSource = (typeof import("@secretlint/core"))["lintSource"];
type LintConfig = Parameters<LintSource>[0]["options"]["config"];

type Rules = (typeof import("@secretlint/secretlint-rule-preset-recommend"))["rules"];

let loaded: Promise<{ lintSource: LintSource; rules: Rules }> | undefined;

/**
 * The versions of the secretlint engine and rule preset installed (`unknown` where one cannot be
 * read): what they find and redact can change with them under the same memsnap version, so an
 * incremental snapshot does not reference text redacted by other ones.
 */
export function secretlintVersions(): string {
  const req = createRequire(import.meta.url);
  const version = (pkg: string): string => {
    try {
      const v = (req(`${pkg}/package.json`) as { version?: unknown }).version;
      return typeof v === "string" ? v : "unknown";
    } catch {
      return "unknown";
    }
  };
  return `core ${version("@secretlint/core")}, preset ${version("@secretlint/secretlint-rule-preset-recommend")}`;
}

function load(): Promise<{ lintSource: LintSource; rules: Rules }> {
  loaded ??= (async () => {
    const [core, preset] = await Promise.all([
      import("@secretlint/core"),
      import("@secretlint/secretlint-rule-preset-recommend"),
    ]);
    try {
      const profiler = (await import("@secretlint/profiler")) as { secretLintProfiler?: { mark?: unknown } };
      if (profiler.secretLintProfiler) profiler.secretLintProfiler.mark = () => undefined;
    } catch {
      // a later secretlint without the profiler: nothing to switch off
    }
    return { lintSource: core.lintSource, rules: preset.rules };
  })();
  return loaded;
}

/**
 * A scanner with the given secretlint rules off; null when all of them are off. secretlint is
 * loaded by the first scan of a non-empty batch, not here: loading it is ~35 ms of the main
 * thread (about 50 modules), which held back the start of every snapshot, and the native
 * pre-filter keeps most snapshots from ever needing it (none of the bench mix's 125 MB of text
 * reaches it). A failure to load is thrown by that scan (MEMSNAP_INTERNAL).
 */
export async function createSecretlintScanner(disabled: ReadonlySet<string>): Promise<SecretlintScanner | null> {
  if (SECRETLINT_RULE_IDS.every((id) => disabled.has(id))) return null;
  let real: Promise<SecretlintScanner> | undefined;
  return {
    async scan(texts) {
      if (texts.length === 0) return [];
      real ??= loadScanner(disabled);
      return (await real).scan(texts);
    },
  };
}

/**
 * The scanner itself, once secretlint is loaded. The preset's rules are registered one by one
 * rather than through the preset: v12 ignores `disabled` on rules inside a preset, and the
 * comment filter must not run at all.
 */
async function loadScanner(disabled: ReadonlySet<string>): Promise<SecretlintScanner> {
  let lib: { lintSource: LintSource; rules: Rules };
  try {
    lib = await load();
  } catch (e) {
    loaded = undefined;
    throw new MemsnapError("MEMSNAP_INTERNAL", `cannot load secretlint: ${(e as Error).message}`, {
      cause: e,
      hint: "reinstall memsnap's dependencies (@secretlint/core, @secretlint/secretlint-rule-preset-recommend)",
    });
  }
  const { lintSource, rules } = lib;
  const config: LintConfig = {
    rules: rules
      .filter((r) => r.meta.id !== SECRETLINT_FILTER_COMMENTS && !disabled.has(r.meta.id))
      .map((r) => ({
        id: r.meta.id,
        rule: r,
        ...(r.meta.id === "@secretlint/secretlint-rule-aws" ? { options: { enableIDScanRule: true } } : {}),
      })),
  };
  return {
    async scan(texts) {
      const out: Candidate[][] = texts.map(() => []);
      if (texts.length === 0) return out;
      // The batch starts with the separator, so it never starts with a BOM (which secretlint strips, shifting offsets).
      const starts: number[] = [];
      let content = "";
      for (const t of texts) {
        content += SEP;
        starts.push(content.length);
        content += t;
      }
      let result: Awaited<ReturnType<LintSource>>;
      try {
        result = await lintSource({
          source: { content, contentType: "text", ext: ".txt", filePath: "" },
          options: { config, noPhysicFilePath: true, maskSecrets: false, locale: "en" },
        });
      } catch (e) {
        // the message may quote the text; keep only the error's kind
        throw new MemsnapError(
          "MEMSNAP_INTERNAL",
          `secretlint failed while scanning for secrets (${(e as Error).name})`,
          {
            hint: "report this as a bug; redaction can be switched off with --no-redact",
          },
        );
      }
      for (const m of result.messages) {
        let [s, e] = m.range;
        // the unit holding the match start
        let lo = 0;
        let hi = starts.length - 1;
        while (lo < hi) {
          const mid = (lo + hi + 1) >> 1;
          if (starts[mid]! <= s) lo = mid;
          else hi = mid - 1;
        }
        const base = starts[lo]!;
        const text = texts[lo]!;
        const ctxStart = s - base;
        const ctxEnd = Math.min(e - base, text.length);
        const field = VALUE_FIELD[m.messageId];
        const value = field ? (m.data as Record<string, unknown> | undefined)?.[field] : undefined;
        if (typeof value === "string" && value.length > 0) {
          const at = content.indexOf(value, s);
          if (at >= 0 && at - s <= 1024) {
            s = at;
            e = at + value.length;
          }
        }
        const start = Math.max(0, s - base);
        let end = Math.min(e - base, text.length);
        if (URI_RULES.has(m.ruleId)) {
          // a URI ends at a quote, bracket or space after its credentials, and not on punctuation
          const span = text.slice(start, end);
          const at = span.lastIndexOf("@");
          const stop = span.slice(at + 1).search(/["'`<>\s]/);
          if (at >= 0 && stop >= 0) end = start + at + 1 + stop;
          const trail = TRAILING.exec(text.slice(start, end));
          if (trail && text.lastIndexOf("@", end - 1) < start + trail.index) end -= trail[0].length;
        }
        if (end <= start) continue;
        out[lo]!.push({
          start,
          end,
          rule: m.ruleId,
          priority: SECRETLINT_PRIORITY,
          ctxStart: Math.max(0, ctxStart),
          ctxEnd: Math.max(ctxEnd, end),
        });
      }
      return out;
    },
  };
}
