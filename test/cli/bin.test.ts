/**
 * bin/memsnap.js executed directly, as an installed `memsnap` (npm's link to it) runs: its sh
 * preamble execs node with the runtime flags and malloc setting it ships with.
 */
import { spawnSync } from "node:child_process";
import { copyFileSync, existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, statSync, symlinkSync, utimesSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { BIN } from "../helpers/cli.js";

const dir = mkdtempSync(join(tmpdir(), "memsnap-bin-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));
const version = (JSON.parse(readFileSync(join(BIN, "..", "..", "package.json"), "utf8")) as { version: string }).version;

/** Run `file --version` directly, with a preload that reports what node was started with. */
function probe(file: string, env: Record<string, string> = {}): { code: number | null; stdout: string; seen: { execArgv: string[]; arena: string | null } } {
  const hook = join(dir, "hook.cjs");
  const out = join(dir, `seen-${Math.random().toString(36).slice(2)}.json`);
  writeFileSync(hook, `require("fs").writeFileSync(${JSON.stringify(out)}, JSON.stringify({ execArgv: process.execArgv, arena: process.env.MALLOC_ARENA_MAX ?? null }));`);
  const base = { ...process.env };
  delete base.MALLOC_ARENA_MAX;
  const r = spawnSync(file, ["--version"], { env: { ...base, NODE_OPTIONS: `--require ${hook}`, ...env }, encoding: "utf8" });
  return { code: r.status, stdout: r.stdout, seen: JSON.parse(readFileSync(out, "utf8")) as { execArgv: string[]; arena: string | null } };
}

describe("bin/memsnap.js executed directly", () => {
  it("runs with a 2 MiB young generation, a 256 KiB interrupt budget and two malloc arenas", () => {
    const r = probe(BIN);
    expect(r.code).toBe(0);
    expect(r.stdout.trim()).toBe(version);
    expect(r.seen.execArgv).toContain("--max-semi-space-size=2");
    expect(r.seen.execArgv).toContain("--interrupt-budget=262144");
    expect(r.seen.arena).toBe("2");
  });

  it("through a symlink (npm link, a global install), and keeping a MALLOC_ARENA_MAX already set", () => {
    const link = join(dir, "memsnap");
    symlinkSync(BIN, link);
    const r = probe(link, { MALLOC_ARENA_MAX: "4" });
    expect(r.code).toBe(0);
    expect(r.stdout.trim()).toBe(version);
    expect(r.seen.execArgv).toContain("--max-semi-space-size=2");
    expect(r.seen.arena).toBe("4");
  });

  it("starts node without NODE_EXTRA_CA_CERTS, and gives it back to memsnap's code and the processes it starts", () => {
    // A file that cannot be read: node warns at startup when it is asked to load it.
    const certs = join(dir, "no-such-certs.pem");
    const plain = spawnSync(process.execPath, ["-e", "0"], { env: { ...process.env, NODE_EXTRA_CA_CERTS: certs }, encoding: "utf8" });
    expect(plain.stderr).toContain("extra certs"); // the probe below can tell
    // A copy of bin/memsnap.js next to a stand-in CLI that reports the variable as memsnap's
    // code sees it, and as a child process (sh) sees it.
    const fake = join(dir, "fake-ca");
    const bin = join(fake, "bin", "memsnap.js");
    mkdirSync(join(fake, "bin"), { recursive: true });
    mkdirSync(join(fake, "dist", "cli"), { recursive: true });
    copyFileSync(BIN, bin);
    writeFileSync(join(fake, "dist", "cli", "main.js"), `import { execFileSync } from "node:child_process";
export async function main() {
  const child = execFileSync("sh", ["-c", 'printf %s "\${NODE_EXTRA_CA_CERTS-unset}"'], { encoding: "utf8" });
  process.stdout.write(JSON.stringify({ own: process.env.NODE_EXTRA_CA_CERTS ?? "unset", child, saved: process.env.MEMSNAP_SAVED_EXTRA_CA_CERTS ?? null }));
  return 0;
}
`);
    const run = (env: Record<string, string | undefined>) => {
      const e: Record<string, string | undefined> = { ...process.env, ...env };
      for (const k of Object.keys(e)) if (e[k] === undefined) delete e[k];
      return spawnSync(bin, [], { env: e as NodeJS.ProcessEnv, encoding: "utf8" });
    };
    const set = run({ NODE_EXTRA_CA_CERTS: certs });
    expect(set.status).toBe(0);
    expect(set.stderr).not.toContain("extra certs");
    expect(JSON.parse(set.stdout)).toEqual({ own: certs, child: certs, saved: null });
    const empty = run({ NODE_EXTRA_CA_CERTS: "" });
    expect(JSON.parse(empty.stdout)).toEqual({ own: "", child: "", saved: null });
    // Unset stays unset, whatever a stray saved value says.
    const unset = run({ NODE_EXTRA_CA_CERTS: undefined, MEMSNAP_SAVED_EXTRA_CA_CERTS: certs });
    expect(JSON.parse(unset.stdout)).toEqual({ own: "unset", child: "unset", saved: null });
  });

  it("still runs as a plain node script (node bin/memsnap.js), with node's defaults", () => {
    const r = spawnSync(process.execPath, [BIN, "--version"], { encoding: "utf8" });
    expect(r.status).toBe(0);
    expect(r.stdout.trim()).toBe(version);
  });
});

describe("bin/memsnap.js picks the CLI bundle only when it is fresh", () => {
  // A copy of bin/memsnap.js next to two stand-in entry points, so only the choice is tested.
  const fake = join(dir, "fake");
  const bin = join(fake, "bin", "memsnap.js");
  const cli = join(fake, "dist", "cli");
  mkdirSync(join(fake, "bin"), { recursive: true });
  mkdirSync(cli, { recursive: true });
  copyFileSync(BIN, bin);
  const entry = (name: string): string => `export async function main() { process.stdout.write(${JSON.stringify(name)}); return 0; }\n`;
  const run = (): string => spawnSync(process.execPath, [bin], { encoding: "utf8" }).stdout;
  const at = (file: string, s: number): void => utimesSync(file, s, s);

  it("the bundle when it is as new as dist/cli/main.js or newer, the tsc modules when it is older or missing", () => {
    writeFileSync(join(cli, "main.js"), entry("tsc"));
    expect(run()).toBe("tsc"); // no bundle
    writeFileSync(join(cli, "memsnap.mjs"), entry("bundle"));
    at(join(cli, "main.js"), 1_000_000);
    at(join(cli, "memsnap.mjs"), 1_000_000);
    expect(run()).toBe("bundle"); // same mtime (npm pack gives every file one)
    at(join(cli, "memsnap.mjs"), 1_000_100);
    expect(run()).toBe("bundle");
    at(join(cli, "main.js"), 1_000_200); // tsc ran after the bundle was built
    expect(run()).toBe("tsc");
  });

  it.runIf(process.env.CI)("is built in CI, after the tsc output", () => {
    const bundle = join(BIN, "..", "..", "dist", "cli", "memsnap.mjs");
    expect(existsSync(bundle)).toBe(true);
    expect(statSync(bundle).mtimeMs).toBeGreaterThanOrEqual(statSync(join(BIN, "..", "..", "dist", "cli", "main.js")).mtimeMs);
  });
});

describe("memsnap without a command", () => {
  it("prints the help on stderr and exits 2, without a second error line; --json gets a usage error object", () => {
    const r = spawnSync(BIN, [], { encoding: "utf8" });
    expect(r.status).toBe(2);
    expect(r.stdout).toBe("");
    expect(r.stderr).toMatch(/^Usage: memsnap /);
    expect(r.stderr).not.toContain("memsnap: error:");
    const j = spawnSync(BIN, ["--json"], { encoding: "utf8" });
    expect(j.status).toBe(2);
    expect(JSON.parse(j.stdout)).toEqual({ ok: false, exit_code: 2, error: { code: "MEMSNAP_USAGE", message: "no command given", hint: "see 'memsnap --help'" } });
  });
});
