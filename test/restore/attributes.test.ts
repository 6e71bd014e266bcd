/**
 * A restore gives files, state and trace files back their permission bits and mtimes (as
 * `tar -x` does; they came back 0600 and stamped with the restore's time): into a new
 * directory, in place, and through an incremental bundle's references. Set-uid, set-gid and
 * sticky bits never come back, and a mode is masked by the restoring process's umask
 * (`mode & 0o777 & ~umask`) for every kind, SQLite and KV files included, and
 * for hand-built hostile bundles. Through the CLI, with real files.
 */
import { spawnSync } from "node:child_process";
import { chmodSync, mkdirSync, readdirSync, readFileSync, statSync, utimesSync, writeFileSync } from "node:fs";
import { createRequire } from "node:module";
import { join, relative } from "node:path";
import { describe, expect, it } from "vitest";
import { agentlogId, parseLossless } from "../../src/util/canonical-agentlog.js";
import { currentUmask } from "../../src/util/umask.js";
import { BIN, expectOk, jsonOut, makeAgent, runCliSync, tempDir } from "../helpers/cli.js";
import { generateKvDump } from "../helpers/kv-dump.js";

const T = new Date("2024-05-06T07:08:09.123Z");
const T2 = new Date("2023-01-02T03:04:05.678Z");

function agentWithModes() {
  const a = makeAgent({ files: { "run.sh": "#!/bin/sh\necho hi\n", "notes/private.md": "mine\n", "shared.md": "ours\n", "odd.md": "setuid?\n" } });
  chmodSync(join(a.memoryDir, "run.sh"), 0o755);
  chmodSync(join(a.memoryDir, "notes/private.md"), 0o600);
  chmodSync(join(a.memoryDir, "shared.md"), 0o664);
  chmodSync(join(a.memoryDir, "odd.md"), 0o4755);
  for (const f of ["run.sh", "notes/private.md", "shared.md", "odd.md"]) utimesSync(join(a.memoryDir, f), T, T);
  utimesSync(join(a.stateDir, "cursor.json"), T2, T2);
  chmodSync(join(a.stateDir, "cursor.json"), 0o640);
  return a;
}

const modeOf = (p: string): number => statSync(p).mode & 0o7777;
/** The umask the CLI runs under in these first tests (the test process's). */
const UMASK = currentUmask();
/** A file's mtime as a Date shows it (whole milliseconds), what an index records. */
const msOf = (p: string): number => statSync(p).mtime.getTime();

