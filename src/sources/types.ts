/**
 * The Source interface every capture source implements.
 *
 * A source kind (files, state, and later git, sqlite, pfimg, kv, criu, trace, exec) turns
 * its config entry into a stream of artifacts, each with a size declared before its bytes
 * are read. The pipeline hashes each artifact's bytes exactly once as they stream into the
 * payload tar, so the bytes hashed are the bytes stored. A source that cannot keep its
 * declared size (a file that grew or shrank) fails the whole snapshot with
 * MEMSNAP_SOURCE_CHANGED; no bundle is written.
 */
import type { LayerEntry } from "../format/manifest.js";
import type { Redactor } from "../redact/types.js";

import type { Artifact } from "../format/artifact.js";
export type { Artifact, OpenOptions } from "../format/artifact.js";

/** What a source's capture returns. */
export interface LayerCapture {
  artifacts: AsyncIterable<Artifact>;
  /** Total bytes expected, for progress and ETA, when the source knows it up front. */
  estimatedBytes?: number;
  /** The layer's schema version when not the kind's (SourceKind.schemaVersion is the newest it reads). */
  schemaVersion?: number;
  /** Called after every artifact streamed; its result becomes the layer's `meta` in the manifest. */
  finish?(): Promise<Record<string, unknown> | undefined>;
  /** Called always (success or failure) to remove temp files the source made. */
  cleanup?(): Promise<void>;
  /**
   * After finish(): what the capture left out that the user must hear of, one sentence each
   * (files whose names a bundle cannot hold). Shown by the CLI, never put in the manifest: it may
   * name files, which an encrypted bundle keeps inside its ciphertext.
   */
  notices?(): string[];
}

/** Context given to a capture. */
export interface CaptureContext {
  /** Directory relative config paths resolve against. */
  baseDir: string;
  signal?: AbortSignal;
  /**
   * Present when redaction is on; sources use it for content they rewrite themselves (SQLite cells) or only scan (git
   * history).
   */
  redactor?: Redactor;
  /** A private temp directory for this capture (removed after the snapshot). */
  tmpDir: string;
  /**
   * An incremental snapshot's test for an artifact whose preparation is costly (a SQLite
   * database's scan and checks): when the artifact at `payloadPath` with this fingerprint and
   * kind will be referenced, not packed, the layer meta of the bundle that holds its bytes
   * (for the source to carry over what it would have measured); null otherwise. A source that
   * gets a meta yields the artifact with that fingerprint and never opens it.
   */
  unchanged?(payloadPath: string, fingerprint: string, kind: string): Record<string, unknown> | null;
  /**
   * Present in an incremental snapshot: the meta of layer `layer` in the last incremental
   * snapshot of this agent (whose bundle is still in the store), or null. A git layer continues
   * the last one's chain of bundles from it.
   */
  lastMeta?(layer: string): Record<string, unknown> | null;
  /**
   * Present in an incremental snapshot: the table of page hashes (16 bytes of SHA-256 a page,
   * pages of `pageSize` bytes) that the last incremental snapshot recorded of the `pages`-chunked
   * artifact at `payloadPath`, or null. Nothing is handed out: the pack still chunks against it.
   */
  pageTable?(payloadPath: string): Promise<{ table: Buffer; pageSize: number } | null>;
}

/** Context given to a deep verify of one artifact. */
export interface DeepVerifyContext {
  /** The artifact's payload path (`<layer>/<path>`) and its layer name. */
  entry: { path: string; layer: string };
  /** The artifact's bytes, hashed and checked against the index by the caller as they pass. */
  bytes: AsyncIterable<Buffer>;
  /**
   * The layer's manifest entry (the same object for every artifact of the layer in one verify),
   * for the sizes it declares: a check that decompresses bounds its work by them.
   */
  layer?: LayerEntry;
}

/** Where a layer lives on the live agent, and how an in-place restore replaces it. */
export interface LiveTarget {
  /** Absolute live root of the layer. */
  root: string;
  /** `dir`: the whole root is replaced by the staged layer; `files`: each owned file is swapped on its own. */
  mode: "dir" | "files";
  /**
   * files mode: which live files (relative to root) belong to the layer; owned files absent from the bundle are
   * removed.
   */
  owns?: (rel: string) => boolean;
  /** files mode: live siblings removed along with a restored file (SQLite `-wal`/`-shm`). */
  companions?: (rel: string) => string[];
  /**
   * Called on a layer's staged root once it is materialized, before anything live changes:
   * carries over from the live root what the live copy keeps across a restore (git: the
   * repository's own .git/config, hooks and info/, which no bundle holds).
   */
  keepLive?: (staged: string) => Promise<void>;
}

