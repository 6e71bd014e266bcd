/** Directory walking shared by file-based sources: sorted, filtered, regular files only. */
import { open, stat, type FileHandle } from "node:fs/promises";
import {
  closeSync,
  createReadStream,
  fstatSync,
  lstatSync,
  openSync,
  readdirSync,
  readSync,
  statSync,
  type Stats,
} from "node:fs";
import { constants as osConstants } from "node:os";
import { basename, join } from "node:path";
import { getSystemErrorName } from "node:util";
import type { Readable } from "node:stream";
import { sourceChanged, sourceError } from "../errors.js";
import { compileGlobs } from "../util/glob.js";
import { CompactStats, nativeFs, SD, type FileStats } from "../util/native-fs.js";
import { reusedChunks } from "../util/reused-chunks.js";
import type { Artifact, OpenOptions } from "./types.js";

/** A file's bytes as the batch read them, and its stat after the read. */
export interface ReadAhead {
  bytes: Buffer;
  stats: FileStats;
}

export type { FileStats };

const ENOENT = osConstants.errno.ENOENT;

export interface WalkOptions {
  include?: readonly string[];
  exclude?: readonly string[];
}

/** A predicate for "this relative path is selected by these include/exclude globs". */
export function selector(opts: WalkOptions): (rel: string) => boolean {
  const inc = opts.include?.length ? compileGlobs(opts.include) : null;
  const exc = opts.exclude?.length ? compileGlobs(opts.exclude) : null;
  return (rel) => !rel.split("/").some(isMemsnapPrivate) && !exc?.(rel) && (!inc || inc(rel));
}

/** memsnap's own control dir and in-flight staging/backup/work dirs are never captured or restored over. */
export function isMemsnapPrivate(name: string): boolean {
  return name === ".memsnap" || /\.memsnap-(new|old|work|staging)-/.test(name) || /^\.memsnap-work-/.test(name);
}

/** The walk's synchronous calls run at most this long before the event loop gets a turn (ms). */
const WALK_SLICE_MS = 8;

/** A regular file found by {@link walkFiles}. */
export interface FoundFile {
  abs: string;
  rel: string;
  stats: FileStats;
}

export interface WalkResult {
  files: FoundFile[];
  /**
   * What the walk left out: symlinks, special files, and files or directories whose names are
   * not valid UTF-8 (`unsafe_names`; a bundle's paths are UTF-8 text, and Node would hand such a
   * name over mangled; `unsafe` lists their relative paths, the bad bytes escaped as `\xNN`).
   */
  skipped: { symlinks: number; special: number; unsafe_names?: number };
  unsafe?: string[];
  /**
   * Symlinks the globs select (a memory's `latest.md → …`): left out, so counted, the first few
   * named, in a notice.
   */
  links?: LinksLeftOut;
}

export interface LinksLeftOut {
  count: number;
  some: string[];
}

/** The notices (LayerCapture.notices) for what a walk left out: names that are not UTF-8, symlinks. */
export function walkNotices(r: { unsafe?: readonly string[]; links?: LinksLeftOut }): string[] {
  const some = (xs: readonly string[]): string => `${xs.slice(0, 5).join(", ")}${xs.length > 5 ? ", …" : ""}`;
  const out: string[] = [];
  const u = r.unsafe ?? [];
  if (u.length)
    out.push(
      `left out ${u.length} file(s) or folder(s) whose names are not UTF-8, which a bundle cannot hold (rename them ` +
        `to capture them): ${some(u)}`,
    );
  const l = r.links;
  if (l?.count)
    out.push(
      `left out ${l.count} symlink(s): memsnap captures regular files, not links (capture their targets' folder ` +
        `instead): ${l.some.join(", ")}${l.count > l.some.length ? ", …" : ""}`,
    );
  return out;
}

