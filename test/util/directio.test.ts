/**
 * SequentialDirectWriter (src/util/directio.ts): a file written front to back with O_DIRECT
 * where the file system allows it is byte for byte the file written through the page cache,
 * whatever the chunk sizes; a refused O_DIRECT (forced with MEMSNAP_DIRECT_IO=misaligned) falls
 * back to the page cache for the rest. And a restore of a big file through it gives the bytes back.
 */
import { createHash, randomBytes } from "node:crypto";
import { closeSync, mkdirSync, openSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { parseConfig, restoreToDir, snapshot } from "../../src/index.js";
import { createRequire } from "node:module";
import { alignedBuffer, directIoAddon, mallocTrim, memoryAddon, SequentialDirectWriter } from "../../src/util/directio.js";
import { tempDir } from "../helpers/cli.js";
import { directOk } from "../helpers/direct.js";


async function writeWith(path: string, data: Buffer, buf: Buffer | Buffer[], step: (k: number) => number): Promise<number> {
  const fd = openSync(path, "wx", 0o600);
  const w = new SequentialDirectWriter(path, fd, buf);
  try {
    let off = 0;
    for (let k = 1; off < data.length; k++) {
      const n = Math.min(data.length - off, step(k));
      await w.write(data.subarray(off, off + n));
      off += n;
    }
    await w.end();
    return w.direct;
  } finally {
    await w.settle();
    closeSync(fd);
  }
}

async function withEnv<T>(value: string | undefined, f: () => Promise<T>): Promise<T> {
  const before = process.env.MEMSNAP_DIRECT_IO;
  if (value === undefined) delete process.env.MEMSNAP_DIRECT_IO;
  else process.env.MEMSNAP_DIRECT_IO = value;
  try {
    return await f();
  } finally {
    if (before === undefined) delete process.env.MEMSNAP_DIRECT_IO;
    else process.env.MEMSNAP_DIRECT_IO = before;
  }
}

describe.runIf(memoryAddon() !== null)("native/directio copy (memcpy into shared memory)", () => {
  type Copy = (dst: Uint8Array, dstOffset: number, src: Uint8Array, srcOffset: number, length: number) => void;
  const copy = (): Copy => (createRequire(import.meta.url)(memoryAddon()!) as { copy: Copy }).copy;

  it("copies the bytes asked for into a SharedArrayBuffer and from one, and nothing else", () => {
    const ring = Buffer.from(new SharedArrayBuffer(1 << 16));
    const src = randomBytes(40000);
    copy()(ring, 123, src, 7, 30000);
    expect(ring.subarray(123, 30123).equals(src.subarray(7, 30007))).toBe(true);
    expect(ring.subarray(0, 123).every((b) => b === 0) && ring.subarray(30123).every((b) => b === 0)).toBe(true);
    const back = Buffer.alloc(30000);
    copy()(back, 0, ring, 123, 30000);
    expect(back.equals(src.subarray(7, 30007))).toBe(true);
  });

  it("refuses a range past either end, and anything but Uint8Arrays", () => {
    const a = Buffer.alloc(16);
    const b = Buffer.alloc(16);
    expect(() => copy()(a, 12, b, 0, 5)).toThrow(/within both arrays/);
    expect(() => copy()(a, 0, b, 12, 5)).toThrow(/within both arrays/);
    expect(() => copy()(a, -1, b, 0, 1)).toThrow(/within both arrays/);
    expect(() => copy()(new Uint16Array(8) as unknown as Uint8Array, 0, b, 0, 1)).toThrow(/Uint8Arrays/);
    expect(a.every((x) => x === 0)).toBe(true);
  });
});

describe.runIf(memoryAddon() !== null)("native/directio writer (the bundle sink's background writes)", () => {
  interface Writer {
    writer(): object;
    writerStart(h: object, fd: number, bytes: Uint8Array, pos: number): void;
    writerWait(h: object): [number, number];
  }
  const addon = (): Writer => createRequire(import.meta.url)(memoryAddon()!) as Writer;

  it("writes each buffer at its offset on its own thread; the wait returns the count, and the caller may go on meanwhile", () => {
    const a = addon();
    const dir = tempDir();
    const path = join(dir, "out.bin");
    const fd = openSync(path, "w+", 0o600);
    try {
      const h = a.writer();
      const want = Buffer.alloc(3 * 65536 + 100);
      for (let k = 0; k < 4; k++) {
        const part = randomBytes(k === 3 ? 100 : 65536);
        part.copy(want, k * 65536);
        a.writerStart(h, fd, part, k * 65536);
        expect(() => a.writerStart(h, fd, part, 0), "one write at a time").toThrow(/already in flight/);
        expect(a.writerWait(h)).toEqual([part.length, 0]);
      }
      expect(a.writerWait(h), "nothing in flight: nothing to wait for").toEqual([0, 0]);
      expect(readFileSync(path).equals(want)).toBe(true);
    } finally {
      closeSync(fd);
    }
  });

  it("a failed write returns its errno and what was written (a read-only descriptor: EBADF); bad arguments throw", () => {
    const a = addon();
    const dir = tempDir();
    const path = join(dir, "ro.bin");
    writeFileSync(path, "x");
    const fd = openSync(path, "r");
    try {
      const h = a.writer();
      a.writerStart(h, fd, Buffer.alloc(10), 0);
      expect(a.writerWait(h)).toEqual([0, 9]); // EBADF
      expect(readFileSync(path, "utf8")).toBe("x");
      expect(() => a.writerStart({}, fd, Buffer.alloc(1), 0)).toThrow(/handle from writer/);
      expect(() => a.writerStart(h, -1, Buffer.alloc(1), 0)).toThrow(RangeError);
      expect(() => a.writerStart(h, fd, Buffer.alloc(1), -5)).toThrow(RangeError);
      expect(() => a.writerStart(h, fd, new Uint16Array(2) as unknown as Uint8Array, 0)).toThrow(/Uint8Arrays/);
    } finally {
      closeSync(fd);
    }
  });
});

describe.runIf(directIoAddon() !== null)("SequentialDirectWriter", () => {
  it("writes the same bytes, in any chunking, at any length; whole blocks with O_DIRECT", async () => {
    const dir = tempDir("memsnap-directio-");
    const expectDirect = directOk(dir);
    const buf = alignedBuffer(1 << 20)!;
    const buf2 = alignedBuffer(1 << 20)!;
    expect(buf).not.toBeNull();
    for (const bufs of [buf, [buf, buf2]]) {
      for (const [len, step] of [[0, () => 1], [100, () => 7], [4096, () => 4096], [(3 << 20) + 4095, (k: number) => (k * 7919) % 300_000 + 1], [5 << 20, () => 1 << 20], [(2 << 20) + 1, () => 3 << 20]] as const) {
        const data = randomBytes(len);
        const path = join(dir, `f-${len}-${Array.isArray(bufs) ? 2 : 1}`);
        const direct = await writeWith(path, data, bufs, step);
        expect(readFileSync(path).equals(data), `length ${len}, ${Array.isArray(bufs) ? 2 : 1} buffer(s)`).toBe(true);
        if (expectDirect) expect(direct).toBe(len - (len % 4096));
      }
    }
  });

  it("O_DIRECT refused (EINVAL on the first write): the page cache takes the same bytes", async () => {
    const dir = tempDir("memsnap-directio-");
    const [buf, buf2] = await withEnv("misaligned", async () => [alignedBuffer(1 << 20), alignedBuffer(1 << 20)]);
    expect(buf).not.toBeNull();
    for (const bufs of [buf!, [buf!, buf2!]]) {
      const data = randomBytes((2 << 20) + 333);
      const path = join(dir, `f-${Array.isArray(bufs) ? 2 : 1}`);
      const direct = await writeWith(path, data, bufs, (k) => (k * 104_729) % 700_000 + 1);
      expect(direct).toBe(0);
      expect(readFileSync(path).equals(data)).toBe(true);
    }
  });

  it("a failed write surfaces (here the tail's, at the end), and settle() then closes", async () => {
    const dir = tempDir("memsnap-directio-");
    const path = join(dir, "f");
    closeSync(openSync(path, "wx", 0o600));
    // the file's own descriptor read-only: the tail's write fails with EBADF
    const ro = openSync(path, "r");
    const w2 = new SequentialDirectWriter(path, ro, [alignedBuffer(1 << 20)!, alignedBuffer(1 << 20)!]);
    try {
      await w2.write(randomBytes(100));
      await expect(w2.end()).rejects.toMatchObject({ code: "EBADF" });
    } finally {
      await w2.settle();
      closeSync(ro);
    }
  });

  it("a restore writes big files with and without it to the same bytes", async () => {
    // With the small and mid-size files around it, entries span the payload reader's 1 MiB
    // batches every way a restore writes them (small files gathered for one write, batched
    // writev, O_DIRECT); the suite's poisoned slots (vitest.config.ts) catch a chunk kept unpinned.
    const dir = tempDir("memsnap-directio-");
    const src = join(dir, "src");
    mkdirSync(src);
    const big = randomBytes((9 << 20) + 12_345);
    writeFileSync(join(src, "big.bin"), big);
    writeFileSync(join(src, "small.txt"), "hello\n");
    const others = Array.from({ length: 12 }, (_, i) => randomBytes(i % 3 === 2 ? 1_500_000 + i : 200_000 + i * 1000));
    others.forEach((b, i) => writeFileSync(join(src, `o${i}.bin`), b));
    const config = parseConfig({ agent: "a", sources: [{ kind: "files", name: "f", path: "src" }] }, null, dir);
    const r = await snapshot({ config, out: join(dir, "b.memsnap"), redact: false });
    for (const [env, out] of [[undefined, "r1"], ["0", "r2"], ["misaligned", "r3"]] as const) {
      await withEnv(env, () => restoreToDir(r.path, join(dir, out)));
      const got = readFileSync(join(dir, out, "f", "big.bin"));
      expect(createHash("sha256").update(got).digest("hex"), `MEMSNAP_DIRECT_IO=${env}`).toBe(createHash("sha256").update(big).digest("hex"));
      expect(readFileSync(join(dir, out, "f", "small.txt"), "utf8")).toBe("hello\n");
      others.forEach((b, i) => expect(readFileSync(join(dir, out, "f", `o${i}.bin`)).equals(b), `o${i}.bin, MEMSNAP_DIRECT_IO=${env}`).toBe(true));
    }
  });
});

describe.skipIf(process.platform !== "linux" || memoryAddon() === null)("mallocTrim", () => {
  it("hands back what an exited worker thread left in malloc's arenas", async () => {
    const anonMiB = (): number => Number(/RssAnon:\s+(\d+)/.exec(readFileSync("/proc/self/status", "utf8"))![1]) / 1024;
    const { Worker } = await import("node:worker_threads");
    // 64 MiB of small buffers (malloc'd by node's allocator, not mmapped), freed when it exits.
    const src = `const k = []; for (let i = 0; i < 16384; i++) k.push(Buffer.alloc(4096, 1));
      require("node:worker_threads").parentPort.postMessage(k.length);`;
    await new Promise<void>((res, rej) => {
      const w = new Worker(src, { eval: true });
      w.on("error", rej);
      w.on("exit", () => res());
    });
    const before = anonMiB();
    expect(mallocTrim()).toBe(true);
    const after = anonMiB();
    expect(before - after).toBeGreaterThan(32);
  });
});
