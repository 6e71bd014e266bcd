import { MemsnapError } from "../errors.js";

/** Parse a duration like `30s`, `2m`, `500ms`, `1h`, `7d` or a number of seconds. Throws MEMSNAP_USAGE. */
export function parseDuration(s: string): number {
  const m = /^(\d+(?:\.\d+)?)(ms|s|m|h|d)?$/.exec(s.trim());
  if (!m)
    throw new MemsnapError("MEMSNAP_USAGE", `bad duration ${JSON.stringify(s)}`, {
      hint: "use e.g. 30s, 2m, 500ms, 1h, 7d",
    });
  const n = Number(m[1]);
  const unit = m[2] ?? "s";
  return Math.round(
    n * (unit === "ms" ? 1 : unit === "s" ? 1000 : unit === "m" ? 60_000 : unit === "h" ? 3_600_000 : 86_400_000),
  );
}
