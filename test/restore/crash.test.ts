// Crash safety, proven: a real restore (and a real snapshot) in a child process is killed with
// SIGKILL at every crash point it passes; after `memsnap recover` the live state hashes exactly
// equal to the pre-restore state or to the bundle's state, never a mix, and nothing is left over.
import { spawnSync } from "node:child_process";
import { createHash } from "node:crypto";
import { cpSync, existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, relative } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";

const BIN = new URL("../../bin/memsnap.js", import.meta.url).pathname;
const work = mkdtempSync(join(tmpdir(), "memsnap-crash-"));
afterAll(() => rmSync(work, { recursive: true, force: true }));

function cli(args: string[], env: Record<string, string> = {}) {
  const r = spawnSync(process.execPath, [BIN, ...args], { encoding: "utf8", env: { ...process.env, ...env } });
  return { code: r.status, signal: r.signal, stdout: r.stdout, stderr: r.stderr };
}

/** Hash of the live agent state: every file under the agent dir except memsnap's control dir. */
function stateHash(dir: string): string {
  const h = createHash("sha256");
  const walk = (d: string): void => {
    for (const n of readdirSync(d).sort()) {
      if (n === ".memsnap") continue;
      const p = join(d, n);
      if (statSync(p).isDirectory()) walk(p);
      else h.update(`${relative(dir, p)}\0${createHash("sha256").update(readFileSync(p)).digest("hex")}\n`);
    }
  };
  walk(dir);
  return h.digest("hex");
}

function leftovers(dir: string): string[] {
  const out: string[] = [];
  const walk = (d: string): void => {
    for (const n of readdirSync(d)) {
      const p = join(d, n);
      if (/\.memsnap-(new|old|staging|work)-|\.tmp-\d+-/.test(n)) out.push(p);
      else if (statSync(p).isDirectory() && n !== ".memsnap") walk(p);
    }
  };
  walk(dir);
  if (existsSync(join(dir, "agent", ".memsnap", "journal.json"))) out.push("journal.json");
  return out;
}

const template = join(work, "template");
const bundleState = join(work, "bundle-state");
const store = join(work, "store");
let bundle = "";
let preHash = "";
let bundleHash = "";

function writeAgent(root: string, variant: "bundle" | "pre"): void {
  mkdirSync(join(root, "agent", "memory", "notes"), { recursive: true });
  mkdirSync(join(root, "agent", "state"), { recursive: true });
  writeFileSync(join(root, "agent", "memsnap.json"), JSON.stringify({
    agent: "crashy", store: "../store", redaction: { enabled: false },
    sources: [
      { kind: "files", name: "memory", path: "memory" },
      { kind: "state", name: "state", path: "state" },
    ],
  }));
  for (let i = 0; i < 4; i++) writeFileSync(join(root, "agent", "memory", "notes", `n${i}.md`), `${variant} note ${i}\n`.repeat(50 + i));
  writeFileSync(join(root, "agent", "memory", "MEMORY.md"), `# memory (${variant})\n`);
  writeFileSync(join(root, "agent", "state", "cursor.json"), JSON.stringify({ cursor: variant === "bundle" ? 1 : 2 }));
  if (variant === "pre") writeFileSync(join(root, "agent", "memory", "only-pre.md"), "added after the bundle\n");
  else writeFileSync(join(root, "agent", "memory", "only-bundle.md"), "removed after the bundle\n");
}

beforeAll(() => {
  writeAgent(bundleState, "bundle");
  const r = cli(["snapshot", "-c", join(bundleState, "agent", "memsnap.json"), "--out", join(work, "b.memsnap")]);
  expect(r.code, r.stderr).toBe(0);
  bundle = join(work, "b.memsnap");
  bundleHash = stateHash(join(bundleState, "agent"));
  writeAgent(template, "pre");
  preHash = stateHash(join(template, "agent"));
  expect(preHash).not.toBe(bundleHash);
});

function freshAgent(): string {
  const root = mkdtempSync(join(work, "run-"));
  cpSync(join(template, "agent"), join(root, "agent"), { recursive: true });
  return join(root, "agent");
}

function restoreArgs(agent: string): string[] {
  return ["restore", bundle, "-c", join(agent, "memsnap.json"), "--store", store];
}

