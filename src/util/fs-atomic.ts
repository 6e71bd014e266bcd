import { execFile } from "node:child_process";
import { open, rename, unlink } from "node:fs/promises";
import { dirname } from "node:path";
import { promisify } from "node:util";
import { destinationError } from "../errors.js";

const execFileP = promisify(execFile);

/** fsync a directory so a rename inside it survives a crash. Errors on platforms without dir fsync are ignored. */
export async function fsyncDir(dir: string): Promise<void> {
  let fh;
  try {
    fh = await open(dir, "r");
    await fh.sync();
  } catch (e) {
    const code = (e as NodeJS.ErrnoException).code;
    if (code !== "EISDIR" && code !== "EINVAL" && code !== "EPERM") throw e;
  } finally {
    await fh?.close();
  }
}

/**
 * Flush the dirty data of the whole filesystem that holds `dir`: syncfs(2), through coreutils'
 * `sync -f` (Node has no binding for it). A restore calls it once on its staged tree before it
 * commits, instead of an fsync per file (a ProcessFork store's 56 sequential fsyncs were ~0.3 s
 * of the bench's restore).
 *
 * A write-back error is an error: syncfs(2) reports one (EIO, ENOSPC) since Linux 5.8, and
 * `sync` then exits non-zero with the errno's text, which becomes MEMSNAP_DEST_FULL or
 * MEMSNAP_DEST_UNWRITABLE here, so a restore never commits a tree the disk did not take.
 * Where `sync` has no `-f` (BSD, macOS) a plain `sync` flushes every filesystem instead; only
 * a missing `sync` binary makes the flush a no-op.
 */
export async function syncFilesystem(dir: string): Promise<void> {
  try {
    await execFileP("sync", ["-f", dir]);
  } catch (e) {
    const err = e as NodeJS.ErrnoException & { stderr?: string };
    if (err.code === "ENOENT") return; // no sync binary at all
    const said = String(err.stderr ?? "").trim();
    if (/invalid option|illegal option|unrecognized option|usage/i.test(said)) {
      await execFileP("sync", []).catch(() => undefined);
      return;
    }
    const errno = /no space left|quota/i.test(said) ? "ENOSPC" : "EIO";
    throw destinationError(Object.assign(new Error(said || `sync -f exited with ${String(err.code)}`), { code: errno }), dir);
  }
}

/** Rename `tmp` over `dest` and fsync the directory: the last step of temp → fsync → rename → fsync dir. */
export async function commitRename(tmp: string, dest: string): Promise<void> {
  await rename(tmp, dest);
  await fsyncDir(dirname(dest));
}

/** Remove a file, ignoring "not found". */
export async function unlinkQuiet(path: string): Promise<void> {
  try {
    await unlink(path);
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code !== "ENOENT") throw e;
  }
}
