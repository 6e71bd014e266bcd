// `recover` trusts a journal only as far as the config and memsnap's own naming go (issue #35
// items 4 and 16): a hand-written .memsnap/journal.json that would remove or rename anything
// else (outside the agent, `..` tricks, through a symlink, the config or the control dir) is
// refused with MEMSNAP_JOURNAL_UNTRUSTED (exit 9) and nothing is touched, by `recover` and by
// every command that recovers first. A killed restore's scratch beside staging is removed.
import { spawnSync } from "node:child_process";
import { cpSync, existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, symlinkSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { tree } from "../helpers/tree.js";

const BIN = new URL("../../bin/memsnap.js", import.meta.url).pathname;
const work = mkdtempSync(join(tmpdir(), "memsnap-recover-journal-"));
afterAll(() => rmSync(work, { recursive: true, force: true }));

function cli(args: string[], env: Record<string, string> = {}) {
  const r = spawnSync(process.execPath, [BIN, ...args], { encoding: "utf8", timeout: 60_000, env: { ...process.env, ...env } });
  return { code: r.status, signal: r.signal, stdout: r.stdout, stderr: r.stderr };
}


const TAG = "abcdefabcdef-0";

/** An agent (memory files, state JSON) beside a directory it must never touch. */
function agentHome(sources?: unknown[]): { home: string; agent: string; config: string; precious: string } {
  const home = mkdtempSync(join(work, "home-"));
  const agent = join(home, "agent");
  const precious = join(home, "precious");
  mkdirSync(join(agent, "memory", "notes"), { recursive: true });
  mkdirSync(join(agent, "state"));
  mkdirSync(join(agent, ".memsnap"), { mode: 0o700 });
  mkdirSync(precious);
  writeFileSync(join(precious, "a.md"), "precious a\n");
  writeFileSync(join(precious, "x.md"), "precious x\n");
  writeFileSync(join(agent, "memory", "a.md"), "live a\n");
  writeFileSync(join(agent, "memory", "notes", "n.md"), "live n\n");
  writeFileSync(join(agent, "state", "cursor.json"), '{"c":1}');
  const config = join(agent, "memsnap.json");
  writeFileSync(config, JSON.stringify({
    agent: "victim", redaction: { enabled: false },
    sources: sources ?? [
      { kind: "files", name: "memory", path: "memory", include: ["**/*.md"] },
      { kind: "state", name: "state", path: "state" },
    ],
  }));
  return { home, agent, config, precious };
}

function journal(phase: string, staging: string[], backups: string[], swaps: unknown[]): string {
  return JSON.stringify({ version: 1, op: "restore", snapshot_id: "01JHXST1E00000000000000000", bundle: "/x", pid: 1, host: "h", started_at: "t", phase, staging, backups, swaps });
}

/** Write `text` as the agent's journal, run `args`; expect exit 9 MEMSNAP_JOURNAL_UNTRUSTED and nothing under home touched. */
function expectRefused(h: { home: string; agent: string; config: string }, text: string, args = ["recover"]): string {
  writeFileSync(join(h.agent, ".memsnap", "journal.json"), text);
  const before = tree(h.home);
  const r = cli([...args, "-c", h.config, "--json"]);
  const out = JSON.parse(r.stdout) as { error?: { code: string; message: string; hint: string } };
  expect({ exit: r.code, code: out.error?.code }, r.stdout + r.stderr).toEqual({ exit: 9, code: "MEMSNAP_JOURNAL_UNTRUSTED" });
  expect(out.error?.hint).toMatch(/nothing was changed.*remove the journal/);
  expect(tree(h.home)).toEqual(before);
  return out.error!.message;
}

describe("recover refuses a journal it did not write", () => {
  it("rm -rf of a directory outside the agent (staging phase)", () => {
    const h = agentHome();
    expectRefused(h, journal("staging", [h.precious], [], []));
    expectRefused(h, journal("committed", [], [h.precious], []));
    // memsnap's naming, but beside a directory that is no live root of the config
    const fake = `${h.precious}.memsnap-new-${TAG}`;
    cpSync(h.precious, fake, { recursive: true });
    expectRefused(h, journal("staging", [fake], [], []));
    expect(existsSync(fake)).toBe(true);
  });

  it("a rename of a path outside the agent, or of a layer the config does not have", () => {
    const h = agentHome();
    const root = join(h.agent, "memory");
    const backup = `${root}.memsnap-old-${TAG}`;
    const staging = `${root}.memsnap-new-${TAG}`;
    expectRefused(h, journal("swapping", [staging], [backup], [{ layer: "memory", target: join(h.precious, "a.md"), staged: null, backup: join(backup, "a.md") }]));
    // the target is the layer's, the backup is not memsnap's: the old file would be moved outside
    expectRefused(h, journal("swapping", [staging], [backup], [{ layer: "memory", target: join(root, "a.md"), staged: null, backup: join(h.precious, "moved.md") }]));
    // a staged path outside: a file of the precious directory would be moved into the agent
    expectRefused(h, journal("swapping", [staging], [backup], [{ layer: "memory", target: join(root, "a.md"), staged: join(h.precious, "a.md"), backup: join(backup, "a.md") }]));
    expectRefused(h, journal("swapping", [staging], [backup], [{ layer: "nope", target: join(root, "a.md"), staged: null, backup: join(backup, "a.md") }]));
    // a file the source does not own (outside its include globs)
    writeFileSync(join(root, "keep.bin"), "not the layer's\n");
    expectRefused(h, journal("swapping", [staging], [backup], [{ layer: "memory", target: join(root, "keep.bin"), staged: null, backup: join(backup, "keep.bin") }]));
    expect(readFileSync(join(h.precious, "a.md"), "utf8")).toBe("precious a\n");
  });

  it("'..' tricks and unnormalized paths", () => {
    const h = agentHome();
    const root = join(h.agent, "memory");
    const staging = `${root}.memsnap-new-${TAG}`;
    const backup = `${root}.memsnap-old-${TAG}`;
    expectRefused(h, journal("staging", [`${staging}/../precious`], [], []));
    expectRefused(h, journal("staging", [`${root}.memsnap-new-../../precious`], [], []));
    expectRefused(h, journal("staging", [`${staging}/`], [], []));
    expectRefused(h, journal("swapping", [staging], [backup], [{ layer: "memory", target: `${root}/../../precious/a.md`, staged: null, backup: join(backup, "a.md") }]));
    expectRefused(h, journal("swapping", [staging], [backup], [{ layer: "memory", target: join(root, "a.md"), staged: null, backup: `${backup}/../../precious/a.md` }]));
    expectRefused(h, journal("staging", ["memory.memsnap-new-abcdefabcdef-0"], [], []));
  });

  it("a rename through a symlinked component of the live tree, of staging or of backups", () => {
    const h = agentHome();
    const precious = tree(h.precious);
    const root = join(h.agent, "memory");
    const staging = `${root}.memsnap-new-${TAG}`;
    const backup = `${root}.memsnap-old-${TAG}`;
    // live memory/sub -> precious: removing memory/sub/x.md would move precious/x.md
    symlinkSync(h.precious, join(root, "sub"));
    mkdirSync(join(staging, "sub"), { recursive: true });
    writeFileSync(join(staging, "sub", "x.md"), "staged x\n");
    let m = expectRefused(h, journal("swapping", [staging], [backup], [{ layer: "memory", target: join(root, "sub", "x.md"), staged: join(staging, "sub", "x.md"), backup: join(backup, "sub", "x.md") }]));
    expect(m).toMatch(/memory\/sub is a symlink/);
    expectRefused(h, journal("swapping", [staging], [backup], [{ layer: "memory", target: join(root, "sub", "x.md"), staged: null, backup: join(backup, "sub", "x.md") }]));
    // the staging directory is a link to precious: its files would be moved into the agent
    rmSync(staging, { recursive: true });
    rmSync(join(root, "sub"));
    symlinkSync(h.precious, staging);
    m = expectRefused(h, journal("swapping", [staging], [backup], [{ layer: "memory", target: join(root, "a.md"), staged: join(staging, "a.md"), backup: join(backup, "a.md") }]));
    expect(m).toMatch(/memsnap-new-abcdefabcdef-0 is a symlink/);
    // the backup directory is a link to precious: the live file would be moved there
    rmSync(staging);
    symlinkSync(h.precious, backup);
    expectRefused(h, journal("swapping", [staging], [backup], [{ layer: "memory", target: join(root, "notes", "n.md"), staged: null, backup: join(backup, "notes", "n.md") }]));
    expectRefused(h, journal("swapping", [staging], [backup], [{ layer: "memory", target: join(root, "a.md"), staged: null, backup: join(backup, "a.md") }]));
    expect(tree(h.precious)).toEqual(precious);
    expect(readFileSync(join(h.precious, "x.md"), "utf8")).toBe("precious x\n");
  });

  it("the config file and the control dir, even where a source at '.' would own them", () => {
    const h = agentHome([{ kind: "state", name: "top", path: ".", include: ["**/*.json"] }]);
    const root = h.agent;
    const staging = `${root}.memsnap-new-${TAG}`;
    const backup = `${root}.memsnap-old-${TAG}`;
    mkdirSync(staging);
    writeFileSync(join(staging, "memsnap.json"), '{"agent":"victim","hooks":{"on_created":["/bin/false"]},"sources":[]}');
    expectRefused(h, journal("swapping", [staging], [backup], [{ layer: "top", target: join(root, "memsnap.json"), staged: join(staging, "memsnap.json"), backup: join(backup, "memsnap.json") }]));
    expectRefused(h, journal("swapping", [staging], [backup], [{ layer: "top", target: join(root, "memsnap.json"), staged: null, backup: join(backup, "memsnap.json") }]));
    writeFileSync(join(root, ".memsnap", "other.json"), "{}");
    expectRefused(h, journal("swapping", [staging], [backup], [{ layer: "top", target: join(root, ".memsnap", "other.json"), staged: null, backup: join(backup, ".memsnap", "other.json") }]));
  });

  it("an unparseable journal; and snapshot, which recovers first, refuses it too and touches nothing", () => {
    const h = agentHome();
    expectRefused(h, "{ not json");
    expectRefused(h, JSON.stringify({ version: 1, op: "restore", phase: "staging", staging: "x", swaps: [] }));
    expectRefused(h, journal("staging", [h.precious], [], []), ["snapshot", "--out", join(h.home, "s.memsnap")]);
    expect(existsSync(join(h.home, "s.memsnap"))).toBe(false);
  });
});

describe("recover after a killed restore", () => {
  let bundle = "";
  beforeAll(() => {
    const h = agentHome();
    writeFileSync(join(h.agent, "memory", "a.md"), "bundle a\n");
    const r = cli(["snapshot", "-c", h.config, "--out", join(work, "b.memsnap")]);
    expect(r.code, r.stderr).toBe(0);
    bundle = join(work, "b.memsnap");
  });

  it("removes the scratch a layer's rebuild left beside staging (git's .<staging>.git-restore-…)", () => {
    const h = agentHome();
    const before = tree(h.home);
    const r = cli(["restore", bundle, "-c", h.config, "--no-safety-snapshot"], { MEMSNAP_CRASH_AT: "restore:journal-staging" });
    expect(r.signal).toBe("SIGKILL");
    const j = JSON.parse(readFileSync(join(h.agent, ".memsnap", "journal.json"), "utf8")) as { staging: string[] };
    // what git's materialize makes beside a staging directory, killed before its finally ran
    for (const s of j.staging) {
      mkdirSync(s, { recursive: true });
      const scratch = join(h.agent, `.${s.split("/").pop()}.git-restore-Ab12Cd`);
      mkdirSync(scratch);
      writeFileSync(join(scratch, "repo.bundle"), "half a bundle");
    }
    const rec = cli(["recover", "-c", h.config]);
    expect(rec.code, rec.stderr).toBe(0);
    expect(rec.stdout).toMatch(/rolled back/);
    expect(readdirSync(h.agent).filter((n) => n.includes("memsnap-")), "leftovers").toEqual([]);
    expect(tree(h.home)).toEqual(before);
  });

  it("a journal memsnap wrote is still finished after a kill in the swap phase", () => {
    const h = agentHome();
    const r = cli(["restore", bundle, "-c", h.config, "--no-safety-snapshot"], { MEMSNAP_CRASH_AT: "restore:swap:1" });
    expect(r.signal).toBe("SIGKILL");
    const rec = cli(["recover", "-c", h.config]);
    expect(rec.code, rec.stderr).toBe(0);
    expect(rec.stdout).toMatch(/finished/);
    expect(readFileSync(join(h.agent, "memory", "a.md"), "utf8")).toBe("bundle a\n");
    expect(readdirSync(h.agent).filter((n) => n.includes("memsnap-"))).toEqual([]);
    expect(existsSync(join(h.agent, ".memsnap", "journal.json"))).toBe(false);
  });
});
