/**
 * Reading one object of an S3 store: the BundleFile of a bundle URL (../format/bundle-file.ts).
 *
 * - The size comes from the listing that found the object, else from HeadObject.
 * - Small positioned reads (a bundle's headers, its manifest, the age header) are served from
 *   a cache of 64 KiB blocks, each filled by one ranged GET that covers every missing block of
 *   the read: reading a manifest takes two or three GETs, never the whole object.
 * - A sequential stream (the payload, for restore and verify) fetches 8 MiB ranges, the next
 *   one while the current is consumed, so memory stays at a few ranges whatever the size; a
 *   range whose body fails midway is fetched again (the SDK retries the requests themselves).
 */
import { GetObjectCommand, HeadObjectCommand, type S3Client } from "@aws-sdk/client-s3";
import { MemsnapError } from "../errors.js";
import { s3ClientFor, s3Error } from "./client.js";
import { parseObjectUrl } from "./location.js";

const BLOCK = 64 * 1024;
const CACHED_BLOCKS = 32;
/** Bytes per ranged GET of a stream. */
export const STREAM_RANGE = 8 * 1024 * 1024;
/** Ranges in flight ahead of the one being read (3 × 8 MiB: 4 took restore to ~240 MiB peak RSS). */
const STREAM_AHEAD = 3;
/** Chunks a stream yields (the decoder copies each into its worker). */
const STREAM_CHUNK = 1024 * 1024;
/** Attempts at one range whose body failed after the request succeeded. */
const BODY_ATTEMPTS = 3;

const clients = new Map<string, S3Client>();

/** The client for a bucket (one per bucket and process: the SDK keeps its connections). */
export function clientFor(bucket: string): S3Client {
  let c = clients.get(bucket);
  if (!c) {
    c = s3ClientFor({ bucket });
    clients.set(bucket, c);
  }
  return c;
}

const isMissing = (e: unknown): boolean => {
  const x = e as { name?: string; Code?: string; $metadata?: { httpStatusCode?: number } };
  return (
    x?.name === "NotFound" ||
    x?.name === "NoSuchKey" ||
    x?.Code === "NoSuchKey" ||
    (x?.$metadata?.httpStatusCode === 404 && x?.name !== "NoSuchBucket")
  );
};

const missing = (url: string): MemsnapError =>
  new MemsnapError("MEMSNAP_SOURCE_MISSING", `cannot open bundle ${url}: no such object`, {
    path: url,
    hint: "check the bundle URL (memsnap list shows the store's bundles)",
  });

/** The bytes [from, to) of an object, in one ranged GET (fewer at its end). */
export async function getRange(
  client: S3Client,
  bucket: string,
  key: string,
  from: number,
  to: number,
  url: string,
): Promise<Buffer> {
  let last: unknown;
  for (let attempt = 0; attempt < BODY_ATTEMPTS; attempt++) {
    let body: { transformToByteArray(): Promise<Uint8Array> } | undefined;
    try {
      const r = await client.send(new GetObjectCommand({ Bucket: bucket, Key: key, Range: `bytes=${from}-${to - 1}` }));
      body = r.Body as typeof body;
    } catch (e) {
      if (isMissing(e)) throw missing(url);
      if ((e as { $metadata?: { httpStatusCode?: number } }).$metadata?.httpStatusCode === 416) return Buffer.alloc(0);
      throw s3Error(e, `reading ${url}`);
    }
    try {
      const bytes = await body!.transformToByteArray();
      return Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength);
    } catch (e) {
      last = e; // the connection broke inside the body: the range again
    }
  }
  throw s3Error(last, `reading ${url}`);
}

/** An object opened for positioned reads and streams: a BundleFile (../format/bundle-file.ts) by shape. */
export class ObjectBundle {
  readonly local = false;
  readonly #blocks = new Map<number, Buffer>();

  constructor(
    readonly path: string,
    readonly size: number,
    private readonly client: S3Client,
    private readonly bucket: string,
    private readonly key: string,
  ) {}

  #get(from: number, to: number): Promise<Buffer> {
    return getRange(this.client, this.bucket, this.key, from, to, this.path);
  }

  async read(buf: Buffer, off: number, len: number, pos: number): Promise<number> {
    const end = Math.min(this.size, pos + len);
    if (end <= pos) return 0;
    if (end - pos > (CACHED_BLOCKS / 2) * BLOCK) {
      const got = await this.#get(pos, end); // a large read (a big manifest): straight through
      got.copy(buf, off);
      return got.length;
    }
    const first = Math.floor(pos / BLOCK);
    const last = Math.floor((end - 1) / BLOCK);
    let lo = -1;
    let hi = -1;
    for (let i = first; i <= last; i++) {
      if (this.#blocks.has(i)) continue;
      if (lo < 0) lo = i;
      hi = i;
    }
    if (lo >= 0) {
      const got = await this.#get(lo * BLOCK, Math.min(this.size, (hi + 1) * BLOCK));
      for (let i = lo; i <= hi; i++) {
        const b = got.subarray((i - lo) * BLOCK, Math.min(got.length, (i - lo + 1) * BLOCK));
        this.#blocks.delete(i);
        this.#blocks.set(i, b);
        if (this.#blocks.size > CACHED_BLOCKS) this.#blocks.delete(this.#blocks.keys().next().value!);
      }
    }
    let n = 0;
    for (let i = first; i <= last; i++) {
      const b = this.#blocks.get(i);
      if (!b) break;
      const from = Math.max(pos, i * BLOCK) - i * BLOCK;
      const to = Math.min(end - i * BLOCK, b.length);
      if (to <= from) break;
      b.copy(buf, off + n, from, to);
      n += to - from;
      if (b.length < BLOCK) break; // the object ended early
    }
    return n;
  }

  async *stream(start: number, end: number): AsyncGenerator<Buffer> {
    end = Math.min(end, this.size);
    const ranges: { p: Promise<Buffer>; len: number }[] = [];
    let next = start;
    const more = (): void => {
      while (ranges.length < STREAM_AHEAD && next < end) {
        const to = Math.min(end, next + STREAM_RANGE);
        const p = this.#get(next, to);
        p.catch(() => undefined); // awaited in turn; one left behind by an early stop must not go unhandled
        ranges.push({ p, len: to - next });
        next = to;
      }
    };
    more();
    while (ranges.length) {
      const r = ranges.shift()!;
      const got = await r.p;
      more();
      for (let i = 0; i < got.length; i += STREAM_CHUNK) yield got.subarray(i, Math.min(got.length, i + STREAM_CHUNK));
      if (got.length < r.len) return; // the object is shorter than its size: the reader finds it short
    }
  }

  async close(): Promise<void> {
    this.#blocks.clear();
  }
}

/** Open the object at `url` (see ../../format/bundle-file.ts openBundle). */
export async function openObjectBundle(url: string, knownSize?: number): Promise<ObjectBundle> {
  const { bucket, key } = parseObjectUrl(url);
  const client = clientFor(bucket);
  let size = knownSize;
  if (size === undefined) {
    try {
      const h = await client.send(new HeadObjectCommand({ Bucket: bucket, Key: key }));
      size = h.ContentLength ?? 0;
    } catch (e) {
      if (isMissing(e)) throw missing(url);
      throw s3Error(e, `reading ${url}`);
    }
  }
  return new ObjectBundle(url, size, client, bucket, key);
}
