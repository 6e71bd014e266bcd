import { createCipheriv, hkdfSync, randomBytes } from "node:crypto";
import { mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Readable, Writable, type Transform } from "node:stream";
import { pipeline } from "node:stream/promises";
import { Decrypter, Encrypter, type Stanza } from "age-encryption";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { isMemsnapError, type ErrorCode } from "../../src/errors.js";
import { AGE_MAGIC } from "../../src/codecs/age/common.js";
import {
  generateIdentity, identityFileText, parseIdentities, parseRecipients, recipientFingerprint,
} from "../../src/codecs/age/keys.js";
import { createAgeDecryptor } from "../../src/codecs/age/stream-open.js";
import { createAgeEncryptor } from "../../src/codecs/age/stream-seal.js";
import { exec, itWithTools } from "../helpers/exec.js";

const CHUNK = 65536;
const LOG_N = 10;

// ---------------------------------------------------------------------------------------
// helpers

/** Split `buf` into pieces of the given sizes, cycling through `sizes`. */
function* pieces(buf: Buffer, sizes: number[]): Generator<Buffer> {
  if (buf.length === 0) return;
  let i = 0;
  let off = 0;
  while (off < buf.length) {
    const n = sizes[i++ % sizes.length]!;
    yield buf.subarray(off, off + n);
    off += n;
  }
}

/** Run `input` (as the given pieces) through `t`; resolves with the concatenated output. */
async function through(t: Transform, input: Iterable<Buffer>): Promise<Buffer> {
  const out: Buffer[] = [];
  await pipeline(
    Readable.from(input),
    t,
    new Writable({
      write(chunk: Buffer, _enc, cb) {
        out.push(chunk);
        cb();
      },
    }),
  );
  return Buffer.concat(out);
}

async function encrypt(plain: Buffer, opts: Parameters<typeof createAgeEncryptor>[0], sizes?: number[]): Promise<Buffer> {
  return through(await createAgeEncryptor(opts), sizes ? pieces(plain, sizes) : [plain]);
}

async function decrypt(cipher: Buffer, opts: Parameters<typeof createAgeDecryptor>[0], sizes?: number[]): Promise<Buffer> {
  return through(createAgeDecryptor(opts), sizes ? pieces(cipher, sizes) : [cipher]);
}

/** Expect the promise to reject with a MemsnapError of `code`; returns it. */
async function expectCode(p: Promise<unknown>, code: ErrorCode): Promise<Error> {
  let err: unknown;
  try {
    await p;
  } catch (e) {
    err = e;
  }
  expect(err, `expected ${code}`).toBeDefined();
  if (!isMemsnapError(err, code)) {
    throw new Error(`expected ${code}, got ${String((err as { code?: string })?.code)}: ${String((err as Error)?.message)}`);
  }
  return err;
}

function expectCodeSync(fn: () => unknown, code: ErrorCode): void {
  let err: unknown;
  try {
    fn();
  } catch (e) {
    err = e;
  }
  expect(isMemsnapError(err, code), `expected ${code}, got ${String(err)}`).toBe(true);
}

/** Length of the age header (through the `--- <mac>\n` line). */
function headerLength(file: Buffer): number {
  const at = file.indexOf("\n--- ");
  expect(at).toBeGreaterThan(0);
  return file.indexOf(0x0a, at + 5) + 1;
}

function expectedCipherLength(header: number, size: number): number {
  return header + 16 + size + 16 * Math.max(1, Math.ceil(size / CHUNK));
}

let dir: string;
let alice: { identity: string; recipient: string };
let bob: { identity: string; recipient: string };

beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), "memsnap-age-"));
  alice = await generateIdentity();
  bob = await generateIdentity();
});

afterAll(async () => {
  await rm(dir, { recursive: true, force: true });
});

// ---------------------------------------------------------------------------------------

