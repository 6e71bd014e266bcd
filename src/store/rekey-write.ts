/**
 * Writing one rekeyed bundle for `rekey`: the new age header, the nonce and every STREAM chunk
 * copied byte for byte (hashed as they pass), the new manifest sealed (and signed), to a temp
 * file beside the bundle that is read back before it counts. Split from ./rekey.ts, which
 * renames the temp files into place once a whole group is written.
 */
import { createHash } from "node:crypto";
import { open, type FileHandle } from "node:fs/promises";
import { dirname } from "node:path";
import { MemsnapError, destinationError } from "../errors.js";
import { readAt, readLayout, tempPathFor } from "../format/container.js";
import {
  basesOf,
  checkSeal,
  computeSeal,
  encodeManifest,
  MANIFEST_MEMBER,
  parseManifest,
  PAYLOAD_MEMBER_ENCRYPTED,
  type Manifest,
} from "../format/manifest.js";
import { BLOCK, encodeHeader, padding } from "../format/tar-header.js";
import { openAgeHeaderForRekey, writeAgeHeader } from "../codecs/age/rekey.js";
import { AGE_PREFIX_MAX } from "../codecs/age/stream-open.js";
import { signManifest } from "../sign.js";
import { unlinkQuiet } from "../util/fs-atomic.js";
import { plan } from "./rekey-plan.js";
import type { Item, RekeyOptions, RekeyResult } from "./rekey-types.js";

const COPY_BUF = 1 << 20;

/** A bundle written to its temp file, not yet renamed into place. */
export interface Pending {
  tmp: string;
  dest: string;
}

/**
 * Write the rekeyed bundle to a temp file beside `item.path` (fsynced), or only plan it in a
 * dry run. `newSeals` maps the ids of bases rekeyed earlier in this run to their new seals.
 */
export async function rekeyOne(
  item: Item,
  opts: RekeyOptions,
  newSeals: Map<string, string>,
  pending: Pending[],
): Promise<RekeyResult> {
  const { layout, manifest } = item;
  const src = await open(item.path, "r");
  let out: FileHandle | undefined;
  let tmp: string | undefined;
  try {
    const prefix = await readAt(src, layout.payloadOffset, Math.min(layout.payloadSize, AGE_PREFIX_MAX));
    const opened = await openAgeHeaderForRekey(prefix, opts.keys);
    const p = plan(item, opened.stanzas, opened.opened, opts);
    const header = await writeAgeHeader(opened.fileKey, {
      keep: p.keep,
      recipients: p.recipients,
      ...(p.passphrase !== undefined ? { passphrase: p.passphrase } : {}),
      ...(opts.scryptLogN ? { scryptLogN: opts.scryptLogN } : {}),
    });
    opened.fileKey.fill(0);
    const bodyStart = layout.payloadOffset + opened.headerLength;
    const bodyLen = layout.payloadSize - opened.headerLength;
    const storedSize = header.length + bodyLen;
    const bases = basesOf(manifest);
    const sealKey = (id: string): string => `${dirname(item.path)}\0${id}`;
    const basesUpdated = bases.filter((b) => newSeals.has(sealKey(b.snapshot_id))).map((b) => b.snapshot_id);
    const basesNot = bases.filter((b) => !newSeals.has(sealKey(b.snapshot_id))).map((b) => b.snapshot_id);
    const base: RekeyResult = {
      snapshot_id: manifest.snapshot_id,
      path: item.path,
      recipients: p.infos,
      added: p.added,
      removed: p.removed,
      passphrase: p.passphrase !== undefined,
      signed: !!opts.signKey,
      signature_dropped: !opts.signKey && manifest.signature !== undefined,
      bases_updated: basesUpdated,
      bases_not_rekeyed: basesNot,
      stored_size: storedSize,
      sha256: "",
      dry_run: !!opts.dryRun,
    };
    if (opts.dryRun) return base;

    const mode = (await src.stat()).mode & 0o777;
    tmp = tempPathFor(item.path);
    out = await open(tmp, "wx", mode);
    const mtime = new Date();
    const hash = createHash("sha256").update(header);
    await out.write(encodeHeader(PAYLOAD_MEMBER_ENCRYPTED, storedSize, mtime, 0o600), 0, BLOCK, 0);
    await out.write(header, 0, header.length, BLOCK);
    let pos = BLOCK + header.length;
    const buf = Buffer.allocUnsafe(COPY_BUF);
    for (let done = 0; done < bodyLen;) {
      const { bytesRead } = await src.read(buf, 0, Math.min(COPY_BUF, bodyLen - done), bodyStart + done);
      if (bytesRead === 0)
        throw new MemsnapError("MEMSNAP_BUNDLE_TRUNCATED", `${item.path}: the payload ends early`, {
          path: item.path,
          hint: "the bundle changed while it was rekeyed; run rekey again",
        });
      hash.update(buf.subarray(0, bytesRead));
      await out.write(buf, 0, bytesRead, pos);
      pos += bytesRead;
      done += bytesRead;
    }
    const sha256 = hash.digest("hex");
    const { seal: _s, signature: _sig, ...rest } = manifest;
    const body: Omit<Manifest, "seal"> = {
      ...rest,
      ...(bases.length
        ? {
            bases: bases.map((b) => ({
              snapshot_id: b.snapshot_id,
              seal: newSeals.get(sealKey(b.snapshot_id)) ?? b.seal,
            })),
          }
        : {}),
      payload: {
        ...manifest.payload,
        encryption: { scheme: "age", recipients: p.infos },
        stored_size: storedSize,
        sha256,
      },
    };
    const sealed: Manifest = { ...body, seal: computeSeal(body) };
    const final: Manifest = opts.signKey ? { ...sealed, signature: { ...signManifest(sealed, opts.signKey) } } : sealed;
    const mBytes = encodeManifest(final);
    const tail = Buffer.concat([
      Buffer.alloc(padding(storedSize)),
      encodeHeader(MANIFEST_MEMBER, mBytes.length, mtime, 0o644),
      mBytes,
      Buffer.alloc(padding(mBytes.length)),
      Buffer.alloc(2 * BLOCK),
    ]);
    await out.write(tail, 0, tail.length, pos);
    await out.truncate(pos + tail.length);
    await out.sync();
    await out.close();
    out = undefined;
    // What was written reads back as a bundle with this manifest.
    const check = await readLayout(tmp);
    const back = parseManifest(check.manifestBytes);
    if (!checkSeal(back) || back.payload.stored_size !== check.payloadSize || back.seal !== final.seal) {
      throw new MemsnapError("MEMSNAP_INTERNAL", `${item.path}: the rekeyed bundle does not read back as written`, {
        hint: "the original is unchanged; report this",
      });
    }
    pending.push({ tmp, dest: item.path });
    tmp = undefined;
    newSeals.set(sealKey(manifest.snapshot_id), final.seal);
    return { ...base, sha256 };
  } catch (e) {
    if (out) await out.close().catch(() => undefined);
    if (tmp) await unlinkQuiet(tmp).catch(() => undefined);
    if (e instanceof MemsnapError) throw e;
    throw destinationError(e, item.path);
  } finally {
    await src.close();
  }
}
