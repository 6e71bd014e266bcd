/**
 * Bounded memory for streaming: every buffer that flows through a pipeline becomes garbage
 * a moment later, and V8 only collects once external memory has grown by tens of MiB, so
 * peak RSS carries that much dead data per stage. Asking for a cheap young-generation
 * collection every few MiB streamed frees those buffers early and keeps the peak flat.
 */
import { setFlagsFromString } from "node:v8";
import { runInNewContext } from "node:vm";

type GcFn = (opts?: { type?: "minor" | "major"; execution?: "sync" | "async" }) => void;

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

/** Counts streamed bytes and runs a minor GC every `stepBytes`. */
export class GcPacer {
  private since = 0;
  constructor(private readonly stepBytes = 16 * 1024 * 1024) {}
  add(n: number): void {
    this.since += n;
    if (this.since < this.stepBytes) return;
    this.since = 0;
    gc()?.({ type: "minor" });
  }
}
