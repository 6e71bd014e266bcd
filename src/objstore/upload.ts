/**
 * The upload of one bundle to an object: sequential writes cut into parts, uploaded as they fill
 * with a bounded number in flight, so memory is (parts in flight + 2) x part size whatever the
 * bundle's size. The first part is held back in memory until complete(): the container's first
 * tar header (the payload's size) is patched into it after the payload has streamed, and it is
 * uploaded last. A bundle that fits in one part is one PutObject at complete(). The object is
 * visible only once complete() returns; any failure aborts the multipart upload (what an abort
 * cannot reach, a crash or a dead server, is left for `prune`'s clean-up of stale uploads).
 */
import {
  AbortMultipartUploadCommand,
  CompleteMultipartUploadCommand,
  CreateMultipartUploadCommand,
  PutObjectCommand,
  UploadPartCommand,
  type S3Client,
} from "@aws-sdk/client-s3";
import { MemsnapError } from "../errors.js";
import { s3Error } from "./client.js";
import { intEnv } from "./location.js";

/** S3's smallest part (all but the last) and most parts per upload. */
export const MIN_PART = 5 << 20;
export const MAX_PARTS = 10_000;
const MiB = 1 << 20;

export interface UploadOptions {
  /** Bytes per part (>= 5 MiB); default $MEMSNAP_S3_PART_MIB MiB, else 8 MiB. Doubles every 2,000 parts. */
  partSize?: number;
  /** Parts uploading at once; default $MEMSNAP_S3_CONCURRENCY, else 4. */
  inFlight?: number;
  /** Cancels the requests in flight (the upload is then aborted). */
  signal?: AbortSignal;
  /** Metadata and content type for the object. */
  contentType?: string;
  env?: NodeJS.ProcessEnv;
}

/** One object written by sequential {@link write}s, then {@link complete} or {@link abort}. */
export class BundleUpload {
  readonly url: string;
  readonly #client: S3Client;
  readonly #bucket: string;
  readonly #key: string;
  readonly #basePart: number;
  readonly #maxInFlight: number;
  readonly #signal: AbortSignal | undefined;
  readonly #contentType: string;
  /** The part being filled, its number (1-based) and fill. */
  #cur: Buffer;
  #curLen = 0;
  #partNo = 1;
  /** Part 1, held back once full (patchable until complete). */
  #first: Buffer | null = null;
  #uploadId: string | undefined;
  #creating: Promise<string> | undefined;
  readonly #etags: string[] = [];
  readonly #inFlight = new Set<Promise<void>>();
  /** Spare part buffers of the current size, reused instead of allocating one per part. */
  #spare: Buffer[] = [];
  #failure: MemsnapError | undefined;
  #written = 0;
  #state: "open" | "completing" | "done" | "aborted" = "open";

  constructor(client: S3Client, bucket: string, key: string, opts: UploadOptions = {}) {
    const env = opts.env ?? process.env;
    this.#client = client;
    this.#bucket = bucket;
    this.#key = key;
    this.url = `s3://${bucket}/${key}`;
    this.#basePart = opts.partSize ?? intEnv(env, "MEMSNAP_S3_PART_MIB", 8, 5, 5120) * MiB;
    if (this.#basePart < MIN_PART) throw new Error(`part size ${this.#basePart} is under S3's 5 MiB minimum`);
    this.#maxInFlight = opts.inFlight ?? intEnv(env, "MEMSNAP_S3_CONCURRENCY", 4, 1, 64);
    this.#signal = opts.signal;
    this.#contentType = opts.contentType ?? "application/x-tar";
    this.#cur = Buffer.allocUnsafe(this.#basePart);
  }

  /** Bytes written so far. */
  get size(): number {
    return this.#written;
  }

  /** The size of part `n`: the base size, doubled every 2,000 parts (10,000 parts of 8 MiB would stop at 78 GiB). */
  #partSize(n: number): number {
    return this.#basePart * 2 ** Math.floor((n - 1) / 2000);
  }

