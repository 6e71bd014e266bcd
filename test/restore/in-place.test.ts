// In-place restore through the real CLI: safety snapshot, agent checks, --only, --dry-run, locking.
import { spawn, spawnSync } from "node:child_process";
import { existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { hostname, tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeEach, describe, expect, it } from "vitest";
import { acquireLock } from "../../src/agent/lock.js";
import { readLayout } from "../../src/format/container.js";
import { parseManifest } from "../../src/format/manifest.js";
import { recipientFingerprint } from "../../src/codecs/age/keys.js";

const BIN = new URL("../../bin/memsnap.js", import.meta.url).pathname;
const work = mkdtempSync(join(tmpdir(), "memsnap-inplace-"));
afterAll(() => rmSync(work, { recursive: true, force: true }));

function cli(args: string[]) {
  const r = spawnSync(process.execPath, [BIN, ...args], { encoding: "utf8" });
  return { code: r.status, stdout: r.stdout, stderr: r.stderr };
}

let agent = "";
let store = "";
let bundle = "";
let bundleId = "";

function makeAgent(name = "scribe"): string {
  const a = mkdtempSync(join(work, "agent-"));
  mkdirSync(join(a, "memory", "people"), { recursive: true });
  mkdirSync(join(a, "state"));
  writeFileSync(join(a, "memory", "MEMORY.md"), "# v1\n");
  writeFileSync(join(a, "memory", "people", "ada.md"), "ada v1\n");
  writeFileSync(join(a, "memory", "keep.bin"), "not a markdown file: outside the layer's globs\n");
  writeFileSync(join(a, "state", "cursor.json"), '{"c":1}');
  writeFileSync(join(a, "memsnap.json"), JSON.stringify({
    agent: name, redaction: { enabled: false },
    sources: [
      { kind: "files", name: "memory", path: "memory", include: ["**/*.md"] },
      { kind: "state", name: "state", path: "state" },
    ],
  }));
  return a;
}

beforeEach(() => {
  agent = makeAgent();
  store = join(agent, "..", `store-${Date.now()}`);
  const r = cli(["snapshot", "-c", join(agent, "memsnap.json"), "--store", store, "--json"]);
  expect(r.code, r.stderr).toBe(0);
  ({ path: bundle, id: bundleId } = JSON.parse(r.stdout) as { path: string; id: string });
  // the live agent moves on
  writeFileSync(join(agent, "memory", "MEMORY.md"), "# v2\n");
  rmSync(join(agent, "memory", "people", "ada.md"));
  writeFileSync(join(agent, "memory", "new.md"), "new\n");
  writeFileSync(join(agent, "memory", "keep.bin"), "changed, but not ours\n");
  writeFileSync(join(agent, "state", "cursor.json"), '{"c":2}');
});

describe("restore in place", () => {
  it("restores the layers, keeps files outside the layer's globs, and takes a labelled safety snapshot first", () => {
    const r = cli(["restore", bundle, "-c", join(agent, "memsnap.json"), "--store", store, "--json"]);
    expect(r.code, r.stderr).toBe(0);
    const out = JSON.parse(r.stdout) as { safety_snapshot: { path: string }; layers: string[] };
    expect(out.layers).toEqual(["memory", "state"]);
    expect(readFileSync(join(agent, "memory", "MEMORY.md"), "utf8")).toBe("# v1\n");
    expect(readFileSync(join(agent, "memory", "people", "ada.md"), "utf8")).toBe("ada v1\n");
    expect(existsSync(join(agent, "memory", "new.md"))).toBe(false);
    expect(readFileSync(join(agent, "memory", "keep.bin"), "utf8")).toBe("changed, but not ours\n");
    expect(readFileSync(join(agent, "state", "cursor.json"), "utf8")).toBe('{"c":1}');
    // the safety snapshot holds the pre-restore state and says what it is
    return readLayout(out.safety_snapshot.path).then((l) => {
      const m = parseManifest(l.manifestBytes);
      expect(m.created_by).toBe("pre-restore");
      expect(m.label).toBe(`auto:pre-restore-${bundleId}`);
      expect(m.index?.some((e) => e.path === "memory/new.md")).toBe(true);
    });
  });

  it("--no-safety-snapshot skips it; restoring the same bundle twice works", () => {
    for (let i = 0; i < 2; i++) {
      const r = cli(["restore", bundle, "-c", join(agent, "memsnap.json"), "--no-safety-snapshot", "--json"]);
      expect(r.code, r.stderr).toBe(0);
      expect((JSON.parse(r.stdout) as { safety_snapshot: unknown }).safety_snapshot).toBeNull();
    }
    expect(readdirSync(join(store, "default", "scribe"))).toHaveLength(1);
  });

  it("--only restores one layer", () => {
    const r = cli(["restore", bundle, "-c", join(agent, "memsnap.json"), "--store", store, "--only", "state"]);
    expect(r.code, r.stderr).toBe(0);
    expect(readFileSync(join(agent, "state", "cursor.json"), "utf8")).toBe('{"c":1}');
    expect(readFileSync(join(agent, "memory", "MEMORY.md"), "utf8")).toBe("# v2\n");
  });

  it("--dry-run prints the plan and touches nothing", () => {
    const r = cli(["restore", bundle, "-c", join(agent, "memsnap.json"), "--store", store, "--dry-run", "--json"]);
    expect(r.code, r.stderr).toBe(0);
    const plan = (JSON.parse(r.stdout) as { plan: { layers: { layer: string; added: string[]; removed: string[]; changed: string[] }[] } }).plan;
    const mem = plan.layers.find((l) => l.layer === "memory")!;
    expect(mem.added).toEqual(["people/ada.md"]);
    expect(mem.removed).toEqual(["new.md"]);
    expect(mem.changed).toEqual(["MEMORY.md"]);
    expect(readFileSync(join(agent, "memory", "MEMORY.md"), "utf8")).toBe("# v2\n");
    expect(readdirSync(join(store, "default", "scribe"))).toHaveLength(1);
  });

  it("refuses another agent's bundle unless --as-agent", () => {
    const other = makeAgent("other");
    const r = cli(["restore", bundle, "-c", join(other, "memsnap.json"), "--no-safety-snapshot"]);
    expect(r.code).toBe(2);
    expect(r.stderr).toContain("[MEMSNAP_AGENT_MISMATCH]");
    expect(r.stderr).toContain("hint: pass --as-agent");
    const ok = cli(["restore", bundle, "-c", join(other, "memsnap.json"), "--no-safety-snapshot", "--as-agent"]);
    expect(ok.code, ok.stderr).toBe(0);
  });

  it("fails with the locked code while another process holds the agent, and waits with --wait", async () => {
    const lock = await acquireLock(agent, { command: "test" });
    const r = cli(["restore", bundle, "-c", join(agent, "memsnap.json"), "--store", store]);
    expect(r.code).toBe(7);
    expect(r.stderr).toContain("[MEMSNAP_LOCKED]");
    expect(r.stderr).toContain(`pid ${process.pid}`);
    expect(readFileSync(join(agent, "memory", "MEMORY.md"), "utf8")).toBe("# v2\n");
    // with --wait it proceeds once the lock is released
    const child = spawn(process.execPath, [BIN, "restore", bundle, "-c", join(agent, "memsnap.json"), "--store", store, "--wait", "20s"]);
    const done = new Promise<number | null>((res) => child.on("exit", res));
    await new Promise((r2) => setTimeout(r2, 700));
    await lock.release();
    expect(await done).toBe(0);
    expect(readFileSync(join(agent, "memory", "MEMORY.md"), "utf8")).toBe("# v1\n");
  });

  it("takes over a stale lock left by a dead process", () => {
    mkdirSync(join(agent, ".memsnap"), { recursive: true });
    const dead = spawnSync(process.execPath, ["-e", "process.exit(0)"]).pid;
    writeFileSync(join(agent, ".memsnap", "lock"), JSON.stringify({ pid: dead, host: hostname(), started_at: new Date().toISOString(), command: "snapshot" }));
    const r = cli(["restore", bundle, "-c", join(agent, "memsnap.json"), "--no-safety-snapshot"]);
    expect(r.code, r.stderr).toBe(0);
    expect(existsSync(join(agent, ".memsnap", "lock"))).toBe(false);
  });

  it("a write-back error when the staged files are flushed is exit 8 and leaves the live state as it was", () => {
    // syncfs(2) reports write-back errors (Linux >= 5.8) and `sync -f` then fails with the
    // errno's text; a `sync` earlier on PATH stands in for a failing disk.
    const bin = mkdtempSync(join(work, "fake-sync-"));
    writeFileSync(join(bin, "sync"), `#!/bin/sh\necho "sync: error syncing '$2': Input/output error" >&2\nexit 1\n`, { mode: 0o755 });
    const before = readdirSync(join(agent, "memory")).sort();
    const r = spawnSync(process.execPath, [BIN, "restore", bundle, "-c", join(agent, "memsnap.json"), "--no-safety-snapshot"], {
      encoding: "utf8", env: { ...process.env, PATH: `${bin}:${process.env.PATH ?? ""}` },
    });
    expect(r.status, r.stderr).toBe(8);
    expect(r.stderr).toContain("[MEMSNAP_DEST_UNWRITABLE]");
    expect(r.stderr).toContain("Input/output error");
    // untouched: the v2 files, no staging or backup siblings, no journal, no lock
    expect(readFileSync(join(agent, "memory", "MEMORY.md"), "utf8")).toBe("# v2\n");
    expect(readFileSync(join(agent, "state", "cursor.json"), "utf8")).toBe('{"c":2}');
    expect(readdirSync(join(agent, "memory")).sort()).toEqual(before);
    expect(readdirSync(agent).filter((n) => n.includes(".memsnap-"))).toEqual([]);
    expect(existsSync(join(agent, ".memsnap", "journal.json"))).toBe(false);
    expect(existsSync(join(agent, ".memsnap", "lock"))).toBe(false);
    // and a restore with a working disk then goes through
    const ok = cli(["restore", bundle, "-c", join(agent, "memsnap.json"), "--no-safety-snapshot"]);
    expect(ok.code, ok.stderr).toBe(0);
    expect(readFileSync(join(agent, "memory", "MEMORY.md"), "utf8")).toBe("# v1\n");
  });
});

describe("the safety snapshot is encrypted like the bundle it is taken for", () => {
  // It keeps the live files exactly (no redaction): it must not sit in the store in plaintext
  // beside encrypted bundles just because the config names no recipients.
  const safetyOf = (stdout: string): { id: string; path: string; encrypted: boolean } =>
    (JSON.parse(stdout) as { safety_snapshot: { id: string; path: string; encrypted: boolean } }).safety_snapshot;
  const keygen = (name: string): { key: string; recipient: string } => {
    const key = join(work, `${name}-${Date.now()}.txt`);
    const r = cli(["keygen", "-o", key]);
    expect(r.code, r.stderr).toBe(0);
    return { key, recipient: r.stdout.trim() };
  };
  /** Snapshot the v2 agent into a fresh store, encrypted with `args`; the live agent then moves on to v3. */
  const encryptedBundle = (args: string[]): { store: string; path: string } => {
    const s = mkdtempSync(join(work, "store-enc-"));
    const r = cli(["snapshot", "-c", join(agent, "memsnap.json"), "--store", s, "--json", ...args]);
    expect(r.code, r.stderr).toBe(0);
    writeFileSync(join(agent, "memory", "MEMORY.md"), "# v3\n");
    return { store: s, path: (JSON.parse(r.stdout) as { path: string }).path };
  };

  it("to the recipient of the identity that opens the bundle, and restores with it", () => {
    const a = keygen("a");
    const { store: s, path } = encryptedBundle(["-r", a.recipient]);
    const r = cli(["restore", path, "-c", join(agent, "memsnap.json"), "--store", s, "-i", a.key, "--json"]);
    expect(r.code, r.stderr).toBe(0);
    expect(readFileSync(join(agent, "memory", "MEMORY.md"), "utf8")).toBe("# v2\n");
    const safety = safetyOf(r.stdout);
    expect(safety.encrypted).toBe(true);
    return readLayout(safety.path).then((l) => {
      const m = parseManifest(l.manifestBytes);
      expect(m.payload.encryption?.recipients).toEqual([{ type: "x25519", fingerprint: recipientFingerprint(a.recipient) }]);
      // the same key opens it, and it holds the live state from before the restore
      const out = join(work, `safety-${Date.now()}`);
      const back = cli(["restore", safety.path, "--to", out, "-i", a.key]);
      expect(back.code, back.stderr).toBe(0);
      expect(readFileSync(join(out, "memory", "MEMORY.md"), "utf8")).toBe("# v3\n");
      expect(cli(["restore", safety.path, "--to", `${out}-nokey`]).code).toBe(4);
    });
  });

  it("to the config's recipients when it names any", () => {
    const a = keygen("a");
    const b = keygen("b");
    const cfg = JSON.parse(readFileSync(join(agent, "memsnap.json"), "utf8")) as Record<string, unknown>;
    writeFileSync(join(agent, "memsnap.json"), JSON.stringify({ ...cfg, recipients: [b.recipient] }));
    const { store: s, path } = encryptedBundle(["-r", a.recipient]);
    const r = cli(["restore", path, "-c", join(agent, "memsnap.json"), "--store", s, "-i", a.key, "--json"]);
    expect(r.code, r.stderr).toBe(0);
    return readLayout(safetyOf(r.stdout).path).then((l) => {
      expect(parseManifest(l.manifestBytes).payload.encryption?.recipients).toEqual([{ type: "x25519", fingerprint: recipientFingerprint(b.recipient) }]);
    });
  });

  it("with the bundle's passphrase", () => {
    const pw = join(work, `pw-${Date.now()}.txt`);
    writeFileSync(pw, "correct horse battery staple\n");
    const { store: s, path } = encryptedBundle(["--passphrase-file", pw]);
    const r = cli(["restore", path, "-c", join(agent, "memsnap.json"), "--store", s, "--passphrase-file", pw]);
    expect(r.code, r.stderr).toBe(0);
    expect(r.stdout).toContain("(encrypted with the bundle's passphrase)");
    const id = /safety snapshot (\S+)/.exec(r.stdout)![1]!;
    return readLayout(join(s, "default", "scribe", `${id}.memsnap`)).then((l) => {
      expect(parseManifest(l.manifestBytes).payload.encryption?.recipients).toEqual([{ type: "scrypt" }]);
    });
  });

  it("not at all for a plaintext bundle and a config without recipients, and the restore says so", () => {
    const r = cli(["restore", bundle, "-c", join(agent, "memsnap.json"), "--store", store]);
    expect(r.code, r.stderr).toBe(0);
    expect(r.stdout).toMatch(/safety snapshot \S+ → .* \(not encrypted\)/);
    expect(r.stderr).toContain("is not encrypted and not redacted");
    expect(r.stderr).toContain(join(agent, "memsnap.json"));
  });
});

describe("restore in place: layers that share a live directory", () => {
  // `memsnap init` on an agent that keeps a database and its state JSON side by side writes a
  // sqlite source for the file and a state source for the directory: both layers' live root
  // is the agent's directory. Each must be staged, rebuilt and swapped on its own.
  it("a database, state JSON and notes in one directory are each restored, and nothing else is touched", async () => {
    const { createRequire } = await import("node:module");
    const Database = createRequire(import.meta.url)("better-sqlite3") as typeof import("better-sqlite3");
    const a = mkdtempSync(join(work, "shared-"));
    /** The live agent at version `v`: its database row, its state and its note. */
    const live = (v: number): void => {
      const db = new Database(join(a, "memory.db"));
      db.exec(`CREATE TABLE IF NOT EXISTS facts(x TEXT); DELETE FROM facts; INSERT INTO facts VALUES ('v${v}');`);
      db.close();
      writeFileSync(join(a, "state.json"), `{"cursor":${v}}`);
      writeFileSync(join(a, "note.md"), `v${v}\n`);
    };
    live(1);
    writeFileSync(join(a, "other.txt"), "no layer's\n");
    writeFileSync(join(a, "memsnap.json"), JSON.stringify({
      agent: "shared", redaction: { enabled: false },
      sources: [
        { kind: "sqlite", name: "memory", path: "memory.db" },
        { kind: "state", name: "state", path: ".", include: ["/state.json"] },
        { kind: "files", name: "notes", path: ".", include: ["/*.md"] },
      ],
    }));
    const st = join(a, "..", `store-shared-${Date.now()}`);
    const s = cli(["snapshot", "-c", join(a, "memsnap.json"), "--store", st, "--json"]);
    expect(s.code, s.stderr).toBe(0);
    const b = (JSON.parse(s.stdout) as { path: string }).path;
    live(2);
    writeFileSync(join(a, "new.md"), "after the snapshot\n");
    writeFileSync(join(a, "other.txt"), "changed, not a layer's\n");
    const r = cli(["restore", b, "-c", join(a, "memsnap.json"), "--store", st, "--json"]);
    expect(r.code, r.stderr).toBe(0);
    expect((JSON.parse(r.stdout) as { layers: string[] }).layers).toEqual(["memory", "state", "notes"]);
    const db3 = new Database(join(a, "memory.db"), { readonly: true });
    expect(db3.prepare("SELECT x FROM facts").pluck().all()).toEqual(["v1"]);
    db3.close();
    expect(readFileSync(join(a, "state.json"), "utf8")).toBe('{"cursor":1}');
    expect(readFileSync(join(a, "note.md"), "utf8")).toBe("v1\n");
    expect(existsSync(join(a, "new.md"))).toBe(false);
    expect(readFileSync(join(a, "other.txt"), "utf8")).toBe("changed, not a layer's\n");
    expect(readdirSync(a).sort()).toEqual([".memsnap", "memory.db", "memsnap.json", "note.md", "other.txt", "state.json"]);
    expect(readdirSync(join(a, "..")).filter((n) => n.startsWith(`${a.split("/").pop()}.memsnap-`))).toEqual([]);
  });
});

describe("restore in place: the before_restore hook", () => {
  /** The agent's config with hooks added (before_restore as given, on_failed logging to a file). */
  function withHooks(before: string[]): string {
    const cfgPath = join(agent, "memsnap.json");
    const cfg = JSON.parse(readFileSync(cfgPath, "utf8")) as Record<string, unknown>;
    cfg.hooks = { before_restore: before, on_failed: ["/bin/sh", "-c", `cat > ${join(agent, "..", "failed.json")}`], timeout_ms: 5000 };
    writeFileSync(cfgPath, JSON.stringify(cfg));
    return cfgPath;
  }

  it("runs once the lock is held, before the safety snapshot, with the bundle and layers on stdin", () => {
    // The hook stands in for stopping the agent: it writes the agent's last state, which the
    // safety snapshot must then hold, and records what it was given.
    const got = join(agent, "..", "before.json");
    const cfg = withHooks(["/bin/sh", "-c", `cat > ${got}; test -f ${join(agent, ".memsnap", "lock")} && echo '{"c":3}' > ${join(agent, "state", "cursor.json")}`]);
    const r = cli(["restore", bundle, "-c", cfg, "--store", store, "--json"]);
    expect(r.code, r.stderr).toBe(0);
    expect(JSON.parse(readFileSync(got, "utf8"))).toEqual({ event: "before_restore", bundle, tenant: "default", agent: "scribe", layers: ["memory", "state"] });
    expect(readFileSync(join(agent, "state", "cursor.json"), "utf8")).toBe('{"c":1}'); // restored over it
    const safety = (JSON.parse(r.stdout) as { safety_snapshot: { path: string } }).safety_snapshot.path;
    const out = join(agent, "..", `safety-${Date.now()}`);
    expect(cli(["restore", safety, "--to", out]).code).toBe(0);
    expect(readFileSync(join(out, "state", "cursor.json"), "utf8")).toBe('{"c":3}\n'); // what the hook left
  });

  it("a hook that fails stops the restore before anything: exit 7, MEMSNAP_HOOK_REFUSED, no safety snapshot, on_failed told", () => {
    const cfg = withHooks(["/bin/sh", "-c", "echo 'agent will not stop' >&2; exit 1"]);
    const r = cli(["restore", bundle, "-c", cfg, "--store", store]);
    expect(r.code).toBe(7);
    expect(r.stderr).toMatch(/the before_restore hook \(\/bin\/sh -c .*\) failed: exit 1: agent will not stop; nothing was restored \[MEMSNAP_HOOK_REFUSED\]/);
    expect(readFileSync(join(agent, "memory", "MEMORY.md"), "utf8")).toBe("# v2\n");
    expect(readFileSync(join(agent, "state", "cursor.json"), "utf8")).toBe('{"c":2}');
    expect(readdirSync(join(store, "default", "scribe")).filter((n) => n.endsWith(".memsnap"))).toEqual([`${bundleId}.memsnap`]); // no safety snapshot
    expect(JSON.parse(readFileSync(join(agent, "..", "failed.json"), "utf8")).error.code).toBe("MEMSNAP_HOOK_REFUSED");
    expect(existsSync(join(agent, ".memsnap", "lock"))).toBe(false);
    // --dry-run does not run it
    expect(cli(["restore", bundle, "-c", cfg, "--store", store, "--dry-run"]).code).toBe(0);
  });
});
