import { execFile } from "node:child_process";
import { createHash } from "node:crypto";
import { createReadStream } from "node:fs";
import { access, lstat, open, rename, unlink } from "node:fs/promises";
import { dirname } from "node:path";
import { promisify } from "node:util";
import { destinationError } from "../errors.js";

const execFileP = promisify(execFile);

/** fsync a directory so a rename inside it survives a crash. Errors on platforms without dir fsync are ignored. */
export async function fsyncDir(dir: string): Promise<void> {
  let fh;
  try {
    fh = await open(dir, "r");
    await fh.sync();
  } catch (e) {
    const code = (e as NodeJS.ErrnoException).code;
    if (code !== "EISDIR" && code !== "EINVAL" && code !== "EPERM") throw e;
  } finally {
    await fh?.close();
  }
}

/**
 * Flush the dirty data of the whole filesystem that holds `dir`: syncfs(2), through coreutils'
 * `sync -f` (Node has no binding for it). A restore calls it once on its staged tree before it
 * commits, instead of an fsync per file (a ProcessFork store's 56 sequential fsyncs were ~0.3 s
 * of the bench's restore).
 *
 * A write-back error is an error: syncfs(2) reports one (EIO, ENOSPC) since Linux 5.8, and
 * `sync` then exits non-zero with the errno's text, which becomes MEMSNAP_DEST_FULL or
 * MEMSNAP_DEST_UNWRITABLE here, so a restore never commits a tree the disk did not take.
 * Where `sync` has no `-f` (BSD, macOS) a plain `sync` flushes every filesystem instead; only
 * a missing `sync` binary makes the flush a no-op.
 */
export async function syncFilesystem(dir: string): Promise<void> {
  try {
    await execFileP("sync", ["-f", dir]);
  } catch (e) {
    const err = e as NodeJS.ErrnoException & { stderr?: string };
    if (err.code === "ENOENT") return; // no sync binary at all
    const said = String(err.stderr ?? "").trim();
    if (/invalid option|illegal option|unrecognized option|usage/i.test(said)) {
      await execFileP("sync", []).catch(() => undefined);
      return;
    }
    const errno = /no space left|quota/i.test(said) ? "ENOSPC" : "EIO";
    throw destinationError(
      Object.assign(new Error(said || `sync -f exited with ${String(err.code)}`), { code: errno }),
      dir,
    );
  }
}

/** Whether something is at `p`, following a symbolic link (a dangling link is not there). */
export const exists = (p: string): Promise<boolean> =>
  access(p).then(
    () => true,
    () => false,
  );

/** Whether anything is at `p`, a symbolic link itself included (lstat). */
export const lexists = (p: string): Promise<boolean> =>
  lstat(p).then(
    () => true,
    () => false,
  );

/** The SHA-256 (hex) of a file's bytes, streamed. */
export async function sha256File(path: string): Promise<string> {
  const h = createHash("sha256");
  for await (const c of createReadStream(path, { highWaterMark: 1 << 20 })) h.update(c as Buffer);
  return h.digest("hex");
}

/** Bytes restored between two early syncs (see {@link EarlySync}). */
export const EARLY_SYNC_BYTES = 128 * 1024 * 1024;

/**
 * Writeback of a staged tree started while the restore is still writing it: a syncfs of each
 * of `dirs` (see {@link syncFilesystem}), not awaited and one round in flight at a time, after
 * every {@link EARLY_SYNC_BYTES} restored and whenever {@link kick} is called (a layer
 * materialized). Without it the kernel starts writeback only past `dirty_background_ratio`
 * (10 % of RAM, 2.3 GiB here), so a restore's final sync waited for up to that much on the
 * disk after the last byte was decoded. The first write-back error is kept and thrown by
 * {@link settle}, so the commit never follows a failed flush.
 */
export class EarlySync {
  readonly #dirs: () => Iterable<string>;
  readonly #every: number;
  #bytes = 0;
  #next: number;
  #inFlight: Promise<void> | null = null;
  #failed: { error: unknown } | null = null;

  constructor(dirs: () => Iterable<string>, every = EARLY_SYNC_BYTES) {
    this.#dirs = dirs;
    this.#every = every;
    this.#next = every;
  }

  /** Count `n` bytes restored; starts a sync each time another `every` have passed. */
  bytes(n: number): void {
    this.#bytes += n;
    if (this.#bytes < this.#next) return;
    this.#next = this.#bytes + this.#every;
    this.kick();
  }

  /** Start a sync now unless one is in flight (or one failed). */
  kick(): void {
    if (this.#inFlight || this.#failed) return;
    const dirs = [...new Set(this.#dirs())];
    this.#inFlight = (async () => {
      // A staged root that extraction has not created yet has nothing to flush.
      for (const d of dirs) if (await exists(d)) await syncFilesystem(d);
    })()
      .catch((error: unknown) => {
        this.#failed ??= { error };
      })
      .finally(() => {
        this.#inFlight = null;
      });
  }

  /** Wait for the sync in flight; throws the write-back error an early sync met. */
  async settle(): Promise<void> {
    await this.#inFlight;
    if (this.#failed) throw this.#failed.error;
  }
}

/** Rename `tmp` over `dest` and fsync the directory: the last step of temp → fsync → rename → fsync dir. */
export async function commitRename(tmp: string, dest: string): Promise<void> {
  await rename(tmp, dest);
  await fsyncDir(dirname(dest));
}

/** Remove a file, ignoring "not found". */
export async function unlinkQuiet(path: string): Promise<void> {
  try {
    await unlink(path);
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code !== "ENOENT") throw e;
  }
}
