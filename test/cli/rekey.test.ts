/**
 * `memsnap rekey` through the CLI with real age-keygen keys, real snapshots and the real `age`
 * binary: the rekeyed payload opens with `age -d -i NEW` alone and not with a removed key; only
 * the header changed (the STREAM body is the same bytes); the manifest is sealed again and
 * verifies deep; passphrase change; --sign-key re-signs (verify --trust), a signature not made
 * again is dropped with a warning; a store-wide rekey of an incremental chain updates the bases'
 * seals and restores; a base alone is refused; without the old key, or on a plaintext bundle,
 * nothing changes; a write that fails leaves the original byte for byte and no temp file.
 */
import { spawnSync } from "node:child_process";
import { randomBytes } from "node:crypto";
import { appendFileSync, copyFileSync, mkdirSync, readdirSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { beforeAll, describe, expect, it } from "vitest";
import {
  expectCliError, expectOk, jsonOut, makeAgent, readBundle, reseal, runCliSync, sha256, tempDir, treeHashes, writeBundle, type Agent,
} from "../helpers/cli.js";
import { requireTool } from "../helpers/tools.js";

let a: Agent;
let keys: string;
const key = (n: string): string => join(keys, `${n}.key`);
const pub = (n: string): string => {
  const r = spawnSync("age-keygen", ["-y", key(n)], { encoding: "utf8" });
  expect(r.status, r.stderr).toBe(0);
  return r.stdout.trim();
};
const cli = (args: string[], opts: Parameters<typeof runCliSync>[1] = {}) => runCliSync(args, { cwd: a.dir, ...opts });

/** Run a shell pipeline in the agent dir; returns its exit status and output. */
function sh(cmd: string): { status: number | null; stdout: Buffer; stderr: string } {
  const r = spawnSync("bash", ["-c", `set -e -o pipefail; ${cmd}`], { cwd: a.dir, maxBuffer: 64 << 20 });
  return { status: r.status, stdout: r.stdout, stderr: r.stderr.toString() };
}

/** The file names `tar -t` lists in the payload of `bundle`, decrypted by the real age with `keyFile`. */
function listWithAge(bundle: string, keyFile: string): string[] {
  const r = sh(`tar -xOf "${bundle}" payload.tar.zst.age | age -d -i "${keyFile}" | zstd -d | tar -t`);
  expect(r.status, r.stderr).toBe(0);
  return r.stdout.toString().trim().split("\n").sort();
}
function ageOpens(bundle: string, keyFile: string): boolean {
  return sh(`tar -xOf "${bundle}" payload.tar.zst.age | age -d -i "${keyFile}" > /dev/null`).status === 0;
}

/** A fresh encrypted bundle of the agent (to -r recipients, or a passphrase file). */
function snapshot(name: string, args: string[]): string {
  const out = join(a.dir, `${name}.memsnap`);
  expectOk(cli(["snapshot", "-c", a.config, "-o", out, ...args]));
  return out;
}

/** The bytes after the age header: the 16-byte nonce and every STREAM chunk. */
function ageBody(bundle: string): Buffer {
  const p = readBundle(bundle).payload;
  const end = p.indexOf("\n--- ");
  return p.subarray(p.indexOf(0x0a, end + 5) + 1);
}

beforeAll(() => {
  a = makeAgent({ files: { "MEMORY.md": "# Memory\n", "notes/n1.md": "one\n".repeat(30_000), "notes/n2.md": "two\n" } });
  keys = tempDir("memsnap-rekey-keys-");
  for (const n of ["old", "new", "other"]) {
    const r = spawnSync("age-keygen", ["-o", key(n)], { encoding: "utf8" });
    if (r.error) return; // no age-keygen: the tests skip through requireTool
    expect(r.status, r.stderr).toBe(0);
  }
  writeFileSync(join(keys, "old.pass"), "correct horse battery staple\n");
  writeFileSync(join(keys, "new.pass"), "a much longer new passphrase of mine\n");
  expectOk(runCliSync(["keygen", "--sign", "-o", join(keys, "sign.key")], { cwd: keys }));
});

describe("memsnap rekey", () => {
  it("replaces a recipient: the real age opens it with the new key alone, not the old; only the header changed; verify --deep and restore pass", (ctx) => {
    requireTool(["age", "age-keygen", "zstd", "tar"], ctx);
    const b = snapshot("swap", ["-r", pub("old")]);
    const before = readBundle(b);
    const body = ageBody(b);
    const r = cli(["rekey", b, "-i", key("old"), "-r", pub("new"), "--remove-recipient", pub("old"), "--json"]);
    expectOk(r);
    const j = jsonOut(r);
    expect(j.bundles).toHaveLength(1);
    expect(j.bundles[0].recipients).toHaveLength(1);
    expect(j.bundles[0].removed).toHaveLength(1);
    expect(j.bundles[0].added).toHaveLength(1);

    expect(listWithAge(b, key("new"))).toContain("memory/notes/n1.md");
    expect(ageOpens(b, key("old"))).toBe(false);
    // The payload was not encrypted again: nonce and chunks are the same bytes.
    expect(ageBody(b).equals(body)).toBe(true);
    expect(readBundle(b).payload.equals(before.payload)).toBe(false);

    const m = readBundle(b).manifest;
    expect(m.payload.stored_size).toBe(readBundle(b).payload.length);
    expect(m.payload.encryption.recipients).toEqual([{ type: "x25519", fingerprint: j.bundles[0].added[0] }]);
    expect(m.snapshot_id).toBe(before.manifest.snapshot_id);
    expect(m.seal).not.toBe(before.manifest.seal);

    expectOk(cli(["verify", b, "--deep", "-i", key("new")]));
    const old = cli(["verify", b, "--deep", "-i", key("old")]);
    expect(old.code).not.toBe(0);
    const to = join(tempDir(), "out");
    expectOk(cli(["restore", b, "--to", to, "-i", key("new")]));
    expect(treeHashes(join(to, "memory"))).toEqual(treeHashes(a.memoryDir));
  });

  it("adds a recipient and keeps the old one; then removes the old by its fingerprint", (ctx) => {
    requireTool(["age", "age-keygen", "zstd", "tar"], ctx);
    const b = snapshot("add", ["-r", pub("old")]);
    expectOk(cli(["rekey", b, "-i", key("old"), "-r", pub("other")]));
    expect(ageOpens(b, key("old"))).toBe(true);
    expect(ageOpens(b, key("other"))).toBe(true);
    expect(ageOpens(b, key("new"))).toBe(false);
    const fps = readBundle(b).manifest.payload.encryption.recipients.map((x: { fingerprint: string }) => x.fingerprint);
    expect(fps).toHaveLength(2);
    // Remove the old one by the fingerprint the manifest shows, opening with the other key.
    const r = cli(["rekey", b, "-i", key("other"), "--remove-recipient", fps[0]]);
    expectOk(r);
    expect(r.stdout).toContain("1 recipient(s)");
    expect(ageOpens(b, key("old"))).toBe(false);
    expect(ageOpens(b, key("other"))).toBe(true);
    expectOk(cli(["verify", b, "--deep", "-i", key("other")]));
    // Removing a recipient that is not one, or the last one, is refused.
    expectCliError(cli(["rekey", b, "-i", key("other"), "--remove-recipient", pub("new")]), 2, "MEMSNAP_USAGE");
    expectCliError(cli(["rekey", b, "-i", key("other"), "--remove-recipient", pub("other")]), 2, "MEMSNAP_USAGE");
  });

  it("a header written by the age CLI: stanzas line up with the manifest's recipients, or removal refuses and --replace works", (ctx) => {
    requireTool(["age", "age-keygen", "zstd", "tar"], ctx);
    const b = snapshot("agecli", ["-r", pub("old")]);
    const parts = readBundle(b);
    writeFileSync(join(a.dir, "agecli.age"), parts.payload);
    const twice = sh(`age -d -i "${key("old")}" agecli.age | age -r ${pub("old")} -r ${pub("other")}`);
    expect(twice.status, twice.stderr).toBe(0);
    const fp = (n: string) => ({ type: "x25519", fingerprint: `sha256:${sha256(pub(n)).slice(0, 16)}` });
    const rewrite = (recipients: object[]) => writeBundle(b, "payload.tar.zst.age", twice.stdout, reseal({
      ...parts.manifest, payload: { ...parts.manifest.payload, stored_size: twice.stdout.length, sha256: sha256(twice.stdout), encryption: { scheme: "age", recipients } },
    }));
    // Listed in stanza order: the other recipient's stanza is dropped, the old one's kept.
    rewrite([fp("old"), fp("other")]);
    expectOk(cli(["verify", b, "-i", key("other")]));
    expectOk(cli(["rekey", b, "-i", key("old"), "--remove-recipient", pub("other")]));
    expect(ageOpens(b, key("old"))).toBe(true);
    expect(ageOpens(b, key("other"))).toBe(false);
    expectOk(cli(["verify", b, "--deep", "-i", key("old")]));
    // Listed otherwise (one recipient for two stanzas): which stanza is whose is unknown.
    rewrite([fp("old")]);
    const bytes = readFileSync(b);
    const r = cli(["rekey", b, "-i", key("old"), "--remove-recipient", pub("other")]);
    expectCliError(r, 2, "MEMSNAP_USAGE");
    expect(r.stderr).toContain("--replace");
    expect(readFileSync(b).equals(bytes)).toBe(true);
    expectOk(cli(["rekey", b, "-i", key("old"), "--replace", "-r", pub("new")]));
    expect(listWithAge(b, key("new"))).toContain("memory/MEMORY.md");
    expect(ageOpens(b, key("old"))).toBe(false);
    expect(ageOpens(b, key("other"))).toBe(false);
  });

  it("changes a passphrase: the new one opens it, the old one does not", (ctx) => {
    requireTool(["age", "zstd", "tar"], ctx);
    const b = snapshot("pass", ["--passphrase-file", join(keys, "old.pass")]);
    const body = ageBody(b);
    expectOk(cli(["rekey", b, "--passphrase-file", join(keys, "old.pass"), "--new-passphrase-file", join(keys, "new.pass")]));
    expect(ageBody(b).equals(body)).toBe(true);
    expectOk(cli(["verify", b, "--deep", "--passphrase-file", join(keys, "new.pass")]));
    const old = cli(["verify", b, "--deep", "--passphrase-file", join(keys, "old.pass")]);
    expect(old.code).toBe(4);
    expect(readBundle(b).manifest.payload.encryption.recipients).toEqual([{ type: "scrypt" }]);
    // From a passphrase to a recipient: the real age opens it with the key.
    expectOk(cli(["rekey", b, "--passphrase-file", join(keys, "new.pass"), "-r", pub("new")]));
    expect(listWithAge(b, key("new"))).toContain("memory/MEMORY.md");
  });

  it("--sign-key signs the new manifest (verify --trust); without it a signature is dropped with a warning", (ctx) => {
    requireTool(["age-keygen"], ctx);
    const b = snapshot("signed", ["-r", pub("old"), "--sign-key", join(keys, "sign.key")]);
    expectOk(cli(["verify", b, "--trust", join(keys, "sign.key.pub")]));
    expectOk(cli(["rekey", b, "-i", key("old"), "-r", pub("new"), "--sign-key", join(keys, "sign.key")]));
    expectOk(cli(["verify", b, "--deep", "-i", key("new"), "--trust", join(keys, "sign.key.pub")]));
    const r = cli(["rekey", b, "-i", key("new"), "-r", pub("other")]);
    expectOk(r);
    expect(r.stderr).toMatch(/warning: .*signature was removed/);
    expect(readBundle(b).manifest.signature).toBeUndefined();
    expectOk(cli(["verify", b, "-i", key("other")]));
    expect(cli(["verify", b, "--trust", join(keys, "sign.key.pub")]).code).not.toBe(0);
  });

  it("refuses without the old key, with a wrong key, and on a plaintext bundle, changing nothing", (ctx) => {
    requireTool(["age-keygen"], ctx);
    const b = snapshot("refuse", ["-r", pub("old")]);
    const plain = join(a.dir, "plain.memsnap");
    expectOk(cli(["snapshot", "-c", a.config, "-o", plain]));
    const bytes = readFileSync(b);
    const plainBytes = readFileSync(plain);
    expectCliError(cli(["rekey", b, "-r", pub("new")]), 4, "MEMSNAP_IDENTITY_REQUIRED");
    expectCliError(cli(["rekey", b, "-i", key("other"), "-r", pub("new")]), 4, "MEMSNAP_DECRYPT_FAILED");
    expectCliError(cli(["rekey", plain, "-i", key("old"), "-r", pub("new")]), 2, "MEMSNAP_USAGE");
    expectCliError(cli(["rekey", b, "-i", key("old")]), 2, "MEMSNAP_USAGE"); // nothing to change
    const dry = cli(["rekey", b, "-i", key("old"), "-r", pub("new"), "--dry-run"]);
    expectOk(dry);
    expect(dry.stdout).toContain("would rekey");
    expect(readFileSync(b).equals(bytes)).toBe(true);
    expect(readFileSync(plain).equals(plainBytes)).toBe(true);
    expect(readdirSync(a.dir).filter((n) => n.includes(".tmp-"))).toEqual([]);
  });

  it("a write that fails leaves the original byte for byte and no temp file", (ctx) => {
    requireTool(["age-keygen"], ctx);
    const dir = tempDir();
    const b = join(dir, "big.memsnap");
    copyFileSync(snapshot("big", ["-r", pub("old")]), b);
    const bytes = readFileSync(b);
    // Under `ulimit -f` smaller than the bundle, writing the temp file fails (EFBIG).
    const r = runCliSync(["rekey", b, "-i", key("old"), "-r", pub("new")], { cwd: dir, fileSizeLimitKiB: Math.floor(bytes.length / 1024 / 2) });
    expect(r.code).not.toBe(0);
    expect(r.stderr).toMatch(/MEMSNAP_DEST_/);
    expect(readFileSync(b).equals(bytes)).toBe(true);
    expect(readdirSync(dir)).toEqual(["big.memsnap"]);
  });
});

describe("memsnap rekey over a store with an incremental chain", () => {
  let store: string;
  let cfg: string;
  let ids: string[];
  let plainId: string;

  beforeAll(() => {
    if (!requireTool(["age-keygen"])) return;
    const w = tempDir("memsnap-rekey-store-");
    store = join(w, "store");
    mkdirSync(join(w, "memory"));
    for (let i = 0; i < 10; i++) writeFileSync(join(w, "memory", `n${i}.md`), `note ${i}\n`.repeat(200));
    cfg = join(w, "memsnap.json");
    writeFileSync(cfg, JSON.stringify({ agent: "chain", store, recipients: [pub("old")], sources: [{ kind: "files", name: "memory", path: "memory" }] }));
    ids = [];
    for (let i = 0; i < 3; i++) {
      appendFileSync(join(w, "memory", "n0.md"), `change ${i}\n`);
      // The last one is the largest bundle of the chain (for the failing-write test).
      if (i === 2) writeFileSync(join(w, "memory", "big.bin"), randomBytes(400_000));
      const r = runCliSync(["snapshot", "-c", cfg, "--incremental", "--json"], { cwd: w });
      expectOk(r);
      ids.push(jsonOut(r).id);
    }
    // A plaintext bundle of the same agent, and another agent encrypted to another key.
    const p = runCliSync(["snapshot", "-c", cfg, "--no-encrypt", "--json"], { cwd: w });
    expectOk(p);
    plainId = jsonOut(p).id;
    const cfg2 = join(w, "second.json");
    writeFileSync(cfg2, JSON.stringify({ agent: "second", store, recipients: [pub("other")], sources: [{ kind: "files", name: "memory", path: "memory" }] }));
    expectOk(runCliSync(["snapshot", "-c", cfg2], { cwd: w }));
  });

  it("refuses a base alone, naming the bundles that reference it", (ctx) => {
    requireTool(["age-keygen"], ctx);
    const path = join(store, "default", "chain", `${ids[0]}.memsnap`);
    const bytes = readFileSync(path);
    const r = runCliSync(["rekey", ids[0]!, "--store", store, "-i", key("old"), "-r", pub("new")]);
    expectCliError(r, 2, "MEMSNAP_USAGE");
    expect(r.stderr).toContain(ids[1]);
    expect(readFileSync(path).equals(bytes)).toBe(true);
    // The last one alone is allowed, with a warning that its bases keep their keys.
    const last = runCliSync(["rekey", ids[2]!, "--store", store, "-i", key("old"), "-r", pub("new"), "--dry-run"]);
    expectOk(last);
    expect(last.stderr).toMatch(/warning: .* which keep their old keys/);
    expect(last.stdout).toContain(`would rekey ${ids[2]}`);
  });

  it("a write that fails on the last bundle of a chain leaves every bundle of it as it was, and no temp file", (ctx) => {
    requireTool(["age-keygen"], ctx);
    const dir = join(store, "default", "chain");
    const files = ids.map((id) => join(dir, `${id}.memsnap`));
    const bytes = files.map((f) => readFileSync(f));
    const sizes = bytes.map((b) => b.length);
    expect(sizes[2]).toBeGreaterThan(Math.max(sizes[0]!, sizes[1]!) + 4096);
    const limitKiB = Math.ceil((Math.max(sizes[0]!, sizes[1]!) + 2048) / 1024);
    const r = runCliSync(["rekey", "--all", "--agent", "chain", "--store", store, "-i", key("old"), "-r", pub("new")], { fileSizeLimitKiB: limitKiB });
    expect(r.code, r.stderr).toBe(8);
    expect(r.stderr).toMatch(/MEMSNAP_DEST_/);
    expect(r.stderr).toContain(ids[2]); // the first two were written (to temp files) before it
    files.forEach((f, i) => expect(readFileSync(f).equals(bytes[i]!)).toBe(true));
    expect(readdirSync(dir).filter((n) => n.includes(".tmp-"))).toEqual([]);
  });

  it("--all rekeys bases first and updates the seals that reference them; every snapshot verifies and restores with the new key", (ctx) => {
    requireTool(["age", "age-keygen", "zstd", "tar"], ctx);
    const dir = join(store, "default", "chain");
    const before = Object.fromEntries(ids.map((id) => [id, readBundle(join(dir, `${id}.memsnap`)).manifest]));
    expect(before[ids[2]!].bases?.length).toBeGreaterThan(0);
    // The whole store: the old key does not open the other agent's bundle, so nothing changes.
    const all = runCliSync(["rekey", "--all", "--store", store, "-i", key("old"), "-r", pub("new")]);
    expectCliError(all, 4, "MEMSNAP_DECRYPT_FAILED");
    for (const id of ids) expect(readBundle(join(dir, `${id}.memsnap`)).manifest.seal).toBe(before[id]!.seal);

    const r = runCliSync(["rekey", "--all", "--agent", "chain", "--store", store, "-i", key("old"), "--replace", "-r", pub("new"), "--json"]);
    expectOk(r);
    expect(jsonOut(r).bundles.map((x: { snapshot_id: string }) => x.snapshot_id)).toEqual(ids);
    expect(jsonOut(r).skipped).toEqual([expect.objectContaining({ snapshot_id: plainId, reason: "not encrypted" })]);
    const after = Object.fromEntries(ids.map((id) => [id, readBundle(join(dir, `${id}.memsnap`)).manifest]));
    for (const id of ids) {
      expect(after[id]!.seal).not.toBe(before[id]!.seal);
      for (const b of after[id]!.bases ?? []) expect(b.seal).toBe(after[b.snapshot_id]!.seal);
      expect(ageOpens(join(dir, `${id}.memsnap`), key("old"))).toBe(false);
    }
    expect(readdirSync(dir).filter((n) => n.includes(".tmp-"))).toEqual([]);
    expectOk(runCliSync(["verify", ...ids, "--store", store, "-i", key("new")]));
    const to = join(tempDir(), "out");
    expectOk(runCliSync(["restore", ids[2]!, "--store", store, "--to", to, "-i", key("new")]));
    expect(readFileSync(join(to, "memory", "n0.md"), "utf8")).toContain("change 2");
  });
});
