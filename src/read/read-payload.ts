/**
 * Reading a bundle's payload: stored bytes ─hash─▶ [age -d] ─▶ zstd -d (bounded) ─▶ tar ─▶ entries.
 * Everything up to the tar's framing runs in one worker thread (./decoder.ts, ./tar-scan.ts:
 * one tar parser, so the bytes hashed are the bytes handed to the handler); the age header is
 * opened here first, so a wrong key fails before the worker starts.
 *
 * Every stored byte is hashed (payload SHA-256; a keyed restore of an age payload skips it, see
 * {@link ReadPayloadOptions.skipStoredHash}), every entry's bytes are hashed and counted
 * as they pass to the caller's handler, and the index (the last member) is parsed. The
 * caller compares the result with the manifest through {@link compareWithIndex}, which
 * collects every finding instead of stopping at the first.
 */
import { createHash } from "node:crypto";
import { Writable } from "node:stream";
import { heapPacer } from "../util/gc.js";
import { MemsnapError, type Finding } from "../errors.js";
import type { BundleLayout } from "../format/container.js";
import { withBundle } from "../format/bundle-file.js";
import {
  encodeIndex,
  indexHash,
  INDEX_PATH,
  isChunkedIn,
  refOf,
  storedOf,
  type IndexDocument,
  type IndexEntry,
  type Manifest,
} from "../format/manifest.js";
import { AGE_PREFIX_MAX, openAgePrefix } from "../codecs/age/stream-open.js";
import { PayloadDecoder, type ScannedBatch } from "./decoder.js";
import { EntryTable } from "./entry-table.js";
import { artifactProblem, IndexComparer } from "./index-stream.js";
import { chunkedProblem } from "../format/chunked.js";
import { OP_DATA, OP_END, OP_START } from "./tar-scan.js";

/** The event loop gets a turn at least this often while entries stream (ms). */
const TURN_MS = 50;
/**
 * Old-generation garbage from the entries' per-entry objects is collected once 16 MiB of it may have built up (see
 * heapPacer).
 */
const collectEntries = heapPacer(16 * 1024 * 1024);

/** Identities and passphrases that may open an encrypted bundle. */
export interface Keys {
  identities?: string[];
  passphrases?: string[];
  /** The highest scrypt work factor (log2 N) a passphrase is tried on; default $MEMSNAP_SCRYPT_MAX_LOG_N, else 18. */
  scryptMaxLogN?: number;
}

/** What an entry handler is told about the entry. */
export interface EntryInfo {
  name: string;
  size: number;
  layer: string;
  /** Path inside the layer. */
  rel: string;
}

/**
 * Called for each artifact entry with its bytes. A chunk is a view of the decoder's shared
 * memory, valid until the handler asks for the next chunk or returns: a handler that keeps one
 * longer (a write that completes later, chunks gathered for one write) pins it with
 * `pin` (util/slots.ts) or copies it.
 */
export type EntryHandler = (info: EntryInfo, chunks: AsyncIterable<Buffer>) => Promise<void>;

/** An entry as read: its name, the bytes it held and what they hashed to. */
export interface PayloadEntry {
  name: string;
  size: number;
  sha256: string;
}

export interface PayloadReadResult {
  /** Null when the stored bytes were not hashed (`skipStoredHash` on an age payload). */
  storedSha256: string | null;
  storedSize: number;
  /** Entries in payload order (the index excluded), with what their bytes hashed to. */
  entries: EntryTable;
  /** The parsed index, or null when it was missing, unparseable (a finding says which) or streamed. */
  index: IndexDocument | null;
  /** With `streamIndex`: the index's snapshot id and its comparison with the entries. */
  indexCheck: { snapshotId: unknown; findings: Finding[] } | null;
  indexSha256: string | null;
  findings: Finding[];
  /** How many entries the decoder worker hashed (the main thread hashed the others; a diagnostic). */
  hashedInWorker: number;
}

const INDEX_MAX_BYTES = 256 * 1024 * 1024;
const EMPTY = Buffer.alloc(0);
const BOMB_MARGIN = 4 * 1024 * 1024;

