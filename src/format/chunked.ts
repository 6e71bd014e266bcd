/**
 * Chunked index entries (manifest_version 4, docs/FORMAT.md §6.1): an artifact whose bytes are a
 * sequence of ranges, each either stored in this bundle's payload or a byte range of the payload
 * entry at the same path in one of the bundle's bases.
 *
 * The payload entry at the artifact's path holds the stored ranges back to back (`stored_size`
 * bytes hashing to `stored_sha256`); `size` and `sha256` are the whole artifact's, checked once
 * it is reassembled. A range never resolves through another range: a writer flattens a base's
 * own ranges into the bases that hold the bytes, so a reader needs no recursion, and the ranges
 * of one entry that read one base never overlap (each stored byte is used once per entry).
 */

/** `[length]`: the next `length` stored bytes; `[length, base, offset]`: bytes of a base's entry. */
export type ChunkRange = [number] | [number, string, number];

/** The fields a chunked index entry adds. */
export interface ChunkedFields {
  ranges: ChunkRange[];
  stored_size: number;
  stored_sha256: string;
}

/** The most ranges one entry may list (a writer stays far below: see snapshot/chunking.ts). */
export const CHUNKED_MAX_RANGES = 65_536;
/** The largest artifact a chunked entry may describe (a reassembly writes that much). */
export const CHUNKED_MAX_SIZE = 2 ** 40;

const ID = /^[0-7][0-9A-HJKMNP-TV-Z]{25}$/;
const isCount = (v: unknown): v is number => Number.isSafeInteger(v) && (v as number) >= 0;

/**
 * Why the chunked fields of index entry `e` (one with `ranges`) are malformed, or null: the
 * shape of every range, the lengths summing to `size` and the stored ones to `stored_size`, at
 * least one range read from a base, no `ref`, and no two ranges reading one base overlapping.
 * Whether each base is one of the bundle's, and each range within its base entry, is checked
 * where those are known (read/bases.ts).
 */
export function chunkedProblem(e: Record<string, unknown>): string | null {
  const r = e.ranges;
  if (!Array.isArray(r) || r.length === 0 || r.length > CHUNKED_MAX_RANGES)
    return `ranges is not an array of 1 to ${CHUNKED_MAX_RANGES} ranges`;
  if (e.ref !== undefined) return "a chunked entry has a ref";
  if (!isCount(e.stored_size) || typeof e.stored_sha256 !== "string" || !/^[0-9a-f]{64}$/.test(e.stored_sha256))
    return "stored_size or stored_sha256 is malformed";
  if (!isCount(e.size) || e.size > CHUNKED_MAX_SIZE) return `size is over ${CHUNKED_MAX_SIZE}`;
  let total = 0;
  let stored = 0;
  const byBase = new Map<string, [number, number][]>();
  for (const x of r as unknown[]) {
    if (!Array.isArray(x) || (x.length !== 1 && x.length !== 3) || !Number.isSafeInteger(x[0]) || (x[0] as number) < 1)
      return "a range is malformed";
    const len = x[0] as number;
    total += len;
    if (x.length === 1) {
      stored += len;
      continue;
    }
    const [, base, off] = x as [number, unknown, unknown];
    if (typeof base !== "string" || !ID.test(base) || !isCount(off) || off + len > Number.MAX_SAFE_INTEGER)
      return "a range is malformed";
    let l = byBase.get(base);
    if (!l) byBase.set(base, (l = []));
    l.push([off, len]);
  }
  if (total !== e.size) return `its ranges sum to ${total} bytes, the entry says ${String(e.size)}`;
  if (stored !== e.stored_size)
    return `its stored ranges sum to ${stored} bytes, the entry says ${String(e.stored_size)}`;
  if (byBase.size === 0) return "no range reads a base";
  for (const [base, l] of byBase) {
    l.sort((a, b) => a[0] - b[0]);
    for (let i = 1; i < l.length; i++)
      if (l[i - 1]![0] + l[i - 1]![1] > l[i]![0]) return `two ranges read the same bytes of base ${base}`;
  }
  return null;
}

/** The bases a chunked entry's ranges read. */
export function rangeBases(ranges: readonly ChunkRange[]): Set<string> {
  const out = new Set<string>();
  for (const r of ranges) if (r.length === 3) out.add(r[1]);
  return out;
}
