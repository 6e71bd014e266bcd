// Operating a store through the real CLI: list, diff, export, delete, prune (with concurrent
// processes and other processes' temp files), hooks, and the scheduler as a real service.
import { spawn, spawnSync } from "node:child_process";
import { existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, utimesSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";

const BIN = new URL("../../bin/memsnap.js", import.meta.url).pathname;
const work = mkdtempSync(join(tmpdir(), "memsnap-ops-"));
afterAll(() => rmSync(work, { recursive: true, force: true }));
const agent = join(work, "agent");
const store = join(work, "store");
const agentStore = join(store, "default", "ops");

function cli(args: string[]) {
  const r = spawnSync(process.execPath, [BIN, ...args], { encoding: "utf8", cwd: work });
  return { code: r.status, stdout: r.stdout, stderr: r.stderr };
}
function json<T>(args: string[]): T {
  const r = cli([...args, "--json"]);
  expect(r.code, r.stderr).toBe(0);
  return JSON.parse(r.stdout) as T;
}
const cfg = ["-c", join(agent, "memsnap.json")];

beforeAll(() => {
  mkdirSync(join(agent, "mem"), { recursive: true });
  writeFileSync(join(agent, "mem", "a.md"), "a\n");
  writeFileSync(join(agent, "mem", "b.md"), "b\n");
  writeFileSync(join(agent, "memsnap.json"), JSON.stringify({
    agent: "ops", store: "../store", redaction: { enabled: false },
    hooks: { on_created: ["/bin/sh", "-c", `cat >> ${join(work, "hook.jsonl")}`], on_failed: ["/bin/sh", "-c", "exit 3"] },
    sources: [{ kind: "files", name: "mem", path: "mem" }],
  }));
});

describe("store operations", () => {
  let first = "";
  let second = "";

  it("snapshots into the store layout and lists them", () => {
    first = json<{ id: string }>(["snapshot", ...cfg, "--label", "one"]).id;
    writeFileSync(join(agent, "mem", "a.md"), "a changed\n");
    rmSync(join(agent, "mem", "b.md"));
    writeFileSync(join(agent, "mem", "c.md"), "c\n");
    second = json<{ id: string }>(["snapshot", ...cfg, "--label", "two"]).id;
    expect(readdirSync(agentStore).filter((n) => /^[0-9A-Z]{26}\.memsnap$/.test(n)).sort()).toEqual([`${first}.memsnap`, `${second}.memsnap`]);
    const l = json<{ snapshots: { id: string; label: string; created_by: string; encrypted: boolean; signed: boolean; size: number }[] }>(["list", ...cfg]);
    expect(l.snapshots.map((s) => [s.id, s.label, s.created_by, s.encrypted, s.signed])).toEqual([[first, "one", "cli", false, false], [second, "two", "cli", false, false]]);
    const table = cli(["list", ...cfg]).stdout;
    expect(table.split("\n")[0]).toMatch(/^ID\s+AGENT\s+CREATED\s+BY\s+SIZE\s+ENC\s+SIGNED\s+BASES\s+LABEL/);
  });

  it("the on_created hook received the snapshot's metadata on stdin", () => {
    const lines = readFileSync(join(work, "hook.jsonl"), "utf8").trim().split("\n").map((l) => JSON.parse(l) as { event: string; snapshot_id: string });
    expect(lines.map((l) => [l.event, l.snapshot_id])).toEqual([["on_created", first], ["on_created", second]]);
  });

  it("a failing hook is reported and never breaks the command", () => {
    const r = cli(["snapshot", ...cfg, "--out", "/nonexistent-dir/x.memsnap"]);
    expect(r.code).toBe(8);
    expect(r.stderr).toContain("warning: hook on_failed");
  });

  it("diff shows added, changed and removed artifacts per layer", () => {
    const d = json<{ layers: { layer: string; added: { path: string }[]; changed: { path: string }[]; removed: { path: string }[] }[] }>(["diff", first.slice(0, 20), second, ...cfg]);
    expect(d.layers[0]!.added.map((x) => x.path)).toEqual(["mem/c.md"]);
    expect(d.layers[0]!.changed.map((x) => x.path)).toEqual(["mem/a.md"]);
    expect(d.layers[0]!.removed.map((x) => x.path)).toEqual(["mem/b.md"]);
  });

  it("export copies a verified bundle out and refuses to overwrite", () => {
    json(["export", first, ...cfg, "--to", join(work, "exported.memsnap")]);
    expect(readFileSync(join(work, "exported.memsnap")).equals(readFileSync(join(agentStore, `${first}.memsnap`)))).toBe(true);
    const again = cli(["export", first, ...cfg, "--to", join(work, "exported.memsnap")]);
    expect(again.code).toBe(8);
    expect(again.stderr).toContain("[MEMSNAP_DEST_EXISTS]");
  });

  it("delete refuses the agent's last snapshot without --force", () => {
    json(["delete", first, ...cfg]);
    const r = cli(["delete", second, ...cfg]);
    expect(r.code).toBe(2);
    expect(r.stderr).toContain("refusing to delete the last snapshot");
    expect(existsSync(join(agentStore, `${second}.memsnap`))).toBe(true);
  });

  it("prune --dry-run lists decisions with their rule; prune applies them; concurrent prunes and snapshots are safe", async () => {
    for (let i = 0; i < 4; i++) json(["snapshot", ...cfg]);
    const dry = json<{ agents: { decisions: { id: string; keep: boolean; reasons: string[] }[] }[] }>(["prune", ...cfg, "--keep-last", "2", "--prune-label", "*", "--dry-run"]);
    const ds = dry.agents[0]!.decisions;
    expect(ds.filter((d) => d.keep).map((d) => d.reasons[d.reasons.length - 1])).toEqual(["last 1/2", "last 2/2"]);
    expect(ds.filter((d) => !d.keep)).toHaveLength(3);
    expect(readdirSync(agentStore).filter((n) => /^[0-9A-Z]{26}\.memsnap$/.test(n))).toHaveLength(5);
    // three processes at once: two prunes and a snapshot; all succeed, and the store ends consistent
    const run = (args: string[]) => new Promise<number | null>((res) => spawn(process.execPath, [BIN, ...args], { cwd: work, stdio: "ignore" }).on("exit", res));
    const codes = await Promise.all([
      run(["prune", ...cfg, "--keep-last", "2", "--prune-label", "*"]), run(["prune", ...cfg, "--keep-last", "2", "--prune-label", "*"]), run(["snapshot", ...cfg, "--wait", "30s"]),
    ]);
    expect(codes).toEqual([0, 0, 0]);
    const left = readdirSync(agentStore).filter((n) => /^[0-9A-Z]{26}\.memsnap$/.test(n));
    expect(left.length).toBeGreaterThanOrEqual(2);
    expect(left.length).toBeLessThanOrEqual(3);
    const ok = cli(["verify", join(agentStore, left[0]!)]);
    expect(ok.code, ok.stderr).toBe(0);
  });

  it("prune removes dead processes' leftovers by age and never a live process's temp file", () => {
    const deadPid = spawnSync(process.execPath, ["-e", "0"]).pid!;
    const old = Date.now() / 1000 - 3600;
    const live = join(agentStore, `.X.memsnap.tmp-${process.pid}-abcd1234`);
    const dead = join(agentStore, `.Y.memsnap.tmp-${deadPid}-abcd1234`);
    const fresh = join(agentStore, `.Z.memsnap.tmp-${deadPid}-ffff0000`);
    for (const p of [live, dead, fresh]) writeFileSync(p, "partial");
    utimesSync(live, old, old);
    utimesSync(dead, old, old);
    const r = json<{ agents: { orphans: string[] }[] }>(["prune", ...cfg, "--keep-last", "10"]);
    expect(r.agents[0]!.orphans).toEqual([dead]);
    expect(existsSync(live)).toBe(true);
    expect(existsSync(fresh)).toBe(true); // younger than the age threshold
    rmSync(live);
    rmSync(fresh);
  });
});

describe("schedule", () => {
  it("prints unit files for systemd and cron", () => {
    const s = cli(["schedule", ...cfg, "--every", "1h", "--keep-daily", "7", "--print", "systemd"]);
    expect(s.code, s.stderr).toBe(0);
    expect(s.stdout).toContain("[Service]");
    expect(s.stdout).toMatch(/ExecStart=.* schedule -c .*memsnap\.json --every 1h --keep-daily 7/);
    const c = cli(["schedule", ...cfg, "--cron", "*/15 * * * *", "--keep-last", "3", "--print", "cron"]);
    expect(c.code, c.stderr).toBe(0);
    expect(c.stdout).toMatch(/^\*\/15 \* \* \* \* .* snapshot -c .* && .* prune -c .* --keep-last 3/m);
    const i = cli(["schedule", ...cfg, "--every", "1h", "--incremental", "--keep-last", "3", "--print", "systemd"]);
    expect(i.stdout).toMatch(/ExecStart=.* schedule -c .*memsnap\.json --every 1h --incremental --keep-last 3/);
    const ic = cli(["schedule", ...cfg, "--every", "1h", "--incremental", "--print", "cron"]);
    expect(ic.stdout).toMatch(/ snapshot -c .* --incremental/);
  });

  it("the systemd unit keeps every option given and starts memsnap through its bin script (memory flags)", () => {
    const s = cli(["schedule", ...cfg, "--every", "6h", "--jitter", "5m", "--missed", "skip", "--store", "my store", "--keep-last", "3", "--print", "systemd"]);
    expect(s.code, s.stderr).toBe(0);
    const exec = /^ExecStart=(.*)$/m.exec(s.stdout)![1]!;
    expect(exec).toBe(`${BIN} schedule -c ${join(agent, "memsnap.json")} --every 6h --jitter 5m --missed skip --store "${join(work, "my store")}" --keep-last 3`);
  });

  it("cron: an interval becomes cron fields, or a usage error when cron cannot say it", () => {
    const when = (every: string) => cli(["schedule", ...cfg, "--every", every, "--print", "cron"]);
    expect(when("30m").stdout).toMatch(/^\*\/30 \* \* \* \* /m);
    expect(when("1m").stdout).toMatch(/^\* \* \* \* \* /m);
    expect(when("6h").stdout).toMatch(/^0 \*\/6 \* \* \* /m);
    expect(when("1d").stdout).toMatch(/^0 3 \* \* \* /m);
    for (const bad of ["7m", "5h", "2d"]) {
      const r = when(bad);
      expect(r.code, bad).toBe(2);
      expect(r.stderr).toContain(`cron cannot run every ${bad} [MEMSNAP_USAGE]`);
      expect(r.stdout).toBe("");
    }
  });

  it("cron: the line runs under sh as cron would, jitter included, and logs every command's output", () => {
    const home = join(work, "cron-home");
    const a = join(work, "cron-agent");
    mkdirSync(join(a, "mem"), { recursive: true });
    writeFileSync(join(a, "mem", "n.md"), "note\n");
    writeFileSync(join(a, "memsnap.json"), JSON.stringify({ agent: "cronned", store: "store", sources: [{ kind: "files", name: "mem", path: "mem" }] }));
    const r = cli(["schedule", "-c", join(a, "memsnap.json"), "--every", "15m", "--jitter", "1s", "--keep-last", "1", "--print", "cron"]);
    expect(r.code, r.stderr).toBe(0);
    const line = r.stdout.split("\n").find((l) => l.startsWith("*/15 "))!;
    // cron hands the command after the five fields to sh, with each \% turned into %.
    const command = line.split(" ").slice(5).join(" ").replace(/\\%/g, "%");
    expect(command).toContain("sleep $((");
    for (let i = 0; i < 2; i++) {
      const run = spawnSync("/bin/sh", ["-c", command], { encoding: "utf8", env: { ...process.env, HOME: home } });
      expect(run.status, run.stderr).toBe(0);
    }
    const log = readFileSync(join(home, ".local", "state", "memsnap-cronned.log"), "utf8");
    expect(log.match(/^snapshot [0-9A-Z]{26}$/gm)).toHaveLength(2); // the snapshot's own output is logged
    expect(log).toMatch(/^ {2}remove [0-9A-Z]{26} /m); // and the prune's, which kept the newest
    expect(readdirSync(join(a, "store", "default", "cronned")).filter((f) => /^[0-9A-Z]{26}\.memsnap$/.test(f))).toHaveLength(1);
  });

  it("a run refused for want of encryption says to name recipients in the config (schedule has no -r)", () => {
    // a git memdir whose history holds a token: a plaintext bundle of it is refused
    const a = join(work, "leaky");
    const git = (...args: string[]) => {
      const r = spawnSync("git", ["-C", join(a, "mem"), "-c", "user.name=t", "-c", "user.email=t@example.com", ...args], { encoding: "utf8" });
      expect(r.status, r.stderr).toBe(0);
    };
    mkdirSync(join(a, "mem"), { recursive: true });
    git("init", "-q");
    writeFileSync(join(a, "mem", "leak.md"), "gh: ghp_ZZabcdefghijklmnopqrstuvwxyz01234567\n");
    git("add", ".");
    git("commit", "-qm", "leak");
    git("rm", "-q", "leak.md");
    git("commit", "-qm", "unleak");
    writeFileSync(join(a, "memsnap.json"), JSON.stringify({ agent: "leaky", sources: [{ kind: "git", name: "mem", path: "mem" }] }));
    const r = spawnSync(process.execPath, [BIN, "schedule", "-c", join(a, "memsnap.json"), "--store", join(a, "store"), "--every", "100ms", "--max-runs", "1"], { encoding: "utf8" });
    expect(r.status, r.stderr).toBe(0);
    const failed = r.stdout.trim().split("\n").map((l) => JSON.parse(l) as { event: string; error?: { code: string; hint: string } }).find((e) => e.event === "failed");
    expect(failed?.error?.code).toBe("MEMSNAP_UNREDACTED_SECRETS");
    expect(failed?.error?.hint).toContain(`name recipients in ${join(a, "memsnap.json")}`);
    expect(failed?.error?.hint).not.toContain("-r age1");
  });

  it("--incremental: the ticks after the first reference the unchanged files, and pruning keeps their bases", async () => {
    const store = join(work, "inc-schedule-store");
    const child = spawnSync(process.execPath, [BIN, "schedule", ...cfg, "--store", store, "--every", "100ms", "--max-runs", "3", "--incremental", "--keep-last", "1"], { cwd: work, encoding: "utf8" });
    expect(child.status, child.stderr).toBe(0);
    const events = child.stdout.trim().split("\n").map((l) => JSON.parse(l) as Record<string, unknown>);
    const snaps = events.filter((e) => e.event === "snapshot");
    expect(snaps).toHaveLength(3);
    expect(snaps[0]!.referenced).toBe(0);
    expect(snaps[1]!.referenced).toBeGreaterThan(0);
    expect(snaps[2]!.bases).toEqual([snaps[0]!.snapshot_id]); // nothing changed: still the first one's bytes
    // keep-last 1 keeps the newest and, as its base, the first
    const left = readdirSync(join(store, "default", "ops")).filter((n) => /^[0-9A-Z]{26}\.memsnap$/.test(n)).sort();
    expect(left).toEqual([`${String(snaps[0]!.snapshot_id)}.memsnap`, `${String(snaps[2]!.snapshot_id)}.memsnap`]);
    const v = cli(["verify", join(store, "default", "ops", left[1]!)]);
    expect(v.code, v.stderr).toBe(0);
  });

  it("runs as a service at a fast interval, never overlaps itself, prunes, logs JSON lines, and stops cleanly on SIGTERM", async () => {
    const lines: Record<string, unknown>[] = [];
    const child = spawn(process.execPath, [BIN, "schedule", ...cfg, "--every", "300ms", "--keep-last", "3"], { cwd: work });
    let buf = "";
    child.stdout.on("data", (c: Buffer) => {
      buf += c.toString();
      let i;
      while ((i = buf.indexOf("\n")) >= 0) {
        lines.push(JSON.parse(buf.slice(0, i)) as Record<string, unknown>);
        buf = buf.slice(i + 1);
      }
    });
    const exited = new Promise<number | null>((res) => child.on("exit", res));
    while (lines.filter((l) => l.event === "snapshot").length < 3) await new Promise((r) => setTimeout(r, 50));
    // a second scheduler for the same agent refuses to start
    const second = cli(["schedule", ...cfg, "--every", "1s"]);
    expect(second.code).toBe(7);
    expect(second.stderr).toContain("[MEMSNAP_LOCKED]");
    child.kill("SIGTERM");
    expect(await exited).toBe(0);
    expect(lines[0]!.event).toBe("started");
    expect(lines[lines.length - 1]!.event).toBe("stopped");
    expect(lines.some((l) => l.event === "prune")).toBe(true);
    expect(lines.every((l) => typeof l.ts === "string")).toBe(true);
    // the schedule prunes only its own snapshots: keep-last 3, and one more if SIGTERM came between a snapshot and its prune
    const listed = json<{ snapshots: { created_by: string }[] }>(["list", ...cfg]).snapshots;
    expect(listed.filter((x) => x.created_by === "schedule").length).toBeLessThanOrEqual(4);
    expect(listed.filter((x) => x.created_by === "cli").length).toBeGreaterThanOrEqual(2); // the manual ones are untouched
    expect(readdirSync(agentStore).filter((n) => n.startsWith("."))).toEqual([".memsnap"]); // no partial files
  });
});
