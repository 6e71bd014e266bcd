// Hostile chunked index entries (manifest_version 4, docs/FORMAT.md §6.1): an artifact whose
// bytes are ranges stored in the bundle or read from the entry at its path in a base. One real
// base sits beside the cases (written by make-hostile from `beside`); every case is sealed and
// its payload hash matches, so only the ranges lie: past the base entry's end, not summing to
// the size, reading a base not declared or the bundle itself, overlapping, too many, in a layer
// that spools, alongside a ref, or reassembling to other bytes. Restore refuses each before
// anything leaves staging (ranges are checked before a byte of the base is written).
import { HOSTILE_ID, sha } from "../lib/hostile-bundle.mjs";

const BASE_ID = "01JHXST1E00000000000000BSE";
const OTHER_ID = "01JHXST1E00000000000000TH3";
const BASE_DATA = Buffer.from(Array.from({ length: 200 }, (_, i) => `{"line":${i},"text":"the base's record number ${i}"}\n`).join(""));
const TAIL = Buffer.from('{"line":200,"text":"appended"}\n');
const WHOLE = Buffer.concat([BASE_DATA, TAIL]);

/** The manifest JSON of a container built by the builder. */
function manifestOf(bytes) {
  const size = (at) => parseInt(bytes.toString("latin1", at + 124, at + 135).replace(/\0.*$/, "").trim(), 8);
  const p = size(0);
  const at = 512 + p + ((512 - (p % 512)) % 512);
  return JSON.parse(bytes.toString("utf8", at + 512, at + 512 + size(at)));
}

