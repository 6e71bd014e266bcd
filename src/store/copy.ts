/**
 * `memsnap copy`: snapshots from one store to another (local → s3, s3 → local, or any pair),
 * under the same `<tenant>/<agent>/<ID>.memsnap` names.
 *
 * Each bundle is streamed (never a whole local copy of a remote one) and checked as it goes:
 * the copied bytes' payload SHA-256 against the manifest, the copied manifest against the one
 * read first, and its seal. The destination appears only once the copy is complete and checked:
 * in s3 the upload is completed only then (else aborted: nothing visible); locally a temp file
 * beside the destination is fsynced and renamed. A snapshot already in the destination with the
 * same seal is skipped; one there with another seal is refused (nothing is overwritten). Bases
 * are copied before the incremental snapshots that need them (oldest first: a base is always
 * older than what references it), and copying an incremental snapshot copies its bases.
 */
import { createHash } from "node:crypto";
import { mkdir, open, stat } from "node:fs/promises";
import { dirname } from "node:path";
import { MemsnapError, destinationError } from "../errors.js";
import { bundleIn, openBundle } from "../format/bundle-file.js";
import { layoutOf, tempPathFor } from "../format/container.js";
import { basesOf, checkSeal, parseManifest } from "../format/manifest.js";
import { commitRename, unlinkQuiet } from "../util/fs-atomic.js";
import { isS3Url, parseObjectUrl } from "../objstore/location.js";
import { agentDir, findSnapshot, listSnapshots, type StoredSnapshot } from "./store.js";

export interface CopyItem {
  id: string;
  tenant: string;
  agent: string;
  from: string;
  to: string;
  size: number;
  /** "copied", or "skipped" (already there with the same seal). */
  action: "copied" | "skipped";
}

/**
 * Stream the bundle at `src` to `write` (offset order), checking the copy: the payload's SHA-256
 * and the manifest bytes equal to those read first, the seal valid. Throws
 * MEMSNAP_PAYLOAD_HASH_MISMATCH or MEMSNAP_SEAL_MISMATCH after the last write: the caller then
 * discards what it wrote.
 */
export async function streamChecked(
  src: string,
  size: number | undefined,
  write: (chunk: Buffer) => Promise<void>,
): Promise<number> {
  const f = await openBundle(src, size);
  try {
    const layout = await layoutOf(f);
    const m = parseManifest(layout.manifestBytes);
    if (!checkSeal(m)) {
      throw new MemsnapError("MEMSNAP_SEAL_MISMATCH", `${src}: the manifest seal does not match its content`, {
        path: src,
        hint: "the stored bundle is damaged (memsnap verify says more); it was not copied",
      });
    }
    const ph = createHash("sha256");
    const mh = createHash("sha256");
    const pEnd = layout.payloadOffset + layout.payloadSize;
    const mStart = pEnd + ((512 - (pEnd % 512)) % 512) + 512; // past the payload's padding and the manifest's header
    const mEnd = mStart + layout.manifestBytes.length;
    const feed = (h: ReturnType<typeof createHash>, c: Buffer, pos: number, from: number, to: number): void => {
      const a = Math.max(pos, from);
      const b = Math.min(pos + c.length, to);
      if (b > a) h.update(c.subarray(a - pos, b - pos));
    };
    let pos = 0;
    for await (const c of f.stream(0, layout.fileSize)) {
      feed(ph, c, pos, layout.payloadOffset, pEnd);
      feed(mh, c, pos, mStart, mEnd);
      await write(c);
      pos += c.length;
    }
    const manifestOk = mh.digest("hex") === createHash("sha256").update(layout.manifestBytes).digest("hex");
    if (pos !== layout.fileSize || ph.digest("hex") !== m.payload.sha256 || !manifestOk) {
      const msg = `${src}: the bytes read do not hash to the manifest's SHA-256`;
      throw new MemsnapError("MEMSNAP_PAYLOAD_HASH_MISMATCH", msg, {
        path: src,
        hint: "the stored bundle is damaged or changed while it was read (memsnap verify says more); it was not copied",
      });
    }
    return pos;
  } finally {
    await f.close();
  }
}

