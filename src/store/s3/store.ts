/**
 * The store functions of ../store.ts and ../ops.ts over an S3 store (`s3://bucket/prefix`):
 * objects `<prefix>/<tenant>/<agent>/<ULID>.memsnap`, the local layout, so that `memsnap copy`
 * maps one onto the other. A bundle's path is its URL; everything that reads a bundle opens
 * it through format/bundle-file.ts.
 *
 * Writers (snapshot, copy) only ever PUT new keys (a ULID each) and never delete or overwrite,
 * so hosts with credentials that cannot delete keep an append-only history. `delete` and
 * `prune` are the only commands that delete. Before their first delete they probe the
 * permission with a DeleteObject of a key that does not exist (S3 answers 204 when deleting is
 * allowed, AccessDenied when not): without it they fail with MEMSNAP_STORE_DENIED having
 * changed nothing.
 *
 * Concurrency (the server here has no conditional PUT, so nothing relies on create-only writes):
 *
 * - Two snapshots of the same agent never touch the same key, and a snapshot becomes visible
 *   only whole (a completed upload). A prune decides on one listing; a snapshot that completes
 *   later is not in it and is never deleted by that prune.
 * - The one hazard is a snapshot in flight that references an old bundle as a base (an
 *   incremental snapshot) while a prune deletes that base. So prune deletes in two phases:
 *   a snapshot the policy does not keep is first *condemned* (a marker object
 *   `<tenant>/<agent>/.memsnap/condemned/<ID>` holding the time), and deleted by a later prune
 *   only once it has been condemned for the grace period (`--grace`, default 24 h) and is still
 *   not kept nor the base of a kept snapshot in a fresh listing taken under the lease. Writers
 *   that start after the marker do not use a condemned bundle as a base (snapshot/incremental.ts
 *   reads the markers); a writer that started before it has completed within the grace period
 *   (the assumption: no snapshot takes longer than the grace), so its snapshot is in the fresh
 *   listing and keeps its bases. A condemned snapshot that is kept again (a new incremental
 *   needs it) loses its marker. `--grace 0` deletes at once (one host, no concurrent writers).
 * - Prunes of the same agent exclude each other with a lease object
 *   `<tenant>/<agent>/.memsnap/prune-lease/<ULID>.json` that expires (10 minutes, renewed
 *   while pruning): a prune writes its lease, lists the leases, and goes on only if its own is
 *   the oldest unexpired one; otherwise it removes its lease and waits or fails MEMSNAP_LOCKED.
 *   Two prunes that write at the same moment both see both leases, and the older ULID wins.
 * - Incomplete multipart uploads (a writer that crashed) older than the grace are aborted.
 */
import {
  AbortMultipartUploadCommand,
  DeleteObjectCommand,
  ListMultipartUploadsCommand,
  ListObjectsV2Command,
  PutObjectCommand,
  type S3Client,
} from "@aws-sdk/client-s3";
import { hostname } from "node:os";
import { MemsnapError } from "../../errors.js";
import { layoutOf } from "../../format/container.js";
import { openBundle } from "../../format/bundle-file.js";
import { basesOf, ID_PATTERN, parseManifest } from "../../format/manifest.js";
import { isUlid, ulid } from "../../util/ulid.js";
import { decide, type PruneDecision, type RetentionPolicy } from "../prune.js";
import { storedSnapshot, type StoredSnapshot } from "../types.js";
import { s3Error } from "../../objstore/client.js";
import { parseStoreLocation, s3Key } from "../../objstore/location.js";
import { clientFor } from "../../objstore/object-reader.js";

type S3Loc = { bucket: string; prefix: string; url: string };

/** The s3 location of a store URL (already checked by resolveStore). */
export function s3Loc(store: string): S3Loc {
  const loc = parseStoreLocation(store);
  if (loc.kind !== "s3") throw new MemsnapError("MEMSNAP_INTERNAL", `${store} is not an s3 store`);
  return loc;
}

/** An agent's key prefix URL, `s3://bucket/prefix/tenant/agent` (agentDir's counterpart). */
export function s3AgentDir(store: string, tenant: string, agent: string): string {
  const loc = s3Loc(store);
  return `s3://${loc.bucket}/${s3Key(loc, `${tenant}/${agent}`)}`;
}

const urlOf = (bucket: string, key: string): string => `s3://${bucket}/${key}`;

/** Every object under `prefix` (ListObjectsV2, page by page). */
type Listed = { key: string; size: number; modified: Date | null };

