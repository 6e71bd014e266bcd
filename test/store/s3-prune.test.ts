/**
 * delete and prune on an s3 store, with real CLI processes against the real server: the same
 * decisions and refusals as on disk; the two-phase delete (condemned, then deleted once the
 * grace has passed); stale multipart uploads aborted; credentials the bucket refuses change
 * nothing; a held prune lease makes another prune wait and fail MEMSNAP_LOCKED; snapshots and
 * prunes of one agent running at the same time lose nothing; schedule into an s3 store.
 */
import {
  CreateMultipartUploadCommand, ListMultipartUploadsCommand, ListObjectsV2Command, PutObjectCommand, UploadPartCommand,
} from "@aws-sdk/client-s3";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ulid } from "../../src/util/ulid.js";
import { expectCliError, expectOk, jsonOut, makeAgent, runCli, startCli, type Agent } from "../helpers/cli.js";
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
  const b = `prune-${process.pid}-${++n}`;
  await server.createBucket(b);
  return b;
}
const cli = (args: string[], cwd?: string, env: Record<string, string> = {}) =>
  runCli(args, { env: { ...server.env, ...env }, ...(cwd ? { cwd } : {}), timeoutMs: 120_000 });
async function keys(b: string): Promise<string[]> {
  const r = await server.client().send(new ListObjectsV2Command({ Bucket: b }));
  return (r.Contents ?? []).map((o) => o.Key!).sort();
}
async function snap(a: Agent, store: string): Promise<string> {
  const r = await cli(["snapshot", "-c", a.config, "--store", store, "--json"], a.dir);
  expectOk(r);
  return jsonOut(r).snapshot_id;
}
const bundles = (ks: string[]): string[] => ks.filter((k) => k.endsWith(".memsnap"));

