// The "custom" cases of scripts/hostile/git.mjs (fixtures/hostile/): git layers made harmless
// rather than refused. Restored with --to and in place, each succeeds, creates no symlink
// anywhere (a link of the bundle's history is a plain file holding its target), says so in a
// note, and touches nothing outside.
import { spawnSync } from "node:child_process";
import { existsSync, lstatSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { commitAll, git, initRepo, writeFiles } from "../helpers/git.js";

const BIN = new URL("../../bin/memsnap.js", import.meta.url).pathname;
const FIX = new URL("../../fixtures/hostile/", import.meta.url).pathname;
const KEY = join(FIX, "victim.key");
const work = mkdtempSync(join(tmpdir(), "memsnap-hostile-git-"));
afterAll(() => rmSync(work, { recursive: true, force: true }));

function cli(args: string[], env: Record<string, string> = {}) {
  const r = spawnSync(process.execPath, [BIN, ...args], { encoding: "utf8", cwd: work, env: { ...process.env, ...env }, timeout: 60_000 });
  return { code: r.status, stdout: r.stdout, stderr: r.stderr };
}

function linksUnder(dir: string, rel = ""): string[] {
  const out: string[] = [];
  for (const e of readdirSync(join(dir, rel), { withFileTypes: true })) {
    const r = rel ? `${rel}/${e.name}` : e.name;
    if (e.isSymbolicLink()) out.push(r);
    else if (e.isDirectory()) out.push(...linksUnder(dir, r));
  }
  return out;
}

/** A live agent "victim" (the hostile bundles' agent) with a git memdir `mem` of its own. */
function victimAgent(): string {
  const a = mkdtempSync(join(work, "agent-"));
  const root = initRepo(join(a, "memdir"));
  writeFiles(root, { "MEMORY.md": "# live\n" });
  commitAll(root, "live");
  writeFileSync(join(a, "memsnap.json"), JSON.stringify({ tenant: "default", agent: "victim", redaction: { enabled: false }, sources: [{ kind: "git", name: "mem", path: "memdir" }] }));
  return a;
}

const SYMLINK_CASES = [
  { file: "git-history-symlinks.memsnap", key: [] as string[], env: {} },
  { file: "git-history-symlinks-encrypted.memsnap", key: ["-i", KEY], env: {} },
  { file: "git-history-symlinks.memsnap", key: [] as string[], env: { MEMSNAP_GIT_IMPL: "isomorphic" } },
];

describe("hostile git layers made harmless (scripts/hostile/git.mjs)", () => {
  for (const c of SYMLINK_CASES) {
    const how = c.env.MEMSNAP_GIT_IMPL ? " (isomorphic-git)" : "";
    it(`${c.file}${how}: restore --to creates no link; /etc, ../../x and /tmp come back as plain files`, () => {
      const to = join(mkdtempSync(join(work, "to-")), "r");
      const r = cli(["restore", join(FIX, c.file), "--to", to, ...c.key], c.env);
      expect(r.code, r.stderr).toBe(0);
      expect(r.stderr).toMatch(/memsnap: note: git layer mem: 3 symlinks .*restored as plain files/);
      expect(linksUnder(to)).toEqual([]);
      expect(readFileSync(join(to, "mem", "etc"), "utf8")).toBe("/etc");
      expect(readFileSync(join(to, "mem", "up"), "utf8")).toBe("../../x");
      expect(readFileSync(join(to, "mem", "deep", "tmp"), "utf8")).toBe("/tmp");
      expect(git(join(to, "mem"), ["status", "--porcelain"])).toBe("");
    });

    it(`${c.file}${how}: in place, the same, and the live repository's config is kept`, () => {
      const a = victimAgent();
      git(join(a, "memdir"), ["config", "user.name", "Victim"]);
      const r = cli(["restore", join(FIX, c.file), "-c", join(a, "memsnap.json"), "--store", join(a, "..", `${a.split("/").pop()}-store`), "--json", ...c.key], c.env);
      expect(r.code, r.stderr).toBe(0);
      expect(JSON.parse(r.stdout).notes).toEqual([expect.stringMatching(/^git layer mem: 3 symlinks/)]);
      expect(linksUnder(a)).toEqual([]);
      expect(lstatSync(join(a, "memdir", "etc")).isFile()).toBe(true);
      expect(readFileSync(join(a, "memdir", "etc"), "utf8")).toBe("/etc");
      expect(git(join(a, "memdir"), ["config", "user.name"]).trim()).toBe("Victim");
      expect(git(join(a, "memdir"), ["log", "--format=%s"]).trim()).toBe("hostile");
    });
  }

  it("git-deleted-through-link.memsnap: a deletion under a tracked link to a victim directory deletes nothing outside (--to and in place)", () => {
    const victim = "/tmp/memsnap-hostile-git-victim";
    mkdirSync(victim, { recursive: true });
    writeFileSync(join(victim, "victim.txt"), "keep me\n");
    try {
      const to = join(mkdtempSync(join(work, "to-")), "r");
      const r = cli(["restore", join(FIX, "git-deleted-through-link.memsnap"), "--to", to]);
      expect(r.code, r.stderr).toBe(0);
      expect(readFileSync(join(to, "mem", "v"), "utf8")).toBe(victim);
      const a = victimAgent();
      const ip = cli(["restore", join(FIX, "git-deleted-through-link.memsnap"), "-c", join(a, "memsnap.json"), "--no-safety-snapshot"]);
      expect(ip.code, ip.stderr).toBe(0);
      expect(linksUnder(a)).toEqual([]);
      expect(readFileSync(join(victim, "victim.txt"), "utf8")).toBe("keep me\n");
    } finally {
      rmSync(victim, { recursive: true, force: true });
    }
    expect(existsSync(victim)).toBe(false);
  });
});
