/**
 * The `git` source: a memory directory that is a git repository.
 *
 * Artifacts of a layer:
 *   repo.bundle            kind `git-bundle`: a standard git bundle of every ref (and HEAD);
 *                          absent when the repository has no commit yet
 *   repo.<n>.bundle        kind `git-bundle`, schema 2 (an incremental snapshot): the chain's
 *                          links, each of the objects since the bundle before it (./chain.ts)
 *   repo.idx               kind `git-pack-index`, schema 3: git's index (v2) of repo.bundle's
 *                          pack, which restore installs the pack with (./pack-index.ts); the
 *                          layer meta's `bundle_index_bytes` declares it
 *   worktree-deleted.json  kind `json`: tracked paths missing from the work tree, and which
 *                          captured work-tree files are executable (see WorktreeDoc)
 *   worktree/<path>        kind `file`, text: modified, added and untracked files (ignored
 *                          files are not captured), byte for byte before redaction
 *
 * `.git/config`, hooks, the index, reflogs and lock files are never captured: the bundle
 * carries objects and refs only, and restore builds a fresh `.git` (in place, it then keeps
 * the live repository's own config, hooks/ and info/: keepLiveRepoFiles). A symlink of the
 * checked-out tree is written as a plain file holding its target, with core.symlinks=false:
 * restore creates no link a bundle asks for (materialize returns a note saying so).
 *
 * Every git command runs with execFile/spawn (never a shell) in a sanitized environment
 * (./run.ts); without a git binary isomorphic-git does the work (./iso.ts). With redaction on,
 * the history is scanned (./history-scan.ts).
 */
import { execFile } from "node:child_process";
import { createHash } from "node:crypto";
import { createWriteStream } from "node:fs";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { Readable } from "node:stream";
import { pipeline } from "node:stream/promises";
import type { LayerEntry } from "../../format/manifest.js";
import type { SourceKind } from "../types.js";
import { captureLayer } from "./capture.js";
import { parseGitConfig, type GitConfig } from "./config.js";
import { BUNDLE_ARTIFACT, parseWorktreeDoc, WORKTREE_DOC_ARTIFACT, WORKTREE_DOC_MAX } from "./format.js";
import { keepLiveRepoFiles } from "./keep-live.js";
import { materializeLayer } from "./materialize.js";
import { deepVerifyChainBundle, verifyBundleFile } from "./verify.js";
import { isBundleName, orderChain } from "./chain.js";
import { declaredIndexBytes, PACK_INDEX_ARTIFACT } from "./pack-index.js";
import { gitImpl } from "./run.js";

/** Per layer of one verify: the SHA-256 of the stored pack index and of the one git wrote for the pack. */
const indexDigests = new WeakMap<LayerEntry, { stored?: string; computed?: string }>();

/** Record one side; once both are known, why they differ (reported on `path`), or null. */
function matchIndex(layer: LayerEntry, side: "stored" | "computed", sha256: string, path: string): string | null {
  const d = indexDigests.get(layer) ?? {};
  d[side] = sha256;
  indexDigests.set(layer, d);
  if (d.stored === undefined || d.computed === undefined) return null;
  if (d.stored === d.computed) return null;
  return side === "stored"
    ? `${path}: not the index git writes for ${layer.name}/${BUNDLE_ARTIFACT}'s pack`
    : `${path}: ${layer.name}/${PACK_INDEX_ARTIFACT} is not the index git writes for this bundle's pack`;
}

