/**
 * PayloadDecoder's reads: an encrypted payload is read with O_DIRECT (native/directio's aligned
 * memory, two buffers, the next block read while this one is opened) where the file system
 * takes it, and through the page cache otherwise. Both give the same bytes and the same hash
 * of the stored bytes, at any payload offset; a refusal mid-stream (EINVAL) falls back; a cut
 * payload is reported as truncated either way; no descriptor is left open.
 */
import { createHash } from "node:crypto";
import { closeSync, copyFileSync, openSync, readdirSync, readFileSync, readSync, truncateSync, unlinkSync, writeFileSync, writeSync } from "node:fs";
import { join } from "node:path";
import { afterEach, beforeAll, describe, expect, it } from "vitest";
import { generateIdentity } from "../../src/codecs/age/keys.js";
import { openAgePrefix } from "../../src/codecs/age/stream-open.js";
import { prepareAgeEncryption } from "../../src/codecs/age/stream-seal.js";
import { PayloadDecoder, type StoredResult } from "../../src/read/decoder.js";
import { PayloadEncoder } from "../../src/snapshot/encoder.js";
import { directIoAddon } from "../../src/util/directio.js";
import { tempDir } from "../helpers/cli.js";
import { directOk } from "../helpers/direct.js";
import { seededBlob, seededText } from "../helpers/seeded-blob.js";

const openFds = (): number => readdirSync("/proc/self/fd").length;

let dir: string;
let identity: string;
let recipient: string;
const input = Buffer.concat([seededText(1_500_000, 7), seededBlob(3 * 1024 * 1024 + 4321, 3), Buffer.alloc(700_000), seededText(99_999, 5)]);

beforeAll(async () => {
  dir = tempDir("memsnap-decoder-");
  ({ identity, recipient } = await generateIdentity());
});

/** An age payload of `input` after a `start`-byte header: the file and the stored bytes' hash. */
let files = 0;
async function encodeFile(start: number): Promise<{ path: string; size: number; sha256: string }> {
  const path = join(dir, `p-${start}-${++files}.bin`);
  const fd = openSync(path, "wx", 0o600);
  if (start) writeSync(fd, Buffer.alloc(start, 0x5a), 0, start, 0);
  const enc = new PayloadEncoder({ fd, start, path, level: 1, age: await prepareAgeEncryption({ recipients: [recipient] }) });
  try {
    for (let off = 0; off < input.length; off += 256 * 1024) {
      const w = enc.write(input.subarray(off, off + 256 * 1024));
      if (w) await w;
    }
    const r = await enc.finish();
    return { path, size: r.storedSize, sha256: r.sha256 };
  } finally {
    await enc.destroy();
    closeSync(fd);
  }
}

/** Decode the payload at [offset, offset + size) of `path`: its tar bytes and the stored result. */
async function decode(path: string, offset: number, size: number): Promise<{ out: Buffer; stored: StoredResult }> {
  const prefix = Buffer.alloc(Math.min(size, 64 * 1024));
  const fd = openSync(path, "r");
  try {
    readSync(fd, prefix, 0, prefix.length, offset);
  } finally {
    closeSync(fd);
  }
  const age = await openAgePrefix(prefix, prefix.length === size, { identities: [identity] });
  const d = new PayloadDecoder({ path, offset, size, age, maxOutputBytes: input.length + 1024 });
  const parts: Buffer[] = [];
  for await (const c of d) parts.push(c as Buffer);
  return { out: Buffer.concat(parts), stored: await d.stored };
}

/** Let terminated workers finish exiting (their descriptors close on exit), up to 10 s (a loaded CI machine). */
async function settledFds(want: number): Promise<number> {
  for (let i = 0; i < 200 && openFds() > want; i++) await new Promise((r) => setTimeout(r, 50));
  return openFds();
}

describe("PayloadDecoder reads", () => {
  const saved = process.env.MEMSNAP_DIRECT_IO;
  afterEach(() => {
    if (saved === undefined) delete process.env.MEMSNAP_DIRECT_IO;
    else process.env.MEMSNAP_DIRECT_IO = saved;
  });

  it("O_DIRECT, the page cache, and O_DIRECT refused mid-stream give the same bytes and stored hash, at any offset", async () => {
    const expectDirect = directIoAddon() !== null && directOk(dir);
    for (const start of [0, 512, 4096 + 100, 3 * 4096]) {
      const f = await encodeFile(start);
      expect(f.size).toBeGreaterThan(3 * 1024 * 1024); // several read blocks
      const results: Record<string, { out: Buffer; stored: StoredResult }> = {};
      for (const mode of ["direct", "0", "misaligned"]) {
        if (mode === "direct") delete process.env.MEMSNAP_DIRECT_IO;
        else process.env.MEMSNAP_DIRECT_IO = mode;
        results[mode] = await decode(f.path, start, f.size);
      }
      for (const [mode, r] of Object.entries(results)) {
        expect(r.out.equals(input), `${mode} at ${start}`).toBe(true);
        expect(r.stored).toMatchObject({ sha256: f.sha256, size: f.size });
      }
      expect(createHash("sha256").update(readFileSync(f.path).subarray(start, start + f.size)).digest("hex")).toBe(f.sha256);
      if (expectDirect) expect(results.direct!.stored.directBytes, `start ${start}`).toBe(f.size);
      expect(results["0"]!.stored.directBytes).toBe(0);
      expect(results.misaligned!.stored.directBytes).toBe(0);
    }
  }, 120_000);

  it("a payload cut short is MEMSNAP_BUNDLE_TRUNCATED with and without O_DIRECT, and no descriptor is left open", async () => {
    const f = await encodeFile(512);
    const before = openFds();
    for (const cutAt of [512 + 100_000, 512 + Math.floor(f.size / 2) + 17, 512 + f.size - 5]) {
      const cut = join(dir, `cut-${cutAt}.bin`);
      copyFileSync(f.path, cut);
      truncateSync(cut, cutAt);
      for (const mode of ["direct", "0"]) {
        if (mode === "direct") delete process.env.MEMSNAP_DIRECT_IO;
        else process.env.MEMSNAP_DIRECT_IO = mode;
        await expect(decode(cut, 512, f.size), `${mode}, cut at ${cutAt}`).rejects.toMatchObject({ code: "MEMSNAP_BUNDLE_TRUNCATED" });
      }
    }
    // and after successful decodes
    for (let i = 0; i < 3; i++) expect((await decode(f.path, 512, f.size)).out.equals(input)).toBe(true);
    expect(await settledFds(before)).toBe(before);
  }, 120_000);

  it("a bundle that cannot be opened is MEMSNAP_SOURCE_UNREADABLE", async () => {
    const f = await encodeFile(4096);
    const gone = join(dir, "gone.bin");
    writeFileSync(gone, readFileSync(f.path));
    const prefix = readFileSync(gone).subarray(4096, 4096 + 64 * 1024);
    const age = await openAgePrefix(prefix, false, { identities: [identity] });
    unlinkSync(gone);
    const d = new PayloadDecoder({ path: gone, offset: 4096, size: f.size, age, maxOutputBytes: input.length + 1024 });
    await expect((async () => { for await (const _ of d) { /* drain */ } })()).rejects.toMatchObject({ code: "MEMSNAP_SOURCE_UNREADABLE" });
  });
});
