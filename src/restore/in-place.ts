/**
 * restore BUNDLE (in place): put a bundle back into the agent's live locations.
 *
 *  1. check the manifest (version, seal, layers, payload label) — before touching anything;
 *  2. take the agent's lock (and finish any interrupted restore first);
 *  3. take a safety snapshot of the live state (`auto:pre-restore-<id>`), inside the lock;
 *  4. write the journal (phase `staging`), extract every selected layer into a staging
 *     sibling of its live root, checking every hash, and materialize it;
 *  5. list the swaps in the journal (phase `swapping`), fsynced;
 *  6. swap with renames, fsync, mark `committed`, then delete the old copies.
 *
 * A crash before step 5 leaves the live state untouched (recover removes staging); from step
 * 5 on, recover finishes the swaps. Either way the live state is the old one or the bundle's.
 *
 * Where each layer goes and its swaps are in ./swaps.ts; the safety snapshot's key in ./safety.ts.
 */
import { randomBytes } from "node:crypto";
import { mkdir } from "node:fs/promises";
import type { MemsnapConfig } from "../config.js";
import { MemsnapError, interruptedOr, isMemsnapError } from "../errors.js";
import { readLayout } from "../format/container.js";
import { parseManifest, referencedIn, type Manifest } from "../format/manifest.js";
import type { Keys } from "../read/read-payload.js";
import { snapshot, type SnapshotResult } from "../snapshot/snapshot.js";
import { crashPoint } from "../util/crash-point.js";
import { EarlySync, syncFilesystem } from "../util/fs-atomic.js";
import { extractPayload, RestoredAttributes } from "../read/extract.js";
import { basesNeeded, checkReferencedLayers, extractReferenced, openBases, References } from "../read/bases.js";
import { LayerMaterializer } from "./materialize.js";
import {
  backupName,
  checkJournal,
  journalScope,
  newJournal,
  recoverJournal,
  rollForward,
  stagingName,
  writeJournal,
  cleanup,
} from "../agent/journal.js";
import { Protected, realish, type LiveRoot } from "../agent/live-guard.js";
import { checkBundleKey } from "./key-check.js";
import { processesUsing, refuseLiveProcesses, type LiveProcess } from "../agent/live-procs.js";
import { acquireLock, type AgentLock } from "../agent/lock.js";
import { checkManifest, checkManifestFindings, enforceSignature, type SignaturePolicy } from "../read/preflight.js";
import { loadIndex, selectPaths } from "../browse/index.js";
import { planRestore, type RestorePlan } from "./plan.js";
import { buildSwaps, checkTargets, refusedPath, selectLayers, swapFailure } from "./swaps.js";
import { SAFETY_SOURCE_CODES, safetyEncryption } from "./safety.js";

export interface RestoreInPlaceOptions extends SignaturePolicy {
  keys?: Keys;
  /** Restore only these layers (by name). */
  only?: string[];
  /**
   * Restore only the artifacts these patterns select (payload paths, see browse/index.ts
   * pathFilter). Of a layer only partly selected (files, state, trace) the selected files are
   * written and no live file is removed; other kinds only whole.
   */
  paths?: string[];
  /** Restore a bundle of another tenant/agent into this agent. */
  asAgent?: boolean;
  /** Take the automatic safety snapshot first (default true). */
  safetySnapshot?: boolean;
  /** Store for the safety snapshot. */
  store?: string;
  /** How long to wait for the agent's lock (ms; default 0). */
  waitMs?: number;
  dryRun?: boolean;
  signal?: AbortSignal;
  onProgress?: (bytes: number, total: number) => void;
  /**
   * Called once the agent's lock is held, before the safety snapshot and before anything is
   * staged (the CLI runs the `before_restore` hook here, to stop the agent); throwing ends the
   * restore with nothing changed. Not called for a dry run.
   */
  beforeRestore?: (layers: string[]) => Promise<void>;
  /** Restore even while other processes hold live files open or work inside a live directory (./live-procs.ts). */
  ignoreOpenFiles?: boolean;
}

