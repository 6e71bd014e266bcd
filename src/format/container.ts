/**
 * The outer bundle container: a POSIX tar with exactly two members, written in one pass.
 *
 *   [header: payload.tar.zst(.age)] [payload bytes] [pad] [header: manifest.json] [manifest] [pad] [2 zero blocks]
 *
 * The payload header is written with size 0, the payload streams straight into the file
 * (hashed as it goes), then the header's size is patched in place and the manifest member
 * is appended. Readers find the manifest with two header reads and one seek. Everything is
 * written to a temp file beside the destination and renamed into place only after fsync;
 * `abort()` removes the temp file, so a failure leaves nothing behind.
 */
import { createHash, randomBytes, type Hash } from "node:crypto";
import { open, stat, type FileHandle } from "node:fs/promises";
import { basename, dirname, join } from "node:path";
import { Writable } from "node:stream";
import { MemsnapError, destinationError } from "../errors.js";
import { withBundle, type BundleFile } from "./bundle-file.js";
import { commitRename, unlinkQuiet } from "../util/fs-atomic.js";
import { MANIFEST_MAX_BYTES, MANIFEST_MEMBER, PAYLOAD_MEMBER_ENCRYPTED, PAYLOAD_MEMBER_PLAIN } from "./manifest.js";
import { BLOCK, decodeHeader, encodeHeader, padding, patchSize } from "./tar-header.js";

/** Temp files are named `.<final name>.tmp-<pid>-<random>` so cleanup can tell whose they are. */
export function tempPathFor(dest: string): string {
  return join(dirname(dest), `.${basename(dest)}.tmp-${process.pid}-${randomBytes(4).toString("hex")}`);
}

/** Writes the payload with positional writes, hashing and counting every stored byte. */
class PayloadSink extends Writable {
  readonly hash: Hash = createHash("sha256");
  bytes = 0;
  head: Buffer = Buffer.alloc(0);
  constructor(
    private readonly fh: FileHandle,
    private readonly start: number,
    private readonly path: string,
  ) {
    super({ highWaterMark: 1 << 20 });
  }
  private note(chunk: Buffer): void {
    this.hash.update(chunk);
    if (this.head.length < 64) this.head = Buffer.concat([this.head, chunk.subarray(0, 64 - this.head.length)]);
  }
  override _write(chunk: Buffer, _enc: BufferEncoding, cb: (e?: Error | null) => void): void {
    this.note(chunk);
    const pos = this.start + this.bytes;
    this.bytes += chunk.length;
    this.fh.write(chunk, 0, chunk.length, pos).then(
      () => cb(),
      (e) => cb(destinationError(e, this.path)),
    );
  }
  override _writev(chunks: { chunk: Buffer }[], cb: (e?: Error | null) => void): void {
    const bufs = chunks.map((c) => c.chunk);
    for (const b of bufs) this.note(b);
    const pos = this.start + this.bytes;
    const total = bufs.reduce((n, b) => n + b.length, 0);
    this.bytes += total;
    this.fh.writev(bufs, pos).then(
      () => cb(),
      (e) => cb(destinationError(e, this.path)),
    );
  }
}

/** Result of writing the payload member. */
export interface PayloadWritten {
  storedSize: number;
  sha256: string;
  /** First bytes of the payload, to check its magic against the declared encryption. */
  head: Buffer;
}

/** The payload member's header, its size to be patched in once the payload is written. */
export function payloadHeader(encrypted: boolean, mtime: Date): Buffer {
  return encodeHeader(encrypted ? PAYLOAD_MEMBER_ENCRYPTED : PAYLOAD_MEMBER_PLAIN, 0, mtime, 0o600);
}

/** What follows a payload of `storedSize` bytes: its padding, the manifest member, the end-of-archive blocks. */
export function bundleTail(manifest: Buffer, storedSize: number, mtime: Date): Buffer {
  const mHeader = encodeHeader(MANIFEST_MEMBER, manifest.length, mtime, 0o644);
  return Buffer.concat([
    Buffer.alloc(padding(storedSize)),
    mHeader,
    manifest,
    Buffer.alloc(padding(manifest.length)),
    Buffer.alloc(2 * BLOCK),
  ]);
}

/**
 * Writes one bundle file atomically. Call {@link open}, stream into {@link payload}, then {@link commit} or {@link
 * abort}.
 */
