/**
 * A bundle written straight into an object: the same container as BundleWriter writes to a file
 * (src/format/container.ts), streamed into a multipart upload (upload.ts) with no local copy.
 * The payload header goes first with size 0 and is patched in the held-back first part once the
 * payload's size is known; the object appears only when commit() completes the upload, and
 * abort() aborts it.
 */
import { ListObjectsV2Command, type S3Client } from "@aws-sdk/client-s3";
import { bundleTail, payloadHeader } from "./container.js";
import { patchSize } from "./tar-header.js";
import { s3Error } from "../objstore/client.js";
import { BundleUpload, type UploadOptions } from "../objstore/upload.js";

export class S3BundleWriter {
  readonly destPath: string;
  readonly #upload: BundleUpload;
  readonly #header: Buffer;
  readonly #mtime = new Date();

  constructor(
    client: S3Client,
    bucket: string,
    key: string,
    readonly encrypted: boolean,
    opts: UploadOptions = {},
  ) {
    this.#upload = new BundleUpload(client, bucket, key, opts);
    this.destPath = this.#upload.url;
    this.#header = payloadHeader(encrypted, this.#mtime);
  }

  /** Write the placeholder payload header; returns where the payload's bytes go, in order. */
  async open(): Promise<(bytes: Uint8Array) => Promise<void>> {
    await this.#upload.write(this.#header);
    return (bytes) => this.#upload.write(bytes);
  }

  /** Patch the payload size, append the manifest and the end-of-archive blocks, complete the upload. */
  async commit(manifest: Buffer, storedSize: number): Promise<{ size: number }> {
    try {
      patchSize(this.#header, storedSize);
      this.#upload.patch(0, this.#header);
      await this.#upload.write(bundleTail(manifest, storedSize, this.#mtime));
      return await this.#upload.complete();
    } catch (e) {
      await this.abort();
      throw s3Error(e, `upload ${this.destPath}`);
    }
  }

  /** Abort the upload (nothing becomes visible). Safe to call more than once. */
  async abort(): Promise<void> {
    await this.#upload.abort();
  }
}

/**
 * The newest snapshot id under `prefix` (`.../tenant/agent/`) older than `before`, or null: the
 * parent of a snapshot taken into an s3 store, as newestIn() finds it in a directory. Also the
 * first request a snapshot makes, so a wrong bucket or credentials fail before any capture work.
 */
export async function newestSnapshotIn(
  client: S3Client,
  bucket: string,
  prefix: string,
  before: string,
  url: string,
): Promise<string | null> {
  let newest: string | null = null;
  let token: string | undefined;
  try {
    do {
      const r = await client.send(
        new ListObjectsV2Command({ Bucket: bucket, Prefix: prefix, Delimiter: "/", ContinuationToken: token }),
      );
      for (const o of r.Contents ?? []) {
        const m = /^([0-9A-HJKMNP-TV-Z]{26})\.memsnap$/.exec(o.Key!.slice(prefix.length));
        if (m && m[1]! < before && (newest === null || m[1]! > newest)) newest = m[1]!;
      }
      token = r.IsTruncated ? r.NextContinuationToken : undefined;
    } while (token);
  } catch (e) {
    throw s3Error(e, `list ${url}`);
  }
  return newest;
}
