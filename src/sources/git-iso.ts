/**
 * Pieces of the `git` source shared by both implementations (bundle header parsing, the
 * history-scan step, the worktree document, path checks), and the isomorphic-git fallback
 * used when no git binary is on PATH (or when `MEMSNAP_GIT_IMPL=isomorphic` forces it).
 *
 * The fallback hand-builds a v2 bundle (`# v2 git bundle`, `<oid> <ref>` lines, a blank
 * line, then a packfile from `packObjects`), lists the worktree with `statusMatrix` through
 * a read-only file system (so the source's index is never rewritten), and rebuilds a
 * repository from a bundle with `indexPack` + `checkout`. It holds the whole packfile in
 * memory, so it suits memory-sized repositories; the git binary path streams.
 */
import { createHash } from "node:crypto";
import * as nodeFs from "node:fs";
import { mkdir, mkdtemp, open, readFile, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { MemsnapError } from "../errors.js";
import type { Redactor } from "../redact/types.js";

import type { PromiseFsClient } from "isomorphic-git";

type IsoGit = typeof import("isomorphic-git");

let isoGit: Promise<IsoGit> | undefined;

/** Load isomorphic-git on first use (the git binary path never pays for it). */
export async function loadIsoGit(): Promise<IsoGit> {
  isoGit ??= import("isomorphic-git").catch((e: unknown) => {
    isoGit = undefined;
    throw new MemsnapError("MEMSNAP_INTERNAL", `neither a git binary nor isomorphic-git is available: ${(e as Error).message}`, {
      cause: e, hint: "install git (https://git-scm.com) or reinstall memsnap with its dependencies",
    });
  });
  return isoGit;
}

// ------------------------------------------------------------------------------ shared: bundle header

export const BUNDLE_V2_SIGNATURE = "# v2 git bundle\n";
export const BUNDLE_V3_SIGNATURE = "# v3 git bundle\n";
/** A bundle header bigger than this is refused (a million refs is ~70 MiB). */
const MAX_HEADER = 128 * 1024 * 1024;

export interface BundleRef {
  oid: string;
  name: string;
}

export interface BundleHeader {
  version: 2 | 3;
  objectFormat: "sha1" | "sha256";
  refs: BundleRef[];
  prerequisites: string[];
  /** Byte offset of the packfile. */
  packOffset: number;
}

const OID = /^[0-9a-f]{40}([0-9a-f]{24})?$/;

/** Parse a bundle header; `buf` must hold at least the whole header. Returns a problem string on failure. */
export function parseBundleHeader(buf: Buffer): BundleHeader | string {
  const sig = buf.toString("latin1", 0, BUNDLE_V2_SIGNATURE.length);
  if (sig !== BUNDLE_V2_SIGNATURE && sig !== BUNDLE_V3_SIGNATURE) return "not a git bundle (no v2/v3 signature)";
  const version = sig === BUNDLE_V2_SIGNATURE ? 2 : 3;
  let objectFormat: "sha1" | "sha256" = "sha1";
  const refs: BundleRef[] = [];
  const prerequisites: string[] = [];
  let pos = sig.length;
  for (;;) {
    const nl = buf.indexOf(10, pos);
    if (nl < 0) return "bundle header is truncated";
    const line = buf.toString("utf8", pos, nl);
    pos = nl + 1;
    if (line === "") break;
    if (version === 3 && line.startsWith("@")) {
      const m = /^@object-format=(sha1|sha256)$/.exec(line);
      if (m) objectFormat = m[1] as "sha1" | "sha256";
      else if (!line.startsWith("@filter=")) return `unsupported bundle capability ${JSON.stringify(line)}`;
      continue;
    }
    if (line.startsWith("-")) {
      const oid = line.slice(1).split(" ")[0] ?? "";
      if (!OID.test(oid)) return `bad prerequisite line ${JSON.stringify(line)}`;
      prerequisites.push(oid);
      continue;
    }
    const sp = line.indexOf(" ");
    const oid = line.slice(0, sp);
    const name = line.slice(sp + 1);
    if (sp < 0 || !OID.test(oid) || name === "") return `bad ref line ${JSON.stringify(line)}`;
    refs.push({ oid, name });
  }
  return { version, objectFormat, refs, prerequisites, packOffset: pos };
}

/** Read and parse the header of the bundle file at `path`. */
export async function readBundleHeader(path: string): Promise<BundleHeader | string> {
  const fh = await open(path, "r");
  try {
    let buf = Buffer.alloc(0);
    let chunk = 64 * 1024;
    for (;;) {
      const b = Buffer.alloc(chunk);
      const { bytesRead } = await fh.read(b, 0, chunk, buf.length);
      buf = Buffer.concat([buf, b.subarray(0, bytesRead)]);
      const end = buf.indexOf("\n\n");
      if (end >= 0 || bytesRead === 0) return parseBundleHeader(buf);
      if (buf.length > MAX_HEADER) return "bundle header is too large";
      chunk = Math.min(chunk * 2, 16 * 1024 * 1024);
    }
  } finally {
    await fh.close();
  }
}

/** Check a packfile's signature and trailing SHA-1 (the whole file from `offset` on). */
export async function checkPackTrailer(path: string, offset: number): Promise<string | null> {
  const size = (await nodeFs.promises.stat(path)).size;
  if (size - offset < 32) return "packfile is truncated";
  const fh = await open(path, "r");
  try {
    const head = Buffer.alloc(12);
    await fh.read(head, 0, 12, offset);
    if (head.toString("latin1", 0, 4) !== "PACK") return "packfile signature missing";
    const v = head.readUInt32BE(4);
    if (v !== 2 && v !== 3) return `unsupported packfile version ${v}`;
    const hash = createHash("sha1");
    const end = size - 20;
    const buf = Buffer.alloc(1 << 20);
    for (let p = offset; p < end;) {
      const { bytesRead } = await fh.read(buf, 0, Math.min(buf.length, end - p), p);
      if (bytesRead === 0) return "packfile is truncated";
      hash.update(buf.subarray(0, bytesRead));
      p += bytesRead;
    }
    const trailer = Buffer.alloc(20);
    await fh.read(trailer, 0, 20, end);
    return hash.digest().equals(trailer) ? null : "packfile checksum does not match its trailing SHA-1";
  } finally {
    await fh.close();
  }
}

// ------------------------------------------------------------------------------ shared: history scan

/** Blobs larger than this are not scanned (counted in `skipped_large`). */
export const SCAN_MAX_BYTES = 16 * 1024 * 1024;
/** A blob with a NUL byte in its first 8 KiB is binary and not scanned. */
export const BINARY_PROBE_BYTES = 8192;

/** Counts of the history scan, recorded in the layer meta. */
export interface HistoryScan {
  /** Objects reachable from the bundle's refs. */
  objects: number;
  /** Blobs, commit messages and tag messages whose text went through the redactor's pre-filter. */
  scanned: number;
  bytes: number;
  /** Texts the pre-filter passed on to the full scan. */
  candidates: number;
  skipped_binary: number;
  skipped_large: number;
}

export function emptyScan(): HistoryScan {
  return { objects: 0, scanned: 0, bytes: 0, candidates: 0, skipped_binary: 0, skipped_large: 0 };
}

/**
 * Scan one object's text for secrets: a blob's content (unless binary), or the message of a
 * commit or tag (their headers hold only oids, names and dates). Trees are not text.
 */
export async function scanObject(type: string, data: Buffer, redactor: Redactor, artifact: string, st: HistoryScan): Promise<void> {
  let text: Buffer;
  if (type === "blob") {
    if (data.subarray(0, BINARY_PROBE_BYTES).includes(0)) {
      st.skipped_binary++;
      return;
    }
    text = data;
  } else if (type === "commit" || type === "tag") {
    const i = data.indexOf("\n\n");
    if (i < 0) return;
    text = data.subarray(i + 2);
  } else {
    return;
  }
  st.scanned++;
  st.bytes += text.length;
  // A clean object (memsnap's redactor: the native pre-filter on the bytes themselves) is
  // neither decoded nor scanned in JS: the bench's memory layer has ~14 MB of history text.
  if (redactor.clean?.(text)) return;
  const s = text.toString("utf8");
  if (!redactor.candidate(s)) return;
  st.candidates++;
  await redactor.scanText(s, artifact);
}

// ------------------------------------------------------------------------------ shared: worktree document

/** `worktree-deleted.json`: what restore needs to reproduce `git status` besides the files. */
export interface WorktreeDoc {
  format: "memsnap-git-worktree";
  version: 1;
  /** Tracked paths that were missing from the work tree (deleted, staged or not). */
  deleted: string[];
  /** Captured `worktree/` paths that had an executable bit (restore makes them 0700; others stay 0600). */
  executable: string[];
}

/** Why `p` may not be used as a work-tree path, or null. Refuses anything git itself would not check out. */
export function worktreePathProblem(p: string): string | null {
  if (p === "") return "empty path";
  if (p.includes("\0")) return "NUL byte in path";
  if (p.startsWith("/")) return "absolute path";
  if (p.includes("\\")) return "backslash in path";
  for (const seg of p.split("/")) {
    if (seg === "" || seg === "." || seg === "..") return `'${seg}' segment`;
    // `.git`, and the spellings Windows/macOS file systems fold to it (`.GIT`, `.git.`, `git~1`).
    const folded = seg.toLowerCase().replace(/[. ]+$/, "");
    if (folded === ".git" || folded === "git~1") return "'.git' segment";
  }
  return null;
}

/** Parse and check a worktree document; returns a problem string on failure. */
export function parseWorktreeDoc(bytes: Buffer): WorktreeDoc | string {
  let v: unknown;
  try {
    v = JSON.parse(bytes.toString("utf8"));
  } catch (e) {
    return `not valid JSON (${(e as Error).message})`;
  }
  const o = v as Partial<WorktreeDoc> | null;
  if (typeof o !== "object" || o === null || Array.isArray(o)) return "not a JSON object";
  if (o.format !== "memsnap-git-worktree") return `format is ${JSON.stringify(o.format)}, expected "memsnap-git-worktree"`;
  if (o.version !== 1) return `unsupported version ${JSON.stringify(o.version)}`;
  for (const key of ["deleted", "executable"] as const) {
    const list = o[key];
    if (!Array.isArray(list) || !list.every((x) => typeof x === "string")) return `"${key}" must be an array of strings`;
    for (const p of list) {
      const why = worktreePathProblem(p);
      if (why) return `"${key}" holds an unsafe path ${JSON.stringify(p)} (${why})`;
    }
  }
  return o as WorktreeDoc;
}

// ------------------------------------------------------------------------------ isomorphic-git: capture

/** A change of the work tree against HEAD. `new` covers untracked and index-added files. */
export interface StatusEntry {
  path: string;
  change: "modified" | "new" | "deleted";
}

/** Facts about HEAD, as recorded in the layer meta. */
export interface HeadFacts {
  oid: string;
  subject: string;
  author: string;
  time: string;
}

/** Parse a raw commit object into the HEAD facts. */
export function commitFacts(oid: string, raw: Buffer): HeadFacts {
  const text = raw.toString("utf8");
  const split = text.indexOf("\n\n");
  const headers = split < 0 ? text : text.slice(0, split);
  const message = split < 0 ? "" : text.slice(split + 2);
  let author = "";
  let time = new Date(0).toISOString();
  for (const line of headers.split("\n")) {
    const a = /^author (.*) <(.*)> (\d+) [+-]\d{4}$/.exec(line);
    if (a) author = `${a[1]} <${a[2]}>`;
    const c = /^committer .* (\d+) [+-]\d{4}$/.exec(line);
    if (c) time = new Date(Number(c[1]) * 1000).toISOString();
  }
  // The subject is the first paragraph joined into one line, as `git log --format=%s` shows it.
  const para = message.split(/\n[ \t]*\n/)[0] ?? "";
  const subject = para.split("\n").map((l) => l.trim()).filter(Boolean).join(" ");
  return { oid, subject, author, time };
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
      readFile: p.readFile, readdir: p.readdir, stat: p.stat, lstat: p.lstat, readlink: p.readlink,
      writeFile: noop, unlink: noop, mkdir: noop, rmdir: noop, symlink: noop, chmod: noop,
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
  gitdir: string, objects: Map<string, string>, redactor: Redactor, artifact: string, signal?: AbortSignal,
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

/** What HEAD should be in a rebuilt repository. */
export interface HeadSpec {
  /** Full ref name HEAD points at, or null when detached. */
  ref: string | null;
  /** The commit HEAD resolves to; null for an unborn branch. */
  oid: string | null;
}

/**
 * Make `dir` a repository holding the bundle's objects and refs, HEAD as `head`, the work
 * tree and index checked out from HEAD. `dir` must hold nothing but what the caller put there.
 */
export async function isoMaterialize(dir: string, bundle: string | null, head: HeadSpec, artifact: string): Promise<{ count: number; paths: string[] }> {
  const git = await loadIsoGit();
  const fs = nodeFs;
  const links = { count: 0, paths: [] as string[] };
  const branch = head.ref?.startsWith("refs/heads/") ? head.ref.slice(11) : "main";
  await git.init({ fs, dir, defaultBranch: branch });
  if (bundle) {
    const h = await readBundleHeader(bundle);
    const bad = (why: string): MemsnapError => new MemsnapError("MEMSNAP_DEEP_VERIFY_FAILED", `${artifact}: ${why}`, {
      path: artifact, hint: "the git bundle in this snapshot is damaged; use another snapshot",
    });
    if (typeof h === "string") throw bad(h);
    if (h.objectFormat !== "sha1") throw bad("isomorphic-git reads only SHA-1 repositories; install git to restore this one");
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
    const st = await p.lstat(path, opts as nodeFs.StatOptions) as nodeFs.Stats;
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
  if (h.prerequisites.length) return `bundle needs ${h.prerequisites.length} prerequisite commit(s); memsnap writes complete bundles`;
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
      oids = new Set((await git.indexPack({ fs: nodeFs, dir: scratch, gitdir: join(scratch, "g"), filepath: rel })).oids);
    } catch (e) {
      return `packfile does not index: ${(e as Error).message}`;
    }
    for (const r of h.refs) if (!oids.has(r.oid)) return `${r.name} points at ${r.oid}, which the packfile lacks`;
    return null;
  } finally {
    await rm(scratch, { recursive: true, force: true });
  }
}
