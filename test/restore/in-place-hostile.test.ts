// Hostile bundles restored in place (issue #35 items 2 and 3; fixtures from scripts/hostile/in-place.mjs):
// only what the configured source owns is swapped in, the config the restore runs with and the
// control dir are never written, and nothing is renamed or created through a live symlink. A
// refusal is exit 9 before the first live byte changes: the whole tree (and the directory a live
// link points to) is byte-identical afterwards, with no staging left and no journal.
import { spawnSync } from "node:child_process";
import { existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, symlinkSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { tree } from "../helpers/tree.js";

const BIN = new URL("../../bin/memsnap.js", import.meta.url).pathname;
const FIX = new URL("../../fixtures/hostile/", import.meta.url).pathname;
const work = mkdtempSync(join(tmpdir(), "memsnap-inplace-hostile-"));
afterAll(() => rmSync(work, { recursive: true, force: true }));

function cli(args: string[]) {
  const r = spawnSync(process.execPath, [BIN, ...args], { encoding: "utf8", timeout: 60_000 });
  return { code: r.status, stdout: r.stdout, stderr: r.stderr };
}


interface Victim { home: string; agent: string; config: string; outside: string }

/** A victim agent (tenant default, agent victim) under a fresh directory, with a directory outside it. */
function victim(sources: unknown[], live: (agent: string, outside: string) => void): Victim {
  const home = mkdtempSync(join(work, "victim-"));
  const agent = join(home, "agent");
  const outside = join(home, "elsewhere");
  mkdirSync(join(agent, ".memsnap"), { recursive: true, mode: 0o700 }); // memsnap's own: the lock goes there
  mkdirSync(outside);
  writeFileSync(join(outside, "x.md"), "outside the agent\n");
  const config = join(agent, "memsnap.json");
  writeFileSync(config, JSON.stringify({ agent: "victim", redaction: { enabled: false }, sources }, null, 1));
  live(agent, outside);
  return { home, agent, config, outside };
}

function restore(v: Victim, file: string, extra: string[] = []) {
  const args = ["restore", join(FIX, file), "-c", v.config, "--no-safety-snapshot", "--json", ...extra];
  if (file.endsWith("-enc.memsnap")) args.push("-i", join(FIX, "victim.key"));
  const r = cli(args);
  const out = JSON.parse(r.stdout) as { ok: boolean; error?: { code: string; message: string; hint?: string } };
  return { ...r, out };
}

/** Refused with exit 9 and `code`, and the victim's home is exactly as it was. */
function expectRefused(v: Victim, file: string, match: RegExp): void {
  const before = tree(v.home);
  const r = restore(v, file);
  expect({ exit: r.code, code: r.out.error?.code }, r.stdout).toEqual({ exit: 9, code: "MEMSNAP_UNSAFE_PATH" });
  expect(r.out.error?.message).toMatch(match);
  expect(r.out.error?.hint).toMatch(/nothing was changed/);
  expect(tree(v.home)).toEqual(before);
  expect(existsSync(join(v.agent, ".memsnap", "journal.json"))).toBe(false);
}

const memorySource = [{ kind: "files", name: "memory", path: "memory", include: ["**/*.md"] }];

describe("in-place restore of a hostile bundle", () => {
  for (const file of ["in-place-not-owned-exec.memsnap", "in-place-not-owned-exec-enc.memsnap"]) {
    it(`${file}: a file outside the source's globs (run.sh, 0755) is refused; nothing live changes`, () => {
      const v = victim(memorySource, (a) => {
        mkdirSync(join(a, "memory"));
        writeFileSync(join(a, "memory", "ok.md"), "live\n");
        writeFileSync(join(a, "memory", "keep.bin"), "not the layer's\n");
      });
      expectRefused(v, file, /memory: the bundle holds run\.sh, which the files source memory does not own/);
      expect(existsSync(join(v.agent, "memory", "run.sh"))).toBe(false);
    });
  }

  it("in-place-not-owned-exec.memsnap: --dry-run says the restore refuses it", () => {
    const v = victim(memorySource, (a) => mkdirSync(join(a, "memory")));
    const r = cli(["restore", join(FIX, "in-place-not-owned-exec.memsnap"), "-c", v.config, "--dry-run", "--json"]);
    expect(r.code, r.stderr).toBe(0);
    const plan = (JSON.parse(r.stdout) as { plan: { layers: { notes: string[]; added: string[] }[] } }).plan;
    expect(plan.layers[0]!.notes.join("\n")).toMatch(/refuses: the bundle holds 1 file\(s\) the source does not own \(run\.sh\)/);
    expect(plan.layers[0]!.added).toEqual(["ok.md"]);
  });

  for (const file of ["in-place-replace-config.memsnap", "in-place-replace-config-enc.memsnap"]) {
    it(`${file}: a state source at '.' never writes the config it runs with`, () => {
      rmSync("/tmp/memsnap-pwned-hook", { force: true });
      const v = victim([{ kind: "state", name: "state", path: "." }], (a) => writeFileSync(join(a, "cursor.json"), '{"c":"live"}'));
      const config = readFileSync(v.config);
      const r = restore(v, file);
      expect(r.code, r.stdout).toBe(0);
      expect(readFileSync(v.config).equals(config)).toBe(true);
      expect(readFileSync(join(v.agent, "cursor.json"), "utf8")).toBe('{"c":"bundle"}');
      expect(readdirSync(v.home).sort()).toEqual(["agent", "elsewhere"]);
      // the bundle's hook is not in the config the next snapshot runs with
      const snap = cli(["snapshot", "-c", v.config, "--out", join(v.home, "after.memsnap")]);
      expect(snap.code, snap.stderr).toBe(0);
      expect(existsSync("/tmp/memsnap-pwned-hook")).toBe(false);
    });
  }

  it("in-place-config-absent.memsnap: the config, owned by the state globs, is not removed either", () => {
    const v = victim([{ kind: "state", name: "state", path: "." }], (a) => {
      writeFileSync(join(a, "cursor.json"), '{"c":"live"}');
      writeFileSync(join(a, "other.json"), "{}");
    });
    const config = readFileSync(v.config);
    const r = restore(v, "in-place-config-absent.memsnap");
    expect(r.code, r.stdout).toBe(0);
    expect(readFileSync(v.config).equals(config)).toBe(true);
    expect(readFileSync(join(v.agent, "cursor.json"), "utf8")).toBe('{"c":"bundle"}');
    expect(existsSync(join(v.agent, "other.json"))).toBe(false); // owned and not in the bundle: removed as before
  });

  for (const file of ["in-place-plant-journal.memsnap", "in-place-plant-journal-enc.memsnap"]) {
    it(`${file}: a file under .memsnap (a planted journal) is owned by no layer: refused`, () => {
      const v = victim([{ kind: "state", name: "state", path: ".", include: ["**/*.json"] }], (a) => {
        writeFileSync(join(a, "cursor.json"), '{"c":"live"}');
      });
      expectRefused(v, file, /the bundle holds \.memsnap\/journal\.json/);
      // the next command has no journal to obey
      const rec = cli(["recover", "-c", v.config]);
      expect(rec.code, rec.stderr).toBe(0);
      expect(rec.stdout).toMatch(/nothing to recover/);
    });
  }

  it("in-place-trace-not-owned.memsnap: a trace layer holding a script is refused", () => {
    const v = victim([{ kind: "trace", name: "traces", path: "traces" }], (a) => mkdirSync(join(a, "traces")));
    expectRefused(v, "in-place-trace-not-owned.memsnap", /traces: the bundle holds run\.sh/);
  });

  for (const file of ["in-place-through-live-symlink.memsnap", "in-place-through-live-symlink-enc.memsnap"]) {
    it(`${file}: a live symlink where the bundle has a directory is refused, never followed`, () => {
      const v = victim(memorySource, (a, outside) => {
        mkdirSync(join(a, "memory"));
        writeFileSync(join(a, "memory", "ok.md"), "live\n");
        symlinkSync(outside, join(a, "memory", "sub"));
      });
      const outside = tree(v.outside);
      expectRefused(v, file, /memory\/sub is a symlink/);
      expect(tree(v.outside)).toEqual(outside);
      expect(readFileSync(join(v.outside, "x.md"), "utf8")).toBe("outside the agent\n");
    });
  }

  it("in-place-file-over-live-dir.memsnap: a live directory where the bundle has a file is refused (its other files stay)", () => {
    const v = victim(memorySource, (a) => {
      mkdirSync(join(a, "memory", "notes.md"), { recursive: true });
      writeFileSync(join(a, "memory", "notes.md", "keep.bin"), "not the layer's\n");
    });
    expectRefused(v, "in-place-file-over-live-dir.memsnap", /notes\.md is a directory where the bundle has a file/);
  });

  it("in-place-dir-over-live-file.memsnap: a live file where the bundle has a directory is refused before anything changes", () => {
    const v = victim(memorySource, (a) => {
      mkdirSync(join(a, "memory"));
      writeFileSync(join(a, "memory", "ok.md"), "live\n");
      writeFileSync(join(a, "memory", "box"), "a file, not the layer's\n");
    });
    expectRefused(v, "in-place-dir-over-live-file.memsnap", /memory\/box is not a directory/);
  });
});
