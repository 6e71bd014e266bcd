/** Capturing a git source: the bundle (or the last snapshot's, reused), the work tree and the history scan. */
import type { ChildProcessWithoutNullStreams } from "node:child_process";
import { createHash } from "node:crypto";
import { createReadStream } from "node:fs";
import { mkdtemp, rm, stat } from "node:fs/promises";
import { join, resolve } from "node:path";
import { Readable } from "node:stream";
import { MemsnapError } from "../../errors.js";
import type { Redactor } from "../../redact/types.js";
import { readAhead } from "../prefetch.js";
import type { Artifact, CaptureContext, LayerCapture } from "../types.js";
import { fileArtifact, fingerprintOf, SMALL_FILE, walkNotices, type FoundFile } from "../walk.js";
import type { GitConfig } from "./config.js";
import { findRepo, stateFlags, type RepoPaths } from "./discover.js";
import { lexists as exists } from "../../util/fs-atomic.js";
import {
  BUNDLE_ARTIFACT,
  commitFacts,
  packObjectCount,
  readBundleHeader,
  WORKTREE_DIR,
  WORKTREE_DOC_ARTIFACT,
  type BundleHeader,
  type HeadFacts,
  type WorktreeDoc,
} from "./format.js";
import {
  LINK_FRACTION,
  linkArtifact,
  MAX_LINKS,
  MAX_TIPS,
  orderChain,
  parseTips,
  tipsReachable,
  writeLink,
  type ChainLink,
} from "./chain.js";
import { scanHistoryGit, type HistoryScan } from "./history-scan.js";
import { PACK_INDEX_ARTIFACT, PACK_INDEX_KIND } from "./pack-index.js";
import { isoRepoFacts, isoScanObjects, isoStatus, isoWriteBundle, type StatusEntry } from "./iso.js";
import {
  gitEnv,
  gitImpl,
  gitIn,
  neutralizeFilters,
  GIT_MEMORY_CONFIG,
  sourceInvalid,
  type GitCtx,
} from "./run.js";
import { classify, listWorktreeGit, type WorktreeListing } from "./worktree.js";

interface CaptureState {
  bundle: string | null;
  bundleSize: number;
  /** The artifact the new bundle is written as: repo.bundle, or the chain's next link. */
  bundleName: string;
  /** The bundle's incremental fingerprint (its refs), when there is a bundle. */
  bundleFingerprint?: string;
  /** An incremental snapshot references the last one's bundle: none was written now (`bundle` is null). */
  reused?: { bytes: number; scan: HistoryScan | null };
  /**
   * An incremental snapshot references the last one's chain of bundles (./chain.ts); `bundle`,
   * when not null, is its next link. `scan`: the history scan of the referenced bundles.
   */
  chain?: { links: ChainLink[]; scan: HistoryScan | null };
  /** The objects the bundle's refs and HEAD point at (the layer meta's `bundle_tips`). */
  tips?: string[];
  /**
   * The pack index of the full bundle (./pack-index.ts): written now (`path`), or the last
   * snapshot's, referenced (`path` null, `fingerprint` its bundle's).
   */
  index?: { path: string | null; bytes: number; fingerprint: string };
  listing: WorktreeListing | null;
  meta: Record<string, unknown>;
  scan: Promise<HistoryScan> | null;
}

/**
 * The incremental fingerprint of a repository's bundle: its refs (names and object ids), HEAD
 * and object format. A bundle holds exactly the objects reachable from its refs, and objects are
 * named by their content, so the last snapshot's bundle of the same refs is a bundle of this
 * repository as it is now: an incremental snapshot references it instead of writing and
 * scanning the history again (a commit, a new branch or a moved tag changes the fingerprint).
 */
export function refsFingerprint(
  impl: string,
  objectFormat: string,
  headRef: string | null,
  headOid: string | null,
  refs: readonly string[],
): string {
  const h = createHash("sha256").update(`${impl}\n${objectFormat}\nHEAD ${headRef ?? "-"} ${headOid ?? "-"}\n`);
  for (const r of [...refs].sort()) h.update(`${r}\n`);
  return `git-refs:${h.digest("hex")}`;
}

/**
 * The last incremental snapshot's pack index of its full bundle (whose fingerprint is
 * `fingerprint`), when it will be referenced with that bundle.
 */
