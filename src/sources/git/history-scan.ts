/**
 * The history scan. With redaction on, history cannot be rewritten, so every blob, commit
 * message and tag message reachable from the bundle's refs is scanned (streaming, one object in
 * memory at a time, binary blobs and blobs over 16 MiB skipped) and findings are recorded as
 * unredacted against `<layer>/repo.bundle`.
 */
import type { ChildProcessWithoutNullStreams } from "node:child_process";
import { createReadStream, createWriteStream } from "node:fs";
import { rm } from "node:fs/promises";
import { once } from "node:events";
import type { Redactor } from "../../redact/types.js";
import { sourceInvalid, spawnGit, type GitCtx, type Spawned } from "./run.js";

/** Blobs larger than this are not scanned (counted in `skipped_large`). */
export const SCAN_MAX_BYTES = 16 * 1024 * 1024;
/** A blob with a NUL byte in its first 8 KiB is binary and not scanned. */
export const BINARY_PROBE_BYTES = 8192;

/** Counts of the history scan, recorded in the layer meta. */
export interface HistoryScan {
  /** Objects reachable from the bundle's refs. */
  objects: number;
  /** Blobs, commit messages and tag messages whose text went through the redactor's pre-filter. */
  scanned: number;
  bytes: number;
  /** Texts the pre-filter passed on to the full scan. */
  candidates: number;
  skipped_binary: number;
  skipped_large: number;
}

export function emptyScan(): HistoryScan {
  return { objects: 0, scanned: 0, bytes: 0, candidates: 0, skipped_binary: 0, skipped_large: 0 };
}

/**
 * Scan one object's text for secrets: a blob's content (unless binary), or the message of a
 * commit or tag (their headers hold only oids, names and dates). Trees are not text.
 */
export async function scanObject(
  type: string,
  data: Buffer,
  redactor: Redactor,
  artifact: string,
  st: HistoryScan,
): Promise<void> {
  let text: Buffer;
  if (type === "blob") {
    if (data.subarray(0, BINARY_PROBE_BYTES).includes(0)) {
      st.skipped_binary++;
      return;
    }
    text = data;
  } else if (type === "commit" || type === "tag") {
    const i = data.indexOf("\n\n");
    if (i < 0) return;
    text = data.subarray(i + 2);
  } else {
    return;
  }
  st.scanned++;
  st.bytes += text.length;
  // A clean object (memsnap's redactor: the native pre-filter on the bytes themselves) is
  // neither decoded nor scanned in JS: the bench's memory layer has ~14 MB of history text.
  if (redactor.clean?.(text)) return;
  const s = text.toString("utf8");
  if (!redactor.candidate(s)) return;
  st.candidates++;
  await redactor.scanText(s, artifact);
}

// ------------------------------------------------------------------------------ with the git binary

const CHECK_FORMAT = "--batch-check=%(objectname) %(objecttype) %(objectsize)";

/** A whole bundle's scan: the objects its pack holds, and a file to list the ones to read in. */
export interface WholeBundle {
  packObjects: number;
  spool: string;
}

/**
 * Scan every blob, commit message and tag message reachable from `revs` (rev-list arguments:
 * tips, and `^oid` exclusions).
 *
 * For a whole bundle (`whole`: every ref, no prerequisites) the objects are first listed
 * straight from the object store, without walking history: `cat-file --batch-all-objects`
 * lists each object once. The bundle's pack holds every object reachable from the refs, all of
 * them in the store, so when the store holds exactly as many objects as the pack, the two sets
 * are the same. Then the objects to read are spooled to a file and read by one `cat-file
 * --batch` after the listing has exited: one git process at a time. On the realistic home's
 * memdir (59k objects) this took the scan's git processes from 152 MiB at once (rev-list 94,
 * both cat-files 29 each) to 20 MiB then 30, and from 0.68 to 0.45 CPU-s. A store that holds
 * more (unreachable objects, or objects of refs the bundle skipped) is scanned the other way,
 * so that nothing the bundle does not hold is reported:
 *
 *   rev-list --objects --stdin │ cat-file --batch-check │ (node: pick blobs ≤ 16 MiB, commits, tags)
 *   │ cat-file --batch │ scan
 *
 * Backpressure flows end to end, so memory holds one object (≤ 16 MiB) plus pipe buffers.
 */
export async function scanHistoryGit(
  root: string,
  g: GitCtx,
  revs: string[],
  redactor: Redactor,
  artifact: string,
  children: Set<ChildProcessWithoutNullStreams>,
  whole?: WholeBundle,
): Promise<HistoryScan> {
  if (whole) {
    const st = await scanWholeStore(root, g, whole, redactor, artifact, children);
    if (st) return st;
  }
  const st = emptyScan();
  const revList = spawnGit(root, g, ["rev-list", "--objects", "--no-object-names", "--stdin"], children);
  const check = spawnGit(root, g, ["cat-file", CHECK_FORMAT, "--buffer"], children);
  const batch = spawnGit(root, g, ["cat-file", "--batch", "--buffer"], children);
  const all = [revList, check, batch];
  revList.child.stdin.end(`${[...new Set(revs)].join("\n")}\n`);
  revList.child.stdout.pipe(check.child.stdin);
  const stdin = batch.child.stdin;
  const feeder = async (): Promise<void> => {
    for await (const out of picked(root, check, st)) if (!stdin.write(out)) await writable(stdin);
    stdin.end();
  };
  try {
    await Promise.all([feeder(), readBatch(root, batch, redactor, artifact, st), ...all.map((s) => s.done)]);
  } catch (e) {
    for (const s of all) s.child.kill("SIGKILL");
    throw e;
  }
  return st;
}

