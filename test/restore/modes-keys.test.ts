/**
 * Keys at restore (issue 35, items 9, 10, 11), through the CLI with real bundles:
 * - `restore --trust KEY` requires a signature by a trusted key, as `verify --trust` does
 *   (an unsigned bundle was restored), with the same codes, before anything is written and
 *   before the safety snapshot;
 * - a passphrase bundle whose scrypt work factor is over the cap (2^18 unless raised) is
 *   refused at once, in little memory; memsnap's own passphrase bundles are under it, and
 *   --scrypt-max-log-n / MEMSNAP_SCRYPT_MAX_LOG_N raise it;
 * - an identity, passphrase or signing key file open to group or others is warned of (stderr
 *   and the JSON output's `warnings`), and still used.
 * The hand-built bundles are in fixtures/hostile (scripts/hostile/modes-keys.mjs).
 */
import { spawnSync } from "node:child_process";
import { copyFileSync, chmodSync, existsSync, readdirSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { parseConfig, snapshot } from "../../src/index.js";
import { readLayout } from "../../src/format/container.js";
import { BIN, expectCliError, expectJsonError, expectOk, jsonOut, makeAgent, runCliSync, tempDir } from "../helpers/cli.js";

const hostile = new URL("../../fixtures/hostile/", import.meta.url).pathname;
/** The attacker's public key (scripts/hostile/modes-keys.mjs signs with the Ed25519 key of seed 0x5a×32). */
async function attackerPub(): Promise<string> {
  const { attackerSigningKey } = (await import("../../scripts/hostile/modes-keys.mjs")) as { attackerSigningKey: () => import("node:crypto").KeyObject };
  const { publicKeyString } = await import("../../src/sign.js");
  const { createPublicKey } = await import("node:crypto");
  return publicKeyString(createPublicKey(attackerSigningKey()));
}

/** A private copy of the victim's identity with the given mode. */
function victimKey(dir: string, mode = 0o600): string {
  const k = join(dir, `victim-${mode.toString(8)}.key`);
  copyFileSync(join(hostile, "victim.key"), k);
  chmodSync(k, mode);
  return k;
}

describe("restore --trust is verify --trust (item 9)", () => {
  const work = tempDir("memsnap-trust-");
  const mine = runCliSync(["keygen", "--sign", "-o", "mine.key"], { cwd: work }).stdout.trim();

  it.each([
    ["trust-unsigned.memsnap", "MEMSNAP_SIGNATURE_REQUIRED"],
    ["trust-signed-by-attacker.memsnap", "MEMSNAP_SIGNATURE_UNTRUSTED"],
  ])("%s: restore --to --trust (no --require-signature) refuses it with verify's code, nothing written", (file, code) => {
    expect(mine).toMatch(/^memsnap-ed25519:/);
    const v = runCliSync(["verify", join(hostile, file), "--trust", mine, "--json"], { cwd: work });
    expect(v.code).toBe(4);
    expect((jsonOut(v) as { findings: { code: string }[] }).findings.map((f) => f.code)).toEqual([code]);
    const parent = tempDir("memsnap-trust-to-");
    const r = runCliSync(["restore", join(hostile, file), "--to", join(parent, "r"), "--trust", mine, "--json"], { cwd: work });
    expectJsonError(r, 4, code);
    expect(readdirSync(parent)).toEqual([]);
    const t = runCliSync(["restore", join(hostile, file), "--to", join(parent, "r"), "--trust", mine], { cwd: work });
    expectCliError(t, 4, code);
    expect(readdirSync(parent)).toEqual([]);
  });

  it("the signer's own key is trusted: trust-signed-by-attacker.memsnap restores with --trust of its key", async () => {
    const pub = await attackerPub();
    const to = join(tempDir("memsnap-trust-to-"), "r");
    expectOk(runCliSync(["restore", join(hostile, "trust-signed-by-attacker.memsnap"), "--to", to, "--trust", pub], { cwd: work }));
    expect(readFileSync(join(to, "memory", "ok.md"), "utf8")).toBe("signed by someone else\n");
    expect(runCliSync(["verify", join(hostile, "trust-signed-by-attacker.memsnap"), "--trust", pub], { cwd: work }).code).toBe(0);
    // without --trust, an unsigned bundle restores as before
    expectOk(runCliSync(["restore", join(hostile, "trust-unsigned.memsnap"), "--to", join(tempDir("memsnap-trust-to-"), "r")], { cwd: work }));
  });

  it.each(["unsigned", "signed by another key"])("in place, %s: refused before the safety snapshot, the live files untouched", (how) => {
    const a = makeAgent();
    const store = join(a.dir, "store");
    const other = join(a.dir, "other.key");
    expectOk(runCliSync(["keygen", "--sign", "-o", other], { cwd: a.dir }));
    const s = runCliSync(["snapshot", "-c", a.config, "--store", store, "--json", ...(how === "unsigned" ? [] : ["--sign-key", other])], { cwd: a.dir });
    expectOk(s);
    const bundle = (jsonOut(s) as { path: string }).path;
    writeFileSync(join(a.memoryDir, "live.md"), "written after the snapshot\n");
    const before = readdirSync(join(store), { recursive: true }).sort();
    const r = runCliSync(["restore", bundle, "-c", a.config, "--store", store, "--trust", mine, "--json"], { cwd: a.dir });
    expectJsonError(r, 4, how === "unsigned" ? "MEMSNAP_SIGNATURE_REQUIRED" : "MEMSNAP_SIGNATURE_UNTRUSTED");
    expect(readdirSync(join(store), { recursive: true }).sort()).toEqual(before); // no auto:pre-restore snapshot
    expect(readFileSync(join(a.memoryDir, "live.md"), "utf8")).toBe("written after the snapshot\n");
  });
});

/** Max RSS (KiB) and wall seconds of a CLI run, from GNU time. */
function timed(args: string[], env: Record<string, string>, cwd: string) {
  const r = spawnSync("/usr/bin/time", ["-f", "%M %e", process.execPath, BIN, ...args], {
    cwd, encoding: "utf8", env: { ...process.env, ...env, XDG_DATA_HOME: join(cwd, ".xdg") }, timeout: 60_000,
  });
  const last = r.stderr.trim().split("\n").pop()!.split(" ");
  return { code: r.status, stdout: r.stdout, stderr: r.stderr, rssKiB: Number(last[0]), seconds: Number(last[1]) };
}

/** The work factor in a passphrase bundle's age header. */
async function scryptLogNOf(bundle: string): Promise<number> {
  const layout = await readLayout(bundle);
  const head = readFileSync(bundle).subarray(layout.payloadOffset, layout.payloadOffset + 200).toString("latin1");
  const m = /^age-encryption\.org\/v1\n-> scrypt \S+ (\d+)\n/.exec(head);
  expect(m, head).not.toBeNull();
  return Number(m![1]);
}

describe("the scrypt work factor is capped (item 10)", () => {
  it.each(["scrypt-logn20.memsnap", "scrypt-logn22.memsnap", "scrypt-logn-huge.memsnap"])("%s is refused before any scrypt work: little memory, no waiting", (file) => {
    const parent = tempDir("memsnap-scrypt-");
    const r = timed(["restore", join(hostile, file), "--to", join(parent, "r"), "--json"], { MEMSNAP_PASSPHRASE: "guess" }, parent);
    expect(r.code, r.stderr).toBe(9);
    const err = (JSON.parse(r.stdout) as { error: { code: string; message: string; hint: string } }).error;
    expect(err.code).toBe("MEMSNAP_UNSAFE_BUNDLE");
    expect(err.message).toMatch(/scrypt work factor of 2\^\d+.* over the limit of 2\^18/);
    if (file === "scrypt-logn20.memsnap") expect(err.hint).toContain("--scrypt-max-log-n 20");
    // 2^20 cost 4.9 s and 1 GiB before the MAC failed; node itself is ~50 MiB
    expect(r.rssKiB).toBeLessThan(200 * 1024);
    expect(r.seconds).toBeLessThan(4);
    expect(readdirSync(parent).filter((f) => !f.startsWith("."))).toEqual([]);
  });

  it("bundles memsnap writes with --passphrase-file are at 2^18, under the default cap, and restore", () => {
    const a = makeAgent();
    writeFileSync(join(a.dir, "pass.txt"), "correct horse\n", { mode: 0o600 });
    expectOk(runCliSync(["snapshot", "-c", a.config, "-o", "p.memsnap", "--passphrase-file", "pass.txt"], { cwd: a.dir }));
    return scryptLogNOf(join(a.dir, "p.memsnap")).then((n) => {
      expect(n).toBe(18);
      expectOk(runCliSync(["restore", "p.memsnap", "--to", "out", "--passphrase-file", "pass.txt"], { cwd: a.dir }));
      expect(existsSync(join(a.dir, "out", "memory"))).toBe(true);
    });
  });

  it("a bundle at 2^19 needs the cap raised: --scrypt-max-log-n for restore, MEMSNAP_SCRYPT_MAX_LOG_N for any command", async () => {
    const a = makeAgent();
    const config = parseConfig(JSON.parse(readFileSync(a.config, "utf8")), a.config, a.dir);
    const bundle = join(a.dir, "p19.memsnap");
    await snapshot({ config, out: bundle, passphrase: "correct horse", scryptLogN: 19 });
    expect(await scryptLogNOf(bundle)).toBe(19);
    const env = { MEMSNAP_PASSPHRASE: "correct horse" };
    const refused = runCliSync(["restore", bundle, "--to", "r0"], { cwd: a.dir, env });
    expectCliError(refused, 9, "MEMSNAP_UNSAFE_BUNDLE");
    expect(refused.stderr).toContain("--scrypt-max-log-n 19");
    expect(existsSync(join(a.dir, "r0"))).toBe(false);
    expectCliError(runCliSync(["verify", bundle], { cwd: a.dir, env }), 9, "MEMSNAP_UNSAFE_BUNDLE");
    expectOk(runCliSync(["restore", bundle, "--to", "r1", "--scrypt-max-log-n", "19"], { cwd: a.dir, env }));
    expect(readdirSync(join(a.dir, "r1", "memory")).length).toBeGreaterThan(0);
    expectOk(runCliSync(["verify", bundle], { cwd: a.dir, env: { ...env, MEMSNAP_SCRYPT_MAX_LOG_N: "19" } }));
  });

  it("the cap is 1..20: anything else is a usage error, before the bundle is read", () => {
    const cwd = tempDir("memsnap-scrypt-");
    for (const n of ["21", "0", "abc", "1e1"]) {
      expectCliError(runCliSync(["restore", join(hostile, "scrypt-logn22.memsnap"), "--to", "r", "--scrypt-max-log-n", n], { cwd, env: { MEMSNAP_PASSPHRASE: "x" } }), 2, "MEMSNAP_USAGE");
    }
    expectCliError(runCliSync(["restore", join(hostile, "scrypt-logn22.memsnap"), "--to", "r"], { cwd, env: { MEMSNAP_PASSPHRASE: "x", MEMSNAP_SCRYPT_MAX_LOG_N: "64" } }), 2, "MEMSNAP_USAGE");
    expect(existsSync(join(cwd, "r"))).toBe(false);
  });
});

describe("secret key files open to group or others are warned of (item 11)", () => {
  const bundle = join(hostile, "modes-files-special-bits-encrypted.memsnap");

  it("an identity file at 0644 or 0640: a warning on stderr and in --json's warnings; the restore goes on", () => {
    const dir = tempDir("memsnap-keymode-");
    for (const [mode, who] of [[0o644, "group and others"], [0o640, "its group"], [0o604, "others"]] as const) {
      const key = victimKey(dir, mode);
      const to = join(dir, `r-${mode.toString(8)}`);
      const r = runCliSync(["restore", bundle, "--to", to, "-i", key], { cwd: dir });
      expectOk(r);
      expect(r.stderr).toContain(`memsnap: warning: identity file ${key} is open to ${who} (mode 0${mode.toString(8)})`);
      expect(r.stderr).toContain(`chmod 600 ${key}`);
      const j = runCliSync(["restore", bundle, "--to", `${to}-json`, "-i", key, "--json"], { cwd: dir });
      expectOk(j);
      const out = jsonOut(j) as { ok: boolean; warnings?: { path: string; message: string }[] };
      expect(out.ok).toBe(true);
      expect(out.warnings).toEqual([{ path: key, message: expect.stringContaining(`identity file ${key} is open to ${who}`) as string }]);
    }
  });

  it("an identity file at 0600 or 0400, or read through /dev/stdin: no warning", () => {
    const dir = tempDir("memsnap-keymode-");
    for (const mode of [0o600, 0o400]) {
      const j = runCliSync(["restore", bundle, "--to", join(dir, `r-${mode.toString(8)}`), "-i", victimKey(dir, mode), "--json"], { cwd: dir });
      expectOk(j);
      expect(j.stderr).not.toContain("warning");
      expect((jsonOut(j) as { warnings?: unknown }).warnings).toBeUndefined();
    }
    const open = victimKey(dir, 0o644);
    const r = spawnSync("sh", ["-c", `exec "$0" "$@" < '${open}'`, process.execPath, BIN, "restore", bundle, "--to", join(dir, "r-stdin"), "-i", "/dev/stdin"], { cwd: dir, encoding: "utf8" });
    expect(r.status, r.stderr).toBe(0);
    expect(r.stderr).not.toContain("warning");
  });

  it("verify -i and a passphrase file and a signing key at 0644: warned of too", () => {
    const a = makeAgent();
    const key = victimKey(a.dir, 0o644);
    const v = runCliSync(["verify", bundle, "-i", key, "--json"], { cwd: a.dir });
    expectOk(v);
    expect(v.stderr).toContain(`identity file ${key} is open to group and others`);
    expect((jsonOut(v) as { warnings?: { path: string }[] }).warnings?.map((w) => w.path)).toEqual([key]);

    writeFileSync(join(a.dir, "pass.txt"), "correct horse\n");
    chmodSync(join(a.dir, "pass.txt"), 0o644);
    expectOk(runCliSync(["keygen", "--sign", "-o", "sign.key"], { cwd: a.dir }));
    chmodSync(join(a.dir, "sign.key"), 0o640);
    const s = runCliSync(["snapshot", "-c", a.config, "-o", "p.memsnap", "--passphrase-file", "pass.txt", "--sign-key", "sign.key", "--json"], { cwd: a.dir });
    expectOk(s);
    expect(s.stderr).toContain("memsnap: warning: passphrase file pass.txt is open to group and others (mode 0644)");
    expect(s.stderr).toContain("memsnap: warning: signing key sign.key is open to its group (mode 0640)");
    const out = jsonOut(s) as { ok: boolean; signed: boolean; warnings: { path: string }[] };
    expect(out.ok && out.signed).toBe(true);
    expect(out.warnings.map((w) => w.path)).toEqual(["pass.txt", "sign.key"]);
  });
});
