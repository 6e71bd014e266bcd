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
    const dump = (table: Map<string, Map<string, number>>, onCount: (n: number) => void): Record<string, RuleCounts> => {
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
