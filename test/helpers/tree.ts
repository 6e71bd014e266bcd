/** A directory tree as data, for tests that require "nothing changed": every node's type, mode and bytes or link target. */
import { createHash } from "node:crypto";
import { lstatSync, readdirSync, readFileSync, readlinkSync } from "node:fs";
import { join } from "node:path";

/** Every node under `dir` (type, permission bits, SHA-256 or link target), any `.memsnap/lock` aside. */
export function tree(dir: string): Record<string, string> {
  const out: Record<string, string> = {};
  const walk = (d: string, rel: string): void => {
    for (const n of readdirSync(d).sort()) {
      const p = join(d, n);
      const r = rel ? `${rel}/${n}` : n;
      if (n === "lock" && (rel === ".memsnap" || rel.endsWith("/.memsnap"))) continue;
      const st = lstatSync(p);
      if (st.isSymbolicLink()) out[r] = `link ${readlinkSync(p)}`;
      else if (st.isDirectory()) {
        out[r] = `dir ${(st.mode & 0o7777).toString(8)}`;
        walk(p, r);
      } else out[r] = `file ${(st.mode & 0o7777).toString(8)} ${createHash("sha256").update(readFileSync(p)).digest("hex")}`;
    }
  };
  walk(dir, "");
  return out;
}
