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
 *
 * The parts: the shapes (./rekey-types.ts), one bundle's new header (./rekey-plan.ts), writing
 * one bundle (./rekey-write.ts); this file loads the bundles, groups them by references, locks,
 * and puts each group in place.
 */
import { readdir, realpath } from "node:fs/promises";
import { basename, dirname, join } from "node:path";
import { MemsnapError } from "../errors.js";
import { readLayout } from "../format/container.js";
import { basesOf, checkSeal, parseManifest, PAYLOAD_MEMBER_ENCRYPTED } from "../format/manifest.js";
import { acquireLock, type AgentLock } from "../agent/lock.js";
import { commitRename, unlinkQuiet } from "../util/fs-atomic.js";
import { isUlid } from "../util/ulid.js";
import type { Item, RekeyOptions, RekeyOutcome, RekeyResult } from "./rekey-types.js";
import { rekeyOne, type Pending } from "./rekey-write.js";

export type { RekeyOptions, RekeyOutcome, RekeyResult } from "./rekey-types.js";

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
