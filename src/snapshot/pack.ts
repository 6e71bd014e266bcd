/**
 * Packing: one layer's artifacts into the payload's tar, each hashed as its bytes stream into
 * its entry (so the index's hash is over exactly the bytes stored), with text artifacts redacted
 * a few ahead and, in an incremental snapshot, unchanged ones referenced or chunked instead of
 * stored. Split from ./snapshot.ts, which runs the layers through here in config order.
 */
import { createHash } from "node:crypto";
import { performance } from "node:perf_hooks";
import { MemsnapError, sourceChanged } from "../errors.js";
import { BLOCK, encodeEntryHeader, padding } from "../format/tar-header.js";
import type { IndexEntry, LayerEntry } from "../format/manifest.js";
import type { Redactor } from "../redact/types.js";
import type { Artifact, LayerCapture } from "../sources/types.js";
import { crashPoint } from "../util/crash-point.js";
import { gcPacer, heapPacer } from "../util/gc.js";
import type { PayloadEncoder } from "./encoder.js";
import type { Reference, ReferenceSet } from "./incremental.js";
import { packChunked, packWhole, wholeReason, type ChunkRecord } from "./chunking.js";
import type { LevelPolicy } from "./levels.js";
import { PLANE_LEVEL } from "../codecs/zstd-profile.js";
import { PLANES_MAX_BYTES, shuffleInto } from "../util/planes.js";

const REDACT_LOOKAHEAD = 2;

/** Yield `prepare(x)` for each item in order, with up to `depth` preparations started ahead. */
async function* lookahead<T, U>(
  items: AsyncIterable<T>,
  prepare: (x: T) => Promise<U>,
  depth: number,
): AsyncGenerator<U> {
  const queue: Promise<U>[] = [];
  const it = items[Symbol.asyncIterator]();
  let done = false;
  try {
    for (;;) {
      while (!done && queue.length <= depth) {
        const n = await it.next();
        if (n.done) done = true;
        else queue.push(prepare(n.value));
      }
      const next = queue.shift();
      if (!next) return;
      yield await next;
    }
  } finally {
    if (!done) await it.return?.();
  }
}

/** Two zero blocks: tar padding is a prefix of them, and together they end the archive. */
export const ZEROS = Buffer.alloc(2 * BLOCK);

/**
 * Source chunks are fresh Buffers (file reads of up to 1 MiB, KV read blocks of 4 MiB) that are
 * garbage once copied into the payload worker's buffers, but V8 frees their external memory
 * only when a scavenge happens to run. A minor GC every 16 MiB packed keeps them
 * from piling up (measured: the KV layer of the bench mix peaked at 235 MiB RSS without it).
 */
const collectPacked = gcPacer(16 * 1024 * 1024, "minor");
/** Old-generation garbage of many small artifacts (KV pages) is collected every 16 MiB of it (see heapPacer). */
const collectArtifacts = heapPacer(16 * 1024 * 1024);

/** The packer's buffers for a page stored as planes: the page gathered, then its planes (reused page after page). */
let gathered: Buffer = Buffer.alloc(0);
let planesBuf = Buffer.alloc(0);
/** Buffers up to this size are kept for the next page. */
const PLANES_KEEP_BYTES = 4 * 1024 * 1024;

/** Artifact `a`'s bytes as their byte planes, in one chunk (valid until the next call). */
export async function* planesOf(name: string, a: Artifact, elem: number): AsyncGenerator<Buffer> {
  if (a.size > PLANES_MAX_BYTES) {
    throw new MemsnapError("MEMSNAP_INTERNAL", `${name}: ${a.size} bytes to shuffle, over ${PLANES_MAX_BYTES}`);
  }
  const keep = a.size <= PLANES_KEEP_BYTES;
  const dst = keep && planesBuf.length >= a.size ? planesBuf : Buffer.allocUnsafeSlow(a.size);
  if (keep) planesBuf = dst;
  const out = dst.subarray(0, a.size);
  let src: Buffer | null = null; // the chunks gathered, unless the first is the whole artifact
  let shuffled = false;
  let n = 0;
  for await (const c of a.open({ reuse: true })) {
    const b = c as Buffer;
    if (n + b.length > a.size) throw sourceChanged(name, `grew past its declared ${a.size} bytes`);
    if (n === 0 && b.length === a.size) {
      // the whole artifact in one chunk (a KV page is): shuffled from where it lies, before the
      // reader is asked for more (it may reuse its buffer), instead of gathered first
      shuffleInto(out, b, elem);
      shuffled = true;
      n = b.length;
      continue;
    }
    if (src === null) {
      src = keep && gathered.length >= a.size ? gathered : Buffer.allocUnsafeSlow(a.size);
      if (keep) gathered = src;
    }
    b.copy(src, n);
    n += b.length;
  }
  if (n !== a.size) throw sourceChanged(name, `shrank from ${a.size} to ${n} bytes`);
  if (!shuffled && src !== null) shuffleInto(out, src.subarray(0, n), elem);
  yield out;
}

