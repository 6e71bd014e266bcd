/**
 * Retention: decide which snapshots to keep, restic-style, and say which rule kept each.
 *
 * keep-last N keeps the N newest; keep-hourly/daily/weekly/monthly/yearly N keep the newest
 * snapshot of each of the N most recent periods that have one; keep-within D keeps everything
 * within D of the newest snapshot; keep-label G keeps snapshots whose label matches a glob.
 * The newest snapshot is always kept (the delete floor), so prune never empties an agent.
 *
 * Some snapshots are protected before any rule is applied (they are kept, with the reason, and
 * do not count towards keep-last and the period rules):
 *  - a safety snapshot (created_by "pre-restore", label auto:pre-restore-…) younger than
 *    `safetyMs` (default 7 days): the undo of a restore;
 *  - a labelled snapshot (a label the user set: not an auto: label, not a scheduled snapshot's)
 *    unless a rule names it: `labels` (keep-label) keeps it, `pruneLabels` (prune-label) hands it
 *    to the rules like any other;
 *  - with `createdBy`, a snapshot made by anything else (a schedule prunes only its own
 *    snapshots and safety snapshots past their time).
 */
import { MemsnapError } from "../errors.js";
import { basesOf } from "../format/manifest.js";
import { compileGlobs } from "../util/glob.js";
import type { StoredSnapshot } from "./types.js";

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
  /** Labelled snapshots whose label matches one of these globs are decided by the rules (else kept). */
  pruneLabels?: string[];
  /** How long a safety snapshot is kept, in milliseconds (default 7 days; 0: no protection). */
  safetyMs?: number;
  /** Decide only over snapshots made by these (manifest created_by); the others are kept. */
  createdBy?: string[];
}

/** The default time a safety snapshot (auto:pre-restore-…) is kept. */
export const DEFAULT_SAFETY_MS = 7 * 86_400_000;

/** A safety snapshot: the one an in-place restore takes of the live state first. */
export function isSafety(s: { created_by: string; label: string | null }): boolean {
  return s.created_by === "pre-restore" || (s.label ?? "").startsWith("auto:pre-restore");
}

/** A label the user set: not an auto: label, and not the label a schedule gives its own snapshots. */
export function userLabel(s: { created_by: string; label: string | null }): string | null {
  if (s.label === null || s.label.startsWith("auto:") || s.created_by === "schedule" || s.created_by === "pre-restore")
    return null;
  return s.label;
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
  const { pruneLabels: _p, safetyMs: _s, createdBy: _c, ...rules } = p;
  return Object.values(rules).some((v) => (Array.isArray(v) ? v.length > 0 : v !== undefined));
}

/**
 * Decide for one agent's snapshots (any order). Throws MEMSNAP_USAGE for an empty policy
 * (it would delete everything but the newest).
 */
export function decide(snapshots: StoredSnapshot[], policy: RetentionPolicy, now = Date.now()): PruneDecision[] {
  if (!hasRules(policy)) {
    throw new MemsnapError("MEMSNAP_USAGE", "prune needs at least one keep rule", {
      hint: "e.g. --keep-last 10 --keep-daily 7 --keep-weekly 4",
    });
  }
  const all = [...snapshots].sort((a, b) => (a.id < b.id ? 1 : a.id > b.id ? -1 : 0));
  const reasons = new Map<string, string[]>(all.map((s) => [s.id, []]));
  const why = (s: StoredSnapshot, r: string): void => {
    reasons.get(s.id)!.push(r);
  };
  if (all[0]) why(all[0], "newest");
  // Protections first: what they keep is out of the rules' reach and does not count for them.
  const safetyMs = policy.safetyMs ?? DEFAULT_SAFETY_MS;
  const keepLabel = policy.labels?.length ? compileGlobs(policy.labels) : () => false;
  const pruneLabel = policy.pruneLabels?.length ? compileGlobs(policy.pruneLabels) : () => false;
  const newestFirst: StoredSnapshot[] = [];
  for (const s of all) {
    const age = now - Date.parse(s.created_at);
    const label = userLabel(s);
    if (isSafety(s) && age < safetyMs) {
      why(
        s,
        `safety snapshot, kept until ${new Date(Date.parse(s.created_at) + safetyMs).toISOString()} (--keep-safety)`,
      );
    } else if (label !== null && !keepLabel(label) && !pruneLabel(label)) {
      why(s, `labelled ${JSON.stringify(label)}: no rule names it (--keep-label/--prune-label)`);
    } else if (
      policy.createdBy &&
      !policy.createdBy.includes(s.created_by) &&
      !(isSafety(s) && policy.createdBy.includes("pre-restore"))
    ) {
      why(s, `made by ${s.created_by}, not decided here (--prune-all)`);
    } else {
      newestFirst.push(s);
    }
  }
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
    for (const s of newestFirst) if (s.label !== null && keepLabel(s.label)) why(s, `label ${s.label}`);
  }
  // An incremental snapshot's bases hold bytes it references: kept as long as it is (whatever
  // kept it, a protection included).
  const byId = new Map(all.map((s) => [s.id, s]));
  for (const s of all) {
    if (!reasons.get(s.id)!.length) continue;
    for (const b of basesOf(s.manifest)) if (byId.has(b.snapshot_id)) why(byId.get(b.snapshot_id)!, `base of ${s.id}`);
  }
  return all.map((s) => ({ snapshot: s, keep: reasons.get(s.id)!.length > 0, reasons: reasons.get(s.id)! }));
}
