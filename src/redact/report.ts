/** The redaction report: counts only — never a secret, a part of one, or a hash of one. */
import type { RedactionReport, RuleCounts } from "./types.js";

export class ReportBuilder {
  private readonly redacted = new Map<string, Map<string, number>>();
  private readonly unredacted = new Map<string, Map<string, number>>();
  private bytes = 0;

  constructor(private readonly policy: string) {}

  /** Count one match of `rule` in `artifact`, rewritten (`redacted`) or only found. */
  add(artifact: string, rule: string, redacted: boolean, n = 1): void {
    const table = redacted ? this.redacted : this.unredacted;
    let counts = table.get(artifact);
    if (!counts) table.set(artifact, (counts = new Map()));
    counts.set(rule, (counts.get(rule) ?? 0) + n);
  }

  scanned(bytes: number): void {
    this.bytes += bytes;
  }

  report(): RedactionReport {
    const fired = new Set<string>();
    let totalRedacted = 0;
    let totalUnredacted = 0;
    const dump = (
      table: Map<string, Map<string, number>>,
      onCount: (n: number) => void,
    ): Record<string, RuleCounts> => {
      const out: Record<string, RuleCounts> = {};
      for (const artifact of [...table.keys()].sort()) {
        const counts = table.get(artifact)!;
        const rc: RuleCounts = {};
        for (const rule of [...counts.keys()].sort()) {
          const n = counts.get(rule)!;
          rc[rule] = n;
          fired.add(rule);
          onCount(n);
        }
        out[artifact] = rc;
      }
      return out;
    };
    const redacted = dump(this.redacted, (n) => (totalRedacted += n));
    const unredacted = dump(this.unredacted, (n) => (totalUnredacted += n));
    return {
      policy: this.policy,
      rules_fired: [...fired].sort(),
      redacted,
      unredacted,
      total_redacted: totalRedacted,
      total_unredacted: totalUnredacted,
      bytes_scanned: this.bytes,
    };
  }
}

/** What a bundle's redaction report says was rewritten, for the layers a reader cares about. */
export interface RedactedSummary {
  /** Values replaced by `[REDACTED:<rule>]` placeholders. */
  total: number;
  /** Payload paths (`<layer>/<path>`) of the artifacts that hold them, sorted. */
  artifacts: string[];
  /** Rule ids that rewrote them, sorted. */
  rules: string[];
  /** Secrets found but kept as they are (git history, content-addressed blobs). */
  unredacted: number;
}

/**
 * Sum a manifest's redaction report (`redaction`, untrusted JSON: anything malformed counts as
 * nothing) over the layers in `layers` (every layer when absent).
 */
export function summarizeRedaction(report: unknown, layers?: ReadonlySet<string>): RedactedSummary {
  const artifacts: string[] = [];
  const rules = new Set<string>();
  let total = 0;
  let unredacted = 0;
  const table = (v: unknown): [string, Record<string, unknown>][] =>
    v !== null && typeof v === "object" && !Array.isArray(v)
      ? Object.entries(v as Record<string, unknown>).filter(
          (e): e is [string, Record<string, unknown>] =>
            (!layers || layers.has(e[0].split("/")[0]!)) &&
            e[1] !== null &&
            typeof e[1] === "object" &&
            !Array.isArray(e[1]),
        )
      : [];
  const counts = (c: Record<string, unknown>, each: (rule: string, n: number) => void): void => {
    for (const [rule, n] of Object.entries(c))
      if (Number.isSafeInteger(n) && (n as number) > 0) each(rule, n as number);
  };
  const r = report !== null && typeof report === "object" ? (report as Record<string, unknown>) : {};
  for (const [path, c] of table(r.redacted)) {
    let here = 0;
    counts(c, (rule, n) => {
      here += n;
      rules.add(rule);
    });
    if (here > 0) {
      artifacts.push(path);
      total += here;
    }
  }
  for (const [, c] of table(r.unredacted))
    counts(c, (_, n) => {
      unredacted += n;
    });
  return { total, artifacts: artifacts.sort(), rules: [...rules].sort(), unredacted };
}

/** `a/b, c/d and 3 more` */
export function listSome(items: readonly string[], max = 3): string {
  if (items.length <= max) return items.join(", ");
  return `${items.slice(0, max).join(", ")} and ${items.length - max} more`;
}
