/**
 * SIGINT/SIGTERM in the middle of a command: exit 130 with MEMSNAP_INTERRUPTED, and nothing
 * half-done left (no bundle, no staging, no restored directory).
 */
import { existsSync, mkdirSync, readdirSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { runCli, startCli, tempDir } from "../helpers/cli.js";

async function until(cond: () => boolean, ms = 20_000): Promise<void> {
  for (const t0 = Date.now(); !cond(); ) {
    if (Date.now() - t0 > ms) throw new Error("timed out waiting");
    await new Promise((r) => setTimeout(r, 20));
  }
}

describe("interrupted commands", () => {
  for (const sig of ["SIGINT", "SIGTERM"] as const) {
    it(`${sig} while a snapshot is capturing: exit 130, MEMSNAP_INTERRUPTED, no bundle left`, async () => {
      const d = tempDir("memsnap-interrupt-");
      const marker = join(d, "plugin-started");
      // An exec source whose plugin says it started, then never writes its tar stream.
      const code = `require("node:fs").writeFileSync(${JSON.stringify(marker)}, ""); setTimeout(() => {}, 60000);`;
      writeFileSync(join(d, "memsnap.json"), JSON.stringify({
        tenant: "t", agent: "a", sources: [{ kind: "exec", name: "slow", command: [process.execPath, "-e", code] }],
      }));
      mkdirSync(join(d, "out"));
      const { child, done } = startCli(["snapshot", "-c", "memsnap.json", "--out", join(d, "out", "b.memsnap"), "--no-encrypt"], { cwd: d });
      await until(() => existsSync(marker));
      child.kill(sig);
      const r = await done;
      expect(r.code, r.stderr).toBe(130);
      expect(r.stderr).toMatch(/\[MEMSNAP_INTERRUPTED\]$/m);
      expect(r.stderr).toContain("no bundle was written");
      expect(readdirSync(join(d, "out"))).toEqual([]);
    });
  }

  it("SIGINT while a plugin restores its layer: the plugin is stopped, exit 130, nothing restored", async () => {
    const d = tempDir("memsnap-interrupt-");
    const marker = join(d, "restore-started");
    // Captures an empty tar; its restore says it started, then never answers (timeout_ms: 10 min).
    const plugin = join(d, "plugin.js");
    writeFileSync(plugin, `if (process.argv[2] === "capture") process.stdout.write(Buffer.alloc(1024));
else { require("node:fs").writeFileSync(${JSON.stringify(marker)}, String(process.pid)); setInterval(() => {}, 1000); }`);
    writeFileSync(join(d, "memsnap.json"), JSON.stringify({
      tenant: "t", agent: "a", sources: [{ kind: "exec", name: "slow", command: [process.execPath, plugin], timeout_ms: 600_000 }],
    }));
    const snap = await runCli(["snapshot", "-c", "memsnap.json", "--out", "b.memsnap", "--no-encrypt"], { cwd: d });
    expect(snap.code, snap.stderr).toBe(0);
    const t0 = Date.now();
    const { child, done } = startCli(["restore", "b.memsnap", "--to", "restored"], { cwd: d, env: { MEMSNAP_ALLOW_PLUGINS: JSON.stringify([[process.execPath, plugin]]) } });
    await until(() => existsSync(marker) && readFileSync(marker, "utf8") !== "");
    const pid = Number(readFileSync(marker, "utf8"));
    child.kill("SIGINT");
    const r = await done;
    expect(r.code, r.stderr).toBe(130);
    expect(r.stderr).toMatch(/restore interrupted \[MEMSNAP_INTERRUPTED\]$/m);
    expect(r.stderr).toContain("nothing was restored");
    expect(Date.now() - t0).toBeLessThan(30_000); // not the plugin's 10 minutes
    expect(existsSync(join(d, "restored"))).toBe(false);
    expect(readdirSync(d).filter((n) => n.includes("staging"))).toEqual([]);
    expect(() => process.kill(pid, 0)).toThrow(); // the plugin is gone
  });
});
