/**
 * Capturing a sqlite source: each database by a live read when that is sound, else by a copy;
 * with redaction, two workers, so that the next database is scanned while one streams (or,
 * when its WAL holds frames, so that it cannot be read live, copied: VACUUM INTO a temporary
 * file, the rest of the copy path at its turn). A source's first database gets the same
 * look-ahead when the snapshot starts, while the layers before it pack.
 */
import { randomBytes } from "node:crypto";
import type { Stats } from "node:fs";
import { open, rm, stat, type FileHandle } from "node:fs/promises";
import { join, resolve } from "node:path";
import { MemsnapError } from "../../errors.js";
import {
  SqliteWorker,
  type CheckResult,
  type CopyResult,
  type LiveBeginResult,
  type LiveVerifyResult,
} from "./worker-host.js";
import type { PageBase } from "./worker-types.js";
import type { Redactor } from "../../redact/types.js";
import type { Artifact, CaptureContext, LayerCapture } from "../types.js";
import { fileArtifact, fingerprintOf, sourceError, walkFiles, walkNotices, type FoundFile } from "../walk.js";
import { SIDE_FILE, SQLITE_DEFAULT_INCLUDE, type SqliteConfig } from "./config.js";
import { DAMAGED_HINT, notSqlite, sniff, sniffHandle, sqliteSourceError } from "./errors.js";
import { liveArtifact, LiveRead, liveReadSkips, sizeOr0 } from "./live-read.js";
import type { SqliteDbMeta, SqliteRedactionStats } from "./meta.js";
import { redactSqliteCopy } from "./redact-copy.js";

/** The most problems a live read's quick_check reports. */
const VERIFY_LIMIT = 10;

/**
 * True when no rule matches in any of `cells` as the copy path reads them (./redact-copy.ts): a
 * TEXT cell that is a candidate, as text; a BLOB that is a candidate, as the text its bytes
 * decode to (text BLOBs would be rewritten, binary ones reported). False as well when the
 * redactor cannot say without recording (no `matches`).
 */
async function candidatesClean(cells: ReadonlyArray<string | Uint8Array>, redactor: Redactor): Promise<boolean> {
  if (!redactor.matches) return false;
  for (const v of cells) {
    let text: string;
    if (typeof v === "string") text = v;
    else {
      if (v.length === 0 || redactor.clean?.(v) === true) continue;
      text = Buffer.from(v.buffer, v.byteOffset, v.byteLength).toString("utf8");
    }
    if (redactor.candidate(text) && (await redactor.matches(text))) return false;
  }
  return true;
}

/** A copy made (and, with redaction on, the live read's scan of it: see makeCopy). */
interface StartedCopy {
  copy: string;
  cr: CopyResult;
  scan?: LiveBeginResult;
}

/**
 * Whether the copy scanned as `scan` needs no redaction: false when it may (a candidate the
 * redactor does not clear, a hit in its stale bytes, a scan that could not decide); otherwise the
 * number of candidate cells the redactor cleared.
 */
async function copyNeedsNothing(scan: LiveBeginResult, redactor: Redactor): Promise<number | false> {
  if (scan.eligible) return 0;
  if (scan.reason !== "redaction_candidate" || !scan.candidates?.length) return false;
  return (await candidatesClean(scan.candidates, redactor)) ? scan.candidates.length : false;
}

