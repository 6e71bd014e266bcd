/**
 * The native pre-filter (native/prefilter/prefilter.c): a fast NEGATIVE test in front of the
 * JS finders (./prefilter.ts). `scan(bytes, start, end)` is -1 only when no scanner of the
 * pre-filter can match in those bytes, read either as a latin1 view or as the UTF-8 text they
 * decode to; any other answer sends the bytes to the JS finders, whose verdict stands. So the
 * native code never decides what is redacted, only how often the JS finders run: output is
 * the same with it and without it (test/redact/native.test.ts checks the superset property
 * against the finders, and the redactor's bytes both ways).
 *
 * Why: the JS finders cost ~1.8 ms/MB on JSONL agent traces (one `indexOf` pass per anchor
 * and ~20 ns per anchor hit; a trace has a ':' every ~40 bytes); the native scan finds the
 * triggers 16 bytes at a time with SSE2 and tests each with a few loads: 0.7-0.8 ms/MB on the
 * bench's traces and notes, measured on the 2-core bench machine
 * (`node scripts/prefilter-speed.mjs`).
 *
 * It is built by `npm install` / `npm ci` (node-gyp, against the local Node headers). If it
 * is missing (no compiler), memsnap runs the JS finders alone, only slower; CI requires it.
 * `MEMSNAP_NATIVE=0` turns it off (for comparisons).
 */
import { existsSync } from "node:fs";
import { createRequire } from "node:module";
import { fileURLToPath } from "node:url";

export interface NativePrefilter {
  /**
   * First offset in [from, end) where a scanner could match (at the match, or one byte before
   * it for a JWT's "eyJ"), or -1: none can. Look-behinds reach back to `start` (default 0),
   * look-aheads to `end` (default the length); `from` defaults to `start`.
   */
  scan(bytes: Uint8Array, start?: number, end?: number, from?: number): number;
  /**
   * On a libuv pool thread: read the file's first `size` bytes (`fd`), write their SHA-256 to
   * `digest`, and scan them: `callback(errno, at, bytesRead)`, `at` -1 when `scan` would say -1
   * for every range of the file (so the stream redactor leaves it as it is), else an offset to
   * look from, and the digest is not written. `bytesRead` short of `size`: the file ended early.
   * (Blocks of 1 MiB with 4 KiB of context either side; see native/prefilter/prefilter.c.)
   */
  scanFile?(
    fd: number,
    size: number,
    digest: Uint8Array,
    callback: (errno: number, at: number, bytesRead: number) => void,
    json?: boolean,
  ): void;
  /**
   * True when scanFile takes `json`: then a JSON escape that can hide a secret (./json.ts,
   * hidingEscapeAt) also stops the scan. An addon built before it ignores the argument, so a
   * JSON file is scanned natively only when this is true.
   */
  readonly scanFileJson?: boolean;
  /** Built with the SSE2 loop (false: the portable byte loop). */
  readonly simd: boolean;
}

/** Where the addon is built (native/prefilter/build/Release), from dist/redact or src/redact. */
const ADDON = fileURLToPath(new URL("../../native/prefilter/build/Release/memsnap_prefilter.node", import.meta.url));

function load(): { path: string; addon: NativePrefilter } | null {
  if (process.env.MEMSNAP_NATIVE === "0" || !existsSync(ADDON)) return null;
  try {
    return { path: ADDON, addon: createRequire(import.meta.url)(ADDON) as NativePrefilter };
  } catch {
    return null; // built for another Node ABI or platform: the JS finders do the work
  }
}

const loaded = load();

/** The addon's path, for worker threads that load it themselves (null: not available). */
export const NATIVE_PREFILTER_PATH: string | null = loaded?.path ?? null;

let active: NativePrefilter | null = loaded?.addon ?? null;

/** The native pre-filter, or null when it is not built or turned off. */
export function nativePrefilter(): NativePrefilter | null {
  return active;
}

/** Tests: run this process's stream redaction with (the loaded addon) or without it. */
export function useNativePrefilter(on: boolean): void {
  active = on ? (loaded?.addon ?? null) : null;
}
