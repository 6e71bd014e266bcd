/**
 * native/aead: age STREAM chunks sealed and opened with Node's own OpenSSL into caller
 * buffers. The addon must give node:crypto's bytes exactly (chunk by chunk, and whole bundles
 * that the `age` CLI decrypts), refuse every chunk that does not authenticate, and refuse bad
 * arguments; bundles written with it and without it (`MEMSNAP_NATIVE=0`) read back either way,
 * and damage is reported the same way by both paths.
 */
import { spawnSync } from "node:child_process";
import { createCipheriv, randomBytes } from "node:crypto";
import { copyFileSync, existsSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { afterEach, beforeAll, describe, expect, it } from "vitest";
import { generateIdentity, identityFileText, loadConfig, restoreToDir, snapshot, verifyBundle } from "../../src/index.js";
import { aeadAddon, aeadAddonPath } from "../../src/codecs/aead.js";
import { flipBit, listTree, makeAgent, readBundle, tempDir } from "../helpers/cli.js";

const ci = process.env.CI === "true";
const addon = aeadAddon();

/** A sealed age chunk as node:crypto makes it: ciphertext, then the tag. */
function reference(key: Buffer, counter: number, last: boolean, plain: Uint8Array): Buffer {
  const nonce = Buffer.alloc(12);
  nonce.writeUIntBE(counter, 5, 6);
  nonce[11] = last ? 1 : 0;
  const c = createCipheriv("chacha20-poly1305", key, nonce, { authTagLength: 16 });
  const body = c.update(plain);
  c.final();
  return Buffer.concat([body, c.getAuthTag()]);
}

describe("native/aead", () => {
  it.runIf(ci)("is built in CI", () => {
    expect(aeadAddonPath(), "npm ci builds native/aead with node-gyp").not.toBeNull();
    expect(addon).not.toBeNull();
  });

  it.runIf(addon !== null)("seals exactly what node:crypto seals, at any length, counter, flag and offset", () => {
    const a = addon!;
    const key = randomBytes(32);
    const dst = Buffer.alloc(70_000);
    // source bytes in shared memory too: the sink seals straight out of the ring it shares
    const shared = Buffer.from(new SharedArrayBuffer(70_000));
    randomBytes(70_000).copy(shared);
    for (const len of [0, 1, 15, 16, 17, 4095, 65_535, 65_536]) {
      for (const counter of [0, 1, 255, 256, 2 ** 32 + 7, 2 ** 48 - 1]) {
        for (const last of [false, true]) {
          const srcOff = (len * 7 + counter) % 1000;
          const dstOff = (len + 3) % 900;
          const plain = shared.subarray(srcOff, srcOff + len);
          const n = a.seal(key, counter, last, shared, srcOff, len, dst, dstOff);
          expect(n).toBe(len + 16);
          expect(dst.subarray(dstOff, dstOff + n).equals(reference(key, counter, last, plain)), `len ${len} counter ${counter} last ${last}`).toBe(true);
        }
      }
    }
  });

  it.runIf(addon !== null)("opens what it sealed, and refuses a flipped bit, another counter, flag or key", () => {
    const a = addon!;
    const key = randomBytes(32);
    const other = randomBytes(32);
    const sealed = Buffer.alloc(65_552);
    const back = Buffer.alloc(65_536);
    for (const len of [0, 1, 1000, 65_536]) {
      const plain = randomBytes(len);
      const n = a.seal(key, 9, len === 1000, plain, 0, len, sealed, 0);
      const last = len === 1000;
      expect(a.open(key, 9, last, sealed, 0, n, back, 0)).toBe(len);
      expect(back.subarray(0, len).equals(plain)).toBe(true);
      expect(a.open(key, 10, last, sealed, 0, n, back, 0)).toBe(-1);
      expect(a.open(key, 9, !last, sealed, 0, n, back, 0)).toBe(-1);
      expect(a.open(other, 9, last, sealed, 0, n, back, 0)).toBe(-1);
      for (const bit of [0, Math.floor(n / 2) * 8 + 3, (n - 1) * 8 + 7]) {
        sealed[bit >> 3]! ^= 1 << (bit & 7);
        expect(a.open(key, 9, last, sealed, 0, n, back, 0), `bit ${bit} of ${n * 8}`).toBe(-1);
        sealed[bit >> 3]! ^= 1 << (bit & 7);
      }
      expect(a.open(key, 9, last, sealed, 0, n, back, 0)).toBe(len);
    }
  });

  it.runIf(addon !== null)("refuses bad arguments with a RangeError and writes nothing", () => {
    const a = addon!;
    const key = randomBytes(32);
    const src = randomBytes(70_000);
    const dst = Buffer.alloc(70_000, 0xaa);
    const bad: Array<() => number> = [
      () => a.seal(key.subarray(0, 31), 0, false, src, 0, 10, dst, 0),
      () => a.seal(key, -1, false, src, 0, 10, dst, 0),
      () => a.seal(key, 2 ** 48, false, src, 0, 10, dst, 0),
      () => a.seal(key, 1.5, false, src, 0, 10, dst, 0),
      () => a.seal(key, 0, false, src, 0, 65_537, dst, 0),
      () => a.seal(key, 0, false, src, 69_999, 2, dst, 0),
      () => a.seal(key, 0, false, src, 0, 100, dst, 69_950),
      () => a.seal(key, 0, false, src, 0, 100, src, 50),
      () => a.open(key, 0, false, src, 0, 15, dst, 0),
      () => a.open(key, 0, false, src, 0, 65_553, dst, 0),
      () => a.open(key, 0, false, src, 0, 1000, dst, 69_500),
      () => (a.seal as unknown as (...x: unknown[]) => number)(key, 0, false, "text", 0, 1, dst, 0),
      () => (a.seal as unknown as (...x: unknown[]) => number)(key, 0, false, src),
    ];
    for (const f of bad) expect(f).toThrow(RangeError);
    expect(dst.every((x) => x === 0xaa)).toBe(true);
  });
});

describe("bundles with and without native/aead", () => {
  const saved = process.env.MEMSNAP_NATIVE;
  afterEach(() => {
    if (saved === undefined) delete process.env.MEMSNAP_NATIVE;
    else process.env.MEMSNAP_NATIVE = saved;
  });
  let work: string;
  let keyFile: string;
  let recipient: string;
  let identities: string[];
  let agentConfig: string;
  let memoryDir: string;
  const bundles: Record<string, string> = {};

  beforeAll(async () => {
    work = tempDir("memsnap-aead-");
    const id = await generateIdentity();
    recipient = id.recipient;
    identities = [id.identity];
    keyFile = join(work, "key.txt");
    writeFileSync(keyFile, identityFileText(id.identity, id.recipient, new Date()), { mode: 0o600 });
    // several 64 KiB age chunks, and a last one that is not full
    const big = Buffer.alloc(700_001);
    for (let i = 0; i < big.length; i++) big[i] = (i * 2654435761) >>> 24;
    const a = makeAgent({ files: { "notes.md": "# notes\nremember the user's plan\n", "blob.bin": big } });
    agentConfig = a.config;
    memoryDir = a.memoryDir;
    for (const mode of ["native", "js"]) {
      if (mode === "js") process.env.MEMSNAP_NATIVE = "0";
      else delete process.env.MEMSNAP_NATIVE;
      const out = join(work, `${mode}.memsnap`);
      await snapshot({ config: await loadConfig(agentConfig), out, recipients: [recipient], lock: false });
      bundles[mode] = out;
    }
  }, 60_000);

  for (const writer of ["native", "js"]) {
    for (const reader of ["native", "js"]) {
      it(`written ${writer}, read ${reader}: verify passes and restore gives the files back`, async () => {
        if (reader === "js") process.env.MEMSNAP_NATIVE = "0";
        else delete process.env.MEMSNAP_NATIVE;
        const report = await verifyBundle(bundles[writer]!, { keys: { identities } });
        expect(report.ok, JSON.stringify(report.findings)).toBe(true);
        const to = join(work, `r-${writer}-${reader}`);
        await restoreToDir(bundles[writer]!, to, { keys: { identities } });
        expect(readFileSync(join(to, "memory", "blob.bin")).equals(readFileSync(join(memoryDir, "blob.bin")))).toBe(true);
      }, 60_000);
    }
  }

  it.runIf(spawnSync("age", ["--version"]).status === 0 || ci)("the age CLI decrypts both payloads to the same tar listing", () => {
    const lists = Object.values(bundles).map((b) => {
      const r = spawnSync("sh", ["-c", `tar -xOf ${JSON.stringify(b)} payload.tar.zst.age | age -d -i ${JSON.stringify(keyFile)} | zstd -d -q | tar -tv`]);
      expect(r.status, r.stderr.toString()).toBe(0);
      return r.stdout.toString().split("\n").filter((l) => !l.includes(".memsnap/index.json")).map((l) => l.replace(/\s+\S+\s+\S+\s+(\S+)$/, " $1"));
    });
    expect(lists[0]).toEqual(lists[1]);
    expect(lists[0]!.some((l) => l.includes("memory/blob.bin"))).toBe(true);
  });

  for (const reader of ["native", "js"]) {
    it(`read ${reader}: a flipped bit in a middle chunk fails verify and restore as a decrypt failure, and restore leaves nothing`, async () => {
      if (reader === "js") process.env.MEMSNAP_NATIVE = "0";
      else delete process.env.MEMSNAP_NATIVE;
      const { payload } = readBundle(bundles.native!);
      const flipped = join(work, `flip-${reader}.memsnap`);
      copyFileSync(bundles.native!, flipped);
      flipBit(flipped, 512 + Math.floor(payload.length / 2), 2); // the payload member's data starts after its 512-byte header
      const r = await verifyBundle(flipped, { keys: { identities } });
      expect(r.ok).toBe(false);
      const codes = r.findings.map((f) => f.code);
      expect(codes).toContain("MEMSNAP_PAYLOAD_HASH_MISMATCH");
      expect(codes).toContain("MEMSNAP_DECRYPT_FAILED");
      const to = join(work, `flip-${reader}`);
      await expect(restoreToDir(flipped, to, { keys: { identities } })).rejects.toMatchObject({ code: "MEMSNAP_DECRYPT_FAILED" });
      expect(existsSync(to), String(existsSync(to) && listTree(to))).toBe(false);
      expect(listTree(work).filter((p) => /\.memsnap-(staging|work|new|old)-/.test(p))).toEqual([]);
    }, 60_000);
  }
});
