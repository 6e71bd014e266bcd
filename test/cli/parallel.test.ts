/**
 * compression.threads ≥ 1: a peer thread compresses every other 2 MiB frame. The payload must
 * stay one valid zstd stream (stock zstd and tar read it back byte for byte) and restore.
 */
import { spawnSync } from "node:child_process";
import { randomBytes } from "node:crypto";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { expectOk, makeAgent, readBundle, runCli, tempDir, treeHashes } from "../helpers/cli.js";
import { requireTool } from "../helpers/tools.js";

describe("parallel frame compression", () => {
  it("a 9 MiB mixed tree compressed on two threads reads back with zstd -d | tar -x and restores", async (ctx) => {
    requireTool(["tar", "zstd"], ctx);
    const text = Array.from({ length: 40_000 }, (_, i) => `line ${i}: the agent noted item ${i * 7919 % 1000}\n`).join("");
    const files = { "a.md": text, "dense.bin": randomBytes(5 * 1024 * 1024), "b.md": text, "c.bin": Buffer.alloc(3 * 1024 * 1024, 7) };
    const a = makeAgent({
      files,
      config: { tenant: "acme", agent: "par", compression: { level: 3, threads: 1 }, sources: [{ kind: "files", name: "memory", path: "memory" }] },
    });
    const out = join(a.dir, "p.memsnap");
    expectOk(await runCli(["snapshot", "-c", a.config, "-o", out], { cwd: a.dir }));
    const d = tempDir();
    const r = spawnSync("sh", ["-c", `tar -xOf "${out}" payload.tar.zst > p.zst && zstd -l p.zst && zstd -dc p.zst | tar -x`], { cwd: d, encoding: "utf8" });
    expect(r.status, r.stderr).toBe(0);
    expect(Number(r.stdout.trim().split("\n")[1]!.trim().split(/\s+/)[0])).toBeGreaterThanOrEqual(5);
    expect(treeHashes(join(d, "memory"))).toEqual(treeHashes(a.memoryDir));
    const to = join(tempDir(), "r");
    expectOk(await runCli(["restore", out, "--to", to], { cwd: a.dir }));
    expect(treeHashes(join(to, "memory"))).toEqual(treeHashes(a.memoryDir));
    expect(readBundle(out).manifest.payload.compression.level).toBe(3);
  });
});
