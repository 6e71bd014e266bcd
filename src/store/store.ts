/**
 * The local directory store: `<store>/<tenant>/<agent>/<snapshot-id>.memsnap`.
 *
 * Listing reads each bundle's manifest with a few positioned reads (never the payload).
 * Deleting and pruning take the agent's store lock (`<store>/<tenant>/<agent>/.memsnap/lock`)
 * so concurrent memsnap processes never race past the delete floor: an agent's last
 * snapshot is never deleted without --force.
 */
import { copyFile, open, readdir, stat, unlink, type FileHandle } from "node:fs/promises";
import { join } from "node:path";
import { MemsnapError, destinationError } from "../errors.js";
import { layoutOf, readLayout, tempPathFor } from "../format/container.js";
import { isBundleUrl, openBundle } from "../format/bundle-file.js";
import { isS3Url, parseStoreLocation, s3Key } from "../objstore/location.js";
import { createHash } from "node:crypto";
import { basesOf, checkSeal, ID_PATTERN, parseManifest } from "../format/manifest.js";
import { acquireLock } from "../agent/lock.js";
import { commitRename, unlinkQuiet } from "../util/fs-atomic.js";
import { isUlid } from "../util/ulid.js";
import { storedSnapshot, type StoredSnapshot } from "./types.js";

export type { StoredSnapshot } from "./types.js";

/** Where an agent's bundles live in a store. */
export function agentDir(store: string, tenant: string, agent: string): string {
  if (isS3Url(store)) {
    const loc = parseStoreLocation(store) as { bucket: string; prefix: string };
    return `s3://${loc.bucket}/${s3Key(loc, `${tenant}/${agent}`)}`;
  }
  return join(store, tenant, agent);
}

/** The s3 store's functions (./s3/store.ts), loaded with the SDK only when a store is an s3 URL. */
const s3 = (): Promise<typeof import("./s3/store.js")> => import("./s3/store.js");

async function dirs(p: string): Promise<string[]> {
  const names = await readdir(p, { withFileTypes: true }).catch(() => []);
  return names
    .filter((d) => d.isDirectory() && ID_PATTERN.test(d.name))
    .map((d) => d.name)
    .sort();
}

/**
 * List the snapshots in a store, oldest first, optionally for one tenant/agent. Unreadable
 * bundles are reported through `onBad` and skipped.
 */
export async function listSnapshots(
  store: string,
  filter: { tenant?: string; agent?: string } = {},
  onBad?: (path: string, e: unknown) => void,
): Promise<StoredSnapshot[]> {
  if (isS3Url(store)) return (await s3()).s3ListSnapshots(store, filter, onBad);
  const out: StoredSnapshot[] = [];
  for (const path of await bundlePaths(store, filter)) {
    try {
      const layout = await readLayout(path);
      const m = parseManifest(layout.manifestBytes);
      out.push(storedSnapshot(path, layout, m));
    } catch (e) {
      onBad?.(path, e);
    }
  }
  return out.sort((a, b) => (a.id < b.id ? -1 : a.id > b.id ? 1 : 0));
}

/**
 * The bundle files in a store (`<tenant>/<agent>/<ULID>.memsnap`), optionally for one
 * tenant/agent, by tenant, agent and id; nothing is opened, so damaged bundles are listed too.
 */
export async function bundlePaths(store: string, filter: { tenant?: string; agent?: string } = {}): Promise<string[]> {
  if (isS3Url(store)) return (await (await s3()).s3BundleObjects(store, filter)).map((o) => o.url);
  const out: string[] = [];
  for (const tenant of filter.tenant ? [filter.tenant] : await dirs(store)) {
    for (const agent of filter.agent ? [filter.agent] : await dirs(join(store, tenant))) {
      const dir = agentDir(store, tenant, agent);
      const names = (await readdir(dir).catch(() => [] as string[]))
        .filter((n) => n.endsWith(".memsnap") && isUlid(n.slice(0, -8)))
        .sort();
      for (const n of names) out.push(join(dir, n));
    }
  }
  return out;
}

/** Find one snapshot by id (or unique id prefix, or a path to a bundle). Throws MEMSNAP_USAGE. */
export async function findSnapshot(
  store: string,
  ref: string,
  filter: { tenant?: string; agent?: string } = {},
): Promise<StoredSnapshot> {
  if (ref.endsWith(".memsnap") || ref.includes("/")) {
    const layout = await readLayout(ref);
    const m = parseManifest(layout.manifestBytes);
    return storedSnapshot(ref, layout, m);
  }
  const all = await listSnapshots(store, filter);
  const hits = all.filter((s) => s.id === ref.toUpperCase() || s.id.startsWith(ref.toUpperCase()));
  if (hits.length === 1) return hits[0]!;
  throw new MemsnapError(
    "MEMSNAP_USAGE",
    hits.length ? `snapshot id ${ref} is ambiguous (${hits.length} matches)` : `no snapshot ${ref} in ${store}`,
    {
      hint: hits.length ? "give more characters of the id" : "see `memsnap list`",
    },
  );
}