async function readRange(path: string, pos: number, len: number, size: number): Promise<Buffer> {
  return withBundle(
    path,
    async (f) => {
      const buf = Buffer.alloc(len);
      return buf.subarray(0, await f.read(buf, 0, len, pos));
    },
    size,
  );
}

/** Hash a byte range of the bundle file without decrypting it (verify without a key). */
export async function hashStoredPayload(
  layout: BundleLayout,
  onStored?: (storedBytes: number, storedTotal: number) => void,
): Promise<{ sha256: string; size: number; head: Buffer }> {
  const h = createHash("sha256");
  let size = 0;
  let head = Buffer.alloc(0);
  if (layout.payloadSize > 0) {
    await withBundle(
      layout.path,
      async (f) => {
        for await (const b of f.stream(layout.payloadOffset, layout.payloadOffset + layout.payloadSize)) {
          if (head.length < 64) head = Buffer.concat([head, b.subarray(0, 64 - head.length)]);
          h.update(b);
          size += b.length;
          onStored?.(size, layout.payloadSize);
        }
      },
      layout.fileSize,
    );
  }
  return { sha256: h.digest("hex"), size, head };
}

export interface ReadPayloadOptions {
  signal?: AbortSignal;
  onStored?: (storedBytes: number, storedTotal: number) => void;
  /** Each entry once its bytes have passed the handler and been hashed. */
  onEntry?: (e: PayloadEntry) => void;
  /**
   * Compare the index with the entries as it streams (./index-stream.ts) instead of parsing it
   * whole: the result's `index` is then null and `indexCheck` holds the comparison, which
   * {@link compareWithIndex} reports. For verify and restore, which need nothing else of it.
   */
  streamIndex?: boolean;
  /** The table to record the entries in (a caller that looks entries up while the payload streams passes its own). */
  entries?: EntryTable;
  /**
   * With `streamIndex`, for a manifest_version 2 bundle: each index artifact that references a
   * base (`ref`), whose bytes are not in this payload (see read/bases.ts).
   */
  onRef?: (a: IndexEntry) => void;
  /** With `streamIndex`: each index artifact whose entry matched it (size and SHA-256). */
  onMatch?: (a: IndexEntry) => void;
  /**
   * Do not hash the stored bytes when the payload is age-encrypted (a plaintext payload is
   * always hashed); their size is still compared with the manifest's. For a keyed restore
   * (./extract.ts), where the hash proves nothing the other checks do not:
   * - every 64 KiB STREAM chunk opens only under the payload key, with its tag, and in its
   *   place (the nonce is its counter), and only the final chunk carries the last-chunk flag, so
   *   the plaintext is exactly what was sealed under that key: no chunk altered, reordered,
   *   dropped, added or cut off (trailing bytes after the final chunk fail, too); the key
   *   comes from the age header, whose MAC is checked under the file key the identity unwraps;
   * - age does not authenticate the sender: anyone with the recipient's public key can write a
   *   whole new payload. That one must then hold an index member whose SHA-256 is the sealed
   *   manifest's `index_sha256` (and whose snapshot id is the manifest's), and every entry must
   *   be in that index with its size and SHA-256, none missing, none extra, none twice
   *   (compareWithIndex), before anything is published: to restore other bytes it must find
   *   SHA-256 second preimages. The manifest's seal (or signature) is checked by the caller's
   *   preflight, and `stored_size` is still compared.
   * What is lost is only a proof about the ciphertext itself: a payload encrypted again (same
   * plaintext, another file key) without its manifest updated restores, and keyless verify,
   * which reads the stored bytes only, still reports it (MEMSNAP_PAYLOAD_HASH_MISMATCH).
   * Measured: see docs/BENCHMARK.md ("keyed restore without the stored-byte hash").
   */
  skipStoredHash?: boolean;
}

/**
 * Stream the payload through decryption, decompression and tar parsing, calling `handler`
 * for every artifact entry. Entry names are checked by the caller's handler (restore) or
 * reported here as findings (verify). Throws the first fatal stream error (decrypt, corrupt
 * zstd/tar, or the handler's own error) as a MemsnapError.
 */
