/**
 * Interop with stock tools, both directions.
 *
 *  memsnap → tools: GNU tar lists exactly the two members and extracts the manifest; the
 *  payload unpacks with `zstd -d | tar`, and an encrypted one with `age -d -i key | zstd -d | tar`
 *  into the source files byte for byte; the manifest's hashes match what the tools see.
 *
 *  tools → memsnap: a container re-packed by GNU tar, a payload recompressed by the zstd CLI,
 *  and a payload re-encrypted by the age CLI (manifest updated and resealed) all verify and
 *  restore; identities and recipients made by age-keygen work with memsnap, and memsnap's
 *  keygen identities work with age.
 */
import { spawnSync } from "node:child_process";
import { randomBytes } from "node:crypto";
import { mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { beforeAll, describe, expect, it } from "vitest";
import {
  expectOk, jsonOut, makeAgent, readBundle, recipientOf, reseal, runCli, sha256, tempDir, treeHashes, writeBundle,
  type Agent,
} from "../helpers/cli.js";
import { requireTool } from "../helpers/tools.js";

let a: Agent;
let key: string;
let plain: string;
let enc: string;

const FILES = {
  "MEMORY.md": "# Memory\n",
  "notes/ünï cødé.md": "unicode and a space\n",
  "notes/empty.md": "",
  "x/y/z.bin": Buffer.from(Array.from({ length: 70_000 }, (_, i) => (i * 31) & 0xff)),
  // Past ustar's 100-byte name: split into prefix/name at a "/" …
  [`deep/${"d".repeat(60)}/${"e".repeat(60)}/${"f".repeat(60)}/note.md`]: "a long path\n",
  // … and a component no split can fit, which needs a PAX header (non-ASCII too).
  [`long/${"ü".repeat(70)}-${"n".repeat(40)}.md`]: "a PAX path\n",
  // Dense bytes (zstd -1 keeps > 60 % of them) between text: the payload switches levels,
  // which ends a zstd frame and opens another.
  "dense/random.bin": randomBytes(512 * 1024),
  "dense/after.md": "text after the dense file\n".repeat(200),
};

beforeAll(async () => {
  a = makeAgent({ files: FILES });
  const k = await runCli(["keygen", "-o", "key.txt"], { cwd: a.dir });
  expectOk(k);
  key = join(a.dir, "key.txt");
  plain = join(a.dir, "plain.memsnap");
  enc = join(a.dir, "enc.memsnap");
  expectOk(await runCli(["snapshot", "-c", a.config, "-o", plain], { cwd: a.dir }));
  expectOk(await runCli(["snapshot", "-c", a.config, "-o", enc, "-r", k.stdout.trim()], { cwd: a.dir }));
});

/** Run a shell pipeline; returns stdout as a Buffer and asserts success. */
function sh(cmd: string, cwd = a.dir): Buffer {
  const r = spawnSync("sh", ["-c", `set -e; ${cmd}`], { cwd, maxBuffer: 64 << 20 });
  expect(r.status, `${cmd}\n${r.stderr?.toString()}`).toBe(0);
  return r.stdout;
}

/** The source files as they appear in the payload (`<layer>/<path>` → sha256). */
function sourceHashes(): Record<string, string> {
  const want: Record<string, string> = {};
  for (const [rel, h] of Object.entries(treeHashes(a.memoryDir))) want[`memory/${rel}`] = h;
  for (const [rel, h] of Object.entries(treeHashes(a.stateDir))) want[`state/${rel}`] = h;
  return want;
}

describe("memsnap bundles read by stock tools", () => {
  it("tar -tf lists exactly the two members, payload first", (ctx) => {
    requireTool("tar", ctx);
    expect(sh(`tar -tf "${plain}"`).toString()).toBe("payload.tar.zst\nmanifest.json\n");
    expect(sh(`tar -tf "${enc}"`).toString()).toBe("payload.tar.zst.age\nmanifest.json\n");
  });

  it("tar -xOf B manifest.json is the manifest, and its payload hash is the member's sha256", (ctx) => {
    requireTool("tar", ctx);
    for (const b of [plain, enc]) {
      const m = sh(`tar -xOf "${b}" manifest.json`);
      expect(m.equals(readBundle(b).manifestBytes)).toBe(true);
      const j = JSON.parse(m.toString("utf8"));
      expect(j.format).toBe("memsnap");
      expect(reseal(j).seal).toBe(j.seal);
      const member = b === plain ? "payload.tar.zst" : "payload.tar.zst.age";
      const payload = sh(`tar -xOf "${b}" ${member}`);
      expect(payload.length).toBe(j.payload.stored_size);
      expect(sha256(payload)).toBe(j.payload.sha256);
    }
  });

  it("tar -xOf B payload.tar.zst | zstd -d | tar -t lists the artifacts and the index, last", (ctx) => {
    requireTool(["tar", "zstd"], ctx);
    const names = sh(`tar -xOf "${plain}" payload.tar.zst | zstd -d | tar -t`).toString("utf8").trim().split("\n");
    expect(names.at(-1)).toBe(".memsnap/index.json");
    expect(names.slice(0, -1).sort()).toEqual(Object.keys(sourceHashes()).sort());
    const tarSize = sh(`tar -xOf "${plain}" payload.tar.zst | zstd -d | wc -c`).toString().trim();
    expect(Number(tarSize)).toBe(readBundle(plain).manifest.payload.tar_size);
  });

  it("the payload is several concatenated zstd frames (a level change per class of bytes), which zstd -l counts", (ctx) => {
    requireTool(["tar", "zstd"], ctx);
    const d = tempDir();
    sh(`tar -xOf "${plain}" payload.tar.zst > "${d}/p.zst"`);
    const list = sh(`zstd -l "${d}/p.zst"`).toString();
    const frames = Number(list.trim().split("\n")[1]!.trim().split(/\s+/)[0]);
    expect(frames).toBeGreaterThanOrEqual(2);
    expect(readBundle(plain).manifest.payload.compression.level).toBe(3);
  });

  it("… | zstd -d | tar -x reproduces the files byte for byte; the index hashes to index_sha256", (ctx) => {
    requireTool(["tar", "zstd"], ctx);
    const out = tempDir();
    sh(`tar -xOf "${plain}" payload.tar.zst | zstd -d | tar -x -C "${out}"`);
    const got = treeHashes(out, (rel) => rel.startsWith(".memsnap/"));
    expect(got).toEqual(sourceHashes());
    const idx = readFileSync(join(out, ".memsnap", "index.json"));
    const m = readBundle(plain).manifest;
    expect(sha256(idx)).toBe(m.payload.index_sha256);
    expect(JSON.parse(idx.toString()).artifacts).toEqual(m.index);
  });

  it("encrypted: tar -xOf B payload.tar.zst.age | age -d -i key | zstd -d | tar -x reproduces the files byte for byte", (ctx) => {
    requireTool(["tar", "zstd", "age"], ctx);
    const out = tempDir();
    sh(`tar -xOf "${enc}" payload.tar.zst.age | age -d -i "${key}" | zstd -d | tar -x -C "${out}"`);
    expect(treeHashes(out, (rel) => rel.startsWith(".memsnap/"))).toEqual(sourceHashes());
    const idx = readFileSync(join(out, ".memsnap", "index.json"));
    expect(sha256(idx)).toBe(readBundle(enc).manifest.payload.index_sha256);
  });
});

describe("bundles made or changed by stock tools, read by memsnap", () => {
  it("a container re-packed by GNU tar (ustar, 10 KiB records) verifies and restores", async (ctx) => {
    requireTool("tar", ctx);
    for (const [b, member] of [[plain, "payload.tar.zst"], [enc, "payload.tar.zst.age"]] as const) {
      const d = tempDir();
      sh(`tar -xf "${b}" && tar --format=ustar -cf repacked.memsnap ${member} manifest.json`, d);
      const size = readFileSync(join(d, "repacked.memsnap")).length;
      expect(size % 10240).toBe(0); // GNU tar's record padding: trailing zeros memsnap accepts
      expectOk(await runCli(["verify", "repacked.memsnap", "-i", key], { cwd: d }));
      expectOk(await runCli(["restore", "repacked.memsnap", "--to", "out", "-i", key], { cwd: d }));
      expect(treeHashes(join(d, "out"), (rel) => rel.startsWith(".memsnap/"))).toEqual(sourceHashes());
    }
  });

  it("a payload recompressed by the zstd CLI (-19), manifest updated and resealed, verifies and restores", async (ctx) => {
    requireTool(["tar", "zstd"], ctx);
    const d = tempDir();
    const x = readBundle(plain);
    writeFileSync(join(d, "p.zst"), x.payload);
    const payload = sh("zstd -d -c p.zst | zstd -q -19 -c", d);
    expect(payload.equals(x.payload)).toBe(false);
    const m = reseal({ ...x.manifest, payload: { ...x.manifest.payload, sha256: sha256(payload), stored_size: payload.length, compression: { codec: "zstd", level: 19 } } });
    writeBundle(join(d, "re.memsnap"), "payload.tar.zst", payload, m);
    const v = await runCli(["--json", "verify", "re.memsnap"], { cwd: d });
    expectOk(v);
    expect(jsonOut(v).checks.filter((c: { name: string; status: string }) => c.name !== "signature" && c.status !== "passed")).toEqual([]);
    expectOk(await runCli(["restore", "re.memsnap", "--to", "out"], { cwd: d }));
    expect(treeHashes(join(d, "out"), (rel) => rel.startsWith(".memsnap/"))).toEqual(sourceHashes());
  });

  it("a payload re-encrypted by the age CLI to an age-keygen key verifies and restores with that key", async (ctx) => {
    requireTool(["age", "age-keygen"], ctx);
    const d = tempDir();
    sh("age-keygen -o ak.txt 2>/dev/null", d);
    const rcpt = sh("age-keygen -y ak.txt", d).toString().trim();
    expect(rcpt).toMatch(/^age1/);
    const x = readBundle(enc);
    writeFileSync(join(d, "p.age"), x.payload);
    const payload = sh(`age -d -i "${key}" p.age | age -r ${rcpt}`, d);
    const m = reseal({ ...x.manifest, payload: { ...x.manifest.payload, sha256: sha256(payload), stored_size: payload.length } });
    writeBundle(join(d, "re.memsnap"), "payload.tar.zst.age", payload, m);
    expectOk(await runCli(["verify", "re.memsnap"], { cwd: d }));
    expectOk(await runCli(["verify", "re.memsnap", "-i", "ak.txt"], { cwd: d }));
    expectOk(await runCli(["restore", "re.memsnap", "--to", "out", "-i", "ak.txt"], { cwd: d }));
    expect(treeHashes(join(d, "out"), (rel) => rel.startsWith(".memsnap/"))).toEqual(sourceHashes());
  });

  it("memsnap encrypts to an age-keygen recipients file; age -d opens it with the age-keygen identity", async (ctx) => {
    requireTool(["tar", "zstd", "age", "age-keygen"], ctx);
    const d = tempDir();
    sh("age-keygen -o ak.txt 2>/dev/null && age-keygen -y ak.txt > recipients.txt", d);
    expectOk(await runCli(["snapshot", "-c", a.config, "-o", "b.memsnap", "-R", "recipients.txt"], { cwd: d }));
    mkdirSync(join(d, "x"));
    sh(`tar -xOf b.memsnap payload.tar.zst.age | age -d -i ak.txt | zstd -d | tar -x -C x`, d);
    expect(treeHashes(join(d, "x"), (rel) => rel.startsWith(".memsnap/"))).toEqual(sourceHashes());
    expectOk(await runCli(["restore", "b.memsnap", "--to", "out", "-i", "ak.txt"], { cwd: d }));
    // and memsnap keygen's identity file is one age reads
    expect(recipientOf(key)).toBe(sh(`age-keygen -y "${key}"`).toString().trim());
  });
});
