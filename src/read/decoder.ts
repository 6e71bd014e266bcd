/**
 * The read side of the payload, in one worker thread (./decoder.worker.ts): bundle file
 * ─pread─▶ SHA-256 of the stored bytes (unless `hashStored: false`) ─▶ [age STREAM open] ─▶ zstd -d (bounded)
 * ─▶ tar bytes,
 * pushed to the main thread as a Readable; with `scan` (what readPayload uses), the tar's framing is parsed here
 * too (./tar-scan.ts) and the main thread gets each batch of bytes with its entries' ranges.
 *
 * The main thread only writes each artifact (restore) and hashes the entries the worker left
 * to it, so decryption, decompression, tar parsing and the stored-byte hash run on the other
 * core. Measured on the bench's scale-1 restore: 3.55 -> 3.1 CPU-s and ~8 MiB less peak RSS
 * than parsing with tar-stream on the main thread (its streams and per-entry objects), wall
 * time within the noise (this worker is then the busier thread; see docs/BENCHMARK.md). The age header is
 * opened on the main thread first (typage and the identities live there; see codecs/age/stream-open.ts
 * `openAgePrefix`), and the worker gets the payload key and the offset of the first chunk.
 *
 * Errors keep the codes and messages of the stream stages they replace (codecs/age/stream-open.ts
 * AgeDecryptStream, zstd.ts): a chunk that does not authenticate, a truncated STREAM, data
 * after the final chunk → MEMSNAP_DECRYPT_FAILED; damaged or truncated zstd, or output past
 * `maxOutputBytes` → MEMSNAP_PAYLOAD_CORRUPT; a short read → MEMSNAP_BUNDLE_TRUNCATED.
 *
 * Flow control: the worker decompresses into the slots of one shared memory (util/slots.ts)
 * and posts each slot as it fills; it stops reading the file while no slot is free, so memory
 * stays bounded whatever the compression ratio (a zstd bomb included). With `scan`, the main
 * thread reads a batch where the worker wrote it and gives the slot back once the reader and
 * whoever pinned a view of it are done with it; without, it copies the bytes out first.
 */
import { closeSync, constants, openSync } from "node:fs";
import { Readable } from "node:stream";
import { Worker } from "node:worker_threads";
import { MemsnapError } from "../errors.js";
import { isBundleUrl, openBundle, type BundleFile } from "../format/bundle-file.js";
import { aeadAddonPath } from "../codecs/aead.js";
import { directIoAddon } from "../util/directio.js";
import { SlotPool } from "../util/slots.js";
import { workerUrl } from "../util/worker-path.js";
import { AGE_DAMAGED_HINT, AGE_SEALED_CHUNK } from "../codecs/age/stream-open.js";
import type { DecoderData, DecoderErrorKind, DecoderReply, DecoderRequest } from "./decoder.worker.js";
import { zstdBindingPath } from "../codecs/zstd-binding.js";

const READ_BLOCK = 1024 * 1024;
/** Bytes of a remote payload per block moved to the worker, and how many given back are kept for reuse. */
const FEED_BLOCK = 1024 * 1024;
const FEED_SPARE = 10;
const OUT_CHUNK = 1024 * 1024;
/** Bytes the main thread may hold unread without `scan` (then copied out of the slots). */
const OUT_CREDIT = 4 * 1024 * 1024;
/**
 * Slots with `scan`: the reader's batch, the batches queued for it and those pinned by writes in
 * flight (a restore's WriteBehind keeps up to 4 MiB of views), with room for the worker to go on.
 */
const SCAN_SLOTS = 10;

