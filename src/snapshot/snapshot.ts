/**
 * Snapshot: every source's artifacts → one payload tar → zstd (worker thread) → age
 * (optional) → the bundle file, in one pass.
 *
 *   main thread:   source bytes ─hash─▶ tar framing ─┐
 *   payload worker: ┌─────────────────────────────────┘
 *                   └▶ zstd (level per class) ─▶ [age STREAM] ─▶ SHA-256 of stored bytes ─▶ pwrite into the temp file
 *
 * Each artifact's bytes are hashed as they stream into their tar entry, so the hash in the
 * index is over exactly the bytes stored. The index is the last payload member because the
 * hashes are known only once the bytes have streamed (a first member would need a second
 * read of every source, which is how the system we replace produced unverifiable bundles).
 * The tar is framed here (ustar, PAX for long names) rather than by a tar library, so that a
 * level change (./levels.ts) lands exactly between two members' bytes. Any failure stops the
 * worker and removes the temp file: no bundle, no leftovers.
 */
import { createHash, randomBytes, type KeyObject } from "node:crypto";
import { fdatasync } from "node:fs";
import { mkdir, readdir, rm, stat } from "node:fs/promises";
import { hostname } from "node:os";
import { performance } from "node:perf_hooks";
import { dirname, join } from "node:path";
import type { MemsnapConfig } from "../config.js";
import { MemsnapError, destinationError, interruptedOr, sourceChanged } from "../errors.js";
import { BundleWriter } from "../format/container.js";
import { BLOCK, encodeEntryHeader, padding } from "../format/tar-header.js";
import {
  computeSeal,
  encodeManifest,
  INDEX_PATH,
  MANIFEST_VERSION,
  MANIFEST_VERSION_NO_INDEX,
  SNAPSHOT_ID_PATTERN,
  MANIFEST_VERSION_FULL,
  MANIFEST_VERSION_INCREMENTAL,
  PAYLOAD_MEMBER_ENCRYPTED,
  PAYLOAD_MEMBER_PLAIN,
  type CreatedBy,
  type IndexEntry,
  type LayerEntry,
  type Manifest,
  type RecipientInfo,
} from "../format/manifest.js";
import { createRedactor } from "../redact/index.js";
import { secretlintVersions } from "../redact/secretlint.js";
import { recoverJournal } from "../agent/journal.js";
import { acquireLock, controlDir, type AgentLock } from "../agent/lock.js";
import { signManifest } from "../sign.js";
import { removeOrphans } from "../agent/orphans.js";
import { crashPoint } from "../util/crash-point.js";
import { gcPacer, heapPacer } from "../util/gc.js";
import type { Redactor } from "../redact/types.js";
import type { Artifact, LayerCapture } from "../sources/types.js";
import { ulid } from "../util/ulid.js";
import { TOOL_NAME, TOOL_VERSION } from "../version.js";
import { recipientFingerprint } from "../codecs/age/keys.js";
import { prepareAgeEncryption } from "../codecs/age/stream-seal.js";
import { PayloadEncoder } from "./encoder.js";
import { cachePath, CacheWriter, incrementalKey, ReferenceSet, type Reference } from "./incremental.js";
import { packChunked, packWhole, wholeReason, type ChunkRecord } from "./chunking.js";
import { IndexSpill } from "./index-spill.js";
import { LevelPolicy } from "./levels.js";
import type { S3Client } from "@aws-sdk/client-s3";
import type { S3BundleWriter } from "../format/s3-bundle-writer.js";
import { isS3Url, parseStoreLocation, s3Key } from "../objstore/location.js";

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

/** What an incremental snapshot referenced. */
export interface IncrementalResult {
  /** Artifacts referenced (chunked ones included), and their bytes (a chunked one's that are in bases). */
  referenced: number;
  referencedBytes: number;
  /** Artifacts stored as chunked entries: only their changed ranges (./chunking.ts). */
  chunked: number;
  /** The bundles referenced. */
  bases: string[];
  /** Why nothing was referenced, when that is so. */
  reason: string | null;
  /** The cache for the next incremental snapshot could not be written (the bundle is fine). */
  cacheError?: string;
}

