/**
 * Reading one object of an S3 store: the BundleFile of a bundle URL (../format/bundle-file.ts).
 *
 * - The size comes from the listing that found the object, else from the first ranged GET's
 *   Content-Range (its 128 KiB fill the block cache: no HeadObject round trip).
 * - Small positioned reads (a bundle's headers, its manifest, the age header) are served from
 *   a cache of 64 KiB blocks, each filled by one ranged GET that covers every missing block of
 *   the read: reading a manifest takes two or three GETs, never the whole object. The cache of a
 *   closed object serves the next open of it within 10 s (a restore opens a bundle three times).
 * - A sequential stream (the payload, for restore and verify) fetches 8 MiB ranges, several in flight
 *   while the current one is consumed ($MEMSNAP_S3_READ_AHEAD ranges ahead of it, default 3), so memory
 *   stays at a few ranges whatever the size. A range's body is kept as the chunks the socket delivered
 *   and yielded as they are (never joined into one buffer: that was a fresh 8 MiB per range, a copy and
 *   its page faults); a range whose body fails midway is fetched again (the SDK retries the requests
 *   themselves).
 */
import { GetObjectCommand, HeadObjectCommand, type S3Client } from "@aws-sdk/client-s3";
import { MemsnapError } from "../errors.js";
import { s3ClientFor, s3Error } from "./client.js";
import { intEnv, parseObjectUrl } from "./location.js";

const BLOCK = 64 * 1024;
const CACHED_BLOCKS = 32;
/** Bytes per ranged GET of a stream. */
export const STREAM_RANGE = 8 * 1024 * 1024;
/** Ranges a stream fetches ahead of the one being read, by default ($MEMSNAP_S3_READ_AHEAD). */
export const STREAM_AHEAD = 3;
/** The most the variable may ask for (64 × 8 MiB ahead is 512 MiB of memory). */
const MAX_STREAM_AHEAD = 64;
/** Blocks the first ranged GET of an object of unknown size fills (its Content-Range gives the size). */
const FIRST_BLOCKS = 2;
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

/** A ranged GET's body, as the chunks the socket delivered, and the object's size from its Content-Range. */
interface RangeBody {
  chunks: Buffer[];
  bytes: number;
  /** The whole object's size (Content-Range "bytes a-b/size"), when the server said. */
  total: number | undefined;
}

/** The bytes [from, to) of an object, in one ranged GET (fewer at its end), as the socket's chunks. */
export async function getRangeChunks(
  client: S3Client,
  bucket: string,
  key: string,
  from: number,
  to: number,
  url: string,
): Promise<RangeBody> {
  let last: unknown;
  for (let attempt = 0; attempt < BODY_ATTEMPTS; attempt++) {
    let body: AsyncIterable<Uint8Array> | undefined;
    let total: number | undefined;
    try {
      const r = await client.send(new GetObjectCommand({ Bucket: bucket, Key: key, Range: `bytes=${from}-${to - 1}` }));
      body = r.Body as AsyncIterable<Uint8Array> | undefined;
      const m = /\/(\d+)\s*$/.exec(r.ContentRange ?? "");
      total = m ? Number(m[1]) : undefined;
    } catch (e) {
      if (isMissing(e)) throw missing(url);
      const status = (e as { $metadata?: { httpStatusCode?: number } }).$metadata?.httpStatusCode;
      if (status === 416) return { chunks: [], bytes: 0, total: from === 0 ? 0 : undefined };
      throw s3Error(e, `reading ${url}`);
    }
    const chunks: Buffer[] = [];
    let bytes = 0;
    try {
      for await (const c of body ?? []) {
        const b = Buffer.isBuffer(c) ? c : Buffer.from(c.buffer, c.byteOffset, c.byteLength);
        chunks.push(b);
        bytes += b.length;
      }
      return { chunks, bytes, total };
    } catch (e) {
      last = e; // the connection broke inside the body: the range again
    }
  }
  throw s3Error(last, `reading ${url}`);
}

/** The bytes [from, to) of an object, in one ranged GET (fewer at its end). */
export async function getRange(
  client: S3Client,
  bucket: string,
  key: string,
  from: number,
  to: number,
  url: string,
): Promise<Buffer> {
  const r = await getRangeChunks(client, bucket, key, from, to, url);
  return r.chunks.length === 1 ? r.chunks[0]! : Buffer.concat(r.chunks, r.bytes);
}

/** An object opened for positioned reads and streams: a BundleFile (../format/bundle-file.ts) by shape. */
export class ObjectBundle {
  readonly local = false;
  #blocks = new Map<number, Buffer>();

  constructor(
    readonly path: string,
    readonly size: number,
    private readonly client: S3Client,
    private readonly bucket: string,
    private readonly key: string,
    /** Ranges a stream fetches ahead of the one being read. */
    private readonly ahead = STREAM_AHEAD,
  ) {}

