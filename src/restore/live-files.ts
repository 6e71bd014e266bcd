/** Listing a live directory for restore: every non-directory entry, relative, sorted, memsnap's own entries skipped. */
import { lstat, readdir } from "node:fs/promises";
import { join } from "node:path";
import { isMemsnapPrivate } from "../sources/walk.js";

/**
 * Relative paths of every file, symlink or special entry under `root` (none when it does not
 * exist). Entries whose names are not UTF-8 are not listed, nor is anything under such a
 * directory: no bundle can hold them (the snapshot left them out and said so), so a restore
 * leaves them where they are.
 */
export async function listFiles(root: string): Promise<string[]> {
  const out: string[] = [];
  const walk = async (dir: string, rel: string): Promise<void> => {
    let raw: Buffer[];
    try {
      raw = await readdir(dir, { encoding: "buffer" });
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code === "ENOENT" || (e as NodeJS.ErrnoException).code === "ENOTDIR") return;
      throw e;
    }
    const names = raw.map((b) => b.toString("utf8")).filter((n, i) => Buffer.from(n, "utf8").equals(raw[i]!));
    for (const n of names.sort()) {
      if (isMemsnapPrivate(n)) continue;
      const p = join(dir, n);
      const r = rel ? `${rel}/${n}` : n;
      const st = await lstat(p);
      if (st.isDirectory()) await walk(p, r);
      else out.push(r);
    }
  };
  await walk(root, "");
  return out;
}
