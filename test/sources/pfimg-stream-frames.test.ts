/**
 * zstd frames that do not declare their content size (streaming compressors write them, issue
 * #38 item 4): a small one is decompressed and hashed in the calling thread, as a frame that
 * declares its size is, not by a worker thread of its own; the bounds hold (output cap, window,
 * truncated and damaged frames, bombs), and a ProcessFork store of such blobs goes through
 * snapshot, deep verify and restore.
 */
import { createHook } from "node:async_hooks";
import { spawnSync } from "node:child_process";
import { createHash } from "node:crypto";
import { createRequire } from "node:module";
import { mkdtempSync, readdirSync, readFileSync, rmSync, statSync, utimesSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, relative } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { parseConfig, restoreToDir, snapshot, verifyBundle } from "../../src/index.js";
import { SYNC_MAX_CONTENT, hashFrameChunks } from "../../src/sources/pfimg/frames.js";
import { kvValues } from "../helpers/kv-dump.js";
import { generatePfimgStore } from "../helpers/pfimg-store.js";

const require = createRequire(import.meta.url);
const zstd = require("zstd-napi") as { compress(b: Buffer): Buffer; decompress(b: Buffer): Buffer };
type CCtx = { setParameter(p: number, v: number): void; compressStream2(dst: Uint8Array, src: Uint8Array, end: number): [number, number, number] };
const binding = require("zstd-napi/binding") as {
  CCtx: new () => CCtx;
  CParameter: { compressionLevel: number; checksumFlag: number; windowLog: number };
  EndDirective: { continue: number; end: number };
  compressBound(n: number): number;
  getFrameContentSize(b: Uint8Array): number | null;
};

const made: string[] = [];
afterAll(() => {
  for (const d of made.splice(0)) rmSync(d, { recursive: true, force: true });
});
const sha = (b: Buffer): string => createHash("sha256").update(b).digest("hex");

/** `bytes` as one zstd frame written by a streaming compressor: no content size in its header. */
function streamFrame(bytes: Buffer, opts: { windowLog?: number } = {}): Buffer {
  const c = new binding.CCtx();
  c.setParameter(binding.CParameter.compressionLevel, 3);
  c.setParameter(binding.CParameter.checksumFlag, 1);
  if (opts.windowLog) c.setParameter(binding.CParameter.windowLog, opts.windowLog);
  const out = Buffer.alloc(binding.compressBound(bytes.length) + 1024);
  // The first call does not end the frame, so zstd cannot know the size when it writes the header.
  const [, w, r] = c.compressStream2(out, bytes, binding.EndDirective.continue);
  let pos = w;
  let rest = bytes.subarray(r);
  for (;;) {
    const [left, w2, r2] = c.compressStream2(out.subarray(pos), rest, binding.EndDirective.end);
    pos += w2;
    rest = rest.subarray(r2);
    if (left === 0) break;
  }
  const f = out.subarray(0, pos);
  expect(binding.getFrameContentSize(f)).toBeNull();
  return Buffer.from(f);
}

/** Run `fn`, counting the worker threads started meanwhile. */
async function countWorkers<T>(fn: () => Promise<T>): Promise<{ value: T; workers: number }> {
  let workers = 0;
  const hook = createHook({ init: (_id, type) => { if (type === "WORKER") workers++; } });
  hook.enable();
  try {
    return { value: await fn(), workers };
  } finally {
    hook.disable();
  }
}

const one = async function* (b: Buffer): AsyncGenerator<Buffer> { yield b; };