function reusableIndex(
  ctx: CaptureContext | undefined,
  layer: string,
  fingerprint: string,
): CaptureState["index"] {
  const meta = ctx?.unchanged?.(`${layer}/${PACK_INDEX_ARTIFACT}`, fingerprint, PACK_INDEX_KIND);
  const bytes = meta?.bundle_index_bytes;
  if (typeof bytes !== "number" || !Number.isSafeInteger(bytes) || bytes <= 0) return undefined;
  return { path: null, bytes, fingerprint };
}

/**
 * The last incremental snapshot's bundle, when one with this fingerprint will be referenced:
 * its size and history scan, from the layer meta of the bundle holding it. A meta without them
 * (written before memsnap recorded `bundle_bytes`), or without a scan where this snapshot
 * redacts, is not reused.
 */
function reusableBundle(
  ctx: CaptureContext | undefined,
  artifact: string,
  fingerprint: string,
  redacting: boolean,
): CaptureState["reused"] {
  const meta = ctx?.unchanged?.(artifact, fingerprint, "git-bundle");
  const bytes = meta?.bundle_bytes;
  if (typeof bytes !== "number" || !Number.isSafeInteger(bytes) || bytes <= 0) return undefined;
  const scan = meta?.history_scan;
  if (redacting && (scan === null || typeof scan !== "object")) return undefined;
  return { bytes, scan: redacting ? (scan as HistoryScan) : null };
}

function worktreeDoc(listing: WorktreeListing): WorktreeDoc {
  return {
    format: "memsnap-git-worktree",
    version: 1,
    deleted: listing.deleted,
    executable: listing.files.filter((f) => (f.stats.mode & 0o111) !== 0).map((f) => f.rel),
  };
}

function worktreeMeta(cfg: GitConfig, listing: WorktreeListing | null): Record<string, unknown> {
  if (!cfg.worktree || !listing) return { captured: false };
  return { captured: true, method: listing.method, ...listing.counts, skipped: listing.skipped };
}

