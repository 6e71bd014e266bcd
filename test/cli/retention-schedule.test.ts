/**
 * Retention that protects the undo, signed schedules, and the small consistency fixes of issue
 * #39, through the real CLI: a store with a safety snapshot (from a real in-place restore),
 * labelled and unlabelled manual snapshots, and scheduled snapshots from a real `schedule`
 * process stopped with SIGTERM.
 */
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { beforeAll, describe, expect, it } from "vitest";
import { expectCliError, expectOk, jsonOut, makeAgent, runCli, startCli, type Agent } from "../helpers/cli.js";

interface Listed { id: string; snapshot_id: string; label: string | null; created_by: string; signed: boolean; path: string }
interface Decision { id: string; snapshot_id: string; keep: boolean; reasons: string[]; created_by: string; label: string | null }

let a: Agent;
let store: string;
let labelled = "";
let manual1 = "";
let manual2 = "";
let safety = "";
let pub = "";

const cfg = (): string[] => ["-c", a.config, "--store", store];
async function list(): Promise<Listed[]> {
  const r = await runCli(["--json", "list", ...cfg()], { cwd: a.dir });
  expectOk(r);
  return jsonOut(r).snapshots as Listed[];
}
async function snap(args: string[] = []): Promise<{ id: string; snapshot_id: string; path: string }> {
  const r = await runCli(["--json", "snapshot", ...cfg(), ...args], { cwd: a.dir });
  expectOk(r);
  return jsonOut(r);
}

/** Run `schedule …` until `until` holds for its events (or a deadline), then SIGTERM it. */
async function schedule(args: string[], until: (events: Record<string, unknown>[]) => boolean, extra: { cwd?: string } = {}) {
  const { child, done } = startCli(["schedule", ...args], { cwd: extra.cwd ?? a.dir, timeoutMs: 90_000 });
  let buf = "";
  const events: Record<string, unknown>[] = [];
  child.stdout!.on("data", (c: Buffer) => {
    buf += c.toString();
    let i;
    while ((i = buf.indexOf("\n")) >= 0) {
      events.push(JSON.parse(buf.slice(0, i)) as Record<string, unknown>);
      buf = buf.slice(i + 1);
    }
  });
  const deadline = Date.now() + 60_000;
  while (!until(events) && Date.now() < deadline && child.exitCode === null) await new Promise((r) => setTimeout(r, 50));
  child.kill("SIGTERM");
  const r = await done;
  return { r, events };
}

beforeAll(async () => {
  a = makeAgent({ agent: "keeper" });
  store = join(a.dir, "store");
  const k = await runCli(["keygen", "--sign", "-o", "sign.key"], { cwd: a.dir });
  expectOk(k);
  pub = k.stdout.trim();
  labelled = (await snap(["--label", "before-upgrade"])).id;
  writeFileSync(join(a.memoryDir, "MEMORY.md"), "# Memory\n\n- likes coffee now\n");
  manual1 = (await snap()).id;
  manual2 = (await snap()).id;
  // a real in-place restore takes the safety snapshot (auto:pre-restore-<id>) first
  expectOk(await runCli(["restore", labelled, ...cfg()], { cwd: a.dir }));
  const l = await list();
  const s = l.find((x) => x.created_by === "pre-restore");
  expect(s?.label).toBe(`auto:pre-restore-${labelled}`);
  safety = s!.id;
}, 120_000);

