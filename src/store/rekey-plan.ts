/**
 * Planning one bundle's new age header for `rekey`: which recipient stanzas are kept (the
 * stanza at position i is the manifest's recipient i, trusted only when header and manifest
 * line up), which are dropped, and what is added, or a new passphrase. Split from ./rekey.ts.
 */
import { MemsnapError } from "../errors.js";
import type { RecipientInfo } from "../format/manifest.js";
import { recipientFingerprint, recipientsOfIdentities } from "../codecs/age/keys.js";
import type { AgeStanza } from "../codecs/age/rekey.js";
import type { Item, RekeyOptions } from "./rekey-types.js";

/** A recipient (`age1…`) or fingerprint as the manifest records it. */
function fingerprintOf(r: string): string {
  return r.startsWith("age1") ? recipientFingerprint(r) : r;
}

/** What the new header holds. */
export interface Plan {
  keep: AgeStanza[];
  recipients: string[];
  passphrase?: string;
  infos: RecipientInfo[];
  added: string[];
  removed: string[];
}

/**
 * The new header of `item` whose header holds `stanzas` (the old key opened stanza `opened`).
 * Throws MEMSNAP_USAGE for a recipient to remove that is not one, or none left.
 */
export function plan(item: Item, stanzas: AgeStanza[], opened: number, opts: RekeyOptions): Plan {
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
