/**
 * The redaction pre-filter in the SQLite worker: is a text (or a range of bytes) a candidate,
 * i.e. could any redaction rule match in it? The same finders and JSON-escape test as the
 * redactor (src/redact/prefilter.ts, src/redact/json.ts), with the native pre-filter in front
 * when it is built.
 */
import { createRequire } from "node:module";
import { workerData } from "node:worker_threads";
import { decodeText, hidingEscapeAt } from "../../redact/escapes.js";
import { HIDING_ESCAPE } from "../../redact/json.js";
import type { NativePrefilter } from "../../redact/native.js";
import { FINDERS } from "../../redact/prefilter.js";
import { gcPacer } from "../../util/gc.js";
import type { SqliteWorkerData } from "./worker-types.js";

// The redaction pre-filter (src/redact/prefilter.ts): candidate(t) is "any scanner matches",
// tested with the very finders the redactor runs.
function rawCandidate(t: string): boolean {
  for (const f of FINDERS) if (f.cursor(t)(0) >= 0) return true;
  return false;
}
// The production redactor's candidate() (src/redact/index.ts) is also true for a text whose
// JSON escapes decode to a candidate ("ghp_…": src/redact/json.ts, escapedCandidate),
// with the same code (src/redact/escapes.ts) and regex.
export function candidate(t: string): boolean {
  if (rawCandidate(t)) return true;
  if (t.indexOf("\\") < 0 || !HIDING_ESCAPE.test(t)) return false;
  return rawCandidate(decodeText(t));
}

/** The native pre-filter with the page walk of native/prefilter/sqlite_walk.c (see ./worker-walk.ts). */
export type NativeWithWalk = NativePrefilter & { sqliteWalk?: unknown; sqliteWalkVersion?: number };

// The native pre-filter (src/redact/native.ts), when built: scan(bytes, a, e) is -1 only when
// the finders find nothing in those bytes as UTF-8 text and as a latin1 view; with no JSON
// escape that can hide a secret either, candidate() is false, so the common "no" is answered
// without decoding; any other answer goes to candidate().
const prefilterPath = (workerData as SqliteWorkerData).prefilterPath;
export const NATIVE: NativeWithWalk | null = prefilterPath
  ? (createRequire(import.meta.url)(prefilterPath) as NativeWithWalk)
  : null;

/** A Buffer with Node's own decoders (what `toString` calls, without its argument checks). */
export type Sliceable = Buffer & { utf8Slice(a: number, e: number): string; latin1Slice(a: number, e: number): string };
/** candidate() of b[a, e) decoded by `decode` ("utf8Slice" or "latin1Slice"). */
export function candidateIn(b: Buffer, a: number, e: number, decode: "utf8Slice" | "latin1Slice"): boolean {
  if (NATIVE !== null && NATIVE.scan(b, a, e) === -1 && hidingEscapeAt(b, a, e) < 0) return false;
  const s = (b as Sliceable)[decode](a, e);
  collectScanned(s.length);
  return candidate(s);
}
// A run of token characters with a letter and a digit: what is left of a secret whose start
// (and with it the pre-filter's anchor) was overwritten in stale space.
const TOKEN_RUN = /[A-Za-z0-9+\/_=-]{24,}/g;
export function tokenRun(s: string): boolean {
  TOKEN_RUN.lastIndex = 0;
  for (let m = TOKEN_RUN.exec(s); m; m = TOKEN_RUN.exec(s)) {
    if (/[0-9]/.test(m[0]) && /[A-Za-z]/.test(m[0])) return true;
  }
  return false;
}

const ZERO = Buffer.alloc(65536);
/**
 * The verdict on one stale region b[a, e) of a page (a latin1 view of its bytes, as
 * src/redact/stream.ts reads a file): null when it is all zero or clean, else counted in
 * `st.stale_bytes` and tested with the pre-filter, then for a long token run.
 */
export function staleVerdict(
  b: Buffer,
  a: number,
  e: number,
  st: { stale_bytes: number },
): "stale_candidate" | "stale_token" | null {
  if (e <= a || ZERO.compare(b, a, e, 0, e - a) === 0) return null;
  st.stale_bytes += e - a;
  if (candidateIn(b, a, e, "latin1Slice")) return "stale_candidate";
  if (tokenRun((b as Sliceable).latin1Slice(a, e))) return "stale_token";
  return null;
}

// A string of 64K characters or more (group_concat of a table, a long value, a two-byte batch)
// is a large object to V8, which puts it straight into its old generation, where it waits for a
// full collection: left to V8's pacing, two scanning workers held ~100 MiB of such dead text at
// peak. A full GC every 32 MiB of them (a few ms each, the live heap is tiny) keeps that flat.
// The page walk's batches (below TEXT_BATCH) are young strings, freed by scavenges.
const LARGE_CHARS = 1 << 16;
const largeGc = gcPacer(32 * 1024 * 1024, "major");
/** Count a string just scanned (of `n` characters) towards the next full GC. */
export function collectScanned(n: number): void {
  if (n < LARGE_CHARS) return;
  largeGc(n);
}
