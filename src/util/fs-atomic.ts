import { open, rename, unlink } from "node:fs/promises";
import { dirname } from "node:path";

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
