/**
 * zstd-napi's native binding, which the zstd, encoder and decoder workers load by its resolved
 * path (so that every thread loads the same copy as the main thread would).
 */
import { createRequire } from "node:module";
import type * as Binding from "zstd-napi/binding.js";

export type ZstdBinding = typeof Binding;

let pathCache: string | undefined;

/** The binding's resolved path, for a worker's workerData. */
export function zstdBindingPath(): string {
  pathCache ??= createRequire(import.meta.url).resolve("zstd-napi/binding");
  return pathCache;
}

/** The binding at `path` (from {@link zstdBindingPath}). */
export function loadZstdBinding(path: string): ZstdBinding {
  return createRequire(import.meta.url)(path) as ZstdBinding;
}