describe("restore crash safety", () => {
  it("an uninterrupted restore reaches the bundle state", () => {
    const agent = freshAgent();
    const r = cli(restoreArgs(agent));
    expect(r.code, r.stderr).toBe(0);
    expect(stateHash(agent)).toBe(bundleHash);
    expect(leftovers(join(agent, ".."))).toEqual([]);
    // restoring the same bundle twice works
    const again = cli(restoreArgs(agent));
    expect(again.code, again.stderr).toBe(0);
    expect(stateHash(agent)).toBe(bundleHash);
  });

  it("after SIGKILL at every crash point, recover leaves the old or the new state, never a mix", () => {
    const listing = join(work, "points.txt");
    const agent0 = freshAgent();
    const r0 = cli(restoreArgs(agent0), { MEMSNAP_CRASH_LIST: listing });
    expect(r0.code, r0.stderr).toBe(0);
    const points = readFileSync(listing, "utf8").trim().split("\n");
    // the points cover the lock, the safety snapshot, staging copies, the journal, every swap and cleanup
    for (const p of ["restore:locked", "snapshot:artifact", "restore:staged-entry", "restore:journal-staging", "restore:staged",
      "restore:journal-swapping", "restore:swap", "restore:committed", "restore:cleanup"]) {
      expect(points.some((x) => x.startsWith(`${p}:`)), p).toBe(true);
    }
    const outcomes = { old: 0, new: 0 };
    for (const point of points) {
      const agent = freshAgent();
      const r = cli(restoreArgs(agent), { MEMSNAP_CRASH_AT: point });
      expect(r.signal, `${point}: ${r.stderr}`).toBe("SIGKILL");
      const rec = cli(["recover", "-c", join(agent, "memsnap.json")]);
      expect(rec.code, `${point}: ${rec.stderr}`).toBe(0);
      const h = stateHash(agent);
      expect([preHash, bundleHash], `state after a kill at ${point} is a mix`).toContain(h);
      if (h === preHash) outcomes.old++;
      else outcomes.new++;
      expect(leftovers(join(agent, "..")), point).toEqual([]);
      // the agent is usable again: a later restore succeeds (the stale lock was taken over)
      const again = cli(restoreArgs(agent));
      expect(again.code, `${point}: ${again.stderr}`).toBe(0);
      expect(stateHash(agent)).toBe(bundleHash);
    }
    expect(outcomes.old).toBeGreaterThan(0);
    expect(outcomes.new).toBeGreaterThan(0);
    console.log(`crash harness: ${points.length} kill points (${outcomes.old} rolled back, ${outcomes.new} finished)`);
  }, 240_000); // 32 sequential restores, each killed and recovered: ~40 s idle, over 60 s on a loaded 2-core machine

  it("a command on an agent with a pending journal recovers it first", () => {
    const agent = freshAgent();
    const r = cli(restoreArgs(agent), { MEMSNAP_CRASH_AT: "restore:swap:2" });
    expect(r.signal).toBe("SIGKILL");
    expect(existsSync(join(agent, ".memsnap", "journal.json"))).toBe(true);
    const snap = cli(["snapshot", "-c", join(agent, "memsnap.json"), "--out", join(work, `after-crash-${Date.now()}.memsnap`)]);
    expect(snap.code, snap.stderr).toBe(0);
    expect(existsSync(join(agent, ".memsnap", "journal.json"))).toBe(false);
    expect(stateHash(agent)).toBe(bundleHash);
  });
});

describe("snapshot crash safety", () => {
  it("a snapshot killed anywhere leaves no bundle, and the next run removes its temp file; live state untouched", () => {
    const agent = freshAgent();
    const listing = join(work, "snap-points.txt");
    const outDir = mkdtempSync(join(work, "snapout-"));
    const ok = cli(["snapshot", "-c", join(agent, "memsnap.json"), "--out", join(outDir, "probe.memsnap")], { MEMSNAP_CRASH_LIST: listing });
    expect(ok.code, ok.stderr).toBe(0);
    rmSync(join(outDir, "probe.memsnap"));
    const points = readFileSync(listing, "utf8").trim().split("\n");
    expect(points.length).toBeGreaterThan(3);
    for (const point of points) {
      const out = join(outDir, "s.memsnap");
      const r = cli(["snapshot", "-c", join(agent, "memsnap.json"), "--out", out], { MEMSNAP_CRASH_AT: point });
      expect(r.signal, point).toBe("SIGKILL");
      expect(existsSync(out), point).toBe(false);
      expect(stateHash(agent)).toBe(preHash);
      // cleanup runs at the start of the next snapshot into the same directory
      const next = cli(["snapshot", "-c", join(agent, "memsnap.json"), "--out", join(outDir, "next.memsnap")]);
      expect(next.code, next.stderr).toBe(0);
      expect(readdirSync(outDir).sort(), point).toEqual(["next.memsnap"]);
      rmSync(join(outDir, "next.memsnap"));
    }
  });
});
