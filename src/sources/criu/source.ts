/**
 * The `criu` source: CRIU process dumps (images directories), validated and captured byte
 * for byte.
 *
 * memsnap ingests images directories it did not make (CRIU cannot dump on every kernel:
 * criu 3.17 fails on kernel ≥ 6.13), so every dump is checked before a byte is packed:
 * inventory present, every framed image with known magics and frames ending exactly at EOF,
 * `size(pages-N.img) == 4096 × Σ nr_pages` of the PE_PRESENT entries not in the parent, every
 * pstree pid with its core-/mm-/pagemap- images, and an incremental dump's `parent` link
 * resolving inside the captured dump series. A `procs.criu.v1` blob (one JSON header line,
 * `\n`, a tar of the images directory) is unpacked to the capture's temp dir and checked the
 * same way. `criu dump` runs only when the config names a pid and `criu check` passes.
 *
 * Layer layout: `images/<name>` for the dump, `parent/<name>` for its parent (and
 * `parent/parent/…` further up the chain). Restore recreates `images/parent → ../parent`.
 * Process memory cannot be redacted: the kind is marked `processMemory`, so a plaintext
 * bundle with a criu layer is refused unless explicitly allowed.
 */
import { execFile } from "node:child_process";
import { createReadStream, type Stats } from "node:fs";
import { lstat, mkdir, mkdtemp, open, readdir, readFile, readlink, realpath, rm, stat, symlink } from "node:fs/promises";
import { basename, dirname, isAbsolute, join, posix, resolve, sep } from "node:path";
import { Readable, type Writable } from "node:stream";
import { pipeline } from "node:stream/promises";
import { tarStream } from "../../util/tar-stream.js";
import { MemsnapError } from "../../errors.js";
import { configInvalid, optInt, optString, rejectUnknownKeys, reqString } from "../../util/config-check.js";
import {
  classifyImage, decodePagemapEntry, decodePagemapHead, decodePstreePid, ImageFormatError, PAGE_SIZE, pagesId,
  pagesInImage, PE_PARENT, scanImage, type ImageClass,
} from "./format.js";
import type { Artifact, SourceKind } from "../types.js";
import { fileArtifact, sourceError } from "../walk.js";

export interface CriuConfig {
  kind: "criu";
  name: string;
  /** An images directory, or a procs.criu.v1 blob file; with `pid`, where `criu dump` writes (new or empty). */
  path?: string;
  /** Dump this process with `criu dump --leave-running` (needs a working criu). */
  pid?: number;
  /** The criu executable (default `criu` on PATH). */
  criu_bin?: string;
}

/** How deep an incremental chain may be. */
export const CRIU_MAX_CHAIN = 32;
/** Largest procs.criu.v1 header line. */
const BLOB_HEADER_MAX = 1024 * 1024;
const CRIU_TIMEOUT_MS = 10 * 60 * 1000;

function invalid(path: string, why: string): MemsnapError {
  return new MemsnapError("MEMSNAP_CRIU_INVALID", `CRIU images ${path}: ${why}`, {
    path,
    hint: "point the criu source at a complete images directory (criu dump -D DIR) or a procs.criu.v1 blob; a damaged dump must be taken again",
  });
}

/** One directory of the chain: the dump itself (depth 0) or a parent. */
interface Level {
  dir: string;
  prefix: string;
}

interface ImageFile {
  abs: string;
  name: string;
  cls: ImageClass;
  stats: Stats;
}

interface LevelScan {
  level: Level;
  files: ImageFile[];
  pids: number[];
  pagesBytes: number;
}

interface Skipped {
  other: number;
  symlinks: number;
  dirs: number;
}

const isInside = (p: string, root: string): boolean => p !== root && p.startsWith(root.endsWith(sep) ? root : root + sep);

