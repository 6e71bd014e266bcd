/** Restoring a git layer: a fresh repository from the bundle, HEAD as recorded, then the work-tree state. */
import { spawn } from "node:child_process";
import type { Stats } from "node:fs";
import { chmod, lstat, mkdir, mkdtemp, readdir, readFile, rename, rm, rmdir, unlink } from "node:fs/promises";
import { basename, dirname, join, resolve } from "node:path";
import { MemsnapError, destinationError } from "../../errors.js";
import type { LayerEntry } from "../../format/manifest.js";
import { chainInvalid, orderChain, type ChainLink } from "./chain.js";
import {
  BUNDLE_ARTIFACT,
  parseWorktreeDoc,
  readBundleHeader,
  WORKTREE_DIR,
  WORKTREE_DOC_ARTIFACT,
  worktreePathProblem,
  type BundleHeader,
  type HeadSpec,
  type WorktreeDoc,
} from "./format.js";
import { isoMaterialize } from "./iso.js";
import { checkAndCopyPack, declaredIndexBytes, PACK_INDEX_ARTIFACT, type PackIndexFacts } from "./pack-index.js";
import {
  gitEnv,
  gitImpl,
  neutralizeFilters,
  runGit,
  said,
  GIT_MEMORY_CONFIG,
  type GitCtx,
  type GitResult,
} from "./run.js";

