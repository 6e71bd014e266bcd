/**
 * Reading an s3 store with the real CLI against the real server (Swift + s3api): list, inspect,
 * verify (keyless and with the key), verify --all, restore --to streamed from GET, ls/cat/find,
 * with the same output and exit codes as the same bundles in a local store; a payload of several ranges read
 * with few or many ranges ahead (MEMSNAP_S3_READ_AHEAD, validated); a damaged object fails verify as the damaged
 * file does; a missing object is MEMSNAP_SOURCE_MISSING.
 */
import { GetObjectCommand, HeadObjectCommand, PutObjectCommand } from "@aws-sdk/client-s3";
import { execFileSync } from "node:child_process";
import { randomBytes } from "node:crypto";
import { existsSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import {
  expectCliError, expectOk, jsonOut, listBundles, makeAgent, runCli, tempDir, treeHashes, type Agent,
} from "../helpers/cli.js";
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
  const b = `read-${process.pid}-${++n}`;
  await server.createBucket(b);
  return b;
}
const cli = (args: string[], cwd?: string, env: Record<string, string | undefined> = {}) =>
  runCli(args, { env: { ...server.env, ...env }, ...(cwd ? { cwd } : {}), timeoutMs: 120_000 });

/** A snapshot of `a` into `store`: its id. */
async function snap(a: Agent, store: string, extra: string[] = []): Promise<string> {
  const r = await cli(["snapshot", "-c", a.config, "--store", store, "--json", ...extra], a.dir);
  expectOk(r);
  return jsonOut(r).snapshot_id as string;
}

/** Text output with the store-specific bundle location taken out. */
const plain = (s: string, where: string): string => s.split(where).join("<STORE>");

