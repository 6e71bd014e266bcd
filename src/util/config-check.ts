/** Small validators shared by the config parser and every source kind's parseConfig. */
import { MemsnapError } from "../errors.js";

const invalid = (where: string, msg: string): MemsnapError =>
  new MemsnapError("MEMSNAP_CONFIG_INVALID", `${where}: ${msg}`, {
    hint: "fix memsnap.json; see README 'Configuration'",
  });

/** Throw MEMSNAP_CONFIG_UNKNOWN_KEY for any key of `raw` not in `allowed`. */
export function rejectUnknownKeys(raw: Record<string, unknown>, allowed: readonly string[], where: string): void {
  for (const k of Object.keys(raw)) {
    if (!allowed.includes(k)) {
      throw new MemsnapError("MEMSNAP_CONFIG_UNKNOWN_KEY", `${where}: unknown key "${k}"`, {
        hint: `allowed keys here: ${allowed.join(", ")}`,
      });
    }
  }
}

export function reqString(raw: Record<string, unknown>, key: string, where: string): string {
  const v = raw[key];
  if (typeof v !== "string" || v === "") throw invalid(where, `"${key}" must be a non-empty string`);
  return v;
}

export function optString(raw: Record<string, unknown>, key: string, where: string): string | undefined {
  const v = raw[key];
  if (v === undefined) return undefined;
  if (typeof v !== "string" || v === "") throw invalid(where, `"${key}" must be a non-empty string`);
  return v;
}

export function optStringArray(raw: Record<string, unknown>, key: string, where: string): string[] | undefined {
  const v = raw[key];
  if (v === undefined) return undefined;
  if (!Array.isArray(v) || !v.every((x) => typeof x === "string" && x !== "")) {
    throw invalid(where, `"${key}" must be an array of non-empty strings`);
  }
  return v as string[];
}

export function optInt(
  raw: Record<string, unknown>,
  key: string,
  where: string,
  min: number,
  max: number,
): number | undefined {
  const v = raw[key];
  if (v === undefined) return undefined;
  if (!Number.isSafeInteger(v) || (v as number) < min || (v as number) > max) {
    throw invalid(where, `"${key}" must be an integer from ${min} to ${max}`);
  }
  return v as number;
}

export function optBool(raw: Record<string, unknown>, key: string, where: string): boolean | undefined {
  const v = raw[key];
  if (v === undefined) return undefined;
  if (typeof v !== "boolean") throw invalid(where, `"${key}" must be true or false`);
  return v;
}

export function isPlainObject(v: unknown): v is Record<string, unknown> {
  return typeof v === "object" && v !== null && !Array.isArray(v);
}

export { invalid as configInvalid };