describe("delete and prune on an s3 store", () => {
  it("delete refuses the last snapshot without --force, as on disk; prune --grace 0 removes what no rule keeps", async () => {
    const b = await bucket();
    const store = `s3://${b}/p`;
    const a = makeAgent();
    const ids = [await snap(a, store), await snap(a, store), await snap(a, store)];
    const d = await cli(["delete", ids[0]!, "--store", store]);
    expectOk(d);
    expect(d.stdout).toBe(`deleted s3://${b}/p/acme/scribe/${ids[0]}.memsnap\n`);
    const p = await cli(["prune", "--store", store, "--keep-last", "1", "--grace", "0"]);
    expectOk(p);
    expect(p.stdout).toContain(`  remove ${ids[1]} `);
    expect(p.stdout).toMatch(new RegExp(`keep   ${ids[2]} .*\\(newest, last 1/1\\)`));
    expect(bundles(await keys(b))).toEqual([`p/acme/scribe/${ids[2]}.memsnap`]);
    expectCliError(await cli(["delete", ids[2]!, "--store", store]), 2, "MEMSNAP_USAGE");
    expectOk(await cli(["delete", ids[2]!, "--store", store, "--force"]));
    expect(await keys(b)).toEqual([]);
  }, 180_000);

  it("without --grace 0 a prune condemns first and a later prune deletes once the grace has passed", async () => {
    const b = await bucket();
    const store = `s3://${b}/p`;
    const a = makeAgent();
    const [old, , newest] = [await snap(a, store), await snap(a, store), await snap(a, store)];
    const p1 = await cli(["prune", "--store", store, "--keep-last", "2", "--grace", "3s"]);
    expectOk(p1);
    expect(p1.stdout).toContain(`  condemn ${old} `);
    expect(await keys(b)).toContain(`p/acme/scribe/.memsnap/condemned/${old}`);
    expect(bundles(await keys(b))).toHaveLength(3);
    const dry = await cli(["prune", "--store", store, "--keep-last", "2", "--dry-run"]);
    expect(dry.stdout).toContain(`would remove ${old}`);
    await new Promise((r) => setTimeout(r, 3500));
    const p2 = await cli(["prune", "--store", store, "--keep-last", "2", "--grace", "3s", "--json"]);
    expectOk(p2);
    expect(jsonOut(p2).agents[0].removed).toEqual([`s3://${b}/p/acme/scribe/${old}.memsnap`]);
    expect(await keys(b)).toEqual(bundles(await keys(b))); // markers and the lease are gone
    expect(bundles(await keys(b))).toContain(`p/acme/scribe/${newest}.memsnap`);
  }, 180_000);

  it("aborts incomplete uploads older than the grace, keeps younger ones", async () => {
    const b = await bucket();
    const store = `s3://${b}/p`;
    const a = makeAgent();
    await snap(a, store);
    const c = server.client();
    const Key = `p/acme/scribe/${ulid()}.memsnap`;
    const up = await c.send(new CreateMultipartUploadCommand({ Bucket: b, Key }));
    await c.send(new UploadPartCommand({ Bucket: b, Key, UploadId: up.UploadId, PartNumber: 1, Body: Buffer.alloc(1024) }));
    const open = async (): Promise<number> => ((await c.send(new ListMultipartUploadsCommand({ Bucket: b }))).Uploads ?? []).length;
    expectOk(await cli(["prune", "--store", store, "--keep-last", "1"]));
    expect(await open()).toBe(1);
    const p = await cli(["prune", "--store", store, "--keep-last", "1", "--grace", "0"]);
    expectOk(p);
    expect(p.stdout).toContain(`aborted incomplete upload s3://${b}/${Key}`);
    expect(await open()).toBe(0);
  }, 180_000);

  it("credentials the bucket refuses: prune and delete fail MEMSNAP_STORE_DENIED and change nothing", async () => {
    const b = await bucket();
    const store = `s3://${b}/p`;
    const a = makeAgent();
    const ids = [await snap(a, store), await snap(a, store)];
    const before = await keys(b);
    const other = { AWS_ACCESS_KEY_ID: "test2:other", AWS_SECRET_ACCESS_KEY: "other2" };
    expectCliError(await cli(["prune", "--store", store, "--keep-last", "1", "--grace", "0"], undefined, other), 8, "MEMSNAP_STORE_DENIED");
    expectCliError(await cli(["delete", `s3://${b}/p/acme/scribe/${ids[0]}.memsnap`, "--store", store], undefined, other), 8, "MEMSNAP_STORE_DENIED");
    expect(await keys(b)).toEqual(before);
  }, 180_000);

  it("a live prune lease makes another prune wait, then fail MEMSNAP_LOCKED, and changes nothing", async () => {
    const b = await bucket();
    const store = `s3://${b}/p`;
    const a = makeAgent();
    await snap(a, store);
    await snap(a, store);
    const lease = `p/acme/scribe/.memsnap/prune-lease/${ulid(Date.now() - 1000)}.json`;
    await server.client().send(new PutObjectCommand({ Bucket: b, Key: lease, Body: "{}" }));
    const t0 = Date.now();
    expectCliError(await cli(["prune", "--store", store, "--keep-last", "1", "--grace", "0"]), 7, "MEMSNAP_LOCKED");
    expect(Date.now() - t0).toBeGreaterThan(9000);
    expect(bundles(await keys(b))).toHaveLength(2);
  }, 180_000);

  it("two hosts snapshotting one agent and two prunes at the same time lose nothing", async () => {
    const b = await bucket();
    const store = `s3://${b}/p`;
    const hosts = [makeAgent(), makeAgent()];
    const first = await snap(hosts[0]!, store);
    const made: string[] = [first];
    const loop = async (a: Agent, k: number): Promise<void> => {
      for (let i = 0; i < k; i++) made.push(await snap(a, store));
    };
    // The prunes keep everything made after `first`: whatever they delete must be `first` alone.
    const prune = async (): Promise<number | null> => {
      const runs: (number | null)[] = [];
      for (let i = 0; i < 3; i++) {
        const { done } = startCli(["prune", "--store", store, "--keep-within", "1h", "--keep-last", "1", "--grace", "0"], { env: server.env, timeoutMs: 120_000 });
        runs.push((await done).code);
      }
      return runs.every((c) => c === 0) ? 0 : runs.find((c) => c !== 0)!;
    };
    const [, , p1, p2] = await Promise.all([loop(hosts[0]!, 3), loop(hosts[1]!, 3), prune(), prune()]);
    expect([p1, p2]).toEqual([0, 0]);
    const left = bundles(await keys(b)).map((k) => k.slice("p/acme/scribe/".length, -".memsnap".length));
    expect(left.sort()).toEqual([...made].sort());
    expect((await keys(b)).filter((k) => k.includes("prune-lease"))).toEqual([]);
    expectOk(await cli(["verify", "--all", "--store", store]));
  }, 300_000);

  it("schedule takes its snapshots into the s3 store and its prune condemns the old ones", async () => {
    const b = await bucket();
    const store = `s3://${b}/p`;
    const a = makeAgent();
    const r = await cli(["schedule", "-c", a.config, "--store", store, "--every", "1s", "--max-runs", "3", "--keep-last", "1"], a.dir);
    expectOk(r);
    const ks = await keys(b);
    expect(bundles(ks)).toHaveLength(3);
    expect(ks.filter((k) => k.includes("/.memsnap/condemned/"))).toHaveLength(2);
    const list = jsonOut(await cli(["list", "--store", store, "--json"])).snapshots;
    expect(list.map((s: { created_by: string }) => s.created_by)).toEqual(["schedule", "schedule", "schedule"]);
    expectOk(await cli(["prune", "--store", store, "--keep-last", "1", "--scheduled-only", "--grace", "0"]));
    expect(bundles(await keys(b))).toEqual([`p/acme/scribe/${list[2].id}.memsnap`]);
  }, 180_000);
});
