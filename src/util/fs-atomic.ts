import { execFile } from "node:child_process";
import { open, rename, unlink } from "node:fs/promises";
import { dirname } from "node:path";
import { promisify } from "node:util";

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
 * of the bench's restore). Best effort, like a missing `sync` binary: failures are ignored.
 */
export async function syncFilesystem(dir: string): Promise<void> {
  await execFileP("sync", ["-f", dir]).catch(() => undefined);
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
