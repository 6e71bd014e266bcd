import { describe, expect, it } from "vitest";
import { spawn, spawnSync } from "node:child_process";
import { once } from "node:events";
import { readFileSync } from "node:fs";
import { mkdtemp, mkdir, readFile, rm, writeFile } from "node:fs/promises";
import { createRequire } from "node:module";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { Readable, Transform, Writable, type Duplex } from "node:stream";
import { pipeline } from "node:stream/promises";
import { fileURLToPath } from "node:url";
import {
  ZSTD_MAGIC,
  createZstdCompressor,
  createZstdDecompressor,
  type ZstdDuplex,
} from "../../src/codecs/zstd.js";
import { MemsnapError } from "../../src/errors.js";

const require = createRequire(import.meta.url);
const binding = require("zstd-napi/binding") as {
  findFrameCompressedSize(b: Uint8Array): number;
};

const MiB = 1024 * 1024;

// ---------------------------------------------------------------- data helpers

/** Deterministic pseudo-random bytes (xorshift32). */
function randomBytes(n: number, seed: number): Buffer {
  const out = Buffer.allocUnsafe(n);
  let x = seed >>> 0 || 1;
  let i = 0;
  for (; i + 4 <= n; i += 4) {
    x ^= x << 13;
    x ^= x >>> 17;
    x ^= x << 5;
    out.writeUInt32LE(x >>> 0, i);
  }
  for (; i < n; i++) {
    x ^= x << 13;
    x ^= x >>> 17;
    x ^= x << 5;
    out[i] = x & 0xff;
  }
  return out;
}

/** Alternating 64 KiB blocks of compressible text and random bytes. */
function mixedData(n: number, seed = 1): Buffer {
  const out = Buffer.allocUnsafe(n);
  const rnd = randomBytes(n, seed);
  const text = Buffer.from(
    Array.from({ length: 2000 }, (_, i) => `{"entry":${i},"memory":"the agent remembered fact ${i % 37}"}\n`).join(""),
  );
  for (let pos = 0, block = 0; pos < n; pos += 65536, block++) {
    const end = Math.min(n, pos + 65536);
    if (block % 2 === 0) {
      for (let p = pos; p < end; p += text.length) text.copy(out, p, 0, Math.min(text.length, end - p));
    } else {
      rnd.copy(out, pos, pos, end);
    }
  }
  return out;
}

/** Pseudo-text: JSON lines of random words and numbers (about 3x compressible, slow at level 19). */
function textData(n: number, seed: number): Buffer {
  const rnd = randomBytes(n, seed);
  const words = Array.from({ length: 1500 }, (_, i) => rnd.subarray(i * 8, i * 8 + 3 + (rnd[i]! % 6)).toString("base64url"));
  const lines: string[] = [];
  let len = 0;
  for (let i = 0; len < n; i++) {
    const w = Array.from({ length: 4 + (rnd[i % n]! % 12) }, (_, k) => words[rnd.readUInt16LE((i * 7 + k * 2) % (n - 2)) % words.length]);
    const line = `{"id":${rnd.readUInt32LE((i * 4) % (n - 4))},"text":"${w.join(" ")}"}\n`;
    lines.push(line);
    len += line.length;
  }
  return Buffer.from(lines.join("")).subarray(0, n);
}

type Feed = "whole" | "pieces" | "slow";

/** A source that yields `data` in one piece or in small pieces of varying size. */
function source(data: Buffer, feed: Feed): Readable {
  if (feed === "whole") return Readable.from([data], { objectMode: false });
  let seed = 12345;
  return Readable.from(
    (function* () {
      let pos = 0;
      while (pos < data.length) {
        seed = (seed * 1103515245 + 12345) & 0x7fffffff;
        const len = 1 + (seed % 20000);
        yield data.subarray(pos, pos + len);
        pos += len;
      }
    })(),
    { objectMode: false },
  );
}

/** A sink collecting everything; `slow` makes it wait a macrotask per chunk with a tiny buffer. */
function sink(slow = false): { w: Writable; result: () => Buffer } {
  const chunks: Buffer[] = [];
  const w = new Writable({
    highWaterMark: slow ? 1024 : 16384,
    write(chunk: Buffer, _e, cb) {
      chunks.push(chunk);
      if (slow) setTimeout(cb, 1);
      else cb();
    },
  });
  return { w, result: () => Buffer.concat(chunks) };
}

