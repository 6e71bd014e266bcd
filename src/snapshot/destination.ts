/**
 * Where a snapshot's bundle goes: an explicit --out path, a local store's
 * <store>/<tenant>/<agent>/<id>.memsnap, or an upload into an s3:// store, and the parent it
 * follows there (the agent's newest snapshot). Split from ./snapshot.ts; the S3 SDK is loaded
 * here only for an s3 store.
 */
import type { S3Client } from "@aws-sdk/client-s3";
import { mkdir, readdir, stat } from "node:fs/promises";
import { dirname, join } from "node:path";
import { MemsnapError, destinationError } from "../errors.js";
import type { S3BundleWriter } from "../format/s3-bundle-writer.js";
import { isS3Url, parseStoreLocation, s3Key } from "../objstore/location.js";
import type { SnapshotOptions } from "./options.js";

/** The newest snapshot id in an agent's store directory older than `before`, or null. */
async function newestIn(dir: string, before: string): Promise<string | null> {
  let newest: string | null = null;
  for (const n of await readdir(dir).catch(() => [] as string[])) {
    const m = /^([0-9A-HJKMNP-TV-Z]{26})\.memsnap$/.exec(n);
    if (m && m[1]! < before && (newest === null || m[1]! > newest)) newest = m[1]!;
  }
  return newest;
}

/** Where a snapshot with this id goes in a store. */
export function storePath(store: string, tenant: string, agent: string, id: string): string {
  return join(store, tenant, agent, `${id}.memsnap`);
}

/** Where a snapshot's bundle goes, and the snapshot it follows. */
export interface Destination {
  /** The bundle's path, or its s3:// URL. */
  dest: string;
  parent: string | null;
  /** The upload's client, bucket and key, for an s3 store. */
  s3: { client: S3Client; bucket: string; key: string } | null;
  /** The s3 writer class, loaded only for an s3 store. */
  S3Writer: typeof S3BundleWriter | undefined;
}

/**
 * Resolve a snapshot's destination: create the store's agent directory, or list the s3 store's
 * (which checks the bucket and credentials before any work), and find the parent there.
 * Throws MEMSNAP_USAGE without a store or --out, MEMSNAP_DEST_EXISTS for an existing file.
 */
export async function resolveDestination(opts: SnapshotOptions, id: string): Promise<Destination> {
  const cfg = opts.config;
  let dest = opts.out;
  let parent = opts.parent ?? null;
  let S3Writer: typeof S3BundleWriter | undefined;
  let newestSnapshotIn: typeof import("../format/s3-bundle-writer.js").newestSnapshotIn;
  let s3: { client: S3Client; bucket: string; key: string } | null = null;
  if (!dest) {
    if (!opts.store)
      throw new MemsnapError("MEMSNAP_USAGE", "no store and no --out given", {
        hint: "pass --out FILE or --store DIR",
      });
    if (isS3Url(opts.store)) {
      // An object store: the bundle streams into an upload of <prefix>/<tenant>/<agent>/<id>.memsnap.
      const loc = parseStoreLocation(opts.store);
      if (loc.kind !== "s3") throw new Error("unreachable");
      const rel = `${cfg.tenant}/${cfg.agent}/`;
      // The SDK is loaded only for an s3 store (it costs every other command ~0.2 s of start-up).
      ({ S3BundleWriter: S3Writer, newestSnapshotIn } = await import("../format/s3-bundle-writer.js"));
      const { s3ClientFor } = await import("../objstore/client.js");
      const client = s3ClientFor(loc, process.env, cfg.s3Endpoint ? { endpoint: cfg.s3Endpoint } : {});
      s3 = { client, bucket: loc.bucket, key: s3Key(loc, `${rel}${id}.memsnap`) };
      dest = `s3://${loc.bucket}/${s3.key}`;
      // Listing the agent's snapshots finds the parent, and checks the bucket and credentials before any work.
      const newest = await newestSnapshotIn(client, loc.bucket, s3Key(loc, rel), id, loc.url);
      if (opts.parent === undefined) parent = newest;
    } else {
      dest = storePath(opts.store, cfg.tenant, cfg.agent, id);
      try {
        await mkdir(dirname(dest), { recursive: true, mode: 0o700 });
      } catch (e) {
        throw destinationError(e, dirname(dest));
      }
      // In a store, the snapshot this one follows is the agent's newest there (ids sort by time).
      if (opts.parent === undefined) parent = await newestIn(dirname(dest), id);
    }
  }
  if (
    !s3 &&
    (await stat(dest).then(
      () => true,
      () => false,
    ))
  ) {
    throw new MemsnapError("MEMSNAP_DEST_EXISTS", `${dest} already exists`, {
      path: dest,
      hint: "choose another --out path or remove the file",
    });
  }
  return { dest, parent, s3, S3Writer };
}