describe("zstd frames without a content size", () => {
  it("142 streaming frames of KV pages decompress and hash in the calling thread: no worker thread", async () => {
    const pages = Array.from({ length: 142 }, (_, i) => kvValues(1, `stream/${i}`, 65536, "bf16"));
    const frames = pages.map((p) => streamFrame(p));
    const { value, workers } = await countWorkers(async () => {
      const out = [];
      for (const f of frames) out.push(await hashFrameChunks(one(f), { maxOutput: 65536 }));
      return out;
    });
    expect(workers).toBe(0);
    value.forEach((d, i) => expect(d).toEqual({ hex: sha(pages[i]!), size: 65536, zero: false }));
    // fed in pieces, as a file is read
    const f = frames[0]!;
    const pieces = async function* (): AsyncGenerator<Buffer> { for (let i = 0; i < f.length; i += 1000) yield f.subarray(i, i + 1000); };
    expect((await countWorkers(() => hashFrameChunks(pieces()))).workers).toBe(0);
    // concatenated frames are one stream, as the worker reads them
    const both = Buffer.concat([frames[0]!, frames[1]!]);
    const d = await hashFrameChunks(one(both));
    expect(d).toEqual({ hex: sha(Buffer.concat([pages[0]!, pages[1]!])), size: 131072, zero: false });
  });

  it("keeps the bounds: more than maxOutput, a truncated or damaged frame, a big window, a bomb past the in-thread cap", async () => {
    const page = kvValues(2, "bounds", 65536, "bf16");
    const f = streamFrame(page);
    await expect(hashFrameChunks(one(f), { maxOutput: 65535 })).rejects.toMatchObject({
      code: "MEMSNAP_PAYLOAD_CORRUPT", message: expect.stringMatching(/exceeds the declared size/),
    });
    await expect(hashFrameChunks(one(f.subarray(0, f.length - 5)))).rejects.toMatchObject({
      code: "MEMSNAP_PAYLOAD_CORRUPT", message: expect.stringMatching(/truncated/),
    });
    const bad = Buffer.from(f);
    bad[Math.floor(bad.length / 2)]! ^= 0xff;
    await expect(hashFrameChunks(one(bad))).rejects.toMatchObject({ code: "MEMSNAP_PAYLOAD_CORRUPT" });
    await expect(hashFrameChunks(one(Buffer.concat([f, Buffer.from("trailing")])))).rejects.toMatchObject({ code: "MEMSNAP_PAYLOAD_CORRUPT" });
    // a window over 8 MiB is not opened in the calling thread: the worker takes the frame
    const wide = streamFrame(page, { windowLog: 25 });
    const w = await countWorkers(() => hashFrameChunks(one(wide)));
    expect(w.value.hex).toBe(sha(page));
    expect(w.workers).toBe(1);
    // zeros past the in-thread cap: a few KiB of frame; within a bound it is handed to the worker, past it refused
    const zeros = Buffer.alloc(SYNC_MAX_CONTENT * 2);
    const bomb = streamFrame(zeros);
    expect(bomb.length).toBeLessThan(4096);
    const z = await countWorkers(() => hashFrameChunks(one(bomb), { maxOutput: zeros.length }));
    expect(z.value).toEqual({ hex: sha(zeros), size: zeros.length, zero: true });
    await expect(hashFrameChunks(one(bomb), { maxOutput: SYNC_MAX_CONTENT + 1 })).rejects.toMatchObject({
      message: expect.stringMatching(/exceeds the declared size/),
    });
  });

  it("a ProcessFork store whose blobs are streaming frames: snapshot, deep verify and restore byte for byte", async () => {
    const dir = mkdtempSync(join(tmpdir(), "memsnap-pf-stream-"));
    made.push(dir);
    const g = generatePfimgStore({ root: join(dir, "store"), pages: 4, forks: 2 });
    const viaCli = spawnSync("zstd", ["--version"]).status === 0;
    const blobs: string[] = [];
    const walk = (d: string): void => {
      for (const e of readdirSync(d, { withFileTypes: true })) {
        if (e.isDirectory()) walk(join(d, e.name));
        else if (e.name.endsWith(".zst")) blobs.push(join(d, e.name));
      }
    };
    walk(join(g.root, "blobs"));
    for (const b of blobs) {
      const st = statSync(b);
      const raw = zstd.decompress(readFileSync(b));
      // `zstd` reading a pipe, as a shell pipeline writes them, when it is installed
      const cli = viaCli ? spawnSync("zstd", ["-q", "-3", "-c"], { input: raw }) : null;
      const frame = cli?.status === 0 ? cli.stdout : streamFrame(raw);
      expect(binding.getFrameContentSize(frame)).toBeNull();
      writeFileSync(b, frame);
      utimesSync(b, st.atime, st.mtime);
    }
    const before = Object.fromEntries(blobs.map((b) => [relative(g.root, b), sha(readFileSync(b))]));
    const config = parseConfig({ agent: "a", sources: [{ kind: "pfimg", name: "pf", store: "store" }] }, null, dir);
    const r = await snapshot({ config, out: join(dir, "b.memsnap") });
    expect((r.manifest.layers[0]!.meta as { raw_bytes: number }).raw_bytes).toBeGreaterThan(0);
    const v = await verifyBundle(r.path, { deep: true });
    expect(v.ok, JSON.stringify(v.findings)).toBe(true);
    const out = join(dir, "out");
    await restoreToDir(r.path, out);
    for (const [rel, h] of Object.entries(before)) expect(sha(readFileSync(join(out, "pf", rel))), rel).toBe(h);
  });
});