export interface PayloadDecoderOptions {
  /** A local path (read by the worker itself), or a bundle URL (read here and fed to the worker). */
  path: string;
  /** The bundle's size, when known (saves a remote bundle's HeadObject). */
  fileSize?: number;
  /** Byte range of the payload member in the bundle file. */
  offset: number;
  size: number;
  /** age STREAM key and the offset (within the payload) of its first chunk, or null when plaintext. */
  age: { key: Buffer; offset: number } | null;
  /** zstd output past this is MEMSNAP_PAYLOAD_CORRUPT (a bomb guard). */
  maxOutputBytes: number;
  onStored?: (storedBytes: number, storedTotal: number) => void;
  /**
   * Hash the stored bytes (default true): `stored` then gives their SHA-256, else null. Only an
   * age payload may be read without (a keyed restore: see readPayload's `skipStoredHash`).
   */
  hashStored?: boolean;
  /**
   * Parse the tar in the worker and hash each entry there (./tar-scan.ts): the decoder then
   * yields {@link ScannedBatch}es instead of tar bytes, and a failure comes after the batches
   * decoded before it, as a batch holding only the error. Output past `tarSize` bytes is
   * MEMSNAP_UNSAFE_BUNDLE (the manifest's declared size: a zstd or tar bomb).
   */
  scan?: { tarSize: number };
}

/**
 * Tar bytes and what the worker's scanner found in them (`ops`, see TarScanner), or the failure
 * that ended the payload. `buf` is a view of a shared slot: call `release` once (when the reader
 * moves on); a view kept past that must be pinned (util/slots.ts `pin`).
 */
export type ScannedBatch = { buf: Buffer; ops: (number | string)[]; release: () => void } | { err: MemsnapError };

export interface StoredResult {
  /** Null when the decoder was told not to hash them (PayloadDecoderOptions.hashStored). */
  sha256: string | null;
  size: number;
  /** Of those bytes, how many were read with O_DIRECT (0: all through the page cache). */
  directBytes: number;
}

function toError(kind: DecoderErrorKind, msg: string, o: PayloadDecoderOptions): MemsnapError {
  switch (kind) {
    case "decrypt":
      return new MemsnapError("MEMSNAP_DECRYPT_FAILED", msg, { hint: AGE_DAMAGED_HINT });
    case "corrupt":
      return new MemsnapError("MEMSNAP_PAYLOAD_CORRUPT", `invalid zstd data: ${msg}`);
    case "truncated":
      return new MemsnapError("MEMSNAP_PAYLOAD_CORRUPT", `zstd stream is truncated: ${msg}`);
    case "too-big":
      return new MemsnapError(
        "MEMSNAP_PAYLOAD_CORRUPT",
        `decompressed size exceeds the declared size (${o.maxOutputBytes} bytes)`,
      );
    case "bomb":
      return new MemsnapError(
        "MEMSNAP_UNSAFE_BUNDLE",
        `the payload decompresses past its declared ${o.scan!.tarSize} bytes`,
        {
          hint: "a zstd or tar bomb, or a tampered manifest: nothing was restored",
        },
      );
    case "tar":
      return new MemsnapError("MEMSNAP_PAYLOAD_CORRUPT", `the payload is not a valid tar stream: ${msg}`, {
        hint: "the bundle is damaged; use another copy",
      });
    case "short":
      return new MemsnapError("MEMSNAP_BUNDLE_TRUNCATED", `${o.path}: ${msg}`, {
        path: o.path,
        hint: "the file was cut short, e.g. by an interrupted copy; use another copy",
      });
    case "open":
      return new MemsnapError("MEMSNAP_SOURCE_UNREADABLE", `cannot read bundle ${o.path}: ${msg}`, {
        path: o.path,
        hint: "check the bundle path",
      });
    case "internal":
      return new MemsnapError("MEMSNAP_INTERNAL", `payload decoding failed: ${msg}`);
  }
}

/**
 * The payload's tar bytes (or, with `scan`, {@link ScannedBatch}es), decoded in a worker;
 * `stored` resolves with the stored bytes' hash once all are read.
 */
export class PayloadDecoder extends Readable {
  readonly stored: Promise<StoredResult>;
  readonly #worker: Worker;
  readonly #slots: SlotPool;
  /** Without `scan`: slots copied out but not given back while the consumer is behind. */
  readonly #owed: number[] = [];
  #gone = false;
  #done = false;
  #resolveStored!: (r: StoredResult) => void;
  #rejectStored!: (e: Error) => void;

