/**
 * What a git layer holds, shared by both implementations: the artifact names, the bundle
 * header, the work-tree document, and the HEAD facts of the layer meta.
 */
import { createHash } from "node:crypto";
import * as nodeFs from "node:fs";
import { open } from "node:fs/promises";

export const BUNDLE_ARTIFACT = "repo.bundle";
export const WORKTREE_DOC_ARTIFACT = "worktree-deleted.json";
export const WORKTREE_DIR = "worktree";
export const WORKTREE_DOC_MAX = 64 * 1024 * 1024;

// ------------------------------------------------------------------------------ bundle header

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

/** The number of objects a packfile's header declares (the pack starts at `offset`); null if it has no valid header. */
export async function packObjectCount(path: string, offset: number): Promise<number | null> {
  const fh = await open(path, "r");
  try {
    const head = Buffer.alloc(12);
    const { bytesRead } = await fh.read(head, 0, 12, offset);
    if (bytesRead < 12 || head.toString("latin1", 0, 4) !== "PACK") return null;
    return head.readUInt32BE(8);
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

// ------------------------------------------------------------------------------ worktree document

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
  if (o.format !== "memsnap-git-worktree") {
    return `format is ${JSON.stringify(o.format)}, expected "memsnap-git-worktree"`;
  }
  if (o.version !== 1) return `unsupported version ${JSON.stringify(o.version)}`;
  for (const key of ["deleted", "executable"] as const) {
    const list = o[key];
    if (!Array.isArray(list) || !list.every((x) => typeof x === "string")) {
      return `"${key}" must be an array of strings`;
    }
    for (const p of list) {
      const why = worktreePathProblem(p);
      if (why) return `"${key}" holds an unsafe path ${JSON.stringify(p)} (${why})`;
    }
  }
  return o as WorktreeDoc;
}

// ------------------------------------------------------------------------------ HEAD

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
  const subject = para
    .split("\n")
    .map((l) => l.trim())
    .filter(Boolean)
    .join(" ");
  return { oid, subject, author, time };
}

/** What HEAD should be in a rebuilt repository. */
export interface HeadSpec {
  /** Full ref name HEAD points at, or null when detached. */
  ref: string | null;
  /** The commit HEAD resolves to; null for an unborn branch. */
  oid: string | null;
}