async function packArtifact(
  enc: PayloadEncoder,
  levels: LevelPolicy,
  layer: string,
  a: Artifact,
  onBytes: (n: number) => void,
): Promise<IndexEntry> {
  const name = `${layer}/${a.path}`;
  const known = a.text ? undefined : a.sha256;
  const hash = known === undefined ? createHash("sha256") : null;
  let seen = 0;
  let started = false;
  // Byte planes: a frame each, cut where each plane ends (the header rides with the first).
  const sh = a.shuffle && a.shuffle.elem > 1 && a.size % a.shuffle.elem === 0 ? a.shuffle : null;
  const plane = sh?.frames ? a.size / sh.elem : 0;
  const begin = async (first: Uint8Array | undefined): Promise<void> => {
    started = true;
    enc.setLevel(plane ? PLANE_LEVEL : levels.start(layer, a.size, first));
    await enc.write(encodeEntryHeader(name, a.size, a.mtime, a.mode));
  };
  for await (const c of sh ? planesOf(name, a, sh.elem) : a.open({ reuse: true })) {
    const chunk = c as Buffer;
    const at = seen;
    seen += chunk.length;
    if (seen > a.size) throw sourceChanged(name, `grew past its declared ${a.size} bytes`);
    if (!started) await begin(chunk);
    if (!plane) enc.setLevel(levels.next(chunk));
    hash?.update(chunk);
    onBytes(chunk.length);
    collectPacked(chunk.length);
    if (plane) {
      // Write up to each plane's end, then cut.
      for (let off = 0; off < chunk.length;) {
        const end = Math.min(chunk.length, (Math.floor((at + off) / plane) + 1) * plane - at);
        const w = enc.write(chunk.subarray(off, end));
        if (w) await w;
        off = end;
        if ((at + off) % plane === 0) enc.cut();
      }
      continue;
    }
    const w = enc.write(chunk);
    if (w) await w;
  }
  if (!started) await begin(undefined);
  if (seen !== a.size) throw sourceChanged(name, `shrank from ${a.size} to ${seen} bytes`);
  const pad = padding(a.size);
  if (pad) await enc.write(ZEROS.subarray(0, pad));
  await a.check?.();
  const sha256 = hash ? hash.digest("hex") : known!;
  if (a.expectSha256 !== undefined && a.expectSha256 !== sha256) {
    throw sourceChanged(name, "its bytes changed between the redaction scan and packing (same size and mtime)");
  }
  return {
    path: name,
    layer,
    kind: a.kind,
    size: a.size,
    sha256,
    mode: a.mode,
    mtime: a.mtime.toISOString(),
  };
}

/** What packLayer needs to chunk an artifact (an incremental snapshot): this snapshot's id and a scratch directory. */
export interface Chunking {
  self: string;
  workDir: string;
}

/** What an artifact packed as leaves for the incremental cache: a chunkable one's record and table. */
export type PackedChunk = { rec: ChunkRecord; table: Buffer | null };

/**
 * Pack one layer's artifacts in order; with a redactor, text artifacts are redacted up to
 * {@link REDACT_LOOKAHEAD} ahead of the one packing (main-thread work that fills the time the
 * main thread would otherwise wait on the compressor). Returns the wall time spent redacting.
 *
 * A function of its own, not a loop inside snapshot(): V8 optimizes a function whose loop
 * runs hot while it is on the stack (on-stack replacement), and compiling all of snapshot() that
 * way took ~170 ms of a core per run (--trace-opt) for code that mostly awaits.
 */
