/** Directory walking shared by file-based sources: sorted, filtered, regular files only. */
import { lstat, open, readdir, stat, type FileHandle } from "node:fs/promises";
import { createReadStream, type Stats } from "node:fs";
import { basename, join } from "node:path";
import type { Readable } from "node:stream";
import { MemsnapError } from "../errors.js";
import { compileGlobs } from "../util/glob.js";
import { reusedChunks } from "../util/reused-chunks.js";
import type { Artifact, OpenOptions } from "./types.js";

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

/** A regular file found by {@link walkFiles}. */
export interface FoundFile {
  abs: string;
  rel: string;
  stats: Stats;
}

export interface WalkResult {
  files: FoundFile[];
  skipped: { symlinks: number; special: number };
}

/** Map a file-system error on a source path to MEMSNAP_SOURCE_MISSING / _UNREADABLE. */
export function sourceError(e: unknown, path: string): MemsnapError {
  if (e instanceof MemsnapError) return e;
  const code = (e as NodeJS.ErrnoException).code;
  if (code === "ENOENT") {
    return new MemsnapError("MEMSNAP_SOURCE_MISSING", `source path does not exist: ${path}`, {
      path, hint: "fix the source's path in memsnap.json or create it",
    });
  }
  return new MemsnapError("MEMSNAP_SOURCE_UNREADABLE", `cannot read ${path}: ${(e as Error).message}`, {
    path, cause: e, hint: "check the file's permissions",
  });
}

/**
 * List the regular files under `root` (or `root` itself when it is a file), in byte order
 * of their relative paths so bundles are reproducible. Symlinks and special files are
 * counted and skipped, never followed. Throws MEMSNAP_SOURCE_MISSING / _UNREADABLE.
 */
export async function walkFiles(root: string, opts: WalkOptions = {}): Promise<WalkResult> {
  const inc = opts.include?.length ? compileGlobs(opts.include) : null;
  const exc = opts.exclude?.length ? compileGlobs(opts.exclude) : null;
  const files: FoundFile[] = [];
  const skipped = { symlinks: 0, special: 0 };
  let rootStats: Stats;
  try {
    rootStats = await stat(root);
  } catch (e) {
    throw sourceError(e, root);
  }
  if (rootStats.isFile()) {
    return { files: [{ abs: root, rel: basename(root), stats: rootStats }], skipped };
  }
  const visit = async (dir: string, relDir: string): Promise<void> => {
    let names: string[];
    try {
      names = await readdir(dir);
    } catch (e) {
      throw sourceError(e, dir);
    }
    names.sort((a, b) => (Buffer.from(a) < Buffer.from(b) ? -1 : a === b ? 0 : 1));
    for (const name of names) {
      if (isMemsnapPrivate(name)) continue;
      const abs = join(dir, name);
      const rel = relDir ? `${relDir}/${name}` : name;
      if (exc?.(rel)) continue;
      let st: Stats;
      try {
        st = await lstat(abs);
      } catch (e) {
        if ((e as NodeJS.ErrnoException).code === "ENOENT") continue; // vanished while walking
        throw sourceError(e, abs);
      }
      if (st.isDirectory()) await visit(abs, rel);
      else if (st.isSymbolicLink()) skipped.symlinks++;
      else if (!st.isFile()) skipped.special++;
      else if (!inc || inc(rel)) files.push({ abs, rel, stats: st });
    }
  };
  await visit(root, "");
  return { files, skipped };
}

function changed(path: string, what: string): MemsnapError {
  return new MemsnapError("MEMSNAP_SOURCE_CHANGED", `${path} changed while it was captured (${what})`, {
    path, hint: "retry the snapshot; stop writers or snapshot databases through an sqlite source",
  });
}

/** Open a found file for reading at most `size + 1` bytes, mapping errors to source errors. */
function openBounded(f: FoundFile): Readable {
  const s = createReadStream(f.abs, { start: 0, end: f.stats.size, highWaterMark: 1 << 20 });
  return s;
}

/** The same bytes as openBounded, into reused buffers (Artifact.open with `reuse`). */
async function* reusedFileChunks(f: FoundFile): AsyncGenerator<Buffer> {
  let fh: FileHandle | undefined;
  try {
    fh = await open(f.abs, "r");
    yield* reusedChunks(fh, 0, f.stats.size); // at most size + 1 bytes, like openBounded
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code === "ENOENT") throw changed(f.abs, "it was removed");
    throw sourceError(e, f.abs);
  } finally {
    await fh?.close();
  }
}

/** An artifact backed by a file on disk, with change detection by size and mtime. */
export function fileArtifact(f: FoundFile, kind: string, path = f.rel): Artifact {
  return {
    path,
    kind,
    size: f.stats.size,
    mode: f.stats.mode & 0o7777,
    mtime: f.stats.mtime,
    open: (o?: OpenOptions) => {
      if (o?.reuse) return reusedFileChunks(f);
      const s = openBounded(f);
      return (async function* () {
        try {
          for await (const chunk of s) yield chunk as Buffer;
        } catch (e) {
          if ((e as NodeJS.ErrnoException).code === "ENOENT") throw changed(f.abs, "it was removed");
          throw sourceError(e, f.abs);
        }
      })();
    },
    check: async () => {
      let now: Stats;
      try {
        now = await stat(f.abs);
      } catch {
        throw changed(f.abs, "it was removed");
      }
      if (now.size !== f.stats.size) throw changed(f.abs, `size ${f.stats.size} → ${now.size}`);
      if (now.mtimeMs !== f.stats.mtimeMs) throw changed(f.abs, "modified during capture");
    },
  };
}

export { changed as sourceChanged };
