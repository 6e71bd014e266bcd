/**
 * Test hook for the crash-safety harness: `MEMSNAP_CRASH_AT=<point>[:<n>]` kills the process
 * with SIGKILL the n-th time (default 1st) execution reaches `crashPoint(point)`. A no-op
 * unless the variable is set. `MEMSNAP_CRASH_LIST=<file>` appends every point reached, so the
 * harness can enumerate the points a run passes through.
 */
import { appendFileSync } from "node:fs";

const hits = new Map<string, number>();

/** Whether either variable was set when the process started (read once: it is called per artifact). */
let armed: boolean | undefined;

export function crashPoint(point: string): void {
  armed ??= !!(process.env.MEMSNAP_CRASH_AT || process.env.MEMSNAP_CRASH_LIST);
  if (!armed) return;
  const want = process.env.MEMSNAP_CRASH_AT;
  const list = process.env.MEMSNAP_CRASH_LIST;
  if (!want && !list) return;
  const n = (hits.get(point) ?? 0) + 1;
  hits.set(point, n);
  if (list) appendFileSync(list, `${point}:${n}\n`);
  if (!want) return;
  const [p, count] =
    want.includes(":") && /:\d+$/.test(want)
      ? [want.slice(0, want.lastIndexOf(":")), Number(want.slice(want.lastIndexOf(":") + 1))]
      : [want, 1];
  if (p === point && n === count) process.kill(process.pid, "SIGKILL");
}
