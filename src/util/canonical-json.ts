/**
 * Canonical JSON for the manifest seal: object keys sorted by code point, no whitespace,
 * JSON.stringify's escaping for strings and numbers. The manifest holds only strings,
 * safe integers, booleans, null, arrays and objects, so this is unambiguous.
 */
export function canonicalJson(value: unknown): string {
  if (value === null || typeof value !== "object") {
    if (typeof value === "number" && !Number.isFinite(value)) throw new TypeError("non-finite number in canonical JSON");
    const s = JSON.stringify(value);
    if (s === undefined) throw new TypeError(`cannot encode ${typeof value} in canonical JSON`);
    return s;
  }
  if (Array.isArray(value)) return `[${value.map(canonicalJson).join(",")}]`;
  const obj = value as Record<string, unknown>;
  const keys = Object.keys(obj).filter((k) => obj[k] !== undefined).sort();
  return `{${keys.map((k) => `${JSON.stringify(k)}:${canonicalJson(obj[k])}`).join(",")}}`;
}