describe("prune protects the undo", () => {
  it("--dry-run names the protection of each kept snapshot; labelled and safety snapshots do not count for keep-last", async () => {
    const r = await runCli(["--json", "prune", ...cfg(), "--keep-last", "1", "--dry-run"], { cwd: a.dir });
    expectOk(r);
    const ds = jsonOut(r).agents[0].decisions as Decision[];
    const by = (id: string) => ds.find((d) => d.id === id)!;
    expect(ds.every((d) => d.snapshot_id === d.id)).toBe(true);
    expect(by(safety).keep).toBe(true);
    expect(by(safety).reasons.join("; ")).toMatch(/safety snapshot, kept until \S+ \(--keep-safety\)/);
    expect(by(labelled).keep).toBe(true);
    expect(by(labelled).reasons).toEqual(['labelled "before-upgrade": no rule names it (--keep-label/--prune-label)']);
    expect(by(manual2).reasons).toEqual(["last 1/1"]);
    expect(by(manual1).keep).toBe(false);
    // the text form shows the same, and nothing was removed
    const t = await runCli(["prune", ...cfg(), "--keep-last", "1", "--dry-run"], { cwd: a.dir });
    expectOk(t);
    expect(t.stdout).toMatch(new RegExp(`keep +${labelled} .*labelled "before-upgrade"`));
    expect(t.stdout).toMatch(new RegExp(`keep +${safety} .*safety snapshot`));
    expect(t.stdout).toMatch(new RegExp(`would remove ${manual1} .*\\(no rule keeps it\\)`));
    expect(await list()).toHaveLength(4);
  });

  it("a rule that names the label, or --keep-safety past the snapshot's age, lets the rules decide", async () => {
    const r = await runCli(["--json", "prune", ...cfg(), "--keep-last", "1", "--prune-label", "before-*", "--keep-safety", "0s", "--dry-run"], { cwd: a.dir });
    expectOk(r);
    const ds = jsonOut(r).agents[0].decisions as Decision[];
    // the safety snapshot is now the newest candidate: keep-last 1 keeps it, and only it
    expect(ds.filter((d) => d.keep).map((d) => d.id)).toEqual([safety]);
    const k = await runCli(["--json", "prune", ...cfg(), "--keep-last", "1", "--keep-label", "before-*", "--keep-safety", "0s", "--dry-run"], { cwd: a.dir });
    expect((jsonOut(k).agents[0].decisions as Decision[]).find((d) => d.id === labelled)!.reasons).toEqual(["label before-upgrade"]);
  });
});

describe("schedule", () => {
  it("--every 1s --keep-last 1: first snapshot at start, signed; the prune keeps safety, labelled and manual snapshots", async () => {
    const { r, events } = await schedule(
      [...cfg(), "--every", "1s", "--keep-last", "1", "--sign-key", join(a.dir, "sign.key")],
      (ev) => ev.filter((e) => e.event === "prune").length >= 3,
    );
    expect(r.code, r.stderr).toBe(0);
    const started = Date.parse(String(events.find((e) => e.event === "started")!.ts));
    const firstTick = Date.parse(String(events.find((e) => e.event === "tick")!.ts));
    expect(firstTick - started).toBeLessThan(900); // at start, not one interval later
    const made = events.filter((e) => e.event === "snapshot");
    expect(made.length).toBeGreaterThanOrEqual(3);
    expect(made.every((e) => e.signed === true)).toBe(true);
    const removed = events.filter((e) => e.event === "prune").flatMap((e) => e.removed_ids as string[]);
    expect(removed.length).toBeGreaterThanOrEqual(2);
    expect(removed.every((id) => made.some((m) => m.snapshot_id === id))).toBe(true); // only its own
    const left = await list();
    for (const id of [safety, labelled, manual1, manual2]) expect(left.map((s) => s.id)).toContain(id);
    const mine = left.filter((s) => s.created_by === "schedule");
    expect(mine.length).toBeGreaterThanOrEqual(1);
    expect(mine.length).toBeLessThanOrEqual(2); // SIGTERM may land between a snapshot and its prune
    for (const s of mine) {
      expect(s.signed).toBe(true);
      expectOk(await runCli(["verify", s.path, "--trust", pub], { cwd: a.dir }));
    }
  }, 120_000);

  it("--no-run-at-start waits one interval; the config's sign_key signs scheduled and manual snapshots", async () => {
    const signedCfg = join(a.dir, "signed.json");
    writeFileSync(signedCfg, JSON.stringify({
      tenant: "acme", agent: "keeper", sign_key: "sign.key", // relative to the config's directory
      sources: [{ kind: "files", name: "memory", path: "memory" }, { kind: "state", name: "state", path: "state" }],
    }));
    const { r, events } = await schedule(["-c", signedCfg, "--store", store, "--every", "1500ms", "--no-run-at-start", "--max-runs", "1"], () => false, { cwd: "/" });
    expect(r.code, r.stderr).toBe(0);
    const started = Date.parse(String(events.find((e) => e.event === "started")!.ts));
    const tick = Date.parse(String(events.find((e) => e.event === "tick")!.ts));
    expect(tick - started).toBeGreaterThanOrEqual(1400);
    const made = events.find((e) => e.event === "snapshot")!;
    expect(made.signed).toBe(true);
    expectOk(await runCli(["verify", String(made.path), "--trust", pub], { cwd: a.dir }));
    const s = await runCli(["--json", "snapshot", "-c", signedCfg, "--store", store, "--label", "signed-by-config"], { cwd: "/" });
    expectOk(s);
    expectOk(await runCli(["verify", jsonOut(s).path, "--trust", pub], { cwd: a.dir }));
  }, 120_000);

  it("--print systemd and cron keep --sign-key; cron snapshots are the schedule's and its prune decides only over them", async () => {
    const key = join(a.dir, "sign.key");
    const s = await runCli(["schedule", "-c", a.config, "--every", "1h", "--sign-key", key, "--keep-last", "3", "--prune-label", "tmp-*", "--print", "systemd"], { cwd: a.dir });
    expectOk(s);
    expect(/^ExecStart=(.*)$/m.exec(s.stdout)![1]).toMatch(new RegExp(` --every 1h --sign-key ${key} --keep-last 3 --prune-label 'tmp-\\*'$|--sign-key ${key} --keep-last 3 --prune-label "tmp-\\*"$`));
    const c = await runCli(["schedule", "-c", a.config, "--every", "1h", "--sign-key", key, "--keep-last", "3", "--print", "cron"], { cwd: a.dir });
    expectOk(c);
    expect(c.stdout).toMatch(new RegExp(` snapshot -c \\S+ --scheduled --label scheduled --wait 5m --sign-key ${key} && .* prune -c \\S+ --scheduled-only --keep-last 3`));
  });
});

