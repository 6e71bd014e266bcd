/** Unpacking a `procs.criu.v1` blob: one JSON header line, `\n`, a tar of the images directory. */
import { createReadStream } from "node:fs";
import { lstat, mkdir, open, readdir, symlink } from "node:fs/promises";
import { dirname, isAbsolute, join, posix } from "node:path";
import { Readable, type Writable } from "node:stream";
import { pipeline } from "node:stream/promises";
import { tarStream } from "../../util/tar-stream.js";
import { MemsnapError } from "../../errors.js";
import { sourceError } from "../walk.js";
import { criuInvalid } from "./scan.js";

/** Largest procs.criu.v1 header line. */
const BLOB_HEADER_MAX = 1024 * 1024;

/** Read the procs.criu.v1 header line and unpack the tar that follows into `dest`. */
export async function unpackBlob(
  file: string,
  dest: string,
  signal?: AbortSignal,
): Promise<{ header: unknown; images: string }> {
  const src = createReadStream(file, { highWaterMark: 1 << 20 });
  const it = src[Symbol.asyncIterator]() as AsyncIterator<Buffer>;
  let head = Buffer.alloc(0);
  let rest = Buffer.alloc(0);
  try {
    for (;;) {
      const r = await it.next();
      if (r.done) throw criuInvalid(file, "not a procs.criu.v1 blob (no header line)");
      head = Buffer.concat([head, r.value]);
      const nl = head.indexOf(0x0a);
      if (nl >= 0) {
        rest = head.subarray(nl + 1);
        head = head.subarray(0, nl);
        break;
      }
      if (head.length > BLOB_HEADER_MAX) {
        throw criuInvalid(file, `not a procs.criu.v1 blob (no newline in the first ${BLOB_HEADER_MAX} bytes)`);
      }
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
    throw criuInvalid(file, `the procs.criu.v1 header line is not JSON (${(e as Error).message})`);
  }
  if (typeof header !== "object" || header === null || Array.isArray(header)) {
    src.destroy();
    throw criuInvalid(file, "the procs.criu.v1 header line is not a JSON object");
  }
  const rootDir = join(dest, "tar");
  await mkdir(rootDir, { recursive: true });
  const extract = (await tarStream()).extract();
  // The iterator must exist before bytes flow: tar-stream drops entries emitted before it.
  const entries = extract[Symbol.asyncIterator]();
  const feed = pipeline(
    Readable.from(
      (async function* () {
        if (rest.length) yield rest;
        for (;;) {
          const r = await it.next();
          if (r.done) return;
          yield r.value;
        }
      })(),
    ),
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
      const bad = name.startsWith("/")
        ? "absolute path"
        : name.includes("\0")
          ? "NUL in name"
          : name.includes("\\")
            ? "backslash in name"
            : name.split("/").some((s) => s === ".." || s === "" || s === ".")
              ? "'..', '.' or empty segment"
              : null;
      if (bad) throw criuInvalid(file, `unsafe tar entry ${JSON.stringify(h.name)} (${bad})`);
      name = posix.normalize(name);
      const parts = name.split("/");
      for (let i = 1; i < parts.length; i++) {
        if (linkNames.has(parts.slice(0, i).join("/"))) {
          throw criuInvalid(file, `tar entry ${JSON.stringify(h.name)} goes through a symlink`);
        }
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
      } else if (
        h.type === "symlink" &&
        parts[parts.length - 1] === "parent" &&
        h.linkname &&
        !isAbsolute(h.linkname)
      ) {
        links.push({ path: out, target: h.linkname });
        linkNames.add(name);
        entry.resume();
      } else {
        throw criuInvalid(
          file,
          `tar entry ${JSON.stringify(h.name)} is a ${h.type ?? "unknown"} entry; ` +
            "only regular files, directories and relative `parent` symlinks are allowed",
        );
      }
    }
    await feed;
  } catch (e) {
    extract.destroy();
    src.destroy();
    await feed.catch(() => undefined);
    if (e instanceof MemsnapError) throw e;
    const code = (e as NodeJS.ErrnoException).code;
    if (code === "EEXIST") throw criuInvalid(file, "the tar holds the same entry twice");
    if (code && code !== "ERR_STREAM_PREMATURE_CLOSE") throw sourceError(e, file);
    throw criuInvalid(file, `the tar after the header line is malformed (${(e as Error).message})`);
  }
  for (const l of links) {
    try {
      await symlink(l.target, l.path);
    } catch (e) {
      throw criuInvalid(file, `cannot place the parent link ${l.path}: ${(e as Error).message}`);
    }
  }
  // A tar of `images/` (one top-level directory) as well as one of `images/.` is accepted.
  let images = rootDir;
  const top = await readdir(rootDir);
  if (!top.includes("inventory.img") && top.length === 1 && (await lstat(join(rootDir, top[0]!))).isDirectory()) {
    images = join(rootDir, top[0]!);
  }
  return { header, images };
}