async function through(stream: Duplex, data: Buffer, feed: Feed = "whole"): Promise<Buffer> {
  const s = sink(feed === "slow");
  await pipeline(source(data, feed), stream, s.w);
  return s.result();
}

async function expectCorrupt(p: Promise<unknown>, message?: RegExp): Promise<MemsnapError> {
  const err: unknown = await p.then(
    () => {
      throw new Error("expected the pipeline to reject");
    },
    (e: unknown) => e,
  );
  expect(err).toBeInstanceOf(MemsnapError);
  const me = err as MemsnapError;
  expect(me.code).toBe("MEMSNAP_PAYLOAD_CORRUPT");
  if (message) expect(me.message).toMatch(message);
  return me;
}

async function closed(s: ZstdDuplex): Promise<void> {
  if (!s.closed) await once(s, "close");
  // terminate() is asynchronous and takes effect when the current native zstd call returns
  // (up to one 4 MiB multi-threaded job at level 19); the thread id turns -1 on exit.
  for (let i = 0; i < 3000 && s.workerThreadId !== -1; i++) await new Promise((r) => setTimeout(r, 10));
}

/** OS threads of this process (Linux), or undefined elsewhere. */
function osThreads(): number | undefined {
  try {
    const m = /^Threads:\s+(\d+)/m.exec(readFileSync("/proc/self/status", "utf8"));
    return m ? Number(m[1]) : undefined;
  } catch {
    return undefined;
  }
}

// ---------------------------------------------------------------- round trips

describe("round trip", () => {
  const sizes: Array<[string, number]> = [
    ["0 B", 0],
    ["1 B", 1],
    ["1 MiB", MiB],
    ["20 MiB", 20 * MiB + 12345],
  ];
  const inputs = new Map(sizes.map(([, n]) => [n, mixedData(n, n + 7)]));

  for (const threads of [0, 2]) {
    for (const level of [1, 3]) {
      for (const [name, n] of sizes) {
        for (const feed of ["whole", "pieces", "slow"] as const) {
          it(`level ${level}, threads ${threads}, ${name}, ${feed}`, async () => {
            const input = inputs.get(n)!;
            const z = await through(createZstdCompressor({ level, threads }), input, feed);
            expect(z.subarray(0, 4).equals(ZSTD_MAGIC)).toBe(true);
            // exactly one zstd frame
            expect(binding.findFrameCompressedSize(z)).toBe(z.length);
            if (n >= MiB) expect(z.length).toBeLessThan(n * 0.75);
            const back = await through(createZstdDecompressor({ maxOutputBytes: n }), z, feed);
            expect(back.length).toBe(n);
            expect(back.equals(input)).toBe(true);
          });
        }
      }
    }
  }

  for (const threads of [0, 2]) {
    for (const n of [0, 1, 300_000]) {
      it(`level 19, threads ${threads}, ${n} B`, async () => {
        const input = mixedData(n, 99);
        const z = await through(createZstdCompressor({ level: 19, threads }), input, "pieces");
        expect(binding.findFrameCompressedSize(z)).toBe(z.length);
        const z3 = await through(createZstdCompressor({ level: 1 }), input);
        if (n > 0) expect(z.length).toBeLessThanOrEqual(z3.length);
        expect((await through(createZstdDecompressor(), z, "slow")).equals(input)).toBe(true);
      });
    }
  }

  it("sets the frame checksum flag by default and clears it with checksum: false", async () => {
    const input = mixedData(100_000);
    const withSum = await through(createZstdCompressor(), input);
    const without = await through(createZstdCompressor({ checksum: false }), input);
    // Frame_Header_Descriptor is byte 4; bit 2 is Content_Checksum_flag.
    expect(withSum[4]! & 0x04).toBe(0x04);
    expect(without[4]! & 0x04).toBe(0);
    expect(withSum.length).toBe(without.length + 4);
    expect((await through(createZstdDecompressor(), without)).equals(input)).toBe(true);
  });

  it("accepts strings and Uint8Array chunks", async () => {
    const c = createZstdCompressor();
    const s = sink();
    const done = pipeline(c, s.w);
    c.write("hello ");
    c.write(new Uint8Array([119, 111, 114, 108, 100]));
    c.end();
    await done;
    expect((await through(createZstdDecompressor(), s.result())).toString()).toBe("hello world");
  });

  it("rejects invalid options synchronously", () => {
    expect(() => createZstdCompressor({ level: 23 })).toThrow(MemsnapError);
    expect(() => createZstdCompressor({ level: 2.5 })).toThrow(MemsnapError);
    expect(() => createZstdCompressor({ threads: -1 })).toThrow(MemsnapError);
    expect(() => createZstdDecompressor({ maxOutputBytes: -1 })).toThrow(MemsnapError);
  });
});