describe("an s3 store, read", () => {
  it("the config's store and s3_endpoint serve every command, with no MEMSNAP_S3_ENDPOINT", async () => {
    const b = await bucket();
    const store = `s3://${b}/cfg`;
    const a = makeAgent();
    const cfg = JSON.parse(readFileSync(a.config, "utf8"));
    writeFileSync(a.config, JSON.stringify({ ...cfg, store, s3_endpoint: server.endpoint }));
    const noEnv = { MEMSNAP_S3_ENDPOINT: undefined };
    const s = await cli(["snapshot", "-c", a.config, "--json"], a.dir, noEnv);
    expectOk(s);
    const id = jsonOut(s).snapshot_id as string;
    for (const args of [["list", "-c", a.config], ["verify", id], ["inspect", id]]) {
      const r = await cli(args, a.dir, noEnv);
      expect(r.code, `${args[0]}: ${r.stderr}`).toBe(0);
      expect(r.stdout).toContain(id);
    }
    // Without the config, nothing says where the server is: the SDK's default endpoint is not this server.
    const bare = await cli(["list", "--store", store], undefined, { ...noEnv, MEMSNAP_S3_MAX_ATTEMPTS: "1", AWS_EC2_METADATA_DISABLED: "true" });
    expect(bare.code).not.toBe(0);
  }, 180_000);

  it("list, inspect, verify, verify --all, ls and cat say what they say for the local store", async () => {
    const b = await bucket();
    const store = `s3://${b}/team/memsnap`;
    const a = makeAgent();
    const id = await snap(a, store);
    // The same bundle in a local store (downloaded byte for byte).
    const local = tempDir();
    const key = `team/memsnap/acme/scribe/${id}.memsnap`;
    const got = await server.client().send(new GetObjectCommand({ Bucket: b, Key: key }));
    execFileSync("mkdir", ["-p", join(local, "acme", "scribe")]);
    writeFileSync(join(local, "acme", "scribe", `${id}.memsnap`), Buffer.from(await got.Body!.transformToByteArray()));

    const list = await cli(["list", "--store", store, "--json"]);
    expectOk(list);
    const snaps = jsonOut(list).snapshots;
    expect(snaps.map((s: { id: string }) => s.id)).toEqual([id]);
    expect(snaps[0].path).toBe(`s3://${b}/${key}`);
    const listLocal = await cli(["list", "--store", local]);
    const listS3 = await cli(["list", "--store", store]);
    expect(listS3.stdout).toBe(listLocal.stdout);

    for (const args of [["inspect", id.slice(0, 10)], ["verify", id.slice(0, 10)], ["ls", id.slice(0, 10)], ["cat", id.slice(0, 10), "memory/MEMORY.md"]]) {
      const l = await cli([...args, "--store", local]);
      const s = await cli([...args, "--store", store]);
      expect(s.code, `${args[0]}: ${s.stderr}`).toBe(0);
      expect(plain(s.stdout, `s3://${b}/team/memsnap`), args[0]).toBe(plain(l.stdout, local));
    }
    // A bundle URL is a bundle argument too.
    const byUrl = await cli(["verify", `s3://${b}/${key}`, "--json"]);
    expectOk(byUrl);
    expect(jsonOut(byUrl).ok).toBe(true);
    const all = await cli(["verify", "--all", "--store", store]);
    expectOk(all);
    expect(all.stdout).toContain(`ok      ${id}  s3://${b}/${key}`);
    expect(all.stdout).toContain("1 bundle(s): 1 verified, 0 failed");
  }, 180_000);

  it("restore --to streams an encrypted bundle from the store; verify with the key checks every artifact", async () => {
    const b = await bucket();
    const store = `s3://${b}/m`;
    const a = makeAgent({ files: { "big.bin": Buffer.alloc(20 << 20, 7), "x/y.txt": "why\n" } });
    const keyFile = join(a.dir, "key.txt");
    expectOk(await cli(["keygen", "--out", keyFile], a.dir));
    const recipient = readFileSync(keyFile, "utf8").match(/age1[0-9a-z]+/)![0];
    const cfg = JSON.parse(readFileSync(a.config, "utf8"));
    writeFileSync(a.config, JSON.stringify({ ...cfg, recipients: [recipient] }));
    const id = await snap(a, store);
    const keyless = await cli(["verify", id, "--store", store]);
    expectOk(keyless);
    expect(keyless.stdout).toMatch(/^ok +payload-sha256$/m);
    expect(keyless.stdout).toMatch(/skipped decrypt/);
    const withKey = await cli(["verify", id, "--store", store, "-i", keyFile, "--json"]);
    expectOk(withKey);
    expect(jsonOut(withKey).checks.find((c: { name: string }) => c.name === "artifacts").status).toBe("passed");
    const to = join(tempDir(), "out");
    const r = await cli(["restore", id, "--store", store, "-c", a.config, "--to", to, "-i", keyFile], a.dir);
    expectOk(r);
    expect(treeHashes(join(to, "memory"))).toEqual(treeHashes(a.memoryDir));
    expect(listBundles(to)).toEqual([]); // nothing of the bundle was copied to local disk
  }, 180_000);

  it("a payload of several 8 MiB ranges restores whole with 1 or 6 ranges ahead (MEMSNAP_S3_READ_AHEAD); "
    + "0, 1.5 or 65 is a usage error", async () => {
    const b = await bucket();
    const store = `s3://${b}/m`;
    // Incompressible, so the stored payload spans three ranges and a part of a fourth.
    const a = makeAgent({ files: { "noise.bin": randomBytes(26 << 20), "x/y.txt": "why\n" } });
    const id = await snap(a, store);
    const url = `${store}/acme/scribe/${id}.memsnap`;
    const size = (await server.client().send(new HeadObjectCommand({ Bucket: b, Key: `m/acme/scribe/${id}.memsnap` })))
      .ContentLength!;
    expect(size).toBeGreaterThan(3 * (8 << 20));
    for (const ahead of ["1", "6"]) {
      const to = join(tempDir(), "out");
      // By URL: the size comes from the first GET's Content-Range, not from a listing.
      const r = await cli(["restore", url, "--to", to], undefined, { MEMSNAP_S3_READ_AHEAD: ahead });
      expectOk(r);
      expect(treeHashes(join(to, "memory")), `${ahead} ahead`).toEqual(treeHashes(a.memoryDir));
      const v = await cli(["verify", url], undefined, { MEMSNAP_S3_READ_AHEAD: ahead });
      expectOk(v);
      expect(v.stdout).toMatch(/^ok +payload-sha256$/m);
    }
    for (const bad of ["0", "1.5", "65"]) {
      const to = join(tempDir(), "out");
      const r = await cli(["restore", url, "--to", to], undefined, { MEMSNAP_S3_READ_AHEAD: bad });
      expectCliError(r, 2, "MEMSNAP_USAGE");
      expect(r.stderr).toContain(`MEMSNAP_S3_READ_AHEAD must be an integer from 1 to 64, got "${bad}"`);
      expect(existsSync(to)).toBe(false);
    }
  }, 180_000);

  it("a damaged object fails verify with the damaged file's code and exit; a missing one is MEMSNAP_SOURCE_MISSING", async () => {
    const b = await bucket();
    const store = `s3://${b}/m`;
    const a = makeAgent();
    const id = await snap(a, store);
    const key = `m/acme/scribe/${id}.memsnap`;
    const got = await server.client().send(new GetObjectCommand({ Bucket: b, Key: key }));
    const bytes = Buffer.from(await got.Body!.transformToByteArray());
    bytes[600] ^= 1; // inside the payload
    await server.client().send(new PutObjectCommand({ Bucket: b, Key: key, Body: bytes }));
    const file = join(tempDir(), `${id}.memsnap`);
    writeFileSync(file, bytes);
    const l = await cli(["verify", file]);
    const s = await cli(["verify", `s3://${b}/${key}`]);
    expect(l.code).not.toBe(0);
    expect(s.code).toBe(l.code);
    expect(plain(s.stdout, `s3://${b}/${key}`)).toBe(plain(l.stdout, file));
    const gone = await cli(["inspect", `s3://${b}/m/acme/scribe/01ARZ3NDEKTSV4RRFFQ69G5FAV.memsnap`]);
    expectCliError(gone, 6, "MEMSNAP_SOURCE_MISSING");
  }, 180_000);
});