/** A kind of source: config parsing, capture, and the checks only it knows. */
export interface SourceKind<C extends { name: string } = { name: string }> {
  kind: string;
  /** Schema version of this layer kind's artifacts; readers refuse newer ones. */
  schemaVersion: number;
  /** Validate a config entry (`where` names it in messages). Unknown keys are MEMSNAP_CONFIG_UNKNOWN_KEY. */
  parseConfig(raw: Record<string, unknown>, where: string): C;
  capture(cfg: C, ctx: CaptureContext): Promise<LayerCapture>;
  /** Optional deep check of one artifact (verify --deep); resolve with a problem description or null. */
  deepVerify?(ctx: DeepVerifyContext): Promise<string | null>;
  /**
   * Turn a layer's extracted artifacts into their live form, in place. `dir` holds exactly
   * the layer's artifacts at their layer paths (already hash-checked); e.g. git rebuilds the
   * repository from its bundle and lays the uncommitted files on top. Called on staging,
   * before a restore publishes it. Throws a MemsnapError naming the artifact on failure.
   * `verified`, when given, maps payload paths (`<layer>/<path>`) to the SHA-256 their bytes
   * were checked against on extraction, so a kind need not hash them again. `signal`, when
   * given, aborts a step that may run long (a plugin's restore): it then throws. It may
   * resolve with notes for the user (git: symlinks written as plain files), which the restore
   * returns as `notes`.
   */
  materialize?(
    dir: string,
    layer: LayerEntry,
    verified?: VerifiedLookup,
    signal?: AbortSignal,
  ): Promise<void | string[]>;
  /**
   * True when the layer holds process memory (CRIU pages), which cannot be redacted: a
   * plaintext bundle with such a layer is refused (MEMSNAP_PLAINTEXT_PROCESS_MEMORY) before
   * anything is captured, unless the snapshot sets `allowPlaintextMemory`.
   */
  processMemory?: boolean;
  /**
   * True when pulling the next artifact does not disturb one not yet packed (plain files), so the
   * pipeline may prepare (redact) upcoming artifacts ahead. Sources that stream from one process
   * or reuse temp copies must leave it unset: their artifacts are pulled strictly one at a time.
   */
  independentArtifacts?: boolean;
  /**
   * True when the source cannot yield one path twice by construction (KV pages are named by
   * their digest and deduplicated by it): the snapshot then keeps no set of the layer's paths
   * to catch a repeat, which would cost memory per artifact.
   */
  distinctPaths?: boolean;
  /**
   * True when each artifact is restored as the file `<layer root>/<path>` (which the kind's
   * materialize may change in place: the attributes are set after it): the restore gives it the
   * index's mode, less the umask (`mode & 0o777 & ~umask`: never setuid, setgid or sticky), and
   * mtime, as `tar -x` does.
   */
  restoresAttributes?: boolean;
  /**
   * Artifacts of this layer for which this returns true are not written as files on restore:
   * their bytes (hash-checked as usual) are appended to `<layer dir>/.memsnap-spool`, and
   * `<layer dir>/.memsnap-spool.json` maps each one's layer path to `[offset, length]` in it.
   * A {@link SpoolPlace} instead puts the bytes at `offset` in the part file
   * `<layer dir>/.memsnap-spool-<file>` (created sparse), mapped as `[offset, length, file]`.
   * Only for kinds whose {@link materialize} reads them from there and removes these files
   * (KV pages: thousands of 64 KiB pages that would each be created, read once and unlinked;
   * placed, they land where the rebuilt dump file needs them and are not copied again).
   */
  restoreSpool?: (rel: string) => boolean | SpoolPlace;
  /** Where this source's layer lives, for an in-place restore. Without it the layer can only be restored with --to. */
  liveTarget?(cfg: C, baseDir: string, layer: LayerEntry): Promise<LiveTarget>;
  /** Extra plan lines for `restore --dry-run` (git HEAD before → after, SQLite row-count deltas). */
  planLayer?(cfg: C, baseDir: string, layer: LayerEntry): Promise<string[]>;
}

/** The spool file and its map in a layer's restore directory (see {@link SourceKind.restoreSpool}). */
export const SPOOL_FILE = ".memsnap-spool";
export const SPOOL_MAP = ".memsnap-spool.json";
/** The name of spool part `file` (see {@link SourceKind.restoreSpool}). */
export const spoolPart = (file: number): string => `${SPOOL_FILE}-${file}`;
/** Names of the spool, its map and its parts: reserved in a layer that spools. */
export const isSpoolName = (rel: string): boolean =>
  rel === SPOOL_FILE || rel.startsWith(`${SPOOL_FILE}-`) || rel === SPOOL_MAP;

/** Where a spooled artifact's bytes go: part file `file` at byte `offset`. */
export interface SpoolPlace {
  file: number;
  offset: number;
  /**
   * The artifact is byte planes of `elem`-byte elements (a shuffled KV page): the whole artifact
   * is gathered, put back in element order, and must hash to `sha256` (hex) before it is written
   * at its place (else MEMSNAP_ARTIFACT_HASH_MISMATCH).
   */
  planes?: { elem: number; sha256: string };
}

/** A spool map value: `[offset, length]` in the spool, or `[offset, length, file]` in part `file`. */
export type SpoolAt = [number, number] | [number, number, number];

/** Payload path (`<layer>/<path>`) → the SHA-256 (hex) its bytes were checked against on extraction. */
export interface VerifiedLookup {
  get(path: string): string | undefined;
}

/**
 * The fingerprint the KV source gives an unshuffled page (sources/kv/capture.ts): left out of the cache's memory image.
 */
export function kvPageFingerprint(sha256: string, size: number): string {
  return `kv-page:${sha256}:1:${size}`;
}
