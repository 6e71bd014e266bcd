/**
 * Faults on the write path to an s3 store, provoked for real on the S3 server: the proxy killed
 * mid-upload (exit 8, MEMSNAP_STORE_UNREACHABLE, no object, nothing local); the proxy frozen
 * (SIGSTOP) for longer than the stall time-out, then thawed (retried, the snapshot completes);
 * the object server killed, so the proxy answers 503 (retried with backoff until it is back, or
 * exit 8 once the attempts are spent); wrong credentials, a user without rights and a missing
 * bucket (exit 8, DENIED / NOT_FOUND); and the peak RSS of a snapshot of 320 MiB of
 * incompressible data, which would exceed the bound if the bundle were held in memory.
 */
import { GetObjectCommand, ListMultipartUploadsCommand, ListObjectsV2Command, type S3Client } from "@aws-sdk/client-s3";
import { spawnSync } from "node:child_process";
import { closeSync, openSync, readdirSync, writeFileSync, writeSync } from "node:fs";
import { randomBytes } from "node:crypto";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import {
  BIN, expectCliError, expectOk, jsonOut, listBundles, listLeftovers, makeAgent, REPO, runCli, startCli, tempDir,
} from "../helpers/cli.js";
import { READER, startS3Server, type S3Server } from "../helpers/s3-server.js";

let server: S3Server;
let client: S3Client;
beforeAll(async () => {
  server = await startS3Server();
  client = server.client();
}, 120_000);
afterAll(async () => {
  await server?.stop();
});

const MiB = 1 << 20;

async function keys(bucket: string): Promise<string[]> {
  const r = await client.send(new ListObjectsV2Command({ Bucket: bucket }));
  return (r.Contents ?? []).map((o) => o.Key!);
}
async function uploads(bucket: string): Promise<string[]> {
  const r = await client.send(new ListMultipartUploadsCommand({ Bucket: bucket }));
  return (r.Uploads ?? []).map((u) => u.Key!);
}
/** Resolves once the bucket has an open multipart upload (the snapshot is mid-upload). */
async function uploadStarted(bucket: string, ms = 60_000): Promise<void> {
  const until = Date.now() + ms;
  while (Date.now() < until) {
    if ((await uploads(bucket)).length) return;
    await new Promise((r) => setTimeout(r, 50));
  }
  throw new Error("no multipart upload started");
}

/** An agent with `mib` MiB of incompressible data (written a MiB at a time). */
function bigAgent(mib: number): ReturnType<typeof makeAgent> {
  const a = makeAgent({ files: { "MEMORY.md": "# memory\n" } });
  const fd = openSync(join(a.memoryDir, "blob.bin"), "w");
  for (let i = 0; i < mib; i++) writeSync(fd, randomBytes(MiB));
  closeSync(fd);
  return a;
}

function s3env(extra: Record<string, string> = {}): { env: Record<string, string>; tmp: string } {
  const tmp = tempDir("memsnap-s3-tmp-");
  return { env: { ...server.env, TMPDIR: tmp, MEMSNAP_S3_PART_MIB: "5", ...extra }, tmp };
}

/** Nothing of the snapshot left on the local disk: no bundle, temp file, work dir or lock; TMPDIR empty. */
function nothingLocal(dir: string, tmp: string): void {
  expect(listLeftovers(dir)).toEqual([]);
  expect(listBundles(dir)).toEqual([]);
  expect(readdirSync(tmp)).toEqual([]);
}

async function verifyObject(bucket: string, key: string, cwd: string): Promise<void> {
  const r = await client.send(new GetObjectCommand({ Bucket: bucket, Key: key }));
  const local = join(tempDir(), "copy.memsnap");
  writeFileSync(local, await r.Body!.transformToByteArray());
  expectOk(await runCli(["verify", local], { cwd }));
}