export default function ({ bundle }) {
  const base = bundle([{ name: "memory/log.jsonl", data: BASE_DATA, kind: "jsonl" }], { id: BASE_ID });
  const baseSeal = manifestOf(base).seal;
  const cases = [];
  /**
   * A chunked bundle: its payload entry holds `stored`, its index entry lists `ranges` for an
   * artifact of `size` bytes hashing to `sha256` (both the real appended log's unless changed).
   */
  const chunked = (file, { stored = TAIL, ranges = [[BASE_DATA.length, BASE_ID, 0], [TAIL.length]], size = WHOLE.length, sha256 = sha(WHOLE),
    fields = {}, layer = { name: "memory", kind: "files" }, bases = [{ snapshot_id: BASE_ID, seal: baseSeal }], version = 4,
    exit, code, note, encrypt = [false, true], check }) => {
    const path = `${layer.name}/log.jsonl`;
    for (const enc of encrypt) {
      cases.push({
        file: enc ? file.replace(/\.memsnap$/, "-encrypted.memsnap") : file,
        bytes: bundle([{ name: path, data: stored, kind: "jsonl" }], {
          layer, encrypt: enc,
          indexFor: (_e, a) => ({ ...a, size, sha256, ranges, stored_size: stored.length, stored_sha256: sha(stored), ...fields }),
          mutate: (b) => {
            b.manifest_version = version;
            b.bases = bases;
            b.layers[0].referenced = 1;
            b.payload.bytes = size;
            return b;
          },
        }),
        exit: typeof exit === "function" ? exit(enc) : exit, code: typeof code === "function" ? code(enc) : code,
        ...(enc ? { key: true } : {}), ...(check ? { check } : {}), note,
        ...(cases.length === 0 ? { beside: [{ file: `${BASE_ID}.memsnap`, bytes: base }] } : {}),
      });
    }
  };
  // Found in the plaintext manifest's index (parseManifest: corrupt), or in the encrypted payload's index as it streams.
  const malformed = { exit: 3, code: (enc) => (enc ? "MEMSNAP_INDEX_MISMATCH" : "MEMSNAP_MANIFEST_CORRUPT") };

  chunked("chunked-valid.memsnap", {
    exit: 0, code: "", check: "custom", note: "the control: a well-formed chunked bundle restores the appended log byte for byte (test/pipeline/chunked.test.ts)",
  });
  chunked("chunked-range-past-base-entry.memsnap", {
    ranges: [[BASE_DATA.length, BASE_ID, 100], [TAIL.length]], exit: 9, code: "MEMSNAP_UNSAFE_BUNDLE",
    note: "a range reads past the end of the base's entry: refused before any of its bytes is written",
  });
  chunked("chunked-sum-not-size.memsnap", {
    ranges: [[BASE_DATA.length - 1, BASE_ID, 0], [TAIL.length]], ...malformed, note: "the ranges sum to one byte less than the artifact's size",
  });
  chunked("chunked-stored-sum.memsnap", {
    ranges: [[BASE_DATA.length - 1, BASE_ID, 0], [TAIL.length + 1]], ...malformed, note: "the stored ranges sum to more than the payload entry's stored_size",
  });
  chunked("chunked-base-not-declared.memsnap", {
    ranges: [[BASE_DATA.length, OTHER_ID, 0], [TAIL.length]], ...malformed, note: "a range reads a bundle the manifest does not list as a base",
  });
  chunked("chunked-reads-itself.memsnap", {
    ranges: [[BASE_DATA.length, HOSTILE_ID, 0], [TAIL.length]], ...malformed, note: "a range reads the bundle itself (a cycle)",
  });
  chunked("chunked-overlap.memsnap", {
    ranges: [[100, BASE_ID, 0], [BASE_DATA.length - 100, BASE_ID, 50], [TAIL.length]], ...malformed,
    note: "two ranges read the same base bytes (a small base blown up into a big file)",
  });
  {
    const ranges = Array.from({ length: 65_537 }, (_, i) => [1, BASE_ID, i]);
    chunked("chunked-too-many-ranges.memsnap", {
      ranges, stored: Buffer.alloc(0), size: 65_537, ...malformed, encrypt: [false], note: "more ranges than any entry may list",
    });
  }
  chunked("chunked-huge.memsnap", {
    ranges: [[2 ** 41, BASE_ID, 0], [TAIL.length]], size: 2 ** 41 + TAIL.length, ...malformed, note: "an artifact of 2 TiB reassembled from a small base",
  });
  chunked("chunked-with-ref.memsnap", { fields: { ref: BASE_ID }, ...malformed, note: "a chunked entry that is also a whole reference" });
  chunked("chunked-no-base-range.memsnap", {
    ranges: [[TAIL.length]], size: TAIL.length, sha256: sha(TAIL), ...malformed, note: "a chunked entry that reads no base",
  });
  chunked("chunked-kv-layer.memsnap", {
    layer: { name: "kv", kind: "kv", schema_version: 2 }, exit: 9, code: "MEMSNAP_UNSAFE_BUNDLE",
    note: "a chunked entry in a layer whose restore spools its artifacts (KV pages)",
  });
  chunked("chunked-other-bytes.memsnap", {
    sha256: sha(Buffer.from("something else")), exit: 3, code: "MEMSNAP_ARTIFACT_HASH_MISMATCH",
    note: "well-formed ranges that reassemble to bytes other than the index's SHA-256",
  });
  chunked("chunked-stored-differ.memsnap", {
    fields: { stored_sha256: sha(Buffer.from("not the tail")) }, exit: 3, code: "MEMSNAP_ARTIFACT_HASH_MISMATCH",
    note: "the payload entry's bytes are not the stored ranges the index lists",
  });
  chunked("chunked-base-lacks-path.memsnap", {
    layer: { name: "notes", kind: "files" }, exit: 3, code: "MEMSNAP_INDEX_MISMATCH",
    note: "a range reads the entry at the artifact's path in a base that has no such entry",
  });
  chunked("chunked-in-version-3.memsnap", {
    version: 3, ...{ exit: 3, code: "MEMSNAP_ARTIFACT_HASH_MISMATCH" },
    note: "ranges in a version 3 bundle are an unknown key: the entry is a whole artifact, and its bytes are not",
  });
  return cases;
}
