/**
 * PayloadEncoder on its own: plain (no age) output into a file, read back with the zstd CLI
 * and with our decoder; the main thread's frames (work stealing) land in order; O_DIRECT
 * writes (native/directio) give the same file as the page cache, whatever the payload's start.
 */
import { spawnSync } from "node:child_process";
import { createHash } from "node:crypto";
import { openSync, closeSync, readdirSync, readFileSync, readlinkSync, writeFileSync, writeSync } from "node:fs";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { generateIdentity } from "../../src/codecs/age/keys.js";
import { prepareAgeEncryption } from "../../src/codecs/age/stream-seal.js";
import { PayloadEncoder } from "../../src/snapshot/encoder.js";
import { PLANE_LEVEL } from "../../src/codecs/zstd-profile.js";
import { directIoAddon } from "../../src/util/directio.js";
import { directOk } from "../helpers/direct.js";
import { seededText } from "../helpers/seeded-blob.js";

const zstdCli = spawnSync("zstd", ["--version"]).status === 0;
const ci = process.env.CI === "true";
const dirs: string[] = [];
afterAll(async () => {
  for (const d of dirs) await rm(d, { recursive: true, force: true });
});

/**
 * Every zstd frame in `buf`: its Content_Checksum_flag and its Frame_Content_Size (null when the
 * header has none). RFC 8878 §3.1.1: frame header, then blocks up to the one marked last, then
 * the 4-byte checksum when the flag is set.
 */
function zstdFrames(buf: Buffer): { checksum: boolean; contentSize: number | null }[] {
  const frames: { checksum: boolean; contentSize: number | null }[] = [];
  let p = 0;
  while (p < buf.length) {
    if (buf.readUInt32LE(p) !== 0xfd2fb528) throw new Error(`no zstd frame at ${p}`);
    const fhd = buf[p + 4]!;
    const single = (fhd >> 5) & 1, checksum = (fhd >> 2) & 1, fcsFlag = fhd >> 6;
    const dictBytes = [0, 1, 2, 4][fhd & 3]!;
    const fcsBytes = fcsFlag === 0 ? single : [1, 2, 4, 8][fcsFlag]!;
    const at = p + 5 + (single ? 0 : 1) + dictBytes;
    const contentSize = fcsBytes === 0 ? null : fcsBytes === 1 ? buf[at]! : fcsBytes === 2 ? buf.readUInt16LE(at) + 256
      : fcsBytes === 4 ? buf.readUInt32LE(at) : Number(buf.readBigUInt64LE(at));
    p = at + fcsBytes;
    for (;;) {
      const h = buf[p]! | (buf[p + 1]! << 8) | (buf[p + 2]! << 16);
      const last = h & 1, type = (h >> 1) & 3, size = h >>> 3;
      p += 3 + (type === 1 ? 1 : size);
      if (last) break;
    }
    if (checksum) p += 4;
    frames.push({ checksum: checksum === 1, contentSize });
  }
  return frames;
}
const frameChecksumFlags = (buf: Buffer): boolean[] => zstdFrames(buf).map((f) => f.checksum);
/** The encoder's frames always carry their content size. */
const frameContentSizes = (buf: Buffer): number[] => zstdFrames(buf).map((f) => {
  if (f.contentSize === null) throw new Error("a frame has no content size");
  return f.contentSize;
});

/** A plain (no age) encoder writing into a new file in a temp directory. */
async function tempEncoder(level: number): Promise<{ enc: PayloadEncoder; fd: number; path: string }> {
  const dir = await mkdtemp(join(tmpdir(), "memsnap-enc-"));
  dirs.push(dir);
  const path = join(dir, "payload.zst");
  const fd = openSync(path, "w");
  return { enc: new PayloadEncoder({ fd, start: 0, path, level, age: null }), fd, path };
}

