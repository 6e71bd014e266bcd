/**
 * `memsnap snapshot` into an s3 store (the real S3 server): the bundle streams into an object at
 * <prefix>/<tenant>/<agent>/<id>.memsnap, byte for byte a bundle that verifies and restores
 * (checked on a downloaded copy); the parent is the agent's newest snapshot there; --store,
 * MEMSNAP_STORE and the config's store all take the URL; nothing is written on the local disk
 * (no bundle, no temp file, no work dir); --incremental references the bundle before it in the same prefix.
 */
import { GetObjectCommand, HeadObjectCommand, ListObjectsV2Command, type S3Client } from "@aws-sdk/client-s3";
import { randomBytes } from "node:crypto";
import { readdirSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import {
  expectOk, jsonOut, listBundles, listLeftovers, listTree, makeAgent, readBundle, recipientOf, runCli, tempDir, treeHashes,
} from "../helpers/cli.js";
import { startS3Server, type S3Server } from "../helpers/s3-server.js";

let server: S3Server;
let client: S3Client;
beforeAll(async () => {
  server = await startS3Server();
  client = server.client();
}, 120_000);
afterAll(async () => {
  await server?.stop();
});

async function download(bucket: string, key: string, to: string): Promise<Buffer> {
  const r = await client.send(new GetObjectCommand({ Bucket: bucket, Key: key }));
  const b = Buffer.from(await r.Body!.transformToByteArray());
  writeFileSync(to, b);
  return b;
}

async function keys(bucket: string): Promise<string[]> {
  const r = await client.send(new ListObjectsV2Command({ Bucket: bucket }));
  return (r.Contents ?? []).map((o) => o.Key!).sort();
}

/** The CLI's environment for the server, with a private TMPDIR to check that nothing lands there. */
function s3env(extra: Record<string, string> = {}): { env: Record<string, string>; tmp: string } {
  const tmp = tempDir("memsnap-s3-tmp-");
  return { env: { ...server.env, TMPDIR: tmp, ...extra }, tmp };
}

/** The agent's files, bar the control dir (its empty .memsnap/ and lock are the lock's own). */
const agentFiles = (dir: string): string[] => listTree(dir).filter((p) => !p.startsWith(".memsnap"));

describe("snapshot --store s3://", () => {
  it("writes the bundle as <prefix>/<tenant>/<agent>/<id>.memsnap, which verifies and restores; nothing local", async () => {
    await server.createBucket("snap-basic");
    const a = makeAgent({ files: { "MEMORY.md": "# memory\n", "big.bin": randomBytes(12 << 20), "notes/a.md": "a\n" } });
    const before = agentFiles(a.dir);
    const { env, tmp } = s3env({ MEMSNAP_S3_PART_MIB: "5" });
    const r = await runCli(["--json", "snapshot", "-c", a.config, "--store", "s3://snap-basic/team/memsnap/"], { cwd: a.dir, env });
    expectOk(r);
    const j = jsonOut(r);
    const key = `team/memsnap/acme/scribe/${j.id}.memsnap`;
    expect(j.path).toBe(`s3://snap-basic/${key}`);
    expect(await keys("snap-basic")).toEqual([key]);
    const head = await client.send(new HeadObjectCommand({ Bucket: "snap-basic", Key: key }));
    expect(head.ContentLength).toBe(j.bundle_bytes);
    // Nothing on the local disk: no bundle, no temp file, no work dir, nothing in TMPDIR.
    expect(agentFiles(a.dir)).toEqual(before);
    expect(listLeftovers(a.dir)).toEqual([]);
    expect(listBundles(a.dir)).toEqual([]);
    expect(readdirSync(tmp)).toEqual([]);
    // The object is a whole bundle: the payload header was patched after the upload streamed.
    const local = join(tempDir(), "copy.memsnap");
    await download("snap-basic", key, local);
    expect(readBundle(local).manifest.snapshot_id).toBe(j.id);
    expectOk(await runCli(["verify", local], { cwd: a.dir }));
    const to = join(tempDir(), "restored");
    expectOk(await runCli(["restore", local, "-c", a.config, "--to", to], { cwd: a.dir }));
    expect(treeHashes(join(to, "memory"))).toEqual(treeHashes(a.memoryDir));
  });

  it("an encrypted snapshot; the next one's parent is the newest in the store; MEMSNAP_STORE and the config's store", async () => {
    await server.createBucket("snap-enc");
    const a = makeAgent();
    expectOk(await runCli(["keygen", "-o", "key.txt"], { cwd: a.dir }));
    const recipient = recipientOf(join(a.dir, "key.txt"));
    const { env } = s3env();
    const r1 = await runCli(["--json", "snapshot", "-c", a.config, "-r", recipient], { cwd: a.dir, env: { ...env, MEMSNAP_STORE: "s3://snap-enc/p" } });
    expectOk(r1);
    const id1 = jsonOut(r1).id;
    writeFileSync(a.config, JSON.stringify({ ...JSON.parse(readFileSync(a.config, "utf8")), store: "s3://snap-enc/p" }));
    const r2 = await runCli(["--json", "snapshot", "-c", a.config, "-r", recipient], { cwd: a.dir, env });
    expectOk(r2);
    const id2 = jsonOut(r2).id;
    expect(await keys("snap-enc")).toEqual([`p/acme/scribe/${id1}.memsnap`, `p/acme/scribe/${id2}.memsnap`]);
    const local = join(tempDir(), "b.memsnap");
    await download("snap-enc", `p/acme/scribe/${id2}.memsnap`, local);
    const m = readBundle(local).manifest;
    expect(m.parent).toBe(id1);
    expect(m.payload.encryption).not.toBeNull();
    expectOk(await runCli(["verify", local, "-i", join(a.dir, "key.txt")], { cwd: a.dir }));
  });

  it("--incremental into s3 references the unchanged artifacts of the bundle before it in the same prefix", async () => {
    await server.createBucket("snap-inc");
    const a = makeAgent();
    const { env } = s3env();
    const first = await runCli(["snapshot", "-c", a.config, "--store", "s3://snap-inc", "--incremental", "--json"],
      { cwd: a.dir, env });
    expectOk(first);
    writeFileSync(join(a.dir, "memory", "new-note.md"), "a note written after the first snapshot\n");
    const second = await runCli(["snapshot", "-c", a.config, "--store", "s3://snap-inc", "--incremental", "--json"],
      { cwd: a.dir, env });
    expectOk(second);
    const inc = JSON.parse(second.stdout).incremental;
    expect(inc.referenced).toBeGreaterThan(0);
    expect(inc.bases).toEqual([JSON.parse(first.stdout).snapshot_id]);
    const ks = await keys("snap-inc");
    expect(ks.length).toBe(2);
    const local = join(tempDir(), "i.memsnap");
    await download("snap-inc", ks[1]!, local);
    expect(readBundle(local).manifest.bases?.map((b: { snapshot_id: string }) => b.snapshot_id))
      .toEqual([JSON.parse(first.stdout).snapshot_id]);
    // Restored from the store, the base is read from the same prefix; the tree is the live one.
    const out = join(tempDir(), "restored");
    const id = JSON.parse(second.stdout).snapshot_id as string;
    expectOk(await runCli(["restore", `s3://snap-inc/${ks[1]!}`, "--to", out, "--layout", "layers"], { cwd: a.dir, env }));
    expect(readFileSync(join(out, "memory", "new-note.md"), "utf8")).toBe("a note written after the first snapshot\n");
    expect(id).toMatch(/^[0-9A-Z]{26}$/);
  });
});
