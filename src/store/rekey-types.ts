/**
 * The shapes of `rekey` (./rekey.ts): its options, what it reports per bundle, and a bundle
 * opened for rekeying. Apart so that planning (./rekey-plan.ts) and writing (./rekey-write.ts)
 * share them without importing the command.
 */
import type { KeyObject } from "node:crypto";
import type { BundleLayout } from "../format/container.js";
import type { Manifest, RecipientInfo } from "../format/manifest.js";

/** What `rekey` changes: the old key, the recipients to add or remove (or a new passphrase), and switches. */
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

/** What `rekey` did: the bundles rekeyed (or planned, in a dry run) and those skipped. */
export interface RekeyOutcome {
  bundles: RekeyResult[];
  /** Bundles left as they were, and why (plaintext ones under `skipPlaintext`). */
  skipped: Array<{ path: string; snapshot_id: string; reason: string }>;
}

/** One bundle rekeyed: its recipients afterwards, what changed, and its new payload size and SHA-256. */
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

/** A bundle opened and checked for rekeying. */
export interface Item {
  path: string;
  layout: BundleLayout;
  manifest: Manifest;
}
