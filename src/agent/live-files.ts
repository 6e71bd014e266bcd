/** Listing a live directory for restore: every non-directory entry, relative, sorted, memsnap's own entries skipped. */
import { readdirSync, type Dirent } from "node:fs";
import { join } from "node:path";
import { isMemsnapPrivate } from "../sources/walk.js";

/**
 * Relative paths of every file, symlink or special entry under `root` (none when it does not
 * exist). Entries whose names are not UTF-8 are not listed, nor is anything under such a
 * directory: no bundle can hold them (the snapshot left them out and said so), so a restore
 * leaves them where they are. `withPrivate`: list memsnap's own names too (a staging directory,
 * where a bundle's file of such a name is refused, not passed over).
 */
export async function listFiles(root: string, opts: { withPrivate?: boolean } = {}): Promise<string[]> {
  const out: string[] = [];
  // Synchronous calls, and the entries' types from the directory itself: an awaited lstat per
  // entry made listing 20,000 live notes a second or more of thread-pool round trips.
  const walk = (dir: string, rel: string): void => {
    let ents: Dirent<Buffer>[];
    try {
      ents = readdirSync(dir, { withFileTypes: true, encoding: "buffer" });
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code === "ENOENT" || (e as NodeJS.ErrnoException).code === "ENOTDIR") return;
      throw e;
    }
    const names = ents
      .map((d) => ({ d, n: d.name.toString("utf8") }))
      .filter((x) => Buffer.from(x.n, "utf8").equals(x.d.name));
    names.sort((a, b) => (a.n < b.n ? -1 : a.n > b.n ? 1 : 0));
    for (const { d, n } of names) {
      // (a staging listing keeps them: the restore refuses them)
      if (!opts.withPrivate && isMemsnapPrivate(n)) continue;
      const r = rel ? `${rel}/${n}` : n;
      if (d.isDirectory()) walk(join(dir, n), r);
      else out.push(r);
    }
  };
  walk(root, "");
  return out;
}