async function* listKeys(client: S3Client, bucket: string, prefix: string): AsyncGenerator<Listed> {
  let token: string | undefined;
  do {
    let r;
    try {
      const input = { Bucket: bucket, Prefix: prefix, ...(token ? { ContinuationToken: token } : {}) };
      r = await client.send(new ListObjectsV2Command(input));
    } catch (e) {
      throw s3Error(e, `listing s3://${bucket}/${prefix}`);
    }
    for (const o of r.Contents ?? []) {
      if (o.Key) yield { key: o.Key, size: o.Size ?? 0, modified: o.LastModified ?? null };
    }
    token = r.IsTruncated ? r.NextContinuationToken : undefined;
  } while (token);
}

/** The bundle objects of a store (optionally one tenant/agent), by tenant, agent and id, with their sizes. */
type Filter = { tenant?: string; agent?: string };

export async function s3BundleObjects(store: string, filter: Filter = {}): Promise<{ url: string; size: number }[]> {
  const loc = s3Loc(store);
  const client = clientFor(loc.bucket);
  const base = loc.prefix ? `${loc.prefix}/` : "";
  const narrow = filter.tenant ? `${filter.tenant}/${filter.agent ? `${filter.agent}/` : ""}` : "";
  const out: { url: string; size: number; rel: string }[] = [];
  for await (const o of listKeys(client, loc.bucket, base + narrow)) {
    const parts = o.key.slice(base.length).split("/");
    if (parts.length !== 3) continue;
    const [t, a, name] = parts as [string, string, string];
    if (!ID_PATTERN.test(t) || !ID_PATTERN.test(a)) continue;
    if (!name.endsWith(".memsnap") || !isUlid(name.slice(0, -8))) continue;
    if ((filter.tenant && t !== filter.tenant) || (filter.agent && a !== filter.agent)) continue;
    out.push({ url: urlOf(loc.bucket, o.key), size: o.size, rel: `${t}\0${a}\0${name}` });
  }
  return out.sort((x, y) => (x.rel < y.rel ? -1 : x.rel > y.rel ? 1 : 0)).map(({ url, size }) => ({ url, size }));
}

/** How many manifests are read at once when listing. */
const LIST_CONCURRENCY = 8;

/** listSnapshots over an s3 store: each manifest through ranged reads. */
export async function s3ListSnapshots(
  store: string,
  filter: Filter = {},
  onBad?: (path: string, e: unknown) => void,
): Promise<StoredSnapshot[]> {
  const objects = await s3BundleObjects(store, filter);
  const out: (StoredSnapshot | null)[] = new Array(objects.length).fill(null);
  let next = 0;
  const work = async (): Promise<void> => {
    while (next < objects.length) {
      const i = next++;
      const { url, size } = objects[i]!;
      try {
        const f = await openBundle(url, size);
        try {
          const layout = await layoutOf(f);
          const m = parseManifest(layout.manifestBytes);
          out[i] = storedSnapshot(url, layout, m);
        } finally {
          await f.close();
        }
      } catch (e) {
        // The store itself failing (unreachable, denied) is not one bad bundle.
        if (e instanceof MemsnapError && e.code.startsWith("MEMSNAP_STORE_")) throw e;
        onBad?.(url, e);
      }
    }
  };
  await Promise.all(Array.from({ length: Math.min(LIST_CONCURRENCY, objects.length) }, work));
  return (out.filter((s) => s !== null) as StoredSnapshot[]).sort((a, b) => (a.id < b.id ? -1 : a.id > b.id ? 1 : 0));
}

async function deleteKey(client: S3Client, bucket: string, key: string): Promise<void> {
  try {
    await client.send(new DeleteObjectCommand({ Bucket: bucket, Key: key }));
  } catch (e) {
    const x = e as { name?: string; $metadata?: { httpStatusCode?: number } };
    if (x.name === "NoSuchKey" || x.$metadata?.httpStatusCode === 404) return;
    throw s3Error(e, `deleting s3://${bucket}/${key}`);
  }
}

/**
 * Check that these credentials may delete, by deleting a key that does not exist (nothing
 * changes either way). Throws MEMSNAP_STORE_DENIED with a hint for append-only credentials.
 */
export async function probeDelete(store: string, what: string): Promise<void> {
  const loc = s3Loc(store);
  const key = s3Key(loc, `.memsnap-delete-probe-${ulid()}`);
  try {
    await deleteKey(clientFor(loc.bucket), loc.bucket, key);
  } catch (e) {
    if (e instanceof MemsnapError && e.code === "MEMSNAP_STORE_DENIED") {
      const msg = `${what}: these credentials may not delete in ${loc.url}; nothing was deleted`;
      throw new MemsnapError("MEMSNAP_STORE_DENIED", msg, {
        hint:
          "snapshot, verify and restore need no delete permission, prune and delete do: " +
          "run them with credentials " +
          "that have s3:DeleteObject (and s3:AbortMultipartUpload, s3:ListBucketMultipartUploads)",
        cause: e,
      });
    }
    throw e;
  }
}

