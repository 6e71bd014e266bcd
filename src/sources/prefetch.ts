/**
 * Small files read ahead in batches on the thread pool (the native/directio addon's readFiles),
 * for sources that pack many of them (a memory directory of notes). Each file is opened
 * relative to the source's root, read (at most its walked size + 1 bytes, so growth shows) and
 * fstat'ed after the read, as {@link fileArtifact}'s own small-file read does, but without the
 * main thread's four synchronous calls per file. Files are yielded in the walk's order; a file
 * the batch could not read (removed, replaced by a symlink, any error) comes without bytes
 * and is read again the usual way, which reports it as it always did.
 *
 * Measured on 200,000 notes of ~25 bytes (a snapshot with redaction, encrypted): see the
 * commit that added this file.
 */
import { CompactStats, nativeFs, RF } from "../util/native-fs.js";
import type { FoundFile, ReadAhead } from "./walk.js";

/** Files per batch, and the most bytes a batch may read. */
const BATCH_FILES = 256;
const BATCH_BYTES = 1 << 20;
/** Batches in flight ahead of the one being yielded. */
const AHEAD = 2;

interface Batch {
  items: { f: FoundFile; limit: number | null; pre: ReadAhead | null }[];
  read: Promise<void>;
}

/**
 * `files` (relative to `root`) in order, each with its bytes read ahead when `limit(f)` gives
 * how many to read (null: not read ahead: a big file, an append-only log, one an incremental
 * snapshot will reference). Without the addon every file comes without bytes.
 */
export async function* readAhead(
  files: AsyncIterable<FoundFile>,
  root: string,
  limit: (f: FoundFile) => number | null,
): AsyncGenerator<{ f: FoundFile; pre: ReadAhead | null }> {
  const native = Buffer.byteLength(root) < 4000 ? nativeFs() : null; // (the addon takes roots under 4 KiB)
  if (native === null) {
    for await (const f of files) yield { f, pre: null };
    return;
  }
  const it = files[Symbol.asyncIterator]();
  let done = false;
  const fill = async (): Promise<Batch | null> => {
    const items: Batch["items"] = [];
    let bytes = 0;
    let reads = 0;
    while (items.length < BATCH_FILES && bytes < BATCH_BYTES) {
      const r = await it.next();
      if (r.done) {
        done = true;
        break;
      }
      const n = limit(r.value);
      items.push({ f: r.value, limit: n, pre: null });
      if (n !== null) {
        bytes += n;
        reads++;
      }
    }
    if (items.length === 0) return null;
    if (reads === 0) return { items, read: Promise.resolve() };
    const paths: Buffer[] = [];
    const limits = new Float64Array(reads);
    const which: number[] = [];
    items.forEach((x, i) => {
      if (x.limit === null) return;
      limits[which.length] = x.limit;
      which.push(i);
      paths.push(Buffer.from(`${x.f.rel}\0`, "utf8"));
    });
    const out = Buffer.allocUnsafe(bytes);
    const meta = new Float64Array(reads * RF.FIELDS);
    const read = new Promise<void>((res) => {
      native.readFiles(root, Buffer.concat(paths), reads, limits, out, meta, (err) => {
        if (err === 0) {
          which.forEach((i, k) => {
            const b = k * RF.FIELDS;
            if (meta[b + RF.ERR] !== 0) return; // read again the usual way, which reports it
            const at = meta[b + RF.OFF]!;
            items[i]!.pre = { bytes: out.subarray(at, at + meta[b + RF.LEN]!), stats: CompactStats.at(meta, b, RF) };
          });
        }
        res(); // the root could not be opened: every file is read the usual way
      });
    });
    return { items, read };
  };
  const pending: Batch[] = [];
  try {
    for (;;) {
      while (!done && pending.length < AHEAD + 1) {
        const b = await fill();
        if (b) pending.push(b);
      }
      const b = pending.shift();
      if (!b) return;
      await b.read;
      for (const x of b.items) yield { f: x.f, pre: x.pre };
    }
  } finally {
    // A consumer that stops early (a failed snapshot) leaves no read behind it.
    await Promise.all(pending.map((b) => b.read));
  }
}
