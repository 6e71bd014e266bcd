/**
 * The memsnap KV dump format (docs/FORMAT.md "KV dump format") and the `kv` layer's names: the
 * documents' names and caps, the byte-plane shuffle, and the page artifacts' paths. The dump
 * manifest is read in manifest.ts, the layer's kv-index.json in index-format.ts.
 */
import { MemsnapError } from "../../errors.js";
import { PLANES_MAX_BYTES } from "../../util/planes.js";

export const KV_MANIFEST = "kv-manifest.json";
export const KV_INDEX = "kv-index.json";
export const KV_DUMP_FORMAT = "memsnap-kv-dump";
export const KV_INDEX_FORMAT = "memsnap-kv-index";
/** Pages larger than this are refused (a page is held in memory while it is hashed). */
export const KV_MAX_PAGE_BYTES = PLANES_MAX_BYTES;
/**
 * A generic paged dump's pages are at least this big: the index spends ~30 bytes on each page, and tiny pages of a
 * big file would make it larger than the pages' savings.
 */
export const KV_MIN_PAGE_BYTES = 512;
/** kv-manifest.json larger than this is refused. */
export const KV_MANIFEST_MAX_BYTES = 512 * 1024 * 1024;

function invalid(msg: string, path?: string): MemsnapError {
  return new MemsnapError("MEMSNAP_SOURCE_INVALID", msg, {
    ...(path ? { path } : {}),
    hint: 'fix the KV dump (see docs/FORMAT.md "KV dump format") or the kv source\'s format/shape in memsnap.json',
  });
}
export { invalid as kvInvalid };

/** A relative POSIX path of plain segments (no `..`, `.`, empty, absolute, backslash or NUL). */
export function safeRel(p: unknown): p is string {
  if (typeof p !== "string" || p === "" || p.startsWith("/") || p.includes("\\") || p.includes("\0")) return false;
  return p.split("/").every((s) => s !== "" && s !== "." && s !== "..");
}

/** Growable typed array. */
export class Grow<T extends Float64Array | Int32Array | Uint8Array> {
  a: T;
  length = 0;
  constructor(private readonly make: (n: number) => T) {
    this.a = make(1024);
  }
  push(v: number): number {
    if (this.length === this.a.length) {
      const b = this.make(this.a.length * 2);
      b.set(this.a);
      this.a = b;
    }
    this.a[this.length] = v;
    return this.length++;
  }
}

// ------------------------------------------------------------------------------ byte-plane shuffle

export { shuffle, unshuffle } from "../../util/planes.js";

/** Where a page first occurs: data file `file` (its position in kv-index `files`) at byte `offset`. */
export interface PagePlace {
  file: number;
  offset: number;
}

/**
 * A stored page's artifact path: `pages/<sha256>`; byte-plane shuffled, `pages/<sha256>.s<elem>`;
 * (layer schema 2) an unshuffled page with the place of its first occurrence,
 * `pages/<sha256>@<file>.<offset>`, which restore writes straight into place; (layer schema 3) a
 * shuffled page with its place, `pages/<sha256>.s<elem>@<file>.<offset>`, which restore puts
 * back in element order, checks against `<sha256>` and writes into place.
 */
export const pageArtifact = (hex: string, elem: number, at?: PagePlace): string =>
  `pages/${hex}${elem > 1 ? `.s${elem}` : ""}${at ? `@${at.file}.${at.offset}` : ""}`;
/** Groups: 1 the SHA-256, 2 the shuffle element size, 3 and 4 the place's file and offset. */
export const PAGE_ARTIFACT_RE = /^pages\/([0-9a-f]{64})(?:\.s([24]))?(?:@(0|[1-9][0-9]{0,8})\.(0|[1-9][0-9]{0,14}))?$/;
/**
 * A placed page may not end past this offset in its file (a sparse 1 TiB file is the most a hostile bundle can
 * ask for).
 */
export const PLACE_MAX_END = 2 ** 40;
/** The data files of a kv layer (files with tiles) hold at most this many bytes in all, as a place's bound. */
export const KV_MAX_RESTORE_BYTES = PLACE_MAX_END;
/** The prefix of the work directory a rebuild moves the bundle-side artifacts into: no dump file may use it. */
export const KV_WORK_PREFIX = ".memsnap-work-kv-";

/** The page's place, when its artifact path carries one (with its planes, for a shuffled page). */
export function pagePlace(rel: string): (PagePlace & { planes?: { elem: number; sha256: string } }) | null {
  const m = PAGE_ARTIFACT_RE.exec(rel);
  if (!m || m[3] === undefined) return null;
  const at = { file: Number(m[3]), offset: Number(m[4]) };
  return m[2] ? { ...at, planes: { elem: Number(m[2]), sha256: m[1]! } } : at;
}