/** Delete bundle objects (already checked by the caller). */
export async function s3DeleteBundles(store: string, urls: string[]): Promise<void> {
  if (!urls.length) return;
  await probeDelete(store, "delete");
  const loc = s3Loc(store);
  for (const u of urls) {
    const { prefix: key } = parseStoreLocation(u) as S3Loc;
    await deleteKey(clientFor(loc.bucket), loc.bucket, key);
  }
}

// ------------------------------------------------------------------ prune: lease, condemned markers

const LEASE_MS = 10 * 60_000;
const control = (store: string, tenant: string, agent: string, rel: string): { bucket: string; key: string } => {
  const loc = s3Loc(store);
  return { bucket: loc.bucket, key: s3Key(loc, `${tenant}/${agent}/.memsnap/${rel}`) };
};

async function putJson(client: S3Client, bucket: string, key: string, v: unknown): Promise<void> {
  try {
    const input = { Bucket: bucket, Key: key, Body: JSON.stringify(v), ContentType: "application/json" };
    await client.send(new PutObjectCommand(input));
  } catch (e) {
    throw s3Error(e, `writing s3://${bucket}/${key}`);
  }
}

/** The ids condemned by a prune (see above), with when: a snapshot writer skips them as bases. */
export async function condemnedIds(agentUrl: string): Promise<Map<string, number>> {
  const loc = s3Loc(agentUrl);
  const prefix = `${loc.prefix}/.memsnap/condemned/`;
  const out = new Map<string, number>();
  for await (const o of listKeys(clientFor(loc.bucket), loc.bucket, prefix)) {
    const id = o.key.slice(prefix.length);
    if (isUlid(id)) out.set(id, o.modified?.getTime() ?? 0);
  }
  return out;
}

/** A prune's lease on one agent (see above). */
type Lease = { release(): Promise<void>; renew(): Promise<void> };

async function takeLease(store: string, tenant: string, agent: string, waitMs: number): Promise<Lease> {
  const { bucket, key: dir } = control(store, tenant, agent, "prune-lease/");
  const client = clientFor(bucket);
  const deadline = Date.now() + waitMs;
  for (;;) {
    const id = ulid();
    const mine = `${dir}${id}.json`;
    const info = { host: hostname(), pid: process.pid, started_at: new Date().toISOString(), command: "prune" };
    await putJson(client, bucket, mine, { ...info, expires_at: Date.now() + LEASE_MS });
    const held: { id: string; key: string; modified: number }[] = [];
    for await (const o of listKeys(client, bucket, dir)) {
      const other = o.key.slice(dir.length).replace(/\.json$/, "");
      if (!isUlid(other)) continue;
      // A lease is live for LEASE_MS after it was last written (renewals rewrite it).
      const at = o.modified?.getTime() ?? 0;
      if (other !== id && Date.now() - at > LEASE_MS) {
        await deleteKey(client, bucket, o.key); // expired: its prune died
        continue;
      }
      held.push({ id: other, key: o.key, modified: at });
    }
    held.sort((a, b) => (a.id < b.id ? -1 : 1));
    if (held[0]?.id === id || held.length === 0) {
      return {
        release: () => deleteKey(client, bucket, mine),
        renew: () => putJson(client, bucket, mine, { ...info, expires_at: Date.now() + LEASE_MS }),
      };
    }
    await deleteKey(client, bucket, mine);
    if (Date.now() >= deadline) {
      const msg = `another prune of ${tenant}/${agent} is running (lease s3://${bucket}/${held[0]!.key})`;
      throw new MemsnapError("MEMSNAP_LOCKED", msg, {
        hint:
          `wait for it to finish; the lease of a prune that died expires ${LEASE_MS / 60_000} minutes ` +
          "after it was written",
      });
    }
    await new Promise((r) => setTimeout(r, 200 + Math.random() * 300));
  }
}

export interface S3PruneResult {
  decisions: PruneDecision[];
  /** Deleted bundle URLs. */
  removed: string[];
  /** Condemned now (deleted by a prune once the grace has passed). */
  condemned: string[];
  /** Incomplete multipart uploads aborted (their keys). */
  uploads: string[];
}