describe("constants and keys", () => {
  it("AGE_MAGIC is the age v1 version line", () => {
    expect(AGE_MAGIC.toString("latin1")).toBe("age-encryption.org/v1\n");
  });

  it("generateIdentity returns a matching X25519 key pair", async () => {
    expect(alice.identity).toMatch(/^AGE-SECRET-KEY-1[0-9A-Z]{58}$/);
    expect(alice.recipient).toMatch(/^age1[0-9a-z]{58}$/);
    expect(alice.identity).not.toBe(bob.identity);
    // typage agrees that the identity opens files for the recipient
    const e = new Encrypter();
    e.addRecipient(alice.recipient);
    const d = new Decrypter();
    d.addIdentity(alice.identity);
    expect(Buffer.from(await d.decrypt(await e.encrypt("hi"))).toString()).toBe("hi");
  });

  it("identityFileText uses the age-keygen layout and round-trips through parseIdentities", () => {
    const text = identityFileText(alice.identity, alice.recipient, new Date("2024-03-04T05:06:07.890Z"));
    expect(text).toBe(`# created: 2024-03-04T05:06:07Z\n# public key: ${alice.recipient}\n${alice.identity}\n`);
    expect(parseIdentities(text)).toEqual([alice.identity]);
  });

  it("identityFileText rejects a recipient that does not belong to the identity", () => {
    expectCodeSync(() => identityFileText(alice.identity, bob.recipient, new Date()), "MEMSNAP_IDENTITY_INVALID");
    expectCodeSync(() => identityFileText("AGE-SECRET-KEY-1XYZ", alice.recipient, new Date()), "MEMSNAP_IDENTITY_INVALID");
  });

  it("parseRecipients reads files and single recipients, ignoring comments and blank lines", () => {
    expect(parseRecipients(alice.recipient)).toEqual([alice.recipient]);
    expect(parseRecipients(`# team\n\n${alice.recipient}\r\n  # bob:\n${bob.recipient}\n${alice.recipient}\n`)).toEqual([
      alice.recipient,
      bob.recipient,
    ]);
  });

  it("parseRecipients rejects bad recipients with MEMSNAP_IDENTITY_INVALID and a hint", () => {
    const flipped = alice.recipient.slice(0, -1) + (alice.recipient.endsWith("q") ? "p" : "q"); // checksum breaks
    const bad = [
      "",
      "# only a comment\n",
      "age1notarecipient",
      flipped,
      alice.recipient.toUpperCase().replace(/^AGE1/, "age1"),
      alice.identity,
      "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGg user@host",
      `${alice.recipient}\nage1bogus`,
    ];
    for (const text of bad) {
      let err: unknown;
      try {
        parseRecipients(text);
      } catch (e) {
        err = e;
      }
      expect(isMemsnapError(err, "MEMSNAP_IDENTITY_INVALID"), JSON.stringify(text)).toBe(true);
      expect((err as { hint?: string }).hint).toMatch(/age1/);
    }
  });

  it("parseIdentities rejects bad identity files with MEMSNAP_IDENTITY_INVALID", () => {
    const flipped = alice.identity.slice(0, -1) + (alice.identity.endsWith("Q") ? "P" : "Q");
    for (const text of ["", "# nothing here\n", alice.recipient, flipped, "AGE-SECRET-KEY-1ABC", `${alice.identity}\ngarbage`, "age-encryption.org/v1\n-> X25519 abc\n"]) {
      expectCodeSync(() => parseIdentities(text), "MEMSNAP_IDENTITY_INVALID");
    }
    expect(parseIdentities(`${alice.identity}\n\n# second\n${bob.identity}\n`)).toEqual([alice.identity, bob.identity]);
  });

  it("recipientFingerprint is sha256: plus 16 hex characters and stable", () => {
    const fp = recipientFingerprint(alice.recipient);
    expect(fp).toMatch(/^sha256:[0-9a-f]{16}$/);
    expect(recipientFingerprint(alice.recipient)).toBe(fp);
    expect(recipientFingerprint(bob.recipient)).not.toBe(fp);
    // sha256("abc") = ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad
    expect(recipientFingerprint("abc")).toBe("sha256:ba7816bf8f01cfea");
  });
});