export async function packLayer(
  enc: PayloadEncoder,
  levels: LevelPolicy,
  layer: LayerEntry,
  cap: LayerCapture,
  independent: boolean,
  distinctPaths: boolean,
  redactor: Redactor | undefined,
  signal: AbortSignal | undefined,
  onBytes: (n: number) => void,
  onPacked: (e: IndexEntry, fingerprint: string | undefined, chunk?: PackedChunk) => void,
  refs: ReferenceSet | null,
  chunking: Chunking | null,
): Promise<number> {
  let redactMs = 0;
  const seen = distinctPaths ? null : new Set<string>();
  /** Artifacts an incremental snapshot references: not read, not redacted again. */
  const referenced = new WeakMap<Artifact, Reference>();
  const prepare = (raw: Artifact): Promise<Artifact> => {
    const ref = refs?.match(`${layer.name}/${raw.path}`, raw);
    if (ref) {
      referenced.set(raw, ref);
      return Promise.resolve(raw);
    }
    if (!redactor || !raw.text) return Promise.resolve(raw);
    const r0 = performance.now();
    const p = redactor
      .redactArtifact(raw, `${layer.name}/${raw.path}`)
      .then((out) => {
        // The redacted bytes are a function of the source's: the next incremental snapshot may reference them.
        if (raw.fingerprint !== undefined) out.fingerprint = raw.fingerprint;
        if (raw.chunking !== undefined) out.chunking = raw.chunking;
        return out;
      })
      .finally(() => {
        redactMs += performance.now() - r0;
      });
    p.catch(() => undefined); // awaited in order below
    return p;
  };
  for await (const a of lookahead(cap.artifacts, prepare, independent ? REDACT_LOOKAHEAD : 0)) {
    signal?.throwIfAborted();
    if (seen?.has(a.path)) throw new MemsnapError("MEMSNAP_INTERNAL", `source ${layer.name} yielded ${a.path} twice`);
    seen?.add(a.path);
    const ref = referenced.get(a);
    if (ref) {
      const name = `${layer.name}/${a.path}`;
      if (ref.redacted) redactor?.recordReused?.(name, ref.redacted);
      // Secrets found in the referenced bytes and left there (a git bundle's history) count as
      // this snapshot's too: a plaintext bundle is still refused for them.
      if (ref.unredacted) redactor?.recordReused?.(name, ref.unredacted, false);
      const base = {
        path: name,
        layer: layer.name,
        kind: a.kind,
        size: ref.size,
        sha256: ref.sha256,
        mode: a.mode,
        mtime: a.mtime.toISOString(),
      };
      const chunk = ref.chunk ? { rec: ref.chunk.rec, table: await ref.chunk.table() } : undefined;
      if (ref.ranges) {
        // Chunked last time and unchanged: the same ranges, with an empty payload entry (no bytes stored).
        const empty = await packArtifact(
          enc,
          levels,
          layer.name,
          { path: a.path, kind: a.kind, size: 0, mode: a.mode, mtime: a.mtime, open: () => [] },
          onBytes,
        );
        onPacked({ ...base, ranges: ref.ranges, stored_size: 0, stored_sha256: empty.sha256 }, a.fingerprint, chunk);
      } else {
        onPacked({ ...base, ref: ref.base }, a.fingerprint, chunk);
      }
      layer.artifacts++;
      layer.bytes += ref.size;
      layer.referenced = (layer.referenced ?? 0) + 1;
      collectArtifacts(); // a referenced KV page leaves as much garbage as a packed one, and comes faster
      continue;
    }
    const hint = chunking && refs ? a.chunking : undefined;
    if (hint) {
      // An incremental snapshot of a chunkable artifact: chunked against the last one's when
      // that is worth it, else packed whole, its table taken for the next (./chunking.ts).
      const name = `${layer.name}/${a.path}`;
      const pack = (x: Artifact): Promise<IndexEntry> => packArtifact(enc, levels, layer.name, x, onBytes);
      const b = await refs!.chunkBase(name, a, hint);
      const why = b ? wholeReason(b, hint, a) : "no base";
      const r =
        b && why === null
          ? await packChunked(a, hint, b, {
              name,
              layer: layer.name,
              self: chunking!.self,
              workDir: chunking!.workDir,
              pack,
              use: (ids) => refs!.use(ids),
            })
          : await packWhole(a, hint, pack, why ?? undefined);
      if (process.env.MEMSNAP_DEBUG_ENCODER)
        process.stderr.write(
          `chunking ${name}: ${
            r.entry.ranges ? `${r.entry.stored_size} of ${r.entry.size} bytes stored` : `whole (${r.whole ?? "?"})`
          }\n`,
        );
      onPacked(r.entry, a.fingerprint, { rec: r.rec, table: r.table });
      collectArtifacts();
      crashPoint("snapshot:artifact");
      layer.artifacts++;
      layer.bytes += r.entry.size;
      if (r.entry.ranges) layer.referenced = (layer.referenced ?? 0) + 1;
      continue;
    }
    const e = await packArtifact(enc, levels, layer.name, a, onBytes);
    onPacked(e, a.fingerprint);
    collectArtifacts();
    crashPoint("snapshot:artifact");
    layer.artifacts++;
    layer.bytes += e.size;
  }
  return redactMs;
}
