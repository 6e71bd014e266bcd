/**
 * The payload index, compared with the payload's entries as it streams.
 *
 * The index is the last payload member, so every entry has been read (and hashed) when it
 * arrives. Parsed whole, a 65k-artifact index costs its bytes, their string and the parsed
 * objects at once (~70 MB at the end of a verify or restore, on top of everything held): this
 * reads it one artifact at a time instead and checks each against the entries read, keeping
 * only a position per entry name and the findings.
 *
 * It relies on the index being canonical JSON (docs/FORMAT.md §3.2, as memsnap writes it):
 * `{"artifacts":[{"kind":…},…],"format":"memsnap-index","snapshot_id":"…"}` with no
 * whitespace, every artifact an object whose first key is `kind`. In valid JSON a `"`
 * preceded by `{` always opens a key, so `},{"kind":"` occurs only between two artifacts and
 * `}],"format":"` only after the last one: the bytes split at them without a tokenizer. An
 * index in any other form is reported as not parsing (an index that is not canonical JSON is
 * not a memsnap index).
 */
import type { Finding } from "../errors.js";
import type { IndexEntry } from "../format/manifest.js";
import { chunkedProblem } from "../format/chunked.js";
import type { EntryTable } from "./entry-table.js";

const PREFIX = Buffer.from('{"artifacts":[', "utf8");
const EMPTY = Buffer.from('{"artifacts":[]', "utf8");
const SEP = Buffer.from('},{"kind":"', "utf8");
const END = Buffer.from('}],"format":"', "utf8");
/** One artifact's JSON, and the document's tail, may not be longer. */
const ELEMENT_MAX = 1 << 20;

/** What the streamed index held besides its artifacts. */
/**
 * Why an index artifact (from the payload, so from the bundle) cannot be used, or null: a field
 * of another type than memsnap writes (`unsafe: false`; a value such as an array nested 200,000
 * deep would otherwise reach String() in a message, Date.parse or a chmod), or a path that is not
 * under the layer the entry names (`unsafe: true`: restore applies the entry's mode and mtime
 * under that layer's directory). With `segments`, also each segment of the path: no empty, `.`
 * or `..` segment and no NUL (for readers that use the index's paths without matching them to
 * payload entries, whose names are checked as they are read).
 */
export function artifactProblem(a: unknown, segments: boolean): { unsafe: boolean; message: string } | null {
  if (typeof a !== "object" || a === null || Array.isArray(a) || typeof (a as IndexEntry).path !== "string") {
    return { unsafe: false, message: "an artifact is not an object with a path" };
  }
  const e = a as IndexEntry;
  const named = JSON.stringify(e.path.slice(0, 200));
  if (
    typeof e.layer !== "string" ||
    typeof e.kind !== "string" ||
    !Number.isSafeInteger(e.size) ||
    e.size < 0 ||
    typeof e.sha256 !== "string" ||
    (e.mtime !== undefined && typeof e.mtime !== "string") ||
    (e.mode !== undefined && typeof e.mode !== "number") ||
    (e.ref !== undefined && typeof e.ref !== "string")
  ) {
    return { unsafe: false, message: `artifact ${named} is malformed` };
  }
  if (!e.path.startsWith(`${e.layer}/`)) {
    return {
      unsafe: true,
      message: `index entry ${named} is not under the layer it names (${JSON.stringify(e.layer.slice(0, 80))})`,
    };
  }
  if (segments && (e.path.includes("\0") || e.path.split("/").some((x) => x === "" || x === "." || x === ".."))) {
    return { unsafe: true, message: `index entry ${named} is not a relative path of plain segments` };
  }
  return null;
}

export interface IndexTail {
  format: unknown;
  snapshot_id: unknown;
}

/** Splits canonical index bytes into artifacts as they arrive. */
class IndexSplitter {
  #carry: Buffer = Buffer.alloc(0);
  #state: "prefix" | "first" | "elements" | "tail" | "bad" = "prefix";
  #why = "";
  #tail: Buffer[] = [];
  #tailLen = 0;
  readonly #onArtifact: (json: string) => void;

  constructor(onArtifact: (json: string) => void) {
    this.#onArtifact = onArtifact;
  }

