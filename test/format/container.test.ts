/**
 * The outer container: the ustar header codec (round trip, base-256 sizes for ≥ 8 GiB,
 * padding, checksum), BundleWriter (atomic write, abort), and readLayout on good and bad
 * files; GNU tar reads what the codec writes, including a base-256 size (a sparse 8 GiB file).
 */
import { spawnSync } from "node:child_process";
import { closeSync, existsSync, openSync, readdirSync, readFileSync, statSync, writeFileSync, writeSync } from "node:fs";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { BundleWriter, readLayout, tempPathFor } from "../../src/format/container.js";
import { BLOCK, decodeHeader, encodeHeader, padding, patchSize } from "../../src/format/tar-header.js";
import { isMemsnapError } from "../../src/errors.js";
import { fixTarChecksum, tempDir } from "../helpers/cli.js";
import { requireTool } from "../helpers/tools.js";

const GiB = 1024 ** 3;
const MAX_OCTAL = 0o77777777777; // 8 GiB - 1, the largest size 11 octal digits hold
const T = new Date("2024-05-06T07:08:09Z");

describe("tar header codec", () => {
  it("padding rounds a member up to the next 512-byte block", () => {
    const cases: [number, number][] = [[0, 0], [1, 511], [511, 1], [512, 0], [513, 511], [1024, 0], [8 * GiB, 0], [8 * GiB + 1, 511], [MAX_OCTAL, 1]];
    for (const [n, pad] of cases) {
      expect(padding(n), String(n)).toBe(pad);
      expect((n + padding(n)) % BLOCK).toBe(0);
    }
  });

  it("encode → decode round trips name, size and type, with a valid ustar checksum", () => {
    for (const size of [0, 1, 511, 512, 12345, 64 * 1024 * 1024, MAX_OCTAL]) {
      for (const name of ["payload.tar.zst", "payload.tar.zst.age", "manifest.json", "x".repeat(99)]) {
        const h = encodeHeader(name, size, T, 0o600);
        expect(h.length).toBe(BLOCK);
        expect(decodeHeader(h)).toEqual({ name, size, type: "0" });
        expect(h.toString("ascii", 257, 263)).toBe("ustar\0");
        expect(h.toString("ascii", 263, 265)).toBe("00");
        expect(h[124]! & 0x80).toBe(0); // octal, not base-256
      }
    }
    const h = encodeHeader("manifest.json", 10, T, 0o644);
    expect(h.toString("ascii", 100, 107)).toBe("0000644");
    expect(parseInt(h.toString("ascii", 136, 147), 8)).toBe(T.getTime() / 1000);
  });

  it("sizes of 8 GiB and more use GNU base-256 and decode back exactly", () => {
    for (const size of [MAX_OCTAL + 1, 8 * GiB + 1, 100 * GiB + 12345, 2 ** 40 + 7, Number.MAX_SAFE_INTEGER]) {
      const h = encodeHeader("payload.tar.zst", size, T);
      expect(h[124], String(size)).toBe(0x80);
      let v = 0n;
      for (let i = 125; i < 136; i++) v = (v << 8n) | BigInt(h[i]!);
      expect(v).toBe(BigInt(size));
      expect(decodeHeader(h)!.size).toBe(size);
    }
    // one below the switch stays octal
    expect(encodeHeader("p", MAX_OCTAL, T)[124]).toBe("7".charCodeAt(0));
  });

  it("patchSize rewrites the size and the checksum in place (octal ↔ base-256)", () => {
    const h = encodeHeader("payload.tar.zst", 0, T);
    patchSize(h, 123456);
    expect(decodeHeader(h)!.size).toBe(123456);
    patchSize(h, 9 * GiB);
    expect(decodeHeader(h)!.size).toBe(9 * GiB);
    patchSize(h, 77);
    expect(decodeHeader(h)!.size).toBe(77);
  });

  it("decodeHeader: a zero block is the end (null); a short block, a bad checksum or a bad size throw", () => {
    expect(decodeHeader(Buffer.alloc(BLOCK))).toBeNull();
    expect(() => decodeHeader(Buffer.alloc(100))).toThrow(/short/);
    for (const off of [0, 50, 100, 124, 136, 156, 257, 300, 511]) {
      const h = encodeHeader("manifest.json", 10, T);
      h[off]! ^= 0x04;
      expect(() => decodeHeader(h), `flip at ${off}`).toThrow(/checksum/);
    }
    const bad = encodeHeader("manifest.json", 10, T);
    bad.write("0000000009x\0", 124, 12, "ascii");
    fixTarChecksum(bad);
    expect(() => decodeHeader(bad)).toThrow(/size/);
  });

  it("names of 100 bytes or more are refused", () => {
    expect(() => encodeHeader("x".repeat(100), 1, T)).toThrow(RangeError);
    expect(() => encodeHeader("é".repeat(50), 1, T)).toThrow(RangeError);
  });

  it("GNU tar reads headers the codec writes", (ctx) => {
    requireTool("tar", ctx);
    const d = tempDir();
    const body = Buffer.from("hello tar\n");
    const f = join(d, "a.tar");
    writeFileSync(f, Buffer.concat([encodeHeader("payload.tar.zst", body.length, T, 0o600), body, Buffer.alloc(padding(body.length)), Buffer.alloc(1024)]));
    const r = spawnSync("tar", ["-tvf", f], { encoding: "utf8" });
    expect(r.status, r.stderr).toBe(0);
    expect(r.stdout).toMatch(/^-rw------- memsnap\/memsnap\s+10 2024-05-06 \d\d:\d\d payload\.tar\.zst\n$/);
    expect(spawnSync("tar", ["-xOf", f, "payload.tar.zst"]).stdout.toString()).toBe("hello tar\n");
  });

  it("GNU tar and readLayout read a base-256 payload size (a sparse bundle with an 8 GiB + 1 byte payload)", (ctx) => {
    requireTool("tar", ctx);
    const d = tempDir();
    const f = join(d, "huge.memsnap");
    const size = 8 * GiB + 1;
    const manifest = Buffer.from('{"sparse":true}\n');
    const fd = openSync(f, "w");
    try {
      writeSync(fd, encodeHeader("payload.tar.zst", size, T, 0o600), 0, BLOCK, 0);
      const tail = Buffer.concat([encodeHeader("manifest.json", manifest.length, T), manifest, Buffer.alloc(padding(manifest.length)), Buffer.alloc(1024)]);
      writeSync(fd, tail, 0, tail.length, BLOCK + size + padding(size));
    } finally {
      closeSync(fd);
    }
    expect(statSync(f).blocks * 512).toBeLessThan(1024 * 1024); // sparse: no real 8 GiB on disk
    const r = spawnSync("tar", ["-tvf", f], { encoding: "utf8", timeout: 30_000 });
    expect(r.status, r.stderr).toBe(0);
    const lines = r.stdout.trim().split("\n");
    expect(lines[0]).toMatch(new RegExp(`\\s${size}\\s.*payload\\.tar\\.zst$`));
    expect(lines[1]).toMatch(/\s16\s.*manifest\.json$/);
    expect(spawnSync("tar", ["-xOf", f, "manifest.json"], { timeout: 30_000 }).stdout.equals(manifest)).toBe(true);
    return readLayout(f).then((l) => {
      expect(l.payloadSize).toBe(size);
      expect(l.payloadOffset).toBe(BLOCK);
      expect(l.manifestBytes.equals(manifest)).toBe(true);
    });
  });
});