describe("encryptor options", () => {
  it("needs exactly one of recipients or passphrase (MEMSNAP_USAGE)", async () => {
    await expectCode(createAgeEncryptor({}), "MEMSNAP_USAGE");
    await expectCode(createAgeEncryptor({ recipients: [] }), "MEMSNAP_USAGE");
    await expectCode(createAgeEncryptor({ recipients: [alice.recipient], passphrase: "pw" }), "MEMSNAP_USAGE");
    await expectCode(createAgeEncryptor({ passphrase: "" }), "MEMSNAP_USAGE");
    await expectCode(createAgeEncryptor({ passphrase: "pw", scryptLogN: 0 }), "MEMSNAP_USAGE");
    await expectCode(createAgeEncryptor({ passphrase: "pw", scryptLogN: 21 }), "MEMSNAP_USAGE");
    await expectCode(createAgeEncryptor({ passphrase: "pw", scryptLogN: 10.5 }), "MEMSNAP_USAGE");
  });

  it("rejects a bad recipient string with MEMSNAP_IDENTITY_INVALID", async () => {
    await expectCode(createAgeEncryptor({ recipients: ["age1nope"] }), "MEMSNAP_IDENTITY_INVALID");
    await expectCode(createAgeEncryptor({ recipients: [alice.recipient, alice.identity] }), "MEMSNAP_IDENTITY_INVALID");
  });

  it("writes one X25519 stanza per recipient and nothing for the key capture", async () => {
    const out = await encrypt(Buffer.from("x"), { recipients: [alice.recipient, bob.recipient] });
    const header = out.subarray(0, headerLength(out)).toString("latin1");
    expect(out.subarray(0, AGE_MAGIC.length).equals(AGE_MAGIC)).toBe(true);
    expect(header.match(/^-> /gm)).toHaveLength(2);
    expect(header.match(/^-> X25519 /gm)).toHaveLength(2);
  });

  it("writes a single scrypt stanza with the configured work factor", async () => {
    const out = await encrypt(Buffer.from("x"), { passphrase: "pw", scryptLogN: 11 });
    const header = out.subarray(0, headerLength(out)).toString("latin1");
    expect(header).toMatch(/^-> scrypt [A-Za-z0-9+/]{22} 11\n[A-Za-z0-9+/]{43}\n--- [A-Za-z0-9+/]{43}\n$/m);
    expect(header.match(/^-> /gm)).toHaveLength(1);
  });
});

describe("round trip", () => {
  const sizes = [0, 1, 65535, 65536, 65537, 3 * 65536, 5_000_003];
  const plains = new Map(sizes.map((n) => [n, randomBytes(n)]));

  const modes: Array<{ name: string; pieces: (size: number) => number[][] | undefined }> = [
    { name: "one buffer", pieces: () => undefined },
    { name: "64 KiB-ish pieces", pieces: () => [[65536], [65000, 70000]] },
    {
      name: "odd small pieces",
      pieces: (size) => (size <= 65537 ? [[1], [7]] : size <= 3 * 65536 ? [[7], [13, 1, 4093]] : [[4093, 1, 100_003]]),
    },
  ];

  for (const size of sizes) {
    for (const mode of modes) {
      it(`size ${size}, ${mode.name}`, async () => {
        const plain = plains.get(size)!;
        for (const sz of mode.pieces(size) ?? [undefined]) {
          const cipher = await encrypt(plain, { recipients: [alice.recipient] }, sz);
          expect(cipher.length).toBe(expectedCipherLength(headerLength(cipher), size));
          const back = await decrypt(cipher, { identities: [alice.identity] }, sz);
          expect(back.equals(plain)).toBe(true);
        }
      });
    }
  }

  it("decrypts with any one of several recipients' identities", async () => {
    const plain = randomBytes(100_000);
    const cipher = await encrypt(plain, { recipients: [alice.recipient, bob.recipient] });
    expect((await decrypt(cipher, { identities: [alice.identity] })).equals(plain)).toBe(true);
    expect((await decrypt(cipher, { identities: [bob.identity] })).equals(plain)).toBe(true);
    const carol = await generateIdentity();
    expect((await decrypt(cipher, { identities: [carol.identity, bob.identity] })).equals(plain)).toBe(true);
  });

  it("passphrase round trip, small pieces too", async () => {
    for (const size of [0, 65536, 200_000]) {
      const plain = randomBytes(size);
      const cipher = await encrypt(plain, { passphrase: "correct horse", scryptLogN: LOG_N }, [7, 65536]);
      expect((await decrypt(cipher, { passphrases: ["wrong", "correct horse"] }, [3, 999])).equals(plain)).toBe(true);
    }
  });

  it("each encryption uses a fresh file key and nonce", async () => {
    const plain = Buffer.alloc(1000, 1);
    const a = await encrypt(plain, { recipients: [alice.recipient] });
    const b = await encrypt(plain, { recipients: [alice.recipient] });
    expect(a.subarray(headerLength(a)).equals(b.subarray(headerLength(b)))).toBe(false);
  });

  it("emits plaintext in pieces of at most 64 KiB and respects backpressure", async () => {
    const plain = randomBytes(2_000_000);
    const cipher = await encrypt(plain, { recipients: [alice.recipient] });
    const outSizes: number[] = [];
    await pipeline(
      Readable.from([cipher]),
      createAgeDecryptor({ identities: [alice.identity] }),
      new Writable({
        write(chunk: Buffer, _e, cb) {
          outSizes.push(chunk.length);
          cb();
        },
      }),
    );
    expect(Math.max(...outSizes)).toBeLessThanOrEqual(CHUNK);

    // A stalled consumer must stop the producer after a bounded amount of input.
    let produced = 0;
    async function* source(): AsyncGenerator<Buffer> {
      for (let i = 0; i < 512; i++) {
        produced++;
        yield Buffer.alloc(CHUNK, i);
      }
    }
    let release: (() => void) | undefined;
    let received = 0;
    const done = pipeline(
      source(),
      await createAgeEncryptor({ recipients: [alice.recipient] }),
      new Writable({
        highWaterMark: 1024,
        write(chunk: Buffer, _e, cb) {
          received += chunk.length;
          if (release === undefined) release = cb; // stall on the first write
          else cb();
        },
      }),
    );
    await new Promise((r) => setTimeout(r, 200));
    expect(produced).toBeLessThan(16);
    release!();
    await done;
    expect(produced).toBe(512);
    expect(received).toBeGreaterThan(512 * CHUNK);
  });
});

