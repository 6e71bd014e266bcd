/**
 * Synthetic CRIU dumps for tests: the generator lives in scripts/lib/gen-criu.mjs (plain JS,
 * shared with the benchmark); this adds typed helpers to damage a dump and to wrap one in a
 * ProcessFork `procs.criu.v1` blob (JSON header line + `\n` + tar of the images directory).
 */
import { readdirSync, readFileSync, writeFileSync, lstatSync, readlinkSync } from "node:fs";
import { join } from "node:path";
import tar from "tar-stream";
import {
  fBytes, fVarint, frame, genCriuDump, imageBytes, inventoryBytes, MAGIC, pagemapEntry, pagemapHead, PAGE_SIZE,
  PE_PARENT, PE_PRESENT, pstreeEntry, varint, type GenCriuOptions, type GenCriuResult,
} from "../../scripts/lib/gen-criu.mjs";

export {
  fBytes, fVarint, frame, genCriuDump, imageBytes, inventoryBytes, MAGIC, pagemapEntry, pagemapHead, PAGE_SIZE,
  PE_PARENT, PE_PRESENT, pstreeEntry, varint, type GenCriuOptions, type GenCriuResult,
};

/** Overwrite a little-endian u32 at `offset` of `file`. */
export function pokeU32(file: string, offset: number, value: number): void {
  const b = readFileSync(file);
  b.writeUInt32LE(value >>> 0, offset);
  writeFileSync(file, b);
}

/** Append bytes to a file. */
export function appendBytes(file: string, bytes: Buffer): void {
  writeFileSync(file, Buffer.concat([readFileSync(file), bytes]));
}

export interface TarItem {
  name: string;
  data?: Buffer;
  type?: "file" | "directory" | "symlink";
  linkname?: string;
}

/** A tar of the given entries (tar-stream). */
export async function tarOf(items: TarItem[]): Promise<Buffer> {
  const pack = tar.pack();
  const out: Buffer[] = [];
  const done = (async () => {
    for await (const c of pack) out.push(c as Buffer);
  })();
  for (const it of items) {
    await new Promise<void>((res, rej) => {
      const type = it.type ?? "file";
      const cb = (e?: Error | null): void => (e ? rej(e) : res());
      if (type === "file") pack.entry({ name: it.name, size: it.data!.length, mode: 0o644, mtime: new Date(1_700_000_000_000) }, it.data!, cb);
      else pack.entry({ name: it.name, type, linkname: it.linkname ?? "", mode: 0o755, mtime: new Date(1_700_000_000_000) }, cb);
    });
  }
  pack.finalize();
  await done;
  return Buffer.concat(out);
}

/** Tar items for every regular file (and a `parent` symlink) of an images directory. */
export function dirItems(dir: string, prefix = "./"): TarItem[] {
  const items: TarItem[] = [];
  for (const name of readdirSync(dir).sort()) {
    const p = join(dir, name);
    const st = lstatSync(p);
    if (st.isSymbolicLink()) items.push({ name: `${prefix}${name}`, type: "symlink", linkname: readlinkSync(p) });
    else if (st.isFile()) items.push({ name: `${prefix}${name}`, data: readFileSync(p) });
  }
  return items;
}

/** Write a procs.criu.v1 blob: one JSON header line, `\n`, then a tar. */
export async function writeBlob(file: string, header: unknown, items: TarItem[]): Promise<void> {
  writeFileSync(file, Buffer.concat([Buffer.from(`${JSON.stringify(header)}\n`), await tarOf(items)]));
}