export interface SnapshotResult {
  id: string;
  path: string;
  manifest: Manifest;
  /** Bytes of artifacts captured. */
  inputBytes: number;
  /** Size of the bundle file. */
  bundleBytes: number;
  durationMs: number;
  /** Wall time spent redacting text artifacts in the pipeline (sources' own redaction excluded). */
  redactionMs: number;
  /** Present for an incremental snapshot. */
  incremental?: IncrementalResult;
  /** What the layers left out that the user must hear of (LayerCapture.notices), by layer. */
  notices: { layer: string; message: string }[];
}

/**
 * zstd worker threads when the config says nothing. Measured at scale 1 on 2 cores: extra zstd
 * threads (nbWorkers 2) saved under 10 % of wall time but added 30-50 MiB of peak RSS, so the
 * default compresses in the one worker thread; `compression.threads` opts in.
 */
export function defaultZstdThreads(): number {
  return 0;
}

const REDACT_LOOKAHEAD = 2;

/** The most artifacts a plaintext bundle's manifest lists (docs/FORMAT.md §3.2). */
export const MANIFEST_INDEX_MAX = 10_000;

/** Yield `prepare(x)` for each item in order, with up to `depth` preparations started ahead. */
async function* lookahead<T, U>(
  items: AsyncIterable<T>,
  prepare: (x: T) => Promise<U>,
  depth: number,
): AsyncGenerator<U> {
  const queue: Promise<U>[] = [];
  const it = items[Symbol.asyncIterator]();
  let done = false;
  try {
    for (;;) {
      while (!done && queue.length <= depth) {
        const n = await it.next();
        if (n.done) done = true;
        else queue.push(prepare(n.value));
      }
      const next = queue.shift();
      if (!next) return;
      yield await next;
    }
  } finally {
    if (!done) await it.return?.();
  }
}

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

const ZEROS = Buffer.alloc(2 * BLOCK);

/**
 * Source chunks are fresh Buffers (file reads of up to 1 MiB, KV read blocks of 4 MiB) that are
 * garbage once copied into the payload worker's buffers, but V8 frees their external memory
 * only when a scavenge happens to run. A minor GC every 16 MiB packed keeps them
 * from piling up (measured: the KV layer of the bench mix peaked at 235 MiB RSS without it).
 */
const collectPacked = gcPacer(16 * 1024 * 1024, "minor");
/** Old-generation garbage of many small artifacts (KV pages) is collected every 16 MiB of it (see heapPacer). */
const collectArtifacts = heapPacer(16 * 1024 * 1024);

async function packArtifact(
  enc: PayloadEncoder,
  levels: LevelPolicy,
  layer: string,
  a: Artifact,
  onBytes: (n: number) => void,
): Promise<IndexEntry> {
  const name = `${layer}/${a.path}`;
  const known = a.text ? undefined : a.sha256;
  const hash = known === undefined ? createHash("sha256") : null;
  let seen = 0;
  let started = false;
  const begin = async (first: Uint8Array | undefined): Promise<void> => {
    started = true;
    enc.setLevel(levels.start(layer, a.size, first));
    await enc.write(encodeEntryHeader(name, a.size, a.mtime, a.mode));
  };
  for await (const c of a.open({ reuse: true })) {
    const chunk = c as Buffer;
    seen += chunk.length;
    if (seen > a.size) throw sourceChanged(name, `grew past its declared ${a.size} bytes`);
    if (!started) await begin(chunk);
    enc.setLevel(levels.next(chunk));
    hash?.update(chunk);
    onBytes(chunk.length);
    collectPacked(chunk.length);
    const w = enc.write(chunk);
    if (w) await w;
  }
  if (!started) await begin(undefined);
  if (seen !== a.size) throw sourceChanged(name, `shrank from ${a.size} to ${seen} bytes`);
  const pad = padding(a.size);
  if (pad) await enc.write(ZEROS.subarray(0, pad));
  await a.check?.();
  const sha256 = hash ? hash.digest("hex") : known!;
  if (a.expectSha256 !== undefined && a.expectSha256 !== sha256) {
    throw sourceChanged(name, "its bytes changed between the redaction scan and packing (same size and mtime)");
  }
  return {
    path: name,
    layer,
    kind: a.kind,
    size: a.size,
    sha256,
    mode: a.mode,
    mtime: a.mtime.toISOString(),
  };
}