// ---------------------------------------------------------------- backpressure

/** Poll until `f()` stops changing for `quietMs`; returns its last value. */
async function settle(f: () => number, quietMs = 300): Promise<number> {
  let last = f();
  let since = Date.now();
  for (;;) {
    await new Promise((r) => setTimeout(r, 20));
    const v = f();
    if (v !== last) {
      last = v;
      since = Date.now();
    } else if (Date.now() - since >= quietMs) return v;
  }
}

describe("backpressure", () => {
  it("the compressor stops taking input while nobody reads its output", async () => {
    const input = randomBytes(96 * MiB, 5); // incompressible: output ≈ input
    const c = createZstdCompressor({ level: 1 });
    let accepted = 0;
    let offset = 0;
    let ended = false;
    const pump = (): void => {
      while (offset < input.length) {
        const chunk = input.subarray(offset, offset + 65536);
        offset += chunk.length;
        const more = c.write(chunk, () => {
          accepted += chunk.length;
        });
        if (!more) {
          c.once("drain", pump);
          return;
        }
      }
      if (!ended) {
        ended = true;
        c.end();
      }
    };
    pump();
    const stalledAt = await settle(() => accepted);
    // Bounded by the in-flight input (4 MiB), the output credit (4 MiB) and the stream
    // buffers; far below 96 MiB.
    expect(stalledAt).toBeGreaterThan(0);
    expect(stalledAt).toBeLessThan(16 * MiB);
    expect(c.readableLength).toBeLessThan(6 * MiB);
    // Now drain it and check the result is intact.
    const s = sink();
    await pipeline(c, s.w);
    expect(accepted).toBe(input.length);
    expect((await through(createZstdDecompressor(), s.result())).equals(input)).toBe(true);
  });

  it("the decompressor stops producing while nobody reads (a small input expanding to 256 MiB)", async () => {
    const zeros = Buffer.alloc(256 * MiB);
    const z = await through(createZstdCompressor({ level: 3 }), zeros);
    expect(z.length).toBeLessThan(64 * 1024);
    const d = createZstdDecompressor();
    d.end(z);
    // The worker may take a while to start on a loaded machine: wait for its first output, then for it to stop.
    for (const t0 = Date.now(); d.readableLength === 0 && Date.now() - t0 < 30_000; ) {
      await new Promise((r) => setTimeout(r, 20));
    }
    const buffered = await settle(() => d.readableLength);
    expect(buffered).toBeGreaterThan(0);
    expect(buffered).toBeLessThan(6 * MiB); // the output credit, not 256 MiB
    let total = 0;
    let nonZero = false;
    await pipeline(
      d,
      new Writable({
        write(chunk: Buffer, _e, cb) {
          total += chunk.length;
          if (chunk.some((b) => b !== 0)) nonZero = true;
          cb();
        },
      }),
    );
    expect(total).toBe(zeros.length);
    expect(nonZero).toBe(false);
  });
});

// ---------------------------------------------------------------- zstd CLI interop

const zstdCli = spawnSync("zstd", ["--version"]).status === 0;
const ci = process.env.CI !== undefined && process.env.CI !== "" && process.env.CI !== "false";

function cli(args: string[], input: Buffer): Buffer {
  const r = spawnSync("zstd", args, { input, maxBuffer: 512 * MiB });
  if (r.status !== 0) throw new Error(`zstd ${args.join(" ")} failed: ${r.stderr.toString()}`);
  return r.stdout;
}