describe("typage interop", () => {
  it("typage Decrypter (addPassphrase) decrypts our passphrase output", async () => {
    for (const size of [0, 65536, 70_000]) {
      const plain = randomBytes(size);
      const cipher = await encrypt(plain, { passphrase: "hunter2", scryptLogN: LOG_N });
      const d = new Decrypter();
      d.addPassphrase("hunter2");
      expect(Buffer.from(await d.decrypt(new Uint8Array(cipher))).equals(plain)).toBe(true);
    }
  });

  it("typage Decrypter (addIdentity) decrypts our X25519 output, and we decrypt typage's", async () => {
    for (const size of [0, 1, 65536, 65537, 2 * 65536]) {
      const plain = randomBytes(size);
      const ours = await encrypt(plain, { recipients: [alice.recipient] });
      const d = new Decrypter();
      d.addIdentity(alice.identity);
      expect(Buffer.from(await d.decrypt(new Uint8Array(ours))).equals(plain)).toBe(true);

      const e = new Encrypter();
      e.addRecipient(alice.recipient);
      const theirs = Buffer.from(await e.encrypt(new Uint8Array(plain)));
      expect((await decrypt(theirs, { identities: [alice.identity] }, [5000])).equals(plain)).toBe(true);
    }
  });

  it("we decrypt typage's passphrase (setPassphrase) output", async () => {
    const plain = randomBytes(70_000);
    const e = new Encrypter();
    e.setPassphrase("pw");
    e.setScryptWorkFactor(LOG_N);
    const theirs = Buffer.from(await e.encrypt(new Uint8Array(plain)));
    expect((await decrypt(theirs, { passphrases: ["pw"] })).equals(plain)).toBe(true);
  });
});