  constructor(private readonly opts: PayloadDecoderOptions) {
    // Scanning, the objects are batches of at most OUT_CHUNK bytes: the same bound in bytes.
    // (Scanning, the slots bound what is queued; the high-water mark only says when to stop asking.)
    super(opts.scan ? { objectMode: true, highWaterMark: SCAN_SLOTS } : { highWaterMark: OUT_CREDIT });
    const slots = opts.scan ? SCAN_SLOTS : OUT_CREDIT / OUT_CHUNK + 1;
    this.#slots = new SlotPool(slots, OUT_CHUNK, (slot) => {
      if (!this.#gone) this.#worker.postMessage({ t: "free", slot } satisfies DecoderRequest);
    });
    this.stored = new Promise((res, rej) => {
      this.#resolveStored = res;
      this.#rejectStored = rej;
    });
    this.stored.catch(() => undefined);
    // The worker reads through these; they are closed once it has exited (see below), so a
    // failed or abandoned decode leaves no descriptor open.
    let fd = -1;
    let dfd = -1;
    let openError = "";
    const feed = isBundleUrl(opts.path);
    if (!feed) {
      try {
        fd = openSync(opts.path, "r");
      } catch (e) {
        openError = (e as Error).message;
      }
    }
    const direct = fd >= 0 && opts.age !== null ? directIoAddon() : null;
    if (direct !== null) {
      try {
        dfd = openSync(opts.path, constants.O_RDONLY | constants.O_DIRECT);
      } catch {
        dfd = -1; // no O_DIRECT on this file system: buffered reads
      }
    }
    this.#worker = new Worker(workerUrl("read/decoder.worker.js"), {
      execArgv: [],
      resourceLimits: { maxYoungGenerationSizeMb: 4 },
      workerData: {
        bindingPath: zstdBindingPath(),
        path: opts.path,
        offset: opts.offset,
        size: opts.size,
        ageKey: opts.age ? Uint8Array.from(opts.age.key) : null,
        ageOffset: opts.age?.offset ?? 0,
        maxOut: opts.maxOutputBytes,
        sealedChunk: AGE_SEALED_CHUNK,
        readBlock: READ_BLOCK,
        outChunk: OUT_CHUNK,
        slots,
        memory: this.#slots.memory,
        aeadAddon: aeadAddonPath(),
        directAddon: direct,
        fd,
        dfd,
        openError,
        scan: opts.scan ?? null,
        progress: opts.onStored !== undefined,
        hashStored: opts.hashStored !== false,
        feed,
      } satisfies DecoderData,
    });
    this.#worker.on("message", (m: DecoderReply) => this.#onMessage(m));
    this.#worker.on("error", (e: Error) =>
      this.#fail(new MemsnapError("MEMSNAP_INTERNAL", `payload worker failed: ${e.message}`, { cause: e })),
    );
    this.#worker.on("exit", (code: number) => {
      for (const d of [fd, dfd]) if (d >= 0) closeSync(d);
      void this.#closeFeed();
      this.#gone = true;
      if (!this.destroyed && !this.#done)
        this.#fail(new MemsnapError("MEMSNAP_INTERNAL", `payload worker exited unexpectedly (code ${code})`));
    });
  }

  /**
   * A remote bundle's payload stream, opened on the worker's first "need". Its chunks (a socket's, of any
   * size) are copied into blocks of FEED_BLOCK bytes, moved to the worker, which moves each back once it
   * has used it (`spare`): the same few blocks go round, instead of a fresh one (and its page faults) per MiB.
   */
  #feed: {
    file: BundleFile | null;
    it: AsyncIterator<Buffer> | null;
    busy: boolean;
    closed: boolean;
    wanted: number;
    /** The chunk being copied out and how much of it is. */
    chunk: Buffer | null;
    at: number;
    spare: ArrayBuffer[];
  } = { file: null, it: null, busy: false, closed: false, wanted: 0, chunk: null, at: 0, spare: [] };

  /** Post the worker the next `n` blocks of a remote payload (or its end). */
  async #pull(n: number): Promise<void> {
    const f = this.#feed;
    f.wanted += n;
    if (f.busy || f.closed) return;
    f.busy = true;
    try {
      if (!f.it) {
        f.file = await openBundle(this.opts.path, this.opts.fileSize);
        f.it = f.file.stream(this.opts.offset, this.opts.offset + this.opts.size)[Symbol.asyncIterator]();
      }
      while (f.wanted > 0) {
        const ab = f.spare.pop() ?? new ArrayBuffer(FEED_BLOCK);
        const block = Buffer.from(ab);
        let len = 0;
        let end = false;
        while (len < FEED_BLOCK) {
          if (f.chunk === null || f.at === f.chunk.length) {
            const r = await f.it.next();
            if (this.#gone || f.closed) return;
            if (r.done) {
              end = true;
              break;
            }
            f.chunk = r.value;
            f.at = 0;
          }
          const k = Math.min(FEED_BLOCK - len, f.chunk.length - f.at);
          f.chunk.copy(block, len, f.at, f.at + k);
          len += k;
          f.at += k;
        }
        if (len > 0) {
          f.wanted--;
          this.#worker.postMessage({ t: "in", buf: ab, len } satisfies DecoderRequest, [ab]);
        } else f.spare.push(ab);
        if (end) {
          this.#worker.postMessage({ t: "in", end: true } satisfies DecoderRequest);
          f.wanted = 0;
          return;
        }
      }
    } catch (e) {
      if (!this.#gone && !f.closed) {
        this.#fail(
          e instanceof MemsnapError
            ? e
            : new MemsnapError(
                "MEMSNAP_SOURCE_UNREADABLE",
                `cannot read bundle ${this.opts.path}: ${(e as Error).message}`,
                {
                  path: this.opts.path,
                  hint: "check the bundle path",
                  cause: e,
                },
              ),
        );
      }
    } finally {
      f.busy = false;
    }
  }

  async #closeFeed(): Promise<void> {
    const f = this.#feed;
    if (f.closed) return;
    f.closed = true;
    await f.it?.return?.(undefined).catch(() => undefined);
    await f.file?.close().catch(() => undefined);
  }

  #fail(e: Error): void {
    this.#rejectStored(e);
    this.#stop();
    this.destroy(e);
  }

  #stop(): void {
    if (this.#gone) return;
    this.#gone = true;
    void this.#worker.terminate().catch(() => undefined);
  }

  #onMessage(m: DecoderReply): void {
    if (this.destroyed) return;
    switch (m.t) {
      case "out": {
        let view: Buffer;
        try {
          view = this.#slots.take(m.slot, m.len);
        } catch (e) {
          this.#fail(new MemsnapError("MEMSNAP_INTERNAL", `payload worker: ${(e as Error).message}`, { cause: e }));
          return;
        }
        if (m.ops) {
          const slots = this.#slots;
          let released = false;
          this.push({
            buf: view,
            ops: m.ops,
            release: () => {
              if (!released) slots.release(m.slot);
              released = true;
            },
          } satisfies ScannedBatch);
          return;
        }
        if (this.push(Buffer.from(view))) this.#slots.release(m.slot);
        else this.#owed.push(m.slot);
        return;
      }
      case "stored":
        this.opts.onStored?.(m.n, this.opts.size);
        return;
      case "need":
        void this.#pull(m.n);
        return;
      case "back":
        if (this.#feed.spare.length < FEED_SPARE) this.#feed.spare.push(m.buf);
        return;
      case "done":
        this.#done = true;
        this.#resolveStored({ sha256: m.sha256, size: m.size, directBytes: m.directBytes });
        this.#stop();
        this.push(null);
        return;
      case "err": {
        const e = toError(m.kind, m.msg, this.opts);
        if (!this.opts.scan) {
          this.#fail(e);
          return;
        }
        // In order: the reader meets the batches decoded before the failure, then the failure.
        this.#done = true;
        this.#rejectStored(e);
        this.#stop();
        this.push({ err: e } satisfies ScannedBatch);
        this.push(null);
        return;
      }
    }
  }

  override _read(): void {
    for (const slot of this.#owed.splice(0)) this.#slots.release(slot);
  }

  override _destroy(err: Error | null, cb: (e?: Error | null) => void): void {
    this.#rejectStored(err ?? new MemsnapError("MEMSNAP_INTERNAL", "payload reading stopped"));
    this.#stop();
    cb(err);
  }
}
