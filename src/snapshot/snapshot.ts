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
 *
 * This file runs that pass; its parts live beside it: the options and their checks
 * (./options.ts), where the bundle goes (./destination.ts), packing a layer's artifacts
 * (./pack.ts), and the index member, manifest and incremental cache at the end (./seal.ts).
 */
import { randomBytes } from "node:crypto";
import { fdatasync } from "node:fs";
import { mkdir, rm, stat } from "node:fs/promises";
import { performance } from "node:perf_hooks";
import { dirname, join } from "node:path";
import { destinationError, interruptedOr } from "../errors.js";
import { BundleWriter } from "../format/container.js";
import { BLOCK } from "../format/tar-header.js";
import { encodeManifest, type IndexEntry, type LayerEntry, type Manifest } from "../format/manifest.js";
import { createRedactor } from "../redact/index.js";
import { secretlintVersions } from "../redact/secretlint.js";
import { recoverJournal } from "../agent/journal.js";
import { acquireLock, controlDir, type AgentLock } from "../agent/lock.js";
import { removeOrphans } from "../agent/orphans.js";
import type { Redactor } from "../redact/types.js";
import type { LayerCapture } from "../sources/types.js";
import { ulid } from "../util/ulid.js";
import { mallocTrim } from "../util/directio.js";
import { recipientFingerprint } from "../codecs/age/keys.js";
import { prepareAgeEncryption } from "../codecs/age/stream-seal.js";
import { PayloadEncoder } from "./encoder.js";
import { cachePath, incrementalKey, ReferenceSet } from "./incremental.js";
import { CacheWriter } from "./cache-writer.js";
import { IndexSpill } from "./index-spill.js";
import { LevelPolicy } from "./levels.js";
import { checkOptions, type SnapshotOptions } from "./options.js";
import { resolveDestination } from "./destination.js";
import { packLayer } from "./pack.js";
import { buildManifest, commitCache, refuseUnredacted, writeIndexMember } from "./seal.js";

export { LABEL_MAX, type SnapshotOptions, type SnapshotProgress } from "./options.js";
export { storePath } from "./destination.js";

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

/** The most artifacts a plaintext bundle's manifest lists (docs/FORMAT.md §3.2). */
export const MANIFEST_INDEX_MAX = 10_000;

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
  const { recipients, encrypted } = checkOptions(opts);
  const { dest, parent, s3, S3Writer } = await resolveDestination(opts, id);
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
        `incremental: ${refs.size} artifact(s) may be referenced (rss ${Math.round(mu.rss / 1048576)} heap ` +
          `used ${Math.round(mu.heapUsed / 1048576)} of ${Math.round(mu.heapTotal / 1048576)} MiB)\n`,
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
    // another, in config order. One layer ahead, two while the layer about to pack is still
    // being prepared: a capture holds its plan in memory (a KV page table is tens of MiB at
    // scale 10), so starting them all at once raised peak RSS; but while a git memdir's bundle
    // is written (0.9 s on the realistic home, one git process) a core is idle, and the
    // next-but-one layer's preparation (a SQLite scan in its worker: 0.8 s there) fits in it.
    // Snapshot of that home, 4 alternating runs each: 3.95-4.39 → 3.65-4.07 s, same peak RSS.
    const captureCtx = {
      baseDir: cfg.baseDir,
      tmpDir: workDir,
      ...(opts.signal ? { signal: opts.signal } : {}),
      ...(redactor ? { redactor } : {}),
      ...(refs?.size ? { unchanged: (path: string, fp: string, kind: string) => refs.unchanged(path, fp, kind) } : {}),
      ...(refs ? { lastMeta: (layer: string) => refs.lastLayerMeta(layer) } : {}),
      ...(refs?.size ? { pageTable: (path: string) => refs.pageTable(path) } : {}),
    };
    const ready: boolean[] = [];
    const startCapture = (i: number): void => {
      const src = cfg.sources[i];
      if (!src || started[i]) return;
      const p = src.impl.capture(src.cfg, captureCtx);
      if (process.env.MEMSNAP_DEBUG_ENCODER) {
        const at = Math.round(performance.now() - t0);
        p.then(
          () =>
            process.stderr.write(
              `capture ${src.cfg.name} started at ${at}, ready at ${Math.round(performance.now() - t0)} ms\n`,
            ),
          () => undefined,
        );
      }
      p.then(
        (c) => {
          ready[i] = true;
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
      if (!ready[i]) startCapture(i + 2);
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
          `layer ${scfg.name} packed at ${Math.round(performance.now() - t0)} ms (main thread ` +
            `busy ${Math.round(elu.active)} of ${Math.round(elu.active + elu.idle)} ms; rss ${mib(mu.rss)} ` +
            `heap ${mib(mu.heapTotal)} external ${mib(mu.external)} MiB)\n`,
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
          mallocTrim(); // its workers have exited: their memory is free now
        });
        f.catch(() => undefined); // awaited below; an early failure must not go unhandled
        finishing.push(f);
      }
      if (raw) earlySync(raw.fd);
      // A layer's workers free their isolates into malloc's arenas, which keep them resident
      // (../util/directio.ts): hand that back before the next layer, and the next capture's git
      // processes, start.
      mallocTrim();
    }
    const indexSha256 = await writeIndexMember(enc, levels, spill, id, createdAt, level);
    for (const f of finishing) await f; // the layers' meta, and the history scans' findings in the report
    const redaction = redactor ? redactor.report() : null;
    refuseUnredacted(redaction, encrypted, !!opts.allowUnredacted);
    const tarSize = enc.bytesIn;
    if (process.env.MEMSNAP_DEBUG_ENCODER)
      process.stderr.write(
        `levels: ${levels.samples} samples, ${levels.denseSamples} dense; frames compressed on the main ` +
          `thread: ${enc.stolenFrames}\n`,
      );
    const payload = await enc.finish();
    // Only a bundle that references a base needs (and is written as) manifest_version 2, so
    // every other bundle stays readable by memsnap 0.1.
    const bases = refs?.bases() ?? [];
    const manifest = buildManifest(opts, {
      id,
      createdAt,
      parent,
      recipients,
      encrypted,
      chunked,
      index,
      bases,
      layers,
      level,
      payload,
      tarSize,
      indexSha256,
      artifacts: spill.count,
      bytes: bytes + referencedBytes,
      redaction,
    });
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
        const cacheError = await commitCache(cache, incKey, manifest, bases, redaction);
        if (cacheError !== undefined) incremental.cacheError = cacheError;
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