/** Follow `parent` links from `top`; every one must resolve to a directory strictly inside `root`. */
async function resolveChain(top: string, root: string): Promise<Level[]> {
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
    if (!st.isSymbolicLink() && !st.isDirectory()) throw invalid(link, "`parent` is neither a symlink nor a directory");
    let real: string;
    try {
      real = await realpath(link);
    } catch {
      throw invalid(link, `the parent link (${target ?? "parent"}) does not resolve; an incremental dump needs its parent images`);
    }
    if (!isInside(real, root)) {
      throw invalid(link, `the parent link ${JSON.stringify(target ?? "parent")} resolves to ${real}, outside the captured dump series ${root}; refusing to capture it`);
    }
    if (!(await stat(real)).isDirectory()) throw invalid(link, `the parent link resolves to ${real}, which is not a directory`);
    if (seen.has(real)) throw invalid(link, "the parent chain loops");
    if (levels.length >= CRIU_MAX_CHAIN) throw invalid(link, `the parent chain is deeper than ${CRIU_MAX_CHAIN}`);
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
async function scanLevel(level: Level, depth: number, hasParent: boolean, skipped: Skipped): Promise<LevelScan> {
  const files = await listLevel(level, skipped);
  const byName = new Map(files.map((f) => [f.name, f]));
  if (!byName.has("inventory.img")) throw invalid(level.dir, "no inventory.img (not a CRIU images directory)");
  if (depth === 0 && !byName.has("pstree.img")) throw invalid(level.dir, "no pstree.img (a dump, not a pre-dump, is needed at the top of the chain)");
  let pids: number[] = [];
  const pagemaps: { file: ImageFile; pagesId: number; pages: number }[] = [];
  for (const f of files) {
    if (f.cls === "pages" || f.cls === "raw") continue;
    const decode = f.name === "pstree.img" || f.name.startsWith("pagemap-");
    let r;
    try {
      r = await scanImage(f.cls, createReadStream(f.abs, { highWaterMark: 1 << 20 }), decode);
    } catch (e) {
      if (e instanceof ImageFormatError) throw invalid(f.abs, e.message);
      throw sourceError(e, f.abs);
    }
    if (r.bytes !== f.stats.size) throw invalid(f.abs, `changed while it was checked (${f.stats.size} → ${r.bytes} bytes)`);
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
            throw new ImageFormatError(`has pages in the parent dump (vaddr 0x${e.vaddr.toString(16)}) but the dump has no parent link`);
          }
          pages += pagesInImage(e);
        }
        pagemaps.push({ file: f, pagesId: decodePagemapHead(head), pages });
      }
    } catch (e) {
      if (e instanceof ImageFormatError) throw invalid(f.abs, e.message);
      throw e;
    }
  }
  for (const pid of pids) {
    for (const img of [`core-${pid}.img`, `mm-${pid}.img`, `pagemap-${pid}.img`]) {
      if (!byName.has(img)) throw invalid(level.dir, `pid ${pid} is in pstree.img but ${img} is missing`);
    }
  }
  const claimed = new Map<number, string>();
  let pagesBytes = 0;
  for (const pm of pagemaps) {
    const other = claimed.get(pm.pagesId);
    if (other) throw invalid(pm.file.abs, `pages_id ${pm.pagesId} is also claimed by ${other}`);
    claimed.set(pm.pagesId, pm.file.name);
    const pagesName = `pages-${pm.pagesId}.img`;
    const pf = byName.get(pagesName);
    const want = pm.pages * PAGE_SIZE;
    const have = pf ? pf.stats.size : 0;
    if (!pf && want > 0) throw invalid(level.dir, `${pm.file.name} lists ${pm.pages} page(s) in ${pagesName}, which is missing`);
    if (have !== want) {
      throw invalid(pf!.abs, `${pagesName} has ${have} bytes but ${pm.file.name} lists ${pm.pages} present page(s) = ${want} bytes`);
    }
    pagesBytes += have;
  }
  for (const f of files) {
    const id = pagesId(f.name);
    if (id !== null && !claimed.has(id)) throw invalid(f.abs, `${f.name} is not referenced by any pagemap`);
  }
  return { level, files, pids, pagesBytes };
}

