/**
 * A snapshot's options, and the checks they pass before any work starts (recipients or a
 * passphrase, the label, the parent id, process memory in a plaintext bundle, where an
 * incremental snapshot may go). Split from ./snapshot.ts so that the write path reads as
 * one pass, with its preconditions here.
 */
import type { KeyObject } from "node:crypto";
import type { MemsnapConfig } from "../config.js";
import { MemsnapError } from "../errors.js";
import { SNAPSHOT_ID_PATTERN, type CreatedBy } from "../format/manifest.js";

/** Progress reported while a snapshot runs. */
export interface SnapshotProgress {
  bytes: number;
  totalBytes: number | null;
  artifacts: number;
  layer: string;
}

/** The longest label a snapshot may carry. */
export const LABEL_MAX = 200;
// One line of printable text: no C0/C1 control characters (a newline would break `list`).
const LABEL_OK = new RegExp(`^[^\\u0000-\\u001f\\u007f-\\u009f]{1,${LABEL_MAX}}$`, "u");

/** What snapshot() takes: the config, where the bundle goes, its key, label, and switches. */
export interface SnapshotOptions {
  config: MemsnapConfig;
  /** Bundle path; default `<store>/<tenant>/<agent>/<id>.memsnap` (then `store` is required). */
  out?: string;
  store?: string;
  recipients?: string[];
  passphrase?: string;
  scryptLogN?: number;
  level?: number;
  label?: string | null;
  createdBy?: CreatedBy;
  parent?: string | null;
  signal?: AbortSignal;
  onProgress?: (p: SnapshotProgress) => void;
  /** Override the config's redaction switch (`--no-redact`). */
  redact?: boolean;
  /** Write a plaintext bundle even when unredactable secrets were found. */
  allowUnredacted?: boolean;
  /** Write a plaintext bundle even with a layer of process memory (criu), which cannot be redacted. */
  allowPlaintextMemory?: boolean;
  /**
   * The agent lock: wait up to `waitMs` for it (default: fail at once if held), `"held"` when
   * the caller already holds it (the safety snapshot inside a restore), or false for none.
   */
  lock?: { waitMs: number } | "held" | false;
  /** Sign the manifest with this Ed25519 private key. */
  signKey?: KeyObject;
  /**
   * Reference the artifacts unchanged since the last incremental snapshot of this agent
   * instead of storing them again (./incremental.ts); needs `store` (bases live beside the
   * bundle). Without a usable earlier one the snapshot is full, and becomes the base.
   */
  incremental?: boolean;
  /**
   * The most artifacts a plaintext bundle's manifest lists (default MANIFEST_INDEX_MAX); past it
   * the manifest leaves the index out (manifest_version 3). For tests and fixtures.
   */
  manifestIndexMax?: number;
}

/**
 * Check a snapshot's options before anything is read or written; returns the recipients and
 * whether the bundle is encrypted. Throws MEMSNAP_USAGE for options that conflict or are
 * malformed, MEMSNAP_PLAINTEXT_PROCESS_MEMORY for process memory in a plaintext bundle.
 */
export function checkOptions(opts: SnapshotOptions): { recipients: string[]; encrypted: boolean } {
  const cfg = opts.config;
  const recipients = opts.recipients ?? [];
  if (recipients.length && opts.passphrase) {
    throw new MemsnapError("MEMSNAP_USAGE", "use recipients or a passphrase, not both", {
      hint: "drop --recipient or --passphrase-file",
    });
  }
  if (opts.label != null && !LABEL_OK.test(opts.label)) {
    throw new MemsnapError(
      "MEMSNAP_USAGE",
      `a label is 1 to ${LABEL_MAX} characters on one line, without control characters: ` +
        `got ${JSON.stringify(opts.label.length > 40 ? `${opts.label.slice(0, 40)}…` : opts.label)} ` +
        `(${opts.label.length} characters)`,
      {
        hint: "e.g. --label before-upgrade; `memsnap list` shows it and `prune --keep-label` matches it",
      },
    );
  }
  if (opts.parent != null && !SNAPSHOT_ID_PATTERN.test(opts.parent)) {
    throw new MemsnapError(
      "MEMSNAP_USAGE",
      `parent ${JSON.stringify(opts.parent.slice(0, 40))} is not a snapshot id (a ULID)`,
      { hint: "pass the parent's snapshot id, or null" },
    );
  }
  const encrypted = recipients.length > 0 || !!opts.passphrase;
  const memory = cfg.sources.filter((s) => s.impl.processMemory).map((s) => s.cfg.name);
  if (memory.length && !encrypted && !opts.allowPlaintextMemory) {
    throw new MemsnapError(
      "MEMSNAP_PLAINTEXT_PROCESS_MEMORY",
      `layer(s) ${memory.join(", ")} hold process memory, which cannot be redacted; refusing a plaintext bundle`,
      { hint: "encrypt the bundle (-r age1… or --passphrase-file), or pass --allow-plaintext-memory" },
    );
  }
  if (opts.incremental && (opts.out || !opts.store)) {
    throw new MemsnapError(
      "MEMSNAP_USAGE",
      "an incremental snapshot goes into the store (its bases are the bundles beside it)",
      {
        hint: "drop --out (use --store DIR), or drop --incremental",
      },
    );
  }
  return { recipients, encrypted };
}