/** A relative path with a name that is not UTF-8, for messages: each invalid byte as `\xNN`. */
export function escapeName(raw: Buffer): string {
  let out = "";
  let i = 0;
  while (i < raw.length) {
    // The longest valid UTF-8 sequence at i, else one byte escaped.
    let taken = false;
    for (let n = Math.min(4, raw.length - i); n >= 1; n--) {
      const piece = raw.subarray(i, i + n);
      const text = piece.toString("utf8");
      if (!text.includes("\ufffd") && Buffer.from(text, "utf8").equals(piece)) {
        out += text;
        i += n;
        taken = true;
        break;
      }
    }
    if (!taken) out += `\\x${raw[i++]!.toString(16).padStart(2, "0")}`;
  }
  return out;
}

/** Map a file-system error on a source path to MEMSNAP_SOURCE_MISSING / _UNREADABLE. */

/**
 * List the regular files under `root` (or `root` itself when it is a file), in byte order
 * of their relative paths so bundles are reproducible. Symlinks and special files are
 * counted and skipped, never followed. Throws MEMSNAP_SOURCE_MISSING / _UNREADABLE.
 */
export async function walkFiles(root: string, opts: WalkOptions = {}): Promise<WalkResult> {
  const walk = await walkStream(root, opts);
  const files: FoundFile[] = [];
  for await (const f of walk) files.push(f);
  return {
    files,
    skipped: walk.skipped,
    ...(walk.unsafe.length ? { unsafe: walk.unsafe } : {}),
    ...(walk.links.count ? { links: walk.links } : {}),
  };
}

/** An entry's lstat as the walk needs it: its kind, and for a file what memsnap keeps of its stat. */
interface EntryStat {
  kind: "dir" | "file" | "link" | "other";
  stats?: FileStats;
}

/** One directory's entries in byte order of their names (so bundles are reproducible). */
interface Listing {
  readonly n: number;
  /** The entry's name, or null when it is not UTF-8 (see raw). */
  name(i: number): string | null;
  raw(i: number): Buffer;
  /** The entry's lstat (`path`: its path, bytes when its name is not UTF-8), null when it vanished. */
  stat(i: number, path: string | Buffer, shown: string): EntryStat | null;
}

function kindOf(fmt: number): EntryStat["kind"] {
  return fmt === 0o040000 ? "dir" : fmt === 0o100000 ? "file" : fmt === 0o120000 ? "link" : "other";
}

/** A Node-style error for an errno the addon returned. */
function errnoError(errno: number, path: string): NodeJS.ErrnoException {
  const code = getSystemErrorName(-errno);
  return Object.assign(new Error(`${code}: ${path}`), { code, errno: -errno, path });
}

/** `dir` listed with the addon's scanDir (one call, entries lstat'ed relative to it) or with node:fs. */
function listDir(dir: string): Listing {
  const native = nativeFs();
  // (the addon takes paths under 4 KiB; a longer one gets node:fs's own error, ENAMETOOLONG)
  if (native !== null && Buffer.byteLength(dir) < 4000) {
    const [err, names, meta] = native.scanDir(dir);
    if (err !== 0) throw sourceError(errnoError(err, dir), dir);
    const F = SD.FIELDS;
    const start = (i: number): number => meta![i * F + SD.OFF]!;
    const end = (i: number): number => start(i) + meta![i * F + SD.LEN]!;
    return {
      n: meta!.length / F,
      name: (i) => (meta![i * F + SD.UTF8] ? names!.toString("utf8", start(i), end(i)) : null),
      raw: (i) => Buffer.from(names!.subarray(start(i), end(i))),
      stat: (i, _path, shown) => {
        const e = meta![i * F + SD.ERR]!;
        if (e !== 0) {
          if (e === ENOENT) return null;
          throw sourceError(errnoError(e, shown), shown);
        }
        const kind = kindOf(meta![i * F + SD.FMT]!);
        return kind === "file" ? { kind, stats: CompactStats.at(meta!, i * F, SD) } : { kind };
      },
    };
  }
  let names: Buffer[];
  try {
    names = readdirSync(dir, { encoding: "buffer" });
  } catch (e) {
    throw sourceError(e, dir);
  }
  names.sort(Buffer.compare);
  return {
    n: names.length,
    name: (i) => {
      const s = names[i]!.toString("utf8");
      return Buffer.from(s, "utf8").equals(names[i]!) ? s : null;
    },
    raw: (i) => names[i]!,
    stat: (_i, path, shown) => {
      let st: Stats;
      try {
        st = lstatSync(path);
      } catch (e) {
        if ((e as NodeJS.ErrnoException).code === "ENOENT") return null;
        throw sourceError(e, shown);
      }
      const kind = st.isDirectory() ? "dir" : st.isFile() ? "file" : st.isSymbolicLink() ? "link" : "other";
      return kind === "file" ? { kind, stats: CompactStats.of(st) } : { kind };
    },
  };
}