describe("restored files keep their modes and mtimes", () => {
  it("into a new directory", () => {
    const a = agentWithModes();
    const s = runCliSync(["snapshot", "-c", a.config, "--out", join(a.dir, "b.memsnap"), "--json"]);
    expectOk(s);
    const to = join(tempDir("memsnap-attrs-"), "r");
    expectOk(runCliSync(["restore", join(a.dir, "b.memsnap"), "--to", to]));
    expect(modeOf(join(to, "memory", "run.sh"))).toBe(0o755);
    expect(modeOf(join(to, "memory", "notes/private.md"))).toBe(0o600);
    expect(modeOf(join(to, "memory", "shared.md"))).toBe(0o664 & ~UMASK); // within the umask (0644 under 022)
    expect(modeOf(join(to, "memory", "odd.md"))).toBe(0o755); // no set-uid bit from a bundle
    expect(msOf(join(to, "memory", "run.sh"))).toBe(msOf(join(a.memoryDir, "run.sh")));
    expect(Math.abs(msOf(join(to, "memory", "run.sh")) - T.getTime())).toBeLessThanOrEqual(1);
    expect(modeOf(join(to, "state", "cursor.json"))).toBe(0o640);
    expect(msOf(join(to, "state", "cursor.json"))).toBe(msOf(join(a.stateDir, "cursor.json")));
    expect(Math.abs(msOf(join(to, "state", "cursor.json")) - T2.getTime())).toBeLessThanOrEqual(1);
  });

  it("in place, over files whose modes and times changed since", () => {
    const a = agentWithModes();
    const store = join(a.dir, "store");
    const s = runCliSync(["snapshot", "-c", a.config, "--store", store, "--json"]);
    expectOk(s);
    const shared = msOf(join(a.memoryDir, "shared.md"));
    chmodSync(join(a.memoryDir, "run.sh"), 0o644);
    writeFileSync(join(a.memoryDir, "shared.md"), "edited\n");
    chmodSync(join(a.memoryDir, "shared.md"), 0o600);
    expectOk(runCliSync(["restore", (jsonOut(s) as { path: string }).path, "-c", a.config, "--store", store, "--no-safety-snapshot"]));
    expect(modeOf(join(a.memoryDir, "run.sh"))).toBe(0o755);
    expect(modeOf(join(a.memoryDir, "shared.md"))).toBe(0o664 & ~UMASK);
    expect(readFileSync(join(a.memoryDir, "shared.md"), "utf8")).toBe("ours\n");
    expect(msOf(join(a.memoryDir, "shared.md"))).toBe(shared);
  });

  it("through an incremental bundle's references (the files read from its base)", () => {
    const a = agentWithModes();
    const store = join(a.dir, "store");
    expectOk(runCliSync(["snapshot", "-c", a.config, "--store", store, "--incremental"]));
    writeFileSync(join(a.memoryDir, "new.md"), "new\n");
    const s = runCliSync(["snapshot", "-c", a.config, "--store", store, "--incremental", "--json"]);
    expectOk(s);
    expect((jsonOut(s) as { incremental: { referenced: number } }).incremental.referenced).toBeGreaterThan(3);
    const to = join(tempDir("memsnap-attrs-"), "r");
    expectOk(runCliSync(["restore", (jsonOut(s) as { path: string }).path, "--to", to]));
    expect(modeOf(join(to, "memory", "run.sh"))).toBe(0o755);
    expect(msOf(join(to, "memory", "run.sh"))).toBe(msOf(join(a.memoryDir, "run.sh")));
    expect(modeOf(join(to, "state", "cursor.json"))).toBe(0o640);
  });
});

// ------------------------------------------------------------------ issue 35, items 8 and 15
// A restored file's mode is its captured mode & 0o777 & ~umask, for every kind that restores
// modes, into a new directory and in place; a SQLite database comes back with its own mode.

/** The rule: what a file captured with `mode` is restored as under `umask`. */
const rule = (mode: number, umask: number): number => mode & 0o777 & ~umask;

/** Run the CLI under a umask set by the shell, as a user's login shell would. */
function cliUnderUmask(umask: number, args: string[], cwd: string, env: Record<string, string> = {}) {
  const e: NodeJS.ProcessEnv = { ...process.env, XDG_DATA_HOME: join(cwd, ".xdg-data"), ...env };
  delete e.MEMSNAP_STORE;
  const r = spawnSync("sh", ["-c", `umask ${umask.toString(8).padStart(3, "0")} && exec "$0" "$@"`, process.execPath, BIN, ...args], {
    cwd, env: e, encoding: "utf8", timeout: 60_000,
  });
  return { code: r.status, signal: r.signal, stdout: r.stdout, stderr: r.stderr };
}

function agentlog(agent: string): string {
  const meta = { agent };
  const first = { version: "0.1", id: agentlogId(parseLossless(JSON.stringify(meta))), kind: "metadata", ts: "2024-06-01T00:00:00Z", parent: null, payload: meta };
  return `${JSON.stringify(first)}\n`;
}

/** Every regular file under `root` (relative path → permission bits, special bits included). */
function modesUnder(root: string): Record<string, number> {
  const out: Record<string, number> = {};
  const walk = (d: string): void => {
    for (const e of readdirSync(d, { withFileTypes: true })) {
      const p = join(d, e.name);
      if (e.isDirectory()) walk(p);
      else if (e.isFile()) out[relative(root, p)] = statSync(p).mode & 0o7777;
    }
  };
  walk(root);
  return out;
}

