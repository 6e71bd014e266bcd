/**
 * Validation of a CRIU images directory and its parent chain: every image checked before a byte
 * is packed (see source.ts).
 */
import { createReadStream, type Stats } from "node:fs";
import { lstat, readdir, readlink, realpath, stat } from "node:fs/promises";
import { join, sep } from "node:path";
import { MemsnapError } from "../../errors.js";
import {
  classifyImage,
  decodePagemapEntry,
  decodePagemapHead,
  decodePstreePid,
  ImageFormatError,
  PAGE_SIZE,
  pagesId,
  pagesInImage,
  PE_PARENT,
  scanImage,
  type ImageClass,
} from "./format.js";
import { sourceError } from "../walk.js";

/** How deep an incremental chain may be. */
export const CRIU_MAX_CHAIN = 32;

export function criuInvalid(path: string, why: string): MemsnapError {
  return new MemsnapError("MEMSNAP_CRIU_INVALID", `CRIU images ${path}: ${why}`, {
    path,
    hint:
      "point the criu source at a complete images directory (criu dump -D DIR) or a procs.criu.v1 blob; " +
      "a damaged dump must be taken again",
  });
}

/** One directory of the chain: the dump itself (depth 0) or a parent. */
export interface Level {
  dir: string;
  prefix: string;
}

export interface ImageFile {
  abs: string;
  name: string;
  cls: ImageClass;
  stats: Stats;
}

export interface LevelScan {
  level: Level;
  files: ImageFile[];
  pids: number[];
  pagesBytes: number;
}

export interface Skipped {
  other: number;
  symlinks: number;
  dirs: number;
}

const isInside = (p: string, root: string): boolean =>
  p !== root && p.startsWith(root.endsWith(sep) ? root : root + sep);

/** Follow `parent` links from `top`; every one must resolve to a directory strictly inside `root`. */
export async function resolveChain(top: string, root: string): Promise<Level[]> {
  const levels: Level[] = [{ dir: top, prefix: "images" }];
  const seen = new Set([top]);
  for (;;) {
    const cur = levels[levels.length - 1]!;
    const link = join(cur.dir, "parent");
    let st: Stats;
    try {
      st = await lstat(link);
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code === "ENOENT") break;
      throw sourceError(e, link);
    }
    const target = st.isSymbolicLink() ? await readlink(link) : null;
    if (!st.isSymbolicLink() && !st.isDirectory()) {
      throw criuInvalid(link, "`parent` is neither a symlink nor a directory");
    }
    let real: string;
    try {
      real = await realpath(link);
    } catch {
      throw criuInvalid(
        link,
        `the parent link (${target ?? "parent"}) does not resolve; an incremental dump needs its parent images`,
      );
    }
    if (!isInside(real, root)) {
      throw criuInvalid(
        link,
        `the parent link ${JSON.stringify(target ?? "parent")} resolves to ${real}, ` +
          `outside the captured dump series ${root}; refusing to capture it`,
      );
    }
    if (!(await stat(real)).isDirectory()) {
      throw criuInvalid(link, `the parent link resolves to ${real}, which is not a directory`);
    }
    if (seen.has(real)) throw criuInvalid(link, "the parent chain loops");
    if (levels.length >= CRIU_MAX_CHAIN) throw criuInvalid(link, `the parent chain is deeper than ${CRIU_MAX_CHAIN}`);
    seen.add(real);
    levels.push({ dir: real, prefix: `${cur.prefix === "images" ? "parent" : `${cur.prefix}/parent`}` });
  }
  return levels;
}

async function listLevel(level: Level, skipped: Skipped): Promise<ImageFile[]> {
  let names: string[];
  try {
    names = await readdir(level.dir);
  } catch (e) {
    throw sourceError(e, level.dir);
  }
  names.sort((a, b) => Buffer.compare(Buffer.from(a), Buffer.from(b)));
  const files: ImageFile[] = [];
  for (const name of names) {
    if (name === "parent") continue;
    const abs = join(level.dir, name);
    let st: Stats;
    try {
      st = await lstat(abs);
    } catch (e) {
      throw sourceError(e, abs);
    }
    const cls = classifyImage(name);
    if (st.isSymbolicLink()) skipped.symlinks++;
    else if (st.isDirectory()) skipped.dirs++;
    else if (!st.isFile() || cls === null) skipped.other++;
    else files.push({ abs, name, cls, stats: st });
  }
  return files;
}

