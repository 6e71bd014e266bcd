/** Store operations built on listing: prune (with the agent's store lock) and diff. */
import { MemsnapError } from "../errors.js";
import { readLayout } from "../format/container.js";
import type { IndexEntry, Manifest } from "../format/manifest.js";
import { readPayload, type Keys } from "../pipeline/read-payload.js";
import { acquireLock } from "../restore/lock.js";
import { removeOrphans } from "./orphans.js";
import { decide, type PruneDecision, type RetentionPolicy } from "./prune.js";
import { agentDir, listSnapshots, type StoredSnapshot } from "./store.js";
import { unlink } from "node:fs/promises";

export interface PruneResult {
  tenant: string;
  agent: string;
  decisions: PruneDecision[];
  removed: string[];
  orphans: string[];
}

/**
 * Apply a retention policy to every agent in the store (or one). Each agent is pruned under
 * its store lock; leftovers of dead memsnap processes older than `orphanMinAgeMs` are removed,
 * never those of a live process.
 */
export async function pruneStore(store: string, policy: RetentionPolicy, opts: { tenant?: string; agent?: string; dryRun?: boolean; orphanMinAgeMs?: number; waitMs?: number } = {}): Promise<PruneResult[]> {
  const all = await listSnapshots(store, { ...(opts.tenant ? { tenant: opts.tenant } : {}), ...(opts.agent ? { agent: opts.agent } : {}) });
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
    const lock = await acquireLock(dir, { waitMs: opts.waitMs ?? 10_000, command: "prune" });
    try {
      // Re-list under the lock: another process may have added or removed snapshots.
      const fresh = await listSnapshots(store, { tenant, agent });
      const decisions = decide(fresh, policy);
      const removed: string[] = [];
      for (const d of decisions) {
        if (d.keep) continue;
        await unlink(d.snapshot.path).catch((e: NodeJS.ErrnoException) => { if (e.code !== "ENOENT") throw e; });
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

export interface LayerDiff {
  layer: string;
  kind: string;
  added: { path: string; size: number }[];
  removed: { path: string; size: number }[];
  changed: { path: string; from: number; to: number }[];
  unchanged: number;
  notes: string[];
}

/**
 * The artifact index of a snapshot: from the manifest, or by reading the payload (with a key
 * when it is encrypted; a plaintext manifest leaves out an index of over MANIFEST_INDEX_MAX
 * artifacts). Throws MEMSNAP_IDENTITY_REQUIRED.
 */
export async function indexOf(s: StoredSnapshot, keys: Keys): Promise<IndexEntry[]> {
  if (s.manifest.index) return s.manifest.index;
  if (s.manifest.payload.encryption !== null && !(keys.identities?.length || keys.passphrases?.length)) {
    throw new MemsnapError("MEMSNAP_IDENTITY_REQUIRED", `snapshot ${s.id} is encrypted: its file list needs the key`, { hint: "pass --identity FILE" });
  }
  const layout = await readLayout(s.path);
  const r = await readPayload(layout, s.manifest, keys, async () => undefined);
  if (!r.index) throw new MemsnapError("MEMSNAP_INDEX_MISMATCH", `snapshot ${s.id} has no readable index`);
  return r.index.artifacts;
}

function meta(m: Manifest, layer: string): Record<string, unknown> {
  return (m.layers.find((l) => l.name === layer)?.meta ?? {}) as Record<string, unknown>;
}

/** Per-layer differences between two snapshots (A → B), plus git/SQLite/KV facts from the layer meta. */
export async function diffSnapshots(a: StoredSnapshot, b: StoredSnapshot, keys: Keys): Promise<LayerDiff[]> {
  const [ia, ib] = [await indexOf(a, keys), await indexOf(b, keys)];
  const layers = [...new Set([...a.manifest.layers, ...b.manifest.layers].map((l) => `${l.name}\0${l.kind}`))].map((k) => k.split("\0") as [string, string]);
  const out: LayerDiff[] = [];
  for (const [layer, kind] of layers) {
    const ma = new Map(ia.filter((e) => e.layer === layer).map((e) => [e.path, e]));
    const mb = new Map(ib.filter((e) => e.layer === layer).map((e) => [e.path, e]));
    const d: LayerDiff = { layer, kind, added: [], removed: [], changed: [], unchanged: 0, notes: [] };
    for (const [p, e] of mb) {
      const o = ma.get(p);
      if (!o) d.added.push({ path: p, size: e.size });
      else if (o.sha256 !== e.sha256) d.changed.push({ path: p, from: o.size, to: e.size });
      else d.unchanged++;
    }
    for (const [p, e] of ma) if (!mb.has(p)) d.removed.push({ path: p, size: e.size });
    const [xa, xb] = [meta(a.manifest, layer), meta(b.manifest, layer)];
    if (kind === "git") {
      const ha = (xa.head as { oid?: string; subject?: string } | undefined) ?? {};
      const hb = (xb.head as { oid?: string; subject?: string } | undefined) ?? {};
      const oa = ha.oid ?? (xa.head_oid as string | undefined);
      const ob = hb.oid ?? (xb.head_oid as string | undefined);
      d.notes.push(oa === ob ? `HEAD unchanged at ${String(oa ?? "-").slice(0, 12)}` : `HEAD ${String(oa ?? "-").slice(0, 12)} → ${String(ob ?? "-").slice(0, 12)}${hb.subject ? ` (${hb.subject})` : ""}`);
      if (typeof xa.commits === "number" && typeof xb.commits === "number") d.notes.push(`commits ${xa.commits} → ${xb.commits} (${xb.commits - xa.commits >= 0 ? "+" : ""}${xb.commits - xa.commits})`);
    }
    if (kind === "sqlite") {
      const da = (xa.databases ?? {}) as Record<string, { tables?: Record<string, number> }>;
      const db = (xb.databases ?? {}) as Record<string, { tables?: Record<string, number> }>;
      for (const name of new Set([...Object.keys(da), ...Object.keys(db)])) {
        const ta = da[name]?.tables ?? {};
        const tb = db[name]?.tables ?? {};
        const parts = [...new Set([...Object.keys(ta), ...Object.keys(tb)])].map((t) => {
          const x = ta[t] ?? 0;
          const y = tb[t] ?? 0;
          return `${t} ${y - x >= 0 ? "+" : ""}${y - x}`;
        });
        d.notes.push(`${name}: rows ${parts.join(", ") || "(none)"}`);
      }
    }
    if (kind === "kv") {
      const pa = new Set(ia.filter((e) => e.layer === layer && /\/pages?\//.test(e.path)).map((e) => e.sha256));
      const pb = ib.filter((e) => e.layer === layer && /\/pages?\//.test(e.path)).map((e) => e.sha256);
      const shared = pb.filter((h) => pa.has(h)).length;
      d.notes.push(`pages: ${shared} shared, ${pb.length - shared} new`);
    }
    out.push(d);
  }
  return out;
}