/** An agent with a files, state, trace, sqlite, kv and git layer, each holding files of wide and special modes. */
function agentOfEveryKind() {
  const a = makeAgent({
    files: { "wide.sh": "w\n", "setuid.sh": "u\n", "setgid.sh": "g\n", "sticky.md": "t\n", "group.md": "o\n", "private.md": "p\n" },
    config: {
      agent: "modes", redaction: { enabled: false },
      sources: [
        { kind: "files", name: "memory", path: "memory" },
        { kind: "state", name: "state", path: "state" },
        { kind: "trace", name: "traces", path: "traces" },
        { kind: "sqlite", name: "db", path: "db" },
        { kind: "kv", name: "kv", path: "kv", format: "memsnap" },
        { kind: "git", name: "repo", path: "repo" },
      ],
    },
  });
  const modes: Record<string, number> = { "wide.sh": 0o777, "setuid.sh": 0o4755, "setgid.sh": 0o2755, "sticky.md": 0o1777, "group.md": 0o664, "private.md": 0o600 };
  for (const [f, m] of Object.entries(modes)) chmodSync(join(a.memoryDir, f), m);
  chmodSync(join(a.stateDir, "cursor.json"), 0o666);
  mkdirSync(join(a.dir, "traces"));
  writeFileSync(join(a.dir, "traces", "run.agentlog"), agentlog("modes"), { mode: 0o666 });
  chmodSync(join(a.dir, "traces", "run.agentlog"), 0o666);
  mkdirSync(join(a.dir, "db"));
  const Database = createRequire(import.meta.url)("better-sqlite3") as typeof import("better-sqlite3");
  const db = new Database(join(a.dir, "db", "app.db"));
  db.exec("CREATE TABLE notes(body TEXT); INSERT INTO notes VALUES ('kept')");
  db.close();
  chmodSync(join(a.dir, "db", "app.db"), 0o644);
  generateKvDump({ dir: join(a.dir, "kv"), nLayers: 2, sequences: 2, prefixBlocks: 1, ownBlocks: 1, zeroBlocks: 1 });
  const kvModes = modesUnder(join(a.dir, "kv"));
  const kvFiles = Object.keys(kvModes).sort();
  expect(kvFiles.length).toBeGreaterThan(1);
  chmodSync(join(a.dir, "kv", kvFiles[0]!), 0o4777);
  chmodSync(join(a.dir, "kv", kvFiles[1]!), 0o666);
  const repo = join(a.dir, "repo");
  mkdirSync(repo);
  const git = (...args: string[]): void => {
    const r = spawnSync("git", ["-c", "user.email=t@example.com", "-c", "user.name=t", ...args], { cwd: repo, encoding: "utf8" });
    expect(r.status, r.stderr).toBe(0);
  };
  git("init", "-q");
  writeFileSync(join(repo, "committed.md"), "c\n");
  git("add", ".");
  git("commit", "-q", "-m", "init");
  writeFileSync(join(repo, "dirty.md"), "uncommitted\n", { mode: 0o644 });
  writeFileSync(join(repo, "run.sh"), "#!/bin/sh\n", { mode: 0o755 });
  chmodSync(join(repo, "dirty.md"), 0o644);
  chmodSync(join(repo, "run.sh"), 0o755);
  return { a, modes, kv: modesUnder(join(a.dir, "kv")) };
}

