/**
 * WriteBehind: positional writes on the thread pool. Real files: what lands where, closes
 * that wait for their writes, room when too much is in flight, and the first error kept.
 */
import { closeSync, fstatSync, openSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { WriteBehind, WriteFailed } from "../../src/util/write-behind.js";
import { tempDir } from "../helpers/cli.js";

const block = (i: number, n: number): Buffer => Buffer.alloc(n, i & 0xff);

describe("WriteBehind", () => {
  it("writes every buffer at its offset, out of order, and drain waits for all of them", async () => {
    const path = join(tempDir("memsnap-wb-"), "f");
    const fd = openSync(path, "w");
    const wb = new WriteBehind(1 << 20);
    const N = 200;
    const S = 65536;
    const order = Array.from({ length: N }, (_, i) => (i * 73) % N); // every block once, shuffled
    for (const i of order) {
      const w = wb.write(fd, block(i, S), i * S, "f");
      if (w) await w;
    }
    await wb.drain();
    closeSync(fd);
    const got = readFileSync(path);
    expect(got.length).toBe(N * S);
    for (let i = 0; i < N; i++) expect(got.subarray(i * S, (i + 1) * S).equals(block(i, S)), `block ${i}`).toBe(true);
  });

  it("asks the caller to wait once the bytes in flight reach the limit", async () => {
    const fd = openSync(join(tempDir("memsnap-wb-"), "f"), "w");
    const wb = new WriteBehind(256 * 1024);
    expect(wb.write(fd, block(1, 128 * 1024), 0, "f")).toBeUndefined();
    const w = wb.write(fd, block(2, 128 * 1024), 128 * 1024, "f");
    expect(w).toBeInstanceOf(Promise);
    await w;
    await wb.drain();
    closeSync(fd);
  });

  it("closes a descriptor only after the writes on it are done", async () => {
    const path = join(tempDir("memsnap-wb-"), "f");
    const fd = openSync(path, "w");
    const wb = new WriteBehind(64 << 20);
    for (let i = 0; i < 64; i++) wb.write(fd, block(i, 65536), i * 65536, "f");
    wb.close(fd, () => { throw new Error("closed at once under pending writes"); });
    expect(() => fstatSync(fd)).not.toThrow(); // still open: writes are in flight
    await wb.drain();
    expect(() => fstatSync(fd)).toThrow(/EBADF/);
    expect(readFileSync(path).length).toBe(64 * 65536);
    // With nothing in flight, close happens at once through the given function.
    const fd2 = openSync(path, "r");
    let called = 0;
    wb.close(fd2, (x) => { called++; closeSync(x); });
    expect(called).toBe(1);
  });

  it("keeps the first error with the label of its write, and refuses writes after it", async () => {
    const path = join(tempDir("memsnap-wb-"), "f");
    writeFileSync(path, "x");
    const fd = openSync(path, "r"); // writes fail with EBADF
    const wb = new WriteBehind(1 << 20);
    wb.write(fd, block(1, 4096), 0, "part-7");
    const e = await wb.drain().then(() => null, (x: unknown) => x);
    expect(e).toBeInstanceOf(WriteFailed);
    expect((e as WriteFailed).where).toBe("part-7");
    expect((e as WriteFailed).err.code).toBe("EBADF");
    expect(() => wb.write(fd, block(2, 16), 0, "part-8")).toThrow(WriteFailed);
    closeSync(fd);
  });

  it("interleaved runs on several descriptors, contiguous and not, all land where they belong", async () => {
    const dir = tempDir("memsnap-wb-");
    const paths = [join(dir, "a"), join(dir, "b"), join(dir, "c")];
    const fds = paths.map((p) => openSync(p, "w"));
    const wb = new WriteBehind(512 * 1024);
    const S = 4096 + 17; // odd sizes: batches end mid-page
    const N = 300;
    for (let i = 0; i < N; i++) {
      for (let f = 0; f < fds.length; f++) {
        // file c is written back to front (never contiguous), a and b front to back (batched)
        const at = f === 2 ? N - 1 - i : i;
        const w = wb.write(fds[f]!, block(at + f, S), at * S, `f${f}`);
        if (w) await w;
      }
    }
    await wb.drain();
    for (const fd of fds) closeSync(fd);
    for (let f = 0; f < paths.length; f++) {
      const got = readFileSync(paths[f]!);
      expect(got.length).toBe(N * S);
      for (let i = 0; i < N; i++) expect(got.subarray(i * S, (i + 1) * S).equals(block(i + f, S)), `file ${f} block ${i}`).toBe(true);
    }
  });

  it("after a failed write the writes queued behind it are dropped, and drain settles with the error", async () => {
    const path = join(tempDir("memsnap-wb-"), "f");
    writeFileSync(path, "x");
    const fd = openSync(path, "r");
    const wb = new WriteBehind(64 << 20);
    for (let i = 0; i < 50; i++) wb.write(fd, block(i, 65536), i * 65536, `part-${i}`);
    const e = await wb.drain().then(() => null, (x: unknown) => x);
    expect(e).toBeInstanceOf(WriteFailed);
    expect((e as WriteFailed).where).toBe("part-0");
    closeSync(fd);
  });
});

