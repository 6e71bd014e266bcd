/**
 * The memsnap.json `memsnap init` writes for a detection: JSON with comments, one commented
 * line per source; and the byte sizes init's text shows.
 */
import { MemsnapError } from "../errors.js";
import { ID_PATTERN } from "../format/manifest.js";
import type { Detection } from "./types.js";

/** Bytes in binary units, for init's text ("861 MiB"). */
export function fmtMiB(n: number): string {
  if (n < 1024) return `${n} B`;
  const units = ["KiB", "MiB", "GiB", "TiB"];
  let v = n / 1024;
  let i = 0;
  while (v >= 1024 && i < units.length - 1) {
    v /= 1024;
    i++;
  }
  return `${v < 10 ? v.toFixed(1) : Math.round(v)} ${units[i]}`;
}

/**
 * Render a commented memsnap.json for a detection. Throws MEMSNAP_USAGE for a bad agent/tenant id or when nothing was
 * found.
 */
export function renderConfig(d: Detection, opts: { agent: string; tenant: string; recipients?: string[] }): string {
  for (const [k, v] of [
    ["agent", opts.agent],
    ["tenant", opts.tenant],
  ] as const) {
    if (!ID_PATTERN.test(v))
      throw new MemsnapError("MEMSNAP_USAGE", `${k} must match [a-z0-9_-]{1,64}, got ${JSON.stringify(v)}`, {
        hint: `pass --${k} NAME`,
      });
  }
  if (d.sources.length === 0) {
    throw new MemsnapError(
      "MEMSNAP_SOURCE_MISSING",
      `found no memdir, database, state, notes, logs, traces or runtime dump under ${d.home}`,
      {
        path: d.home,
        hint: "point init at the agent's home, or write memsnap.json by hand (see README)",
      },
    );
  }
  const lines: string[] = [
    "// memsnap.json, written by `memsnap init`. JSON with comments; unknown keys are errors.",
    "// Edit freely: see the README's Configuration section for every key.",
    "{",
    `  "tenant": ${JSON.stringify(opts.tenant)},`,
    `  "agent": ${JSON.stringify(opts.agent)},`,
    "  // Encrypt every snapshot to these age recipients (memsnap keygen -o key.txt prints one).",
    `  "recipients": ${JSON.stringify(opts.recipients ?? [])},`,
    "  // Secrets in text artifacts are replaced by [REDACTED:<rule>] in the bundle; live files are untouched.",
    '  "redaction": { "enabled": true, "allow": [] },',
    '  "compression": { "level": 3 },',
    '  "sources": [',
  ];
  d.sources.forEach((s, i) => {
    lines.push(`    // ${s.note}`);
    const obj: Record<string, unknown> =
      s.kind === "pfimg" ? { kind: s.kind, name: s.name } : { kind: s.kind, name: s.name, path: s.path };
    if (s.extra) Object.assign(obj, s.extra);
    if (s.include) obj.include = s.include;
    if (s.exclude) obj.exclude = s.exclude;
    if (s.append) obj.append = s.append;
    lines.push(
      `    ${JSON.stringify(obj).replace(/,"/g, ', "').replace(/":/g, '": ')}${i < d.sources.length - 1 ? "," : ""}`,
    );
  });
  lines.push("  ]", "}", "");
  return lines.join("\n");
}