/** What HEAD should be, from the layer meta (checked: it is untrusted input). */
function headSpec(layer: LayerEntry): HeadSpec {
  const meta = layer.meta ?? {};
  const bad = (why: string): MemsnapError =>
    new MemsnapError("MEMSNAP_MANIFEST_CORRUPT", `git layer ${layer.name}: ${why}`, {
      hint: "the manifest's layer meta is damaged; use another snapshot",
    });
  const head = meta.head as { oid?: unknown } | null | undefined;
  let oid: string | null = null;
  if (head !== null && head !== undefined) {
    if (typeof head.oid !== "string" || !/^[0-9a-f]{40}([0-9a-f]{24})?$/.test(head.oid)) {
      throw bad("meta.head.oid is not an object id");
    }
    oid = head.oid;
  }
  const branch = meta.branch;
  // git's own ref-name rules (check-ref-format): a name with `..` or a leading `-` would
  // leave refs/ or be taken for an option.
  const badRef = /[\0-\x20\x7f~^:?*[\\]|\.\.|@\{|\/\/|^[-/.]|\/\.|[/.]$|\.lock(\/|$)/;
  if (branch !== null && branch !== undefined && (typeof branch !== "string" || branch === "" || badRef.test(branch))) {
    throw bad("meta.branch is not a branch name");
  }
  if (meta.detached === true || typeof branch !== "string") {
    if (!oid) throw bad("a detached HEAD needs meta.head.oid");
    return { ref: null, oid };
  }
  return { ref: branch.startsWith("refs/") ? branch : `refs/heads/${branch}`, oid };
}

/** How many symlinks the checked-out tree holds, and the first few of their paths. */
export interface LinksWritten {
  count: number;
  paths: string[];
}

const DAMAGED_HINT = "the git bundle in this snapshot is damaged; run 'memsnap verify --deep' and use another snapshot";

/**
 * The symlinks (mode 120000) of HEAD's tree, streamed from `git ls-tree -r -z` (one record in
 * memory at a time, whatever the tree's size).
 */
function symlinksInHead(g: GitCtx, artifact: string): Promise<LinksWritten> {
  return new Promise((res, rej) => {
    const child = spawn("git", ["ls-tree", "-r", "-z", "--full-tree", "HEAD"], {
      cwd: g.cwd,
      env: g.env,
      stdio: ["ignore", "pipe", "pipe"],
      windowsHide: true,
    });
    const out: LinksWritten = { count: 0, paths: [] };
    let rest = Buffer.alloc(0);
    let err = "";
    const record = (rec: Buffer): void => {
      if (rec.subarray(0, 7).toString("latin1") !== "120000 ") return;
      out.count++;
      if (out.paths.length < 5) out.paths.push(rec.subarray(rec.indexOf(9) + 1).toString("utf8"));
    };
    child.stdout.on("data", (b: Buffer) => {
      let buf = rest.length ? Buffer.concat([rest, b]) : b;
      for (let nul = buf.indexOf(0); nul >= 0; nul = buf.indexOf(0)) {
        record(buf.subarray(0, nul));
        buf = buf.subarray(nul + 1);
      }
      rest = Buffer.from(buf);
    });
    child.stderr.on("data", (b: Buffer) => {
      if (err.length < 64 * 1024) err += b.toString("utf8");
    });
    child.on("error", (e) =>
      rej(
        new MemsnapError("MEMSNAP_INTERNAL", `cannot run git to restore ${artifact}: ${e.message}`, {
          path: artifact,
          cause: e,
          hint: "install git, or set MEMSNAP_GIT_IMPL=isomorphic",
        }),
      ),
    );
    child.on("close", (code) => {
      if (code === 0) res(out);
      else {
        rej(
          new MemsnapError("MEMSNAP_DEEP_VERIFY_FAILED", `restoring ${artifact}: git ls-tree failed: ${said(err)}`, {
            path: artifact,
            hint: DAMAGED_HINT,
          }),
        );
      }
    });
  });
}

/** The note a restore prints when the checked-out tree held symlinks (written as plain files). */
export function linksNote(layer: string, links: LinksWritten): string {
  const some = links.paths.map((p) => JSON.stringify(p)).join(", ") + (links.count > links.paths.length ? ", …" : "");
  return (
    `git layer ${layer}: ${links.count} symlink${links.count === 1 ? "" : "s"} ` +
    `in the checked-out tree (${some}) ` +
    `${links.count === 1 ? "was" : "were"} restored as plain files holding the link target, ` +
    "and the repository has core.symlinks=false " +
    "(restore creates no link a bundle asks for); " +
    "to have links again: git config core.symlinks true, then git checkout -- PATH"
  );
}

/**
 * Fetch the chain's bundles (`[path, artifact]`, in chain order) into the repository `g` names:
 * the first must need no commit, each later one only commits the ones before it brought (else
 * MEMSNAP_GIT_CHAIN_INVALID); after the last, the refs it does not list are dropped (a chain's
 * last bundle lists every ref).
 */
async function fetchChain(
  g: GitCtx,
  layer: string,
  bundles: Array<[string, string]>,
  run: (args: string[], ctx: GitCtx, damaged: boolean) => Promise<void>,
  install?: (bundle: string, h: BundleHeader) => Promise<boolean>,
): Promise<void> {
  let last: BundleHeader | null = null;
  for (const [i, [path, name]] of bundles.entries()) {
    const h = await readBundleHeader(path);
    if (typeof h === "string") {
      throw new MemsnapError("MEMSNAP_DEEP_VERIFY_FAILED", `restoring ${layer}/${name}: ${h}`, {
        path: `${layer}/${name}`,
        hint: DAMAGED_HINT,
      });
    }
    if (i === 0 && h.prerequisites.length) {
      throw chainInvalid(
        layer,
        `${name}, the first bundle, needs ${h.prerequisites.length} commit(s) it does not hold`,
      );
    }
    if (h.prerequisites.length) {
      const r = await runGit(["cat-file", "--batch-check=%(objecttype)"], g, `${h.prerequisites.join("\n")}\n`);
      const types = r.stdout.toString("latin1").split("\n");
      const lacking = h.prerequisites.filter((_, k) => types[k] !== "commit");
      if (r.code !== 0 || lacking.length) {
        throw chainInvalid(
          layer,
          `${name} needs commit ${lacking[0] ?? h.prerequisites[0]}, ` +
            `which the bundles before it (${bundles
              .slice(0, i)
              .map((b) => b[1])
              .join(", ")}) do not hold`,
        );
      }
    }
    last = h;
    if (i === 0 && install && (await install(path, h))) continue;
    const fetch = ["fetch", "-q", "--no-write-fetch-head", "--update-head-ok", "--no-tags", path, "refs/*:refs/*"];
    await run(fetch, g, true);
  }
  if (bundles.length < 2 || !last) return;
  const keep = new Set(last.refs.map((r) => r.name));
  const refs = (await runGit(["for-each-ref", "--format=%(refname)"], g)).stdout.toString("utf8").split("\n");
  const drop = refs.filter((r) => r && !keep.has(r));
  if (drop.length) {
    const r = await runGit(["update-ref", "--stdin"], g, drop.map((n) => `delete ${n}\n`).join(""));
    if (r.code !== 0) {
      throw new MemsnapError(
        "MEMSNAP_DEST_UNWRITABLE",
        `restoring ${layer}: git update-ref failed: ${said(r.stderr)}`,
        {
          path: layer,
          hint: "check the destination",
        },
      );
    }
  }
}

/**
 * Install the whole bundle at `bundle` (header `h`) with its pack index `index` in the fresh
 * repository `g` names, instead of fetching it: the pack and index are checked
 * (./pack-index.ts) and written to objects/pack, then its refs under refs/ are created with
 * `git update-ref` (which checks each name, and refuses one to an object the pack lacks).
 * False when the pack is one to fetch instead (more objects than an index is read for).
 */
async function installWholeBundle(
  g: GitCtx,
  dotgit: string,
  bundle: string,
  h: BundleHeader,
  index: string,
  artifact: string,
  run: (args: string[], ctx: GitCtx, damaged: boolean, input?: string) => Promise<void>,
): Promise<boolean> {
  const hashLen = h.objectFormat === "sha256" ? 32 : 20;
  const packDir = join(dotgit, "objects", "pack");
  const tmp = join(packDir, "tmp_memsnap.pack");
  let facts: PackIndexFacts | string | null;
  try {
    facts = await checkAndCopyPack(bundle, h.packOffset, index, hashLen, tmp);
  } catch (e) {
    await rm(tmp, { force: true });
    throw destinationError(e, packDir);
  }
  if (facts === null || typeof facts === "string") {
    await rm(tmp, { force: true });
    if (facts === null) return false;
    throw new MemsnapError("MEMSNAP_DEEP_VERIFY_FAILED", `restoring ${artifact}: ${facts}`, {
      path: artifact,
      hint: DAMAGED_HINT,
    });
  }
  const name = join(packDir, `pack-${facts.packName}`);
  await rename(index, `${name}.idx`).catch((e: unknown) => {
    throw destinationError(e, packDir);
  });
  await chmod(`${name}.idx`, 0o444);
  await rename(tmp, `${name}.pack`).catch((e: unknown) => {
    throw destinationError(e, packDir);
  });
  const refs = h.refs.filter((r) => r.name.startsWith("refs/"));
  if (refs.some((r) => r.name.includes("\0"))) {
    throw new MemsnapError("MEMSNAP_DEEP_VERIFY_FAILED", `restoring ${artifact}: a ref name holds a NUL byte`, {
      path: artifact,
      hint: DAMAGED_HINT,
    });
  }
  if (refs.length) {
    const input = refs.map((r) => `create ${r.name}\0${r.oid}\0`).join("");
    await run(["update-ref", "-z", "--stdin"], g, true, input);
  }
  return true;
}

async function materializeGit(
  dir: string,
  bundles: Array<[string, string]>,
  head: HeadSpec,
  objectFormat: string,
  layer: string,
  index: string | null,
): Promise<LinksWritten> {
  const artifact = `${layer}/${bundles.at(-1)?.[1] ?? BUNDLE_ARTIFACT}`;
  const init: GitCtx = { cwd: dir, env: gitEnv() };
  let g: GitCtx = { cwd: dir, env: gitEnv({ GIT_DIR: join(dir, ".git"), GIT_WORK_TREE: dir }) };
  const run = async (args: string[], ctx: GitCtx, damaged: boolean, input?: string): Promise<void> => {
    let r: GitResult;
    try {
      r = await runGit(args, ctx, input);
    } catch (e) {
      throw new MemsnapError("MEMSNAP_INTERNAL", `cannot run git to restore ${artifact}: ${(e as Error).message}`, {
        path: artifact,
        cause: e,
        hint: "install git, or set MEMSNAP_GIT_IMPL=isomorphic",
      });
    }
    if (r.code === 0) return;
    throw new MemsnapError(
      damaged ? "MEMSNAP_DEEP_VERIFY_FAILED" : "MEMSNAP_DEST_UNWRITABLE",
      `restoring ${artifact}: git ${args[0]} failed: ${said(r.stderr)}`,
      {
        path: artifact,
        hint: damaged ? DAMAGED_HINT : "check the destination",
      },
    );
  };
  // A fresh .git: no template (no hooks, no info/), the default config git writes, nothing from the bundle.
  const format = objectFormat !== "sha1" ? [`--object-format=${objectFormat}`] : [];
  await run(["init", "-q", "--template=", ...format, dir], init, false);
  // The user's own filter drivers (git-lfs, …) must not run on checkout either: files come back
  // as the blobs hold them.
  const filters = await neutralizeFilters(dir, g);
  g = { ...g, env: gitEnv({ GIT_DIR: join(dir, ".git"), GIT_WORK_TREE: dir }, [...filters, ...GIT_MEMORY_CONFIG]) };
  const first = `${layer}/${bundles[0]?.[1] ?? BUNDLE_ARTIFACT}`;
  const install = index
    ? (bundle: string, h: BundleHeader): Promise<boolean> =>
        installWholeBundle(g, join(dir, ".git"), bundle, h, index, first, run)
    : undefined;
  await fetchChain(g, layer, bundles, run, install);
  if (head.ref) await run(["symbolic-ref", "HEAD", head.ref], g, true);
  else if (head.oid) await run(["update-ref", "--no-deref", "HEAD", head.oid], g, true);
  const links: LinksWritten = head.oid ? await symlinksInHead(g, artifact) : { count: 0, paths: [] };
  // A symlink in the tree is checked out as a plain file holding its target (as git does on a
  // file system without links): restore creates no link a bundle asks for, wherever it points.
  // The repository keeps core.symlinks=false so that `git status` sees those files as the links.
  if (links.count) await run(["config", "core.symlinks", "false"], g, false);
  const checkout: GitCtx = {
    ...g,
    env: gitEnv({ GIT_DIR: join(dir, ".git"), GIT_WORK_TREE: dir }, [
      ...filters,
      ["core.symlinks", "false"],
      ...GIT_MEMORY_CONFIG,
    ]),
  };
  if (head.oid) await run(["reset", "-q", "--hard", "HEAD"], checkout, true);
  return links;
}

// ------------------------------------------------------------------------------ the work tree

function unsafe(artifact: string, why: string): MemsnapError {
  return new MemsnapError("MEMSNAP_UNSAFE_PATH", `${artifact}: ${why}`, {
    path: artifact,
    hint: "this bundle was not written by memsnap or was tampered with",
  });
}

/**
 * Make sure every parent of `rel` under `dir` is a real directory (never a symlink); create
 * missing ones when `create`.
 */
async function realParents(dir: string, rel: string, artifact: string, create: boolean): Promise<boolean> {
  const segs = rel.split("/");
  let cur = dir;
  for (const seg of segs.slice(0, -1)) {
    cur = join(cur, seg);
    let st: Stats;
    try {
      st = await lstat(cur);
    } catch {
      if (!create) return false;
      await mkdir(cur).catch((e: unknown) => {
        throw destinationError(e, cur);
      });
      continue;
    }
    if (st.isSymbolicLink()) throw unsafe(artifact, `${rel} would be written through the symlink ${cur}`);
    if (!st.isDirectory()) {
      if (!create) return false;
      throw unsafe(artifact, `${rel} conflicts with the file ${cur}`);
    }
  }
  return true;
}

/** Remove empty directories from `rel`'s parent up to (not including) `dir`. */
async function pruneEmpty(dir: string, rel: string): Promise<void> {
  const segs = rel.split("/").slice(0, -1);
  while (segs.length) {
    const p = join(dir, ...segs);
    try {
      await rmdir(p);
    } catch {
      return;
    }
    segs.pop();
  }
}

/** Relative paths of the regular files under `root`. */
async function listFiles(root: string, rel = ""): Promise<string[]> {
  const out: string[] = [];
  for (const e of await readdir(join(root, rel), { withFileTypes: true })) {
    const r = rel ? `${rel}/${e.name}` : e.name;
    if (e.isDirectory()) out.push(...(await listFiles(root, r)));
    else if (e.isFile()) out.push(r);
    else throw unsafe(`${WORKTREE_DIR}/${r}`, "not a regular file");
  }
  return out;
}

/** True when `p` is a directory holding no files (only empty directories). */
async function emptyTree(p: string): Promise<boolean> {
  for (const e of await readdir(p, { withFileTypes: true })) {
    if (!e.isDirectory() || !(await emptyTree(join(p, e.name)))) return false;
  }
  return true;
}

/** Lay the captured work-tree state over the checked-out repository. */
async function applyWorktree(dir: string, layer: string, worktree: string | null, doc: WorktreeDoc): Promise<void> {
  const docArt = `${layer}/${WORKTREE_DOC_ARTIFACT}`;
  for (const rel of doc.deleted) {
    if (!(await realParents(dir, rel, docArt, false))) continue;
    const p = join(dir, ...rel.split("/"));
    const st = await lstat(p).catch(() => null);
    if (!st || st.isDirectory()) continue;
    await unlink(p).catch((e: unknown) => {
      throw destinationError(e, p);
    });
    await pruneEmpty(dir, rel);
  }
  if (worktree) {
    for (const rel of await listFiles(worktree)) {
      const art = `${layer}/${WORKTREE_DIR}/${rel}`;
      const why = worktreePathProblem(rel);
      if (why) throw unsafe(art, why);
      await realParents(dir, rel, art, true);
      const dest = join(dir, ...rel.split("/"));
      const st = await lstat(dest).catch(() => null);
      if (st?.isDirectory()) {
        if (!(await emptyTree(dest))) throw unsafe(art, `${rel} conflicts with a directory of the checked-out tree`);
        await rm(dest, { recursive: true });
      }
      await rename(join(worktree, ...rel.split("/")), dest).catch((e: unknown) => {
        throw destinationError(e, dest);
      });
      await chmod(dest, doc.executable.includes(rel) ? 0o700 : 0o600).catch((e: unknown) => {
        throw destinationError(e, dest);
      });
    }
  }
}

// ------------------------------------------------------------------------------ the layer

/** Restore a git layer in `layerDir` (which holds its artifacts); returns the notes to print. */
export async function materializeLayer(layerDir: string, layer: LayerEntry): Promise<string[]> {
  const dir = resolve(layerDir);
  const art = (p: string): string => `${layer.name}/${p}`;
  const names = await readdir(dir);
  // The chain of bundles (./chain.ts), checked before anything is built: a layer without one
  // in its meta has at most repo.bundle.
  let chain: ChainLink[] | null = null;
  if (layer.meta && "bundle_chain" in layer.meta) {
    const c = orderChain(layer.meta.bundle_chain);
    if (typeof c === "string") throw chainInvalid(layer.name, c);
    chain = c;
  }
  const inChain = (n: string): boolean => (chain ? chain.some((l) => l.artifact === n) : n === BUNDLE_ARTIFACT);
  for (const n of names) {
    if (!inChain(n) && n !== WORKTREE_DIR && n !== WORKTREE_DOC_ARTIFACT && n !== PACK_INDEX_ARTIFACT) {
      throw unsafe(art(n), "not an artifact of a git layer");
    }
  }
  const missing = chain?.find((l) => !names.includes(l.artifact));
  if (missing) throw chainInvalid(layer.name, `the chain lists ${missing.artifact}, which the layer does not hold`);
  const bundleNames = chain ? chain.map((l) => l.artifact) : names.includes(BUNDLE_ARTIFACT) ? [BUNDLE_ARTIFACT] : [];
  if (bundleNames.length > 1 && gitImpl() !== "git") {
    throw new MemsnapError(
      "MEMSNAP_UNSUPPORTED_LAYER",
      `git layer ${layer.name} is a chain of ${bundleNames.length} bundles, which only the git binary restores`,
      {
        path: layer.name,
        hint: "install git (and unset MEMSNAP_GIT_IMPL), then restore again",
      },
    );
  }
  const head = headSpec(layer);
  let doc: WorktreeDoc = { format: "memsnap-git-worktree", version: 1, deleted: [], executable: [] };
  if (names.includes(WORKTREE_DOC_ARTIFACT)) {
    const parsed = parseWorktreeDoc(await readFile(join(dir, WORKTREE_DOC_ARTIFACT)));
    if (typeof parsed === "string") {
      // A path that leaves the work tree or names .git is an attack, not damage.
      if (/ holds an unsafe path /.test(parsed)) throw unsafe(art(WORKTREE_DOC_ARTIFACT), parsed);
      throw new MemsnapError("MEMSNAP_DEEP_VERIFY_FAILED", `${art(WORKTREE_DOC_ARTIFACT)}: ${parsed}`, {
        path: art(WORKTREE_DOC_ARTIFACT),
        hint: "the snapshot's git layer is damaged; use another snapshot",
      });
    }
    doc = parsed;
  }
  const hasBundle = bundleNames.length > 0;
  if (head.oid && !hasBundle) {
    const msg = `git layer ${layer.name} records HEAD ${head.oid} but has no ${BUNDLE_ARTIFACT}`;
    throw new MemsnapError("MEMSNAP_INDEX_MISMATCH", msg, {
      path: art(BUNDLE_ARTIFACT),
      hint: "the bundle is damaged or was altered; use another snapshot",
    });
  }
  const objectFormat =
    typeof layer.meta?.object_format === "string" && /^sha(1|256)$/.test(layer.meta.object_format)
      ? layer.meta.object_format
      : "sha1";
  // Move the artifacts aside so `dir` is empty and becomes the work tree; a work-tree file
  // named like an artifact (`repo.bundle`) lives under worktree/ and can't collide.
  const aside = await mkdtemp(join(dirname(dir), `.${basename(dir)}.git-restore-`)).catch((e: unknown) => {
    throw destinationError(e, dirname(dir));
  });
  try {
    const bundles: Array<[string, string]> = bundleNames.map((n) => [join(aside, n), n]);
    for (const [p, n] of bundles) await rename(join(dir, n), p);
    // The full bundle's pack index (./pack-index.ts), used by the git binary only.
    // The meta declares it (verify --deep checks a declared one); one it does not declare is ignored.
    const declared = declaredIndexBytes(layer);
    const held = names.includes(PACK_INDEX_ARTIFACT) ? join(aside, PACK_INDEX_ARTIFACT) : null;
    if (held) await rename(join(dir, PACK_INDEX_ARTIFACT), held);
    const heldBytes = held ? (await lstat(held)).size : 0;
    if (held && declared !== null && heldBytes !== declared) {
      const msg = `${art(PACK_INDEX_ARTIFACT)} holds ${heldBytes} bytes, but the layer meta declares ${declared}`;
      throw new MemsnapError("MEMSNAP_DEEP_VERIFY_FAILED", msg, { path: art(PACK_INDEX_ARTIFACT), hint: DAMAGED_HINT });
    }
    const index = held && declared !== null ? held : null;
    const bundle = bundles[0]?.[0] ?? null;
    const worktree = names.includes(WORKTREE_DIR) ? join(aside, WORKTREE_DIR) : null;
    if (worktree) await rename(join(dir, WORKTREE_DIR), worktree);
    await rm(join(dir, WORKTREE_DOC_ARTIFACT), { force: true });
    let links: LinksWritten;
    if (gitImpl() === "git") {
      links = await materializeGit(dir, bundles, head, objectFormat, layer.name, bundles.length ? index : null);
    }
    else {
      try {
        links = await isoMaterialize(dir, bundle, head, art(BUNDLE_ARTIFACT));
      } catch (e) {
        if (e instanceof MemsnapError) throw e;
        const msg = `restoring ${art(BUNDLE_ARTIFACT)} with isomorphic-git failed: ${(e as Error).message}`;
        throw new MemsnapError("MEMSNAP_DEEP_VERIFY_FAILED", msg, {
          path: art(BUNDLE_ARTIFACT),
          hint: "install git and retry, or use another snapshot",
        });
      }
    }
    await applyWorktree(dir, layer.name, worktree, doc);
    return links.count ? [linksNote(layer.name, links)] : [];
  } finally {
    await rm(aside, { recursive: true, force: true });
  }
}
