/**
 * `memsnap snapshot --incremental` through the CLI: what it prints, an in-place restore of an
 * incremental snapshot (its references read from the base), `inspect`, `export` (copies the
 * bases beside the copy, which then restores elsewhere), `delete` of a base refused.
 */
import { appendFileSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { runCliSync } from "../helpers/cli.js";

const work = mkdtempSync(join(tmpdir(), "memsnap-cli-inc-"));
afterAll(() => rmSync(work, { recursive: true, force: true }));

const cli = (args: string[]) => runCliSync(args, { cwd: work });

const agent = join(work, "agent");
const store = join(work, "store");
const config = join(agent, "memsnap.json");
const key = join(work, "key.txt");

function snap(): { id: string; path: string; incremental: { referenced: number; bases: string[]; reason: string | null } } {
  const r = cli(["snapshot", "-c", config, "--incremental", "--json"]);
  expect(r.code, r.stderr).toBe(0);
  return JSON.parse(r.stdout);
}

let first: ReturnType<typeof snap>;
let second: ReturnType<typeof snap>;

beforeAll(() => {
  const k = cli(["keygen", "-o", key]);
  expect(k.code, k.stderr).toBe(0);
  mkdirSync(join(agent, "memory"), { recursive: true });
  for (let i = 0; i < 20; i++) writeFileSync(join(agent, "memory", `n${i}.md`), `note ${i}\n`.repeat(100));
  writeFileSync(config, JSON.stringify({ agent: "scribe", store, recipients: [k.stdout.trim()], sources: [{ kind: "files", name: "memory", path: "memory" }] }));
  first = snap();
  appendFileSync(join(agent, "memory", "n0.md"), "changed\n");
  second = snap();
});

describe("snapshot --incremental (CLI)", () => {
  it("the first is full and says why; the next references the unchanged files", () => {
    expect(first.incremental).toMatchObject({ referenced: 0, bases: [], reason: "no earlier incremental snapshot of this agent" });
    expect(second.incremental).toMatchObject({ referenced: 19, bases: [first.id], reason: null });
    const human = cli(["snapshot", "-c", config, "--incremental"]);
    expect(human.code, human.stderr).toBe(0);
    expect(human.stdout).toMatch(/^ {2}refs {5}20 unchanged artifact\(s\), .* referenced in /m);
    // the bytes read are those of the artifacts packed: none here
    expect(human.stdout).toMatch(/^ {2}input {4}0 B read, in 0 of 20 artifacts \(the rest referenced\), 1 layer\(s\)$/m);
    const ins = cli(["inspect", second.path]);
    expect(ins.stdout).toContain(`bases      ${first.id} (incremental: needs them beside it to restore)`);
    expect(ins.stdout).toMatch(/memory +files +v1 +20 artifacts .* \(19 referenced in bases\)/);
    expect(ins.stdout).toContain("manifest v2");
    const list = cli(["list", "-c", config]).stdout.split("\n");
    expect(list[0]).toMatch(/SIGNED +BASES +LABEL/);
    expect(list.find((l) => l.startsWith(first.id))).toMatch(/ no +- *$/);
    expect(list.find((l) => l.startsWith(second.id))).toMatch(/ no +1 *$/);
    const lj = JSON.parse(cli(["--json", "list", "-c", config]).stdout) as { snapshots: { id: string; bases: string[] }[] };
    expect(lj.snapshots.find((x) => x.id === second.id)!.bases).toEqual([first.id]);
  });

  it("--incremental with --out is a usage error", () => {
    const r = cli(["snapshot", "-c", config, "--incremental", "--out", join(work, "x.memsnap")]);
    expect(r.code).toBe(2);
    expect(r.stderr).toContain("[MEMSNAP_USAGE]");
  });

  it("restores in place from the incremental snapshot, its references read from the base", () => {
    writeFileSync(join(agent, "memory", "n5.md"), "the live file moved on\n");
    rmSync(join(agent, "memory", "n6.md"));
    const r = cli(["restore", second.id, "-c", config, "-i", key, "--no-safety-snapshot"]);
    expect(r.code, r.stderr).toBe(0);
    expect(readFileSync(join(agent, "memory", "n5.md"), "utf8")).toBe("note 5\n".repeat(100));
    expect(readFileSync(join(agent, "memory", "n6.md"), "utf8")).toBe("note 6\n".repeat(100));
    expect(readFileSync(join(agent, "memory", "n0.md"), "utf8")).toContain("changed\n");
  });

  it("export copies the bases beside the copy, which restores on its own; delete refuses a base", () => {
    const out = join(work, "exported");
    mkdirSync(out);
    const e = cli(["export", second.id, "-c", config, "--to", join(out, "mine.memsnap")]);
    expect(e.code, e.stderr).toBe(0);
    expect(e.stdout).toContain(`base ${first.id} copied to ${join(out, `${first.id}.memsnap`)}`);
    expect(readdirSync(out).sort()).toEqual([`${first.id}.memsnap`, "mine.memsnap"].sort());
    const r = cli(["restore", join(out, "mine.memsnap"), "--to", join(work, "elsewhere"), "-i", key]);
    expect(r.code, r.stderr).toBe(0);
    expect(readFileSync(join(work, "elsewhere", "memory", "n7.md"), "utf8")).toBe("note 7\n".repeat(100));
    const d = cli(["delete", first.id, "-c", config]);
    expect(d.code).toBe(2);
    expect(d.stderr).toContain(`the incremental snapshot ${second.id} references artifacts in it`);
  });
});