/** Incomplete multipart uploads under the agent's prefix started more than `graceMs` ago: aborted. */
async function abortStaleUploads(store: string, tenant: string, agent: string, graceMs: number): Promise<string[]> {
  const loc = s3Loc(store);
  const client = clientFor(loc.bucket);
  const prefix = s3Key(loc, `${tenant}/${agent}/`);
  const out: string[] = [];
  let keyMarker: string | undefined;
  let idMarker: string | undefined;
  for (;;) {
    let r;
    try {
      r = await client.send(
        new ListMultipartUploadsCommand({
          Bucket: loc.bucket,
          Prefix: prefix,
          ...(keyMarker ? { KeyMarker: keyMarker } : {}),
          ...(idMarker ? { UploadIdMarker: idMarker } : {}),
        }),
      );
    } catch (e) {
      throw s3Error(e, `listing the incomplete uploads of ${urlOf(loc.bucket, prefix)}`);
    }
    for (const u of r.Uploads ?? []) {
      if (!u.Key || !u.UploadId || !u.Initiated || Date.now() - u.Initiated.getTime() < graceMs) continue;
      try {
        await client.send(new AbortMultipartUploadCommand({ Bucket: loc.bucket, Key: u.Key, UploadId: u.UploadId }));
      } catch (e) {
        const x = e as { name?: string };
        if (x.name !== "NoSuchUpload") throw s3Error(e, `aborting the upload of ${urlOf(loc.bucket, u.Key)}`);
      }
      out.push(urlOf(loc.bucket, u.Key));
    }
    if (!r.IsTruncated) return out;
    keyMarker = r.NextKeyMarker;
    idMarker = r.NextUploadIdMarker;
  }
}

/**
 * Prune one agent of an s3 store under its lease: condemn what the policy does not keep,
 * delete what was condemned at least `graceMs` ago and is still not kept, un-condemn what is
 * kept again, abort incomplete uploads older than `graceMs`.
 */
export async function s3PruneAgent(
  store: string,
  tenant: string,
  agent: string,
  policy: RetentionPolicy,
  opts: { graceMs: number; waitMs?: number },
): Promise<S3PruneResult> {
  await probeDelete(store, "prune");
  const lease = await takeLease(store, tenant, agent, opts.waitMs ?? 10_000);
  const loc = s3Loc(store);
  const client = clientFor(loc.bucket);
  try {
    // Listed under the lease: what another process added or removed before now is seen.
    const fresh = await s3ListSnapshots(store, { tenant, agent });
    const decisions = fresh.length ? decide(fresh, policy) : [];
    const condemnedAt = await condemnedIds(s3AgentDir(store, tenant, agent));
    const removed: string[] = [];
    const condemned: string[] = [];
    let lastRenew = Date.now();
    for (const d of decisions) {
      if (Date.now() - lastRenew > LEASE_MS / 3) {
        await lease.renew();
        lastRenew = Date.now();
      }
      const marker = control(store, tenant, agent, `condemned/${d.snapshot.id}`);
      const since = condemnedAt.get(d.snapshot.id);
      if (d.keep) {
        if (since !== undefined) await deleteKey(client, marker.bucket, marker.key);
        continue;
      }
      if (opts.graceMs > 0 && (since === undefined || Date.now() - since < opts.graceMs)) {
        const note = { snapshot_id: d.snapshot.id, condemned_at: new Date().toISOString() };
        if (since === undefined) await putJson(client, marker.bucket, marker.key, note);
        condemned.push(d.snapshot.path);
        continue;
      }
      await deleteKey(client, loc.bucket, (parseStoreLocation(d.snapshot.path) as S3Loc).prefix);
      if (since !== undefined) await deleteKey(client, marker.bucket, marker.key);
      removed.push(d.snapshot.path);
    }
    // Markers of snapshots no longer in the store (deleted by `memsnap delete`, say).
    const present = new Set(fresh.map((s) => s.id));
    for (const id of condemnedAt.keys()) {
      if (present.has(id)) continue;
      const marker = control(store, tenant, agent, `condemned/${id}`);
      await deleteKey(client, marker.bucket, marker.key);
    }
    const uploads = await abortStaleUploads(store, tenant, agent, opts.graceMs);
    return { decisions, removed, condemned, uploads };
  } finally {
    await lease.release().catch(() => undefined);
  }
}

/** Bases named by snapshots of a list (for delete's refusal, as on disk). */
export function basesNamed(snaps: StoredSnapshot[]): Set<string> {
  return new Set(snaps.flatMap((s) => basesOf(s.manifest).map((b) => b.snapshot_id)));
}