  #check(): void {
    if (this.#failure) throw this.#failure;
    if (this.#state !== "open") throw new Error(`upload of ${this.url} is ${this.#state}`);
  }

  /** Append `data` (copied). Resolves when it is buffered; waits while the parts in flight are at the bound. */
  async write(data: Uint8Array): Promise<void> {
    this.#check();
    let off = 0;
    while (off < data.length) {
      const n = Math.min(data.length - off, this.#cur.length - this.#curLen);
      this.#cur.set(data.subarray(off, off + n), this.#curLen);
      this.#curLen += n;
      off += n;
      this.#written += n;
      if (this.#curLen === this.#cur.length) await this.#partFull();
    }
  }

  /**
   * Overwrite bytes already written at `offset` (e.g. the first tar header). Only bytes not yet
   * sent can change: those in the held-back first part, or in the part being filled.
   */
  patch(offset: number, bytes: Uint8Array): void {
    this.#check();
    const end = offset + bytes.length;
    if (end > this.#written) throw new Error(`patch past the end of what was written (${end} > ${this.#written})`);
    const firstLen = this.#first?.length ?? 0;
    if (this.#first && end <= firstLen) {
      this.#first.set(bytes, offset);
      return;
    }
    const curStart = this.#written - this.#curLen;
    if (offset >= curStart) {
      this.#cur.set(bytes, offset - curStart);
      return;
    }
    throw new Error(`patch at ${offset}: those bytes were uploaded already`);
  }

  async #partFull(): Promise<void> {
    const part = this.#cur;
    const n = this.#partNo;
    this.#partNo++;
    this.#curLen = 0;
    if (n === 1) {
      this.#first = part;
      this.#cur = Buffer.allocUnsafe(this.#partSize(this.#partNo));
      return;
    }
    if (this.#partNo > MAX_PARTS) {
      throw this.#fail(
        new MemsnapError("MEMSNAP_STORE_ERROR", `${this.url}: the bundle needs more than ${MAX_PARTS} parts`, {
          hint: "raise MEMSNAP_S3_PART_MIB",
        }),
      );
    }
    const size = this.#partSize(this.#partNo);
    if (size !== part.length) this.#spare = [];
    this.#cur = this.#spare.pop() ?? Buffer.allocUnsafe(size);
    await this.#send(n, part, part.length);
  }

  #fail(e: unknown): MemsnapError {
    this.#failure ??= s3Error(e, `upload ${this.url}`);
    return this.#failure;
  }

  async #create(): Promise<string> {
    this.#creating ??= this.#client
      .send(
        new CreateMultipartUploadCommand({
          Bucket: this.#bucket,
          Key: this.#key,
          ContentType: this.#contentType,
        }),
        { abortSignal: this.#signal },
      )
      .then((r) => {
        if (!r.UploadId) throw new Error("CreateMultipartUpload returned no UploadId");
        this.#uploadId = r.UploadId;
        return r.UploadId;
      });
    return this.#creating;
  }

  /** Start uploading part `n` (bytes [0, len) of `buf`) once fewer than the bound are in flight. */
  async #send(n: number, buf: Buffer, len: number): Promise<void> {
    while (this.#inFlight.size >= this.#maxInFlight) await Promise.race(this.#inFlight);
    if (this.#failure) throw this.#failure;
    let uploadId: string;
    try {
      uploadId = await this.#create();
    } catch (e) {
      throw this.#fail(e);
    }
    const p: Promise<void> = this.#client
      .send(
        new UploadPartCommand({
          Bucket: this.#bucket,
          Key: this.#key,
          UploadId: uploadId,
          PartNumber: n,
          Body: buf.subarray(0, len),
          ContentLength: len,
        }),
        { abortSignal: this.#signal },
      )
      .then(
        (r) => {
          if (!r.ETag) throw new Error(`UploadPart ${n} returned no ETag`);
          this.#etags[n - 1] = r.ETag;
          if (buf.length === this.#cur.length && n !== 1) this.#spare.push(buf);
        },
        (e: unknown) => {
          this.#fail(e);
        },
      )
      .finally(() => {
        this.#inFlight.delete(p);
      });
    this.#inFlight.add(p);
  }

  /**
   * Upload what is left (the last part, then the held-back first part) and complete the upload,
   * or put a small bundle in one request. On failure the upload is aborted and the error thrown.
   */
  async complete(): Promise<{ size: number }> {
    this.#check();
    this.#state = "completing";
    try {
      if (!this.#first) {
        // One part or less: one PutObject, nothing multipart to clean up.
        await this.#client.send(
          new PutObjectCommand({
            Bucket: this.#bucket,
            Key: this.#key,
            Body: this.#cur.subarray(0, this.#curLen),
            ContentLength: this.#curLen,
            ContentType: this.#contentType,
          }),
          { abortSignal: this.#signal },
        );
      } else {
        if (this.#curLen > 0) await this.#send(this.#partNo, this.#cur, this.#curLen);
        await this.#send(1, this.#first, this.#first.length);
        await Promise.all(this.#inFlight);
        if (this.#failure) throw this.#failure;
        const parts = this.#etags.map((ETag, i) => ({ ETag, PartNumber: i + 1 }));
        if (parts.length !== (this.#curLen > 0 ? this.#partNo : this.#partNo - 1) || parts.some((p) => !p.ETag)) {
          throw new Error("a part is missing its ETag");
        }
        await this.#client.send(
          new CompleteMultipartUploadCommand({
            Bucket: this.#bucket,
            Key: this.#key,
            UploadId: this.#uploadId,
            MultipartUpload: { Parts: parts },
          }),
          { abortSignal: this.#signal },
        );
      }
    } catch (e) {
      const err = this.#fail(e);
      this.#state = "open";
      await this.abort();
      throw err;
    }
    this.#state = "done";
    this.#release();
    return { size: this.#written };
  }

  #release(): void {
    this.#first = null;
    this.#spare = [];
    this.#cur = Buffer.alloc(0);
  }

  /**
   * Stop: wait for the parts in flight, then abort the multipart upload so no part stays stored.
   * Safe to call more than once and after a failure; an abort the server does not answer is left
   * to `prune` (stale uploads). Resolves true when nothing is left on the server.
   */
  async abort(): Promise<boolean> {
    if (this.#state === "done") return false;
    if (this.#state === "aborted") return true;
    this.#state = "aborted";
    this.#failure ??= new MemsnapError("MEMSNAP_INTERRUPTED", `upload of ${this.url} was aborted`);
    await Promise.allSettled([...this.#inFlight]);
    await this.#creating?.catch(() => undefined);
    this.#release();
    if (!this.#uploadId) return true;
    try {
      // Not under the caller's signal: it may be what stopped the upload.
      await this.#client.send(
        new AbortMultipartUploadCommand({ Bucket: this.#bucket, Key: this.#key, UploadId: this.#uploadId }),
      );
      return true;
    } catch {
      return false;
    }
  }
}