describe("BundleWriter", () => {
  async function writeBundleWith(dest: string, payload: Buffer, manifest: Buffer, encrypted = false): Promise<void> {
    const w = new BundleWriter(dest, encrypted);
    const sink = await w.open();
    await new Promise<void>((res, rej) => sink.end(payload, () => res()).on("error", rej));
    const p = w.payloadResult();
    expect(p.storedSize).toBe(payload.length);
    await w.commit(manifest, p.storedSize);
  }

  it("writes payload, manifest and end blocks; readLayout finds them", async () => {
    const d = tempDir();
    const dest = join(d, "x.memsnap");
    const payload = Buffer.concat([Buffer.from([0x28, 0xb5, 0x2f, 0xfd]), Buffer.alloc(1000, 7)]);
    const manifest = Buffer.from('{"m":1}\n');
    await writeBundleWith(dest, payload, manifest);
    expect(readdirSync(d)).toEqual(["x.memsnap"]);
    const bytes = readFileSync(dest);
    expect(bytes.length).toBe(512 + 1024 + 512 + 512 + 1024);
    expect(statSync(dest).mode & 0o777).toBe(0o600);
    const l = await readLayout(dest);
    expect(l).toMatchObject({ payloadMember: "payload.tar.zst", payloadOffset: 512, payloadSize: payload.length, fileSize: bytes.length });
    expect(l.manifestBytes.equals(manifest)).toBe(true);
    expect(l.payloadHead.equals(payload.subarray(0, 64))).toBe(true);
    expect(bytes.subarray(bytes.length - 1024).every((b) => b === 0)).toBe(true);
  });

  it("an encrypted writer names the member payload.tar.zst.age; a zero-byte payload works", async () => {
    const d = tempDir();
    const dest = join(d, "e.memsnap");
    await writeBundleWith(dest, Buffer.alloc(0), Buffer.from("{}"), true);
    const l = await readLayout(dest);
    expect(l.payloadMember).toBe("payload.tar.zst.age");
    expect(l.payloadSize).toBe(0);
    expect(l.fileSize).toBe(512 + 512 + 512 + 1024);
  });

  it("the temp file is .<name>.tmp-<pid>-<hex> beside the destination, and abort removes it", async () => {
    const d = tempDir();
    const dest = join(d, "y.memsnap");
    expect(tempPathFor(dest)).toMatch(new RegExp(`^${d}/\\.y\\.memsnap\\.tmp-${process.pid}-[0-9a-f]{8}$`));
    const w = new BundleWriter(dest, false);
    const sink = await w.open();
    sink.write(Buffer.alloc(100, 1));
    expect(existsSync(w.tmpPath)).toBe(true);
    expect(existsSync(dest)).toBe(false);
    await w.abort();
    await w.abort(); // twice is fine
    expect(readdirSync(d)).toEqual([]);
  });

  it("open() in a missing directory is MEMSNAP_DEST_UNWRITABLE and leaves nothing", async () => {
    const d = tempDir();
    const w = new BundleWriter(join(d, "no", "such", "z.memsnap"), false);
    const e = await w.open().catch((x: unknown) => x);
    expect(isMemsnapError(e, "MEMSNAP_DEST_UNWRITABLE")).toBe(true);
    expect(readdirSync(d)).toEqual([]);
  });
});

