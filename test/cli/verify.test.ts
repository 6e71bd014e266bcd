/**
 * `memsnap verify` through the CLI on good bundles: the report's checks, keyless verify of an
 * encrypted bundle (what it can check passes, what it cannot is `skipped`, never `passed`),
 * verify with the right and the wrong key, and the simplest not-a-bundle inputs. Damaged and
 * tampered bundles are in bad-bundles.test.ts.
 */
import { appendFileSync, copyFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { beforeAll, describe, expect, it } from "vitest";
import {
  expectCliError, expectOk, jsonOut, makeAgent, runCli, type Agent,
} from "../helpers/cli.js";

let a: Agent;
let key: string;
let otherKey: string;
let plain: string;
let enc: string;

beforeAll(async () => {
  a = makeAgent();
  const [k1, k2] = await Promise.all([
    runCli(["keygen", "-o", "key.txt"], { cwd: a.dir }),
    runCli(["keygen", "-o", "other.txt"], { cwd: a.dir }),
  ]);
  expectOk(k1);
  expectOk(k2);
  key = join(a.dir, "key.txt");
  otherKey = join(a.dir, "other.txt");
  expectOk(await runCli(["snapshot", "-c", a.config, "-o", "plain.memsnap", "--label", "v"], { cwd: a.dir }));
  expectOk(await runCli(["snapshot", "-c", a.config, "-o", "enc.memsnap", "-r", k1.stdout.trim()], { cwd: a.dir }));
  plain = join(a.dir, "plain.memsnap");
  enc = join(a.dir, "enc.memsnap");
});

type Check = { name: string; status: string; detail?: string };

/** An unsigned bundle's `signature` check (when this build has one) is the only other check allowed to be skipped. */
function expectOnlyUnsignedSkipped(checks: Check[]): void {
  for (const c of checks) {
    if (c.status === "passed") continue;
    expect(c.name, JSON.stringify(c)).toBe("signature");
    expect(c.status).toBe("skipped");
    expect(c.detail).toMatch(/unsigned/);
  }
}

/** The `skipped signature: …unsigned` line of a human report, if any. */
const unsignedLines = (out: string): string[] => out.split("\n").filter((l) => /^skipped signature: .*unsigned/.test(l));
const statusOf = (checks: Check[]): Record<string, string> => Object.fromEntries(checks.map((c) => [c.name, c.status]));

describe("verify: plaintext bundle", () => {
  it("passes every check, keyless, and lists them", async () => {
    const r = await runCli(["--json", "verify", plain], { cwd: a.dir });
    expectOk(r);
    const j = jsonOut(r);
    expect(j.ok).toBe(true);
    expect(j.encrypted).toBe(false);
    expect(j.findings).toEqual([]);
    expect(j.snapshot_id).toMatch(/^[0-9A-Z]{26}$/);
    expect(statusOf(j.checks)).toMatchObject({
      container: "passed", manifest: "passed", seal: "passed", layers: "passed", "payload-label": "passed",
      "index-binding": "passed", "payload-sha256": "passed", artifacts: "passed",
    });
    expectOnlyUnsignedSkipped(j.checks);
    expect(j.checks.find((c: Check) => c.name === "artifacts").detail).toBe("7 artifacts");
    const h = await runCli(["verify", plain], { cwd: a.dir });
    expectOk(h);
    expect(h.stdout).toMatch(/^ok {6}container$/m);
    expect(h.stdout).toMatch(/^ok {6}artifacts: 7 artifacts$/m);
    expect(h.stdout).toMatch(new RegExp(`^verified ${j.snapshot_id}( \\(.*\\))?$`, "m"));
    expect(h.stdout).not.toMatch(/FAILED/);
    expect(h.stdout.split("\n").filter((l) => l.startsWith("skipped"))).toEqual(unsignedLines(h.stdout));
  });

  it("--deep runs the layers' own checks and passes", async () => {
    const r = await runCli(["--json", "verify", "--deep", plain], { cwd: a.dir });
    expectOk(r);
    expect(statusOf(jsonOut(r).checks).deep).toBe("passed");
  });

  it("zero padding after the end blocks (as copy tools add) is accepted", async () => {
    const padded = join(a.dir, "padded.memsnap");
    copyFileSync(plain, padded);
    appendFileSync(padded, Buffer.alloc(10240 - 512));
    expectOk(await runCli(["verify", padded], { cwd: a.dir }));
  });

  it("non-zero bytes after the end blocks are MEMSNAP_BUNDLE_MALFORMED, exit 5", async () => {
    const junk = join(a.dir, "junk.memsnap");
    copyFileSync(plain, junk);
    appendFileSync(junk, "trailing garbage");
    expectCliError(await runCli(["verify", junk], { cwd: a.dir }), 5, "MEMSNAP_BUNDLE_MALFORMED");
  });
});

describe("verify: encrypted bundle", () => {
  it("keyless: passes what it can check and reports decrypt, index-binding and artifacts as skipped, never passed", async () => {
    const r = await runCli(["--json", "verify", enc], { cwd: a.dir });
    expectOk(r);
    const j = jsonOut(r);
    expect(j.ok).toBe(true);
    expect(j.encrypted).toBe(true);
    const s = statusOf(j.checks);
    expect(s).toMatchObject({
      container: "passed", manifest: "passed", seal: "passed", layers: "passed", "payload-label": "passed",
      "payload-sha256": "passed", decrypt: "skipped", "index-binding": "skipped", artifacts: "skipped",
    });
    for (const c of j.checks as Check[]) if (c.status !== "passed") expect(["decrypt", "index-binding", "artifacts", "signature"]).toContain(c.name);
    for (const name of ["decrypt", "index-binding", "artifacts"]) {
      const cs = j.checks.filter((c: Check) => c.name === name);
      expect(cs.length, name).toBe(1);
      expect(cs[0].status, name).toBe("skipped");
      expect(cs[0].detail, name).toMatch(/identity|key/);
    }
    const deep = jsonOut(await runCli(["--json", "verify", "--deep", enc], { cwd: a.dir }));
    expect(statusOf(deep.checks).deep).toBe("skipped");
    const h = await runCli(["verify", enc], { cwd: a.dir });
    expectOk(h);
    expect(h.stdout).toMatch(/^skipped decrypt: /m);
    expect(h.stdout).toMatch(/^skipped artifacts: /m);
    expect(h.stdout).not.toMatch(/^ok\s+(decrypt|artifacts|index-binding)/m);
    expect(h.stdout).toMatch(/\([34] check\(s\) not run: pass --identity to run them(; unsigned)?\)/);
  });

  it("with the key: every check passes, decrypt included", async () => {
    const r = await runCli(["--json", "verify", enc, "-i", key, "--deep"], { cwd: a.dir });
    expectOk(r);
    const j = jsonOut(r);
    expect(j.findings).toEqual([]);
    const s = statusOf(j.checks);
    expectOnlyUnsignedSkipped(j.checks);
    for (const [name, st] of Object.entries(s)) if (name !== "signature") expect(st, name).toBe("passed");
    expect(Object.keys(s)).toEqual(expect.arrayContaining(["decrypt", "index-binding", "artifacts", "deep", "payload-sha256"]));
  });

  // BUG (src/cli/commands/verify.ts, the "verified …" line): every skipped check is blamed on a
  // missing key, so verifying WITH the key prints "(1 check(s) not run: pass --identity to run
  // them)" because the (unsigned) signature check was skipped.
  it("with the key, the summary does not ask for --identity", async () => {
    const h = await runCli(["verify", enc, "-i", key], { cwd: a.dir });
    expectOk(h);
    expect(h.stdout).not.toMatch(/pass --identity/);
  });

  it("a wrong identity is MEMSNAP_DECRYPT_FAILED, exit 4 (human and --json report)", async () => {
    const r = await runCli(["verify", enc, "-i", otherKey], { cwd: a.dir });
    expectCliError(r, 4, "MEMSNAP_DECRYPT_FAILED");
    const rj = await runCli(["--json", "verify", enc, "-i", otherKey], { cwd: a.dir });
    expect(rj.code).toBe(4);
    const j = jsonOut(rj);
    expect(j.ok).toBe(false);
    expect(j.findings.map((f: { code: string }) => f.code)).toEqual(["MEMSNAP_DECRYPT_FAILED"]);
    const s = statusOf(j.checks);
    expect(s.decrypt).toBe("failed");
    expect(s["payload-sha256"]).toBe("passed");
    expect(s.artifacts).toBe("skipped");
  });

  it("an unreadable identity file is MEMSNAP_IDENTITY_INVALID, exit 4", async () => {
    writeFileSync(join(a.dir, "garbage-key.txt"), "this is not a key\n");
    expectCliError(await runCli(["verify", enc, "-i", "garbage-key.txt"], { cwd: a.dir }), 4, "MEMSNAP_IDENTITY_INVALID");
    expectCliError(await runCli(["verify", enc, "-i", "no-such-key.txt"], { cwd: a.dir }), 4, "MEMSNAP_IDENTITY_INVALID");
  });
});

describe("verify: not a bundle", () => {
  it("a missing file is MEMSNAP_SOURCE_MISSING (exit 6); an empty one MEMSNAP_BUNDLE_TRUNCATED; text MEMSNAP_BUNDLE_MALFORMED", async () => {
    expectCliError(await runCli(["verify", "nope.memsnap"], { cwd: a.dir }), 6, "MEMSNAP_SOURCE_MISSING");
    writeFileSync(join(a.dir, "empty.memsnap"), "");
    expectCliError(await runCli(["verify", "empty.memsnap"], { cwd: a.dir }), 5, "MEMSNAP_BUNDLE_TRUNCATED");
    writeFileSync(join(a.dir, "text.memsnap"), "hello\n".repeat(200));
    expectCliError(await runCli(["verify", "text.memsnap"], { cwd: a.dir }), 5, "MEMSNAP_BUNDLE_MALFORMED");
    const rj = await runCli(["--json", "verify", "text.memsnap"], { cwd: a.dir });
    expect(rj.code).toBe(5);
    const j = jsonOut(rj);
    expect(j.ok).toBe(false);
    expect(statusOf(j.checks)).toEqual({ container: "failed" });
    expect(j.findings[0].code).toBe("MEMSNAP_BUNDLE_MALFORMED");
  });

  it("a usage error is MEMSNAP_USAGE, exit 2", async () => {
    const r = await runCli(["verify"], { cwd: a.dir });
    expectCliError(r, 2, "MEMSNAP_USAGE");
    const rj = await runCli(["--json", "verify", "--no-such-flag", "x"], { cwd: a.dir });
    expect(rj.code).toBe(2);
    expect(jsonOut(rj).error.code).toBe("MEMSNAP_USAGE");
  });
});