describe.skipIf(!zstdCli && !ci)("PayloadEncoder", () => {
  it("the zstd CLI is installed (required when CI is set)", () => {
    expect(zstdCli).toBe(true);
  });

  it("frames compressed on the main thread while the worker is behind land in order", async () => {
    // Level 19 makes the worker the slow side, so the writer outruns it and steals.
    const { enc, fd, path } = await tempEncoder(19);
    const input = seededText(24 * 1024 * 1024, 7);
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

describe.skipIf(!zstdCli && !ci)("PayloadEncoder: cuts (a frame per KV page plane)", () => {
  const decode = (path: string): Buffer => {
    const d = spawnSync("zstd", ["-d", "-q", "-c", path], { maxBuffer: 64 * 1024 * 1024 });
    expect(d.status).toBe(0);
    return d.stdout;
  };

  it("a cut ends the frame where it is: mid-buffer, twice in a row, and where a full input buffer was just posted", async () => {
    const { enc, fd, path } = await tempEncoder(3);
    const input = seededText(1024 * 1024 + 10, 11);
    try {
      enc.setLevel(PLANE_LEVEL);
      await enc.write(input.subarray(0, 3000));
      enc.cut();
      await enc.write(input.subarray(3000, 43_000));
      enc.cut();
      enc.cut(); // no empty frame
      await enc.write(input.subarray(43_000, 1024 * 1024)); // fills the first input buffer exactly
      enc.cut(); // at the start of the next one
      await enc.write(input.subarray(1024 * 1024));
      enc.cut(); // at the end
      await enc.finish();
    } finally {
      await enc.destroy();
      closeSync(fd);
    }
    expect(frameContentSizes(readFileSync(path))).toEqual([3000, 40_000, 1024 * 1024 - 43_000, 10]);
    expect(decode(path).equals(input)).toBe(true);
  });

  it("cuts hold in frames the main thread compresses while the worker is behind", async () => {
    // Level 19 between the planes keeps the worker behind, so the writer steals.
    const { enc, fd, path } = await tempEncoder(19);
    const input = seededText(12 * 1024 * 1024, 5);
    const sizes: number[] = [];
    try {
      for (let off = 0; off < input.length; ) {
        for (const n of [32 * 1024, 32 * 1024, 700_000]) {
          enc.setLevel(n === 700_000 ? 19 : PLANE_LEVEL);
          const w = enc.write(input.subarray(off, off + n));
          if (w) await w;
          if (n !== 700_000) enc.cut();
          sizes.push(Math.min(n, input.length - off));
          off += n;
          if (off >= input.length) break;
        }
      }
      await enc.finish();
    } finally {
      await enc.destroy();
      closeSync(fd);
    }
    expect(enc.stolenFrames).toBeGreaterThan(0);
    // Every plane is one frame of exactly its size (the level-19 stretches may be split further).
    const got = frameContentSizes(readFileSync(path));
    const planes = got.filter((n) => n === 32 * 1024).length;
    expect(planes).toBe(sizes.filter((n) => n === 32 * 1024).length);
    expect(got.reduce((a, b) => a + b, 0)).toBe(input.length);
    expect(decode(path).equals(input)).toBe(true);
  }, 120_000);
});

describe.skipIf(!zstdCli && !ci)("PayloadEncoder: direct I/O", () => {
  it.runIf(ci && process.platform === "linux")("native/directio is built in CI", () => {
    expect(directIoAddon(), "npm ci builds native/directio with node-gyp").not.toBeNull();
  });

  /** Encode `input` after a `start`-byte header, in odd-sized writes; the file, the result and how many bytes went out with O_DIRECT. */
  async function encode(dir: string, start: number, input: Buffer, directIo: boolean, recipient: string | null) {
    const path = join(dir, `p-${start}-${directIo}-${recipient !== null}.bin`);
    const fd = openSync(path, "wx", 0o600);
    const header = Buffer.alloc(start, 0x5a);
    if (start) writeSync(fd, header, 0, start, 0);
    const enc = new PayloadEncoder({
      fd, start, path, level: 1, directIo,
      age: recipient !== null ? await prepareAgeEncryption({ recipients: [recipient] }) : null,
    });
    try {
      let off = 0;
      for (let k = 1; off < input.length; k++) {
        const n = Math.min(input.length - off, (k * 7919) % 300_000 + 1);
        const w = enc.write(input.subarray(off, off + n));
        if (w) await w;
        off += n;
      }
      const r = await enc.finish();
      return { path, r, header, direct: enc.directBytes };
    } finally {
      await enc.destroy();
      closeSync(fd);
    }
  }

  it("the same file with and without O_DIRECT: header kept, exact length, payload decodes, hash of the stored bytes", async () => {
    const dir = await mkdtemp(join(tmpdir(), "memsnap-direct-"));
    dirs.push(dir);
    const expectDirect = directIoAddon() !== null && directOk(dir);
    const input = Buffer.concat([seededText(3 * 1024 * 1024 + 777, 11), Buffer.alloc(1 << 20), seededText(4099, 3)]);
    for (const start of [0, 512, 1536, 4096 + 512, 3 * 4096]) {
      const a = await encode(dir, start, input, true, null);
      const b = await encode(dir, start, input, false, null);
      expect(b.direct).toBe(0);
      if (expectDirect) expect(a.direct, `start ${start}`).toBeGreaterThan(0);
      for (const x of [a, b]) {
        const file = readFileSync(x.path);
        expect(file.length).toBe(start + x.r.storedSize);
        expect(file.subarray(0, start).equals(x.header)).toBe(true);
        const payload = file.subarray(start);
        expect(createHash("sha256").update(payload).digest("hex")).toBe(x.r.sha256);
        const d = spawnSync("zstd", ["-d", "-q", "-c"], { input: payload, maxBuffer: 64 * 1024 * 1024 });
        expect(d.status).toBe(0);
        expect(d.stdout.equals(input)).toBe(true);
        // A plaintext payload: every frame carries its XXH64 checksum, for `zstd -d` alone.
        const flags = frameChecksumFlags(payload);
        expect(flags.length).toBeGreaterThan(1);
        expect(flags.every((f) => f)).toBe(true);
      }
    }
  }, 120_000);

  it("an age payload written with O_DIRECT: the age and zstd CLIs read it back to the same bytes", async () => {
    const dir = await mkdtemp(join(tmpdir(), "memsnap-direct-"));
    dirs.push(dir);
    const { identity, recipient } = await generateIdentity();
    const key = join(dir, "key.txt");
    writeFileSync(key, `${identity}\n`, { mode: 0o600 });
    const input = seededText(2 * 1024 * 1024 + 13, 5);
    const x = await encode(dir, 512, input, true, recipient);
    if (directIoAddon() !== null && directOk(dir)) expect(x.direct).toBeGreaterThan(0);
    const file = readFileSync(x.path);
    expect(file.length).toBe(512 + x.r.storedSize);
    const payload = file.subarray(512);
    expect(createHash("sha256").update(payload).digest("hex")).toBe(x.r.sha256);
    if (spawnSync("age", ["--version"]).status !== 0 && !ci) return;
    const enc = join(dir, "payload.age");
    writeFileSync(enc, payload);
    const d = spawnSync("sh", ["-c", `age -d -i ${JSON.stringify(key)} ${JSON.stringify(enc)} | zstd -d -q -c`], { maxBuffer: 64 * 1024 * 1024 });
    expect(d.status, d.stderr.toString()).toBe(0);
    expect(d.stdout.equals(input)).toBe(true);
    // An encrypted payload's frames carry no XXH64: age's Poly1305 tags authenticate every chunk.
    const z = spawnSync("age", ["-d", "-i", key, enc], { maxBuffer: 64 * 1024 * 1024 });
    expect(z.status).toBe(0);
    const flags = frameChecksumFlags(z.stdout);
    expect(flags.length).toBeGreaterThan(1);
    expect(flags.some((f) => f)).toBe(false);
  }, 120_000);

  it("an encoder destroyed mid-stream leaves no descriptor of its file open (the O_DIRECT one included)", async () => {
    const dir = await mkdtemp(join(tmpdir(), "memsnap-direct-"));
    dirs.push(dir);
    const open = (): string[] => readdirSync("/proc/self/fd").flatMap((f) => {
      try {
        const t = readlinkSync(`/proc/self/fd/${f}`);
        return t.startsWith(dir) ? [t] : [];
      } catch {
        return [];
      }
    });
    const input = seededText(6 * 1024 * 1024, 4);
    for (let i = 0; i < 6; i++) {
      const path = join(dir, `cut-${i}.bin`);
      const fd = openSync(path, "wx", 0o600);
      writeSync(fd, Buffer.alloc(700, 1), 0, 700, 0);
      const enc = new PayloadEncoder({ fd, start: 700, path, level: 1, age: null });
      // stop at a different point each time: before, while and after the sink writes
      for (let off = 0; off < (i + 1) * 1024 * 1024; off += 256 * 1024) {
        const w = enc.write(input.subarray(off, off + 256 * 1024));
        if (w) await w;
      }
      if (i === 5) expect(open().length, "the file and, with direct I/O, its O_DIRECT descriptor").toBeGreaterThanOrEqual(1);
      await enc.destroy();
      closeSync(fd);
      expect(open(), `destroyed after ${i + 1} MiB`).toEqual([]);
    }
  }, 60_000);

  it("O_DIRECT refused mid-stream (EINVAL): the rest goes through the page cache, and the file is the same", async () => {
    const dir = await mkdtemp(join(tmpdir(), "memsnap-direct-"));
    dirs.push(dir);
    const input = seededText(3 * 1024 * 1024 + 5, 9);
    const before = process.env.MEMSNAP_DIRECT_IO;
    process.env.MEMSNAP_DIRECT_IO = "misaligned"; // the sink's memory is one byte off: every direct write is refused
    let x;
    try {
      x = await encode(dir, 1536, input, true, null);
    } finally {
      if (before === undefined) delete process.env.MEMSNAP_DIRECT_IO;
      else process.env.MEMSNAP_DIRECT_IO = before;
    }
    expect(x.direct).toBe(0);
    const file = readFileSync(x.path);
    expect(file.length).toBe(1536 + x.r.storedSize);
    expect(file.subarray(0, 1536).equals(x.header)).toBe(true);
    const d = spawnSync("zstd", ["-d", "-q", "-c"], { input: file.subarray(1536), maxBuffer: 64 * 1024 * 1024 });
    expect(d.stdout.equals(input)).toBe(true);
  }, 60_000);
});