/** A git repository: a bundle of every ref, plus the uncommitted and untracked files. */
export const gitSource: SourceKind<GitConfig> = {
  kind: "git",
  // 2: a chain of bundles (./chain.ts); 3: a pack index of the full bundle (./pack-index.ts);
  // a layer with a single bundle and no index is still written as 1.
  schemaVersion: 3,
  parseConfig: parseGitConfig,
  capture: captureLayer,

  async deepVerify(ctx) {
    const { entry, bytes } = ctx;
    const rel = entry.path.startsWith(`${entry.layer}/`) ? entry.path.slice(entry.layer.length + 1) : entry.path;
    if (rel === WORKTREE_DOC_ARTIFACT) {
      const parts: Buffer[] = [];
      let n = 0;
      for await (const c of bytes) {
        n += c.length;
        if (n > WORKTREE_DOC_MAX) return `${entry.path}: over ${WORKTREE_DOC_MAX} bytes`;
        parts.push(c);
      }
      const doc = parseWorktreeDoc(Buffer.concat(parts));
      return typeof doc === "string" ? `${entry.path}: ${doc}` : null;
    }
    // The full bundle's pack index, when the layer meta declares one (restore uses it then,
    // with the git binary): it must be the index git writes for the bundle's pack.
    const indexed = ctx.layer !== undefined && declaredIndexBytes(ctx.layer) !== null && gitImpl() === "git";
    if (rel === PACK_INDEX_ARTIFACT) {
      if (!indexed) return null;
      const h = createHash("sha256");
      let n = 0;
      for await (const c of bytes) {
        h.update(c);
        n += c.length;
      }
      const declared = declaredIndexBytes(ctx.layer!);
      if (n !== declared) return `${entry.path}: ${n} bytes, but the layer meta declares ${declared}`;
      return matchIndex(ctx.layer!, "stored", h.digest("hex"), entry.path);
    }
    if (!isBundleName(rel)) return null;
    if (entry.layer && ctx.layer?.meta && "bundle_chain" in ctx.layer.meta) {
      const chain = orderChain(ctx.layer.meta.bundle_chain);
      if (typeof chain === "string") return `${entry.path}: ${chain}`;
      if (!chain.some((l) => l.artifact === rel)) return `${entry.path}: not a bundle of the layer's chain`;
      if (chain.length > 1) {
        const r = await deepVerifyChainBundle(ctx.layer, chain, rel, bytes, indexed);
        if (r.problem) return `${entry.layer}: the chain of git bundles is not sound: ${r.problem}`;
        return r.indexSha256 ? matchIndex(ctx.layer, "computed", r.indexSha256, `${entry.layer}/${BUNDLE_ARTIFACT}`) : null;
      }
    }
    if (rel !== BUNDLE_ARTIFACT) return null;
    const scratch = await mkdtemp(join(tmpdir(), "memsnap-gitverify-"));
    try {
      const file = join(scratch, BUNDLE_ARTIFACT);
      await pipeline(Readable.from(bytes), createWriteStream(file, { mode: 0o600 }));
      const r = await verifyBundleFile(file, indexed);
      if (r.problem) return `${entry.path}: not a valid git bundle: ${r.problem}`;
      return r.indexSha256 ? matchIndex(ctx.layer!, "computed", r.indexSha256, entry.path) : null;
    } finally {
      await rm(scratch, { recursive: true, force: true });
    }
  },

  async liveTarget(cfg, baseDir) {
    // The whole memdir is replaced by the rebuilt repository: a fresh .git (never the bundle's
    // config or hooks) that keeps the live repository's own config, hooks and info/.
    const root = resolve(baseDir, cfg.path);
    return { root, mode: "dir", keepLive: (staged: string) => keepLiveRepoFiles(root, staged) };
  },

  async planLayer(cfg, baseDir, layer) {
    const root = resolve(baseDir, cfg.path);
    const after = (layer.meta?.head as { oid?: string; subject?: string } | null | undefined) ?? null;
    const before = await new Promise<string | null>((res) => {
      execFile(
        "git",
        ["-C", root, "-c", "core.hooksPath=/dev/null", "rev-parse", "--verify", "-q", "HEAD"],
        {
          env: {
            PATH: process.env.PATH ?? "",
            HOME: process.env.HOME ?? "",
            GIT_CONFIG_NOSYSTEM: "1",
            GIT_TERMINAL_PROMPT: "0",
            GIT_OPTIONAL_LOCKS: "0",
          },
          encoding: "utf8",
        },
        (err, out) => res(err ? null : out.trim() || null),
      );
    });
    const short = (o: string | null | undefined): string => (o ? o.slice(0, 12) : "(none)");
    const branch = typeof layer.meta?.branch === "string" ? ` on ${layer.meta.branch}` : "";
    const subject = after?.subject ? ` (${after.subject})` : "";
    return [`git HEAD ${short(before)} → ${short(after?.oid)}${branch}${subject}`];
  },

  materialize: materializeLayer,
};
