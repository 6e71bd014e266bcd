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
 *
 * The shapes are in ./payload-types.ts, the decoder's ops are read by ./op-reader.ts, and the
 * comparison with the index is ./index-compare.ts.
 */
import { createHash } from "node:crypto";
import { Writable } from "node:stream";
import { heapPacer } from "../util/gc.js";
import { MemsnapError, type Finding } from "../errors.js";
import type { BundleLayout } from "../format/container.js";
import { withBundle } from "../format/bundle-file.js";
import { INDEX_PATH, isChunkedIn, type IndexDocument, type IndexEntry, type Manifest } from "../format/manifest.js";
import { AGE_PREFIX_MAX, openAgePrefix } from "../codecs/age/stream-open.js";
import { PayloadDecoder } from "./decoder.js";
import { EntryTable } from "./entry-table.js";
import { artifactProblem, IndexComparer } from "./index-stream.js";
import { chunkedProblem } from "../format/chunked.js";
import { OpReader } from "./op-reader.js";
import type { EntryHandler, EntryInfo, Keys, PayloadEntry, PayloadReadResult } from "./payload-types.js";

export type { EntryHandler, EntryInfo, Keys, PayloadEntry, PayloadReadResult } from "./payload-types.js";
export { compareWithIndex } from "./index-compare.js";

/** The event loop gets a turn at least this often while entries stream (ms). */
const TURN_MS = 50;
/**
 * Old-generation garbage from the entries' per-entry objects is collected once 16 MiB of it may have built up (see
 * heapPacer).
 */
const collectEntries = heapPacer(16 * 1024 * 1024);

const INDEX_MAX_BYTES = 256 * 1024 * 1024;
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

/** How {@link readPayload} reads: an abort signal, progress and entry callbacks, a streamed index check. */
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

/** A Writable that discards everything (for draining). */
export function devNull(): Writable {
  return new Writable({ write: (_c, _e, cb) => cb() });
}
