/**
 * The test harness's S3 server (Swift + s3api on loopback) works with the AWS SDK: buckets,
 * put/get/list, a multipart upload, and the pause/kill/restart controls fault tests use.
 */
import {
  CompleteMultipartUploadCommand, CreateMultipartUploadCommand, GetObjectCommand, HeadObjectCommand,
  ListObjectsV2Command, PutObjectCommand, UploadPartCommand,
} from "@aws-sdk/client-s3";
import { createHash, randomBytes } from "node:crypto";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startS3Server, type S3Server } from "../helpers/s3-server.js";

let server: S3Server;
beforeAll(async () => {
  server = await startS3Server();
}, 120_000);
afterAll(async () => {
  await server?.stop();
});

const sha = (b: Uint8Array): string => createHash("sha256").update(b).digest("hex");

describe("s3 test server", () => {
  it("creates a bucket; put, get, ranged get, head and list work", async () => {
    await server.createBucket("harness-basic");
    const c = server.client();
    const body = randomBytes(100_000);
    await c.send(new PutObjectCommand({ Bucket: "harness-basic", Key: "a/b/c.bin", Body: body }));
    await c.send(new PutObjectCommand({ Bucket: "harness-basic", Key: "a/d.bin", Body: "x" }));
    const got = await c.send(new GetObjectCommand({ Bucket: "harness-basic", Key: "a/b/c.bin" }));
    expect(sha(await got.Body!.transformToByteArray())).toBe(sha(body));
    const range = await c.send(new GetObjectCommand({ Bucket: "harness-basic", Key: "a/b/c.bin", Range: "bytes=10-19" }));
    expect(Buffer.from(await range.Body!.transformToByteArray())).toEqual(body.subarray(10, 20));
    expect((await c.send(new HeadObjectCommand({ Bucket: "harness-basic", Key: "a/b/c.bin" }))).ContentLength).toBe(100_000);
    const list = await c.send(new ListObjectsV2Command({ Bucket: "harness-basic", Prefix: "a/" }));
    expect(list.Contents!.map((o) => o.Key).sort()).toEqual(["a/b/c.bin", "a/d.bin"]);
  });

  it("does multipart uploads of 5 MiB parts", async () => {
    await server.createBucket("harness-multipart");
    const c = server.client();
    const Bucket = "harness-multipart";
    const Key = "big.bin";
    const parts = [randomBytes(5 << 20), randomBytes(1000)];
    const { UploadId } = await c.send(new CreateMultipartUploadCommand({ Bucket, Key }));
    const etags = [];
    for (const [i, p] of parts.entries()) {
      etags.push((await c.send(new UploadPartCommand({ Bucket, Key, UploadId, PartNumber: i + 1, Body: p }))).ETag);
    }
    await c.send(new CompleteMultipartUploadCommand({
      Bucket, Key, UploadId, MultipartUpload: { Parts: etags.map((ETag, i) => ({ ETag, PartNumber: i + 1 })) },
    }));
    const got = await c.send(new GetObjectCommand({ Bucket, Key }));
    expect(sha(await got.Body!.transformToByteArray())).toBe(sha(Buffer.concat(parts)));
  });

  it("kill() refuses connections and restart() brings the same endpoint back; pause() holds requests", async () => {
    await server.createBucket("harness-faults");
    const c = server.client();
    await server.kill();
    await expect(c.send(new HeadObjectCommand({ Bucket: "harness-faults", Key: "x" }))).rejects.toMatchObject({ code: "ECONNREFUSED" });
    await server.restart();
    await c.send(new PutObjectCommand({ Bucket: "harness-faults", Key: "x", Body: "1" }));
    server.pause();
    const t0 = Date.now();
    const pending = c.send(new GetObjectCommand({ Bucket: "harness-faults", Key: "x" }));
    setTimeout(() => server.resume(), 1500);
    const got = await pending;
    expect(await got.Body!.transformToString()).toBe("1");
    expect(Date.now() - t0).toBeGreaterThanOrEqual(1400);
  });
});