/**
 * Pack one layer's artifacts in order; with a redactor, text artifacts are redacted up to
 * {@link REDACT_LOOKAHEAD} ahead of the one packing (main-thread work that fills the time the
 * main thread would otherwise wait on the compressor). Returns the wall time spent redacting.
 *
 * A function of its own, not a loop inside {@link snapshot}: V8 optimizes a function whose loop
 * runs hot while it is on the stack (on-stack replacement), and compiling all of snapshot() that
 * way took ~170 ms of a core per run (--trace-opt) for code that mostly awaits.
 */
/** What packLayer needs to chunk an artifact (an incremental snapshot): this snapshot's id and a scratch directory. */
interface Chunking {
  self: string;
  workDir: string;
}

/** What an artifact packed as leaves for the incremental cache: a chunkable one's record and table. */
type PackedChunk = { rec: ChunkRecord; table: Buffer | null };

async function packLayer(
  enc: PayloadEncoder,
  levels: LevelPolicy,
  layer: LayerEntry,
  cap: LayerCapture,
  independent: boolean,
  distinctPaths: boolean,
  redactor: Redactor | undefined,
  signal: AbortSignal | undefined,
  onBytes: (n: number) => void,
  onPacked: (e: IndexEntry, fingerprint: string | undefined, chunk?: PackedChunk) => void,
  refs: ReferenceSet | null,
  chunking: Chunking | null,
): Promise<number> {
  let redactMs = 0;
  const seen = distinctPaths ? null : new Set<string>();
  /** Artifacts an incremental snapshot references: not read, not redacted again. */
  const referenced = new WeakMap<Artifact, Reference>();
  const prepare = (raw: Artifact): Promise<Artifact> => {
    const ref = refs?.match(`${layer.name}/${raw.path}`, raw);
    if (ref) {
      referenced.set(raw, ref);
      return Promise.resolve(raw);
    }
    if (!redactor || !raw.text) return Promise.resolve(raw);
    const r0 = performance.now();
    const p = redactor
      .redactArtifact(raw, `${layer.name}/${raw.path}`)
      .then((out) => {
        // The redacted bytes are a function of the source's: the next incremental snapshot may reference them.
        if (raw.fingerprint !== undefined) out.fingerprint = raw.fingerprint;
        if (raw.chunking !== undefined) out.chunking = raw.chunking;
        return out;
      })
      .finally(() => {
        redactMs += performance.now() - r0;
      });
    p.catch(() => undefined); // awaited in order below
    return p;
  };
  for await (const a of lookahead(cap.artifacts, prepare, independent ? REDACT_LOOKAHEAD : 0)) {
    signal?.throwIfAborted();
    if (seen?.has(a.path)) throw new MemsnapError("MEMSNAP_INTERNAL", `source ${layer.name} yielded ${a.path} twice`);
    seen?.add(a.path);
    const ref = referenced.get(a);
    if (ref) {
      const name = `${layer.name}/${a.path}`;
      if (ref.redacted) redactor?.recordReused?.(name, ref.redacted);
      // Secrets found in the referenced bytes and left there (a git bundle's history) count as
      // this snapshot's too: a plaintext bundle is still refused for them.
      if (ref.unredacted) redactor?.recordReused?.(name, ref.unredacted, false);
      const base = {
        path: name,
        layer: layer.name,
        kind: a.kind,
        size: ref.size,
        sha256: ref.sha256,
        mode: a.mode,
        mtime: a.mtime.toISOString(),
      };
      const chunk = ref.chunk ? { rec: ref.chunk.rec, table: await ref.chunk.table() } : undefined;
      if (ref.ranges) {
        // Chunked last time and unchanged: the same ranges, with an empty payload entry (no bytes stored).
        const empty = await packArtifact(
          enc,
          levels,
          layer.name,
          { path: a.path, kind: a.kind, size: 0, mode: a.mode, mtime: a.mtime, open: () => [] },
          onBytes,
        );
        onPacked({ ...base, ranges: ref.ranges, stored_size: 0, stored_sha256: empty.sha256 }, a.fingerprint, chunk);
      } else {
        onPacked({ ...base, ref: ref.base }, a.fingerprint, chunk);
      }
      layer.artifacts++;
      layer.bytes += ref.size;
      layer.referenced = (layer.referenced ?? 0) + 1;
      collectArtifacts(); // a referenced KV page leaves as much garbage as a packed one, and comes faster
      continue;
    }
    const hint = chunking && refs ? a.chunking : undefined;
    if (hint) {
      // An incremental snapshot of a chunkable artifact: chunked against the last one's when
      // that is worth it, else packed whole, its table taken for the next (./chunking.ts).
      const name = `${layer.name}/${a.path}`;
      const pack = (x: Artifact): Promise<IndexEntry> => packArtifact(enc, levels, layer.name, x, onBytes);
      const b = await refs!.chunkBase(name, a, hint);
      const why = b ? wholeReason(b, hint, a) : "no base";
      const r =
        b && why === null
          ? await packChunked(a, hint, b, {
              name,
              layer: layer.name,
              self: chunking!.self,
              workDir: chunking!.workDir,
              pack,
              use: (ids) => refs!.use(ids),
            })
          : await packWhole(a, hint, pack, why ?? undefined);
      if (process.env.MEMSNAP_DEBUG_ENCODER)
        process.stderr.write(
          `chunking ${name}: ${r.entry.ranges ? `${r.entry.stored_size} of ${r.entry.size} bytes stored` : `whole (${r.whole ?? "?"})`}\n`,
        );
      onPacked(r.entry, a.fingerprint, { rec: r.rec, table: r.table });
      collectArtifacts();
      crashPoint("snapshot:artifact");
      layer.artifacts++;
      layer.bytes += r.entry.size;
      if (r.entry.ranges) layer.referenced = (layer.referenced ?? 0) + 1;
      continue;
    }
    const e = await packArtifact(enc, levels, layer.name, a, onBytes);
    onPacked(e, a.fingerprint);
    collectArtifacts();
    crashPoint("snapshot:artifact");
    layer.artifacts++;
    layer.bytes += e.size;
  }
  return redactMs;
}