  #fail(why: string): void {
    this.#state = "bad";
    this.#why = why;
    this.#carry = Buffer.alloc(0);
    this.#tail = [];
  }

  push(chunk: Buffer): void {
    if (this.#state === "bad") return;
    if (this.#state === "tail") {
      this.#tailLen += chunk.length;
      if (this.#tailLen > ELEMENT_MAX) return this.#fail("its end is too long");
      this.#tail.push(Buffer.from(chunk)); // a copy: the chunk's memory is reused
      return;
    }
    let buf = this.#carry.length ? Buffer.concat([this.#carry, chunk]) : chunk;
    if (this.#state === "prefix") {
      if (buf.length < PREFIX.length + 1) {
        if (!PREFIX.subarray(0, Math.min(buf.length, PREFIX.length)).equals(buf.subarray(0, PREFIX.length)))
          return this.#fail("it is not canonical JSON");
        this.#carry = Buffer.from(buf);
        return;
      }
      if (!buf.subarray(0, PREFIX.length).equals(PREFIX)) return this.#fail("it is not canonical JSON");
      buf = buf.subarray(PREFIX.length);
      if (buf[0] === 0x5d) {
        // "]": no artifacts
        this.#state = "tail";
        this.#carry = Buffer.alloc(0);
        return this.push(Buffer.from(buf.subarray(1)));
      }
      this.#state = "elements";
    }
    // buf starts at an artifact's "{" (or inside one, carried).
    let at = 0;
    // END occurs once, after the last artifact: searched for once per chunk, not per artifact.
    const end = buf.indexOf(END);
    for (;;) {
      const sep = buf.indexOf(SEP, at);
      if (sep >= 0 && (end < 0 || sep < end)) {
        this.#onArtifact(buf.toString("utf8", at, sep + 1));
        at = sep + 2;
        continue;
      }
      if (end >= 0) {
        this.#onArtifact(buf.toString("utf8", at, end + 1));
        this.#state = "tail";
        this.#carry = Buffer.alloc(0);
        return this.push(Buffer.from(buf.subarray(end + 2)));
      }
      break;
    }
    if (buf.length - at > ELEMENT_MAX) return this.#fail("an artifact in it is too long");
    this.#carry = Buffer.from(buf.subarray(at)); // a copy: the chunk's memory is not pinned
  }

  /** The tail's fields, or an error message. */
  end(): IndexTail | string {
    if (this.#state === "bad") return this.#why;
    if (this.#state !== "tail") return "it ends inside its artifacts";
    try {
      const doc = JSON.parse(Buffer.concat([EMPTY, ...this.#tail]).toString("utf8")) as Record<string, unknown>;
      if (typeof doc !== "object" || doc === null || Array.isArray(doc)) return "it is not an object";
      return { format: doc.format, snapshot_id: doc.snapshot_id };
    } catch (e) {
      return (e as Error).message;
    }
  }
}

/**
 * Compares the streamed index with the payload entries read before it, producing exactly the
 * findings, in the same order, that comparing the parsed index does (compareWithIndex): an
 * artifact listed twice (when seen again; the later listing is the one compared); then per
 * entry in payload order a duplicate, an entry not in the index, or a size/SHA-256 mismatch;
 * then the indexed artifacts missing from the payload, in index order. Memory: a position per
 * distinct entry name and the findings, never the index.
 */
export class IndexComparer {
  readonly #entries: EntryTable;
  /** Per entry: 1 when an index artifact lists it. */
  readonly #listed: Uint8Array;
  /** Per entry position, the mismatch with the (last) listing of it. */
  readonly #mismatch = new Map<number, Finding>();
  /** Indexed paths with no entry, in the order first listed. */
  readonly #absent = new Set<string>();
  readonly #twice: Finding[] = [];
  readonly #splitter: IndexSplitter;
  #parseError: string | null = null;

  readonly #onRef: ((a: IndexEntry) => void) | undefined;
  /** Paths listed as references to a base (manifest_version 2), to refuse one listed twice. */
  readonly #refs = new Set<string>();

  /**
   * With `onRef` (a manifest_version 2 bundle), an artifact with a `ref` is a reference to a base:
   * not expected among the entries, handed to `onRef` instead.
   */
  readonly #onMatch: ((a: IndexEntry) => void) | undefined;

  /** A manifest_version 4 bundle: an artifact with `ranges` is chunked (format/chunked.ts). */
  readonly #chunked: boolean;

  /**
   * `onMatch`: each artifact whose entry is in the payload with the size and SHA-256 the index
   * lists (a restore gives the file the index's mode and mtime then). With `chunked`, a chunked
   * artifact's entry holds its stored ranges (`stored_size`, `stored_sha256`); once matched, the
   * artifact goes to `onRef` too, for its other ranges are in bases.
   */
  constructor(
    entries: EntryTable,
    onRef?: (a: IndexEntry) => void,
    onMatch?: (a: IndexEntry) => void,
    chunked = false,
  ) {
    this.#entries = entries;
    this.#onRef = onRef;
    this.#onMatch = onMatch;
    this.#chunked = chunked && onRef !== undefined;
    this.#listed = new Uint8Array(entries.length);
    this.#splitter = new IndexSplitter((json) => this.#artifact(json));
  }

  push(chunk: Buffer): void {
    this.#splitter.push(chunk);
  }

  #artifact(json: string): void {
    if (this.#parseError !== null) return;
    let a: IndexEntry;
    try {
      a = JSON.parse(json) as IndexEntry;
    } catch (e) {
      this.#parseError = (e as Error).message;
      return;
    }
    if (typeof a !== "object" || a === null || Array.isArray(a) || typeof a.path !== "string") {
      this.#parseError = "an artifact is not an object with a path";
      return;
    }
    const problem = artifactProblem(a, true);
    if (problem?.unsafe) {
      this.#twice.push({ code: "MEMSNAP_UNSAFE_PATH", message: problem.message, path: a.path });
      return;
    }
    if (problem) {
      this.#parseError = problem.message;
      return;
    }
    const j = this.#entries.position(a.path);
    const twice = (): void => {
      this.#twice.push({ code: "MEMSNAP_INDEX_MISMATCH", message: `the index lists ${a.path} twice`, path: a.path });
    };
    const chunked = this.#chunked && a.ranges !== undefined;
    if (chunked) {
      const why = chunkedProblem(a as unknown as Record<string, unknown>);
      if (why !== null) {
        this.#parseError = `artifact ${JSON.stringify(a.path.slice(0, 200))}: ${why}`;
        return;
      }
    }
    if (this.#onRef && a.ref !== undefined) {
      if (this.#refs.has(a.path) || this.#absent.has(a.path) || (j !== undefined && this.#listed[j] === 1)) twice();
      this.#refs.add(a.path);
      if (j !== undefined) {
        this.#twice.push({
          code: "MEMSNAP_INDEX_MISMATCH",
          message: `${a.path} is both in the payload and a reference to a base`,
          path: a.path,
        });
        this.#listed[j] = 1;
      }
      this.#onRef(a);
      return;
    }
    if (this.#refs.has(a.path)) twice();
    if (j === undefined) {
      if (this.#absent.has(a.path)) twice();
      this.#absent.add(a.path);
      return;
    }
    if (this.#listed[j] === 1) twice();
    this.#listed[j] = 1;
    const got = { name: this.#entries.name(j), size: this.#entries.size(j) };
    const want = chunked ? { size: a.stored_size!, sha256: a.stored_sha256! } : a;
    if (want.size !== got.size || want.sha256 !== this.#entries.sha256(j)) {
      this.#mismatch.set(j, {
        code: "MEMSNAP_ARTIFACT_HASH_MISMATCH",
        message:
          want.size !== got.size
            ? `${got.name}: ${got.size} bytes, index says ${want.size}`
            : `${got.name}: SHA-256 differs from the index`,
        path: got.name,
      });
    } else {
      this.#mismatch.delete(j);
      this.#onMatch?.(a);
      if (chunked) this.#onRef!(a);
    }
  }

  /** The index's other fields and the comparison's findings, or why the index does not parse. */
  end(): { tail: IndexTail; findings: Finding[] } | { error: string } {
    const tail = this.#splitter.end();
    if (typeof tail === "string") return { error: tail };
    if (this.#parseError !== null) return { error: this.#parseError };
    const findings: Finding[] = [...this.#twice];
    for (let j = 0; j < this.#entries.length; j++) {
      const name = this.#entries.name(j);
      if (this.#entries.position(name) !== j) {
        findings.push({ code: "MEMSNAP_INDEX_MISMATCH", message: `duplicate payload entry ${name}`, path: name });
      } else if (this.#listed[j] === 0) {
        findings.push({
          code: "MEMSNAP_INDEX_MISMATCH",
          message: `payload entry ${name} is not in the index`,
          path: name,
        });
      } else {
        const m = this.#mismatch.get(j);
        if (m) findings.push(m);
      }
    }
    for (const p of this.#absent)
      findings.push({
        code: "MEMSNAP_INDEX_MISMATCH",
        message: `indexed artifact ${p} is missing from the payload`,
        path: p,
      });
    return { tail, findings };
  }
}
