/** Live targets for path-based sources (files, state): per-file swaps of the files the source selects. */
import { stat } from "node:fs/promises";
import { basename, dirname } from "node:path";
import type { LiveTarget } from "./types.js";
import { selector, type WalkOptions } from "./walk.js";

/**
 * A `files`-mode target for a source whose path is a directory (the files its globs select
 * belong to it) or a single file (only that file belongs to it).
 */
export async function pathTarget(abs: string, capturedFile: boolean, opts: WalkOptions): Promise<LiveTarget> {
  const st = await stat(abs).catch(() => null);
  if (st ? st.isFile() : capturedFile) {
    const name = basename(abs);
    return { root: dirname(abs), mode: "files", owns: (rel) => rel === name };
  }
  return { root: abs, mode: "files", owns: selector(opts) };
}
