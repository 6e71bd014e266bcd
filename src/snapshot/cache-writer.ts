/**
 * The writing half of the incremental cache (./incremental.ts describes its format): the lines
 * go to a temp file beside the cache as artifacts pack, chunk tables to a temp table file, and
 * both are put in place only once the bundle is committed; dropped otherwise.
 */
import { createHash } from "node:crypto";
import { mkdir, open, readdir, rename, rm, type FileHandle } from "node:fs/promises";
import { basename, dirname, join } from "node:path";
import type { IndexEntry } from "../format/manifest.js";
import type { RuleCounts } from "../redact/types.js";
import { kvPageFingerprint } from "../sources/types.js";
import { pidAlive } from "../agent/orphans.js";
import type { ChunkRecord } from "./chunking.js";
import { FORMAT, tableFile, VERSION, type IncrementalKey } from "./incremental.js";

/**
 * Writes the cache of a snapshot as its artifacts pack (to a temp file beside the cache), then
 * puts it in place once the bundle is committed; dropped otherwise.
 */
export class CacheWriter {
  readonly #tmp: string;
  readonly #tablesTmp: string;
  #fh: Awaited<ReturnType<typeof open>> | null = null;
  #tables: FileHandle | null = null;
  #tableSize = 0;
  #lines: string[] = [];
  #pending = 0;
  #flushing: Promise<void> = Promise.resolve();

  /** `id`: the snapshot whose cache this is (it names the table file). */
  constructor(
    readonly file: string,
    readonly id: string,
  ) {
    this.#tmp = `${file}.tmp-${process.pid}`;
    this.#tablesTmp = `${tableFile(file, id)}.tmp-${process.pid}`;
  }

  async start(): Promise<void> {
    const dir = dirname(this.file);
    await mkdir(dir, { recursive: true, mode: 0o700 });
    // A snapshot killed before its commit left its temp files: remove those of dead processes.
    const stem = basename(this.file);
    for (const n of await readdir(dir).catch(() => [] as string[])) {
      const m = n.startsWith(stem) ? /\.(?:tmp|new)-(\d+)$/.exec(n) : null;
      if (m && !pidAlive(Number(m[1]))) await rm(join(dir, n), { force: true });
    }
    this.#fh = await open(this.#tmp, "w", 0o600);
    this.#tables = await open(this.#tablesTmp, "w", 0o600);
  }

  /**
   * Record one artifact: packed here (`base` = this snapshot) or referenced; with `chunk`, a
   * chunkable one's record and table (this snapshot is then `base` unless the whole artifact was
   * referenced).
   */
  add(
    e: IndexEntry,
    fingerprint: string | undefined,
    holder: string,
    chunk?: { rec: ChunkRecord; table: Buffer | null },
  ): void {
    // never referenced
    if ((fingerprint === undefined && !chunk) || /[\t\n]/.test(fingerprint ?? "") || /[\t\n]/.test(e.kind)) return;
    const fp = fingerprint === undefined ? "-" : fingerprint === kvPageFingerprint(e.sha256, e.size) ? "" : fingerprint;
    let rec = "";
    if (chunk) {
      const r: ChunkRecord = { ...chunk.rec };
      delete r.t;
      if (chunk.table) {
        const t = chunk.table;
        r.t = [this.#tableSize, t.length, createHash("sha256").update(t).digest("hex").slice(0, 32)];
        const at = this.#tableSize;
        this.#tableSize += t.length;
        const fh = this.#tables!;
        this.#flushing = this.#flushing.then(async () => {
          await fh.write(t, 0, t.length, at);
        });
      }
      rec = `\t${JSON.stringify(r)}`;
    }
    this.#lines.push(`${JSON.stringify(e.path)}\t${e.kind}\t${e.size}\t${e.sha256}\t${holder}\t${fp}${rec}`);
    this.#pending += this.#lines[this.#lines.length - 1]!.length;
    if (this.#pending >= 1 << 18) this.#flush();
  }

  #flush(): void {
    const text = this.#lines.join("\n") + "\n";
    this.#lines = [];
    this.#pending = 0;
    const fh = this.#fh!;
    this.#flushing = this.#flushing.then(async () => {
      await fh.write(text);
    });
  }

  /**
   * Write the header (known only at the end: the bundles that hold the bytes, with their seals,
   * and the redaction report's counts per artifact, values replaced and secrets left as they
   * were) and put the cache in place.
   */
  async commit(
    snapshotId: string,
    key: IncrementalKey,
    bundles: Record<string, string>,
    redacted: Record<string, RuleCounts>,
    unredacted: Record<string, RuleCounts>,
  ): Promise<void> {
    if (this.#lines.length) this.#flush();
    await this.#flushing;
    const body = this.#fh!;
    await body.close();
    this.#fh = null;
    // The table file first, under the name the new cache's header implies.
    await this.#tables!.sync();
    await this.#tables!.close();
    this.#tables = null;
    await rename(this.#tablesTmp, tableFile(this.file, this.id));
    const header =
      JSON.stringify({
        format: FORMAT,
        version: VERSION,
        snapshot_id: snapshotId,
        ...key,
        bundles,
        redacted,
        unredacted,
      }) + "\n";
    const out = await open(`${this.file}.new-${process.pid}`, "w", 0o600);
    try {
      await out.write(header);
      const src = await open(this.#tmp, "r");
      try {
        const buf = Buffer.allocUnsafe(1 << 20);
        for (;;) {
          const { bytesRead } = await src.read(buf, 0, buf.length, null);
          if (!bytesRead) break;
          await out.write(buf.subarray(0, bytesRead));
        }
      } finally {
        await src.close();
      }
      await out.sync();
    } finally {
      await out.close();
    }
    await rename(`${this.file}.new-${process.pid}`, this.file);
    await rm(this.#tmp, { force: true });
    // The table files of earlier caches are read by no cache now.
    const dir = dirname(this.file);
    const stem = `${basename(this.file)}.`;
    const mine = basename(tableFile(this.file, this.id));
    for (const n of await readdir(dir).catch(() => [] as string[])) {
      if (n.startsWith(stem) && n.endsWith(".chunks") && n !== mine) await rm(join(dir, n), { force: true });
    }
  }

  async abort(): Promise<void> {
    await this.#flushing.catch(() => undefined);
    await this.#fh?.close().catch(() => undefined);
    await this.#tables?.close().catch(() => undefined);
    await rm(this.#tmp, { force: true });
    await rm(this.#tablesTmp, { force: true });
    await rm(`${this.file}.new-${process.pid}`, { force: true });
  }
}