export class BundleWriter {
  readonly tmpPath: string;
  private fh: FileHandle | undefined;
  private sink: PayloadSink | undefined;
  private header: Buffer | undefined;
  private readonly mtime = new Date();

  constructor(
    readonly destPath: string,
    readonly encrypted: boolean,
  ) {
    this.tmpPath = tempPathFor(destPath);
  }

  /** Create the temp file and write the placeholder payload header. Throws MEMSNAP_DEST_* on failure. */
  async open(): Promise<Writable> {
    try {
      this.fh = await open(this.tmpPath, "wx", 0o600);
      this.header = payloadHeader(this.encrypted, this.mtime);
      await this.fh.write(this.header, 0, BLOCK, 0);
    } catch (e) {
      await this.abort();
      throw destinationError(e, this.destPath);
    }
    this.sink = new PayloadSink(this.fh, BLOCK, this.destPath);
    return this.sink;
  }

  /**
   * Create the temp file and write the placeholder payload header, for a writer that writes
   * the payload itself at `start` (positional writes, e.g. from a worker thread). The fd stays
   * open until {@link commit} or {@link abort}. Throws MEMSNAP_DEST_* on failure.
   */
  async openRaw(): Promise<{ fd: number; start: number }> {
    try {
      this.fh = await open(this.tmpPath, "wx", 0o600);
      this.header = payloadHeader(this.encrypted, this.mtime);
      await this.fh.write(this.header, 0, BLOCK, 0);
    } catch (e) {
      await this.abort();
      throw destinationError(e, this.destPath);
    }
    return { fd: this.fh.fd, start: BLOCK };
  }

  /** What the payload sink has seen so far (call after the payload stream finished). */
  payloadResult(): PayloadWritten {
    if (!this.sink) throw new Error("BundleWriter not open");
    return { storedSize: this.sink.bytes, sha256: this.sink.hash.digest("hex"), head: this.sink.head };
  }

  /** Patch the payload size, append the manifest and the end-of-archive blocks, fsync and rename into place. */
  async commit(manifest: Buffer, storedSize: number): Promise<void> {
    const fh = this.fh;
    if (!fh || !this.header) throw new Error("BundleWriter not open");
    try {
      patchSize(this.header, storedSize);
      await fh.write(this.header, 0, BLOCK, 0);
      let pos = BLOCK + storedSize;
      const tail = bundleTail(manifest, storedSize, this.mtime);
      await fh.write(tail, 0, tail.length, pos);
      pos += tail.length;
      await fh.truncate(pos);
      await fh.sync();
      await fh.close();
      this.fh = undefined;
      await commitRename(this.tmpPath, this.destPath);
    } catch (e) {
      await this.abort();
      throw destinationError(e, this.destPath);
    }
  }

  /** Close and remove the temp file. Safe to call more than once. */
  async abort(): Promise<void> {
    const fh = this.fh;
    this.fh = undefined;
    if (fh) await fh.close().catch(() => undefined);
    await unlinkQuiet(this.tmpPath).catch(() => undefined);
  }
}

/** Where the members of a bundle lie in its file. */
export interface BundleLayout {
  path: string;
  fileSize: number;
  payloadMember: string;
  payloadOffset: number;
  payloadSize: number;
  manifestBytes: Buffer;
  /** The first bytes of the payload (up to 64), to check its magic. */
  payloadHead: Buffer;
}

const truncated = (path: string, what: string): MemsnapError =>
  new MemsnapError("MEMSNAP_BUNDLE_TRUNCATED", `${path}: bundle ends early (${what})`, {
    path,
    hint: "the file was cut short, e.g. by an interrupted copy; use another copy",
  });
const malformed = (path: string, what: string): MemsnapError =>
  new MemsnapError("MEMSNAP_BUNDLE_MALFORMED", `${path}: not a memsnap bundle (${what})`, {
    path,
    hint: "memsnap bundles are tar files holding payload.tar.zst[.age] and manifest.json",
  });

/** Up to `len` bytes at `pos` (fewer only at the end of the file). */
export async function readAt(fh: FileHandle, pos: number, len: number): Promise<Buffer> {
  const buf = Buffer.alloc(len);
  let got = 0;
  while (got < len) {
    const { bytesRead } = await fh.read(buf, got, len - got, pos + got);
    if (bytesRead === 0) break;
    got += bytesRead;
  }
  return buf.subarray(0, got);
}