/**
 * The decoder's batches, op by op (see TarScanner): an entry's head, its byte ranges as
 * buffers, its digest. Sync where the current batch has the next op; the worker's framing
 * guarantees the order (start, data*, end), which is checked here too.
 */
class OpReader {
  readonly #it: AsyncIterator<ScannedBatch>;
  #buf: Buffer = Buffer.alloc(0);
  #release: (() => void) | null = null;
  #ops: (number | string)[] = [];
  #i = 0;
  #digest: string | null = null;

  constructor(decoder: PayloadDecoder) {
    this.#it = (decoder as AsyncIterable<ScannedBatch>)[Symbol.asyncIterator]();
  }

  /** Refill from the next batch: false at the end of the payload. */
  async #fill(): Promise<boolean> {
    while (this.#i >= this.#ops.length) {
      // The batch's last chunk was handed out and its handler asks for more: the slot goes back.
      this.close();
      const r = await this.#it.next();
      if (r.done) return false;
      if ("err" in r.value) throw r.value.err;
      this.#buf = r.value.buf;
      this.#release = r.value.release;
      this.#ops = r.value.ops;
      this.#i = 0;
    }
    return true;
  }

  /** Give the current batch's slot back (at the end, or when reading stops). */
  close(): void {
    this.#release?.();
    this.#release = null;
    this.#buf = EMPTY;
  }

  #broken(what: string): never {
    throw new MemsnapError("MEMSNAP_INTERNAL", `payload framing out of order: ${what}`);
  }

  /** The next entry's head, or null at the end of the payload. */
  async start(): Promise<{ name: string; size: number; type: string; hashed: boolean } | null> {
    if (!(await this.#fill())) return null;
    const o = this.#ops;
    if (o[this.#i] !== OP_START) this.#broken(`op ${String(o[this.#i])} where an entry starts`);
    const head = {
      name: o[this.#i + 1] as string,
      size: o[this.#i + 2] as number,
      type: o[this.#i + 3] as string,
      hashed: o[this.#i + 4] === 1,
    };
    this.#i += 5;
    this.#digest = null;
    return head;
  }

  /** The entry's next bytes if the current batch has them; null at its end (see digest); undefined: call dataAsync. */
  data(): Buffer | null | undefined {
    const o = this.#ops;
    const i = this.#i;
    if (i >= o.length) return undefined;
    if (o[i] === OP_DATA) {
      this.#i = i + 3;
      const off = o[i + 1] as number;
      return this.#buf.subarray(off, off + (o[i + 2] as number));
    }
    if (o[i] === OP_END) {
      this.#digest = o[i + 1] as string;
      this.#i = i + 2;
      return null;
    }
    return this.#broken(`op ${String(o[i])} inside an entry`);
  }

  async dataAsync(): Promise<Buffer | null> {
    if (!(await this.#fill()))
      throw new MemsnapError("MEMSNAP_PAYLOAD_CORRUPT", "the payload ends inside an entry", {
        hint: "the bundle is damaged; use another copy",
      });
    return this.data()!;
  }

  /** The SHA-256 (hex) of the entry that just ended. */
  digest(): string {
    return this.#digest ?? this.#broken("no digest");
  }
}

export async function readPayload(
  layout: BundleLayout,
  manifest: Manifest,
  keys: Keys,
  handler: EntryHandler,
  opts: ReadPayloadOptions = {},
): Promise<PayloadReadResult> {
  const { signal, onStored, onEntry } = opts;
  let age: { key: Buffer; offset: number } | null = null;
  if (manifest.payload.encryption) {
    const prefix = await readRange(
      layout.path,
      layout.payloadOffset,
      Math.min(layout.payloadSize, AGE_PREFIX_MAX),
      layout.fileSize,
    );
    age = await openAgePrefix(prefix, prefix.length === layout.payloadSize, keys);
  }
  // The manifest declares the tar size: past it the payload is a bomb (the scanner stops
  // there, MEMSNAP_UNSAFE_BUNDLE). The decoder's own hard stop sits a margin above.
  const decoder = new PayloadDecoder({
    path: layout.path,
    offset: layout.payloadOffset,
    size: layout.payloadSize,
    fileSize: layout.fileSize,
    age,
    maxOutputBytes: manifest.payload.tar_size + BOMB_MARGIN,
    ...(onStored ? { onStored } : {}),
    hashStored: !(opts.skipStoredHash && age !== null),
    scan: { tarSize: manifest.payload.tar_size },
  });
  const interrupted = (): MemsnapError =>
    new MemsnapError("MEMSNAP_INTERRUPTED", "reading the payload was interrupted", { hint: "nothing was restored" });
  const onAbort = (): void => {
    decoder.destroy(interrupted());
  };
  if (signal?.aborted) onAbort();
  signal?.addEventListener("abort", onAbort, { once: true });
  const ops = new OpReader(decoder);
  const entries = opts.entries ?? new EntryTable();
  const findings: Finding[] = [];
  let index: IndexDocument | null = null;
  let indexSha256: string | null = null;
  let indexCheck: PayloadReadResult["indexCheck"] = null;
  let sawIndex = false;
  let hashedInWorker = 0;
  let lastTurn = performance.now();
  try {
    for (;;) {
      if (signal?.aborted) throw interrupted(); // the batches already decoded are not worked through
      const head = await ops.start();
      if (head === null) break;
      const { name, size, type } = head;
      let n = 0;
      let digest: string | null = null;
      // The entry's bytes as the worker framed them; the worker hashed them too, or left that to
      // this thread (head.hashed); the digest comes after the last.
      const h = head.hashed ? null : createHash("sha256");
      if (head.hashed) hashedInWorker++;
      const next = async (): Promise<Buffer | null> => {
        let c = ops.data();
        if (c === undefined) c = await ops.dataAsync();
        if (c === null) digest = h === null ? ops.digest() : (ops.digest(), h.digest("hex"));
        else {
          n += c.length;
          h?.update(c);
        }
        return c;
      };
      const chunks = (async function* () {
        while (digest === null) {
          const c = await next();
          if (c !== null) yield c;
        }
      })();
      /** Whatever of the entry the handler left (it may have stopped early): hashed and counted, not kept. */
      const drain = async (): Promise<string> => {
        while (digest === null) await next();
        return digest;
      };
      if (sawIndex) {
        findings.push({
          code: "MEMSNAP_INDEX_MISMATCH",
          message: `entry ${name} follows the index, which must be last`,
          path: name,
        });
      }
      if (name === INDEX_PATH && opts.streamIndex) {
        sawIndex = true;
        const cmp = new IndexComparer(
          entries,
          manifest.manifest_version >= 2 ? (opts.onRef ?? (() => undefined)) : undefined,
          opts.onMatch,
          manifest.manifest_version >= 4,
        );
        for await (const c of chunks) {
          if (n > INDEX_MAX_BYTES)
            throw new MemsnapError("MEMSNAP_BUNDLE_MALFORMED", "the payload index is over its size cap");
          cmp.push(c);
        }
        indexSha256 = await drain();
        const r = cmp.end();
        if ("error" in r)
          findings.push({
            code: "MEMSNAP_INDEX_MISMATCH",
            message: `the payload index does not parse: ${r.error}`,
            path: INDEX_PATH,
          });
        else if (r.tail.format !== "memsnap-index")
          findings.push({
            code: "MEMSNAP_INDEX_MISMATCH",
            message: "the payload index does not parse: not an index document",
            path: INDEX_PATH,
          });
        else indexCheck = { snapshotId: r.tail.snapshot_id, findings: r.findings };
        continue;
      }
      if (name === INDEX_PATH) {
        sawIndex = true;
        const parts: Buffer[] = [];
        for await (const c of chunks) {
          if (n > INDEX_MAX_BYTES)
            throw new MemsnapError("MEMSNAP_BUNDLE_MALFORMED", "the payload index is over its size cap");
          parts.push(Buffer.from(c)); // a copy: the chunk's slot is reused once the next is read
        }
        const bytes = Buffer.concat(parts);
        indexSha256 = await drain();
        try {
          const doc = JSON.parse(bytes.toString("utf8")) as IndexDocument;
          if (doc.format !== "memsnap-index" || !Array.isArray(doc.artifacts)) throw new Error("not an index document");
          // Its readers (a dry run's plan, diff) use the paths as they are: each is checked first.
          for (const a of doc.artifacts) {
            const problem = artifactProblem(a, true);
            if (problem?.unsafe) {
              throw new MemsnapError("MEMSNAP_UNSAFE_PATH", `the payload index: ${problem.message}`, {
                path: INDEX_PATH,
                hint: "this bundle was not written by memsnap or was tampered with; do not restore it",
              });
            }
            if (problem) throw new Error(problem.message);
            const why = isChunkedIn(manifest, a) ? chunkedProblem(a as unknown as Record<string, unknown>) : null;
            if (why !== null) throw new Error(`artifact ${JSON.stringify(a.path.slice(0, 200))}: ${why}`);
          }
          index = doc;
        } catch (e) {
          if (e instanceof MemsnapError) throw e;
          findings.push({
            code: "MEMSNAP_INDEX_MISMATCH",
            message: `the payload index does not parse: ${(e as Error).message}`,
            path: INDEX_PATH,
          });
        }
        continue;
      }
      const slash = name.indexOf("/");
      const info: EntryInfo = {
        name,
        size,
        layer: slash > 0 ? name.slice(0, slash) : "",
        rel: slash > 0 ? name.slice(slash + 1) : name,
      };
      if (type !== "file") {
        throw new MemsnapError(
          "MEMSNAP_UNSAFE_PATH",
          `payload entry ${name} is a ${type} entry; only regular files are allowed`,
          {
            path: name,
            hint: "this bundle was not written by memsnap or was tampered with; do not restore it",
          },
        );
      }
      await handler(info, chunks);
      const hex = await drain();
      collectEntries();
      if (performance.now() - lastTurn > TURN_MS) {
        // Entries already decoded can follow one another as promise continuations for seconds;
        // let the event loop turn (timers, the progress display, SIGINT) between them.
        await new Promise<void>((r) => setImmediate(r));
        lastTurn = performance.now();
      }
      entries.add(name, n, Buffer.from(hex, "hex"));
      onEntry?.({ name, size: n, sha256: hex });
    }
  } catch (e) {
    ops.close();
    decoder.destroy();
    // Interrupted: a write or decode that failed on the way out failed because of it.
    if (signal?.aborted && !(e instanceof MemsnapError && e.code === "MEMSNAP_INTERRUPTED")) throw interrupted();
    if (e instanceof MemsnapError) throw e;
    throw new MemsnapError("MEMSNAP_PAYLOAD_CORRUPT", `the payload could not be read: ${(e as Error).message}`, {
      cause: e,
      hint: "the bundle is damaged; use another copy",
    });
  } finally {
    signal?.removeEventListener("abort", onAbort);
  }
  ops.close();
  if (!sawIndex)
    findings.push({ code: "MEMSNAP_INDEX_MISMATCH", message: "the payload has no index member", path: INDEX_PATH });
  const stored = await decoder.stored;
  return {
    storedSha256: stored.sha256,
    storedSize: stored.size,
    entries,
    index,
    indexSha256,
    indexCheck,
    findings,
    hashedInWorker,
  };
}

/**
 * Compare what the payload held with the index and the manifest: the index hash bound to
 * the manifest, the index bound to this snapshot, every artifact present once with its
 * size and SHA-256, nothing extra. Returns every finding.
 */
export function compareWithIndex(manifest: Manifest, r: PayloadReadResult): Finding[] {
  const findings: Finding[] = [...r.findings];
  // (storedSha256 null: an age payload read without it, see ReadPayloadOptions.skipStoredHash)
  const hashBad = r.storedSha256 !== null && r.storedSha256 !== manifest.payload.sha256;
  if (hashBad || r.storedSize !== manifest.payload.stored_size) {
    findings.push({
      code: "MEMSNAP_PAYLOAD_HASH_MISMATCH",
      message: "the payload bytes do not match the manifest's SHA-256/size",
    });
  }
  const index = r.index;
  if (!index && !r.indexCheck) return findings;
  if (r.indexSha256 !== manifest.payload.index_sha256) {
    findings.push({
      code: "MEMSNAP_INDEX_MISMATCH",
      message: "the payload index is not the one the manifest is bound to",
      path: INDEX_PATH,
    });
  }
  const snapshotId = index ? index.snapshot_id : r.indexCheck!.snapshotId;
  if (snapshotId !== manifest.snapshot_id) {
    // (not String(): the id is the bundle's, and an array nested 200,000 deep overflows its join)
    const named =
      typeof snapshotId === "string"
        ? snapshotId.slice(0, 64)
        : `of type ${Array.isArray(snapshotId) ? "array" : typeof snapshotId}`;
    findings.push({
      code: "MEMSNAP_INDEX_MISMATCH",
      message: `the payload index belongs to snapshot ${named}`,
      path: INDEX_PATH,
    });
  }
  // The manifest's own copy (plaintext bundles) must be the same document: same canonical bytes.
  if (
    manifest.index &&
    (index
      ? encodeIndex({ format: "memsnap-index", snapshot_id: manifest.snapshot_id, artifacts: manifest.index }).compare(
          encodeIndex(index),
        ) !== 0
      : indexHash({ format: "memsnap-index", snapshot_id: manifest.snapshot_id, artifacts: manifest.index }) !==
        r.indexSha256)
  ) {
    findings.push({
      code: "MEMSNAP_INDEX_MISMATCH",
      message: "the manifest's index differs from the payload's index",
      path: INDEX_PATH,
    });
  }
  if (!index) return [...findings, ...r.indexCheck!.findings];
  const want = new Map<string, { size: number; sha256: string }>();
  const refs = new Set<string>();
  for (const a of index.artifacts) {
    if (want.has(a.path) || refs.has(a.path))
      findings.push({ code: "MEMSNAP_INDEX_MISMATCH", message: `the index lists ${a.path} twice`, path: a.path });
    if (refOf(manifest, a) !== undefined && !isChunkedIn(manifest, a))
      refs.add(a.path); // its bytes are in a base's payload
    else want.set(a.path, storedOf(manifest, a)); // (a chunked entry's payload entry holds its stored ranges)
  }
  const seen = new Set<string>();
  for (let i = 0; i < r.entries.length; i++) {
    const e = { name: r.entries.name(i), size: r.entries.size(i), sha256: r.entries.sha256(i) };
    if (seen.has(e.name)) {
      findings.push({ code: "MEMSNAP_INDEX_MISMATCH", message: `duplicate payload entry ${e.name}`, path: e.name });
      continue;
    }
    seen.add(e.name);
    const w = want.get(e.name);
    if (!w && refs.has(e.name)) {
      findings.push({
        code: "MEMSNAP_INDEX_MISMATCH",
        message: `${e.name} is both in the payload and a reference to a base`,
        path: e.name,
      });
    } else if (!w) {
      findings.push({
        code: "MEMSNAP_INDEX_MISMATCH",
        message: `payload entry ${e.name} is not in the index`,
        path: e.name,
      });
    } else if (w.size !== e.size || w.sha256 !== e.sha256) {
      findings.push({
        code: "MEMSNAP_ARTIFACT_HASH_MISMATCH",
        message:
          w.size !== e.size
            ? `${e.name}: ${e.size} bytes, index says ${w.size}`
            : `${e.name}: SHA-256 differs from the index`,
        path: e.name,
      });
    }
  }
  for (const p of want.keys()) {
    if (!seen.has(p))
      findings.push({
        code: "MEMSNAP_INDEX_MISMATCH",
        message: `indexed artifact ${p} is missing from the payload`,
        path: p,
      });
  }
  return findings;
}

/** A Writable that discards everything (for draining). */
export function devNull(): Writable {
  return new Writable({ write: (_c, _e, cb) => cb() });
}
