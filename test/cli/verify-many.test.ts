/**
 * `memsnap verify` over several bundles: paths and ids, or `--all` for a whole store (the
 * offline check of a copied store on another host). One line per bundle, damaged bundles
 * included (a listing that skipped unreadable files would hide exactly those), a summary, and a
 * failing exit when any bundle fails: that failure's code when all failures share a class,
 * MEMSNAP_VERIFY_FAILED (exit 3) otherwise.
 */
import { closeSync, cpSync, mkdirSync, mkdtempSync, openSync, readSync, rmSync, statSync, truncateSync, writeFileSync, writeSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { runCliSync } from "../helpers/cli.js";

const work = mkdtempSync(join(tmpdir(), "memsnap-verify-many-"));
afterAll(() => rmSync(work, { recursive: true, force: true }));

const cli = (args: string[]) => runCliSync(args, { cwd: work });

const store = join(work, "store");
const key = join(work, "key.txt");
let plain: { id: string; path: string };
let enc: { id: string; path: string };
let other: { id: string; path: string };

function agent(name: string, recipients: string[] = []): string {
  const dir = join(work, name);
  mkdirSync(join(dir, "memory"), { recursive: true });
  writeFileSync(join(dir, "memory", "MEMORY.md"), `# ${name}\n${"remember this line\n".repeat(200)}`);
  const config = join(dir, "memsnap.json");
  writeFileSync(config, JSON.stringify({ agent: name, store, recipients, sources: [{ kind: "files", name: "memory", path: "memory" }] }));
  return config;
}

function snap(config: string): { id: string; path: string } {
  const r = cli(["snapshot", "-c", config, "--json"]);
  expect(r.code, r.stderr).toBe(0);
  return JSON.parse(r.stdout) as { id: string; path: string };
}

/** A copy of the store with `damage` applied to the copy of `b`; returns the copy's root and b's path in it. */
function damagedCopy(name: string, b: string, damage: (path: string) => void): { root: string; path: string } {
  const root = join(work, name);
  cpSync(store, root, { recursive: true });
  const path = join(root, b.slice(store.length + 1));
  damage(path);
  return { root, path };
}

/** Flip one byte in the middle of the payload member: the payload no longer hashes to the manifest's SHA-256. */
function flipPayloadByte(path: string): void {
  const fd = openSync(path, "r+");
  const at = 512 + 100;
  const b = Buffer.alloc(1);
  readSync(fd, b, 0, 1, at);
  b.writeUInt8(b.readUInt8(0) ^ 0xff, 0);
  writeSync(fd, b, 0, 1, at);
  closeSync(fd);
}

beforeAll(() => {
  const k = cli(["keygen", "-o", key]);
  expect(k.code, k.stderr).toBe(0);
  const recipient = k.stdout.trim();
  plain = snap(agent("plain"));
  enc = snap(agent("secret", [recipient]));
  other = snap(agent("plain"));
});

describe("verify: several bundles", () => {
  it("--all: every bundle in the store, one line each, then a summary; keyless checks say what needs the key", () => {
    const r = cli(["verify", "--all", "--store", store]);
    expect(r.code, r.stderr).toBe(0);
    const lines = r.stdout.trimEnd().split("\n");
    expect(lines).toHaveLength(4);
    for (const b of [plain, enc, other]) expect(lines.some((l) => l.startsWith(`ok      ${b.id}  ${b.path}`))).toBe(true);
    expect(lines.find((l) => l.includes(enc.id))).toContain("check(s) not run: pass --identity");
    expect(lines[3]).toBe("3 bundle(s): 3 verified, 0 failed");
    const keyed = cli(["verify", "--all", "--store", store, "-i", key]);
    expect(keyed.code, keyed.stderr).toBe(0);
    expect(keyed.stdout).not.toContain("not run");
  });

  it("paths and ids, and --json: one report per bundle", () => {
    const r = cli(["--json", "verify", plain.path, enc.id, "--store", store]);
    expect(r.code, r.stderr).toBe(0);
    const out = JSON.parse(r.stdout) as { ok: boolean; bundles: Array<{ ok: boolean; snapshot_id: string; checks: unknown[] }> };
    expect(out.ok).toBe(true);
    expect(out.bundles.map((b) => [b.ok, b.snapshot_id])).toEqual([[true, plain.id], [true, enc.id]]);
    expect(out.bundles[1]!.checks.length).toBeGreaterThan(3);
  });

  it("a damaged bundle fails the run but the others are still checked; its own code when the failures share a class", () => {
    // the encrypted one: without the key only its payload hash is checked, so one problem, one code
    const { root, path } = damagedCopy("flipped", enc.path, flipPayloadByte);
    const r = cli(["verify", "--all", "--store", root]);
    expect(r.code).toBe(3);
    const lines = r.stdout.trimEnd().split("\n");
    expect(lines).toHaveLength(4);
    expect(lines.find((l) => l.startsWith("FAILED"))).toMatch(new RegExp(`^FAILED  ${path}: .*\\[MEMSNAP_PAYLOAD_HASH_MISMATCH\\]$`));
    expect(lines.filter((l) => l.startsWith("ok      "))).toHaveLength(2);
    expect(lines[3]).toBe("3 bundle(s): 2 verified, 1 failed");
    expect(r.stderr).toContain(`memsnap: error: 1 of 3 bundles failed verification, first: ${path}: `);
    expect(r.stderr).toContain("[MEMSNAP_PAYLOAD_HASH_MISMATCH]");
  });

  it("failures of different classes (altered, truncated, not a bundle): MEMSNAP_VERIFY_FAILED, exit 3, and none is skipped", () => {
    const { root, path: flipped } = damagedCopy("mixed", other.path, flipPayloadByte);
    const truncated = join(root, plain.path.slice(store.length + 1));
    truncateSync(truncated, statSync(truncated).size - 700);
    const junk = join(root, "default", "plain", "01M8DDJ8VZQREZACW7JACVC9R9.memsnap");
    writeFileSync(junk, "not a bundle\n");
    const r = cli(["verify", "--all", "--store", root]);
    expect(r.code).toBe(3);
    expect(r.stderr).toContain("[MEMSNAP_VERIFY_FAILED]");
    for (const p of [flipped, truncated, junk]) expect(r.stdout).toMatch(new RegExp(`^FAILED  ${p}: `, "m"));
    expect(r.stdout).toContain("4 bundle(s): 1 verified, 3 failed");
  });

  it("a path that does not exist among several is that one's failure, said as no such file; the others are verified", () => {
    const missing = join(work, "no-such.memsnap");
    const r = cli(["verify", plain.path, missing, "--json"]);
    expect(r.code).toBe(6);
    const out = JSON.parse(r.stdout) as { bundles: { path: string; ok: boolean; findings: { code: string; message: string }[] }[] };
    expect(out.bundles.map((b) => b.ok)).toEqual([true, false]);
    expect(out.bundles[1]!.findings.map((f) => f.code)).toEqual(["MEMSNAP_SOURCE_MISSING"]);
    expect(out.bundles[1]!.findings[0]!.message).toMatch(/no such file/i);
    const text = cli(["verify", plain.path, missing]);
    expect(text.stderr).toMatch(/no file is at that path/);
    expect(text.stderr).not.toMatch(/damaged/);
  });

  it("usage: no bundle, bundles with --all, an empty store", () => {
    for (const args of [["verify"], ["verify", "--all", plain.path], ["verify", "--all", "--store", join(work, "empty")]]) {
      const r = cli(args);
      expect(r.code, args.join(" ")).toBe(2);
      expect(r.stderr).toMatch(/\[MEMSNAP_USAGE\]\nmemsnap: hint: /);
    }
  });
});