/** A walk in progress: its files as they are found, once, and what it has left out so far. */
export interface Walk extends AsyncIterable<FoundFile> {
  readonly skipped: WalkResult["skipped"];
  readonly unsafe: string[];
  readonly links: LinksLeftOut;
}

/**
 * The files of {@link walkFiles} one by one as the walk finds them, holding only the listings
 * of the directories on the current path: a source with very many files (a memory of 200,000
 * notes) then needs no list of them all. The root is checked (and listed) before this returns,
 * so a missing or unreadable root fails here. Single use.
 */
export async function walkStream(root: string, opts: WalkOptions = {}): Promise<Walk> {
  const inc = opts.include?.length ? compileGlobs(opts.include) : null;
  const exc = opts.exclude?.length ? compileGlobs(opts.exclude) : null;
  const skipped: WalkResult["skipped"] = { symlinks: 0, special: 0 };
  const unsafe: string[] = [];
  const links: LinksLeftOut = { count: 0, some: [] };
  let rootStats: Stats;
  try {
    rootStats = await stat(root);
  } catch (e) {
    throw sourceError(e, root);
  }
  if (rootStats.isFile()) {
    const it = (async function* (): AsyncGenerator<FoundFile> {
      yield { abs: root, rel: basename(root), stats: rootStats };
    })();
    return { skipped, unsafe, links, [Symbol.asyncIterator]: () => it };
  }
  // Entries are listed and stat'ed with synchronous calls, yielding to the event loop every
  // WALK_SLICE_MS: an async lstat per entry is a thread-pool round trip, and awaited one after
  // another they made the walk latency-bound (3,010 files of the bench's memory layer: 180-375 ms
  // async against 37-64 ms this way, with the machine busy).
  const stack: { dir: string; relDir: string; list: Listing; i: number }[] = [
    { dir: root, relDir: "", list: listDir(root), i: 0 },
  ];
  const it = (async function* (): AsyncGenerator<FoundFile> {
    let slice = performance.now();
    while (stack.length > 0) {
      const top = stack[stack.length - 1]!;
      if (top.i === top.list.n) {
        stack.pop();
        continue;
      }
      const i = top.i++;
      const { dir, relDir, list } = top;
      const name = list.name(i);
      // A name that is not UTF-8: a bundle cannot name it, and decoded it is another file's (or
      // none). Left out and reported, never silently; the decoded name only meets the globs.
      const raw = name === null ? list.raw(i) : null;
      const shown = name ?? raw!.toString("utf8");
      if (isMemsnapPrivate(shown)) continue;
      const rel = relDir ? `${relDir}/${shown}` : shown;
      if (exc?.(rel)) continue;
      if (performance.now() - slice >= WALK_SLICE_MS) {
        await new Promise<void>((r) => setImmediate(r));
        slice = performance.now();
      }
      const abs = join(dir, shown);
      const st = list.stat(i, raw === null ? abs : Buffer.concat([Buffer.from(`${dir}/`), raw]), abs);
      if (st === null) continue; // vanished while walking
      if (raw !== null) {
        if (st.kind === "link") skipped.symlinks++;
        else if (st.kind === "dir" || (st.kind === "file" && (!inc || inc(rel)))) {
          skipped.unsafe_names = (skipped.unsafe_names ?? 0) + 1;
          unsafe.push(relDir ? `${relDir}/${escapeName(raw)}` : escapeName(raw));
        } else if (st.kind !== "file") skipped.special++;
        continue;
      }
      if (st.kind === "dir") stack.push({ dir: abs, relDir: rel, list: listDir(abs), i: 0 });
      else if (st.kind === "link") {
        skipped.symlinks++;
        if (!inc || inc(rel)) {
          links.count++;
          if (links.some.length < 5) links.some.push(rel);
        }
      } else if (st.kind !== "file") skipped.special++;
      else if (!inc || inc(rel)) yield { abs, rel, stats: st.stats! };
    }
  })();
  return { skipped, unsafe, links, [Symbol.asyncIterator]: () => it };
}

