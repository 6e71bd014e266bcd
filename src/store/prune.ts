/**
 * Retention: decide which snapshots to keep, restic-style, and say which rule kept each.
 *
 * keep-last N keeps the N newest; keep-hourly/daily/weekly/monthly/yearly N keep the newest
 * snapshot of each of the N most recent periods that have one; keep-within D keeps everything
 * within D of the newest snapshot; keep-label G keeps snapshots whose label matches a glob.
 * The newest snapshot is always kept (the delete floor), so prune never empties an agent.
 */
import { MemsnapError } from "../errors.js";
import { basesOf } from "../format/manifest.js";
import { compileGlobs } from "../util/glob.js";
import type { StoredSnapshot } from "./store.js";

export interface RetentionPolicy {
  last?: number;
  hourly?: number;
  daily?: number;
  weekly?: number;
  monthly?: number;
  yearly?: number;
  /** Milliseconds. */
  within?: number;
  labels?: string[];
}

export interface PruneDecision {
  snapshot: StoredSnapshot;
  keep: boolean;
  /** The rules that kept it (empty when it is removed). */
  reasons: string[];
}

const pad = (n: number): string => String(n).padStart(2, "0");

function isoWeek(d: Date): string {
  const t = new Date(Date.UTC(d.getUTCFullYear(), d.getUTCMonth(), d.getUTCDate()));
  const day = t.getUTCDay() || 7;
  t.setUTCDate(t.getUTCDate() + 4 - day);
  const year = t.getUTCFullYear();
  const week = Math.ceil(((t.getTime() - Date.UTC(year, 0, 1)) / 86_400_000 + 1) / 7);
  return `${year}-W${pad(week)}`;
}

const PERIODS: [keyof RetentionPolicy, (d: Date) => string][] = [
  ["hourly", (d) => `${d.getUTCFullYear()}-${pad(d.getUTCMonth() + 1)}-${pad(d.getUTCDate())}T${pad(d.getUTCHours())}`],
  ["daily", (d) => `${d.getUTCFullYear()}-${pad(d.getUTCMonth() + 1)}-${pad(d.getUTCDate())}`],
  ["weekly", isoWeek],
  ["monthly", (d) => `${d.getUTCFullYear()}-${pad(d.getUTCMonth() + 1)}`],
  ["yearly", (d) => `${d.getUTCFullYear()}`],
];

/** True when the policy has at least one keep rule. */
export function hasRules(p: RetentionPolicy): boolean {
  return Object.values(p).some((v) => (Array.isArray(v) ? v.length > 0 : v !== undefined));
}

/**
 * Decide for one agent's snapshots (any order). Throws MEMSNAP_USAGE for an empty policy
 * (it would delete everything but the newest).
 */
export function decide(snapshots: StoredSnapshot[], policy: RetentionPolicy): PruneDecision[] {
  if (!hasRules(policy)) {
    throw new MemsnapError("MEMSNAP_USAGE", "prune needs at least one keep rule", {
      hint: "e.g. --keep-last 10 --keep-daily 7 --keep-weekly 4",
    });
  }
  const newestFirst = [...snapshots].sort((a, b) => (a.id < b.id ? 1 : a.id > b.id ? -1 : 0));
  const reasons = new Map<string, string[]>(newestFirst.map((s) => [s.id, []]));
  const why = (s: StoredSnapshot, r: string): void => { reasons.get(s.id)!.push(r); };
  if (newestFirst[0]) why(newestFirst[0], "newest");
  newestFirst.slice(0, policy.last ?? 0).forEach((s, i) => why(s, `last ${i + 1}/${policy.last}`));
  for (const [rule, bucket] of PERIODS) {
    const n = policy[rule] as number | undefined;
    if (!n) continue;
    const seen = new Set<string>();
    for (const s of newestFirst) {
      if (seen.size >= n) break;
      const b = bucket(new Date(s.created_at));
      if (seen.has(b)) continue;
      seen.add(b);
      why(s, `${rule} ${b}`);
    }
  }
  if (policy.within !== undefined && newestFirst[0]) {
    const newest = Date.parse(newestFirst[0].created_at);
    for (const s of newestFirst) if (newest - Date.parse(s.created_at) <= policy.within) why(s, "within");
  }
  if (policy.labels?.length) {
    const m = compileGlobs(policy.labels);
    for (const s of newestFirst) if (s.label !== null && m(s.label)) why(s, `label ${s.label}`);
  }
  // An incremental snapshot's bases hold bytes it references: kept as long as it is.
  const byId = new Map(newestFirst.map((s) => [s.id, s]));
  for (const s of newestFirst) {
    if (!reasons.get(s.id)!.length) continue;
    for (const b of basesOf(s.manifest)) if (byId.has(b.snapshot_id)) why(byId.get(b.snapshot_id)!, `base of ${s.id}`);
  }
  return newestFirst.map((s) => ({ snapshot: s, keep: reasons.get(s.id)!.length > 0, reasons: reasons.get(s.id)! }));
}