describe("errors and output", () => {
  it("verify, inspect and restore of a path that does not exist: no such file, with the path, not damage", async () => {
    for (const cmd of [["verify"], ["inspect"], ["restore", "--to", "out"]]) {
      const r = await runCli([cmd[0]!, "missing/typo.memsnap", ...cmd.slice(1)], { cwd: a.dir });
      expectCliError(r, 6, "MEMSNAP_SOURCE_MISSING");
      expect(r.stderr).toContain(`no such file: ${join(a.dir, "missing", "typo.memsnap")}`);
      expect(r.stderr).not.toMatch(/damaged|altered/);
    }
  });

  it("a trailing comma in memsnap.json is accepted; other JSON errors name the line and column", async () => {
    const b = makeAgent({ configText: `{\n  // ${"a long comment ".repeat(20)}\n  "agent": "commas",\n  "sources": [\n    { "kind": "files", "name": "memory", "path": "memory", /* last */ },\n  ],\n}\n` });
    expectOk(await runCli(["snapshot", "-c", b.config, "-o", "x.memsnap"], { cwd: b.dir }));
    const bad = makeAgent({ configText: `{\n  // ${"a long comment ".repeat(20)}\n  "agent": "commas"\n  "sources": []\n}\n` });
    const r = await runCli(["snapshot", "-c", bad.config, "-o", "x.memsnap"], { cwd: bad.dir });
    expectCliError(r, 2, "MEMSNAP_CONFIG_INVALID");
    expect(r.stderr).toMatch(/at line 4, column 3/);
  });

  it("snapshot, list, prune and export --json carry snapshot_id (and id, for compatibility)", async () => {
    const s = await snap(["--label", "json-names"]);
    expect(s.snapshot_id).toBe(s.id);
    expect((await list()).every((x) => x.snapshot_id === x.id)).toBe(true);
    const e = await runCli(["--json", "export", s.id, ...cfg(), "--to", join(a.dir, "exported.memsnap")], { cwd: a.dir });
    expectOk(e);
    expect(jsonOut(e).snapshot_id).toBe(s.id);
    const d = await runCli(["--json", "delete", s.id, ...cfg()], { cwd: a.dir });
    expectOk(d);
    expect(jsonOut(d).snapshot_ids).toEqual([s.id]);
  });

  it("init --print ends with a newline", async () => {
    const b = makeAgent();
    const r = await runCli(["init", b.dir, "--print"], { cwd: b.dir });
    expectOk(r);
    expect(r.stdout.endsWith("}\n")).toBe(true);
  });
});