describe("readLayout on bad files", () => {
  const good = async (d: string): Promise<Buffer> => {
    const f = join(d, "g.memsnap");
    const w = new BundleWriter(f, false);
    const sink = await w.open();
    await new Promise<void>((res) => sink.end(Buffer.alloc(700, 3), () => res()));
    await w.commit(Buffer.from('{"a":1}'), 700);
    return readFileSync(f);
  };

  async function codeOf(bytes: Buffer): Promise<string> {
    const f = join(tempDir(), "b.memsnap");
    writeFileSync(f, bytes);
    const e = await readLayout(f).then(() => "ok", (x: unknown) => (isMemsnapError(x) ? x.code : String(x)));
    return e;
  }

  it("missing → MEMSNAP_SOURCE_MISSING; empty or cut → MEMSNAP_BUNDLE_TRUNCATED", async () => {
    const d = tempDir();
    const e = await readLayout(join(d, "nope")).catch((x: unknown) => x);
    expect(isMemsnapError(e, "MEMSNAP_SOURCE_MISSING")).toBe(true);
    const g = await good(d);
    expect(await codeOf(g)).toBe("ok");
    for (let cut = 0; cut < g.length; cut += 100) expect(await codeOf(g.subarray(0, cut)), `cut ${cut}`).toBe("MEMSNAP_BUNDLE_TRUNCATED");
  });

  it("wrong member names, a non-file member, a zero first block, junk after the end → MEMSNAP_BUNDLE_MALFORMED", async () => {
    const g = await good(tempDir());
    const rename = (off: number, name: string): Buffer => {
      const b = Buffer.from(g);
      b.fill(0, off, off + 100);
      b.write(name, off, "ascii");
      fixTarChecksum(b.subarray(off, off + 512));
      return b;
    };
    expect(await codeOf(rename(0, "evil.tar"))).toBe("MEMSNAP_BUNDLE_MALFORMED");
    expect(await codeOf(rename(512 + 1024, "other.json"))).toBe("MEMSNAP_BUNDLE_MALFORMED");
    const dir = Buffer.from(g);
    dir[156] = "5".charCodeAt(0);
    fixTarChecksum(dir.subarray(0, 512));
    expect(await codeOf(dir)).toBe("MEMSNAP_BUNDLE_MALFORMED");
    expect(await codeOf(Buffer.concat([Buffer.alloc(512), g.subarray(512)]))).toBe("MEMSNAP_BUNDLE_MALFORMED");
    expect(await codeOf(Buffer.concat([g, Buffer.from("x")]))).toBe("MEMSNAP_BUNDLE_MALFORMED");
    expect(await codeOf(Buffer.concat([g, Buffer.alloc(4096)]))).toBe("ok");
    const nz = Buffer.from(g);
    nz[nz.length - 10] = 1; // inside the end-of-archive blocks
    expect(await codeOf(nz)).toBe("MEMSNAP_BUNDLE_MALFORMED");
  });

  it("a manifest member over the 64 MiB cap is refused before it is read (MEMSNAP_UNSAFE_BUNDLE)", async () => {
    const d = tempDir();
    const f = join(d, "big-manifest.memsnap");
    const msize = 64 * 1024 * 1024 + 1;
    const fd = openSync(f, "w");
    try {
      writeSync(fd, encodeHeader("payload.tar.zst", 0, T), 0, BLOCK, 0);
      writeSync(fd, encodeHeader("manifest.json", msize, T), 0, BLOCK, BLOCK);
      writeSync(fd, Buffer.alloc(1024), 0, 1024, 2 * BLOCK + msize + padding(msize));
    } finally {
      closeSync(fd);
    }
    const e = await readLayout(f).catch((x: unknown) => x);
    expect(isMemsnapError(e, "MEMSNAP_UNSAFE_BUNDLE"), String(e)).toBe(true);
    expect((e as Error).message).toMatch(/cap/);
  });
});