/** The whole-store scan of {@link scanHistoryGit}; null when the store holds other objects than the bundle. */
async function scanWholeStore(
  root: string,
  g: GitCtx,
  whole: WholeBundle,
  redactor: Redactor,
  artifact: string,
  children: Set<ChildProcessWithoutNullStreams>,
): Promise<HistoryScan | null> {
  const st = emptyScan();
  const list = spawnGit(root, g, ["cat-file", "--batch-all-objects", "--unordered", CHECK_FORMAT], children);
  const spool = createWriteStream(whole.spool, { flags: "wx", mode: 0o600 });
  const spoolError = once(spool, "error").then(([e]) => Promise.reject(e as Error));
  spoolError.catch(() => undefined);
  try {
    try {
      const writing = (async (): Promise<void> => {
        for await (const out of picked(root, list, st)) if (!spool.write(out)) await once(spool, "drain");
        spool.end();
        await once(spool, "finish");
      })();
      await Promise.race([Promise.all([writing, list.done]), spoolError]);
    } catch (e) {
      list.child.kill("SIGKILL");
      spool.destroy();
      throw e;
    }
    if (st.objects !== whole.packObjects) return null;
    const batch = spawnGit(root, g, ["cat-file", "--batch", "--buffer"], children);
    const feed = createReadStream(whole.spool);
    feed.on("error", (e) => batch.child.stdin.destroy(e));
    feed.pipe(batch.child.stdin);
    try {
      await Promise.all([readBatch(root, batch, redactor, artifact, st), batch.done]);
    } catch (e) {
      batch.child.kill("SIGKILL");
      feed.destroy();
      throw e;
    }
    return st;
  } finally {
    await rm(whole.spool, { force: true });
  }
}

/** Resolves when `stdin` can take more (or has closed). */
function writable(stdin: NodeJS.WritableStream): Promise<void> {
  return new Promise((res) => {
    const done = (): void => {
      stdin.off("drain", done);
      stdin.off("close", done);
      res();
    };
    stdin.on("drain", done);
    stdin.on("close", done);
  });
}

/**
 * The `--batch-check` lines of `check`, counted into `st`: the oids of the objects to read
 * (blobs up to {@link SCAN_MAX_BYTES}, commits, tags), one batch of lines per chunk.
 */
async function* picked(root: string, check: Spawned, st: HistoryScan): AsyncGenerator<string> {
  let rest = "";
  for await (const chunk of check.child.stdout as AsyncIterable<Buffer>) {
    const lines = (rest + chunk.toString("latin1")).split("\n");
    rest = lines.pop() ?? "";
    let out = "";
    for (const line of lines) {
      const [oid, type, size] = line.split(" ");
      if (type === "missing") {
        throw sourceInvalid(root, `git object ${oid} is missing from ${root} (the repository is damaged)`);
      }
      st.objects++;
      if (type === "blob") {
        if (Number(size) > SCAN_MAX_BYTES) {
          st.skipped_large++;
          continue;
        }
      } else if (type !== "commit" && type !== "tag") {
        continue;
      }
      out += `${oid}\n`;
    }
    if (out) yield out;
  }
}

/** Read the objects `cat-file --batch` prints and scan each ({@link scanObject}). */
async function readBatch(
  root: string,
  batch: Spawned,
  redactor: Redactor,
  artifact: string,
  st: HistoryScan,
): Promise<void> {
  let buf: Buffer = Buffer.alloc(0);
  let need = -1; // bytes of the current object's content + its trailing LF still to read
  let type = "";
  let parts: Buffer[] = [];
  for await (const chunk of batch.child.stdout as AsyncIterable<Buffer>) {
    buf = buf.length ? Buffer.concat([buf, chunk]) : chunk;
    for (;;) {
      if (need < 0) {
        const nl = buf.indexOf(10);
        if (nl < 0) break;
        const header = buf.toString("latin1", 0, nl).split(" ");
        buf = buf.subarray(nl + 1);
        if (header[1] === "missing" || header.length !== 3) {
          throw sourceInvalid(root, `git object ${header[0]} is missing from ${root} (the repository is damaged)`);
        }
        type = header[1]!;
        need = Number(header[2]) + 1;
        parts = [];
      }
      if (buf.length === 0) break;
      const take = Math.min(need, buf.length);
      parts.push(buf.subarray(0, take));
      buf = buf.subarray(take);
      need -= take;
      if (need > 0) break;
      need = -1;
      const data = Buffer.concat(parts);
      parts = [];
      await scanObject(type, data.subarray(0, data.length - 1), redactor, artifact, st);
    }
  }
  if (need >= 0) throw sourceInvalid(root, `git cat-file ended in the middle of an object in ${root}`);
}