async function captureGit(
  cfg: GitConfig,
  root: string,
  repo: RepoPaths,
  work: string,
  signal: AbortSignal | undefined,
  redactor: Redactor | undefined,
  children: Set<ChildProcessWithoutNullStreams>,
  ctx?: CaptureContext,
): Promise<CaptureState> {
  const base: GitCtx = {
    cwd: root,
    env: gitEnv({ GIT_DIR: repo.dotgit, GIT_WORK_TREE: root }),
    ...(signal ? { signal } : {}),
  };
  // First a plain call that fails cleanly on something that is not a usable repository.
  const fmt = (await gitIn(root, base, ["rev-parse", "--show-object-format"])).stdout.toString("utf8").trim() || "sha1";
  const [partial, sym, hv, refList, filters] = await Promise.all([
    gitIn(root, base, ["config", "--get", "extensions.partialclone"], [0, 1]),
    gitIn(root, base, ["symbolic-ref", "-q", "HEAD"], [0, 1]),
    gitIn(root, base, ["rev-parse", "-q", "--verify", "HEAD"], [0, 1]),
    gitIn(root, base, ["for-each-ref", "--format=%(objectname) %(refname)"]),
    neutralizeFilters(root, base),
  ]);
  if (partial.code === 0) {
    throw sourceInvalid(
      root,
      `${root} is a partial clone (objects are missing by design)`,
      "fetch every object first (git fetch --refetch, or clone without --filter), then snapshot again",
    );
  }
  const headRef = sym.code === 0 ? sym.stdout.toString("utf8").trim() : null;
  const headOid = hv.code === 0 ? hv.stdout.toString("utf8").trim() : null;
  const refLines = refList.stdout.toString("utf8").split("\n").filter(Boolean);
  const refOids = refLines.map((l) => l.slice(0, l.indexOf(" ")));
  const g: GitCtx = {
    ...base,
    env: gitEnv({ GIT_DIR: repo.dotgit, GIT_WORK_TREE: root }, [...filters, ...GIT_MEMORY_CONFIG]),
  };
  const bundleFingerprint =
    refOids.length > 0 || headOid ? refsFingerprint("git", fmt, headRef, headOid, refLines) : undefined;
  const tips = [...new Set([...refOids, ...(headOid ? [headOid] : [])])];
  // An incremental snapshot continues the last one's chain of bundles (./chain.ts) when it can;
  // a last one that recorded no chain has its single bundle referenced when no ref moved.
  const last = ctx?.lastMeta?.(cfg.name) ?? null;
  const chained = last !== null && "bundle_chain" in last;
  const chain =
    bundleFingerprint && chained && ctx
      ? await chainPlan(ctx, cfg.name, last, fmt, bundleFingerprint, !!redactor, root, g, children)
      : null;
  const reused =
    bundleFingerprint && !chained
      ? reusableBundle(ctx, `${cfg.name}/${BUNDLE_ARTIFACT}`, bundleFingerprint, !!redactor)
      : undefined;
  const link = chain?.fresh ? chain : null;
  const bundleName = link ? linkArtifact(link.links.length) : BUNDLE_ARTIFACT;
  const bundle = bundleFingerprint && !reused && (!chain || link) ? join(work, bundleName) : null;
  const artifact = `${cfg.name}/${bundleName}`;
  // A full bundle is written with its pack's index (./pack-index.ts), which restore installs
  // instead of indexing the pack again; an object directory whose path git's list of alternates
  // cannot hold as is gets none.
  const objects = resolve(repo.commondir, "objects");
  const indexOut = bundle && !link && /^[^:"\\\0-\x1f]+$/.test(objects) ? join(work, PACK_INDEX_ARTIFACT) : null;
  // The HEAD commit, the work-tree listing and the bundle are independent: run them at once.
  const [head, listing, header] = await Promise.all([
    headOid ? gitIn(root, base, ["cat-file", "commit", headOid]).then((r) => commitFacts(headOid, r.stdout)) : null,
    cfg.worktree ? listWorktreeGit(root, g, headOid !== null) : null,
    bundle && link
      ? writeLink(root, g, bundle, fmt, tips, link.tips, refLines, headOid, children).then(() => null)
      : bundle
        ? (async (): Promise<BundleHeader> => {
            // The bundle `git bundle create --all` would write, of the refs just read, but by one
            // git process, not two: its parent (17 MiB on the realistic home) only relays the
            // pack into the file, and pack-objects (59 MiB) ran beside it.
            const index = indexOut ? { out: indexOut, objects } : undefined;
            await writeLink(root, g, bundle, fmt, tips, [], refLines, headOid, children, index);
            const h = await readBundleHeader(bundle);
            if (typeof h === "string") throw sourceInvalid(root, `the bundle written for ${root} is bad: ${h}`);
            return h;
          })()
        : null,
  ]);
  const bundleSize = bundle ? (await stat(bundle)).size : 0;
  const index: CaptureState["index"] =
    indexOut && bundleFingerprint
      ? { path: indexOut, bytes: (await stat(indexOut)).size, fingerprint: bundleFingerprint }
      : reused && bundleFingerprint
        ? reusableIndex(ctx, cfg.name, bundleFingerprint)
        : chain
          ? reusableIndex(ctx, cfg.name, chain.links[0]!.fingerprint)
          : undefined;
  // The history scan starts once the bundle is written, from the refs the bundle holds (a ref
  // that moved while it was written is in its header); a link's scan covers only what the link
  // holds. Not alongside `git bundle create`: the scan's three git processes and the bundle's
  // two at once came to ~75 MiB more of the process tree's peak RSS, over the 200 MiB target
  // on a memdir of 3k commits, for no gain in wall time (the layer before is still packing).
  const bundleTips = header ? [...new Set(header.refs.map((r) => r.oid))] : tips;
  const scanRevs = link ? [...tips, ...link.tips.map((o) => `^${o}`)] : bundleTips;
  // A whole bundle (every ref, no prerequisites) is scanned from the object store when the
  // store holds just its objects (./history-scan.ts).
  const packObjects = header && !header.prerequisites.length ? await packObjectCount(bundle!, header.packOffset) : null;
  const whole = packObjects !== null ? { packObjects, spool: join(work, "history-scan.oids") } : undefined;
  const scan = redactor && bundle ? scanHistoryGit(root, g, scanRevs, redactor, artifact, children, whole) : null;
  scan?.catch(() => undefined);
  const refCount = header
    ? header.refs.filter((r) => r.name !== "HEAD").length
    : bundleFingerprint
      ? refLines.length
      : 0;
  return {
    bundle,
    bundleSize,
    bundleName,
    listing,
    scan,
    ...(bundleFingerprint ? { bundleFingerprint } : {}),
    ...(reused ? { reused } : {}),
    ...(chain ? { chain: { links: chain.links, scan: chain.scan } } : {}),
    ...(ctx?.lastMeta && bundleFingerprint ? { tips: bundleTips } : {}),
    ...(index ? { index } : {}),
    meta: {
      impl: "git",
      object_format: fmt,
      ...headMeta(head, headRef, headOid, refCount),
    },
  };
}

function addScans(a: HistoryScan, b: HistoryScan): HistoryScan {
  const sum = Object.entries(a).map(([k, v]) => [k, v + b[k as keyof HistoryScan]]);
  return Object.fromEntries(sum) as unknown as HistoryScan;
}

/**
 * Whether this incremental snapshot continues the last one's chain (its meta `last`): every
 * bundle of it referenced, and then either nothing new (`fresh` false: no ref moved) or a link
 * of the objects since its tips. Null where the policy in ./chain.ts asks for a full bundle.
 */
async function chainPlan(
  ctx: CaptureContext,
  layer: string,
  last: Record<string, unknown>,
  fmt: string,
  fingerprint: string,
  redacting: boolean,
  root: string,
  g: GitCtx,
  children: Set<ChildProcessWithoutNullStreams>,
): Promise<{ links: ChainLink[]; tips: string[]; scan: HistoryScan | null; fresh: boolean } | null> {
  if (last.impl !== "git" || last.object_format !== fmt) return null;
  const links = orderChain(last.bundle_chain);
  const tips = parseTips(last.bundle_tips);
  if (typeof links === "string" || !tips) return null;
  const scan = last.history_scan;
  if (redacting && (scan === null || typeof scan !== "object")) return null;
  const held = (l: ChainLink): boolean =>
    ctx.unchanged?.(`${layer}/${l.artifact}`, l.fingerprint, "git-bundle") != null;
  if (!links.every(held)) return null;
  const out = { links, tips, scan: redacting ? (scan as HistoryScan) : null };
  if (links.at(-1)!.fingerprint === fingerprint) return { ...out, fresh: false };
  if (links.length > MAX_LINKS) return null;
  if (links.slice(1).reduce((n, l) => n + l.bytes, 0) > links[0]!.bytes * LINK_FRACTION) return null;
  if (!(await tipsReachable(root, g, tips, children))) return null;
  return { ...out, fresh: true };
}

function headMeta(
  head: HeadFacts | null,
  headRef: string | null,
  headOid: string | null,
  refCount: number,
): Record<string, unknown> {
  return {
    empty: headOid === null && refCount === 0,
    bundle: headOid !== null || refCount > 0,
    head,
    branch: headRef === null ? null : headRef.startsWith("refs/heads/") ? headRef.slice(11) : headRef,
    detached: headRef === null,
    ref_count: refCount,
  };
}

async function captureIso(
  cfg: GitConfig,
  root: string,
  repo: RepoPaths,
  work: string,
  signal: AbortSignal | undefined,
  redactor: Redactor | undefined,
  ctx?: CaptureContext,
): Promise<CaptureState> {
  const wrap = async <T>(what: string, p: () => Promise<T>): Promise<T> => {
    try {
      return await p();
    } catch (e) {
      if (e instanceof MemsnapError) throw e;
      throw sourceInvalid(root, `isomorphic-git could not ${what} ${root}: ${(e as Error).message}`);
    }
  };
  const facts = await wrap("read", () => isoRepoFacts(repo.gitdir));
  const listing = cfg.worktree
    ? await classify(
        root,
        (await wrap("list the work tree of", () => isoStatus(root, repo.gitdir))).map((s: StatusEntry) => ({
          path: s.path,
          tracked: s.change !== "new",
        })),
        "isomorphic-git",
      )
    : null;
  let bundle: string | null = null;
  let bundleSize = 0;
  let scan: Promise<HistoryScan> | null = null;
  const artifact = `${cfg.name}/${BUNDLE_ARTIFACT}`;
  const bundleFingerprint =
    facts.refs.length > 0 || facts.headOid
      ? refsFingerprint(
          "isomorphic-git",
          "sha1",
          facts.headRef,
          facts.headOid,
          facts.refs.map((r) => `${r.oid} ${r.name}`),
        )
      : undefined;
  const reused = bundleFingerprint ? reusableBundle(ctx, artifact, bundleFingerprint, !!redactor) : undefined;
  if (bundleFingerprint && !reused) {
    bundle = join(work, BUNDLE_ARTIFACT);
    const out = bundle;
    const objects = await wrap("bundle", () => isoWriteBundle(repo.gitdir, facts, out));
    bundleSize = (await stat(bundle)).size;
    if (redactor) {
      scan = wrap("scan the history of", () => isoScanObjects(repo.gitdir, objects, redactor, artifact, signal));
    }
  }
  return {
    bundle,
    bundleSize,
    bundleName: BUNDLE_ARTIFACT,
    listing,
    scan,
    ...(bundleFingerprint ? { bundleFingerprint } : {}),
    ...(reused ? { reused } : {}),
    meta: {
      impl: "isomorphic-git",
      object_format: "sha1",
      ...headMeta(facts.head, facts.headRef, facts.headOid, facts.refs.length),
    },
  };
}

// ------------------------------------------------------------------------------ the layer

/**
 * The chain of bundles the layer meta records (in an incremental snapshot with the git binary,
 * for the next one to continue): the referenced bundles, then the one written now; null when
 * not recorded.
 */
function chainMeta(cap: CaptureState): ChainLink[] | null {
  if (!cap.tips || !cap.bundleFingerprint) return null;
  const fingerprint = cap.bundleFingerprint;
  const prior =
    cap.chain?.links ?? (cap.reused ? [{ artifact: BUNDLE_ARTIFACT, fingerprint, bytes: cap.reused.bytes }] : []);
  if (!cap.bundle) return prior.length ? prior : null;
  const after = prior.at(-1)?.artifact;
  return [...prior, { artifact: cap.bundleName, fingerprint, bytes: cap.bundleSize, ...(after ? { after } : {}) }];
}

/** Capture a git source: a bundle of every ref, plus the uncommitted and untracked files. */
export async function captureLayer(cfg: GitConfig, ctx: CaptureContext): Promise<LayerCapture> {
  const root = resolve(ctx.baseDir, cfg.path);
  const repo = await findRepo(root);
  if (await exists(join(repo.commondir, "shallow"))) {
    throw sourceInvalid(
      root,
      `${root} is a shallow clone: unshallow it first (its bundle would lack history)`,
      `run 'git fetch --unshallow' in ${root}, then snapshot again`,
    );
  }
  const state = await stateFlags(repo);
  const impl = gitImpl();
  // Absolute: git runs with the repository as its working directory.
  const work = await mkdtemp(join(resolve(ctx.tmpDir), "git-"));
  const children = new Set<ChildProcessWithoutNullStreams>();
  const redactor = ctx.redactor;
  let cap: CaptureState;
  try {
    cap =
      impl === "git"
        ? await captureGit(cfg, root, repo, work, ctx.signal, redactor, children, ctx)
        : await captureIso(cfg, root, repo, work, ctx.signal, redactor, ctx);
    cap.scan?.catch(() => undefined); // awaited in finish(); don't let an early failure go unhandled
    const head = cap.meta.head as HeadFacts | null;
    if (head && redactor?.candidate(head.subject)) {
      // The subject lands in the manifest, which is plaintext even in an encrypted bundle.
      head.subject = await redactor.redactText(head.subject, "manifest.json");
    }
  } catch (e) {
    for (const c of children) c.kill("SIGKILL");
    await rm(work, { recursive: true, force: true });
    throw e;
  }
  const listing = cap.listing;
  const docBytes = listing ? Buffer.from(`${JSON.stringify(worktreeDoc(listing), null, 1)}\n`, "utf8") : null;
  const now = new Date();
  const links = chainMeta(cap);
  const referenced = (path: string, size: number, fingerprint: string, kind = "git-bundle"): Artifact => ({
    path,
    kind,
    size,
    mode: 0o600,
    mtime: now,
    fingerprint,
    open: () => {
      throw new MemsnapError(
        "MEMSNAP_INTERNAL",
        `${cfg.name}/${path} was to be referenced by the incremental snapshot, not read`,
      );
    },
  });
  return {
    // A chain of more than one bundle is schema 2: a reader that knows only single bundles
    // refuses it; a pack index (with one bundle or a chain) is schema 3.
    schemaVersion: cap.index ? 3 : links && links.length > 1 ? 2 : 1,
    estimatedBytes:
      cap.bundleSize + (cap.index?.path ? cap.index.bytes : 0) + (docBytes?.length ?? 0) + (listing?.files.reduce((n, f) => n + f.stats.size, 0) ?? 0),
    notices: () => walkNotices(listing ?? {}),
    artifacts: (async function* (): AsyncGenerator<Artifact> {
      const fingerprint = cap.bundleFingerprint;
      // The chain's bundles in order: the last snapshot's, referenced, then the new link.
      for (const l of cap.chain?.links ?? []) yield referenced(l.artifact, l.bytes, l.fingerprint);
      if (cap.bundle) {
        const path = cap.bundle;
        yield {
          path: cap.bundleName,
          kind: "git-bundle",
          size: cap.bundleSize,
          mode: 0o600,
          mtime: now,
          ...(fingerprint ? { fingerprint } : {}),
          open: () => createReadStream(path, { highWaterMark: 1 << 20 }),
        };
      } else if (cap.reused && fingerprint) {
        yield referenced(BUNDLE_ARTIFACT, cap.reused.bytes, fingerprint);
      }
      const ix = cap.index;
      if (ix?.path) {
        const path = ix.path;
        yield {
          path: PACK_INDEX_ARTIFACT,
          kind: PACK_INDEX_KIND,
          size: ix.bytes,
          mode: 0o600,
          mtime: now,
          fingerprint: ix.fingerprint,
          open: () => createReadStream(path, { highWaterMark: 1 << 20 }),
        };
      } else if (ix) yield referenced(PACK_INDEX_ARTIFACT, ix.bytes, ix.fingerprint, PACK_INDEX_KIND);
      if (docBytes) {
        yield {
          path: WORKTREE_DOC_ARTIFACT,
          kind: "json",
          size: docBytes.length,
          mode: 0o600,
          mtime: now,
          open: () => Readable.from([docBytes]),
        };
      }
      // The work tree's small files are read ahead in batches off the main thread, as a files
      // layer's are (./prefetch.ts), except those an incremental snapshot will reference.
      const files = (async function* (): AsyncGenerator<FoundFile> {
        yield* listing?.files ?? [];
      })();
      for await (const { f, pre } of readAhead(files, root, (x) => {
        if (x.stats.size >= SMALL_FILE) return null;
        const path = `${cfg.name}/${WORKTREE_DIR}/${x.rel}`;
        if (ctx.unchanged?.(path, fingerprintOf(x.stats), "file") != null) return null;
        return x.stats.size + 1;
      })) {
        const a = fileArtifact(f, "file", `${WORKTREE_DIR}/${f.rel}`, undefined, pre);
        a.text = true;
        a.fingerprint = fingerprintOf(f.stats);
        yield a;
      }
    })(),
    finish: async () => {
      const fresh = cap.scan ? await cap.scan : null;
      const prior = cap.reused?.scan ?? cap.chain?.scan ?? null;
      const scan = prior && fresh ? addScans(prior, fresh) : (prior ?? fresh);
      const bundleBytes = links
        ? links.reduce((n, l) => n + l.bytes, 0)
        : (cap.reused?.bytes ?? (cap.bundle ? cap.bundleSize : undefined));
      const nothingNew = !cap.bundle && (cap.reused !== undefined || cap.chain !== undefined);
      return {
        root,
        ...cap.meta,
        state,
        worktree: worktreeMeta(cfg, listing),
        history_scan: scan,
        ...(bundleBytes !== undefined ? { bundle_bytes: bundleBytes } : {}),
        ...(cap.index ? { bundle_index_bytes: cap.index.bytes } : {}),
        ...(nothingNew ? { bundle_reused: true } : {}),
        ...(links ? { bundle_chain: links } : {}),
        ...(links && cap.tips && cap.tips.length <= MAX_TIPS ? { bundle_tips: cap.tips } : {}),
      };
    },
    cleanup: async () => {
      for (const c of children) c.kill("SIGKILL");
      await cap.scan?.catch(() => undefined);
      await rm(work, { recursive: true, force: true });
    },
  };
}