describe("s3 store faults on snapshot", () => {
  it("the server killed mid-upload: exit 8 STORE_UNREACHABLE with a hint; no object; nothing local", async () => {
    await server.createBucket("fault-killed");
    const a = bigAgent(60);
    const { env, tmp } = s3env({ MEMSNAP_S3_MAX_ATTEMPTS: "2" });
    const run = startCli(["snapshot", "-c", a.config, "--store", "s3://fault-killed/p"], { cwd: a.dir, env, timeoutMs: 120_000 });
    try {
      await uploadStarted("fault-killed");
      await server.kill();
      const r = await run.done;
      expectCliError(r, 8, "MEMSNAP_STORE_UNREACHABLE");
      expect(r.stderr).toMatch(/hint: check that http:\/\/127\.0\.0\.1:\d+ is up and reachable \(MEMSNAP_S3_ENDPOINT\)/);
      nothingLocal(a.dir, tmp);
    } finally {
      await server.restart();
    }
    expect(await keys("fault-killed")).toEqual([]);
    // The abort could not reach a dead server: the incomplete upload waits for prune's clean-up.
    expect((await uploads("fault-killed")).length).toBeLessThanOrEqual(1);
  }, 180_000);

  it("the server frozen (SIGSTOP) past the stall time-out, then thawed: retried, the snapshot completes", async () => {
    await server.createBucket("fault-paused");
    const a = bigAgent(40);
    const { env, tmp } = s3env({ MEMSNAP_S3_TIMEOUT_MS: "1000", MEMSNAP_S3_MAX_ATTEMPTS: "10" });
    const run = startCli(["--json", "snapshot", "-c", a.config, "--store", "s3://fault-paused/p"], { cwd: a.dir, env, timeoutMs: 120_000 });
    await uploadStarted("fault-paused");
    const t0 = Date.now();
    server.pause();
    await new Promise((r) => setTimeout(r, 3000));
    server.resume();
    const r = await run.done;
    expectOk(r);
    expect(Date.now() - t0).toBeGreaterThanOrEqual(3000);
    const key = `p/acme/scribe/${jsonOut(r).id}.memsnap`;
    expect(await keys("fault-paused")).toEqual([key]);
    expect(await uploads("fault-paused")).toEqual([]);
    nothingLocal(a.dir, tmp);
    await verifyObject("fault-paused", key, a.dir);
  }, 180_000);

  it("503 from the server (its object server down): retried with backoff until it is back", async () => {
    await server.createBucket("fault-503");
    const a = bigAgent(30);
    // Up to 20 attempts: backoff doubles to 20 s, so they outlast the object server's restart (5-10 s here).
    const { env } = s3env({ MEMSNAP_S3_MAX_ATTEMPTS: "20" });
    const run = startCli(["--json", "snapshot", "-c", a.config, "--store", "s3://fault-503/p"], { cwd: a.dir, env, timeoutMs: 200_000 });
    await uploadStarted("fault-503");
    await server.kill("object");
    await new Promise((r) => setTimeout(r, 1500));
    await server.restart("object");
    const r = await run.done;
    expectOk(r);
    const key = `p/acme/scribe/${jsonOut(r).id}.memsnap`;
    expect(await keys("fault-503")).toEqual([key]);
    await verifyObject("fault-503", key, a.dir);
  }, 240_000);

  it("503 that outlasts the attempts: exit 8 STORE_UNREACHABLE, no object", async () => {
    await server.createBucket("fault-503-out");
    const a = makeAgent();
    const { env, tmp } = s3env({ MEMSNAP_S3_MAX_ATTEMPTS: "2" });
    await server.kill("object");
    try {
      const r = await runCli(["snapshot", "-c", a.config, "--store", "s3://fault-503-out/p"], { cwd: a.dir, env });
      expectCliError(r, 8, "MEMSNAP_STORE_UNREACHABLE");
      expect(r.stderr).toMatch(/kept failing after 2 attempts \(ServiceUnavailable/);
      nothingLocal(a.dir, tmp);
    } finally {
      await server.restart("object");
    }
    expect(await keys("fault-503-out")).toEqual([]);
  });

  it("wrong credentials, a user without rights, a missing bucket: exit 8 with the code that says which", async () => {
    await server.createBucket("fault-auth");
    const a = makeAgent();
    const cases: [Record<string, string>, string, string, RegExp][] = [
      [{ AWS_SECRET_ACCESS_KEY: "wrong" }, "s3://fault-auth/p", "MEMSNAP_STORE_DENIED", /SignatureDoesNotMatch/],
      [{ AWS_ACCESS_KEY_ID: "nobody:none" }, "s3://fault-auth/p", "MEMSNAP_STORE_DENIED", /InvalidAccessKeyId|SignatureDoesNotMatch/],
      [READER, "s3://fault-auth/p", "MEMSNAP_STORE_DENIED", /AccessDenied/],
      [{}, "s3://no-such-bucket/p", "MEMSNAP_STORE_NOT_FOUND", /no such bucket/],
    ];
    for (const [extra, store, code, msg] of cases) {
      const { env, tmp } = s3env(extra);
      const r = await runCli(["snapshot", "-c", a.config, "--store", store], { cwd: a.dir, env });
      expectCliError(r, 8, code);
      expect(r.stderr).toMatch(msg);
      nothingLocal(a.dir, tmp);
    }
    expect(await keys("fault-auth")).toEqual([]);
  });

  it("peak RSS of a 320 MiB incompressible snapshot into s3 stays under 250 MiB (the bundle is never held)", async () => {
    await server.createBucket("fault-rss");
    const a = bigAgent(320);
    const { env, tmp } = s3env({ MEMSNAP_S3_PART_MIB: "8", NODE_OPTIONS: `--require=${join(REPO, "test", "helpers", "maxrss.cjs")}` });
    // bin/memsnap.js run as the installed command (sh re-executes it with memsnap's node flags).
    const r = spawnSync(BIN, ["--json", "snapshot", "-c", a.config, "--store", "s3://fault-rss/p"], {
      cwd: a.dir, env: { ...process.env, ...env }, encoding: "utf8", timeout: 170_000,
    });
    expect(r.status, r.stdout + r.stderr).toBe(0);
    const kib = Number(/memsnap-test-maxrss-kib=(\d+)/.exec(r.stderr)?.[1]);
    const j = JSON.parse(r.stdout);
    expect(j.bundle_bytes).toBeGreaterThan(320 * MiB);
    expect(kib / 1024, `peak RSS ${Math.round(kib / 1024)} MiB`).toBeLessThan(250);
    expect(await keys("fault-rss")).toEqual([`p/acme/scribe/${j.id}.memsnap`]);
    nothingLocal(a.dir, tmp);
  }, 180_000);
});
