/**
 * `memsnap copy` between a local store and an s3 store (real CLI, real server): local → s3 with
 * an incremental snapshot and its base (bases first), skipping what is there; the copy verifies
 * and restores from s3 (the incremental finds its base in the same store); s3 → local gives the
 * same bytes; a damaged source is refused and leaves nothing in the bucket.
 */
import { ListMultipartUploadsCommand, ListObjectsV2Command } from "@aws-sdk/client-s3";
import { readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { expectCliError, expectOk, jsonOut, makeAgent, runCli, tempDir, treeHashes } from "../helpers/cli.js";
import { startS3Server, type S3Server } from "../helpers/s3-server.js";

let server: S3Server;
beforeAll(async () => {
  server = await startS3Server();
}, 120_000);
afterAll(async () => {
  await server?.stop();
});

let n = 0;
async function bucket(): Promise<string> {
  const b = `copy-${process.pid}-${++n}`;
  await server.createBucket(b);
  return b;
}
const cli = (args: string[], cwd?: string) =>
  runCli(args, { env: server.env, ...(cwd ? { cwd } : {}), timeoutMs: 120_000 });
async function keys(b: string): Promise<string[]> {
  const r = await server.client().send(new ListObjectsV2Command({ Bucket: b }));
  return (r.Contents ?? []).map((o) => o.Key!).sort();
}

describe("memsnap copy", () => {
  it("local → s3 → local: bases first, skips what is there, the copy verifies and restores from s3", async () => {
    const b = await bucket();
    const s3 = `s3://${b}/off`;
    const local = tempDir();
    const a = makeAgent();
    const snap = async (extra: string[]): Promise<string> => {
      const r = await cli(["snapshot", "-c", a.config, "--store", local, "--json", ...extra], a.dir);
      expectOk(r);
      return jsonOut(r).snapshot_id;
    };
    const full = await snap(["--incremental"]);
    writeFileSync(join(a.memoryDir, "MEMORY.md"), "# Memory\n\n- likes coffee now\n");
    const inc = await snap(["--incremental"]);
    const listed = jsonOut(await cli(["list", "--store", local, "--json"])).snapshots;
    expect(listed.find((s: { id: string }) => s.id === inc).bases).toEqual([full]);

    // Naming only the incremental one copies its base too, first.
    const r = await cli(["copy", local, s3, inc]);
    expectOk(r);
    expect(r.stdout.split("\n").slice(0, 2)).toEqual([
      expect.stringMatching(new RegExp(`^copied ${full} to s3://${b}/off/acme/scribe/${full}\\.memsnap`)),
      expect.stringMatching(new RegExp(`^copied ${inc} to `)),
    ]);
    expect(await keys(b)).toEqual([`off/acme/scribe/${full}.memsnap`, `off/acme/scribe/${inc}.memsnap`]);
    const again = await cli(["copy", local, s3, "--json"]);
    expectOk(again);
    expect(jsonOut(again)).toMatchObject({ copied: 0, skipped: 2 });

    const all = await cli(["verify", "--all", "--store", s3]);
    expectOk(all);
    expect(all.stdout).toContain("2 bundle(s): 2 verified, 0 failed");
    const to = join(tempDir(), "out");
    expectOk(await cli(["restore", inc, "--store", s3, "-c", a.config, "--to", to], a.dir));
    expect(treeHashes(join(to, "memory"))).toEqual(treeHashes(a.memoryDir));

    const back = tempDir();
    const r2 = await cli(["copy", s3, back, "--json"]);
    expectOk(r2);
    expect(jsonOut(r2)).toMatchObject({ copied: 2, skipped: 0 });
    for (const id of [full, inc]) {
      expect(readFileSync(join(back, "acme", "scribe", `${id}.memsnap`)).equals(readFileSync(join(local, "acme", "scribe", `${id}.memsnap`)))).toBe(true);
    }
    // s3 → local also as `export` does it: one file.
    const one = join(tempDir(), "one.memsnap");
    expectOk(await cli(["export", full, "--store", s3, "--to", one]));
    expect(readFileSync(one).equals(readFileSync(join(local, "acme", "scribe", `${full}.memsnap`)))).toBe(true);
  }, 240_000);

  it("a damaged source is refused (MEMSNAP_PAYLOAD_HASH_MISMATCH) and nothing appears in the bucket", async () => {
    const b = await bucket();
    const local = tempDir();
    const a = makeAgent({ files: { "big.bin": Buffer.alloc(12 << 20, 3), "a.txt": "a\n" } });
    const r = await cli(["snapshot", "-c", a.config, "--store", local, "--json"], a.dir);
    expectOk(r);
    const path = jsonOut(r).path as string;
    const bytes = readFileSync(path);
    bytes[700] ^= 0x40;
    writeFileSync(path, bytes);
    const c = await cli(["copy", local, `s3://${b}/x`]);
    expectCliError(c, 3, "MEMSNAP_PAYLOAD_HASH_MISMATCH");
    expect(await keys(b)).toEqual([]);
    const up = await server.client().send(new ListMultipartUploadsCommand({ Bucket: b }));
    expect(up.Uploads ?? []).toEqual([]);
  }, 240_000);
});
