/**
 * The KV source's block reader (src/sources/kv/blocks.ts): pages read ahead across data files,
 * and hashed on libuv's pool by native/aead `readHash` when it is built. Real files; the
 * native path and the JS path (MEMSNAP_NATIVE=0) must give the same blocks, and both must fail
 * cleanly (stable code, descriptors closed) on a file that shrank or went away.
 */
import { createHash, randomBytes } from "node:crypto";
import { readdirSync, readFileSync, rmSync, truncateSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { afterEach, describe, expect, it } from "vitest";
import { READ_BLOCK, readBlocks, type BlockFile, type ReadBlock } from "../../src/sources/kv/blocks.js";
import { aeadAddon } from "../../src/codecs/aead.js";
import { tempDir } from "../helpers/cli.js";

const addon = aeadAddon();
const ci = process.env.CI === "true";
const saved = process.env.MEMSNAP_NATIVE;
afterEach(() => {
  if (saved === undefined) delete process.env.MEMSNAP_NATIVE;
  else process.env.MEMSNAP_NATIVE = saved;
});

/** A data file of pages of the given lengths (every third one all zero), written to `dir`. */
function dataFile(dir: string, name: string, lens: number[]): BlockFile & { bytes: Buffer } {
  const pages = lens.map((n, i) => (i % 3 === 1 ? Buffer.alloc(n) : randomBytes(n)));
  const bytes = Buffer.concat(pages);
  const abs = join(dir, name);
  writeFileSync(abs, bytes);
  const offsets: number[] = [];
  let at = 0;
  for (const n of lens) {
    offsets.push(at);
    at += n;
  }
  return { abs, bytes, stats: { size: bytes.length }, tiles: { length: lens.length, offset: (i) => offsets[i]!, len: (i) => lens[i]! } };
}

/** Every tile of every block, as the consumer sees it: file, tile, its bytes' SHA-256 and zero flag. */
async function drain(files: BlockFile[]): Promise<{ blocks: ReadBlock[]; tiles: string[] }> {
  const blocks: ReadBlock[] = [];
  const tiles: string[] = [];
  for await (const b of readBlocks(files)) {
    blocks.push({ ...b, bytes: Buffer.from(b.bytes) });
    let off = 0;
    for (let i = b.first; i < b.end; i++) {
      const len = files[b.file]!.tiles.len(i);
      const page = b.bytes.subarray(off, off + len);
      off += len;
      const k = i - b.first;
      const zero = page.every((x) => x === 0);
      if (b.zero) {
        // the addon's answer must be the truth
        expect(b.zero[k]).toBe(zero ? 1 : 0);
        if (!zero) expect(b.digests!.subarray(32 * k, 32 * k + 32).toString("hex")).toBe(createHash("sha256").update(page).digest("hex"));
      }
      tiles.push(`${b.file}:${i}:${zero ? "zero" : createHash("sha256").update(page).digest("hex")}`);
    }
    expect(off).toBe(b.bytes.length);
  }
  return { blocks, tiles };
}

const openFds = (): number => readdirSync("/proc/self/fd").length;

describe("readBlocks", () => {
  it.runIf(ci)("hashes on the thread pool in CI (native/aead has readHash)", () => {
    expect(typeof addon?.readHash).toBe("function");
  });

  it("reads whole tiles in order across files, native and JS alike, and the bytes are the files'", async () => {
    const dir = tempDir();
    const page = 64 * 1024;
    const files = [
      dataFile(dir, "a.bin", Array.from({ length: 150 }, () => page)), // 9.4 MiB: several blocks, the last short
      dataFile(dir, "empty.bin", []),
      dataFile(dir, "b.bin", [READ_BLOCK + 4096, 100, 8192, 1]), // a tile bigger than a block is read alone
      dataFile(dir, "c.bin", Array.from({ length: 700 }, (_, i) => 1000 + (i % 7))), // odd sizes
    ];
    const fds = openFds();
    const native = await drain(files);
    expect(openFds()).toBe(fds);
    process.env.MEMSNAP_NATIVE = "0";
    const js = await drain(files);
    expect(js.blocks.every((b) => b.zero === null && b.digests === null)).toBe(true);
    expect(native.tiles).toEqual(js.tiles);
    expect(native.tiles).toHaveLength(150 + 4 + 700);
    for (const b of native.blocks) {
      const f = files[b.file]!;
      const start = f.tiles.offset(b.first);
      expect(b.bytes.equals(f.bytes.subarray(start, start + b.bytes.length))).toBe(true);
      expect(b.bytes.length <= READ_BLOCK || b.end - b.first === 1).toBe(true);
    }
    const per = READ_BLOCK / 65536;
    const want: number[][] = [];
    for (let i = 0; i < 150; i += per) want.push([i, Math.min(150, i + per)]);
    expect(want.length).toBeGreaterThan(2);
    expect(native.blocks.filter((b) => b.file === 0).map((b) => [b.first, b.end])).toEqual(want);
    expect(native.blocks.filter((b) => b.file === 2).map((b) => [b.first, b.end])).toEqual([[0, 1], [1, 4]]);
  });

  for (const mode of ["native", "js"]) {
    it(`a file shorter than its tiles, or gone: MEMSNAP_SOURCE_CHANGED, descriptors closed (${mode})`, async () => {
      if (mode === "js") process.env.MEMSNAP_NATIVE = "0";
      const dir = tempDir();
      const files = [
        dataFile(dir, "a.bin", Array.from({ length: 100 }, () => 65536)),
        dataFile(dir, "b.bin", Array.from({ length: 100 }, () => 65536)),
      ];
      truncateSync(files[1]!.abs, 50 * 65536 + 10);
      const fds = openFds();
      const err = await drain(files).catch((e: unknown) => e);
      expect(err).toMatchObject({ code: "MEMSNAP_SOURCE_CHANGED" });
      expect((err as Error).message).toContain(`ends at ${50 * 65536 + 10} bytes`);
      expect(openFds()).toBe(fds);

      rmSync(files[1]!.abs);
      await expect(drain(files)).rejects.toMatchObject({ code: "MEMSNAP_SOURCE_CHANGED", message: expect.stringContaining("removed") });
      expect(openFds()).toBe(fds);
    });
  }

  it.runIf(addon?.readHash !== undefined)("a file's last block read before an earlier one: the file stays open until the consumer takes it", async () => {
    // The thread pool may finish reads out of order. Here the first block's read starts only
    // 50 ms after the second (the file's last) has finished; a reader that closed the file when
    // its last read finished had closed it under the first (EBADF, seen now and then in snapshots).
    const dir = tempDir();
    const files = [dataFile(dir, "a.bin", Array.from({ length: 64 }, () => 65536)), dataFile(dir, "b.bin", [4096, 4096])];
    const real = addon!.readHash!.bind(addon);
    let calls = 0;
    let first: (() => void) | null = null;
    const readHash: Parameters<typeof readBlocks>[2]["readHash"] = (fd, pos, buf, lens, count, digests, zero, cb) => {
      const k = calls++;
      if (k === 0) {
        first = () => real(fd, pos, buf, lens, count, digests, zero, cb);
        return;
      }
      real(fd, pos, buf, lens, count, digests, zero, (errno, got) => {
        cb(errno, got);
        if (k === 1) setTimeout(() => first!(), 50);
      });
    };
    const fds = openFds();
    const seen: string[] = [];
    for await (const b of readBlocks(files, undefined, { readHash })) {
      const f = files[b.file]!;
      const start = f.tiles.offset(b.first);
      expect(b.bytes.equals(f.bytes.subarray(start, start + b.bytes.length))).toBe(true);
      seen.push(`${b.file}:${b.first}-${b.end}`);
    }
    expect(seen).toEqual(["0:0-32", "0:32-64", "1:0-2"]);
    expect(calls).toBe(3);
    expect(openFds()).toBe(fds);
  });

  it("a consumer that stops early: the reads in flight finish, then the files close", async () => {
    const dir = tempDir();
    const files = [dataFile(dir, "a.bin", Array.from({ length: 400 }, () => 65536))];
    const fds = openFds();
    let n = 0;
    for await (const b of readBlocks(files)) {
      expect(b.first).toBe(0);
      if (++n === 1) break;
    }
    expect(openFds()).toBe(fds);
    // the file was not touched
    expect(readFileSync(files[0]!.abs).equals(files[0]!.bytes)).toBe(true);
  });

  it.runIf(addon !== null)("readHash refuses bad arguments before touching anything", () => {
    const a = addon!;
    const cb = (): void => undefined;
    const buf = Buffer.alloc(100);
    const lens = new Uint32Array([60, 60]);
    expect(() => a.readHash!(0, 0, buf, lens, 2, Buffer.alloc(64), new Uint8Array(2), cb)).toThrow(/smaller than the tiles/);
    expect(() => a.readHash!(0, 0, buf, lens, 3, Buffer.alloc(96), new Uint8Array(3), cb)).toThrow(/more tiles/);
    expect(() => a.readHash!(0, 0, buf, lens, 2, Buffer.alloc(32), new Uint8Array(2), cb)).toThrow(/more tiles/);
    expect(() => a.readHash!(-1, 0, buf, lens, 1, Buffer.alloc(32), new Uint8Array(1), cb)).toThrow(/file descriptor/);
    expect(() => a.readHash!(0, -5, buf, lens, 1, Buffer.alloc(32), new Uint8Array(1), cb)).toThrow(/position/);
    expect(() => a.readHash!(0, 0, buf, new Uint8Array(2) as unknown as Uint32Array, 1, Buffer.alloc(32), new Uint8Array(1), cb)).toThrow(/Uint32Array/);
  });

  it.runIf(addon !== null)("readHash reports a read error's errno (a directory's descriptor: EISDIR)", async () => {
    const { openSync, closeSync } = await import("node:fs");
    const fd = openSync(tempDir(), "r");
    try {
      const [errno, got] = await new Promise<[number, number]>((res) => addon!.readHash!(fd, 0, Buffer.alloc(10), new Uint32Array([10]), 1, Buffer.alloc(32), new Uint8Array(1), (e, g) => res([e, g])));
      expect(errno).toBe(21); // EISDIR on Linux
      expect(got).toBe(0);
    } finally {
      closeSync(fd);
    }
  });
});
