// Hostile bundles (fixtures/hostile, built by scripts/make-hostile.mjs) are refused with an
// unsafe-bundle code before anything is written outside staging, and staging is removed.
import { spawnSync } from "node:child_process";
import { existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";

const BIN = new URL("../../bin/memsnap.js", import.meta.url).pathname;
const dir = new URL("../../fixtures/hostile/", import.meta.url).pathname;
const work = mkdtempSync(join(tmpdir(), "memsnap-hostile-"));
afterAll(() => rmSync(work, { recursive: true, force: true }));

const cases: [string, string][] = [
  ["absolute-path", "MEMSNAP_UNSAFE_PATH"],
  ["dotdot", "MEMSNAP_UNSAFE_PATH"],
  ["symlink-then-write", "MEMSNAP_UNSAFE_PATH"],
  ["symlink-outside", "MEMSNAP_UNSAFE_PATH"],
  ["hardlink-outside", "MEMSNAP_UNSAFE_PATH"],
  ["device-node", "MEMSNAP_UNSAFE_PATH"],
  ["fifo", "MEMSNAP_UNSAFE_PATH"],
  ["duplicate-path", "MEMSNAP_UNSAFE_PATH"],
  ["unknown-layer", "MEMSNAP_UNSAFE_PATH"],
  ["longer-than-declared", "MEMSNAP_UNSAFE_BUNDLE"],
  ["zstd-bomb", "MEMSNAP_UNSAFE_BUNDLE"],
  ["manifest-over-cap", "MEMSNAP_UNSAFE_BUNDLE"],
];
/** Bundles whose layer an agent with only a `memory` files source would not restore in place. */
const toOnly: [string, string][] = [
  ["kv-spool-collision", "MEMSNAP_UNSAFE_PATH"],
  ["kv-spool-part-collision", "MEMSNAP_UNSAFE_PATH"],
  ["kv-place-past-end", "MEMSNAP_UNSAFE_BUNDLE"],
  ["layers-interleaved", "MEMSNAP_UNSAFE_BUNDLE"],
];

function run(args: string[]) {
  const r = spawnSync(process.execPath, [BIN, ...args, "--json"], { encoding: "utf8" });
  return { code: r.status, out: JSON.parse(r.stdout) as { ok: boolean; error?: { code: string; hint?: string } } };
}

const escapes = ["/tmp/memsnap-hostile-abs", "/tmp/memsnap-hostile-through-link"];

describe("hostile bundles", () => {
  it("every fixture is present", () => {
    // (with the bundles a case needs beside it: the base of the chunked cases)
    const grouped = (JSON.parse(readFileSync(join(dir, "cases.json"), "utf8")) as { file: string; beside?: string[] }[]).flatMap((c) => [c.file, ...(c.beside ?? [])]);
    expect(readdirSync(dir).filter((f) => f.endsWith(".memsnap")).sort()).toEqual([...[...cases, ...toOnly].map(([n]) => `${n}.memsnap`), ...grouped].sort());
  });

  it.each([...cases, ...toOnly])("%s: restore --to refuses with %s and leaves nothing", (name, code) => {
    const parent = mkdtempSync(join(work, "to-"));
    const target = join(parent, "deep", "restored");
    mkdirSync(join(parent, "deep"));
    const r = run(["restore", join(dir, `${name}.memsnap`), "--to", target]);
    expect(r.code).toBe(9);
    expect(r.out.error?.code).toBe(code);
    expect(r.out.error?.hint).toBeTruthy();
    expect(readdirSync(join(parent, "deep"))).toEqual([]); // no target, no staging
    expect(readdirSync(parent)).toEqual(["deep"]); // nothing escaped upwards
    for (const e of escapes) expect(existsSync(e)).toBe(false);
  });

  it.each(cases)("%s: in-place restore refuses with %s and the live agent is untouched", (name, code) => {
    const agent = mkdtempSync(join(work, "agent-"));
    mkdirSync(join(agent, "memory"));
    writeFileSync(join(agent, "memory", "live.md"), "live\n");
    writeFileSync(join(agent, "memsnap.json"), JSON.stringify({ agent: "victim", sources: [{ kind: "files", name: "memory", path: "memory" }] }));
    const r = run(["restore", join(dir, `${name}.memsnap`), "-c", join(agent, "memsnap.json"), "--no-safety-snapshot"]);
    expect(r.code).toBe(9);
    expect(r.out.error?.code).toBe(code);
    expect(readdirSync(join(agent, "memory"))).toEqual(["live.md"]);
    expect(readdirSync(agent).filter((n) => n !== ".memsnap").sort()).toEqual(["memory", "memsnap.json"]);
    expect(readdirSync(join(agent, ".."))).not.toContainEqual(expect.stringMatching(/memsnap-(new|old)-/));
    expect(existsSync(join(agent, ".memsnap", "journal.json"))).toBe(false);
    for (const e of escapes) expect(existsSync(e)).toBe(false);
  });
});
