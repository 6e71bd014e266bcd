/**
 * The git history scan with memsnap's own redactor (test/sources/git.test.ts uses a stub):
 * objects its native pre-filter clears are neither decoded nor scanned in JS, and a secret in
 * a blob or a commit message that is no longer in the work tree is still found and reported
 * against the layer's repo.bundle.
 */
import { spawnSync } from "node:child_process";
import { rmSync, unlinkSync } from "node:fs";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { createRedactor } from "../../src/redact/index.js";
import { nativePrefilter } from "../../src/redact/native.js";
import { emptyScan, scanObject } from "../../src/sources/git/history-scan.js";
import { expectOk, runCli, tempDir } from "../helpers/cli.js";
import { commitAll, initRepo, writeFiles } from "../helpers/git.js";
import { requireTool } from "../helpers/tools.js";

const TOKEN = "ghp_" + "Zq7Rk2Lm9Xv4Tb8Nc3Wd6Hy1Pf5Gs0Ja2Ke4"; // GitHub token shape, not a real one
const dirs: string[] = [];
afterAll(() => {
  for (const d of dirs) rmSync(d, { recursive: true, force: true });
});

describe("git history scan with memsnap's redactor", () => {
  it("clean(): true for text no rule can match (ASCII and not), false for a token", async () => {
    const tmp = tempDir("memsnap-githist-");
    dirs.push(tmp);
    const r = (await createRedactor({ enabled: true, allow: [] }, tmp))!;
    expect(typeof r.clean).toBe("function");
    const plain = Buffer.from("# notes\nThe agent met Zoë at the café; nothing to hide here.\n".repeat(50));
    const secret = Buffer.from(`config:\n  github: ${TOKEN}\n`);
    if (nativePrefilter() === null) {
      // No native pre-filter (not built, or MEMSNAP_NATIVE=0): clean() never claims anything.
      expect(r.clean!(plain)).toBe(false);
      expect(process.env.CI === "true" && process.env.MEMSNAP_NATIVE !== "0").toBe(false);
    } else {
      expect(r.clean!(plain)).toBe(true);
    }
    expect(r.clean!(secret)).toBe(false);
    expect(r.candidate(secret.toString("utf8"))).toBe(true);

    // scanObject: a clean blob is counted as scanned, a secret one reaches the rules.
    const st = emptyScan();
    await scanObject("blob", plain, r, "memory/repo.bundle", st);
    await scanObject("blob", secret, r, "memory/repo.bundle", st);
    await scanObject("commit", Buffer.from(`tree ${"a".repeat(40)}\nauthor x <x@y> 0 +0000\n\nrotate ${TOKEN}\n`), r, "memory/repo.bundle", st);
    expect(st).toMatchObject({ scanned: 3, candidates: 2 });
    expect(r.report().unredacted["memory/repo.bundle"]).toBeDefined();
    expect(r.report().total_unredacted).toBeGreaterThanOrEqual(2);
    await r.cleanup();
  });

  it("a token deleted from the work tree is still reported from history; a clean history reports nothing", async (ctx) => {
    if (!requireTool(["git", "tar"], ctx)) return;
    const root = tempDir("memsnap-githist-");
    dirs.push(root);
    for (const [name, withSecret] of [["dirty", true], ["clean", false]] as const) {
      const repo = initRepo(join(root, name, "memory"));
      writeFiles(repo, { "notes/a.md": "# a\nplain notes, café\n", "notes/b.md": "# b\n" + "more text\n".repeat(200) });
      commitAll(repo, "first");
      if (withSecret) {
        writeFiles(repo, { "notes/creds.md": `token: ${TOKEN}\n` });
        commitAll(repo, "add creds");
        unlinkSync(join(repo, "notes/creds.md"));
        commitAll(repo, "remove creds");
      }
      const config = join(root, name, "memsnap.json");
      writeFiles(join(root, name), { "memsnap.json": JSON.stringify({ tenant: "t", agent: "a", sources: [{ kind: "git", name: "memory", path: "memory" }] }) });
      const out = join(root, name, "s.memsnap");
      const r = await runCli(["snapshot", "--config", config, "--out", out, "--allow-unredacted", "--json"]);
      expectOk(r);
      // The manifest's report (plaintext member; read with the stock tar, as a user would).
      const t = spawnSync("tar", ["-xOf", out, "manifest.json"]);
      expect(t.status).toBe(0);
      const rep = JSON.parse(t.stdout.toString("utf8")).redaction;
      if (withSecret) {
        expect(rep.unredacted["memory/repo.bundle"], JSON.stringify(rep)).toBeDefined();
        expect(rep.total_unredacted).toBe(1); // the one token in the deleted blob; the messages are clean
      } else {
        expect(rep.total_unredacted, JSON.stringify(rep)).toBe(0);
      }
    }
  }, 60_000);
});
