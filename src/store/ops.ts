/** Store operations built on listing: prune (with the agent's store lock) and diff (./diff.ts). */
import { acquireLock } from "../agent/lock.js";
import { removeOrphans } from "../agent/orphans.js";
import { decide, type PruneDecision, type RetentionPolicy } from "./prune.js";
import { agentDir, listSnapshots, type StoredSnapshot } from "./store.js";
import { unlink } from "node:fs/promises";
import { isS3Url } from "../objstore/location.js";

/** How long an s3 prune waits before deleting what it condemned, and before aborting an incomplete upload. */
export const DEFAULT_S3_GRACE_MS = 24 * 3_600_000;

export interface PruneResult {
  tenant: string;
  agent: string;
  decisions: PruneDecision[];
  removed: string[];
  orphans: string[];
  /** s3 stores: snapshots condemned by this prune, deleted by a prune once `graceMs` has passed (./s3/store.ts). */
  condemned?: string[];
  /** s3 stores: incomplete multipart uploads aborted. */
  uploads?: string[];
}

/**
 * Apply a retention policy to every agent in the store (or one). Each agent is pruned under
 * its store lock; leftovers of dead memsnap processes older than `orphanMinAgeMs` are removed,
 * never those of a live process.
 */
export async function pruneStore(
  store: string,
  policy: RetentionPolicy,
  opts: {
    tenant?: string;
    agent?: string;
    dryRun?: boolean;
    orphanMinAgeMs?: number;
    waitMs?: number;
    graceMs?: number;
  } = {},
): Promise<PruneResult[]> {
  const all = await listSnapshots(store, {
    ...(opts.tenant ? { tenant: opts.tenant } : {}),
    ...(opts.agent ? { agent: opts.agent } : {}),
  });
  const agents = new Map<string, StoredSnapshot[]>();
  for (const s of all) agents.set(`${s.tenant}/${s.agent}`, [...(agents.get(`${s.tenant}/${s.agent}`) ?? []), s]);
  const out: PruneResult[] = [];
  for (const [key, snaps] of agents) {
    const [tenant, agent] = key.split("/") as [string, string];
    const dir = agentDir(store, tenant, agent);
    if (opts.dryRun) {
      out.push({ tenant, agent, decisions: decide(snaps, policy), removed: [], orphans: [] });
      continue;
    }
    if (isS3Url(store)) {
      const { s3PruneAgent } = await import("./s3/store.js");
      const r = await s3PruneAgent(store, tenant, agent, policy, {
        graceMs: opts.graceMs ?? DEFAULT_S3_GRACE_MS,
        ...(opts.waitMs !== undefined ? { waitMs: opts.waitMs } : {}),
      });
      out.push({
        tenant,
        agent,
        decisions: r.decisions,
        removed: r.removed,
        orphans: [],
        condemned: r.condemned,
        uploads: r.uploads,
      });
      continue;
    }
    const lock = await acquireLock(dir, { waitMs: opts.waitMs ?? 10_000, command: "prune" });
    try {
      // Re-list under the lock: another process may have added or removed snapshots.
      const fresh = await listSnapshots(store, { tenant, agent });
      const decisions = decide(fresh, policy);
      const removed: string[] = [];
      for (const d of decisions) {
        if (d.keep) continue;
        await unlink(d.snapshot.path).catch((e: NodeJS.ErrnoException) => {
          if (e.code !== "ENOENT") throw e;
        });
        removed.push(d.snapshot.path);
      }
      const orphans = await removeOrphans(dir, opts.orphanMinAgeMs ?? 15 * 60_000);
      out.push({ tenant, agent, decisions, removed, orphans });
    } finally {
      await lock.release();
    }
  }
  return out;
}

export { diffSnapshots, indexOf, type LayerDiff, type GitDiff, type SqliteDiff } from "./diff.js";