/** Read the procs.criu.v1 header line and unpack the tar that follows into `dest`. */
async function unpackBlob(file: string, dest: string, signal?: AbortSignal): Promise<{ header: unknown; images: string }> {
  const src = createReadStream(file, { highWaterMark: 1 << 20 });
  const it = src[Symbol.asyncIterator]() as AsyncIterator<Buffer>;
  let head = Buffer.alloc(0);
  let rest = Buffer.alloc(0);
  try {
    for (;;) {
      const r = await it.next();
      if (r.done) throw invalid(file, "not a procs.criu.v1 blob (no header line)");
      head = Buffer.concat([head, r.value]);
      const nl = head.indexOf(0x0a);
      if (nl >= 0) {
        rest = head.subarray(nl + 1);
        head = head.subarray(0, nl);
        break;
      }
      if (head.length > BLOB_HEADER_MAX) throw invalid(file, `not a procs.criu.v1 blob (no newline in the first ${BLOB_HEADER_MAX} bytes)`);
    }
  } catch (e) {
    src.destroy();
    throw e instanceof MemsnapError ? e : sourceError(e, file);
  }
  let header: unknown;
  try {
    header = JSON.parse(head.toString("utf8"));
  } catch (e) {
    src.destroy();
    throw invalid(file, `the procs.criu.v1 header line is not JSON (${(e as Error).message})`);
  }
  if (typeof header !== "object" || header === null || Array.isArray(header)) {
    src.destroy();
    throw invalid(file, "the procs.criu.v1 header line is not a JSON object");
  }
  const rootDir = join(dest, "tar");
  await mkdir(rootDir, { recursive: true });
  const extract = (await tarStream()).extract();
  // The iterator must exist before bytes flow: tar-stream drops entries emitted before it.
  const entries = extract[Symbol.asyncIterator]();
  const feed = pipeline(
    Readable.from((async function* () {
      if (rest.length) yield rest;
      for (;;) {
        const r = await it.next();
        if (r.done) return;
        yield r.value;
      }
    })()),
    extract as unknown as Writable,
    ...(signal ? [{ signal }] : []),
  );
  feed.catch(() => undefined);
  const links: { path: string; target: string }[] = [];
  const linkNames = new Set<string>();
  try {
    for (;;) {
      const next = await entries.next();
      if (next.done) break;
      const entry = next.value;
      const h = entry.header;
      let name = h.name.replace(/^(\.\/)+/, "").replace(/\/+$/, "");
      if (name === "" || name === ".") {
        entry.resume();
        continue;
      }
      const bad = name.startsWith("/") ? "absolute path" : name.includes("\0") ? "NUL in name" : name.includes("\\") ? "backslash in name"
        : name.split("/").some((s) => s === ".." || s === "" || s === ".") ? "'..', '.' or empty segment" : null;
      if (bad) throw invalid(file, `unsafe tar entry ${JSON.stringify(h.name)} (${bad})`);
      name = posix.normalize(name);
      const parts = name.split("/");
      for (let i = 1; i < parts.length; i++) {
        if (linkNames.has(parts.slice(0, i).join("/"))) throw invalid(file, `tar entry ${JSON.stringify(h.name)} goes through a symlink`);
      }
      const out = join(rootDir, ...parts);
      if (h.type === "directory") {
        await mkdir(out, { recursive: true });
        entry.resume();
      } else if (h.type === "file" || h.type === "contiguous-file") {
        await mkdir(dirname(out), { recursive: true });
        const fh = await open(out, "wx", 0o600);
        try {
          for await (const c of entry as AsyncIterable<Buffer>) await fh.write(c);
        } finally {
          await fh.close();
        }
      } else if (h.type === "symlink" && parts[parts.length - 1] === "parent" && h.linkname && !isAbsolute(h.linkname)) {
        links.push({ path: out, target: h.linkname });
        linkNames.add(name);
        entry.resume();
      } else {
        throw invalid(file, `tar entry ${JSON.stringify(h.name)} is a ${h.type ?? "unknown"} entry; only regular files, directories and relative \`parent\` symlinks are allowed`);
      }
    }
    await feed;
  } catch (e) {
    extract.destroy();
    src.destroy();
    await feed.catch(() => undefined);
    if (e instanceof MemsnapError) throw e;
    const code = (e as NodeJS.ErrnoException).code;
    if (code === "EEXIST") throw invalid(file, "the tar holds the same entry twice");
    if (code && code !== "ERR_STREAM_PREMATURE_CLOSE") throw sourceError(e, file);
    throw invalid(file, `the tar after the header line is malformed (${(e as Error).message})`);
  }
  for (const l of links) {
    try {
      await symlink(l.target, l.path);
    } catch (e) {
      throw invalid(file, `cannot place the parent link ${l.path}: ${(e as Error).message}`);
    }
  }
  // A tar of `images/` (one top-level directory) as well as one of `images/.` is accepted.
  let images = rootDir;
  const top = await readdir(rootDir);
  if (!top.includes("inventory.img") && top.length === 1 && (await lstat(join(rootDir, top[0]!))).isDirectory()) images = join(rootDir, top[0]!);
  return { header, images };
}

