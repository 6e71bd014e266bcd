/**
 * The SQLite worker's live reads, by handle number: each holds a read-only connection, the
 * descriptor its stale-byte scan reads through (the host's), and the last scan's result.
 */
import type { Db } from "./worker-sql.js";
import type { LiveScanStats, LiveVerifyResult } from "./worker-types.js";

export interface Handle {
  id: number;
  db: Db | null;
  /** The host's read-only descriptor of the database file. */
  fd: number;
  released: boolean;
  /** live_begin is running on it (perhaps suspended in a scan). */
  busy?: boolean;
  /** Settles when live_begin is done with it (a read on the thread pool may still use the descriptor until then). */
  idle?: Promise<void>;
  /** The read transaction is held (live_begin with `hold` and a yes). */
  holding?: boolean;
  /**
   * quick_check and the row counts, run in this read transaction (or in the look-ahead's whose
   * scan it reuses) while the changed-page pass hashed: live_verify answers with it.
   */
  verified?: LiveVerifyResult & { limit: number };
  /** A look-ahead's scan result, valid while `data_version`, size and mtime are unchanged. */
  cache: {
    dataVersion: number;
    size: number;
    mtimeMs: number;
    scan: LiveScanStats;
    reason: string | null;
    candidates: Array<string | Uint8Array> | undefined;
    pages: { pageSize: number; table: Uint8Array; sha256: string } | undefined;
    verified: (LiveVerifyResult & { limit: number }) | undefined;
  } | null;
}

export const handles = new Map<number, Handle>();

/** The error a scan stops with once its handle was released (code MEMSNAP_RELEASED). */
export const released = (): Error =>
  Object.assign(new Error("the live read was released"), { code: "MEMSNAP_RELEASED" });

let lastYield = 0;
/** Let other jobs run (every 15 ms at most); throws {@link released} if `h` was released meanwhile. */
export async function maybeYield(h: Handle): Promise<void> {
  const now = performance.now();
  if (now - lastYield < 15) return;
  await new Promise((r) => setImmediate(r));
  lastYield = performance.now();
  if (h.released) throw released();
}

/** Release `h`: roll its transaction back and close its connection (or leave that to live_begin, if busy). */
export function closeHandle(h: Handle): void {
  handles.delete(h.id);
  h.released = true;
  if (h.busy) return; // live_begin is running on it (suspended in a scan): it closes the handle when it resumes
  if (h.db) {
    try {
      if (h.db.inTransaction) h.db.exec("ROLLBACK");
    } catch {
      /* closing anyway */
    }
    try {
      h.db.close();
    } catch {
      /* already closed */
    }
    h.db = null;
  }
}
