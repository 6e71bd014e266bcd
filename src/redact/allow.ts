/**
 * The allow-list: `redaction.allow` entries that mark false positives. An entry is a literal
 * string, or a regex written `/source/flags` (flags from `imsu`). A match is kept (not
 * redacted) when a literal equals its text, or a regex finds itself in its text — where "its
 * text" is the replaced span (the value of an assignment) or the rule's whole match
 * (`password=hunter2`).
 */
import { configInvalid } from "../util/config-check.js";

export type AllowMatcher = (span: string, context: string) => boolean;

const REGEX_ENTRY = /^\/(.+)\/([a-z]*)$/s;

/** Compile `/regex/flags` entries; throws MEMSNAP_CONFIG_INVALID on a bad one. */
export function compileAllow(entries: readonly string[], where: string): AllowMatcher {
  const literals = new Set<string>();
  const regexes: RegExp[] = [];
  for (const e of entries) {
    const m = REGEX_ENTRY.exec(e);
    if (!m) {
      literals.add(e);
      continue;
    }
    const flags = m[2]!;
    if (!/^[imsu]*$/.test(flags) || new Set(flags).size !== flags.length) {
      throw configInvalid(
        where,
        `allow entry ${JSON.stringify(e)}: regex flags must be some of "imsu" (got "${flags}")`,
      );
    }
    try {
      regexes.push(new RegExp(m[1]!, flags));
    } catch (err) {
      throw configInvalid(
        where,
        `allow entry ${JSON.stringify(e)} is not a valid regular expression: ${(err as Error).message}`,
      );
    }
  }
  if (literals.size === 0 && regexes.length === 0) return () => false;
  return (span, context) =>
    literals.has(span) ||
    literals.has(context) ||
    regexes.some((r) => r.test(span) || (context !== span && r.test(context)));
}
