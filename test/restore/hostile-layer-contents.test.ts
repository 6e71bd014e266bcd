// The hostile layer contents of fixtures/hostile (scripts/hostile/layer-exec-pfimg-trace.mjs),
// through the real CLI: no exec case runs the code its bundle names (whatever the allow-list),
// a recorded cwd is never used, pfimg bombs stop within seconds, and `verify --deep` reports each
// hostile trace with exit 3 and bounded memory.
import { spawnSync } from "node:child_process";
import { existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeEach, describe, expect, it } from "vitest";

const BIN = new URL("../../bin/memsnap.js", import.meta.url).pathname;
const MAXRSS = new URL("../helpers/maxrss.cjs", import.meta.url).pathname;
const dir = new URL("../../fixtures/hostile/", import.meta.url).pathname;
const KEY = join(dir, "victim.key");
const work = mkdtempSync(join(tmpdir(), "memsnap-hostile-layers-"));
afterAll(() => rmSync(work, { recursive: true, force: true }));

interface Case { file: string; exit: number; code: string; check: "to" | "custom"; key?: boolean; env?: Record<string, string>; group: string }
const cases = (JSON.parse(readFileSync(join(dir, "cases.json"), "utf8")) as Case[]).filter((c) => c.group === "layer-exec-pfimg-trace");
const byFile = (f: string): Case => {
  const c = cases.find((x) => x.file === f);
  if (!c) throw new Error(`${f} is not in fixtures/hostile/cases.json (run scripts/make-hostile.mjs)`);
  return c;
};

const PWNED = "/tmp/memsnap-hostile-exec-pwned";
const CWD_MARK = "memsnap-hostile-exec-cwd-pwned";

function memsnap(args: string[], c: Case, extra: { rss?: boolean } = {}) {
  const env: NodeJS.ProcessEnv = { ...process.env, ...(c.env ?? {}) };
  delete env.NODE_OPTIONS;
  if (extra.rss) env.NODE_OPTIONS = `--require=${MAXRSS}`;
  const r = spawnSync(process.execPath, [BIN, ...args, "--json", ...(c.key ? ["-i", KEY] : [])], { encoding: "utf8", env, timeout: 120_000 });
  const kib = /memsnap-test-maxrss-kib=(\d+)/.exec(r.stderr);
  return { status: r.status, out: JSON.parse(r.stdout) as { ok: boolean; error?: { code: string; hint?: string }; findings?: { code: string; message: string }[] }, rssMiB: kib ? Number(kib[1]) / 1024 : NaN, stderr: r.stderr };
}

describe("hostile exec layers", () => {
  beforeEach(() => {
    rmSync(PWNED, { force: true });
    rmSync(join("/tmp", CWD_MARK), { force: true });
  });

  it.each(cases.filter((c) => c.file.startsWith("exec-") && c.check === "to").map((c) => [c.file, c] as const))(
    "%s: refused (exit 9) and the command it names never runs", (_f, c) => {
      const target = join(mkdtempSync(join(work, "x-")), "restored");
      const r = memsnap(["restore", join(dir, c.file), "--to", target], c);
      expect({ exit: r.status, code: r.out.error?.code }).toEqual({ exit: 9, code: "MEMSNAP_PLUGIN_UNTRUSTED" });
      expect(r.out.error?.hint).toMatch(/whole command/);
      expect(existsSync(PWNED)).toBe(false);
      expect(existsSync(target)).toBe(false);
    });

  it.each(["exec-cwd-outside.memsnap", "exec-cwd-outside-encrypted.memsnap"])(
    "%s: the allowed command runs in the restored layer's directory, not in the cwd the bundle records (/tmp)", (f) => {
      const c = byFile(f);
      const target = join(mkdtempSync(join(work, "cwd-")), "restored");
      const r = memsnap(["restore", join(dir, c.file), "--to", target], c);
      expect(r.status, r.stderr).toBe(0);
      expect(existsSync(join("/tmp", CWD_MARK))).toBe(false);
      expect(existsSync(join(target, "kv", CWD_MARK))).toBe(true);
    });
});

describe("hostile pfimg layers", () => {
  it("pfimg-zero-frames.memsnap (~9 GiB of zeros in frames) is refused within seconds, restore and verify --deep", () => {
    for (const f of ["pfimg-zero-frames.memsnap", "pfimg-zero-frames-encrypted.memsnap"]) {
      const c = byFile(f);
      const t0 = Date.now();
      const r = memsnap(["restore", join(dir, c.file), "--to", join(mkdtempSync(join(work, "pf-")), "restored")], c);
      expect({ exit: r.status, code: r.out.error?.code }).toEqual({ exit: 9, code: "MEMSNAP_UNSAFE_BUNDLE" });
      const v = memsnap(["verify", join(dir, c.file), "--deep"], c);
      expect(v.status).toBe(3);
      expect(v.out.findings?.map((x) => x.code)).toEqual(["MEMSNAP_DEEP_VERIFY_FAILED"]);
      expect(Date.now() - t0).toBeLessThan(20_000); // loose: unbounded, each takes a minute or more
    }
  }, 120_000);
});

describe("hostile trace layers: verify --deep reports each, exit 3, with bounded memory", () => {
  const expected: [string, RegExp, number][] = [
    ["trace-huge-array.memsnap", /line 1: record is over the 256 MiB memory budget/, 600],
    ["trace-huge-array-encrypted.memsnap", /line 1: record is over the 256 MiB memory budget/, 600],
    ["trace-huge-numbers.memsnap", /line 1: record's numbers would expand past/, 300],
    ["trace-deep-nesting.memsnap", /line 1: not valid JSON \(nesting too deep/, 300],
    ["trace-dangling-parent.memsnap", /line 2: parent sha256:[0-9a-f]{64} is not an earlier record/, 300],
    ["trace-dangling-parent-encrypted.memsnap", /line 2: parent sha256:[0-9a-f]{64} is not an earlier record/, 300],
  ];
  it("every trace case of the group is listed here", () => {
    expect(cases.filter((c) => c.file.startsWith("trace-")).map((c) => c.file).sort()).toEqual(expected.map(([f]) => f).sort());
  });
  it.each(expected)("%s", (f, message, maxMiB) => {
    const c = byFile(f);
    const r = memsnap(["verify", join(dir, c.file), "--deep"], c, { rss: true });
    expect({ exit: r.status, findings: r.out.findings }).toEqual({
      exit: c.exit, findings: [{ code: c.code, path: "t/run.agentlog", message: expect.stringMatching(message) }],
    });
    expect(r.rssMiB, r.stderr).toBeLessThan(maxMiB);
    // A restore writes the trace as it is (inside its target): traces are checked by verify --deep.
    const parent = mkdtempSync(join(work, "tr-"));
    mkdirSync(join(parent, "deep"));
    const res = memsnap(["restore", join(dir, c.file), "--to", join(parent, "deep", "restored")], c);
    expect(res.status, res.stderr).toBe(0);
    expect(readdirSync(parent)).toEqual(["deep"]);
  }, 120_000);
});