describe("age CLI interop", () => {
  const itAge = itWithTools(["age", "age-keygen"]);
  const itAgeTty = itWithTools(["age", ["script", ["--version"]]]);

  async function keygen(name: string): Promise<{ file: string; identity: string; recipient: string }> {
    const file = join(dir, name);
    const r = await exec("age-keygen", ["-o", file]);
    expect(r.code, r.stderr).toBe(0);
    const identities = parseIdentities(await readFile(file, "utf8"));
    expect(identities).toHaveLength(1);
    const y = await exec("age-keygen", ["-y", file]);
    expect(y.code, y.stderr).toBe(0);
    return { file, identity: identities[0]!, recipient: parseRecipients(y.stdout.toString())[0]! };
  }

  itAge("age-keygen output parses with parseIdentities and matches our layout", async () => {
    const k = await keygen("keygen.txt");
    const text = await readFile(k.file, "utf8");
    expect(text).toMatch(/^# created: \S+\n# public key: age1[0-9a-z]{58}\nAGE-SECRET-KEY-1[0-9A-Z]{58}\n$/);
    expect(text).toContain(`# public key: ${k.recipient}\n`);
    // our writer produces the same layout for the same key (only the timestamp can differ)
    const ours = identityFileText(k.identity, k.recipient, new Date());
    expect(ours.split("\n").slice(1)).toEqual(text.split("\n").slice(1));
  });

  itAge("our X25519 output decrypts with `age -d -i`", async () => {
    const k1 = await keygen("k1.txt");
    const k2 = await keygen("k2.txt");
    // 256 * 64 KiB + 5 needs a chunk counter > 255 (carry into the next nonce byte)
    for (const size of [0, 1, 65536, 65537, 3 * 65536, 1_000_000, 256 * 65536 + 5]) {
      const plain = randomBytes(size);
      const cipher = await encrypt(plain, { recipients: [k1.recipient, k2.recipient] });
      for (const k of [k1, k2]) {
        const r = await exec("age", ["-d", "-i", k.file], { input: cipher });
        expect(r.code, r.stderr).toBe(0);
        expect(r.stdout.equals(plain)).toBe(true);
      }
    }
  });

  itAge("`age -r` and `age -R` (two recipients) output decrypts with ours", async () => {
    const k1 = await keygen("r1.txt");
    const k2 = await keygen("r2.txt");
    const recipientsFile = join(dir, "recipients.txt");
    await writeFile(recipientsFile, `# two of them\n${k1.recipient}\n\n${k2.recipient}\n`);
    expect(parseRecipients(await readFile(recipientsFile, "utf8"))).toEqual([k1.recipient, k2.recipient]);
    for (const size of [0, 100, 65536, 65537, 2 * 65536, 700_000, 257 * 65536]) {
      const plain = randomBytes(size);
      const single = await exec("age", ["-r", k1.recipient], { input: plain });
      expect(single.code, single.stderr).toBe(0);
      expect((await decrypt(single.stdout, { identities: [k1.identity] }, [65536])).equals(plain)).toBe(true);
      await expectCode(decrypt(single.stdout, { identities: [k2.identity] }), "MEMSNAP_DECRYPT_FAILED");

      const multi = await exec("age", ["-R", recipientsFile], { input: plain });
      expect(multi.code, multi.stderr).toBe(0);
      expect((await decrypt(multi.stdout, { identities: [k1.identity] })).equals(plain)).toBe(true);
      expect((await decrypt(multi.stdout, { identities: [k2.identity] }, [1, 7, 4096])).equals(plain)).toBe(true);
    }
  });

  itAge("a key from generateIdentity + identityFileText works with the age CLI", async () => {
    const k = await generateIdentity();
    const file = join(dir, "ours.txt");
    await writeFile(file, identityFileText(k.identity, k.recipient, new Date()), { mode: 0o600 });
    const y = await exec("age-keygen", ["-y", file]);
    expect(y.code, y.stderr).toBe(0);
    expect(y.stdout.toString().trim()).toBe(k.recipient);
    const plain = randomBytes(123_456);
    const cipher = await encrypt(plain, { recipients: [k.recipient] });
    const r = await exec("age", ["-d", "-i", file], { input: cipher });
    expect(r.code, r.stderr).toBe(0);
    expect(r.stdout.equals(plain)).toBe(true);
  });

  // age reads passphrases only from a terminal; `script` gives it one and forwards our stdin.
  itAgeTty("passphrase files interoperate with `age -p` / `age -d` through a pty", async () => {
    const plain = randomBytes(150_000);
    const pw = "interop passphrase";
    const sh = (s: string): string => `'${s.replace(/'/g, "'\\''")}'`;

    const oursFile = join(dir, "ours-pw.age");
    const outFile = join(dir, "ours-pw.out");
    await writeFile(oursFile, await encrypt(plain, { passphrase: pw, scryptLogN: LOG_N }));
    const d = await exec("script", ["-qec", `age -d -o ${sh(outFile)} ${sh(oursFile)}`, "/dev/null"], { input: `${pw}\n` });
    expect(d.code, d.stdout.toString() + d.stderr).toBe(0);
    expect((await readFile(outFile)).equals(plain)).toBe(true);

    const plainFile = join(dir, "plain.bin");
    const theirsFile = join(dir, "theirs-pw.age");
    await writeFile(plainFile, plain);
    const e = await exec("script", ["-qec", `age -p -o ${sh(theirsFile)} ${sh(plainFile)}`, "/dev/null"], { input: `${pw}\n${pw}\n` });
    expect(e.code, e.stdout.toString() + e.stderr).toBe(0);
    const theirs = await readFile(theirsFile);
    expect(theirs.toString("latin1")).toMatch(/^age-encryption\.org\/v1\n-> scrypt \S+ 18\n/);
    expect((await decrypt(theirs, { passphrases: [pw] })).equals(plain)).toBe(true);
    await expectCode(decrypt(theirs, { passphrases: ["not it"] }), "MEMSNAP_DECRYPT_FAILED");
  });
});

describe("failures", () => {
  const plain = randomBytes(3 * 65536 + 1000); // 4 chunks
  let cipher: Buffer;
  let hlen: number;
  const open = (buf: Buffer, sizes?: number[]): Promise<Buffer> => decrypt(buf, { identities: [alice.identity] }, sizes);

  beforeAll(async () => {
    cipher = await encrypt(plain, { recipients: [alice.recipient] });
    hlen = headerLength(cipher);
  });

  function flip(buf: Buffer, at: number): Buffer {
    const b = Buffer.from(buf);
    b[at]! ^= 0x01;
    return b;
  }

  it("wrong identity → MEMSNAP_DECRYPT_FAILED with a hint", async () => {
    const err = await expectCode(decrypt(cipher, { identities: [bob.identity] }), "MEMSNAP_DECRYPT_FAILED");
    expect((err as { hint?: string }).hint).toMatch(/identity/);
    await expectCode(decrypt(cipher, { passphrases: ["pw"] }), "MEMSNAP_DECRYPT_FAILED");
  });

  it("wrong passphrase, or an identity for a passphrase file → MEMSNAP_DECRYPT_FAILED", async () => {
    const c = await encrypt(Buffer.from("secret"), { passphrase: "right", scryptLogN: LOG_N });
    await expectCode(decrypt(c, { passphrases: ["wrong"] }), "MEMSNAP_DECRYPT_FAILED");
    await expectCode(decrypt(c, { identities: [alice.identity] }), "MEMSNAP_DECRYPT_FAILED");
  });

  it("no identity or passphrase → MEMSNAP_IDENTITY_REQUIRED", async () => {
    await expectCode(decrypt(cipher, {}), "MEMSNAP_IDENTITY_REQUIRED");
    await expectCode(decrypt(cipher, { identities: [], passphrases: [] }), "MEMSNAP_IDENTITY_REQUIRED");
  });

  it("an invalid identity string → MEMSNAP_IDENTITY_INVALID", async () => {
    await expectCode(decrypt(cipher, { identities: [alice.recipient] }), "MEMSNAP_IDENTITY_INVALID");
  });

  it("flipped bits in the header (stanza and MAC) → MEMSNAP_DECRYPT_FAILED", async () => {
    const text = cipher.subarray(0, hlen).toString("latin1");
    const targets = [
      text.indexOf("X25519") + 1, // stanza type
      text.indexOf("X25519") + 10, // ephemeral share
      text.indexOf("\n", text.indexOf("-> ")) + 3, // stanza body
      text.indexOf("--- ") + 8, // MAC
      hlen - 2, // last MAC character
    ];
    for (const at of targets) await expectCode(open(flip(cipher, at)), "MEMSNAP_DECRYPT_FAILED");
  });

  it("a flipped bit in the nonce, the middle of the body, or the last tag → MEMSNAP_DECRYPT_FAILED", async () => {
    for (const at of [hlen, hlen + 16 + 70_000, Math.floor(cipher.length / 2), cipher.length - 1, cipher.length - 16]) {
      await expectCode(open(flip(cipher, at)), "MEMSNAP_DECRYPT_FAILED");
      await expectCode(open(flip(cipher, at), [1000]), "MEMSNAP_DECRYPT_FAILED");
    }
  });

  it("no plaintext is released from a chunk that fails authentication", async () => {
    const damaged = flip(cipher, hlen + 16 + 65552 + 10); // second chunk
    const got: Buffer[] = [];
    await expect(
      pipeline(
        Readable.from([damaged]),
        createAgeDecryptor({ identities: [alice.identity] }),
        new Writable({
          write(c: Buffer, _e, cb) {
            got.push(c);
            cb();
          },
        }),
      ),
    ).rejects.toMatchObject({ code: "MEMSNAP_DECRYPT_FAILED" });
    expect(Buffer.concat(got).length).toBeLessThanOrEqual(CHUNK);
  });

  it("truncation anywhere → MEMSNAP_DECRYPT_FAILED", async () => {
    const sealed = CHUNK + 16;
    const cuts = [
      0, // empty
      5, // inside the magic
      AGE_MAGIC.length + 3, // inside the stanzas
      hlen - 1, // inside the MAC line
      hlen, // right after the header
      hlen + 8, // inside the nonce
      hlen + 16, // right after the nonce
      hlen + 16 + 10, // inside the first chunk, less than a tag
      hlen + 16 + 1000, // inside a chunk
      hlen + 16 + sealed, // chunk boundary
      hlen + 16 + 2 * sealed, // chunk boundary
      hlen + 16 + 3 * sealed, // chunk boundary before the short final chunk
      cipher.length - 1, // last byte missing
    ];
    for (const cut of cuts) {
      const err = await expectCode(open(cipher.subarray(0, cut)), "MEMSNAP_DECRYPT_FAILED");
      await expectCode(open(cipher.subarray(0, cut), [7]), "MEMSNAP_DECRYPT_FAILED");
      if (cut === hlen + 16 + sealed) expect(err.message).toMatch(/truncated/);
    }
  });

  it("a file of whole chunks cut at a chunk boundary is rejected (final flag missing)", async () => {
    const p = randomBytes(3 * CHUNK);
    const c = await encrypt(p, { recipients: [alice.recipient] });
    const h = headerLength(c);
    expect((await open(c)).equals(p)).toBe(true);
    const err = await expectCode(open(c.subarray(0, h + 16 + 2 * (CHUNK + 16))), "MEMSNAP_DECRYPT_FAILED");
    expect(err.message).toMatch(/not marked final/);
  });

  it("trailing garbage → MEMSNAP_DECRYPT_FAILED", async () => {
    for (const extra of [Buffer.from([0]), randomBytes(100), randomBytes(CHUNK + 16), randomBytes(CHUNK + 17)]) {
      await expectCode(open(Buffer.concat([cipher, extra])), "MEMSNAP_DECRYPT_FAILED");
    }
    // a final full chunk followed by more data
    const full = await encrypt(randomBytes(CHUNK), { recipients: [alice.recipient] });
    const err = await expectCode(open(Buffer.concat([full, Buffer.from("x")])), "MEMSNAP_DECRYPT_FAILED");
    expect(err.message).toMatch(/trailing/);
  });

  it("an empty final chunk after a full chunk is rejected", async () => {
    // Build header + STREAM by hand with a captured file key: one full non-final chunk, then an empty final one.
    let fileKey: Uint8Array | undefined;
    const e = new Encrypter();
    e.addRecipient(alice.recipient);
    e.addRecipient({
      wrapFileKey(k: Uint8Array): Stanza[] {
        fileKey = Uint8Array.from(k);
        return [];
      },
    });
    const empty = Buffer.from(await e.encrypt(new Uint8Array(0)));
    const header = empty.subarray(0, empty.length - 32);
    const nonce = randomBytes(16);
    const key = Buffer.from(hkdfSync("sha256", fileKey!, nonce, "payload", 32));
    const seal = (pt: Buffer, counter: number, last: boolean): Buffer => {
      const n = Buffer.alloc(12);
      n.writeUIntBE(counter, 5, 6);
      n[11] = last ? 1 : 0;
      const c = createCipheriv("chacha20-poly1305", key, n, { authTagLength: 16 });
      return Buffer.concat([c.update(pt), c.final(), c.getAuthTag()]);
    };
    const p = randomBytes(CHUNK);
    const good = Buffer.concat([header, nonce, seal(p, 0, true)]);
    expect((await open(good)).equals(p)).toBe(true);
    const bad = Buffer.concat([header, nonce, seal(p, 0, false), seal(Buffer.alloc(0), 1, true)]);
    await expectCode(open(bad), "MEMSNAP_DECRYPT_FAILED");
  });

  it("a header without an end within 64 KiB → MEMSNAP_DECRYPT_FAILED", async () => {
    const junk = Buffer.concat([AGE_MAGIC, Buffer.from("-> X25519 " + "A".repeat(70_000) + "\n")]);
    await expectCode(open(junk), "MEMSNAP_DECRYPT_FAILED");
    await expectCode(open(junk, [4096]), "MEMSNAP_DECRYPT_FAILED");
  });

  it("zstd, armored age, or other plaintext → MEMSNAP_PAYLOAD_MISLABELED (before identity checks)", async () => {
    const zstd = Buffer.concat([Buffer.from([0x28, 0xb5, 0x2f, 0xfd]), randomBytes(200)]);
    await expectCode(open(zstd), "MEMSNAP_PAYLOAD_MISLABELED");
    await expectCode(open(zstd, [1]), "MEMSNAP_PAYLOAD_MISLABELED");
    await expectCode(decrypt(zstd, {}), "MEMSNAP_PAYLOAD_MISLABELED");
    await expectCode(open(Buffer.from([0x28, 0xb5])), "MEMSNAP_PAYLOAD_MISLABELED");
    await expectCode(open(Buffer.from("-----BEGIN AGE ENCRYPTED FILE-----\nYWdl\n-----END AGE ENCRYPTED FILE-----\n")), "MEMSNAP_PAYLOAD_MISLABELED");
    await expectCode(open(Buffer.from("age-encryption.org/v2\n-> x\n")), "MEMSNAP_PAYLOAD_MISLABELED");
  });
});

describe("header opening (node:crypto, age v1 grammar)", () => {
  const plain = Buffer.from("the header is opened without typage\n".repeat(100));
  let cipher: Buffer;
  let hlen: number;

  beforeAll(async () => {
    cipher = await encrypt(plain, { recipients: [alice.recipient, bob.recipient] });
    hlen = headerLength(cipher);
  });

  /** `cipher` with its header text rewritten by `edit` (the MAC left as it was). */
  function rewrite(edit: (header: string) => string): Buffer {
    const header = cipher.subarray(0, hlen).toString("latin1");
    return Buffer.concat([Buffer.from(edit(header), "latin1"), cipher.subarray(hlen)]);
  }

  const message = async (p: Promise<unknown>): Promise<string> => (await expectCode(p, "MEMSNAP_DECRYPT_FAILED")).message;

  it("opens a header with several X25519 stanzas with either identity, and skips stanzas of unknown types", async () => {
    expect((await decrypt(cipher, { identities: [bob.identity] })).equals(plain)).toBe(true);
    expect((await decrypt(cipher, { identities: [bob.identity, alice.identity] })).equals(plain)).toBe(true);
    // An unknown stanza type changes the MAC'd bytes: the MAC check (not the parser) must be what refuses it.
    const withUnknown = rewrite((h) => h.replace("-> X25519", "-> some-plugin-type arg\nAAAA\n-> X25519"));
    expect(await message(decrypt(withUnknown, { identities: [alice.identity] }))).toMatch(/MAC does not verify/);
  });

  it("refuses malformed headers with a message that says so", async () => {
    const bodyLine = (h: string): string => h.split("\n")[2]!;
    const cases: [string, (h: string) => string][] = [
      ["padded base64 body", (h) => h.replace(bodyLine(h), `${bodyLine(h)}=`)],
      ["body line longer than 64 columns", (h) => h.replace(bodyLine(h), `${bodyLine(h)}${"A".repeat(70)}`)],
      ["no stanza", (h) => `age-encryption.org/v1\n${h.slice(h.indexOf("--- "))}`],
      ["short MAC", (h) => h.replace(/--- (\S+)/, (_m, mac: string) => `--- ${mac.slice(0, 40)}`)],
      ["empty argument", (h) => h.replace("-> X25519 ", "-> X25519  ")],
      ["X25519 share of 31 bytes", (h) => h.replace(/-> X25519 (\S+)/, (_m, s: string) => `-> X25519 ${Buffer.from(s, "base64").subarray(0, 31).toString("base64").replace(/=+$/, "")}`)],
    ];
    for (const [name, edit] of cases) {
      expect(await message(decrypt(rewrite(edit), { identities: [alice.identity] })), name).toMatch(/malformed/);
    }
  });

  it("an scrypt stanza beside another stanza is refused", async () => {
    const pw = await encrypt(plain, { passphrase: "pw", scryptLogN: LOG_N });
    const pwHeader = pw.subarray(0, headerLength(pw)).toString("latin1");
    const scryptStanza = pwHeader.slice(pwHeader.indexOf("-> scrypt"), pwHeader.indexOf("--- "));
    const mixed = rewrite((h) => h.replace("-> X25519", `${scryptStanza}-> X25519`));
    expect(await message(decrypt(mixed, { passphrases: ["pw"] }))).toMatch(/malformed: an scrypt stanza must be the only one/);
  });

  it("a low-order X25519 share is refused", async () => {
    const zeroShare = rewrite((h) => h.replace(/-> X25519 (\S+)/, `-> X25519 ${"A".repeat(43)}`));
    expect(await message(decrypt(zeroShare, { identities: [alice.identity] }))).toMatch(/low-order/);
  });

  itWithTools(["age"])("the age CLI opens what we encrypt to two recipients, with the second identity", async () => {
    const dir = await mkdtemp(join(tmpdir(), "memsnap-age-hdr-"));
    try {
      await writeFile(join(dir, "c.age"), cipher);
      await writeFile(join(dir, "bob.txt"), `${bob.identity}\n`);
      const d = await exec("age", ["-d", "-i", join(dir, "bob.txt"), join(dir, "c.age")]);
      expect(d.code, d.stderr.toString()).toBe(0);
      expect(d.stdout.equals(plain)).toBe(true);
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });
});