/** Validate one directory of the chain; `hasParent` says whether in-parent pages have somewhere to live. */
export async function scanLevel(level: Level, depth: number, hasParent: boolean, skipped: Skipped): Promise<LevelScan> {
  const files = await listLevel(level, skipped);
  const byName = new Map(files.map((f) => [f.name, f]));
  if (!byName.has("inventory.img")) throw criuInvalid(level.dir, "no inventory.img (not a CRIU images directory)");
  if (depth === 0 && !byName.has("pstree.img")) {
    throw criuInvalid(level.dir, "no pstree.img (a dump, not a pre-dump, is needed at the top of the chain)");
  }
  let pids: number[] = [];
  const pagemaps: { file: ImageFile; pagesId: number; pages: number }[] = [];
  for (const f of files) {
    if (f.cls === "pages" || f.cls === "raw") continue;
    const decode = f.name === "pstree.img" || f.name.startsWith("pagemap-");
    let r;
    try {
      r = await scanImage(f.cls, createReadStream(f.abs, { highWaterMark: 1 << 20 }), decode);
    } catch (e) {
      if (e instanceof ImageFormatError) throw criuInvalid(f.abs, e.message);
      throw sourceError(e, f.abs);
    }
    if (r.bytes !== f.stats.size) {
      throw criuInvalid(f.abs, `changed while it was checked (${f.stats.size} → ${r.bytes} bytes)`);
    }
    try {
      if (f.name === "pstree.img") {
        if (r.type !== "pstree") throw new ImageFormatError(`has ${r.type} magic, not pstree`);
        pids = r.collected.map(decodePstreePid);
        if (pids.length === 0) throw new ImageFormatError("no processes");
        const dup = pids.find((p, i) => pids.indexOf(p) !== i);
        if (dup !== undefined) throw new ImageFormatError(`pid ${dup} appears twice`);
      } else if (decode) {
        if (r.type !== "pagemap") throw new ImageFormatError(`has ${r.type} magic, not pagemap`);
        const [head, ...entries] = r.collected;
        if (!head) throw new ImageFormatError("no pagemap head");
        let pages = 0;
        for (const fr of entries) {
          const e = decodePagemapEntry(fr);
          if ((e.flags & PE_PARENT) !== 0 && !hasParent) {
            throw new ImageFormatError(
              `has pages in the parent dump (vaddr 0x${e.vaddr.toString(16)}) but the dump has no parent link`,
            );
          }
          pages += pagesInImage(e);
        }
        pagemaps.push({ file: f, pagesId: decodePagemapHead(head), pages });
      }
    } catch (e) {
      if (e instanceof ImageFormatError) throw criuInvalid(f.abs, e.message);
      throw e;
    }
  }
  for (const pid of pids) {
    for (const img of [`core-${pid}.img`, `mm-${pid}.img`, `pagemap-${pid}.img`]) {
      if (!byName.has(img)) throw criuInvalid(level.dir, `pid ${pid} is in pstree.img but ${img} is missing`);
    }
  }
  const claimed = new Map<number, string>();
  let pagesBytes = 0;
  for (const pm of pagemaps) {
    const other = claimed.get(pm.pagesId);
    if (other) throw criuInvalid(pm.file.abs, `pages_id ${pm.pagesId} is also claimed by ${other}`);
    claimed.set(pm.pagesId, pm.file.name);
    const pagesName = `pages-${pm.pagesId}.img`;
    const pf = byName.get(pagesName);
    const want = pm.pages * PAGE_SIZE;
    const have = pf ? pf.stats.size : 0;
    if (!pf && want > 0) {
      throw criuInvalid(level.dir, `${pm.file.name} lists ${pm.pages} page(s) in ${pagesName}, which is missing`);
    }
    if (have !== want) {
      throw criuInvalid(
        pf!.abs,
        `${pagesName} has ${have} bytes but ${pm.file.name} lists ${pm.pages} present page(s) = ${want} bytes`,
      );
    }
    pagesBytes += have;
  }
  for (const f of files) {
    const id = pagesId(f.name);
    if (id !== null && !claimed.has(id)) throw criuInvalid(f.abs, `${f.name} is not referenced by any pagemap`);
  }
  return { level, files, pids, pagesBytes };
}