/** Capture a sqlite source: one artifact per database, each one committed state. */
export async function captureLayer(cfg: SqliteConfig, ctx: CaptureContext): Promise<LayerCapture> {
  const root = resolve(ctx.baseDir, cfg.path);
  const walked = await walkFiles(root, { include: cfg.include ?? SQLITE_DEFAULT_INCLUDE, exclude: cfg.exclude });
  const { files, skipped } = walked;
  const dbs = files.filter((f) => !SIDE_FILE.test(f.rel));
  const sideFiles = files.length - dbs.length;
  const databases: Record<string, SqliteDbMeta> = {};
  const temps = new Set<string>();
  const lives = new Set<LiveRead>();
  // With redaction, two workers: while one reads database i, the other scans database i+1 ahead
  // (see the module comment).
  const workers: SqliteWorker[] = [];
  const workerFor = (i: number): SqliteWorker =>
    (workers[ctx.redactor && cfg.live_read !== false ? i % 2 : 0] ??= new SqliteWorker());
  const tag = randomBytes(4).toString("hex");
  let seq = 0;
  let handles = 0;
  const removeCopy = async (p: string): Promise<void> => {
    for (const f of [p, `${p}-journal`, `${p}.vacuum`]) await rm(f, { force: true });
    temps.delete(p);
  };
  const liveOn = cfg.live_read !== false;
  const redact = !!ctx.redactor;

  /** Open a database file and look at its first bytes; the handle stays open for a live read. */
  const openDb = async (f: FoundFile): Promise<FileHandle> => {
    let fh: FileHandle;
    try {
      fh = await open(f.abs, "r");
    } catch (e) {
      throw sourceError(e, f.abs);
    }
    let kind: Awaited<ReturnType<typeof sniffHandle>>;
    try {
      kind = await sniffHandle(fh, f.abs);
    } catch (e) {
      await fh.close().catch(() => undefined);
      throw e;
    }
    if (kind === "other" || kind === "random") {
      await fh.close().catch(() => undefined);
      throw notSqlite(f.abs, kind);
    }
    return fh;
  };

  // An incremental snapshot references a database read live last time whose file has not
  // changed since (same device, inode, size, mtime, ctime) and has no WAL frames or hot journal
  // now: its bytes are those stored then, so it is neither opened nor scanned nor checked
  // again; its meta is carried over from that snapshot (with `reused_from`).
  const reused = new Map<FoundFile, SqliteDbMeta>();
  if (ctx.unchanged && liveOn) {
    for (const f of dbs) {
      const meta = ctx.unchanged(`${cfg.name}/${f.rel}`, fingerprintOf(f.stats), "sqlite");
      const prev = (meta?.databases as Record<string, SqliteDbMeta> | undefined)?.[f.rel];
      if (!prev || prev.method !== "live_read") continue;
      if ((await sizeOr0(`${f.abs}-wal`)) > 0 || (await sizeOr0(`${f.abs}-journal`)) > 0) continue;
      reused.set(f, prev);
    }
  }

  // An incremental snapshot scans only the pages that changed since the last one when that one
  // read the database live and its scan found no free page (./worker-changed.ts): the last
  // snapshot's table of page hashes, for the worker to compare the pages with.
  const lastDbs = ctx.lastMeta?.(cfg.name)?.databases;
  const pageBase = async (f: FoundFile): Promise<PageBase | undefined> => {
    if (!redact || !ctx.pageTable || typeof lastDbs !== "object" || lastDbs === null) return undefined;
    const prev = (lastDbs as Record<string, SqliteDbMeta | undefined>)[f.rel];
    const scan = prev?.method === "live_read" ? prev.redaction?.live_scan : undefined;
    if (!scan || scan.free_pages !== 0) return undefined;
    return (await ctx.pageTable(`${cfg.name}/${f.rel}`)) ?? undefined;
  };

  /** A database's copy, made and checked (redacted when redaction is on), before it streams. */
  interface Copied {
    copy: string;
    cr: CopyResult;
    redaction: SqliteRedactionStats | undefined;
    chk: CheckResult;
    st: Stats;
  }
  const jobFor =
    (f: FoundFile) =>
    <T>(p: Promise<T>): Promise<T> =>
      p.catch((e: unknown) => {
        throw ctx.signal?.aborted ? e : sqliteSourceError(e, f.abs, ctx.tmpDir);
      });
  /**
   * The copy path's first step: VACUUM INTO (or a one-step backup) a temporary file; with
   * redaction on, then the live read's scan of that copy, in the same worker (`scan`: see
   * makeCopy). A scan that fails is no answer (undefined): the copy is redacted as before.
   */
  const startCopy = async (f: FoundFile, w: SqliteWorker, scanIt = true): Promise<StartedCopy> => {
    const job = jobFor(f);
    const copy = join(ctx.tmpDir, `sqlite-${cfg.name}-${tag}-${seq++}.db`);
    temps.add(copy);
    // Not opened yet when copied without a live read, or ahead of its turn: what it is, first.
    const kind = await sniff(f.abs);
    if (kind === "other" || kind === "random") throw notSqlite(f.abs, kind);
    const cr = await job(
      w.call<CopyResult>({ op: "copy", src: f.abs, dest: copy, busyTimeoutMs: cfg.busy_timeout_ms }, ctx.signal),
    );
    // (`live_read: false` keeps the copy path as it was: every cell read as SQL rows)
    if (!redact || !scanIt || !liveOn) return { copy, cr };
    let scan: LiveBeginResult | undefined;
    let fh: FileHandle | undefined;
    const handle = ++handles;
    try {
      fh = await open(copy, "r");
      scan = await w.call<LiveBeginResult>(
        { op: "live_begin", handle, src: copy, fd: fh.fd, busyTimeoutMs: cfg.busy_timeout_ms, redact, hold: false },
        ctx.signal,
      );
    } catch {
      scan = undefined; // (the redaction of the copy meets whatever this was)
    } finally {
      if (fh) {
        await w.call({ op: "live_release", handle }).catch(() => undefined);
        await fh.close().catch(() => undefined);
      }
    }
    return { copy, cr, scan };
  };
  /** The rest of the copy path: redaction in the copy, quick_check. */
  const makeCopy = async (
    f: FoundFile,
    w: SqliteWorker,
    started: Promise<StartedCopy> | undefined,
    scanIt: boolean,
  ): Promise<Copied> => {
    const job = jobFor(f);
    const { copy, cr, scan } = await (started ?? startCopy(f, w, scanIt));
    let redaction: SqliteRedactionStats | undefined;
    if (ctx.redactor) {
      // The copy is a database file nobody else writes: when the live read's scan of it finds
      // nothing to redact (or only candidates the redactor clears, as a live read's are), the
      // rewrite below would change nothing, and is not run. It reads every cell as SQL rows on
      // the main thread: 375 ms (550 CPU-ms) for the realistic home's memory.db, whose hot WAL
      // sends it here, against 159 ms for the scan in the worker.
      const cleared = scan ? await copyNeedsNothing(scan, ctx.redactor) : false;
      if (scan && cleared !== false) {
        redaction = {
          scrub: "none",
          tables: scan.scan?.tables ?? 0,
          cells_scanned: scan.scan?.cells_scanned ?? 0,
          candidates: cleared,
          cells_redacted: 0,
          fts_rebuilt: [],
          fts_optimized: [],
          stat4_cleared: false,
          skipped: liveReadSkips(scan.virtualTables),
          ...(scan.scan ? { live_scan: scan.scan } : {}),
        };
      } else {
        const r = await redactSqliteCopy(copy, ctx.redactor, `${cfg.name}/${f.rel}`, ctx.signal);
        redaction = r.stats;
        if (r.changed) await job(w.call({ op: "vacuum", path: copy }, ctx.signal));
      }
    }
    const chk = await job(
      w.call<CheckResult>({ op: "check", path: copy, pragma: "quick_check", limit: 10, counts: true }, ctx.signal),
    );
    if (chk.problems.length !== 1 || chk.problems[0] !== "ok") {
      throw new MemsnapError(
        "MEMSNAP_SOURCE_INVALID",
        `the copy of ${f.abs} fails quick_check: ${chk.problems.slice(0, 3).join("; ")}`,
        {
          path: f.abs,
          hint: DAMAGED_HINT,
        },
      );
    }
    let st;
    try {
      st = await stat(copy);
    } catch (e) {
      throw sourceError(e, copy);
    }
    return { copy, cr, redaction, chk, st };
  };

  /**
   * A look-ahead, in the other worker, for the next database: its redaction scan in its own
   * short read transaction, or, when its WAL holds frames (so it cannot be read live), its copy
   * (VACUUM INTO only: redacting the copy ahead too, on the main thread, raised the realistic
   * home's peak RSS from 193-198 to 200-213 MiB).
   */
  type Ahead =
    { f: FoundFile; live: LiveRead; done: Promise<unknown> } | { f: FoundFile; copied: Promise<StartedCopy> };
  let ahead: Ahead | null = null;
  // (the worker is started only when there is a look-ahead to run: a source of one database
  // started a second worker for nothing, ~50 ms of CPU and a V8 heap)
  const startAhead = async (i: number, cur: FoundFile | null): Promise<void> => {
    const f = dbs[i];
    if (!f || !liveOn || !redact || ctx.signal?.aborted || reused.has(f)) return;
    const w = workerFor(i);
    if ((await sizeOr0(`${f.abs}-wal`)) > 0) {
      // A hot WAL: the live read would find its frames and copy at its turn; the copy (a
      // committed state under SQLite's own locking) is made now instead, while other layers pack.
      const copied = startCopy(f, w);
      copied.catch(() => undefined); // a failure is met again (and reported) when its turn comes
      ahead = { f, copied };
      return;
    }
    // A hard link of the database being read: closing that one's descriptor would drop this one's locks.
    if (cur && f.stats.dev === cur.stats.dev && f.stats.ino === cur.stats.ino) return;
    let fh: FileHandle;
    try {
      fh = await openDb(f);
    } catch {
      return; // reported when its turn comes
    }
    const live = new LiveRead(++handles, fh, f, w);
    lives.add(live);
    const base = await pageBase(f);
    const done = w
      .call<LiveBeginResult>({
        op: "live_begin",
        handle: live.handle,
        src: f.abs,
        fd: fh.fd,
        busyTimeoutMs: cfg.busy_timeout_ms,
        redact,
        hold: false,
        ...(base ? { base, verifyLimit: VERIFY_LIMIT } : {}),
      })
      .catch(() => undefined); // a failure is met again (and reported) when its turn comes
    ahead = { f, live, done };
  };

  // The first database's scan starts now: the snapshot starts every capture up front, so it
  // runs while the layers before this one pack (its result is reused only if the database
  // has not changed by its turn, as for any look-ahead).
  const firstRead = dbs.findIndex((f) => !reused.has(f));
  if (firstRead >= 0) await startAhead(firstRead, null);

  return {
    estimatedBytes: dbs.reduce((n, f) => n + f.stats.size, 0),
    notices: () => walkNotices(walked),
    artifacts: (async function* (): AsyncGenerator<Artifact> {
      for (let i = 0; i < dbs.length; i++) {
        const f = dbs[i]!;
        ctx.signal?.throwIfAborted();
        const prev = reused.get(f);
        if (prev) {
          databases[f.rel] = { ...prev, reused: true };
          yield {
            path: f.rel,
            kind: "sqlite",
            size: f.stats.size,
            mode: f.stats.mode & 0o7777,
            mtime: f.stats.mtime,
            fingerprint: fingerprintOf(f.stats),
            open: () => {
              throw new MemsnapError(
                "MEMSNAP_INTERNAL",
                `${f.abs} was to be referenced by the incremental snapshot, not read`,
              );
            },
          };
          continue;
        }
        const w = workerFor(i);
        const job = jobFor(f);
        const sourceBytes = f.stats.size + (await sizeOr0(`${f.abs}-wal`));

        // ---- the live read: the file itself under a read transaction, when that is sound
        let skippedWhy: string | undefined = liveOn ? undefined : "disabled";
        const pre = ahead as Ahead | null;
        ahead = null;
        let live: LiveRead | null = null;
        let copiedAhead: Promise<StartedCopy> | null = null;
        if (pre && pre.f === f) {
          if ("copied" in pre) {
            copiedAhead = pre.copied;
            skippedWhy = "wal_frames";
            await startAhead(i + 1, f); // runs while this one streams
          } else {
            await pre.done; // the look-ahead's job must end before the same handle is used again
            live = pre.live;
          }
        } else if (pre && "copied" in pre) {
          const c = await pre.copied.catch(() => null);
          if (c) await removeCopy(c.copy);
        } else if (pre) {
          lives.delete(pre.live);
          await pre.live.release();
        }
        if (liveOn && !copiedAhead) {
          if (!live) {
            const fh = await openDb(f);
            live = new LiveRead(++handles, fh, f, w);
            lives.add(live);
          }
          const l = live;
          await startAhead(i + 1, f); // runs while this one is scanned and streams
          let r: LiveBeginResult;
          try {
            const base = await pageBase(f);
            r = await job(
              l.worker.call<LiveBeginResult>(
                {
                  op: "live_begin",
                  handle: l.handle,
                  src: f.abs,
                  fd: l.fh.fd,
                  busyTimeoutMs: cfg.busy_timeout_ms,
                  redact,
                  hold: true,
                  ...(base ? { base, verifyLimit: VERIFY_LIMIT } : {}),
                },
                ctx.signal,
              ),
            );
          } catch (e) {
            lives.delete(l);
            await l.release();
            throw e;
          }
          // A few cells the pre-filter flagged (random bytes of an embedding BLOB read as "key=",
          // "://"): if the redactor finds nothing in any of them, as the copy path would test
          // them, the copy would come out with the same rows, and the file itself is read.
          let cleared = 0;
          if (!r.eligible && r.candidates && ctx.redactor) {
            try {
              if (await candidatesClean(r.candidates, ctx.redactor)) {
                cleared = r.candidates.length;
                r = { ...r, eligible: true, reason: undefined };
              }
            } catch (e) {
              lives.delete(l);
              await l.release();
              throw e;
            }
          }
          if (r.eligible) {
            // quick_check and the row counts run in the worker, in the same transaction, while the bytes stream.
            const verified = l.worker.call<LiveVerifyResult>(
              { op: "live_verify", handle: l.handle, limit: VERIFY_LIMIT },
              ctx.signal,
            );
            verified.catch(() => undefined); // awaited in check()
            const meta: SqliteDbMeta = {
              method: "live_read",
              ...r.pragmas,
              source_bytes: r.size + r.walBytes,
              copy_bytes: r.size,
              copy_ms: 0,
              prepare_ms: r.ms,
              quick_check: "ok",
              tables: {},
              ...(r.scan
                ? {
                    redaction: {
                      scrub: "none",
                      tables: r.scan.tables,
                      cells_scanned: r.scan.cells_scanned,
                      candidates: cleared,
                      cells_redacted: 0,
                      fts_rebuilt: [],
                      fts_optimized: [],
                      stat4_cleared: false,
                      skipped: liveReadSkips(r.virtualTables),
                      live_scan: { ...r.scan, ...(r.reused ? { reused: true } : {}) },
                    } satisfies SqliteRedactionStats,
                  }
                : {}),
            };
            const mapError = (e: unknown): unknown => (ctx.signal?.aborted ? e : sqliteSourceError(e, f.abs));
            yield liveArtifact(f, l, r, meta, verified, databases, mapError);
            lives.delete(l);
            await l.release();
            continue;
          }
          skippedWhy = r.reason ?? "unknown";
          lives.delete(l);
          await l.release();
        }

        // ---- the copy: made now, or already by the look-ahead
        // (the live read found a candidate the redactor did not clear: the copy holds it too,
        // so it is not scanned again before the rewrite)
        const scanIt = skippedWhy !== "redaction_candidate";
        const { copy, cr, redaction, chk, st } = await makeCopy(f, w, copiedAhead ?? undefined, scanIt);
        databases[f.rel] = {
          method: cr.method,
          ...cr.pragmas,
          source_bytes: sourceBytes,
          copy_bytes: st.size,
          copy_ms: Math.round(cr.ms),
          quick_check: "ok",
          ...(skippedWhy ? { live_read_skipped: skippedWhy } : {}),
          tables: chk.tables ?? {},
          ...(redaction ? { redaction } : {}),
        };
        const a = fileArtifact({ abs: copy, rel: f.rel, stats: st }, "sqlite");
        const pageSize = cr.pragmas.page_size;
        // An incremental snapshot stores only the pages of the copy that changed (a VACUUM INTO
        // copy moves pages after a change less often than not: matched by content, not place).
        yield {
          ...a,
          mode: f.stats.mode & 0o7777,
          mtime: f.stats.mtime,
          ...(pageSize > 0 ? { chunking: { mode: "pages" as const, pageSize } } : {}),
        };
        // The pipeline has packed and checked the artifact: drop the copy now to bound disk use.
        await removeCopy(copy);
      }
    })(),
    finish: async () => {
      // Every database has streamed: stop the workers now (each holds a V8 heap and SQLite
      // caches), not at the end of the whole snapshot, then close the file handles.
      for (const w of workers.splice(0)) await w?.close();
      for (const l of [...lives]) await l.release();
      return {
        root,
        root_is_file: files.length === 1 && files[0]!.abs === root,
        databases,
        skipped: { ...skipped, side_files: sideFiles },
      };
    },
    cleanup: async () => {
      // Stop the worker first (its exit closes every connection), then close the file handles.
      for (const w of workers) await w?.close();
      for (const l of [...lives]) await l.release();
      for (const p of [...temps]) await removeCopy(p).catch(() => undefined);
    },
  };
}
