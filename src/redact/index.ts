/** Redaction entry point. Placeholder until the redactor lands: redaction config parses, and `enabled: false` is honoured. */
import { optBool, optStringArray, rejectUnknownKeys } from "../util/config-check.js";
import type { Redactor } from "./types.js";

export interface RedactionConfig {
  enabled: boolean;
  /** Literal strings or /regex/ patterns whose matches are never redacted (false positives). */
  allow: string[];
}

/** Parse the config's `redaction` object. Throws MEMSNAP_CONFIG_INVALID / _UNKNOWN_KEY. */
export function parseRedactionConfig(raw: Record<string, unknown> | undefined, where: string): RedactionConfig {
  if (raw === undefined) return { enabled: true, allow: [] };
  rejectUnknownKeys(raw, ["enabled", "allow"], where);
  return { enabled: optBool(raw, "enabled", where) ?? true, allow: optStringArray(raw, "allow", where) ?? [] };
}

/** Create a redactor for one snapshot; spool files go under `tmpDir`. */
export async function createRedactor(cfg: RedactionConfig, tmpDir: string): Promise<Redactor | undefined> {
  void tmpDir;
  void cfg;
  return undefined;
}
