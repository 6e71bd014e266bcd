/**
 * The process umask, and the rule a restore applies to every file mode it sets.
 *
 * A restored file's mode is its captured permission bits, masked by the umask of the process
 * that restores: `mode & 0o777 & ~umask`, as `tar -x` does for a user who is not root (no
 * `-p`). Set-uid, set-gid and sticky bits never come back, and a bundle cannot make a file
 * more open than the restoring user's umask allows.
 */
import { readFileSync } from "node:fs";

/**
 * The umask, read without changing it: from /proc/self/status where the kernel reports it
 * (Linux 4.7+). `process.umask()` without an argument sets the mask to 0 and back, a window
 * in which a file made on another thread (the thread pool writes restored files) would be
 * created without the mask; it is only the fallback.
 */
export function currentUmask(): number {
  try {
    const m = /^Umask:\s*([0-7]+)\s*$/m.exec(readFileSync("/proc/self/status", "latin1"));
    if (m) return parseInt(m[1]!, 8) & 0o777;
  } catch {
    // no procfs: fall through
  }
  return process.umask() & 0o777;
}

/** The mode a restore gives a file captured with mode `captured`, under umask `umask`. */
export function restoredMode(captured: number, umask: number = currentUmask()): number {
  return captured & 0o777 & ~umask;
}
