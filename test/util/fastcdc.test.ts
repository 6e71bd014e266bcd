/**
 * FastCDC 2020 against the vectors fastcdc-rs 4.0.1 publishes for its `v2020` module
 * (src/v2020/mod.rs tests; its fixture test/fixtures/SekienAkashita.jpg, copied to
 * fixtures/fastcdc/): every cut's length and gear hash, whole and streamed in odd pieces.
 */
import { createHash, randomBytes } from "node:crypto";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { FastCdc, FastCdcStream, gear } from "../../src/util/fastcdc.js";

const sekien = readFileSync(join(import.meta.dirname, "..", "..", "fixtures", "fastcdc", "SekienAkashita.jpg"));

const cuts = (min: number, avg: number, max: number, data: Buffer = sekien): [bigint, number][] =>
  new FastCdc({ min, avg, max }).cuts(data).map((c) => [c.hash, c.length]);

function streamed(data: Buffer, params: { min: number; avg: number; max: number }, piece: () => number): number[] {
  const s = new FastCdcStream(params);
  const out: number[] = [];
  for (let at = 0; at < data.length;) {
    const n = Math.min(piece(), data.length - at);
    const reused = Buffer.from(data.subarray(at, at + n)); // the caller's buffer, overwritten after
    for (const c of s.push(reused)) out.push(c.length);
    reused.fill(0xaa);
    at += n;
  }
  for (const c of s.end()) out.push(c.length);
  return out;
}

describe("FastCDC 2020 (fastcdc-rs vectors)", () => {
  it("derives the gear table fastcdc-rs ships", () => {
    expect(sekien.length).toBe(109466);
    expect(createHash("sha256").update(sekien).digest("hex")).toBe("d9e749d9367fc908876749d6502eb212fee88c9a94892fb07da5ef3ba8bc39ed");
    expect(gear(0)).toBe(0x3b5d3c7d207e37dcn);
    expect(gear(1)).toBe(0x784d68ba91123086n);
    expect(gear(255)).toBe(0xaabd2b2a451504e1n);
  });

  it("all zeros: chunks of the maximum size", () => {
    const c = cuts(64, 256, 1024, Buffer.alloc(10240));
    expect(c).toHaveLength(10);
    for (const [hash, len] of c) {
      expect(hash).toBe(14169102344523991076n);
      expect(len).toBe(1024);
    }
  });

  it("SekienAkashita.jpg at 4k/16k/64k", () => {
    expect(cuts(4096, 16384, 65535)).toEqual([
      [17968276318003433923n, 21325], [8197189939299398838n, 17140], [13019990849178155730n, 28084],
      [4509236223063678303n, 18217], [2504464741100432583n, 24700],
    ]);
  });

  it("SekienAkashita.jpg at 8k/32k/128k and 16k/64k/256k", () => {
    expect(cuts(8192, 32768, 131072)).toEqual([[15733367461443853673n, 66549], [6321136627705800457n, 42917]]);
    expect(cuts(16384, 65536, 262144)).toEqual([[2504464741100432583n, 109466]]);
  });

  it("the cuts cover the file exactly, first and last as published", () => {
    const c = new FastCdc({ min: 4096, avg: 16384, max: 65535 }).cuts(sekien);
    expect(c[0]!.length).toBe(21325);
    expect(c[c.length - 1]!.length).toBe(24700);
    expect(c.reduce((n, x) => n + x.length, 0)).toBe(sekien.length);
  });

  it("streamed in odd pieces into reused buffers, the same cuts", () => {
    const want = cuts(4096, 16384, 65535).map(([, l]) => l);
    let i = 0;
    const sizes = [1, 7, 4096, 65535, 100_000, 3, 65536];
    expect(streamed(sekien, { min: 4096, avg: 16384, max: 65535 }, () => sizes[i++ % sizes.length]!)).toEqual(want);
    const big = Buffer.concat([randomBytes(3_000_000), sekien, randomBytes(1_000_000)]);
    const whole = new FastCdc({ min: 16384, avg: 65536, max: 262144 }).cuts(big).map((c) => c.length);
    expect(streamed(big, { min: 16384, avg: 65536, max: 262144 }, () => 1 << 20)).toEqual(whole);
    expect(streamed(big, { min: 16384, avg: 65536, max: 262144 }, () => 12345)).toEqual(whole);
  });

  it("an edit in the middle changes only the chunks around it", () => {
    const data = randomBytes(4 << 20);
    const edited = Buffer.from(data);
    edited.write("an edit in the middle", 2 << 20);
    const hashes = (d: Buffer): Set<string> => {
      const out = new Set<string>();
      let at = 0;
      for (const c of new FastCdc({ min: 16384, avg: 65536, max: 262144 }).cuts(d)) {
        out.add(createHash("sha256").update(d.subarray(at, at + c.length)).digest("hex"));
        at += c.length;
      }
      return out;
    };
    const a = hashes(data);
    const b = hashes(edited);
    const changed = [...b].filter((h) => !a.has(h)).length;
    expect(changed).toBeGreaterThan(0);
    expect(changed).toBeLessThanOrEqual(2);
  });
});