  #get(from: number, to: number): Promise<Buffer> {
    return getRange(this.client, this.bucket, this.key, from, to, this.path);
  }

  /** Put the blocks of `got` (bytes from block `lo` on) in the cache. */
  cache(lo: number, got: Buffer): void {
    for (let i = lo; (i - lo) * BLOCK < got.length; i++) {
      const b = got.subarray((i - lo) * BLOCK, Math.min(got.length, (i - lo + 1) * BLOCK));
      this.#blocks.delete(i);
      this.#blocks.set(i, b);
      if (this.#blocks.size > CACHED_BLOCKS) this.#blocks.delete(this.#blocks.keys().next().value!);
    }
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
    if (lo >= 0) this.cache(lo, await this.#get(lo * BLOCK, Math.min(this.size, (hi + 1) * BLOCK)));
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
    const ranges: { p: Promise<RangeBody>; len: number }[] = [];
    let next = start;
    const more = (): void => {
      while (ranges.length < this.ahead && next < end) {
        const to = Math.min(end, next + STREAM_RANGE);
        const p = getRangeChunks(this.client, this.bucket, this.key, next, to, this.path);
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
      // Yielded as the socket delivered them, each dropped once the consumer asks for the next: a range's memory
      // goes as it is read, with no copy here (the decoder copies them into the blocks it moves to its worker).
      for (let c = got.chunks.shift(); c !== undefined; c = got.chunks.shift()) yield c;
      if (got.bytes < r.len) return; // the object is shorter than its size: the reader finds it short
    }
  }

  async close(): Promise<void> {
    // Kept a moment for the next open of the same object (a restore opens a bundle three times: its layout, its
    // age header, its payload; each read the same first blocks again, one round trip each).
    if (this.#blocks.size > 0) {
      recent.delete(this.path);
      recent.set(this.path, { size: this.size, blocks: this.#blocks, at: Date.now() });
      if (recent.size > RECENT_OBJECTS) recent.delete(recent.keys().next().value!);
    }
    this.#blocks = new Map();
  }

  /** Start with the blocks a bundle of this object closed a moment ago had read. */
  adopt(blocks: Map<number, Buffer>): void {
    this.#blocks = blocks;
  }
}

/**
 * The block caches of the objects closed last, for a moment: a bundle object is written once under a new name and
 * never changed (an object replaced meanwhile would be read as it was up to RECENT_MS before).
 */
const recent = new Map<string, { size: number; blocks: Map<number, Buffer>; at: number }>();
const RECENT_OBJECTS = 2;
const RECENT_MS = 10_000;

/** The cached blocks of `url` closed less than RECENT_MS ago, if its size is `size` (when known); taken. */
function takeRecent(url: string, size: number | undefined): { size: number; blocks: Map<number, Buffer> } | null {
  const r = recent.get(url);
  if (!r) return null;
  recent.delete(url);
  if (Date.now() - r.at > RECENT_MS || (size !== undefined && size !== r.size)) return null;
  return r;
}

/**
 * Open the object at `url` (see ../../format/bundle-file.ts openBundle). Throws MEMSNAP_USAGE when
 * $MEMSNAP_S3_READ_AHEAD is not an integer from 1 to 64.
 */
export async function openObjectBundle(url: string, knownSize?: number): Promise<ObjectBundle> {
  const { bucket, key } = parseObjectUrl(url);
  const ahead = intEnv(process.env, "MEMSNAP_S3_READ_AHEAD", STREAM_AHEAD, 1, MAX_STREAM_AHEAD);
  const client = clientFor(bucket);
  const kept = takeRecent(url, knownSize);
  if (kept !== null || knownSize !== undefined) {
    const o = new ObjectBundle(url, kept?.size ?? knownSize!, client, bucket, key, ahead);
    if (kept !== null) o.adopt(kept.blocks);
    return o;
  }
  // The first blocks, which every reader of a bundle reads first (its container headers), and the size with them.
  const first = await getRangeChunks(client, bucket, key, 0, FIRST_BLOCKS * BLOCK, url);
  let size = first.total;
  const cached = size !== undefined;
  if (size === undefined) {
    try {
      const h = await client.send(new HeadObjectCommand({ Bucket: bucket, Key: key }));
      size = h.ContentLength ?? 0;
    } catch (e) {
      if (isMissing(e)) throw missing(url);
      throw s3Error(e, `reading ${url}`);
    }
  }
  const o = new ObjectBundle(url, size, client, bucket, key, ahead);
  // (Not the body of a server that ignored the Range and sent it all.)
  if (cached && first.bytes > 0 && first.bytes <= FIRST_BLOCKS * BLOCK)
    o.cache(0, Buffer.concat(first.chunks, first.bytes));
  return o;
}