/** Copy one bundle to a local path `to` (temp file, fsync, rename). */
async function copyToFile(src: StoredSnapshot, to: string): Promise<void> {
  await mkdir(dirname(to), { recursive: true }).catch((e: unknown) => {
    throw destinationError(e, to);
  });
  const tmp = tempPathFor(to);
  const fh = await open(tmp, "wx", 0o600).catch((e: unknown) => {
    throw destinationError(e, to);
  });
  try {
    let pos = 0;
    await streamChecked(src.path, src.size, async (c) => {
      let w = 0;
      while (w < c.length) {
        const r = await fh.write(c, w, c.length - w, pos + w).catch((e: unknown) => {
          throw destinationError(e, to);
        });
        w += r.bytesWritten;
      }
      pos += c.length;
    });
    await fh.sync();
    await fh.close();
    await commitRename(tmp, to);
  } catch (e) {
    await fh.close().catch(() => undefined);
    await unlinkQuiet(tmp).catch(() => undefined);
    throw destinationError(e, to);
  }
}

/** Copy one bundle to an object URL `to` (a multipart upload completed only once the copy checks out). */
async function copyToObject(src: StoredSnapshot, to: string, signal?: AbortSignal): Promise<void> {
  const [{ BundleUpload }, { clientFor }] = await Promise.all([
    import("../objstore/upload.js"),
    import("../objstore/object-reader.js"),
  ]);
  const { bucket, key } = parseObjectUrl(to);
  const up = new BundleUpload(clientFor(bucket), bucket, key, signal ? { signal } : {});
  try {
    await streamChecked(src.path, src.size, (c) => up.write(c));
    await up.complete();
  } catch (e) {
    await up.abort().catch(() => undefined);
    throw e;
  }
}

/**
 * Copy snapshots of `from` into `to`: those named by `ids` (with their bases), else every one
 * (of `filter`'s tenant/agent). Returns what was copied and skipped, in order.
 */
export async function copySnapshots(
  from: string,
  to: string,
  ids: string[],
  filter: { tenant?: string; agent?: string } = {},
  opts: { signal?: AbortSignal; onItem?: (i: CopyItem) => void } = {},
): Promise<CopyItem[]> {
  const all = await listSnapshots(from, filter);
  let chosen: StoredSnapshot[];
  if (ids.length) {
    const byId = new Map(all.map((s) => [s.id, s]));
    const want = new Map<string, StoredSnapshot>();
    const add = (s: StoredSnapshot): void => {
      if (want.has(s.id)) return;
      want.set(s.id, s);
      for (const b of basesOf(s.manifest)) {
        const base = byId.get(b.snapshot_id);
        if (!base) {
          const msg = `snapshot ${s.id} is incremental and its base ${b.snapshot_id} is not in ${from}`;
          throw new MemsnapError("MEMSNAP_BASE_MISSING", msg, {
            hint: "it cannot be restored from the copy; copy the base along first, or copy a full snapshot",
          });
        }
        add(base);
      }
    };
    for (const ref of ids) add(await findSnapshot(from, ref, filter));
    chosen = [...want.values()];
  } else {
    chosen = all;
  }
  chosen.sort((a, b) => (a.id < b.id ? -1 : a.id > b.id ? 1 : 0)); // bases first: they are older
  const there = new Map((await listSnapshots(to, filter)).map((s) => [`${s.tenant}/${s.agent}/${s.id}`, s]));
  const out: CopyItem[] = [];
  for (const s of chosen) {
    opts.signal?.throwIfAborted();
    const dest = bundleIn(agentDir(to, s.tenant, s.agent), s.id);
    const have =
      there.get(`${s.tenant}/${s.agent}/${s.id}`) ??
      (!isS3Url(to) &&
      (await stat(dest).then(
        () => true,
        () => false,
      ))
        ? await findSnapshot(to, dest)
        : undefined);
    let action: CopyItem["action"] = "copied";
    if (have) {
      if (have.manifest.seal !== s.manifest.seal) {
        const msg = `${have.path} exists and is not the snapshot ${s.id} of ${from} (its seal differs)`;
        throw new MemsnapError("MEMSNAP_DEST_EXISTS", msg, {
          path: have.path,
          hint: "nothing is overwritten: delete it there first if it is the wrong one",
        });
      }
      action = "skipped";
    } else if (isS3Url(to)) {
      await copyToObject(s, dest, opts.signal);
    } else {
      await copyToFile(s, dest);
    }
    const item: CopyItem = { id: s.id, tenant: s.tenant, agent: s.agent, from: s.path, to: dest, size: s.size, action };
    out.push(item);
    opts.onItem?.(item);
  }
  return out;
}
