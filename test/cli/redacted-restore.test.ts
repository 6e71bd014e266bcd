/**
 * A redacted bundle restores `[REDACTED:<rule>]` placeholders, not the secrets it was taken
 * with: `inspect` says how many values were replaced and where, and every restore that writes
 * a redacted artifact says so (a warning in place, naming the safety snapshot that keeps the
 * live values; a note with --to and in the --dry-run plan; `redacted` in --json). Restores that
 * write no redacted artifact (an unredacted bundle, `--only` another layer) say nothing.
 */
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeEach, describe, expect, it } from "vitest";
import { runCliSync } from "../helpers/cli.js";

const work = mkdtempSync(join(tmpdir(), "memsnap-redacted-"));
afterAll(() => rmSync(work, { recursive: true, force: true }));

const cli = (args: string[]) => runCliSync(args, { cwd: work });

const TOKEN = "ghp_" + "Zq7Rk2Lm9Xv4Tb8Nc3Wd6Hy1Pf5Gs0Ja2Ke4"; // GitHub token shape, not a real one

let agent = "";
let config = "";
let store = "";

function snapshot(extra: string[] = []): string {
  const r = cli(["snapshot", "-c", config, "--store", store, "--json", ...extra]);
  expect(r.code, r.stderr).toBe(0);
  return (JSON.parse(r.stdout) as { path: string }).path;
}

beforeEach(() => {
  agent = mkdtempSync(join(work, "agent-"));
  store = join(agent, "store");
  mkdirSync(join(agent, "memory"));
  mkdirSync(join(agent, "state"));
  writeFileSync(join(agent, "memory", "deploy.md"), `push with ${TOKEN}\nand once more: ${TOKEN}\n`);
  writeFileSync(join(agent, "memory", "plain.md"), "nothing secret here\n");
  writeFileSync(join(agent, "state", "cursor.json"), '{"c":1}');
  config = join(agent, "memsnap.json");
  writeFileSync(config, JSON.stringify({
    agent: "scribe",
    sources: [{ kind: "files", name: "memory", path: "memory" }, { kind: "state", name: "state", path: "state" }],
  }));
});

describe("a redacted bundle says what it will restore", () => {
  it("inspect counts the values replaced, the artifacts and the rules", () => {
    const b = snapshot();
    const r = cli(["inspect", b]);
    expect(r.code, r.stderr).toBe(0);
    const line = r.stdout.split("\n").find((l) => l.startsWith("redaction"));
    expect(line).toMatch(/^redaction {2}default: 2 values replaced by \[REDACTED:<rule>\] in memory\/deploy\.md \(\S+\)$/);
    const off = cli(["inspect", snapshot(["--no-redact"])]);
    expect(off.stdout).toMatch(/^redaction {2}off \(not scanned\)$/m);
  });

  it("in place: the restored file holds placeholders, and a warning names them and the safety snapshot", () => {
    const b = snapshot();
    writeFileSync(join(agent, "memory", "deploy.md"), "the live file moved on\n");
    const r = cli(["restore", b, "-c", config, "--store", store]);
    expect(r.code, r.stderr).toBe(0);
    const restored = readFileSync(join(agent, "memory", "deploy.md"), "utf8");
    expect(restored).not.toContain(TOKEN);
    expect(restored).toContain("[REDACTED:");
    const safety = /safety snapshot (\S+)/.exec(r.stdout)?.[1];
    expect(safety).toBeTruthy();
    expect(r.stderr).toContain(`memsnap: warning: 2 values in memory/deploy.md were redacted when this snapshot was taken`);
    expect(r.stderr).toContain(`(the safety snapshot ${safety!} keeps the live values)`);
  });

  it("--dry-run shows it in the plan, --json carries it, --to adds a note", () => {
    const b = snapshot();
    const dry = cli(["restore", b, "-c", config, "--store", store, "--dry-run"]);
    expect(dry.code, dry.stderr).toBe(0);
    expect(dry.stdout).toContain("note: 2 values in memory/deploy.md were redacted");
    expect(readFileSync(join(agent, "memory", "deploy.md"), "utf8")).toContain(TOKEN); // nothing changed
    const json = cli(["--json", "restore", b, "-c", config, "--store", store, "--dry-run"]);
    expect((JSON.parse(json.stdout) as { redacted: unknown }).redacted).toEqual({
      total: 2, artifacts: ["memory/deploy.md"], rules: [expect.any(String)],
    });
    const to = cli(["restore", b, "--to", join(agent, "out")]);
    expect(to.code, to.stderr).toBe(0);
    expect(to.stderr).toMatch(/^memsnap: note: 2 values in memory\/deploy\.md were redacted .*placeholders, not the secrets\n$/);
  });

  it("restores that write no redacted artifact say nothing", () => {
    const b = snapshot();
    const only = cli(["restore", b, "-c", config, "--store", store, "--only", "state"]);
    expect(only.code, only.stderr).toBe(0);
    // nothing of redaction; only that the safety snapshot of this plaintext setup is plaintext too
    expect(only.stderr).not.toContain("were redacted");
    expect(only.stderr.trim().split("\n")).toEqual([expect.stringContaining("safety snapshot") as string]);
    expect(only.stderr).toContain("is not encrypted and not redacted");
    const plain = snapshot(["--no-redact"]);
    const r = cli(["restore", plain, "--to", join(agent, "out2")]);
    expect(r.code, r.stderr).toBe(0);
    expect(r.stderr).toBe("");
    expect(readFileSync(join(agent, "out2", "memory", "deploy.md"), "utf8")).toContain(TOKEN);
  });
});