function run(bin: string, args: string[], signal?: AbortSignal): Promise<{ ok: boolean; out: string; why: string }> {
  return new Promise((res) => {
    execFile(bin, args, { timeout: CRIU_TIMEOUT_MS, maxBuffer: 4 << 20, ...(signal ? { signal } : {}) }, (err, stdout, stderr) => {
      const text = `${stderr}\n${stdout}`.trim();
      if (!err) return res({ ok: true, out: text, why: "" });
      const e = err as NodeJS.ErrnoException & { code?: unknown };
      const why = e.code === "ENOENT" ? `${bin} not found` : e.code === "EACCES" ? `${bin} is not executable`
        : text.split("\n").filter(Boolean).slice(-3).join(" / ") || e.message;
      res({ ok: false, out: text, why });
    });
  });
}

/** `criu check`, then `criu dump --leave-running` of `pid` into `images`. */
async function criuDump(cfg: CriuConfig, baseDir: string, images: string, work: string, signal?: AbortSignal): Promise<string> {
  const bin = cfg.criu_bin ? (cfg.criu_bin.includes("/") ? resolve(baseDir, cfg.criu_bin) : cfg.criu_bin) : "criu";
  const chk = await run(bin, ["check"], signal);
  if (!chk.ok) {
    throw new MemsnapError("MEMSNAP_SOURCE_UNREADABLE", `criu dump needs a working criu (criu check failed: ${chk.why})`, {
      hint: "install CRIU ≥ 4.1 (3.17 fails on kernel ≥ 6.13) and run with the rights criu needs (root or CAP_CHECKPOINT_RESTORE), or capture an existing images directory with \"path\" and no \"pid\"",
    });
  }
  const dumped = await run(bin, ["dump", "-t", String(cfg.pid), "-D", images, "-W", work, "-o", "dump.log", "--leave-running"], signal);
  if (!dumped.ok) {
    const log = await readFile(join(work, "dump.log"), "utf8").catch(() => "");
    const tail = log.trim().split("\n").slice(-3).join(" / ");
    throw new MemsnapError("MEMSNAP_SOURCE_UNREADABLE", `criu dump of pid ${cfg.pid} failed: ${tail || dumped.why}`, {
      path: images, hint: `see ${join(work, "dump.log")} while the snapshot runs, or run criu dump by hand and capture the directory with "path"`,
    });
  }
  return bin;
}

