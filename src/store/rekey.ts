/**
 * `rekey`: new age recipients (or a new passphrase) for existing encrypted bundles, without
 * encrypting their payloads again.
 *
 * An age file is a header that wraps one random file key for each recipient, then a 16-byte
 * nonce and the STREAM chunks, sealed under a key derived from the file key and the nonce.
 * Rekeying opens the header with the old identity (or passphrase), wraps the same file key for
 * the new recipient set, writes a new header MAC, and copies the nonce and every chunk byte
 * for byte (hashed as they are copied, a buffer at a time). The manifest then gets the new
 * payload size, SHA-256 and recipient fingerprints, and a new seal; a signature is made again
 * with a signing key, else dropped (it would no longer verify).
 *
 * Which stanza is whose: an X25519 stanza does not name its recipient, but memsnap writes one
 * stanza per recipient in the order of the manifest's `payload.encryption.recipients`, so the
 * stanza at position i belongs to the fingerprint at position i. Removing a recipient drops
 * its stanza; the others are kept as they were (they wrap the same file key). The mapping is
 * trusted only when the counts agree and the stanza the old identity opened sits where that
 * identity's fingerprint is listed; otherwise removing refuses (replace the whole set instead).
 *
 * Incremental bundles name their bases by id and seal. A rekeyed base gets a new seal, so the
 * bundles that reference it are rekeyed in the same run (bases first) and their `bases[]`
 * updated; rekeying a base without the bundles that reference it is refused, naming them.
 * Each group of bundles linked by references is written as temp files first (temp → fsync)
 * and renamed into place only when every one of them is written: a failure leaves the group
 * as it was, byte for byte, with no temp file.
 */
import { createHash, type KeyObject } from "node:crypto";
import { open, readdir, realpath, type FileHandle } from "node:fs/promises";
import { basename, dirname, join } from "node:path";
import { MemsnapError, destinationError } from "../errors.js";
import { readAt, readLayout, tempPathFor, type BundleLayout } from "../format/container.js";
import {
  basesOf,
  checkSeal,
  computeSeal,
  encodeManifest,
  MANIFEST_MEMBER,
  parseManifest,
  PAYLOAD_MEMBER_ENCRYPTED,
  type Manifest,
  type RecipientInfo,
} from "../format/manifest.js";
import { BLOCK, encodeHeader, padding } from "../format/tar-header.js";
import { recipientFingerprint, recipientsOfIdentities } from "../codecs/age/keys.js";
import { openAgeHeaderForRekey, writeAgeHeader, type AgeStanza } from "../codecs/age/rekey.js";
import { AGE_PREFIX_MAX } from "../codecs/age/stream-open.js";
import { acquireLock, type AgentLock } from "../agent/lock.js";
import { signManifest } from "../sign.js";
import { commitRename, unlinkQuiet } from "../util/fs-atomic.js";
import { isUlid } from "../util/ulid.js";

export interface RekeyOptions {
  /** The old key: identities (`AGE-SECRET-KEY-1…`) and/or passphrases that open the bundles. */
  keys: { identities?: string[]; passphrases?: string[]; scryptMaxLogN?: number };
  /** Recipients (`age1…`) to add; with `replace`, the whole new set. */
  add?: string[];
  /** Recipients to remove: `age1…` or their manifest fingerprint (`sha256:…`). */
  remove?: string[];
  /** The new recipient set is exactly `add` (every old stanza is dropped). */
  replace?: boolean;
  /** Encrypt to this passphrase instead (every old stanza is dropped). */
  newPassphrase?: string;
  scryptLogN?: number;
  /** Sign the new manifest with this Ed25519 key; without it an old signature is dropped. */
  signKey?: KeyObject;
  /** Check the keys and the plan, write nothing. */
  dryRun?: boolean;
  /** Take the agent lock of the bundles' directories (they are in a store). */
  lock?: boolean;
  /** Skip plaintext bundles (reported in `skipped`) instead of refusing them (`--all`). */
  skipPlaintext?: boolean;
}

export interface RekeyOutcome {
  bundles: RekeyResult[];
  /** Bundles left as they were, and why (plaintext ones under `skipPlaintext`). */
  skipped: Array<{ path: string; snapshot_id: string; reason: string }>;
}

export interface RekeyResult {
  snapshot_id: string;
  path: string;
  /** The recipients the bundle is encrypted to afterwards, as the manifest lists them. */
  recipients: RecipientInfo[];
  added: string[];
  removed: string[];
  /** `scrypt` → new passphrase, or recipients → passphrase. */
  passphrase: boolean;
  signed: boolean;
  /** The bundle had a signature and no signing key was given: it was removed. */
  signature_dropped: boolean;
  /** Bases whose seals were updated in this bundle's manifest. */
  bases_updated: string[];
  /** Bases it references that were not rekeyed (they keep their old recipients). */
  bases_not_rekeyed: string[];
  stored_size: number;
  sha256: string;
  dry_run: boolean;
}