/**
 * How many bytes of a found file a read asks for: `size + 1`, so a file that grew is detected
 * without reading it to its end; or exactly `prefix` for an append-only file, whose growth
 * after the walk is not captured.
 */
function readLimit(f: FoundFile, prefix: number | undefined): number {
  return prefix ?? f.stats.size + 1;
}

/** Open a found file for reading its first `limit` bytes. */
function openBounded(f: FoundFile, limit: number): Readable {
  return createReadStream(f.abs, { start: 0, end: limit - 1, highWaterMark: 1 << 20 });
}

/**
 * Files up to this size are read with synchronous calls, in one piece: open, read and close as
 * thread-pool round trips, awaited one after another, cost more than the read itself, and a
 * memory layer is thousands of small notes.
 */
export const SMALL_FILE = 64 * 1024;

/** The same bytes as openBounded, into reused buffers (Artifact.open with `reuse`). */
async function* reusedFileChunks(f: FoundFile, limit: number): AsyncGenerator<Buffer> {
  // (small files never come here: fileArtifact reads them whole, see SMALL_FILE)
  let fh: FileHandle | undefined;
  try {
    fh = await open(f.abs, "r");
    yield* reusedChunks(fh, 0, limit - 1); // at most `limit` bytes, like openBounded
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code === "ENOENT") throw sourceChanged(f.abs, "it was removed");
    throw sourceError(e, f.abs);
  } finally {
    await fh?.close();
  }
}

/** A small file's first `limit` bytes (or fewer, like openBounded) as one chunk, read synchronously. */
function* smallFileChunk(f: FoundFile, limit: number, onRead?: (st: Stats) => void): Generator<Buffer> {
  if (limit === 0) return;
  let buf: Buffer;
  let fd: number | undefined;
  try {
    fd = openSync(f.abs, "r");
    buf = Buffer.allocUnsafe(limit);
    let n = 0;
    for (;;) {
      const got = readSync(fd, buf, n, buf.length - n, n);
      n += got;
      if (got === 0 || n === buf.length) break;
    }
    buf = buf.subarray(0, n);
    onRead?.(fstatSync(fd));
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code === "ENOENT") throw sourceChanged(f.abs, "it was removed");
    throw sourceError(e, f.abs);
  } finally {
    if (fd !== undefined) closeSync(fd);
  }
  if (buf.length > 0) yield buf;
}

/**
 * A file's identity for incremental snapshots (see Artifact.fingerprint): any write, rename
 * over it, chmod or touch changes its ctime, which nothing but the clock can set.
 */
export function fingerprintOf(st: FileStats): string {
  return `${st.dev}:${st.ino}:${st.size}:${st.mtimeMs}:${st.ctimeMs}`;
}

/**
 * An artifact backed by a file on disk, with change detection by size and mtime. With
 * `prefix`, an append-only file (a log a writer appends to): only its first `prefix` bytes are
 * captured (see {@link completeLinesPrefix}), growth during the capture is allowed, and a file
 * that shrank, was replaced or was rewritten without growing is MEMSNAP_SOURCE_CHANGED.
 */