/**
 * Locate the payload and read the manifest bytes with a few positioned reads; the payload
 * itself is not read. `path` is a local path or a bundle URL (./bundle-file.ts); `knownSize`
 * the size a store listing gave. Throws MEMSNAP_BUNDLE_TRUNCATED, MEMSNAP_BUNDLE_MALFORMED, or
 * MEMSNAP_SOURCE_MISSING when the bundle does not exist.
 */
export async function readLayout(path: string, knownSize?: number): Promise<BundleLayout> {
  return withBundle(path, layoutOf, knownSize);
}

/** {@link readLayout} of a bundle already open. */
export async function layoutOf(f: BundleFile): Promise<BundleLayout> {
  const path = f.path;
  const readAt = async (pos: number, len: number): Promise<Buffer> => {
    const buf = Buffer.alloc(len);
    return buf.subarray(0, len > 0 ? await f.read(buf, 0, len, pos) : 0);
  };
  const fileSize = f.size;
  const h0 = await readAt(0, BLOCK);
  if (h0.length < BLOCK)
    throw fileSize === 0 ? truncated(path, "empty file") : truncated(path, "inside the first header");
  let first;
  try {
    first = decodeHeader(h0);
  } catch (e) {
    throw malformed(path, `payload header: ${(e as Error).message}`);
  }
  if (!first) throw malformed(path, "empty archive");
  if (first.name !== PAYLOAD_MEMBER_PLAIN && first.name !== PAYLOAD_MEMBER_ENCRYPTED) {
    throw malformed(path, `first member is ${JSON.stringify(first.name)}`);
  }
  if (first.type !== "0") throw malformed(path, "payload member is not a regular file");
  const payloadOffset = BLOCK;
  const mPos = payloadOffset + first.size + padding(first.size);
  if (mPos + BLOCK > fileSize) throw truncated(path, "inside the payload or before the manifest");
  let second;
  try {
    second = decodeHeader(await readAt(mPos, BLOCK));
  } catch (e) {
    throw malformed(path, `manifest header: ${(e as Error).message}`);
  }
  if (!second) throw truncated(path, "no manifest member");
  if (second.name !== MANIFEST_MEMBER || second.type !== "0")
    throw malformed(path, `second member is ${JSON.stringify(second.name)}`);
  if (second.size > MANIFEST_MAX_BYTES) {
    throw new MemsnapError(
      "MEMSNAP_UNSAFE_BUNDLE",
      `${path}: manifest of ${second.size} bytes is over the ${MANIFEST_MAX_BYTES}-byte cap`,
      {
        path,
        hint: "refusing to read it; this bundle was not written by memsnap or was tampered with",
      },
    );
  }
  const end = mPos + BLOCK + second.size + padding(second.size) + 2 * BLOCK;
  if (fileSize < mPos + BLOCK + second.size) throw truncated(path, "inside the manifest");
  if (fileSize < end) throw truncated(path, "in the end-of-archive blocks");
  if (fileSize > end) {
    const extra = await readAt(end, Math.min(fileSize - end, 1 << 20));
    if (fileSize - end > 1 << 20 || !extra.every((b) => b === 0))
      throw malformed(path, "data after the end of the archive");
  }
  const manifestBytes = await readAt(mPos + BLOCK, second.size);
  const trailer = await readAt(mPos + BLOCK + second.size, padding(second.size) + 2 * BLOCK);
  if (!trailer.every((b) => b === 0)) throw malformed(path, "end-of-archive blocks are not zero");
  const payloadHead = await readAt(payloadOffset, Math.min(64, first.size));
  const payloadPad = await readAt(payloadOffset + first.size, padding(first.size));
  if (!payloadPad.every((b) => b === 0)) throw malformed(path, "the padding after the payload is not zero");
  return {
    path,
    fileSize,
    payloadMember: first.name,
    payloadOffset,
    payloadSize: first.size,
    manifestBytes,
    payloadHead,
  };
}

/** Size of a file, or null when it does not exist. */
export async function fileSizeOrNull(path: string): Promise<number | null> {
  try {
    return (await stat(path)).size;
  } catch {
    return null;
  }
}