/**
 * Stream a remote bundle into a new local file `dest` (created here, fsynced by the caller),
 * checking the payload's SHA-256 against the manifest as it goes. Throws MEMSNAP_PAYLOAD_HASH_MISMATCH.
 */
export async function downloadBundle(url: string, dest: string, size?: number): Promise<void> {
  const f = await openBundle(url, size);
  let out: FileHandle | undefined;
  try {
    const layout = await layoutOf(f);
    const m = parseManifest(layout.manifestBytes);
    out = await open(dest, "wx", 0o600);
    const h = createHash("sha256");
    const payloadEnd = layout.payloadOffset + layout.payloadSize;
    let pos = 0;
    for await (const c of f.stream(0, f.size)) {
      const from = Math.max(pos, layout.payloadOffset);
      const to = Math.min(pos + c.length, payloadEnd);
      if (to > from) h.update(c.subarray(from - pos, to - pos));
      let w = 0;
      while (w < c.length) w += (await out.write(c, w, c.length - w, pos + w)).bytesWritten;
      pos += c.length;
    }
    if (pos !== layout.fileSize || h.digest("hex") !== m.payload.sha256) {
      throw new MemsnapError(
        "MEMSNAP_PAYLOAD_HASH_MISMATCH",
        `${url}: the payload read does not hash to the manifest's SHA-256`,
        {
          path: url,
          hint: "the stored bundle is damaged (memsnap verify says more); nothing was written",
        },
      );
    }
  } finally {
    await out?.close();
    await f.close();
  }
}

/**
 * Copy a bundle to `to` (temp → fsync → rename), then check the copy's container and seal.
 * Throws MEMSNAP_DEST_*.
 */
export async function exportSnapshot(s: StoredSnapshot, to: string): Promise<void> {
  if (
    await stat(to).then(
      () => true,
      () => false,
    )
  ) {
    throw new MemsnapError("MEMSNAP_DEST_EXISTS", `${to} already exists`, {
      path: to,
      hint: "choose another --to path",
    });
  }
  const tmp = tempPathFor(to);
  try {
    if (isBundleUrl(s.path)) await downloadBundle(s.path, tmp, s.size);
    else await copyFile(s.path, tmp);
    const fh = await open(tmp, "r+");
    await fh.sync();
    await fh.close();
    const layout = await readLayout(tmp);
    if (!checkSeal(parseManifest(layout.manifestBytes)) || layout.fileSize !== s.size)
      throw new Error("the copy does not match the original");
    await commitRename(tmp, to);
  } catch (e) {
    await unlinkQuiet(tmp).catch(() => undefined);
    throw destinationError(e, to);
  }
}

/**
 * Delete snapshots of one agent under its store lock. Refuses (MEMSNAP_USAGE) to delete the
 * agent's last snapshot unless `force`.
 */
export async function deleteSnapshots(
  store: string,
  targets: StoredSnapshot[],
  opts: { force?: boolean; waitMs?: number } = {},
): Promise<string[]> {
  const deleted: string[] = [];
  const byAgent = new Map<string, StoredSnapshot[]>();
  for (const t of targets) byAgent.set(`${t.tenant}/${t.agent}`, [...(byAgent.get(`${t.tenant}/${t.agent}`) ?? []), t]);
  for (const [, ts] of byAgent) {
    const { tenant, agent } = ts[0]!;
    const dir = agentDir(store, tenant, agent);
    // An s3 store has no lock to take: see ./s3/store.ts (deleting there is a user's explicit act).
    const remote = isS3Url(store);
    const lock = remote ? null : await acquireLock(dir, { waitMs: opts.waitMs ?? 10_000, command: "delete" });
    try {
      const remaining = await listSnapshots(store, { tenant, agent });
      const doomed = new Set(ts.map((t) => t.id));
      const survivors = remaining.filter((r) => !doomed.has(r.id));
      if (survivors.length === 0 && !opts.force) {
        throw new MemsnapError("MEMSNAP_USAGE", `refusing to delete the last snapshot of ${tenant}/${agent}`, {
          hint: "pass --force to delete it anyway",
        });
      }
      // A base of a snapshot that stays holds bytes that snapshot cannot be restored without.
      for (const s of survivors) {
        const needed = basesOf(s.manifest).find((b) => doomed.has(b.snapshot_id));
        if (needed && !opts.force) {
          throw new MemsnapError(
            "MEMSNAP_USAGE",
            `refusing to delete ${needed.snapshot_id}: the incremental snapshot ${s.id} references artifacts in it`,
            {
              hint: `delete ${s.id} too, or pass --force (${s.id} can then no longer be restored)`,
            },
          );
        }
      }
      if (remote)
        await (
          await s3()
        ).s3DeleteBundles(
          store,
          ts.map((t) => t.path),
        );
      for (const t of ts) {
        if (!remote)
          await unlink(t.path).catch((e: NodeJS.ErrnoException) => {
            if (e.code !== "ENOENT") throw e;
          });
        deleted.push(t.path);
      }
    } finally {
      await lock?.release();
    }
  }
  return deleted;
}