describe.skipIf(!zstdCli && !ci)("interop with the zstd CLI", () => {
  it("the zstd CLI is installed (required when CI is set)", () => {
    expect(zstdCli).toBe(true);
  });

  for (const threads of [0, 2]) {
    it(`our output (threads ${threads}) | zstd -d equals the input`, async () => {
      const input = mixedData(20 * MiB + 3, 17);
      const z = await through(createZstdCompressor({ threads }), input, "pieces");
      expect(cli(["-d", "-c", "-q"], z).equals(input)).toBe(true);
      cli(["-t", "-q"], z); // integrity test incl. checksum
    });
  }

  it("zstd -3 output decompresses with ours, also two frames concatenated", async () => {
    const a = mixedData(3 * MiB + 1, 21);
    const b = mixedData(MiB + 5, 22);
    const za = cli(["-3", "-c", "-q"], a);
    const zb = cli(["-19", "--no-check", "-c", "-q"], b);
    expect((await through(createZstdDecompressor(), za, "pieces")).equals(a)).toBe(true);
    const both = Buffer.concat([za, zb]); // what `cat a.zst b.zst` produces
    const out = await through(createZstdDecompressor({ maxOutputBytes: a.length + b.length }), both, "slow");
    expect(out.equals(Buffer.concat([a, b]))).toBe(true);
  });

  it("zstd -T2 on stdin (no content size) and an empty-input frame decompress with ours", async () => {
    const a = mixedData(8 * MiB, 23);
    const za = cli(["-3", "-T2", "-c", "-q"], a);
    expect((await through(createZstdDecompressor(), za)).equals(a)).toBe(true);
    const empty = cli(["-3", "-c", "-q"], Buffer.alloc(0));
    expect((await through(createZstdDecompressor(), empty)).length).toBe(0);
  });
});

// ---------------------------------------------------------------- corrupt input

describe("corrupt input", () => {
  const input = mixedData(MiB + 77, 31);
  let framePromise: Promise<Buffer> | undefined;
  const frame = (): Promise<Buffer> => (framePromise ??= through(createZstdCompressor(), input));

  it("flipped bytes anywhere in the frame are MEMSNAP_PAYLOAD_CORRUPT", async () => {
    const z = await frame();
    const offsets = [0, 3, 4, 5, 9, 200, z.length >> 2, z.length >> 1, z.length - 5, z.length - 1];
    for (const off of offsets) {
      const bad = Buffer.from(z);
      bad[off] = bad[off]! ^ 0x5a;
      await expectCorrupt(through(createZstdDecompressor(), bad));
    }
  });

  it("random bytes are MEMSNAP_PAYLOAD_CORRUPT, with or without a zstd magic", async () => {
    const rnd = randomBytes(MiB, 77);
    await expectCorrupt(through(createZstdDecompressor(), rnd));
    await expectCorrupt(through(createZstdDecompressor(), Buffer.concat([ZSTD_MAGIC, rnd])));
  });

  it("trailing garbage after a valid frame is MEMSNAP_PAYLOAD_CORRUPT", async () => {
    const z = await frame();
    await expectCorrupt(through(createZstdDecompressor(), Buffer.concat([z, Buffer.from("garbage!")])));
  });

  it("input truncated at any of several offsets is MEMSNAP_PAYLOAD_CORRUPT saying truncated", async () => {
    const z = await frame();
    for (const len of [0, 1, 3, 4, 6, 100, z.length >> 1, z.length - 4, z.length - 1]) {
      await expectCorrupt(through(createZstdDecompressor(), z.subarray(0, len), "pieces"), /truncated/);
    }
    // a complete frame followed by the start of a second one
    await expectCorrupt(
      through(createZstdDecompressor(), Buffer.concat([z, z.subarray(0, 10)])),
      /truncated/,
    );
  });

  it("output beyond maxOutputBytes is MEMSNAP_PAYLOAD_CORRUPT; exactly the limit is fine", async () => {
    const z = await frame();
    await expectCorrupt(
      through(createZstdDecompressor({ maxOutputBytes: input.length - 1 }), z),
      /decompressed size exceeds the declared size/,
    );
    expect((await through(createZstdDecompressor({ maxOutputBytes: input.length }), z)).equals(input)).toBe(true);
    await expectCorrupt(
      through(createZstdDecompressor({ maxOutputBytes: 0 }), z),
      /decompressed size exceeds the declared size/,
    );
  });

  it("a zstd bomb stops at maxOutputBytes without producing more", async () => {
    const bomb = await through(createZstdCompressor({ level: 3 }), Buffer.alloc(512 * MiB));
    expect(bomb.length).toBeLessThan(64 * 1024);
    let produced = 0;
    const d = createZstdDecompressor({ maxOutputBytes: 3 * MiB + 1 });
    await expectCorrupt(
      pipeline(
        Readable.from([bomb], { objectMode: false }),
        d,
        new Writable({
          write(chunk: Buffer, _e, cb) {
            produced += chunk.length;
            cb();
          },
        }),
      ),
      /exceeds the declared size/,
    );
    expect(produced).toBeLessThanOrEqual(3 * MiB + 1);
    await closed(d);
    expect(d.workerThreadId).toBe(-1);
  });
});