describe("restored modes: captured mode & 0o777 & ~umask (issue 35 items 8, 15)", () => {
  it.each([["022", 0o022], ["077", 0o077]] as const)("every kind into a new directory, under umask %s", (_u, umask) => {
    const { a, modes, kv } = agentOfEveryKind();
    const bundle = join(a.dir, "b.memsnap");
    expectOk(runCliSync(["snapshot", "-c", a.config, "--out", bundle]));
    const to = join(tempDir("memsnap-modes-"), "r");
    const r = cliUnderUmask(umask, ["restore", bundle, "--to", to], a.dir);
    expect(r.code, r.stderr).toBe(0);
    for (const [f, m] of Object.entries(modes)) expect([f, modeOf(join(to, "memory", f))]).toEqual([f, rule(m, umask)]);
    expect(modeOf(join(to, "state", "cursor.json"))).toBe(rule(0o666, umask));
    expect(modeOf(join(to, "traces", "run.agentlog"))).toBe(rule(0o666, umask));
    // item 15: the database keeps its own mode (it came back 0600), after its materialize
    expect(modeOf(join(to, "db", "app.db"))).toBe(rule(0o644, umask));
    const Database = createRequire(import.meta.url)("better-sqlite3") as typeof import("better-sqlite3");
    const db = new Database(join(to, "db", "app.db"), { readonly: true });
    expect(db.prepare("SELECT body FROM notes").all()).toEqual([{ body: "kept" }]);
    db.close();
    // a KV dump's files (rebuilt from its own index, whose 04777 came back as given)
    const restoredKv = modesUnder(join(to, "kv"));
    expect(Object.keys(restoredKv).sort()).toEqual(Object.keys(kv).sort());
    for (const [f, m] of Object.entries(kv)) expect([f, restoredKv[f]]).toEqual([f, rule(m, umask)]);
    // git: the committed files as git checks them out (0666 less the umask); the uncommitted
    // ones, whose modes memsnap does not record (only the executable bit), 0600 or 0700,
    // never more open than the umask allows
    expect(modeOf(join(to, "repo", "committed.md"))).toBe(rule(0o666, umask));
    expect(modeOf(join(to, "repo", "dirty.md"))).toBe(rule(0o600, umask));
    expect(modeOf(join(to, "repo", "run.sh"))).toBe(rule(0o700, umask));
  });

  it("in place under umask 077: files, state and the SQLite database", () => {
    const { a, modes } = agentOfEveryKind();
    const store = join(a.dir, "store");
    const s = runCliSync(["snapshot", "-c", a.config, "--store", store, "--json"]);
    expectOk(s);
    for (const f of Object.keys(modes)) chmodSync(join(a.memoryDir, f), 0o644);
    writeFileSync(join(a.memoryDir, "wide.sh"), "changed\n");
    chmodSync(join(a.dir, "db", "app.db"), 0o600);
    const r = cliUnderUmask(0o077, ["restore", (jsonOut(s) as { path: string }).path, "-c", a.config, "--store", store, "--no-safety-snapshot", "--only", "memory", "--only", "state", "--only", "db"], a.dir);
    expect(r.code, r.stderr).toBe(0);
    for (const [f, m] of Object.entries(modes)) expect([f, modeOf(join(a.memoryDir, f))]).toEqual([f, rule(m, 0o077)]);
    expect(readFileSync(join(a.memoryDir, "wide.sh"), "utf8")).toBe("w\n");
    expect(modeOf(join(a.stateDir, "cursor.json"))).toBe(0o600);
    expect(modeOf(join(a.dir, "db", "app.db"))).toBe(0o600);
  });

  it("in place under umask 022: a SQLite database captured 0644 comes back 0644", () => {
    const { a } = agentOfEveryKind();
    const store = join(a.dir, "store");
    const s = runCliSync(["snapshot", "-c", a.config, "--store", store, "--json"]);
    expectOk(s);
    chmodSync(join(a.dir, "db", "app.db"), 0o600);
    const r = cliUnderUmask(0o022, ["restore", (jsonOut(s) as { path: string }).path, "-c", a.config, "--store", store, "--no-safety-snapshot", "--only", "db"], a.dir);
    expect(r.code, r.stderr).toBe(0);
    expect(modeOf(join(a.dir, "db", "app.db"))).toBe(0o644);
  });

  // Hand-built hostile bundles (scripts/hostile/modes-keys.mjs): index modes 0777, 04755,
  // 02755, 01777 and 07777 in files, state, trace, sqlite and kv layers, plaintext and encrypted.
  const hostile = new URL("../../fixtures/hostile/", import.meta.url).pathname;
  const special: Record<string, number> = { "wide.sh": 0o777, "setuid.sh": 0o4755, "setgid.sh": 0o2755, "sticky.md": 0o1777, "all.sh": 0o7777, "group.md": 0o664, "private.md": 0o600 };
  const expectations: Record<string, Record<string, number>> = {
    "modes-files-special-bits.memsnap": Object.fromEntries(Object.entries(special).map(([f, m]) => [`memory/${f}`, m])),
    "modes-files-special-bits-encrypted.memsnap": Object.fromEntries(Object.entries(special).map(([f, m]) => [`memory/${f}`, m])),
    "modes-state-special-bits.memsnap": Object.fromEntries(Object.entries(special).map(([f, m]) => [`state/${f}.json`, m])),
    "modes-trace-special-bits.memsnap": Object.fromEntries(Object.entries(special).map(([f, m]) => [`traces/${f}.agentlog`, m])),
    "modes-sqlite-special-bits.memsnap": { "db/app.db": 0o4777 },
    // a KV layer's files get their modes from its own kv-index.json, in the rebuild
    "modes-kv-special-bits.memsnap": Object.fromEntries(Object.entries(special).map(([f, m]) => [`kv/${f}`, m])),
    "modes-kv-special-bits-encrypted.memsnap": Object.fromEntries(Object.entries(special).map(([f, m]) => [`kv/${f}`, m])),
    "modes-three-layers-encrypted.memsnap": Object.fromEntries(Object.entries(special).flatMap(([f, m]) => [
      [`memory/${f}`, m], [`state/${f}.json`, m], [`traces/${f}.agentlog`, m],
    ])),
  };
  it.each(Object.keys(expectations).flatMap((f) => [[f, "022", 0o022], [f, "077", 0o077]] as const))("hostile %s under umask %s: each file is mode & 0o777 & ~umask", (file, _u, umask) => {
    const to = join(tempDir("memsnap-modes-hostile-"), "r");
    const args = ["restore", join(hostile, file), "--to", to];
    if (file.includes("encrypted")) args.push("-i", join(hostile, "victim.key"));
    const r = cliUnderUmask(umask, args, tempDir());
    expect(r.code, r.stderr).toBe(0);
    const got = modesUnder(to);
    delete got[join(".memsnap", "manifest.json")];
    expect(got).toEqual(Object.fromEntries(Object.entries(expectations[file]!).map(([p, m]) => [p, rule(m, umask)])));
  });

  it.each([["022", 0o022], ["077", 0o077]] as const)("hostile modes-three-layers-encrypted.memsnap in place under umask %s: the live files are mode & 0o777 & ~umask", (_u, umask) => {
    const a = makeAgent({
      files: { "old.md": "live\n" },
      config: {
        agent: "victim", redaction: { enabled: false },
        sources: [{ kind: "files", name: "memory", path: "memory" }, { kind: "state", name: "state", path: "state" }, { kind: "trace", name: "traces", path: "traces" }],
      },
    });
    const r = cliUnderUmask(umask, ["restore", join(hostile, "modes-three-layers-encrypted.memsnap"), "-c", a.config, "--as-agent", "--no-safety-snapshot",
      "-i", join(hostile, "victim.key")], a.dir);
    expect(r.code, r.stderr).toBe(0);
    for (const [f, m] of Object.entries(special)) {
      expect([f, modeOf(join(a.memoryDir, f))]).toEqual([f, rule(m, umask)]);
      expect([f, modeOf(join(a.stateDir, `${f}.json`))]).toEqual([f, rule(m, umask)]);
      expect([f, modeOf(join(a.dir, "traces", `${f}.agentlog`))]).toEqual([f, rule(m, umask)]);
    }
  });
});
