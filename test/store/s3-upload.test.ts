/**
 * The bundle upload (src/objstore/upload.ts) against the real S3 server: one PutObject for a
 * small bundle; a multipart upload whose first part is held back, patched and sent last, with
 * a bounded number of parts in flight; the bytes read back equal those written; and a failure
 * mid-upload leaves no object and, once the abort reaches the server, no open multipart upload.
 */
import {
  GetObjectCommand, HeadObjectCommand, ListMultipartUploadsCommand, ListObjectsV2Command, type S3Client,
} from "@aws-sdk/client-s3";
import { createHash, randomBytes } from "node:crypto";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { isMemsnapError } from "../../src/errors.js";
import { s3ClientFor } from "../../src/objstore/client.js";
import { BundleUpload } from "../../src/objstore/upload.js";
import { startS3Server, type S3Server } from "../helpers/s3-server.js";

let server: S3Server;
beforeAll(async () => {
  server = await startS3Server();
}, 120_000);
afterAll(async () => {
  await server?.stop();
});

const MiB = 1 << 20;
const sha = (b: Uint8Array): string => createHash("sha256").update(b).digest("hex");

/** A memsnap client for the server, recording the part numbers of UploadPart requests and how many ran at once. */
function recordingClient(env: Record<string, string> = {}): { client: S3Client; parts: number[]; maxConcurrent: () => number; puts: () => number } {
  const client = s3ClientFor({ bucket: "x" }, { ...server.env, ...env });
  const parts: number[] = [];
  let cur = 0;
  let max = 0;
  let puts = 0;
  client.middlewareStack.add((next, context) => async (args) => {
    const input = args.input as { PartNumber?: number };
    if (context.commandName === "PutObjectCommand") puts++;
    if (context.commandName !== "UploadPartCommand") return next(args);
    parts.push(input.PartNumber!);
    max = Math.max(max, ++cur);
    try {
      return await next(args);
    } finally {
      cur--;
    }
  }, { step: "initialize", name: "recordParts" });
  return { client, parts, maxConcurrent: () => max, puts: () => puts };
}

async function getBytes(c: S3Client, Bucket: string, Key: string): Promise<Buffer> {
  const r = await c.send(new GetObjectCommand({ Bucket, Key }));
  return Buffer.from(await r.Body!.transformToByteArray());
}

async function openUploads(c: S3Client, Bucket: string): Promise<string[]> {
  const r = await c.send(new ListMultipartUploadsCommand({ Bucket }));
  return (r.Uploads ?? []).map((u) => u.Key!);
}

async function keys(c: S3Client, Bucket: string): Promise<string[]> {
  const r = await c.send(new ListObjectsV2Command({ Bucket }));
  return (r.Contents ?? []).map((o) => o.Key!);
}

/** Write `data` in chunks of varying sizes (not aligned to parts). */
async function writeChunked(u: BundleUpload, data: Buffer): Promise<void> {
  let off = 0;
  for (let i = 0; off < data.length; i++) {
    const n = Math.min(data.length - off, [1, 511, 65_536, 1_000_003, 3 * MiB + 7][i % 5]!);
    await u.write(data.subarray(off, off + n));
    off += n;
  }
}

