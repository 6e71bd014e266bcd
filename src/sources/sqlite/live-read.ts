/**
 * The live read: the database file itself streams while the worker holds a read transaction,
 * then quick_check and the file's size and mtime are checked (see docs/BENCHMARK.md, "SQLite
 * capture notes", for why that is sound).
 */
import { stat, type FileHandle } from "node:fs/promises";
import { MemsnapError } from "../../errors.js";
import { reusedChunks } from "../../util/reused-chunks.js";
import type { LiveBeginResult, LiveVerifyResult, SqliteWorker } from "./worker-host.js";
import type { Artifact, OpenOptions } from "../types.js";
import { fingerprintOf, sourceChanged, sourceError, type FoundFile } from "../walk.js";
import type { SqliteDbMeta } from "./meta.js";
import { DAMAGED_HINT } from "./errors.js";
import { ftsContentOption } from "./redact-copy.js";

/** The artifact of a live read: the database file's bytes, read while the worker holds the read transaction. */
export function liveArtifact(
  f: FoundFile,
  live: LiveRead,
  r: LiveBeginResult,
  meta: SqliteDbMeta,
  verified: Promise<LiveVerifyResult>,
  databases: Record<string, SqliteDbMeta>,
  mapError: (e: unknown) => unknown,
): Artifact {
  const size = r.size;
  return {
    path: f.rel,
    kind: "sqlite",
    size,
    mode: f.stats.mode & 0o7777,
    mtime: f.stats.mtime,
    // The file itself is read: an incremental snapshot may reference it while the file stays as
    // it was found (its stat, taken before the read transaction, is the conservative identity).
    ...(size === f.stats.size ? { fingerprint: fingerprintOf(f.stats) } : {}),
    // Otherwise it stores only the pages that changed.
    ...(meta.page_size > 0 ? { chunking: { mode: "pages", pageSize: meta.page_size } } : {}),
    // The pages may be read through the same descriptor (never another: closing one would drop
    // the read transaction's locks), and check() below catches a file that changed.
    descriptor: { fd: live.fh.fd, path: f.abs },
    // an incremental scan hashed every byte through it already (the pack reads only what it stores)
    ...(r.pages && r.pages.pageSize === meta.page_size ? { pageHashes: r.pages } : {}),
    open: (o?: OpenOptions) => {
      const s = o?.reuse
        ? null
        : live.fh.createReadStream({ start: 0, end: size, autoClose: false, highWaterMark: 1 << 20 });
      return (async function* () {
        let done = false;
        try {
          if (s) for await (const chunk of s) yield chunk as Buffer;
          else yield* reusedChunks(live.fh, 0, size);
          done = true;
        } catch (e) {
          throw sourceError(e, f.abs);
        } finally {
          if (!done) {
            s?.destroy();
            void live.release(); // the read failed or was abandoned: let writers go now
          }
        }
      })();
    },
    check: async () => {
      try {
        let v: LiveVerifyResult;
        try {
          v = await verified;
        } catch (e) {
          throw mapError(e);
        }
        if (v.problems.length !== 1 || v.problems[0] !== "ok") {
          const msg = `${f.abs} fails quick_check: ${v.problems.slice(0, 3).join("; ")}`;
          throw new MemsnapError("MEMSNAP_SOURCE_INVALID", msg, {
            path: f.abs,
            hint: DAMAGED_HINT,
          });
        }
        // The read transaction kept SQLite writers out; a size or mtime change means something else wrote the file.
        const now = await live.fh.stat();
        if (now.size !== size) throw sourceChanged(f.abs, `size ${size} → ${now.size}`);
        if (now.mtimeMs !== r.mtimeMs) throw sourceChanged(f.abs, "modified during capture");
        databases[f.rel] = { ...meta, quick_check_ms: v.quickCheckMs, tables: v.tables };
      } finally {
        await live.release();
      }
    },
  };
}

export async function sizeOr0(p: string): Promise<number> {
  try {
    return (await stat(p)).size;
  } catch {
    return 0;
  }
}

/** What the redaction meta lists as not checked for a `live_read` (the same tables the copy path lists as skipped). */
export function liveReadSkips(
  virtualTables: Array<{ name: string; sql: string }>,
): Array<{ table: string; reason: string }> {
  const out: Array<{ table: string; reason: string }> = [];
  const external: Array<{ table: string; reason: string }> = [];
  const sorted = [...virtualTables].sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0));
  for (const v of sorted) {
    if (/^sqlite_/i.test(v.name)) continue;
    const mod = /\busing\s+([A-Za-z0-9_]+)/i.exec(v.sql)?.[1]?.toLowerCase() ?? "";
    if (mod !== "fts3" && mod !== "fts4" && mod !== "fts5") {
      out.push({
        table: v.name,
        reason: `virtual table (${mod || "unknown module"}): only the TEXT cells of its shadow tables were scanned`,
      });
      continue;
    }
    const content = ftsContentOption(v.sql);
    if (content === "") out.push({ table: v.name, reason: `contentless ${mod} table: its text cannot be read back` });
    else if (content !== undefined) {
      const reason = `external-content FTS table: indexes ${content}, which had nothing to redact`;
      external.push({ table: v.name, reason });
    }
  }
  return [...out, ...external];
}

/**
 * One database's read transaction in the worker (`handle`) and the file handle its bytes
 * are read through. The file handle is closed only after the worker has closed the
 * connection (or exited): closing a descriptor of the file drops every POSIX lock this
 * process holds on it, the read transaction's included.
 */
export class LiveRead {
  #released: Promise<void> | null = null;
  constructor(
    readonly handle: number,
    readonly fh: FileHandle,
    readonly f: FoundFile,
    readonly worker: SqliteWorker,
  ) {}

  /** End the read transaction, close the connection, then the file handle. Idempotent; never rejects. */
  release(): Promise<void> {
    this.#released ??= (async () => {
      try {
        await this.worker.call({ op: "live_release", handle: this.handle });
      } catch {
        await this.worker.close(); // a dead worker: wait until its thread (and so its connections) is gone
      }
      await this.fh.close().catch(() => undefined);
    })();
    return this.#released;
  }
}
