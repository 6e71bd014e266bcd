/**
 * Regions: the parts of a text the full rule set looks at.
 *
 * A region is a line holding a pre-filter hit ([line start, newline) — two lines never
 * overlap, so adjacent hit lines stay separate regions), extended to the END line of a PEM
 * block that begins in it. In a very long line (plain text only) a region is a window of
 * ±{@link WINDOW} around each hit instead, widened to whitespace. Everything outside the
 * regions is copied as it is.
 *
 * The same plan is computed for a whole text at once and, while streaming, for each block:
 * a block is cut only at a line start that no region reaches past (an open PEM block is
 * carried into the next block), so both give the same regions.
 */
import { FINDERS, type Finder } from "./prefilter.js";
import { pemExtent } from "./rules.js";

export interface Region {
  start: number;
  end: number;
}

export interface RegionPlan {
  /** Sorted, disjoint regions, all ending before `cut`. */
  regions: Region[];
  /** The prefix of the text these regions are final for; the rest is carried. */
  cut: number;
}

/** A line longer than this (plain text) gets windows around its hits instead of being one region. */
export const LONG_LINE = 16 * 1024;
/** Half-width of a long-line window; larger than the longest match of any rule. */
export const WINDOW = 4 * 1024;
/** How far a window edge may move to reach whitespace. */
const SNAP = 256;

function lineStart(t: string, p: number): number {
  return p === 0 ? 0 : t.lastIndexOf("\n", p - 1) + 1;
}

/** First `needle` starting in [from, to), searching no further. */
function findIn(t: string, needle: string, from: number, to: number): number {
  if (from >= to) return -1;
  const k = t.substring(from, Math.min(t.length, to + needle.length - 1)).indexOf(needle);
  return k < 0 ? -1 : from + k;
}

function lineEnd(t: string, p: number): number {
  const e = t.indexOf("\n", p);
  return e < 0 ? t.length : e;
}

const isWs = (c: number): boolean => c === 0x20 || c === 0x09 || c === 0x0a || c === 0x0d;
/** UTF-8 continuation byte in a latin1 view (never the start of a character). */
const isCont = (c: number): boolean => c >= 0x80 && c <= 0xbf;

/** Move a window start back to just after whitespace (or at least off a UTF-8 continuation byte / low surrogate). */
function snapBack(t: string, p: number, min: number): number {
  for (let q = p; q > min && q > p - SNAP; q--) if (isWs(t.charCodeAt(q - 1))) return q;
  let q = p;
  while (q > min && (isCont(t.charCodeAt(q)) || (t.charCodeAt(q) & 0xfc00) === 0xdc00)) q--;
  return q;
}

/** Move a window end forward to whitespace (or at least to a character start). */
function snapFwd(t: string, p: number, max: number): number {
  for (let q = p; q < max && q < p + SNAP; q++) if (isWs(t.charCodeAt(q))) return q;
  let q = p;
  while (q < max && (isCont(t.charCodeAt(q)) || (t.charCodeAt(q) & 0xfc00) === 0xdc00)) q++;
  return q;
}

/**
 * Plan the regions of `text`. With `final` false more text may follow: the plan stops at the
 * last line start that no region crosses (`cut`). `windows` false keeps long lines whole (JSON,
 * whose strings must be tokenized from the line start). `finders` is for tests (the pre-filter's
 * reference regexes against its fast finders).
 */
export function planRegions(
  text: string,
  final: boolean,
  windows = true,
  finders: readonly Finder[] = FINDERS,
): RegionPlan {
  const raw: Region[] = [];
  let pending = -1; // line start of a PEM block whose end is not known yet
  for (const f of finders) {
    const next = f.cursor(text);
    for (let p = next(0); p >= 0;) {
      if (pending >= 0 && p >= pending) break;
      const ls = lineStart(text, p);
      const le = lineEnd(text, p);
      const long = windows && le - ls > LONG_LINE;
      let start = long ? snapBack(text, Math.max(ls, p - WINDOW), ls) : ls;
      let end = long ? snapFwd(text, Math.min(le, p + WINDOW), le) : le;
      // a PEM block that begins in the region (at this hit or after it) extends it to its end
      let undecided = false;
      for (let b = findIn(text, "-----BEGIN", start, end); b >= 0; b = findIn(text, "-----BEGIN", b + 10, end)) {
        const ext = pemExtent(text, b, final);
        if (ext === -1) {
          undecided = true;
          break;
        }
        if (ext !== null && ext > end) end = long && ext <= le ? snapFwd(text, ext, le) : lineEnd(text, ext);
      }
      if (undecided) {
        pending = pending < 0 ? ls : Math.min(pending, ls);
        break;
      }
      raw.push({ start, end });
      p = next(Math.max(p + 1, end));
    }
  }
  raw.sort((a, b) => a.start - b.start || a.end - b.end);
  const regions: Region[] = [];
  for (const r of raw) {
    const last = regions[regions.length - 1];
    if (last && r.start < last.end) last.end = Math.max(last.end, r.end);
    else regions.push({ ...r });
  }
  if (final) return { regions, cut: text.length };
  let cut = text.lastIndexOf("\n") + 1;
  if (pending >= 0) cut = Math.min(cut, pending);
  // A region that reaches into the unfinished last line moves the cut to its own line start.
  for (let i = regions.length - 1; i >= 0; i--) {
    const r = regions[i]!;
    if (r.end < cut) break;
    if (r.start < cut && r.end >= cut) cut = lineStart(text, r.start);
  }
  return { regions: regions.filter((r) => r.end < cut), cut };
}