describe("BundleUpload", () => {
  it("a bundle under one part is one PutObject, patchable until complete", async () => {
    await server.createBucket("up-small");
    const { client, parts, puts } = recordingClient();
    const data = randomBytes(300_000);
    const u = new BundleUpload(client, "up-small", "p/a/b/1.memsnap", { partSize: 5 * MiB });
    await writeChunked(u, data);
    u.patch(0, Buffer.from("HEADER"));
    data.write("HEADER", 0);
    expect(await keys(client, "up-small")).toEqual([]); // nothing visible before complete()
    expect(await u.complete()).toEqual({ size: 300_000 });
    expect(parts).toEqual([]);
    expect(puts()).toBe(1);
    expect(sha(await getBytes(client, "up-small", "p/a/b/1.memsnap"))).toBe(sha(data));
    expect(await openUploads(client, "up-small")).toEqual([]);
  });

  it("a large bundle goes in parts, at most `inFlight` at once, the patched first part last", async () => {
    await server.createBucket("up-large");
    const { client, parts, maxConcurrent } = recordingClient();
    const data = randomBytes(33 * MiB + 12_345);
    const u = new BundleUpload(client, "up-large", "big.memsnap", { partSize: 5 * MiB, inFlight: 2 });
    await writeChunked(u, data);
    expect(await keys(client, "up-large")).toEqual([]);
    const header = Buffer.alloc(512, 0x41);
    u.patch(0, header);
    header.copy(data, 0);
    u.patch(5 * MiB - 10, Buffer.from("0123456789")); // the end of the held-back part
    data.write("0123456789", 5 * MiB - 10);
    expect(() => u.patch(5 * MiB, Buffer.from("x"))).toThrow(/uploaded already/); // part 2 is gone
    await u.complete();
    expect(parts.length).toBe(7);
    expect(parts.at(-1)).toBe(1);
    expect([...parts].sort((a, b) => a - b)).toEqual([1, 2, 3, 4, 5, 6, 7]);
    expect(maxConcurrent()).toBeLessThanOrEqual(2);
    expect(maxConcurrent()).toBeGreaterThanOrEqual(1);
    const got = await getBytes(client, "up-large", "big.memsnap");
    expect(got.length).toBe(data.length);
    expect(sha(got)).toBe(sha(data));
    expect(await openUploads(client, "up-large")).toEqual([]);
  });

  it("a bundle of exactly one part, and one of a part and a byte, read back equal", async () => {
    await server.createBucket("up-edges");
    const { client } = recordingClient();
    for (const [key, n] of [["one", 5 * MiB], ["one-plus", 5 * MiB + 1], ["empty", 0]] as const) {
      const data = randomBytes(n);
      const u = new BundleUpload(client, "up-edges", key, { partSize: 5 * MiB });
      await u.write(data);
      await u.complete();
      expect(sha(await getBytes(client, "up-edges", key)), key).toBe(sha(data));
    }
    expect(await openUploads(client, "up-edges")).toEqual([]);
  });

  it("the server killed mid-upload: STORE_UNREACHABLE; no object; abort() once it is back leaves no upload", async () => {
    await server.createBucket("up-killed");
    const { client } = recordingClient({ MEMSNAP_S3_MAX_ATTEMPTS: "2" });
    const u = new BundleUpload(client, "up-killed", "k.memsnap", { partSize: 5 * MiB, inFlight: 2 });
    const data = randomBytes(40 * MiB);
    await u.write(data.subarray(0, 16 * MiB)); // parts 2 and 3 start
    await server.kill();
    let err: unknown;
    try {
      await u.write(data.subarray(16 * MiB));
      await u.complete();
    } catch (e) {
      err = e;
    }
    expect(isMemsnapError(err, "MEMSNAP_STORE_UNREACHABLE"), String(err)).toBe(true);
    expect((err as { hint?: string }).hint).toMatch(/MEMSNAP_S3_ENDPOINT/);
    await server.restart();
    // The multipart upload was created before the kill, and nothing could abort it yet.
    expect(await openUploads(client, "up-killed")).toEqual(["k.memsnap"]);
    expect(await u.abort()).toBe(true);
    expect(await openUploads(client, "up-killed")).toEqual([]);
    expect(await keys(client, "up-killed")).toEqual([]);
    await expect(client.send(new HeadObjectCommand({ Bucket: "up-killed", Key: "k.memsnap" }))).rejects.toMatchObject({ name: "NotFound" });
  });

  it("a failure while the server is up (the signal fires mid-upload) aborts the upload: nothing is left", async () => {
    await server.createBucket("up-cancel");
    const { client } = recordingClient();
    const ac = new AbortController();
    const u = new BundleUpload(client, "up-cancel", "c.memsnap", { partSize: 5 * MiB, inFlight: 2, signal: ac.signal });
    const data = randomBytes(30 * MiB);
    await u.write(data.subarray(0, 12 * MiB));
    ac.abort();
    await expect(u.write(data.subarray(12 * MiB)).then(() => u.complete())).rejects.toSatisfy((e) => isMemsnapError(e));
    expect(await u.abort()).toBe(true);
    expect(await openUploads(client, "up-cancel")).toEqual([]);
    expect(await keys(client, "up-cancel")).toEqual([]);
  });
});
