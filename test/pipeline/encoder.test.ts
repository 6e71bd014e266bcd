/**
 * PayloadEncoder on its own: plain (no age) output into a file, read back with the zstd CLI
 * and with our decoder; the main thread's frames (work stealing) land in order.
 */
import { spawnSync } from "node:child_process";
import { createHash } from "node:crypto";
import { openSync, closeSync, readFileSync } from "node:fs";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { PayloadEncoder } from "../../src/pipeline/encoder.js";

const zstdCli = spawnSync("zstd", ["--version"]).status === 0;
const ci = process.env.CI === "true";
const dirs: string[] = [];
afterAll(async () => {
  for (const d of dirs) await rm(d, { recursive: true, force: true });
});

/** Text-like bytes that compress, but slowly at a high level: words from a seeded generator. */
function textBytes(n: number, seed: number): Buffer {
  const words = ["agent", "memory", "note", "tool", "result", "vector", "cursor", "trace", "plan", "step", "0x3f", "{\"k\":", "42"];
  const out = Buffer.allocUnsafe(n);
  let x = seed >>> 0 || 1;
  let i = 0;
  while (i < n) {
    x ^= x << 13;
    x ^= x >>> 17;
    x ^= x << 5;
    const w = words[(x >>> 0) % words.length]!;
    i += out.write(`${w}${(x >>> 8) % 7 === 0 ? "\n" : " "}`, i, "latin1");
  }
  return out;
}

describe.skipIf(!zstdCli && !ci)("PayloadEncoder", () => {
  it("the zstd CLI is installed (required when CI is set)", () => {
    expect(zstdCli).toBe(true);
  });

  it("frames compressed on the main thread while the worker is behind land in order", async () => {
    const dir = await mkdtemp(join(tmpdir(), "memsnap-enc-"));
    dirs.push(dir);
    const path = join(dir, "payload.zst");
    const fd = openSync(path, "w");
    // Level 19 makes the worker the slow side, so the writer outruns it and steals.
    const enc = new PayloadEncoder({ fd, start: 0, path, level: 19, age: null });
    const input = textBytes(24 * 1024 * 1024, 7);
    try {
      for (let off = 0; off < input.length; off += 256 * 1024) {
        const w = enc.write(input.subarray(off, off + 256 * 1024));
        if (w) await w;
        if (off === 8 * 1024 * 1024) enc.setLevel(3); // a level change mid-stream
      }
      const r = await enc.finish();
      const stored = readFileSync(path);
      expect(r.storedSize).toBe(stored.length);
      expect(r.sha256).toBe(createHash("sha256").update(stored).digest("hex"));
    } finally {
      await enc.destroy();
      closeSync(fd);
    }
    expect(enc.stolenFrames).toBeGreaterThan(0);
    const d = spawnSync("zstd", ["-d", "-q", "-c", path], { maxBuffer: 64 * 1024 * 1024 });
    expect(d.status).toBe(0);
    expect(d.stdout.length).toBe(input.length);
    expect(d.stdout.equals(input)).toBe(true);
  }, 120_000);
});
