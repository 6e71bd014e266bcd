/**
 * tar-stream, imported on first use: it and its dependencies (streamx, fast-fifo, b4a,
 * text-decoder) are ~15 ms of module loading, which every command paid at startup, and only
 * a CRIU procs blob and a plugin's output parse tar with it (a payload's tar is parsed by
 * src/read/tar-scan.ts, in the decoder worker).
 */
import type TarStream from "tar-stream";

let loading: Promise<typeof TarStream> | undefined;

export function tarStream(): Promise<typeof TarStream> {
  // a CommonJS module: its exports are the namespace's default
  loading ??= import("tar-stream").then((m) => (m as unknown as { default: typeof TarStream }).default);
  return loading;
}
