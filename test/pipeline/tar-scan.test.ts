/**
 * TarScanner (src/read/tar-scan.ts), the payload's only tar parser on the read path: it
 * must frame every archive as tar-stream (which read payloads before it) and GNU tar do, fed
 * in pieces of any size, and refuse what they refuse. Archives are written by the real `tar`
 * in its three formats (ustar, GNU long names, pax records).
 */
import { spawnSync } from "node:child_process";
import { createHash, randomBytes } from "node:crypto";
import { mkdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { Readable } from "node:stream";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import tarStream from "tar-stream";
import { OP_DATA, OP_END, OP_START, TarScanner } from "../../src/read/tar-scan.js";
import { fixTarChecksum, tarHeader, tempDir } from "../helpers/cli.js";
import { requireTool, type SkipContext } from "../helpers/tools.js";

interface Seen {
  name: string;
  size: number;
  type: string;
  sha256: string;
}

const sha = (b: Uint8Array): string => createHash("sha256").update(b).digest("hex");

/**
 * Scan `tar` in pieces of the sizes `split` cycles through, each piece copied into a fresh
 * buffer (the scanner must keep nothing of a buffer but its own copies). Entries with their
 * bytes as the ranges give them, hashed here, and the scanner's digest when it hashed them.
 */
function scan(tar: Buffer, split: number[], hashHere: (i: number) => boolean = () => true): { entries: Seen[]; digests: string[]; ok: boolean; error: string | null } {
  let k = 0;
  const s = new TarScanner(() => createHash("sha256"), () => hashHere(k++));
  const entries: Seen[] = [];
  const digests: string[] = [];
  let h = createHash("sha256");
  let ok = true;
  let step = 0;
  for (let at = 0; at < tar.length && ok;) {
    const n = Math.min(split[step++ % split.length]!, tar.length - at);
    const piece = Buffer.alloc(n + 16, 0xee);
    tar.copy(piece, 8, at, at + n); // somewhere inside a bigger buffer
    ok = s.scan(piece, 8, 8 + n);
    at += n;
    const o = s.ops;
    for (let i = 0; i < o.length;) {
      if (o[i] === OP_START) {
        entries.push({ name: o[i + 1] as string, size: o[i + 2] as number, type: o[i + 3] as string, sha256: "" });
        expect([0, 1]).toContain(o[i + 4]);
        h = createHash("sha256");
        i += 5;
      } else if (o[i] === OP_DATA) {
        const off = o[i + 1] as number;
        const len = o[i + 2] as number;
        expect(off).toBeGreaterThanOrEqual(8);
        expect(off + len).toBeLessThanOrEqual(8 + n);
        h.update(piece.subarray(off, off + len));
        i += 3;
      } else {
        expect(o[i]).toBe(OP_END);
        entries.at(-1)!.sha256 = h.digest("hex");
        digests.push(o[i + 1] as string);
        i += 2;
      }
    }
    s.ops = [];
  }
  if (ok) ok = s.end();
  return { entries, digests, ok, error: s.error };
}

/** What tar-stream's extract makes of the archive. */
async function reference(tar: Buffer): Promise<Seen[]> {
  const out: Seen[] = [];
  const ex = tarStream.extract();
  const done = (async () => {
    for await (const e of ex) {
      const parts: Buffer[] = [];
      for await (const c of e) parts.push(c as Buffer);
      out.push({ name: e.header.name, size: e.header.size ?? 0, type: e.header.type ?? "unknown", sha256: sha(Buffer.concat(parts)) });
    }
  })();
  Readable.from([tar]).pipe(ex as unknown as NodeJS.WritableStream);
  await done;
  return out;
}

let dir: string;
const files: Record<string, Buffer> = {};

beforeAll(() => {
  dir = tempDir("memsnap-tarscan-");
  const src = join(dir, "src");
  const long = `${"d".repeat(60)}/${"e".repeat(70)}`; // fits ustar only split into prefix/name
  const names: Record<string, number> = {
    "empty.txt": 0, "one": 1, "b511": 511, "b512": 512, "b513": 513, "big.bin": 70_000,
    [`${long}/file.md`]: 2000,
    [`${"x".repeat(150)}.md`]: 10, // a single component over 100 bytes: GNU long name or pax path
    "unicodé/名前.txt": 33,
  };
  for (const [name, size] of Object.entries(names)) {
    mkdirSync(join(src, name, ".."), { recursive: true });
    const b = randomBytes(size);
    writeFileSync(join(src, name), b);
    files[name] = b;
  }
});

afterAll(() => rmSync(dir, { recursive: true, force: true }));

/** `tar` of the named files only (no directory entries), in `format`. */
function archive(ctx: SkipContext, format: string, names: string[]): Buffer {
  requireTool(["tar"], ctx);
  const out = join(dir, `${format}.tar`);
  const r = spawnSync("tar", [`--format=${format}`, "--no-recursion", "-C", join(dir, "src"), "-cf", out, ...names], { encoding: "utf8" });
  expect(r.status, r.stderr).toBe(0);
  return readFileSync(out);
}

const SPLITS = [[1 << 20], [1], [7, 500, 3], [512], [4096, 1, 511], [100_000, 13]];

describe("TarScanner", () => {
  for (const format of ["ustar", "gnu", "pax"]) {
    it(`frames a GNU tar ${format} archive as tar-stream does, fed in pieces of any size`, async (ctx) => {
      const names = Object.keys(files).filter((n) => format !== "ustar" || !n.startsWith("x".repeat(150)));
      const tar = archive(ctx, format, names);
      const want = await reference(tar);
      expect(want.map((e) => e.name)).toEqual(names);
      expect(want.map((e) => e.sha256)).toEqual(names.map((n) => sha(files[n]!)));
      for (const split of SPLITS) {
        const r = scan(tar, split);
        expect(r.error, `split ${split}`).toBeNull();
        expect(r.ok).toBe(true);
        expect(r.entries, `split ${split}`).toEqual(want);
        expect(r.digests).toEqual(want.map((e) => e.sha256));
      }
    });
  }

  it("hashes only the entries hashHere picks; the others end with an empty digest and the same ranges", async (ctx) => {
    const names = Object.keys(files);
    const tar = archive(ctx, "pax", names);
    const r = scan(tar, [777], (i) => i % 2 === 1);
    expect(r.ok).toBe(true);
    expect(r.entries.map((e) => e.sha256)).toEqual(names.map((n) => sha(files[n]!)));
    expect(r.digests).toEqual(names.map((n, i) => (i % 2 === 1 ? sha(files[n]!) : "")));
  });

  it("reports a non-file entry (its head, then an error) and frames nothing after it", async (ctx) => {
    requireTool(["tar"], ctx);
    const src = join(dir, "src");
    for (const [what, make] of [["directory", () => "unicodé"], ["symlink", () => { spawnSync("ln", ["-sfn", "/etc/passwd", join(src, "link")]); return "link"; }]] as const) {
      const r0 = spawnSync("tar", ["--format=pax", "--no-recursion", "-C", src, "-cf", join(dir, "t.tar"), "one", make(), "b512"], { encoding: "utf8" });
      expect(r0.status, r0.stderr).toBe(0);
      const tar = readFileSync(join(dir, "t.tar"));
      const ref = await reference(tar);
      expect(ref[1]!.type).toBe(what);
      const r = scan(tar, [300]);
      expect(r.ok).toBe(false);
      expect(r.error).toBe(`a ${what} entry`);
      expect(r.entries.map((e) => [e.name, e.type])).toEqual([["one", "file"], [ref[1]!.name, what]]);
    }
  });

  it("a pax size record replaces the header's size, as in tar-stream", async () => {
    const body = randomBytes(1000);
    const rec = (k: string, v: string): string => {
      let len = ` ${k}=${v}\n`.length;
      len += String(len + String(len).length).length;
      return `${len} ${k}=${v}\n`;
    };
    const pax = Buffer.from(rec("path", "layer/renamed.bin") + rec("size", "1000"));
    const xh = tarHeader("PaxHeader/x", pax.length);
    xh[156] = 0x78; // 'x'
    fixTarChecksum(xh);
    const pad = (n: number): Buffer => Buffer.alloc((512 - (n % 512)) % 512);
    const tar = Buffer.concat([xh, pax, pad(pax.length), tarHeader("short", 5), body, pad(1000), Buffer.alloc(1024)]);
    const want = await reference(tar);
    expect(want).toEqual([{ name: "layer/renamed.bin", size: 1000, type: "file", sha256: sha(body) }]);
    for (const split of SPLITS) expect(scan(tar, split).entries).toEqual(want);
  });

  it("refuses what tar-stream refuses: a bad checksum, an unknown format, a truncated archive, an oversized pax header", async (ctx) => {
    const tar = archive(ctx, "ustar", ["one", "b513", "big.bin"]);
    const refuse = async (bytes: Buffer, msg: RegExp): Promise<void> => {
      await expect(reference(bytes)).rejects.toThrow();
      for (const split of SPLITS) {
        const r = scan(bytes, split);
        expect(r.ok, `split ${split}`).toBe(false);
        expect(r.error).toMatch(msg);
      }
    };
    const badSum = Buffer.from(tar);
    badSum[512 + 512 + 3] ^= 1; // the second header's name
    await refuse(badSum, /Invalid tar header\. Maybe the tar is corrupted/);
    const v7 = Buffer.from(tar);
    v7.fill(0, 512 + 512 + 257, 512 + 512 + 265); // no magic: a v7 header
    fixTarChecksum(v7.subarray(1024, 1536));
    await refuse(v7, /unknown format/);
    // "one" is blocks 0-1, "b513" 2-5 (513 bytes from 1536, padded to 2560), "big.bin" from 2560
    await refuse(tar.subarray(0, 1536 + 100), /Unexpected end of data/); // inside an entry
    await refuse(tar.subarray(0, 2200), /Unexpected end of data/); // inside its padding
    await refuse(tar.subarray(0, 2560 + 100), /Unexpected end of data/); // inside a header
    const huge = tarHeader("PaxHeader/x", 5 * 1024 * 1024);
    huge[156] = 0x78;
    fixTarChecksum(huge);
    await refuse(Buffer.concat([huge, Buffer.alloc(5 * 1024 * 1024), tarHeader("a", 0), Buffer.alloc(1024)]), /Header exceeds max size/);
  });

  it("agrees with tar-stream on thousands of damaged archives (seeded byte changes and cuts): the same entries and bytes, and both fail or neither", async (ctx) => {
    // tar-stream's view: the entries up to the first non-file one (where the scanner stops), and whether it failed.
    const refView = async (tar: Buffer): Promise<string> => {
      const out: string[] = [];
      try {
        const ex = tarStream.extract();
        const done = (async () => {
          for await (const e of ex) {
            const h = createHash("sha256");
            for await (const c of e) h.update(c as Buffer);
            out.push(`${e.header.name}|${e.header.size}|${e.header.type}|${h.digest("hex")}`);
            if (e.header.type !== "file") break;
          }
        })();
        Readable.from([tar]).pipe(ex as unknown as NodeJS.WritableStream);
        await done;
      } catch {
        return `failed ${out.join(",")}`;
      }
      return out.join(",");
    };
    const scanView = (tar: Buffer): string => {
      const r = scan(tar, [tar.length]);
      // an entry cut short (no OP_END, so no digest) is not one tar-stream hands on either
      const seen = r.entries.filter((e) => e.sha256 !== "" || e.type !== "file").map((e) => `${e.name}|${e.size}|${e.type}|${e.sha256}`).join(",");
      return r.ok || r.error!.startsWith("a ") ? seen : `failed ${seen}`;
    };
    let seed = 0x9e3779b9; // mulberry32: a failure names its case number, and the same run reproduces it
    const rand = (n: number): number => {
      seed = (seed + 0x6d2b79f5) | 0;
      let t = seed;
      t = Math.imul(t ^ (t >>> 15), t | 1);
      t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
      return Math.floor((((t ^ (t >>> 14)) >>> 0) / 4294967296) * n);
    };
    for (const format of ["pax", "gnu"]) {
      const base = archive(ctx, format, ["empty.txt", "one", "b511", "b513", `${"x".repeat(150)}.md`, "unicodé/名前.txt"]);
      for (let k = 0; k < 1500; k++) {
        const t = Buffer.from(base);
        for (let j = 0; j <= k % 3; j++) {
          // half the changes inside the first four blocks (headers, pax records), half anywhere
          const pos = k % 2 ? rand(t.length) : rand(Math.min(t.length, 4 * 512));
          t[pos] = rand(256);
        }
        const tar = k % 5 === 0 ? t.subarray(0, rand(t.length)) : t;
        expect(scanView(tar), `${format} case ${k}`).toBe(await refView(tar));
      }
    }
  });

  it("is self-contained: its source alone, as the decoder worker builds it, parses the same", async (ctx) => {
    const tar = archive(ctx, "gnu", Object.keys(files));
    const Rebuilt = new Function(`return (${TarScanner.toString()});`)() as typeof TarScanner;
    const s = new Rebuilt(() => createHash("sha256"));
    expect(s.scan(tar, 0, tar.length) && s.end()).toBe(true);
    const names: unknown[] = [];
    for (let i = 0; i < s.ops.length;) {
      if (s.ops[i] === OP_START) names.push(s.ops[i + 1]);
      i += s.ops[i] === OP_START ? 5 : s.ops[i] === OP_DATA ? 3 : 2;
    }
    expect(names).toEqual(Object.keys(files));
  });
});
