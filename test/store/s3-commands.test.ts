/**
 * The commands that read two snapshots or restore in place, on an s3 store (real CLI, real
 * server): diff says what it says for the same bundles in a local store; restore in place
 * streams from the store, takes its safety snapshot into it, and an incremental bundle copied
 * into s3 finds its base there.
 */
import { mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { expectOk, jsonOut, makeAgent, runCli, tempDir, treeHashes } from "../helpers/cli.js";
import { startS3Server, type S3Server } from "../helpers/s3-server.js";

let server: S3Server;
beforeAll(async () => {
  server = await startS3Server();
}, 120_000);
afterAll(async () => {
  await server?.stop();
});

const cli = (args: string[], cwd?: string) =>
  runCli(args, { env: server.env, ...(cwd ? { cwd } : {}), timeoutMs: 120_000 });

describe("s3 store commands", () => {
  it("diff as on disk; restore in place from s3 with a safety snapshot into s3", async () => {
    const b = `cmd-${process.pid}`;
    await server.createBucket(b);
    const store = `s3://${b}/s`;
    const local = tempDir();
    const a = makeAgent();
    const snap = async (): Promise<string> => {
      const r = await cli(["snapshot", "-c", a.config, "--store", local, "--json", "--incremental"], a.dir);
      expectOk(r);
      return jsonOut(r).snapshot_id;
    };
    const before = treeHashes(a.memoryDir);
    const one = await snap();
    writeFileSync(join(a.memoryDir, "MEMORY.md"), "# Memory\n\n- changed\n");
    mkdirSync(join(a.memoryDir, "new"), { recursive: true });
    writeFileSync(join(a.memoryDir, "new", "f.txt"), "new\n");
    const two = await snap();
    expectOk(await cli(["copy", local, store]));

    const dl = await cli(["diff", one, two, "--store", local]);
    const ds = await cli(["diff", one, two, "--store", store]);
    expectOk(ds);
    expect(ds.stdout).toBe(dl.stdout);
    expect(ds.stdout).toContain("+ memory/new/f.txt");

    // In place, from s3: the incremental `two`'s base `one` is found in the same store.
    writeFileSync(join(a.memoryDir, "MEMORY.md"), "live edit\n");
    const r = await cli(["restore", one, "--store", store, "-c", a.config, "--json"], a.dir);
    expectOk(r);
    expect(treeHashes(a.memoryDir)).toEqual(before);
    expect(readFileSync(join(a.memoryDir, "MEMORY.md"), "utf8")).toBe("# Memory\n\n- likes tea\n");
    const safety = jsonOut(r).safety_snapshot;
    expect(safety?.path).toMatch(new RegExp(`^s3://${b}/s/acme/scribe/`));
    const r2 = await cli(["restore", two, "--store", store, "-c", a.config], a.dir);
    expectOk(r2);
    expect(readFileSync(join(a.memoryDir, "MEMORY.md"), "utf8")).toBe("# Memory\n\n- changed\n");
  }, 240_000);
});