/** Drain `bytes` completely, whatever `fn` does with them (a deep check must not stop the payload read). */
async function consumeAll<T>(bytes: AsyncIterable<Buffer>, fn: (b: AsyncIterable<Buffer>) => Promise<T>): Promise<T> {
  const it = bytes[Symbol.asyncIterator]();
  const view: AsyncIterable<Buffer> = {
    [Symbol.asyncIterator]: () => ({ next: () => it.next(), return: async () => ({ done: true as const, value: undefined }) }),
  };
  try {
    return await fn(view);
  } finally {
    for (;;) if ((await it.next()).done) break;
  }
}

function pageKind(name: string): string {
  return pagesId(name) !== null ? "criu-pages" : "criu-image";
}

/** CRIU dumps; see the module comment. */
export const criuSource: SourceKind<CriuConfig> = {
  kind: "criu",
  schemaVersion: 1,
  processMemory: true,
  parseConfig(raw, where) {
    rejectUnknownKeys(raw, ["kind", "name", "path", "pid", "criu_bin"], where);
    const cfg: CriuConfig = { kind: "criu", name: reqString(raw, "name", where) };
    const path = optString(raw, "path", where);
    const pid = optInt(raw, "pid", where, 1, 4194304);
    const bin = optString(raw, "criu_bin", where);
    if (path !== undefined) cfg.path = path;
    if (pid !== undefined) cfg.pid = pid;
    if (bin !== undefined) cfg.criu_bin = bin;
    if (path === undefined && pid === undefined) throw configInvalid(where, 'a criu source needs "path" (an images directory or procs.criu.v1 blob) or "pid" (dump a running process)');
    return cfg;
  },
  async capture(cfg, ctx) {
    let tmp: string | null = null;
    const tmpDir = async (): Promise<string> => (tmp ??= await mkdtemp(join(ctx.tmpDir, `criu-${cfg.name}-`)));
    const cleanup = async (): Promise<void> => {
      if (tmp) await rm(tmp, { recursive: true, force: true });
    };
    try {
      let origin: "dir" | "blob" | "dump";
      let top: string;
      let root: string;
      let source: string;
      const meta: Record<string, unknown> = {};
      if (cfg.pid !== undefined) {
        origin = "dump";
        const t = await tmpDir();
        let images: string;
        if (cfg.path !== undefined) {
          images = resolve(ctx.baseDir, cfg.path);
          const existing = await readdir(images).catch((e: NodeJS.ErrnoException) => {
            if (e.code === "ENOENT") return [] as string[];
            throw sourceError(e, images);
          });
          if (existing.length) {
            throw new MemsnapError("MEMSNAP_SOURCE_INVALID", `criu dump target ${images} is not empty`, {
              path: images, hint: "with \"pid\", \"path\" names a new or empty directory for criu dump; drop \"pid\" to capture an existing dump",
            });
          }
          await mkdir(images, { recursive: true, mode: 0o700 }).catch((e: unknown) => { throw sourceError(e, images); });
        } else {
          images = join(t, "images");
          await mkdir(images, { mode: 0o700 });
        }
        const work = join(t, "work");
        await mkdir(work, { mode: 0o700 });
        meta.criu_bin = await criuDump(cfg, ctx.baseDir, images, work, ctx.signal);
        meta.pid = cfg.pid;
        source = cfg.path !== undefined ? images : "";
        top = await realpath(images);
        root = dirname(top);
      } else {
        source = resolve(ctx.baseDir, cfg.path!);
        let st: Stats;
        try {
          st = await stat(source);
        } catch (e) {
          throw sourceError(e, source);
        }
        if (st.isDirectory()) {
          origin = "dir";
          top = await realpath(source);
          root = dirname(top);
        } else if (st.isFile()) {
          origin = "blob";
          const { header, images } = await unpackBlob(source, await tmpDir(), ctx.signal);
          const text = JSON.stringify(header);
          if (text.length <= 4096) meta.blob_header = header;
          top = await realpath(images);
          root = top;
        } else {
          throw invalid(source, "neither a directory nor a file");
        }
      }
      const levels = await resolveChain(top, root);
      const skipped: Skipped = { other: 0, symlinks: 0, dirs: 0 };
      const scans: LevelScan[] = [];
      for (let i = 0; i < levels.length; i++) scans.push(await scanLevel(levels[i]!, i, i + 1 < levels.length, skipped));
      const all = scans.flatMap((s) => s.files.map((f) => ({ f, prefix: s.level.prefix })));
      const pids = scans[0]!.pids;
      Object.assign(meta, {
        origin,
        path: source || null,
        processes: pids.length,
        pids: pids.slice(0, 64),
        images: all.length,
        bytes: all.reduce((n, x) => n + x.f.stats.size, 0),
        pages_bytes: scans.reduce((n, s) => n + s.pagesBytes, 0),
        parent_depth: levels.length - 1,
        skipped,
      });
      return {
        estimatedBytes: meta.bytes as number,
        artifacts: (async function* (): AsyncGenerator<Artifact> {
          for (const { f, prefix } of all) {
            const a = fileArtifact({ abs: f.abs, rel: f.name, stats: f.stats }, pageKind(f.name), `${prefix}/${f.name}`);
            a.text = false;
            yield a;
          }
        })(),
        finish: async () => meta,
        cleanup,
      };
    } catch (e) {
      await cleanup().catch(() => undefined);
      throw e;
    }
  },
  async deepVerify({ entry, bytes }) {
    return consumeAll(bytes, async (b) => {
      const name = basename(entry.path);
      const cls = classifyImage(name);
      if (cls === null) return `${entry.path}: not a CRIU image name`;
      if (cls === "pages" || cls === "raw") {
        let n = 0;
        for await (const c of b) n += c.length;
        return cls === "pages" && n % PAGE_SIZE !== 0 ? `${entry.path}: ${n} bytes is not a whole number of ${PAGE_SIZE}-byte pages` : null;
      }
      const decode = name === "pstree.img" || name.startsWith("pagemap-");
      try {
        const r = await scanImage(cls, b, decode);
        if (name === "pstree.img") r.collected.forEach(decodePstreePid);
        else if (decode) {
          const [head, ...entries] = r.collected;
          if (!head) throw new ImageFormatError("no pagemap head");
          decodePagemapHead(head);
          entries.forEach(decodePagemapEntry);
        }
        return null;
      } catch (e) {
        if (e instanceof ImageFormatError) return `${entry.path}: ${e.message}`;
        throw e;
      }
    });
  },
  async materialize(dir) {
    // The parent chain was captured as `parent/…` (real directories). CRIU finds a dump's
    // parent through `images/parent`; recreate it as the fixed relative link `../parent`,
    // never a target taken from the bundle, so it cannot point outside the layer.
    const parent = join(dir, "parent");
    const images = join(dir, "images");
    const pst = await lstat(parent).catch(() => null);
    if (!pst) return;
    const ist = await lstat(images).catch(() => null);
    if (!pst.isDirectory() || !ist?.isDirectory()) {
      throw new MemsnapError("MEMSNAP_UNSAFE_PATH", `criu layer ${basename(dir)}: parent/ and images/ must both be directories`, {
        path: `${basename(dir)}/parent`, hint: "the bundle was not written by memsnap or was tampered with",
      });
    }
    const link = join(images, "parent");
    const lst = await lstat(link).catch(() => null);
    if (lst) {
      if (lst.isSymbolicLink() && (await readlink(link)) === "../parent") return; // already made
      throw new MemsnapError("MEMSNAP_UNSAFE_PATH", `criu layer ${basename(dir)}: images/parent exists in the bundle; it is reserved for the parent link`, {
        path: `${basename(dir)}/images/parent`, hint: "the bundle was not written by memsnap or was tampered with",
      });
    }
    await symlink("../parent", link);
    const real = await realpath(link);
    if (real !== (await realpath(parent))) {
      throw new MemsnapError("MEMSNAP_UNSAFE_PATH", `criu layer ${basename(dir)}: images/parent does not resolve to the layer's parent/`, { path: `${basename(dir)}/images/parent` });
    }
  },
};
