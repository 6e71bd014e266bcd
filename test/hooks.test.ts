// Hooks as real processes: what they get, and a hook that hangs (with a child of its own) is
// ended at its timeout without holding memsnap up.
import { readdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { runHook } from "../src/hooks.js";
import { makeAgent, runCli, tempDir } from "./helpers/cli.js";

/** Processes whose command line holds `marker`. */
function running(marker: string): number[] {
  const out: number[] = [];
  for (const p of readdirSync("/proc")) {
    if (!/^\d+$/.test(p)) continue;
    try {
      if (readFileSync(`/proc/${p}/cmdline`, "latin1").replace(/\0/g, " ").includes(marker)) out.push(Number(p));
    } catch {
      // gone meanwhile
    }
  }
  return out;
}

describe("hooks", () => {
  it("get the event as one JSON object on stdin and MEMSNAP_EVENT in the environment", async () => {
    const d = tempDir();
    const out = join(d, "got.txt");
    const r = await runHook({ timeout_ms: 10_000, on_created: ["/bin/sh", "-c", `echo "$MEMSNAP_EVENT" > ${out}; cat >> ${out}`] }, "on_created", { snapshot_id: "X" });
    expect(r).toMatchObject({ ok: true, exit_code: 0, event: "on_created" });
    const [env, json] = readFileSync(out, "utf8").trim().split("\n");
    expect(env).toBe("on_created");
    expect(JSON.parse(json!)).toEqual({ event: "on_created", snapshot_id: "X" });
  });

  it("a hook that hangs is ended at its timeout, with what it started (sh -c forks its command)", async () => {
    const marker = `${process.pid}.${Date.now() % 100000}`; // sleep's argument, to find it in /proc
    const t0 = performance.now();
    const r = await runHook({ timeout_ms: 300, on_failed: ["/bin/sh", "-c", `sleep 3${marker}; true`] }, "on_failed", {});
    expect(performance.now() - t0).toBeLessThan(2000);
    expect(r).toMatchObject({ ok: false, exit_code: null, error: "timed out after 300 ms" });
    for (let i = 0; i < 50 && running(`sleep 3${marker}`).length; i++) await new Promise((res) => setTimeout(res, 20));
    expect(running(`sleep 3${marker}`)).toEqual([]);
  });

  it("memsnap does not wait for a hung hook's children: the command ends at the timeout", async () => {
    const marker = `4${process.pid}.${Date.now() % 100000}`;
    const a = makeAgent({ config: { agent: "h", sources: [{ kind: "files", name: "m", path: "missing" }], hooks: { on_failed: ["/bin/sh", "-c", `sleep ${marker}; true`], timeout_ms: 300 } } });
    const t0 = performance.now();
    const r = await runCli(["snapshot", "-c", a.config, "-o", "x.memsnap"], { cwd: a.dir });
    expect(performance.now() - t0).toBeLessThan(5000); // it was the hook's sleep (~40 s) before
    expect(r.code).toBe(6);
    expect(r.stderr).toContain("warning: hook on_failed (/bin/sh -c sleep");
    expect(r.stderr).toContain("timed out after 300 ms");
    expect(running(`sleep ${marker}`)).toEqual([]);
  });
});
