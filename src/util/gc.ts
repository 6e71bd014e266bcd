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
import { setFlagsFromString } from "node:v8";
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
    gc()?.({ type });
  };
}