/**
 * Take a snapshot. Throws MEMSNAP_SOURCE_* when a source is missing, unreadable or changes,
 * MEMSNAP_DEST_* when the bundle cannot be written, MEMSNAP_USAGE for bad options; in every
 * failure no bundle and no temp file are left.
 */
export async function snapshot(opts: SnapshotOptions): Promise<SnapshotResult> {
  const t0 = performance.now();
  let elu0 = performance.eventLoopUtilization();
  const cfg = opts.config;
  const id = ulid();
  const createdAt = new Date();
  const recipients = opts.recipients ?? [];
  if (recipients.length && opts.passphrase) {
    throw new MemsnapError("MEMSNAP_USAGE", "use recipients or a passphrase, not both", {
      hint: "drop --recipient or --passphrase-file",
    });
  }
  if (opts.label != null && !LABEL_OK.test(opts.label)) {
    throw new MemsnapError(
      "MEMSNAP_USAGE",
      `a label is 1 to ${LABEL_MAX} characters on one line, without control characters: got ${JSON.stringify(opts.label.length > 40 ? `${opts.label.slice(0, 40)}…` : opts.label)} (${opts.label.length} characters)`,
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
  const level = opts.level ?? cfg.compression.level;
  let lock: AgentLock | null = null;
  if (opts.lock !== "held" && opts.lock !== false) {
    lock = await acquireLock(cfg.baseDir, { waitMs: opts.lock?.waitMs ?? 0, command: "snapshot" });
    try {
      await recoverJournal(cfg); // an interrupted restore is finished or undone before capturing
    } catch (e) {
      await lock.release();
      throw e;
    }
  }
  // The work dir (redaction scratch, the index spill) is beside the bundle, or for an object
  // store in the agent's control dir: nothing of the bundle's size is written locally then.
  const workBase = s3 ? controlDir(cfg.baseDir) : dirname(dest);
  if (s3)
    await mkdir(workBase, { recursive: true, mode: 0o700 }).catch((e: unknown) => {
      throw destinationError(e, workBase);
    });
  await removeOrphans(workBase); // a killed earlier snapshot's temp file and work dir
  const writer = s3
    ? new S3Writer!(s3.client, s3.bucket, s3.key, encrypted, opts.signal ? { signal: opts.signal } : {})
    : new BundleWriter(dest, encrypted);
  const workDir = join(workBase, `.memsnap-work-${process.pid}-${randomBytes(4).toString("hex")}`);
  let redactor: Redactor | undefined;
  const captures: LayerCapture[] = [];
  const noticesOf: [string, LayerCapture][] = [];
  let started: Promise<LayerCapture>[] = [];
  /** Each packed layer's finish(), which fills in its meta; awaited before the manifest. */
  const finishing: Promise<void>[] = [];
  let spill: IndexSpill | undefined;
  let enc: PayloadEncoder | undefined;
  let cache: CacheWriter | null = null;
  // Writeback of the bundle starts while later layers pack: an fdatasync after each layer (one
  // in flight, on the thread pool), so the commit's fsync has only the tail left to flush. It
  // is awaited before the file is committed or aborted (never a sync of a closed descriptor).
  let syncing: Promise<void> | null = null;
  const earlySync = (fd: number): void => {
    syncing ??= new Promise<void>((res) => fdatasync(fd, () => res())).finally(() => {
      syncing = null;
    });
  };
  try {
    try {
      await mkdir(workDir, { mode: 0o700 });
    } catch (e) {
      throw destinationError(e, dest);
    }
    redactor = await createRedactor({ ...cfg.redaction, enabled: opts.redact ?? cfg.redaction.enabled }, workDir);
    const age = !encrypted
      ? null
      : await prepareAgeEncryption(
          opts.passphrase
            ? { passphrase: opts.passphrase, ...(opts.scryptLogN ? { scryptLogN: opts.scryptLogN } : {}) }
            : { recipients },
        );
    const threads = cfg.compression.threads ?? defaultZstdThreads();
    let raw: { fd: number; start: number } | null = null;
    if (!(writer instanceof BundleWriter)) {
      // The sink hands its sealed, hashed bytes to the upload (no file, no direct I/O, no early sync).
      const output = await writer.open();
      enc = new PayloadEncoder({ fd: -1, start: BLOCK, output, directIo: false, path: dest, level, threads, age });
    } else {
      raw = await writer.openRaw();
      enc = new PayloadEncoder({ fd: raw.fd, start: raw.start, path: dest, level, threads, age });
    }
    const levels = new LevelPolicy(level);

    // Bases are the bundles beside this one: the same directory, or the same key prefix of an s3 store.
    const incKey = !opts.incremental
      ? null
      : incrementalKey(
          cfg.tenant,
          cfg.agent,
          opts.passphrase ? null : recipients.map(recipientFingerprint),
          redactor ? { settings: cfg.redaction, rules: secretlintVersions() } : null,
        );
    const refs = !opts.incremental
      ? null
      : incKey
        ? await ReferenceSet.load(cachePath(cfg.baseDir, cfg.tenant, cfg.agent), incKey, dirname(dest))
        : ReferenceSet.empty("a passphrase-encrypted snapshot references nothing (passphrases cannot be compared)");
    if (incKey) {
      cache = new CacheWriter(cachePath(cfg.baseDir, cfg.tenant, cfg.agent), id);
      await cache.start().catch((e: unknown) => {
        throw destinationError(e, cache!.file);
      });
    }
    let referencedCount = 0;
    let referencedBytes = 0;
    let chunked = 0;
    if (process.env.MEMSNAP_DEBUG_ENCODER && refs) {
      const mu = process.memoryUsage();
      process.stderr.write(
        `incremental: ${refs.size} artifact(s) may be referenced (rss ${Math.round(mu.rss / 1048576)} heap used ${Math.round(mu.heapUsed / 1048576)} of ${Math.round(mu.heapTotal / 1048576)} MiB)\n`,
      );
    }

    // The index goes to a spill file as artifacts pack (bounded memory whatever their number);
    // a plaintext bundle also lists it in its manifest, so there it is kept in memory too.
    spill = new IndexSpill(join(workDir, "index.spill"));
    // A plaintext bundle's manifest repeats the index (readable with `tar -xOf`), up to
    // MANIFEST_INDEX_MAX artifacts: past that it would make the manifest, and the memory of
    // everything that reads it, grow with the number of files (a memory of 200,000 notes: a
    // 46 MB manifest, 386 MiB to write it, 551 MiB to verify it). The payload's index stays.
    let index: IndexEntry[] | null = encrypted ? null : [];
    const layers: LayerEntry[] = [];
    let bytes = 0;
    let redactMs = 0;
    let estimate: number | null = 0;
    // A source's capture starts when the layer before it starts packing, so that its own
    // preparation (a git bundle written by a git process, a SQLite scan in its worker, a KV
    // dump's manifest checks) overlaps that layer; the layers are still packed one after
    // another, in config order. Only one layer ahead: a capture holds its plan in memory (a KV
    // page table is tens of MiB at scale 10), so starting them all at once raised peak RSS.
    const captureCtx = {
      baseDir: cfg.baseDir,
      tmpDir: workDir,
      ...(opts.signal ? { signal: opts.signal } : {}),
      ...(redactor ? { redactor } : {}),
      ...(refs?.size ? { unchanged: (path: string, fp: string, kind: string) => refs.unchanged(path, fp, kind) } : {}),
      ...(refs ? { lastMeta: (layer: string) => refs.lastLayerMeta(layer) } : {}),
    };
    const startCapture = (i: number): void => {
      const src = cfg.sources[i];
      if (!src || started[i]) return;
      const p = src.impl.capture(src.cfg, captureCtx);
      p.then(
        (c) => {
          captures.push(c);
        },
        () => undefined,
      );
      started[i] = p;
    };
    for (const [i, { impl, cfg: scfg }] of cfg.sources.entries()) {
      opts.signal?.throwIfAborted();
      startCapture(i);
      startCapture(i + 1);
      const cap = await started[i]!;
      estimate = estimate === null || cap.estimatedBytes === undefined ? null : estimate + cap.estimatedBytes;
      const layer: LayerEntry = {
        name: scfg.name,
        kind: impl.kind,
        schema_version: cap.schemaVersion ?? impl.schemaVersion,
        artifacts: 0,
        bytes: 0,
      };
      redactMs += await packLayer(
        enc,
        levels,
        layer,
        cap,
        !!impl.independentArtifacts,
        !!impl.distinctPaths,
        redactor,
        opts.signal,
        (n) => {
          opts.signal?.throwIfAborted();
          bytes += n;
          opts.onProgress?.({ bytes, totalBytes: estimate, artifacts: spill!.count, layer: scfg.name });
        },
        (e, fingerprint, chunk) => {
          spill!.add(e);
          if (index && index.length === (opts.manifestIndexMax ?? MANIFEST_INDEX_MAX)) index = null;
          index?.push(e);
          cache?.add(e, fingerprint, e.ref ?? id, chunk);
          if (e.ref !== undefined) {
            referencedCount++;
            referencedBytes += e.size;
          } else if (e.ranges !== undefined) {
            // (its stored ranges were counted as they packed)
            chunked++;
            referencedCount++;
            referencedBytes += e.size - e.stored_size!;
          }
        },
        refs,
        incKey ? { self: id, workDir } : null,
      );
      if (process.env.MEMSNAP_DEBUG_ENCODER) {
        const elu = performance.eventLoopUtilization(elu0);
        elu0 = performance.eventLoopUtilization();
        const mu = process.memoryUsage();
        const mib = (n: number): number => Math.round(n / 1048576);
        process.stderr.write(
          `layer ${scfg.name} packed at ${Math.round(performance.now() - t0)} ms (main thread busy ${Math.round(elu.active)} of ${Math.round(elu.active + elu.idle)} ms; rss ${mib(mu.rss)} heap ${mib(mu.heapTotal)} external ${mib(mu.external)} MiB)\n`,
        );
      }
      // finish() runs now (a SQLite source stops its workers), but the next layer packs while
      // it settles: the git source's finish waits for its history scan, and a SQLite
      // source's for its workers, which held the payload still for ~0.1 s on the bench mix.
      layers.push(layer);
      if (cap.notices) noticesOf.push([scfg.name, cap]);
      if (cap.finish) {
        const f = cap.finish().then((meta) => {
          if (meta) layer.meta = meta;
        });
        f.catch(() => undefined); // awaited below; an early failure must not go unhandled
        finishing.push(f);
      }
      if (raw) earlySync(raw.fd);
    }
    const indexSize = spill.documentBytes(id);
    const indexHash = createHash("sha256");
    levels.start("", indexSize, undefined);
    enc.setLevel(level);
    await enc.write(encodeEntryHeader(INDEX_PATH, indexSize, createdAt, 0o644));
    for (const c of spill.document(id)) {
      indexHash.update(c);
      await enc.write(c);
    }
    // padding, then the end-of-archive blocks
    await enc.write(Buffer.concat([ZEROS.subarray(0, padding(indexSize)), ZEROS]));
    for (const f of finishing) await f; // the layers' meta, and the history scans' findings in the report
    const redaction = redactor ? redactor.report() : null;
    if (redaction && redaction.total_unredacted > 0 && !encrypted && !opts.allowUnredacted) {
      const where = Object.keys(redaction.unredacted);
      throw new MemsnapError(
        "MEMSNAP_UNREDACTED_SECRETS",
        `${redaction.total_unredacted} secret(s) found in content that cannot be redacted (${where.slice(0, 3).join(", ")}${where.length > 3 ? ", …" : ""}); refusing a plaintext bundle`,
        { hint: "encrypt the bundle (-r age1… or --passphrase-file), or pass --allow-unredacted" },
      );
    }
    const tarSize = enc.bytesIn;
    if (process.env.MEMSNAP_DEBUG_ENCODER)
      process.stderr.write(
        `levels: ${levels.samples} samples, ${levels.denseSamples} dense; frames compressed on the main thread: ${enc.stolenFrames}\n`,
      );
    const payload = await enc.finish();
    const recipientInfo: RecipientInfo[] = opts.passphrase
      ? [{ type: "scrypt" }]
      : recipients.map((r) => ({ type: "x25519", fingerprint: recipientFingerprint(r) }));
    // Only a bundle that references a base needs (and is written as) manifest_version 2, so
    // every other bundle stays readable by memsnap 0.1.
    const bases = refs?.bases() ?? [];
    const body: Omit<Manifest, "seal"> = {
      format: "memsnap",
      // The oldest version that says what this bundle is (so older readers read what they can).
      manifest_version: chunked
        ? MANIFEST_VERSION
        : !encrypted && !index
          ? MANIFEST_VERSION_NO_INDEX
          : bases.length
            ? MANIFEST_VERSION_INCREMENTAL
            : MANIFEST_VERSION_FULL,
      snapshot_id: id,
      created_at: createdAt.toISOString(),
      created_by: opts.createdBy ?? "api",
      label: opts.label ?? null,
      tenant: cfg.tenant,
      agent: cfg.agent,
      host: hostname(),
      tool: { name: TOOL_NAME, version: TOOL_VERSION },
      parent,
      ...(bases.length ? { bases } : {}),
      layers,
      payload: {
        member: encrypted ? PAYLOAD_MEMBER_ENCRYPTED : PAYLOAD_MEMBER_PLAIN,
        compression: { codec: "zstd", level },
        encryption: encrypted ? { scheme: "age", recipients: recipientInfo } : null,
        stored_size: payload.storedSize,
        sha256: payload.sha256,
        tar_size: tarSize,
        index_sha256: indexHash.digest("hex"),
        artifacts: spill.count,
        bytes: bytes + referencedBytes,
      },
      ...(index ? { index } : {}),
      redaction: redaction ? { ...redaction } : { policy: "off" },
    };
    const sealed: Manifest = { ...body, seal: computeSeal(body) };
    const manifest: Manifest = opts.signKey
      ? { ...sealed, signature: { ...signManifest(sealed, opts.signKey) } }
      : sealed;
    await syncing;
    let bundleBytes: number;
    if (!(writer instanceof BundleWriter))
      bundleBytes = (await writer.commit(encodeManifest(manifest), payload.storedSize)).size;
    else {
      await writer.commit(encodeManifest(manifest), payload.storedSize);
      bundleBytes = (await stat(dest)).size;
    }
    let incremental: IncrementalResult | undefined;
    if (refs) {
      incremental = {
        referenced: referencedCount,
        referencedBytes,
        chunked,
        bases: bases.map((b) => b.snapshot_id),
        reason: referencedCount ? null : (refs.reason ?? "nothing was unchanged"),
      };
      if (cache && incKey) {
        // The next incremental snapshot's references: this bundle, and the bases it referenced.
        const holders = Object.fromEntries([[id, manifest.seal], ...bases.map((b) => [b.snapshot_id, b.seal])]);
        try {
          await cache.commit(
            id,
            incKey,
            holders,
            (redaction?.redacted ?? {}) as Record<string, Record<string, number>>,
            (redaction?.unredacted ?? {}) as Record<string, Record<string, number>>,
          );
        } catch (e) {
          incremental.cacheError = (e as Error).message;
          await cache.abort();
        }
        cache = null;
      }
    }
    return {
      id,
      path: dest,
      manifest,
      inputBytes: bytes,
      bundleBytes,
      durationMs: performance.now() - t0,
      redactionMs: redactMs,
      ...(incremental ? { incremental } : {}),
      notices: noticesOf.flatMap(([layer, c]) => c.notices!().map((message) => ({ layer, message }))),
    };
  } catch (e) {
    await enc?.destroy();
    await syncing;
    await writer.abort();
    throw interruptedOr(e, opts.signal, "snapshot interrupted", "no bundle was written");
  } finally {
    await cache?.abort();
    spill?.close();
    await Promise.allSettled(started);
    await Promise.allSettled(finishing);
    for (const c of captures) await c.cleanup?.().catch(() => undefined);
    await redactor?.cleanup().catch(() => undefined);
    await rm(workDir, { recursive: true, force: true }).catch(() => undefined);
    await lock?.release();
  }
}