export interface RestoreInPlaceResult {
  manifest: Manifest;
  layers: string[];
  swaps: number;
  bytes: number;
  safetySnapshot: SnapshotResult | null;
  recovered: string | null;
  plan?: RestorePlan;
  /**
   * Live paths the bundle has a copy of that were left as they are: the config file this
   * restore ran with (a state source at `.` captures it), which a restore never writes.
   */
  kept: string[];
  /** A dry run: the processes that use live files the restore would replace (it would refuse while they do). */
  processes?: LiveProcess[];
  /** What the user should know of how a layer was restored (git: symlinks written as plain files). */
  notes: string[];
  durationMs: number;
}

/**
 * Restore a bundle into the agent described by `config`. Throws MEMSNAP_LOCKED, the bundle's
 * integrity/key/format errors (before anything live is touched), MEMSNAP_USAGE for an agent
 * mismatch or a layer without a target, and MEMSNAP_DEST_* for write failures (staging removed).
 */
export async function restoreInPlace(
  bundle: string,
  config: MemsnapConfig,
  opts: RestoreInPlaceOptions = {},
): Promise<RestoreInPlaceResult> {
  const t0 = performance.now();
  const layout = await readLayout(bundle);
  const manifest = parseManifest(layout.manifestBytes);
  checkManifestFindings(checkManifest(manifest, layout));
  enforceSignature(manifest, opts);
  if (!opts.asAgent && (manifest.tenant !== config.tenant || manifest.agent !== config.agent)) {
    throw new MemsnapError(
      "MEMSNAP_AGENT_MISMATCH",
      `bundle is for ${manifest.tenant}/${manifest.agent}, the config is for ${config.tenant}/${config.agent}`,
      { hint: "pass --as-agent to restore it into this agent anyway" },
    );
  }
  const keys = opts.keys ?? {};
  if (manifest.payload.encryption && !(keys.identities?.length || keys.passphrases?.length)) {
    throw new MemsnapError("MEMSNAP_IDENTITY_REQUIRED", "the bundle is encrypted and no identity was given", {
      hint: "pass --identity FILE (an age identity file) or --passphrase-file FILE",
    });
  }
  // A key that does not open the bundle fails here, before the lock, the hook and the safety snapshot.
  await checkBundleKey(layout, manifest, keys);
  // --path: which artifacts, from the index (the manifest's, else a first read of the payload).
  const selection = opts.paths?.length
    ? selectPaths(
        manifest,
        await loadIndex({ path: bundle, layout, manifest }, keys, opts.signal),
        opts.paths,
        opts.only,
      )
    : null;
  const selected = await selectLayers(manifest, config, selection ? [...selection.layers] : opts.only);
  for (const s of selected) {
    if (selection?.partial.has(s.layer.name) && s.target.mode !== "files") {
      throw new MemsnapError(
        "MEMSNAP_USAGE",
        `--path selects part of layer ${s.layer.name}, which is restored in place only whole`,
        {
          hint: `select the whole layer (--path ${s.layer.name}/), or restore the files with --to DIR`,
        },
      );
    }
  }
  const protect = new Protected(config);
  checkTargets(selected, protect);
  // An incremental bundle's bases are checked before anything is touched. A partial restore
  // (--only) needs only those its layers reference: known here from a plaintext index, else
  // once the bundle's own payload is read (into staging: still before anything live is touched).
  const partial = opts.only?.length || selection ? new Set(selected.map((s) => s.layer.name)) : null;
  const needed = partial ? basesNeeded(manifest, partial) : undefined;
  let bases = needed === null ? null : await openBases(bundle, manifest, needed);
  if (opts.dryRun) {
    const plan = await planRestore(layout, manifest, config, selected, keys, opts.signal, selection ?? undefined);
    const processes = await processesUsing(selected.map((s) => s.target));
    return {
      manifest,
      layers: selected.map((s) => s.layer.name),
      swaps: 0,
      bytes: 0,
      safetySnapshot: null,
      recovered: null,
      plan,
      processes,
      kept: [],
      notes: [],
      durationMs: performance.now() - t0,
    };
  }
  const lock: AgentLock = await acquireLock(config.baseDir, { waitMs: opts.waitMs ?? 0, command: "restore" });
  try {
    crashPoint("restore:locked");
    const rec = await recoverJournal(config);
    await opts.beforeRestore?.(selected.map((s) => s.layer.name));
    if (!opts.ignoreOpenFiles) refuseLiveProcesses(await processesUsing(selected.map((s) => s.target)));
    let safety: SnapshotResult | null = null;
    if (opts.safetySnapshot !== false) {
      if (!opts.store)
        throw new MemsnapError("MEMSNAP_USAGE", "a safety snapshot needs a store", {
          hint: "pass --store, or --no-safety-snapshot",
        });
      try {
        // Of the layers this restore replaces (all of them, or those --only names): restoring
        // it undoes the restore; the others are left as they are.
        const replaced = new Set(selected.map((s) => s.layer.name));
        safety = await snapshot({
          config: { ...config, sources: config.sources.filter((s) => replaced.has(s.cfg.name)) },
          store: opts.store,
          createdBy: "pre-restore",
          label: `auto:pre-restore-${manifest.snapshot_id}`,
          ...safetyEncryption(config, manifest, keys),
          redact: false,
          allowUnredacted: true,
          allowPlaintextMemory: true,
          lock: "held",
          ...(opts.signal ? { signal: opts.signal } : {}),
        });
      } catch (e) {
        // The live state of a layer to restore is missing (a new machine) or cannot be captured
        // as it is (damaged: what one restores over): the snapshot's own hint (fix the config,
        // re-export the dump) is not the way out here. Same code, same exit status.
        if (!isMemsnapError(e) || !SAFETY_SOURCE_CODES.has(e.code)) throw e;
        throw new MemsnapError(e.code, `cannot take the safety snapshot of the live agent: ${e.message}`, {
          ...(e.path ? { path: e.path } : {}),
          cause: e,
          hint:
            e.code === "MEMSNAP_SOURCE_MISSING"
              ? "nothing there to keep (a new machine?): pass --no-safety-snapshot to restore without one, " +
                "or restore into a new directory with --to"
              : "the live state cannot be kept as it is: " +
                "pass --no-safety-snapshot to restore over it without a copy, " +
                "or restore into a new directory with --to",
        });
      }
      crashPoint("restore:safety-snapshot-done");
    }
    // (Only [0-9a-z]: the tag is part of paths, and recover accepts no other.)
    const tag = `${manifest.snapshot_id
      .slice(-8)
      .toLowerCase()
      .replace(/[^0-9a-z]/g, "x")
      .padStart(8, "x")}${randomBytes(2).toString("hex")}`;
    const journal = newJournal(manifest.snapshot_id, layout.path);
    const kept: string[] = [];
    const roots = new Map<string, { staged: string; backup: string }>();
    for (const [k, s] of selected.entries()) {
      // One staging (and backup) directory per layer, even where layers share a live root (a
      // database file and state JSON side by side in the agent's directory): each layer's
      // rebuild and swaps see only its own files.
      const staged = stagingName(s.target.root, tag, k);
      const backup = backupName(s.target.root, tag, k);
      roots.set(s.layer.name, { staged, backup });
      journal.staging.push(staged);
      journal.backups.push(backup);
    }
    await writeJournal(config.baseDir, journal);
    crashPoint("restore:journal-staging");
    let swapping = false;
    try {
      // Each selected layer is materialized in its staging as soon as extraction has moved
      // past it (./materialize.ts); nothing is swapped before every layer is done.
      const bySelected = new Map(selected.map((s) => [s.layer.name, s]));
      const notes: string[] = [];
      const stagedRoots = (): Set<string> => new Set(selected.map((s) => roots.get(s.layer.name)!.staged));
      // Writeback of what is staged starts while later layers extract (see EarlySync).
      const early = new EarlySync(stagedRoots);
      const mat = new LayerMaterializer(async (name, verified) => {
        const s = bySelected.get(name);
        if (!s) return;
        const dir = roots.get(name)!.staged;
        opts.signal?.throwIfAborted();
        await mkdir(dir, { recursive: true });
        notes.push(...((await s.source.impl.materialize?.(dir, s.layer, verified, opts.signal)) ?? []));
        await s.target.keepLive?.(dir);
        early.kick();
      });
      // A layer with references to a base is complete only once the base has been read.
      const deferred = new Set(manifest.layers.filter((l) => referencedIn(manifest, l) > 0).map((l) => l.name));
      const refs = new References();
      const wanted = selection ? new References() : refs; // the references --path selects
      const attributes = new RestoredAttributes();
      let r;
      try {
        r = await extractPayload(layout, manifest, (layer) => roots.get(layer)?.staged ?? null, {
          keys,
          onLayerDone: (l) => {
            if (!deferred.has(l)) mat.layerDone(l);
          },
          entries: mat.verified,
          onEntry: (e) => early.bytes(e.size),
          attributes,
          onRef: (a) => {
            refs.add(a);
            if (selection?.want(a.path) ?? true) wanted.add(a);
          },
          ...(selection ? { want: selection.want } : {}),
          // A keyed restore: see ReadPayloadOptions.skipStoredHash (a plaintext payload is hashed all the same).
          skipStoredHash: true,
          ...(opts.signal ? { signal: opts.signal } : {}),
          ...(opts.onProgress ? { onProgress: opts.onProgress } : {}),
        });
        checkReferencedLayers(manifest, refs);
        if (wanted.count) {
          let done = r.entries.bytes();
          bases ??= await openBases(bundle, manifest, wanted.basesIn(partial ?? undefined));
          await extractReferenced(bases, wanted, (layer) => roots.get(layer)?.staged ?? null, {
            keys,
            ...(opts.signal ? { signal: opts.signal } : {}),
            verified: mat.verified,
            ...(partial ? { layers: partial } : {}),
            skipStoredHash: true,
            onProgress: (n) => {
              done += n;
              early.bytes(n);
              opts.onProgress?.(done, manifest.payload.bytes);
            },
            attributes,
          });
        }
      } catch (e) {
        await mat.settle();
        throw e;
      }
      await mat.finish(bySelected.keys());
      // Every staged byte is on disk before the journal says "swapping" (one syncfs per staged
      // root, not an fsync per file): from then on, recovery rolls forward to these files.
      await early.settle();
      attributes.apply(); // modes and mtimes, synced with the rest
      for (const staged of stagedRoots()) await syncFilesystem(staged);
      crashPoint("restore:staged");
      for (const s of selected) {
        const { staged, backup } = roots.get(s.layer.name)!;
        journal.swaps.push(
          ...(await buildSwaps(s, staged, backup, protect, kept, selection?.perFile.has(s.layer.name))),
        );
      }
      // The same check recover makes, and the live tree's: no symlink or file on the way, no
      // directory where a file goes. A refusal here changes nothing live.
      const own: LiveRoot[] = selected.map((s) => ({
        ...s.target,
        layer: s.layer.name,
        realRoot: realish(s.target.root),
      }));
      journal.phase = "swapping";
      const checked = checkJournal(journal, await journalScope(config, own), (why, path) => refusedPath(why, path));
      await writeJournal(config.baseDir, journal);
      swapping = true;
      crashPoint("restore:journal-swapping");
      await rollForward(config.baseDir, journal, checked, swapFailure);
      const bytes = r.entries.bytes((name) => roots.has(name.split("/")[0]!) && (!selection || selection.want(name)));
      return {
        manifest,
        layers: selected.map((s) => s.layer.name),
        swaps: journal.swaps.length,
        bytes,
        safetySnapshot: safety,
        recovered: rec?.action ?? null,
        kept,
        notes,
        durationMs: performance.now() - t0,
      };
    } catch (e) {
      // Before the swap phase the live state is untouched: remove staging and the journal.
      if (!swapping) {
        await cleanup(config.baseDir, journal).catch(() => undefined);
        throw interruptedOr(e, opts.signal, "restore interrupted", "nothing was restored; the live state is as it was");
      }
      throw e;
    }
  } finally {
    await lock.release();
  }
}

/** `memsnap recover`: finish or roll back an interrupted restore, under the agent's lock. */
export async function recoverAgent(
  config: MemsnapConfig,
  opts: { waitMs?: number } = {},
): Promise<{ action: "rolled-back" | "completed" | "none"; snapshotId: string | null }> {
  const lock = await acquireLock(config.baseDir, { waitMs: opts.waitMs ?? 0, command: "recover" });
  try {
    const r = await recoverJournal(config);
    return r ? { action: r.action, snapshotId: r.journal.snapshot_id } : { action: "none", snapshotId: null };
  } finally {
    await lock.release();
  }
}
