/**
 * A cross-process lock on one agent: a file created with O_EXCL holding the owner's pid,
 * host and start time. A lock whose pid is dead on this host is stale and is taken over.
 * Snapshot, restore and recover hold it, so they never overlap on the same agent.
 */
import { pidAlive } from "./orphans.js";
import { hostname } from "node:os";
import { mkdir, open, readFile, rename, unlink } from "node:fs/promises";
import { join } from "node:path";
import { MemsnapError } from "../errors.js";

export interface LockInfo {
  pid: number;
  host: string;
  started_at: string;
  command: string;
}

export interface AgentLock {
  path: string;
  release(): Promise<void>;
}

/** The directory memsnap keeps an agent's lock and restore journal in. */
export function controlDir(agentBase: string): string {
  return join(agentBase, ".memsnap");
}

async function readInfo(path: string): Promise<LockInfo | null> {
  try {
    return JSON.parse(await readFile(path, "utf8")) as LockInfo;
  } catch {
    return null;
  }
}

/** True when a lock held by `info` can be taken over: its process is gone from this host. */
export function isStale(info: LockInfo | null): boolean {
  if (!info || !Number.isInteger(info.pid)) return true; // unreadable or half-written by a killed process
  return info.host === hostname() && !pidAlive(info.pid);
}

/**
 * Take the agent's lock, waiting up to `waitMs` (0: fail at once). Throws MEMSNAP_LOCKED with
 * the holder's pid, host and start time when it stays held.
 */
export async function acquireLock(
  agentBase: string,
  opts: { waitMs?: number; command: string; name?: string },
): Promise<AgentLock> {
  const dir = controlDir(agentBase);
  await mkdir(dir, { recursive: true, mode: 0o700 });
  const path = join(dir, opts.name ?? "lock");
  const deadline = Date.now() + (opts.waitMs ?? 0);
  const mine: LockInfo = {
    pid: process.pid,
    host: hostname(),
    started_at: new Date().toISOString(),
    command: opts.command,
  };
  for (let attempt = 0; ; attempt++) {
    try {
      const fh = await open(path, "wx", 0o600);
      try {
        await fh.writeFile(JSON.stringify(mine));
        await fh.sync();
      } finally {
        await fh.close();
      }
      let released = false;
      return {
        path,
        release: async () => {
          if (released) return;
          released = true;
          const now = await readInfo(path);
          if (now?.pid === mine.pid && now.started_at === mine.started_at) await unlink(path).catch(() => undefined);
        },
      };
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code !== "EEXIST") throw e;
    }
    const held = await readInfo(path);
    if (isStale(held)) {
      // Take over by renaming the stale file aside, then check it really was the stale one.
      const aside = `${path}.stale-${process.pid}-${attempt}`;
      try {
        await rename(path, aside);
        const moved = await readInfo(aside);
        if (moved?.pid === held?.pid && moved?.started_at === held?.started_at)
          await unlink(aside).catch(() => undefined);
        else await rename(aside, path).catch(() => undefined); // a fresh lock slipped in: put it back
      } catch {
        /* someone else took it over first */
      }
      continue;
    }
    if (Date.now() >= deadline) {
      throw new MemsnapError(
        "MEMSNAP_LOCKED",
        `agent is locked by ${
          held ? `pid ${held.pid} on ${held.host} (${held.command}, since ${held.started_at})` : "another process"
        }`,
        {
          path,
          hint:
            "wait for it to finish, pass --wait DURATION, " +
            "or remove the lock file if that process is gone from another host",
        },
      );
    }
    await new Promise((r) => setTimeout(r, Math.min(200, Math.max(10, deadline - Date.now()))));
  }
}