export function fileArtifact(
  f: FoundFile,
  kind: string,
  path = f.rel,
  prefix?: number,
  pre?: ReadAhead | null,
): Artifact {
  const limit = readLimit(f, prefix);
  // A small file's stat, taken on its descriptor right after its one read: check() compares
  // it instead of a stat by path (one syscall of the ~5 a small file costs, and no path lookup).
  let afterRead: FileStats | null = null;
  const small = limit <= SMALL_FILE;
  const readDone = (st: FileStats): void => {
    afterRead = st;
  };
  // Bytes read ahead (./prefetch.ts): the first open() yields them; any later one reads again.
  let ahead = small ? (pre ?? null) : null;
  return {
    path,
    kind,
    size: prefix ?? f.stats.size,
    mode: f.stats.mode & 0o7777,
    mtime: f.stats.mtime,
    rereadable: true, // each open() reads the file again; check() compares it with f.stats
    file: f.abs,
    open: (o?: OpenOptions) => {
      if (small) {
        afterRead = null;
        if (ahead !== null) {
          const { bytes, stats } = ahead;
          ahead = null;
          afterRead = stats;
          return bytes.length > 0 ? [bytes] : [];
        }
        return smallFileChunk(f, limit, readDone); // a fresh buffer per call, with or without `reuse`
      }
      if (o?.reuse) return reusedFileChunks(f, limit);
      const s = openBounded(f, limit);
      return (async function* () {
        try {
          for await (const chunk of s) yield chunk as Buffer;
        } catch (e) {
          if ((e as NodeJS.ErrnoException).code === "ENOENT") throw sourceChanged(f.abs, "it was removed");
          throw sourceError(e, f.abs);
        }
      })();
    },
    check: async () => {
      let now: FileStats;
      if (afterRead !== null) {
        now = afterRead;
        // The bytes came from the file the walk saw, not one renamed over it since.
        if (now.ino !== f.stats.ino || now.dev !== f.stats.dev) throw sourceChanged(f.abs, "it was replaced");
      } else {
        try {
          now = statSync(f.abs); // one syscall; awaited round trips per file added up (see SMALL_FILE)
        } catch {
          throw sourceChanged(f.abs, "it was removed");
        }
      }
      if (prefix !== undefined) {
        if (now.ino !== f.stats.ino || now.dev !== f.stats.dev)
          throw sourceChanged(f.abs, "it was replaced (an append-only file may only grow)");
        if (now.size < f.stats.size)
          throw sourceChanged(
            f.abs,
            `it shrank from ${f.stats.size} to ${now.size} bytes (an append-only file may only grow)`,
          );
        if (now.size === f.stats.size && now.mtimeMs !== f.stats.mtimeMs)
          throw sourceChanged(f.abs, "rewritten without growing (an append-only file may only grow)");
        return;
      }
      if (now.size !== f.stats.size) throw sourceChanged(f.abs, `size ${f.stats.size} → ${now.size}`);
      if (now.mtimeMs !== f.stats.mtimeMs) throw sourceChanged(f.abs, "modified during capture");
    },
  };
}

/**
 * How much of an append-only file to capture: its first `size` bytes up to the end of the last
 * complete line. A last line without its `\n` counts when `complete(tail)` says so (a finished
 * record whose writer added no final newline) and is left out when it does not (a line still
 * being written), or when it is longer than `maxTail` (not read). `tail` is the bytes left out.
 */
export async function completeLinesPrefix(
  abs: string,
  size: number,
  complete: ((tail: Buffer) => boolean) | null,
  maxTail: number,
): Promise<{ size: number; tail: number }> {
  if (size === 0) return { size, tail: 0 };
  const fh = await open(abs, "r");
  try {
    const last = Buffer.alloc(1);
    if ((await fh.read(last, 0, 1, size - 1)).bytesRead < 1) throw sourceChanged(abs, `it shrank below ${size} bytes`);
    if (last[0] === 0x0a) return { size, tail: 0 };
    const BLOCK = 64 * 1024;
    let nl = -1;
    for (let end = size; end > 0 && nl < 0; end -= BLOCK) {
      const start = Math.max(0, end - BLOCK);
      const buf = Buffer.alloc(end - start);
      await fh.read(buf, 0, buf.length, start);
      const i = buf.lastIndexOf(0x0a);
      if (i >= 0) nl = start + i;
    }
    const tailLen = size - (nl + 1);
    if (complete && tailLen <= maxTail) {
      const tail = Buffer.alloc(tailLen);
      const { bytesRead } = await fh.read(tail, 0, tailLen, nl + 1);
      if (bytesRead === tailLen && complete(tail)) return { size, tail: 0 };
    }
    return { size: nl + 1, tail: tailLen };
  } finally {
    await fh.close();
  }
}

export { sourceChanged, sourceError } from "../errors.js";