interface Item {
  path: string;
  layout: BundleLayout;
  manifest: Manifest;
}

const COPY_BUF = 1 << 20;

/** A recipient (`age1…`) or fingerprint as the manifest records it. */
function fingerprintOf(r: string): string {
  return r.startsWith("age1") ? recipientFingerprint(r) : r;
}

/** The bundles in `dir` other than `skip`, that reference one of `ids` as a base. */
async function dependentsIn(
  dir: string,
  ids: Set<string>,
  skip: Set<string>,
): Promise<Array<{ id: string; base: string }>> {
  const out: Array<{ id: string; base: string }> = [];
  const names = (await readdir(dir).catch(() => [] as string[]))
    .filter((n) => n.endsWith(".memsnap") && isUlid(n.slice(0, -8)))
    .sort();
  for (const n of names) {
    const path = join(dir, n);
    if (skip.has(path)) continue;
    try {
      const m = parseManifest((await readLayout(path)).manifestBytes);
      const b = basesOf(m).find((x) => ids.has(x.snapshot_id));
      if (b) out.push({ id: m.snapshot_id, base: b.snapshot_id });
    } catch {
      // an unreadable bundle references nothing we can update
    }
  }
  return out;
}

/** What the new header holds. */
interface Plan {
  keep: AgeStanza[];
  recipients: string[];
  passphrase?: string;
  infos: RecipientInfo[];
  added: string[];
  removed: string[];
}

function plan(item: Item, stanzas: AgeStanza[], opened: number, opts: RekeyOptions): Plan {
  const old = item.manifest.payload.encryption?.recipients ?? [];
  const add = [...new Set(opts.add ?? [])];
  const where = `${item.manifest.snapshot_id} (${item.path})`;
  if (opts.newPassphrase !== undefined) {
    return {
      keep: [],
      recipients: [],
      passphrase: opts.newPassphrase,
      infos: [{ type: "scrypt" }],
      added: [],
      removed: old.map((o) => o.fingerprint ?? o.type),
    };
  }
  const isScrypt = stanzas.some((s) => s.type === "scrypt");
  if (opts.replace || isScrypt) {
    if (opts.remove?.length && isScrypt) {
      throw new MemsnapError("MEMSNAP_USAGE", `${where} is encrypted to a passphrase: it has no recipient to remove`, {
        hint: "give the new recipients with -r (they replace the passphrase), or --new-passphrase-file",
      });
    }
    if (!add.length)
      throw new MemsnapError("MEMSNAP_USAGE", "--replace needs the new recipients (-r/-R)", {
        hint: "name every recipient the bundles should be encrypted to",
      });
    return {
      keep: [],
      recipients: add,
      infos: add.map((r) => ({ type: "x25519", fingerprint: recipientFingerprint(r) })),
      added: add.map(recipientFingerprint),
      removed: old.map((o) => o.fingerprint ?? o.type),
    };
  }
  // Position i of the manifest's recipients is stanza i, when the header and the manifest agree.
  const ownFps = new Set(recipientsOfIdentities(opts.keys.identities ?? []).map(recipientFingerprint));
  const mapped =
    old.length === stanzas.length &&
    stanzas.every(
      (s, i) => s.type === "X25519" && old[i]!.type === "x25519" && typeof old[i]!.fingerprint === "string",
    ) &&
    opened >= 0 &&
    ownFps.has(old[opened]!.fingerprint!);
  const removeFps = [...new Set((opts.remove ?? []).map(fingerprintOf))];
  const drop = new Set<number>();
  if (removeFps.length) {
    if (!mapped) {
      throw new MemsnapError(
        "MEMSNAP_USAGE",
        `cannot tell which recipient stanza of ${where} is whose: ` +
          "its header and its manifest's recipient list do not line up",
        {
          hint: "replace the whole recipient set instead: --replace -r age1… (every recipient the bundle should keep)",
        },
      );
    }
    for (const fp of removeFps) {
      const i = old.findIndex((o) => o.fingerprint === fp);
      if (i < 0) {
        throw new MemsnapError(
          "MEMSNAP_USAGE",
          `${fp} is not a recipient of ${where} (its recipients: ${old.map((o) => o.fingerprint).join(", ")})`,
          {
            hint: "name a recipient by its age1… key or the fingerprint `memsnap inspect` shows",
          },
        );
      }
      drop.add(i);
    }
  }
  const keep = stanzas.filter((_, i) => !drop.has(i));
  const keptInfos = mapped ? old.filter((_, i) => !drop.has(i)) : old;
  const have = new Set(keptInfos.map((o) => o.fingerprint));
  const newOnes = add.filter((r) => !have.has(recipientFingerprint(r)));
  if (keep.length + newOnes.length === 0) {
    throw new MemsnapError("MEMSNAP_USAGE", `removing ${removeFps.join(", ")} would leave ${where} with no recipient`, {
      hint: "add a new recipient with -r in the same command",
    });
  }
  return {
    keep,
    recipients: newOnes,
    infos: [...keptInfos, ...newOnes.map((r) => ({ type: "x25519" as const, fingerprint: recipientFingerprint(r) }))],
    added: newOnes.map(recipientFingerprint),
    removed: [...drop].sort((a, b) => a - b).map((i) => old[i]!.fingerprint!),
  };
}

