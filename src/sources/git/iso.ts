/**
 * The isomorphic-git fallback, used when no git binary is on PATH (or when
 * `MEMSNAP_GIT_IMPL=isomorphic` forces it).
 *
 * The fallback hand-builds a v2 bundle (`# v2 git bundle`, `<oid> <ref>` lines, a blank
 * line, then a packfile from `packObjects`), lists the worktree with `statusMatrix` through
 * a read-only file system (so the source's index is never rewritten), and rebuilds a
 * repository from a bundle with `indexPack` + `checkout`. It holds the whole packfile in
 * memory, so it suits memory-sized repositories; the git binary path streams.
 */
import * as nodeFs from "node:fs";
import { mkdir, mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { MemsnapError } from "../../errors.js";
import type { Redactor } from "../../redact/types.js";
import {
  BUNDLE_V2_SIGNATURE,
  checkPackTrailer,
  commitFacts,
  readBundleHeader,
  type BundleRef,
  type HeadFacts,
  type HeadSpec,
} from "./format.js";
import { emptyScan, scanObject, SCAN_MAX_BYTES, type HistoryScan } from "./history-scan.js";
import type { PromiseFsClient } from "isomorphic-git";

type IsoGit = typeof import("isomorphic-git");

let isoGit: Promise<IsoGit> | undefined;

/** Load isomorphic-git on first use (the git binary path never pays for it). */
export async function loadIsoGit(): Promise<IsoGit> {
  isoGit ??= import("isomorphic-git").catch((e: unknown) => {
    isoGit = undefined;
    const msg = `neither a git binary nor isomorphic-git is available: ${(e as Error).message}`;
    throw new MemsnapError("MEMSNAP_INTERNAL", msg, {
      cause: e,
      hint: "install git (https://git-scm.com) or reinstall memsnap with its dependencies",
    });
  });
  return isoGit;
}

// ------------------------------------------------------------------------------ isomorphic-git: capture

/** A change of the work tree against HEAD. `new` covers untracked and index-added files. */
export interface StatusEntry {
  path: string;
  change: "modified" | "new" | "deleted";
}

/**
 * A file system for isomorphic-git that reads the real one and drops every write: capture
 * must never modify the source (statusMatrix would otherwise rewrite the index).
 */
function readOnlyFs(): PromiseFsClient {
  const p = nodeFs.promises;
  const noop = async (): Promise<void> => undefined;
  return {
    promises: {
      readFile: p.readFile,
      readdir: p.readdir,
      stat: p.stat,
      lstat: p.lstat,
      readlink: p.readlink,
      writeFile: noop,
      unlink: noop,
      mkdir: noop,
      rmdir: noop,
      symlink: noop,
      chmod: noop,
    },
  };
}

export interface IsoRepoFacts {
  /** Every ref under refs/ with its (unpeeled) oid, sorted; HEAD separately. */
  refs: BundleRef[];
  headOid: string | null;
  /** Full name of the ref HEAD points at, or null when detached. */
  headRef: string | null;
  head: HeadFacts | null;
}

/** Refs, HEAD and the HEAD commit's facts, read with isomorphic-git. */
export async function isoRepoFacts(gitdir: string): Promise<IsoRepoFacts> {
  const git = await loadIsoGit();
  const fs = readOnlyFs();
  const names = (await git.listRefs({ fs, gitdir, filepath: "refs" })).map((n) => `refs/${n}`);
  const refs: BundleRef[] = [];
  for (const name of names.sort()) refs.push({ name, oid: await git.resolveRef({ fs, gitdir, ref: name }) });
  const headTarget = (await readFile(join(gitdir, "HEAD"), "utf8")).trim();
  const headRef = headTarget.startsWith("ref: ") ? headTarget.slice(5).trim() : null;
  let headOid: string | null = null;
  try {
    headOid = await git.resolveRef({ fs, gitdir, ref: "HEAD" });
  } catch {
    headOid = null; // unborn branch
  }
  let head: HeadFacts | null = null;
  if (headOid) {
    const { object } = await git.readObject({ fs, gitdir, oid: headOid, format: "content" });
    head = commitFacts(headOid, Buffer.from(object as Uint8Array));
  }
  return { refs, headOid, headRef, head };
}

/** Every object reachable from `tips`, with its type (blobs are listed from trees, not read). */
async function reachableObjects(gitdir: string, tips: string[]): Promise<Map<string, string>> {
  const git = await loadIsoGit();
  const fs = readOnlyFs();
  const cache = {};
  const seen = new Map<string, string>();
  const stack = [...tips];
  while (stack.length) {
    const oid = stack.pop()!;
    if (seen.has(oid)) continue;
    const o = await git.readObject({ fs, gitdir, oid, format: "parsed", cache });
    seen.set(oid, o.type);
    if (o.type === "commit") {
      const c = o.object as { tree: string; parent: string[] };
      stack.push(c.tree, ...c.parent);
    } else if (o.type === "tag") {
      stack.push((o.object as { object: string }).object);
    } else if (o.type === "tree") {
      for (const e of o.object as Array<{ oid: string; type: string }>) {
        if (e.type === "blob") seen.set(e.oid, "blob");
        else if (e.type === "tree") stack.push(e.oid);
        // gitlinks (submodule commits) live in another repository
      }
    }
  }
  return seen;
}

/**
 * Write a v2 bundle of `refs` (plus HEAD) to `out`; returns the objects it holds (for the
 * history scan). Throws isomorphic-git's error when an object is missing.
 */
export async function isoWriteBundle(gitdir: string, facts: IsoRepoFacts, out: string): Promise<Map<string, string>> {
  const git = await loadIsoGit();
  const tips = [...facts.refs.map((r) => r.oid), ...(facts.headOid ? [facts.headOid] : [])];
  const objects = await reachableObjects(gitdir, tips);
  const { packfile } = await git.packObjects({ fs: readOnlyFs(), gitdir, oids: [...objects.keys()] });
  if (!packfile) throw new Error("packObjects returned no packfile");
  let header = BUNDLE_V2_SIGNATURE;
  for (const r of facts.refs) header += `${r.oid} ${r.name}\n`;
  if (facts.headOid) header += `${facts.headOid} HEAD\n`;
  header += "\n";
  await writeFile(out, Buffer.concat([Buffer.from(header, "utf8"), Buffer.from(packfile)]), { mode: 0o600 });
  return objects;
}

/** Scan the text of every object in `objects` (isomorphic-git reads them one at a time). */
export async function isoScanObjects(
  gitdir: string,
  objects: Map<string, string>,
  redactor: Redactor,
  artifact: string,
  signal?: AbortSignal,
): Promise<HistoryScan> {
  const git = await loadIsoGit();
  const fs = readOnlyFs();
  const st = emptyScan();
  for (const [oid, type] of objects) {
    signal?.throwIfAborted();
    st.objects++;
    if (type !== "blob" && type !== "commit" && type !== "tag") continue;
    const { object } = await git.readObject({ fs, gitdir, oid, format: "content" });
    const data = Buffer.from(object as Uint8Array);
    if (type === "blob" && data.length > SCAN_MAX_BYTES) {
      st.skipped_large++;
      continue;
    }
    await scanObject(type, data, redactor, artifact, st);
  }
  return st;
}

/** The work tree's changes against HEAD (ignored files excluded), via statusMatrix. */
export async function isoStatus(root: string, gitdir: string): Promise<StatusEntry[]> {
  const git = await loadIsoGit();
  const rows = await git.statusMatrix({ fs: readOnlyFs(), dir: root, gitdir });
  const out: StatusEntry[] = [];
  for (const [path, head, workdir] of rows) {
    if (workdir === 0 && head === 1) out.push({ path, change: "deleted" });
    else if (workdir === 2) out.push({ path, change: head === 1 ? "modified" : "new" });
  }
  return out;
}

// ------------------------------------------------------------------------------ isomorphic-git: restore and verify

/**
 * Make `dir` a repository holding the bundle's objects and refs, HEAD as `head`, the work
 * tree and index checked out from HEAD. `dir` must hold nothing but what the caller put there.
 */
export async function isoMaterialize(
  dir: string,
  bundle: string | null,
  head: HeadSpec,
  artifact: string,
): Promise<{ count: number; paths: string[] }> {
  const git = await loadIsoGit();
  const fs = nodeFs;
  const links = { count: 0, paths: [] as string[] };
  const branch = head.ref?.startsWith("refs/heads/") ? head.ref.slice(11) : "main";
  await git.init({ fs, dir, defaultBranch: branch });
  if (bundle) {
    const h = await readBundleHeader(bundle);
    const bad = (why: string): MemsnapError =>
      new MemsnapError("MEMSNAP_DEEP_VERIFY_FAILED", `${artifact}: ${why}`, {
        path: artifact,
        hint: "the git bundle in this snapshot is damaged; use another snapshot",
      });
    if (typeof h === "string") throw bad(h);
    if (h.objectFormat !== "sha1") {
      throw bad("isomorphic-git reads only SHA-1 repositories; install git to restore this one");
    }
    const problem = await checkPackTrailer(bundle, h.packOffset);
    if (problem) throw bad(problem);
    const all = await readFile(bundle);
    const pack = all.subarray(h.packOffset);
    const sum = pack.subarray(pack.length - 20).toString("hex");
    const rel = `.git/objects/pack/pack-${sum}.pack`;
    await mkdir(dirname(join(dir, rel)), { recursive: true });
    await writeFile(join(dir, rel), pack);
    let oids: Set<string>;
    try {
      oids = new Set((await git.indexPack({ fs, dir, filepath: rel })).oids);
    } catch (e) {
      throw bad(`packfile does not index: ${(e as Error).message}`);
    }
    for (const r of h.refs) {
      if (!oids.has(r.oid)) throw bad(`${r.name} points at ${r.oid}, which the packfile lacks`);
      if (r.name !== "HEAD") await git.writeRef({ fs, dir, ref: r.name, value: r.oid, force: true });
    }
  }
  if (head.ref) await git.writeRef({ fs, dir, ref: "HEAD", value: head.ref, symbolic: true, force: true });
  else if (head.oid) await git.writeRef({ fs, dir, ref: "HEAD", value: head.oid, force: true });
  if (head.oid) {
    const noLinks = plainFileLinks(dir, links);
    await git.checkout({ fs: noLinks, dir, ref: "HEAD", force: true, noUpdateHead: true });
    // As git does with core.symlinks=false: `git status` then takes those files for the links.
    if (links.count) await git.setConfig({ fs, dir, path: "core.symlinks", value: false });
  }
  return links;
}

/**
 * A file system for isomorphic-git's checkout that writes each symlink of the tree as a plain
 * file holding its target (git's core.symlinks=false): restore creates no link a bundle asks
 * for. Those files are reported to the index as links (lstat's mode), so the index keeps the
 * tree's mode 120000 for them, as git's own does without symlinks.
 */
function plainFileLinks(dir: string, links: { count: number; paths: string[] }): PromiseFsClient {
  const p = nodeFs.promises;
  const written = new Set<string>();
  const root = dir.endsWith("/") ? dir : `${dir}/`;
  const lstat = async (path: string, opts?: unknown): Promise<nodeFs.Stats> => {
    const st = (await p.lstat(path, opts as nodeFs.StatOptions)) as nodeFs.Stats;
    if (!written.has(String(path)) || !st.isFile()) return st;
    const fake = Object.assign(Object.create(Object.getPrototypeOf(st) as object) as nodeFs.Stats, st);
    fake.mode = 0o120000 | 0o777;
    return fake;
  };
  return {
    promises: {
      ...p,
      lstat,
      symlink: async (target: string, path: string): Promise<void> => {
        const at = String(path);
        await p.writeFile(at, String(target), { mode: 0o644, flag: "wx" });
        written.add(at);
        links.count++;
        if (links.paths.length < 5) links.paths.push(at.startsWith(root) ? at.slice(root.length) : at);
      },
    } as unknown as PromiseFsClient["promises"],
  };
}

/**
 * Deep-check a bundle file without a git binary: header, packfile checksum, every object
 * inflates and hashes (indexPack in a scratch repository), every ref's object is present.
 */
export async function isoVerifyBundle(path: string): Promise<string | null> {
  const h = await readBundleHeader(path);
  if (typeof h === "string") return h;
  if (h.prerequisites.length) {
    return `bundle needs ${h.prerequisites.length} prerequisite commit(s); memsnap writes complete bundles`;
  }
  if (h.refs.length === 0) return "bundle has no refs";
  const trailer = await checkPackTrailer(path, h.packOffset);
  if (trailer) return trailer;
  if (h.objectFormat !== "sha1") return null; // isomorphic-git cannot index SHA-256 packs; the checksum passed
  const git = await loadIsoGit();
  const scratch = await mkdtemp(join(tmpdir(), "memsnap-gitverify-"));
  try {
    const rel = "p.pack";
    await writeFile(join(scratch, rel), (await readFile(path)).subarray(h.packOffset));
    let oids: Set<string>;
    try {
      const indexed = await git.indexPack({ fs: nodeFs, dir: scratch, gitdir: join(scratch, "g"), filepath: rel });
      oids = new Set(indexed.oids);
    } catch (e) {
      return `packfile does not index: ${(e as Error).message}`;
    }
    for (const r of h.refs) if (!oids.has(r.oid)) return `${r.name} points at ${r.oid}, which the packfile lacks`;
    return null;
  } finally {
    await rm(scratch, { recursive: true, force: true });
  }
}
