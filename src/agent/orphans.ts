/**
 * Leftovers of memsnap processes that died (SIGKILL, power loss): bundle temp files
 * `.<name>.tmp-<pid>-<rand>`, work dirs `.memsnap-work-<pid>-<rand>` and restore staging
 * `.<name>.memsnap-staging-<pid>-<rand>`. Each name carries its writer's pid; a leftover is
 * removed only when that pid is dead on this host, so a running writer is never disturbed.
 */
import { readdir, rm, stat } from "node:fs/promises";
import { join } from "node:path";

const ORPHAN = /^\.(?:.+\.tmp|memsnap-work|.+\.memsnap-staging)-(\d+)-[0-9a-f]+$/;

/** True when a process with this pid exists (ours or another user's). */
export function pidAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (e) {
    return (e as NodeJS.ErrnoException).code === "EPERM";
  }
}

/** The pid that owns a leftover name, or null when the name is not a memsnap leftover. */
export function orphanPid(name: string): number | null {
  const m = ORPHAN.exec(name);
  return m ? Number(m[1]) : null;
}

/** Remove dead writers' leftovers in `dir` older than `minAgeMs`; returns the removed paths. */
export async function removeOrphans(dir: string, minAgeMs = 0): Promise<string[]> {
  const removed: string[] = [];
  const names = await readdir(dir).catch(() => [] as string[]);
  for (const name of names) {
    const pid = orphanPid(name);
    if (pid === null || pid === process.pid || pidAlive(pid)) continue;
    const p = join(dir, name);
    const st = await stat(p).catch(() => null);
    if (!st || Date.now() - st.mtimeMs < minAgeMs) continue;
    await rm(p, { recursive: true, force: true });
    removed.push(p);
  }
  return removed;
}