/** A bundle written to its temp file, not yet renamed into place. */
interface Pending {
  tmp: string;
  dest: string;
}

/**
 * Write the rekeyed bundle to a temp file beside `item.path` (fsynced), or only plan it in a
 * dry run. `newSeals` maps the ids of bases rekeyed earlier in this run to their new seals.
 */
async function rekeyOne(
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

/** Open and check the bundles to rekey: encrypted, sealed, each once. */
async function load(
  paths: readonly string[],
  skipPlaintext: boolean,
  skipped: RekeyOutcome["skipped"],
): Promise<Item[]> {
  const items: Item[] = [];
  const seen = new Set<string>();
  for (const given of paths) {
    const layout = await readLayout(given);
    const path = join(await realpath(dirname(given)), basename(given));
    if (seen.has(path)) continue;
    seen.add(path);
    const manifest = parseManifest(layout.manifestBytes);
    if (!checkSeal(manifest)) {
      throw new MemsnapError(
        "MEMSNAP_SEAL_MISMATCH",
        `${given}: the manifest seal does not match its content; refusing to rekey a damaged bundle`,
        {
          path: given,
          hint: "run `memsnap verify` on it; rekey only bundles that verify",
        },
      );
    }
    if (!manifest.payload.encryption || layout.payloadMember !== PAYLOAD_MEMBER_ENCRYPTED) {
      if (skipPlaintext) {
        skipped.push({ path: given, snapshot_id: manifest.snapshot_id, reason: "not encrypted" });
        continue;
      }
      throw new MemsnapError(
        "MEMSNAP_USAGE",
        `${given} (${manifest.snapshot_id}) is not encrypted: ` +
          "rekey changes the keys of encrypted bundles, it does not encrypt",
        {
          path: given,
          hint: "take a new, encrypted snapshot (-r age1… or --passphrase-file) instead",
        },
      );
    }
    if (layout.payloadSize !== manifest.payload.stored_size) {
      throw new MemsnapError(
        "MEMSNAP_PAYLOAD_HASH_MISMATCH",
        `${given}: the payload is ${layout.payloadSize} bytes, the manifest says ${manifest.payload.stored_size}`,
        {
          path: given,
          hint: "the bundle is damaged; rekey only bundles that verify",
        },
      );
    }
    items.push({ path, layout, manifest });
  }
  return items;
}

/**
 * Groups of bundles linked by base references (within one directory), each in an order that
 * puts bases before the bundles that reference them.
 */
function groups(items: Item[]): Item[][] {
  const key = (it: Item): string => `${dirname(it.path)}\0${it.manifest.snapshot_id}`;
  const byKey = new Map(items.map((it) => [key(it), it]));
  const parent = new Map(items.map((it) => [key(it), key(it)]));
  const find = (k: string): string => {
    while (parent.get(k) !== k) k = parent.get(k)!;
    return k;
  };
  for (const it of items) {
    for (const b of basesOf(it.manifest)) {
      const bk = `${dirname(it.path)}\0${b.snapshot_id}`;
      if (byKey.has(bk)) parent.set(find(key(it)), find(bk));
    }
  }
  const out = new Map<string, Item[]>();
  for (const it of items) out.set(find(key(it)), [...(out.get(find(key(it))) ?? []), it]);
  // Bases first: a bundle comes after every base of it in the group.
  return [...out.values()].map((g) => {
    const ordered: Item[] = [];
    const done = new Set<string>();
    const visit = (it: Item, depth: number): void => {
      if (done.has(key(it)) || depth > g.length) return;
      for (const b of basesOf(it.manifest)) {
        const base = byKey.get(`${dirname(it.path)}\0${b.snapshot_id}`);
        if (base) visit(base, depth + 1);
      }
      if (!done.has(key(it))) {
        done.add(key(it));
        ordered.push(it);
      }
    };
    for (const it of [...g].sort((a, b) => (a.manifest.snapshot_id < b.manifest.snapshot_id ? -1 : 1))) visit(it, 0);
    return ordered;
  });
}

/**
 * Rekey bundles (paths). Checks everything that can be checked before writing: every bundle is
 * encrypted and sealed, no bundle outside the set references one inside it, and (per bundle,
 * before its temp file is written) the old key opens it. See the module comment.
 *
 * @throws MEMSNAP_USAGE (plaintext bundle, a base rekeyed without its dependents, a recipient
 *   to remove that is not one, nothing left), MEMSNAP_IDENTITY_REQUIRED / MEMSNAP_DECRYPT_FAILED
 *   (the old key does not open a bundle), MEMSNAP_SEAL_MISMATCH, MEMSNAP_DEST_* (writing).
 */
export async function rekeyBundles(paths: readonly string[], opts: RekeyOptions): Promise<RekeyOutcome> {
  const add = opts.add ?? [];
  if (!add.length && !opts.remove?.length && opts.newPassphrase === undefined) {
    throw new MemsnapError(
      "MEMSNAP_USAGE",
      "nothing to change: give recipients to add (-r/-R), to remove (--remove-recipient), or a new passphrase",
      {
        hint: "e.g. memsnap rekey ID -i old.key -r age1… --remove-recipient age1…",
      },
    );
  }
  if (opts.newPassphrase !== undefined && (add.length || opts.remove?.length || opts.replace)) {
    throw new MemsnapError(
      "MEMSNAP_USAGE",
      "a new passphrase replaces every recipient: give it without -r/-R, --remove-recipient or --replace",
      {
        hint: "a passphrase must be the only recipient of an age file",
      },
    );
  }
  if (opts.replace && opts.remove?.length) {
    throw new MemsnapError(
      "MEMSNAP_USAGE",
      "--replace drops every old recipient already: give it without --remove-recipient",
      { hint: "--replace -r age1… names the whole new set" },
    );
  }
  const skipped: RekeyOutcome["skipped"] = [];
  const items = await load(paths, !!opts.skipPlaintext, skipped);
  if (!items.length) return { bundles: [], skipped };

  const dirs = [...new Set(items.map((it) => dirname(it.path)))];
  const locks: AgentLock[] = [];
  const results: RekeyResult[] = [];
  try {
    // Under the store lock (prune and delete take it too), before anything is checked.
    if (opts.lock && !opts.dryRun)
      for (const dir of dirs) locks.push(await acquireLock(dir, { waitMs: 10_000, command: "rekey" }));

    // A base rekeyed alone would break the bundles that reference it (their seal of it changes).
    const inSet = new Set(items.map((it) => it.path));
    for (const dir of dirs) {
      const ids = new Set(items.filter((it) => dirname(it.path) === dir).map((it) => it.manifest.snapshot_id));
      const deps = await dependentsIn(dir, ids, inSet);
      if (deps.length) {
        const names = deps.map((d) => `${d.id} (references ${d.base})`);
        const more = names.length > 5 ? `, and ${names.length - 5} more` : "";
        const depIds = deps.map((d) => d.id).join(" ");
        throw new MemsnapError(
          "MEMSNAP_USAGE",
          `refusing to rekey a base alone: ${names.slice(0, 5).join(", ")}${more} reference it; ` +
            "their record of its seal would no longer match",
          {
            hint: `rekey them together (memsnap rekey ${[...ids][0]} ${depIds} …, or --all); nothing was changed`,
          },
        );
      }
    }

    // The old key must open every bundle before the first one changes (header reads only).
    if (!opts.dryRun && items.length > 1)
      for (const it of items) await rekeyOne(it, { ...opts, dryRun: true }, new Map(), []);

    const newSeals = new Map<string, string>();
    for (const g of groups(items)) {
      const pending: Pending[] = [];
      const mine: RekeyResult[] = [];
      try {
        for (const it of g) mine.push(await rekeyOne(it, opts, newSeals, pending));
      } catch (e) {
        for (const p of pending) await unlinkQuiet(p.tmp).catch(() => undefined);
        if (results.length && e instanceof MemsnapError) {
          const done = results.map((r) => r.snapshot_id).join(", ");
          throw new MemsnapError(
            e.code,
            `${e.message} (nothing of ${g[0]!.manifest.snapshot_id}'s group was changed; ` +
              `${results.length} bundle(s) rekeyed before it stay rekeyed: ${done})`,
            {
              ...(e.hint ? { hint: e.hint } : {}),
              cause: e,
            },
          );
        }
        throw e;
      }
      for (const p of pending) await commitRename(p.tmp, p.dest);
      results.push(...mine);
    }
  } finally {
    for (const l of locks) await l.release().catch(() => undefined);
  }
  return { bundles: results, skipped };
}
