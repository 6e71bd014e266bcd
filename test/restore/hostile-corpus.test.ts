// The grouped hostile corpus (fixtures/hostile/cases.json, built by scripts/make-hostile.mjs):
// `restore --to` answers each "to" case with its exit and error code and a hint, and writes
// nothing outside the target's parent; every "custom" case is named by some test.
import { spawnSync } from "node:child_process";
import { mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";

const BIN = new URL("../../bin/memsnap.js", import.meta.url).pathname;
const dir = new URL("../../fixtures/hostile/", import.meta.url).pathname;
const testRoot = new URL("../", import.meta.url).pathname;
const work = mkdtempSync(join(tmpdir(), "memsnap-hostile-corpus-"));
afterAll(() => rmSync(work, { recursive: true, force: true }));

interface Case { file: string; exit: number; code: string; check: "to" | "custom"; key?: boolean; env?: Record<string, string>; group: string; note?: string }
const cases = JSON.parse(readFileSync(join(dir, "cases.json"), "utf8")) as Case[];

function testSources(d: string): string {
  let all = "";
  for (const e of readdirSync(d, { withFileTypes: true })) {
    if (e.isDirectory()) all += testSources(join(d, e.name));
    else if (e.name.endsWith(".ts")) all += readFileSync(join(d, e.name), "utf8");
  }
  return all;
}

describe("hostile corpus", () => {
  it("the corpus holds at least 60 bundles, each listed", () => {
    const files = readdirSync(dir).filter((f) => f.endsWith(".memsnap"));
    expect(files.length).toBeGreaterThanOrEqual(60);
    for (const c of cases) expect(files).toContain(c.file);
  });

  it("every custom case is exercised by a named test", () => {
    const src = testSources(testRoot);
    for (const c of cases.filter((x) => x.check === "custom")) expect(src, c.file).toContain(c.file);
  });

  it.each(cases.filter((c) => c.check === "to").map((c) => [c.file, c] as const))("%s: restore --to refuses and writes nothing outside", (_f, c) => {
    const parent = mkdtempSync(join(work, "to-"));
    mkdirSync(join(parent, "deep"));
    const target = join(parent, "deep", "restored");
    const args = [BIN, "restore", join(dir, c.file), "--to", target, "--json"];
    if (c.key) args.push("-i", join(dir, "victim.key"));
    const r = spawnSync(process.execPath, args, { encoding: "utf8", env: { ...process.env, ...(c.env ?? {}) }, timeout: 60_000 });
    const out = JSON.parse(r.stdout) as { ok: boolean; error?: { code: string; hint?: string } };
    expect({ exit: r.status, code: out.error?.code }).toEqual({ exit: c.exit, code: c.code });
    expect(out.error?.hint).toBeTruthy();
    expect(readdirSync(join(parent, "deep"))).toEqual([]);
    expect(readdirSync(parent)).toEqual(["deep"]);
  });
});
