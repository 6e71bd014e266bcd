/**
 * Paced garbage collection for the streaming paths.
 *
 * V8 collects by the size of its own heap, not by the memory behind Buffers or by how long
 * garbage has waited, so two kinds of streaming garbage outlive their use and show as RSS:
 * source chunks (external memory, freed only when a scavenge runs) and strings of a megabyte
 * or more (the redactor's latin1 views), which V8 puts straight into its large-object space in
 * the old generation, where they wait for a full collection. A pacer runs one collection after
 * every so many bytes processed; each costs well under a millisecond (minor) or a few
 * milliseconds (major, the live heap being small).
 */
import { getHeapStatistics, setFlagsFromString } from "node:v8";
import { runInNewContext } from "node:vm";

type GcFn = (o?: { type: "minor" | "major" }) => void;
let gcFn: GcFn | null | undefined;

function gc(): GcFn | null {
  if (gcFn === undefined) {
    try {
      setFlagsFromString("--expose-gc");
      gcFn = runInNewContext("gc") as GcFn;
    } catch {
      gcFn = null;
    }
  }
  return gcFn;
}

/** A function to call with every count of bytes processed; it runs a `type` collection after every `every` bytes. */
export function gcPacer(every: number, type: "minor" | "major"): (n: number) => void {
  let since = 0;
  return (n) => {
    since += n;
    if (since < every) return;
    since = 0;
    const fn = gc();
    // A full collection is the plain call: V8 12 (Node 20) ignores gc({ type: "major" }) (measured:
    // 2M dead objects, 118 MiB of heap, still there after it; gone after gc()).
    if (type === "major") fn?.();
    else fn?.({ type });
  };
}

/**
 * A function to call once per unit of streamed work (a payload entry, a packed artifact): every
 * {@link HEAP_CHECK_EVERY} calls it looks at the heap, and runs a full collection once it holds
 * `slack` bytes more than after the last one.
 *
 * Why: with the young generation kept small (bin/memsnap.js), the per-entry objects of a
 * stream of small artifacts (tar headers, entry streams, hashes) are promoted, and V8 lets the
 * old generation fill with them well before it marks: on a 53k-page KV restore the heap held
 * 83 MiB where 30 were live, and its pages stayed resident. A full collection costs about a
 * millisecond per MiB live, so it runs only once `slack` of garbage may have built up. Measured
 * on that restore with a 16 MiB slack: peak RSS 214 → 163-176 MiB, verify 191 → 139 MiB, at the
 * same wall time.
 */
export function heapPacer(slack: number): () => void {
  let calls = 0;
  let base = -1;
  return () => {
    if (++calls < HEAP_CHECK_EVERY) return;
    calls = 0;
    const used = getHeapStatistics().used_heap_size;
    if (base < 0) base = used;
    if (used < base + slack) return;
    const fn = gc();
    if (!fn) return;
    fn();
    base = getHeapStatistics().used_heap_size;
  };
}

/** Calls between two looks at the heap in {@link heapPacer}. */
export const HEAP_CHECK_EVERY = 64;

/** Run one collection now (a no-op where gc cannot be had). */
export function collectNow(type: "minor" | "major"): void {
  const fn = gc();
  if (type === "major") fn?.();
  else fn?.({ type });
}