// ---------------------------------------------------------------- errors, destroy, worker lifetime

describe("errors and worker lifetime", () => {
  it("a failing consumer rejects the pipeline with its error and stops the worker", async () => {
    const c = createZstdCompressor();
    const boom = new Error("sink failed");
    const p = pipeline(
      source(mixedData(8 * MiB), "pieces"),
      c,
      new Writable({
        write(_c, _e, cb) {
          cb(boom);
        },
      }),
    );
    await expect(p).rejects.toBe(boom);
    await closed(c);
    expect(c.workerThreadId).toBe(-1);
  });

  it("aborting mid-stream settles the pipeline and the worker exits", async () => {
    const c = createZstdCompressor({ level: 19, threads: 2 });
    expect(c.workerThreadId).toBeGreaterThan(0);
    const ac = new AbortController();
    let fed = 0;
    const input = randomBytes(64 * MiB, 10);
    const counter = new Transform({
      transform(chunk: Buffer, _e, cb) {
        fed += chunk.length;
        if (fed > 2 * MiB && !ac.signal.aborted) setTimeout(() => ac.abort(), 50);
        cb(null, chunk);
      },
    });
    const q = pipeline(source(input, "pieces"), counter, c, sink().w, { signal: ac.signal });
    await expect(q).rejects.toMatchObject({ name: "AbortError" });
    expect(fed).toBeLessThan(input.length);
    await closed(c);
    expect(c.destroyed).toBe(true);
    expect(c.workerThreadId).toBe(-1);
  });

  it.skipIf(osThreads() === undefined)("destroy() mid-stream ends the worker's OS threads and zstd's", async () => {
    await readFile(fileURLToPath(import.meta.url)); // start libuv's pool before the baseline
    const before = osThreads()!;
    const c = createZstdCompressor({ level: 3, threads: 2 });
    c.on("error", () => undefined);
    const firstOutput = once(c, "data");
    c.write(randomBytes(16 * MiB, 3));
    await firstOutput;
    expect(osThreads()!).toBeGreaterThanOrEqual(before + 3); // the worker + 2 zstd threads
    c.destroy();
    await closed(c);
    expect(c.workerThreadId).toBe(-1);
    expect(osThreads()!).toBeLessThanOrEqual(before);
  });

  it("destroy() before any data terminates the worker", async () => {
    const d = createZstdDecompressor();
    d.destroy();
    await closed(d);
    expect(d.workerThreadId).toBe(-1);
  });

  it("the worker is gone after a normal finish", async () => {
    const c = createZstdCompressor();
    await through(c, mixedData(MiB));
    await closed(c);
    expect(c.workerThreadId).toBe(-1);
  });

  it("a process with a destroyed, abandoned, stalled or finished stream exits on its own", async () => {
    // Run the module in a fresh Node process (transpiled here, with its worker, into a dist/ of
    // its own: see src/util/worker-path.ts), so "the process exits" is real.
    const tsModule = await import("typescript");
    const ts = (tsModule as { default?: typeof tsModule }).default ?? tsModule;
    const root = join(dirname(fileURLToPath(import.meta.url)), "..", "..");
    const dir = await mkdtemp(join(tmpdir(), "memsnap-zstd-"));
    try {
      await mkdir(join(dir, "dist", "codecs"), { recursive: true });
      await mkdir(join(dir, "dist", "util"), { recursive: true });
      for (const f of ["errors.ts", "util/worker-path.ts", "codecs/zstd-binding.ts", "codecs/zstd.ts", "codecs/zstd.worker.ts"]) {
        const src = await readFile(join(root, "src", f), "utf8");
        const js = ts.transpileModule(src, {
          compilerOptions: { module: ts.ModuleKind.ESNext, target: ts.ScriptTarget.ES2022 },
        }).outputText;
        await writeFile(join(dir, "dist", f.replace(/\.ts$/, ".js")), js);
      }
      await writeFile(join(dir, "package.json"), '{"type":"module"}');
      await writeFile(
        join(dir, "child.js"),
        `
import { createZstdCompressor, createZstdDecompressor } from "./dist/codecs/zstd.js";
import { pipeline } from "node:stream/promises";
import { Readable, Writable } from "node:stream";
const big = Buffer.alloc(8 << 20, 7);
const mode = process.argv[2];
if (mode === "destroy") {
  const c = createZstdCompressor({ level: 19, threads: 2 });
  c.on("error", () => {});
  c.write(big);
  setTimeout(() => { c.destroy(); console.log("destroyed"); }, 300);
} else if (mode === "abandon") {
  const c = createZstdCompressor();
  c.write(big, () => console.log("written"));
} else if (mode === "stall") {
  const z = [];
  const c = createZstdCompressor();
  await pipeline(Readable.from([Buffer.alloc(64 << 20)]), c, new Writable({ write(ch, _e, cb) { z.push(ch); cb(); } }));
  const d = createZstdDecompressor();
  d.end(Buffer.concat(z));
  // wait (polling keeps the process alive) until the worker is stalled on output credit
  const iv = setInterval(() => { if (d.readableLength >= 4 << 20) { clearInterval(iv); console.log("stalled"); } }, 10);
} else {
  let n = 0;
  await pipeline(Readable.from([big]), createZstdCompressor({ threads: 2 }), createZstdDecompressor(),
    new Writable({ write(ch, _e, cb) { n += ch.length; cb(); } }));
  console.log("finished", n);
}
`,
      );
      const run = (mode: string): Promise<{ code: number | null; signal: string | null; out: string }> =>
        new Promise((resolve) => {
          const child = spawn(process.execPath, [join(dir, "child.js"), mode], {
            env: { ...process.env, NODE_PATH: join(root, "node_modules") },
            stdio: ["ignore", "pipe", "inherit"],
            timeout: 30_000, // safety net only: a hanging child is killed and the test fails
          });
          let out = "";
          child.stdout.on("data", (d: Buffer) => (out += d.toString()));
          child.on("close", (code, signal) => resolve({ code, signal, out }));
        });
      const results = await Promise.all(["destroy", "abandon", "stall", "finish"].map(run));
      expect(results).toEqual([
        { code: 0, signal: null, out: "destroyed\n" },
        { code: 0, signal: null, out: "written\n" },
        { code: 0, signal: null, out: "stalled\n" },
        { code: 0, signal: null, out: `finished ${8 << 20}\n` },
      ]);
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });
});

// ---------------------------------------------------------------- the reason this module exists

describe("main thread stays responsive", () => {
  it("timers keep firing while level 19 compresses a few MiB", async () => {
    const input = textData(4 * MiB, 41);
    const ticks: number[] = [];
    const start = performance.now();
    const timer = setInterval(() => ticks.push(performance.now()), 10);
    let z: Buffer;
    try {
      z = await through(createZstdCompressor({ level: 19 }), input);
    } finally {
      clearInterval(timer);
    }
    const end = performance.now();
    const elapsed = end - start;
    const stamps = [start, ...ticks, end];
    let maxGap = 0;
    for (let i = 1; i < stamps.length; i++) maxGap = Math.max(maxGap, stamps[i]! - stamps[i - 1]!);
    // Compressing on the main thread would make one gap as long as the whole compression.
    // Relative, not absolute: no gap may take more than a third of the run.
    expect(ticks.length).toBeGreaterThanOrEqual(3);
    expect(maxGap).toBeLessThan(elapsed / 3);
    expect((await through(createZstdDecompressor(), z)).equals(input)).toBe(true);
  });
});
