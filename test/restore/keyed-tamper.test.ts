/**
 * A keyed restore of an age-encrypted bundle reads its payload without the SHA-256 of the stored
 * bytes (src/read/read-payload.ts `skipStoredHash`): what still refuses a tampered bundle is
 * each STREAM chunk's tag (its nonce is its counter, the last one carries the final flag), the
 * age header's MAC, the stored size, and the sealed index that binds every artifact's SHA-256.
 * One byte flipped anywhere in the payload (header, nonce, a middle chunk, the final chunk's
 * tag) is refused with its code and leaves nothing behind; a whole new payload encrypted to the
 * same recipient is refused by the index binding; the same plaintext encrypted again under
 * another file key restores (its bytes are those the seal binds), while keyless and keyed verify
 * still report the stored bytes' hash, a base's too. Real age (the library, and the age CLI to
 * re-encrypt).
 */
import { spawnSync } from "node:child_process";
import { appendFileSync, existsSync, mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { beforeAll, describe, expect, it } from "vitest";
import { generateIdentity, identityFileText, loadConfig, parseConfig, restoreToDir, snapshot, verifyBundle } from "../../src/index.js";
import { flipBit, listLeftovers, makeAgent, readBundle, reseal, tempDir, writeBundle } from "../helpers/cli.js";
import { hasTool } from "../helpers/tools.js";

const ci = process.env.CI === "true";
const haveAge = hasTool("age");

let work = "";
let bundle = "";
let other = "";
let keyFile = "";
let recipient = "";
let identities: string[] = [];
let memoryDir = "";

beforeAll(async () => {
  work = tempDir("memsnap-keyed-tamper-");
  const id = await generateIdentity();
  recipient = id.recipient;
  identities = [id.identity];
  keyFile = join(work, "key.txt");
  writeFileSync(keyFile, identityFileText(id.identity, id.recipient, new Date()), { mode: 0o600 });
  // several 64 KiB age chunks (incompressible bytes), and a last one that is not full
  const big = Buffer.alloc(400_001);
  let x = 2463534242;
  for (let i = 0; i < big.length; i++) {
    x ^= x << 13;
    x ^= x >>> 17;
    x ^= x << 5;
    big[i] = x & 0xff;
  }
  const a = makeAgent({ files: { "notes.md": "# notes\nthe user's plan\n", "blob.bin": big } });
  memoryDir = a.memoryDir;
  bundle = join(work, "a.memsnap");
  await snapshot({ config: await loadConfig(a.config), out: bundle, recipients: [recipient], lock: false });
  // Another agent's bundle, to the same recipient: its payload is what a forger can write.
  const b = makeAgent({ files: { "notes.md": "# notes\nthe forger's plan\n", "blob.bin": Buffer.alloc(400_001, 7) } });
  other = join(work, "b.memsnap");
  await snapshot({ config: await loadConfig(b.config), out: other, recipients: [recipient], lock: false });
}, 60_000);

/** A keyed restore of `p` must fail with `code` and leave neither the target nor a staging dir. */
async function expectRefused(p: string, code: string | RegExp): Promise<void> {
  const d = tempDir("memsnap-keyed-tamper-to-");
  const to = join(d, "t");
  await expect(restoreToDir(p, to, { keys: { identities } })).rejects.toMatchObject({ code });
  expect(existsSync(to)).toBe(false);
  expect(listLeftovers(d)).toEqual([]);
}

describe("keyed restore of a tampered age payload", () => {
  it("the untouched bundle restores byte for byte (the control)", async () => {
    const to = join(tempDir("memsnap-keyed-tamper-to-"), "t");
    await restoreToDir(bundle, to, { keys: { identities } });
    expect(readFileSync(join(to, "memory", "blob.bin")).equals(readFileSync(join(memoryDir, "blob.bin")))).toBe(true);
  });

  it("one byte flipped in a middle chunk, in the final chunk's tag, in the nonce, in the header's MAC: refused, nothing left", async () => {
    const { payload } = readBundle(bundle);
    const text = payload.toString("latin1", 0, 400);
    const macAt = text.indexOf("\n--- ") + 5; // the header's MAC (base64), after "---"
    const headerEnd = text.indexOf("\n", macAt) + 1; // then the 16-byte nonce, then the chunks
    expect(macAt).toBeGreaterThan(5);
    const cases: Array<[string, number, string]> = [
      ["a middle chunk", Math.floor(payload.length / 2), "MEMSNAP_DECRYPT_FAILED"],
      ["the final chunk's tag", payload.length - 1, "MEMSNAP_DECRYPT_FAILED"],
      ["the nonce", headerEnd + 3, "MEMSNAP_DECRYPT_FAILED"],
      ["the header's MAC", macAt + 2, "MEMSNAP_DECRYPT_FAILED"],
    ];
    for (const [what, at, code] of cases) {
      const p = join(work, `flip-${what.replace(/\W+/g, "-")}.memsnap`);
      writeFileSync(p, readFileSync(bundle));
      flipBit(p, 512 + at, 1); // the payload member's bytes start after its 512-byte header
      await expectRefused(p, code);
    }
  });

  it("another payload encrypted to the same recipient, under the victim's resealed manifest: refused by the index binding", async () => {
    const victim = readBundle(bundle);
    const forged = readBundle(other);
    // A forger keeps the victim's index binding (it cannot make another index hash to it) and
    // sets the stored size and hash to its own payload's, then reseals (a seal is no signature).
    const m = reseal({
      ...victim.manifest,
      payload: { ...victim.manifest.payload, sha256: forged.manifest.payload.sha256, stored_size: forged.payload.length },
    });
    const p = join(work, "forged.memsnap");
    writeBundle(p, victim.payloadName, forged.payload, m);
    await expectRefused(p, "MEMSNAP_INDEX_MISMATCH");
    const d = tempDir("memsnap-keyed-tamper-to-");
    const e = await restoreToDir(p, join(d, "t"), { keys: { identities } }).catch((x: unknown) => x);
    expect(String((e as Error).message)).toMatch(/the payload index is not the one the manifest is bound to/);
  });

  it.runIf(haveAge || ci)("the same plaintext encrypted again under a new file key restores; keyless and keyed verify still report the stored hash", async () => {
    const victim = readBundle(bundle);
    const enc = join(work, "victim.age");
    writeFileSync(enc, victim.payload);
    const plain = spawnSync("age", ["-d", "-i", keyFile, enc]);
    expect(plain.status, plain.stderr.toString()).toBe(0);
    const again = spawnSync("age", ["-r", recipient], { input: plain.stdout });
    expect(again.status, again.stderr.toString()).toBe(0);
    expect(again.stdout.length).toBe(victim.payload.length); // one X25519 stanza: the same header length
    expect(again.stdout.equals(victim.payload)).toBe(false);
    const p = join(work, "reencrypted.memsnap");
    writeBundle(p, victim.payloadName, again.stdout, victim.manifestBytes);
    const to = join(tempDir("memsnap-keyed-tamper-to-"), "t");
    await restoreToDir(p, to, { keys: { identities } });
    expect(readFileSync(join(to, "memory", "blob.bin")).equals(readFileSync(join(memoryDir, "blob.bin")))).toBe(true);
    const keyless = await verifyBundle(p);
    expect(keyless.findings.map((f) => f.code)).toContain("MEMSNAP_PAYLOAD_HASH_MISMATCH");
    const keyed = await verifyBundle(p, { keys: { identities } });
    expect(keyed.findings.map((f) => f.code)).toContain("MEMSNAP_PAYLOAD_HASH_MISMATCH");
  });

  it.runIf(haveAge || ci)("an incremental bundle's base encrypted again: the restore reads it, keyed verify of the bundle still reports it", async () => {
    const dir = tempDir("memsnap-keyed-tamper-inc-");
    mkdirSync(join(dir, "traces"));
    const log = join(dir, "traces", "run.jsonl");
    writeFileSync(log, Array.from({ length: 2000 }, (_, i) => `{"i":${i},"text":"line ${i} of the log"}\n`).join(""));
    const config = parseConfig({ agent: "inc", sources: [{ kind: "files", name: "traces", path: "traces" }] }, null, dir);
    const opts = { config, store: join(dir, "store"), incremental: true, recipients: [recipient], lock: false };
    const first = await snapshot(opts);
    appendFileSync(log, `{"i":2000,"text":"one more"}\n`);
    const second = await snapshot(opts);
    expect(second.manifest.bases?.map((b) => b.snapshot_id)).toEqual([first.id]);
    // The base's payload under a new file key, its manifest (and so its seal) untouched.
    const base = readBundle(first.path);
    const plain = spawnSync("age", ["-d", "-i", keyFile], { input: base.payload });
    expect(plain.status, plain.stderr.toString()).toBe(0);
    const again = spawnSync("age", ["-r", recipient], { input: plain.stdout });
    expect(again.stdout.length).toBe(base.payload.length);
    writeBundle(first.path, base.payloadName, again.stdout, base.manifestBytes);
    const to = join(tempDir("memsnap-keyed-tamper-to-"), "t");
    await restoreToDir(second.path, to, { keys: { identities } });
    expect(readFileSync(join(to, "traces", "run.jsonl")).equals(readFileSync(log))).toBe(true);
    const v = await verifyBundle(second.path, { keys: { identities } });
    expect(v.ok).toBe(false);
    expect(v.findings.map((f) => f.code)).toContain("MEMSNAP_PAYLOAD_HASH_MISMATCH");
  });
});
