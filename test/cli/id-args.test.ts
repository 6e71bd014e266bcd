/**
 * `inspect`, `verify` and `restore` take what `memsnap list` shows: a snapshot id or a unique
 * prefix of one, looked up in the store (--store, $MEMSNAP_STORE, or the config's), as well as
 * a path. A file of that name wins; an unknown id is MEMSNAP_SOURCE_MISSING (exit 6) naming
 * the store, an ambiguous prefix MEMSNAP_USAGE (exit 2); an in-place restore looks only among
 * its own agent's snapshots unless --as-agent.
 */
import { copyFileSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { runCliSync } from "../helpers/cli.js";

const work = mkdtempSync(join(tmpdir(), "memsnap-ids-"));
afterAll(() => rmSync(work, { recursive: true, force: true }));

const cli = (args: string[], opts: { cwd?: string; env?: Record<string, string> } = {}) => runCliSync(args, { cwd: opts.cwd ?? work, ...(opts.env ? { env: opts.env } : {}) });

const store = join(work, "store");

function agent(name: string): { dir: string; config: string } {
  const dir = join(work, name);
  mkdirSync(join(dir, "memory"), { recursive: true });
  writeFileSync(join(dir, "memory", "MEMORY.md"), `# ${name}\n`);
  const config = join(dir, "memsnap.json");
  writeFileSync(config, JSON.stringify({ agent: name, store, redaction: { enabled: false }, sources: [{ kind: "files", name: "memory", path: "memory" }] }));
  return { dir, config };
}

function snap(config: string): { id: string; path: string } {
  const r = cli(["snapshot", "-c", config, "--json"]);
  expect(r.code, r.stderr).toBe(0);
  return JSON.parse(r.stdout) as { id: string; path: string };
}

let scribe: { dir: string; config: string };
let other: { dir: string; config: string };
let s1: { id: string; path: string };
let s2: { id: string; path: string };
let o1: { id: string; path: string };

beforeAll(() => {
  scribe = agent("scribe");
  other = agent("other");
  s1 = snap(scribe.config);
  writeFileSync(join(scribe.dir, "memory", "MEMORY.md"), "# scribe, later\n");
  s2 = snap(scribe.config);
  o1 = snap(other.config);
});

/** The shortest prefix of `id` no other of `ids` starts with (at least 6 characters). */
function prefixOf(id: string, ids: string[]): string {
  for (let n = 6; n <= id.length; n++) if (ids.filter((x) => x.startsWith(id.slice(0, n))).length === 1) return id.slice(0, n);
  return id;
}

describe("a snapshot id where a bundle path goes", () => {
  it("inspect and verify find a full id (any case) and a unique prefix in --store or $MEMSNAP_STORE", () => {
    const ins = cli(["inspect", s2.id.toLowerCase(), "--store", store]);
    expect(ins.code, ins.stderr).toBe(0);
    expect(ins.stdout).toContain(`bundle     ${s2.path}`);
    const p = prefixOf(s1.id, [s1.id, s2.id, o1.id]);
    const ver = cli(["verify", p], { env: { MEMSNAP_STORE: store } });
    expect(ver.code, ver.stderr).toBe(0);
    expect(ver.stdout).toContain(`verified ${s1.id}`);
  });

  it("restore --to by id restores that snapshot", () => {
    const to = join(work, "restored-s1");
    const r = cli(["restore", s1.id, "--to", to, "--store", store]);
    expect(r.code, r.stderr).toBe(0);
    expect(readFileSync(join(to, "memory", "MEMORY.md"), "utf8")).toBe("# scribe\n");
  });

  it("in place by id: the config's store and agent; another agent's id only with --as-agent", () => {
    const dry = cli(["restore", s1.id, "-c", scribe.config, "--dry-run"]);
    expect(dry.code, dry.stderr).toBe(0);
    expect(dry.stdout).toContain(`plan for restoring ${s1.id}`);
    const foreign = cli(["restore", o1.id, "-c", scribe.config, "--dry-run"]);
    expect(foreign.code).toBe(6);
    expect(foreign.stderr).toContain(`no bundle file ${o1.id}, and no snapshot with that id in ${store} [MEMSNAP_SOURCE_MISSING]`);
    const as = cli(["restore", o1.id, "-c", scribe.config, "--dry-run", "--as-agent"]);
    expect(as.code, as.stderr).toBe(0);
    expect(as.stdout).toContain(`plan for restoring ${o1.id}`);
  });

  it("unknown and ambiguous ids, and a file that happens to be named like an id", () => {
    const unknown = cli(["inspect", "01ZZZZZZZZ", "--store", store]);
    expect(unknown.code).toBe(6);
    expect(unknown.stderr).toMatch(/no bundle file 01ZZZZZZZZ, and no snapshot with that id in .*\[MEMSNAP_SOURCE_MISSING\]\nmemsnap: hint: .*memsnap list/);
    let common = 0;
    while (s1.id[common] === s2.id[common] && s1.id[common] === o1.id[common]) common++;
    // ULIDs start with the time: ids made within a second share their first 6 characters
    // (which change every 2^28 ms, ~3.1 days).
    expect(common).toBeGreaterThanOrEqual(6);
    const amb = cli(["inspect", s1.id.slice(0, common), "--store", store]);
    expect(amb.code).toBe(2);
    expect(amb.stderr).toContain("is ambiguous (3 matches)");
    // a path is a path: a copy of s2 in the working directory under s1's id is read as the file
    const dir = mkdtempSync(join(work, "cwd-"));
    copyFileSync(s2.path, join(dir, s1.id));
    const file = cli(["inspect", s1.id, "--store", store], { cwd: dir });
    expect(file.code, file.stderr).toBe(0);
    expect(file.stdout).toContain(`snapshot   ${s2.id}`);
  });
});
