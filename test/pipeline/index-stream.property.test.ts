// The streamed index comparison (src/read/index-stream.ts) finds exactly what comparing
// the parsed index finds (compareWithIndex on a parsed index), in the same order, whatever the
// chunking of the index bytes and however index and entries disagree; an index that is not
// canonical JSON, or is cut short, is reported as not parsing.
import { createHash } from "node:crypto";
import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { encodeIndex, type IndexDocument, type IndexEntry, type Manifest } from "../../src/format/manifest.js";
import { IndexComparer } from "../../src/read/index-stream.js";
import { EntryTable } from "../../src/read/entry-table.js";
import { compareWithIndex, type PayloadEntry, type PayloadReadResult } from "../../src/read/read-payload.js";

/** The entries as readPayload records them. */
function tableOf(entries: PayloadEntry[]): EntryTable {
  const t = new EntryTable();
  for (const e of entries) t.add(e.name, e.size, Buffer.from(e.sha256, "hex"));
  return t;
}

const sha = (s: string): string => createHash("sha256").update(s).digest("hex");
const ID = "01JTESTINDEX0000000000000A";

function chunked(buf: Buffer, cuts: number[]): Buffer[] {
  const at = [...new Set(cuts.map((c) => c % (buf.length + 1)))].sort((a, b) => a - b);
  const out: Buffer[] = [];
  let prev = 0;
  for (const c of [...at, buf.length]) {
    out.push(buf.subarray(prev, c));
    prev = c;
  }
  return out;
}

/** Both ways: the parsed index through compareWithIndex, and the streamed one. */
function both(entries: PayloadEntry[], doc: IndexDocument, bytes: Buffer, cuts: number[]): { parsed: unknown; streamed: unknown } {
  const manifest = { snapshot_id: ID, payload: { sha256: "s", stored_size: 1, index_sha256: sha("x") } } as unknown as Manifest;
  const table = tableOf(entries);
  const base = { storedSha256: "s", storedSize: 1, entries: table, indexSha256: sha("x"), findings: [] };
  const parsed = compareWithIndex(manifest, { ...base, index: doc, indexCheck: null } as PayloadReadResult);
  const cmp = new IndexComparer(table);
  for (const c of chunked(bytes, cuts)) cmp.push(c);
  const r = cmp.end();
  if ("error" in r) return { parsed, streamed: r };
  const streamed = compareWithIndex(manifest, { ...base, index: null, indexCheck: { snapshotId: r.tail.snapshot_id, findings: r.findings } } as PayloadReadResult);
  return { parsed, streamed };
}

const name = fc.oneof(
  fc.constantFrom("kv/pages/a", "kv/pages/b", "mem/x.md", "mem/y.md", "mem/ü ñ.md", 'mem/quote"d', "mem/brace},{\"kind\":\"x", "db/z"),
  // (names a payload can hold: checkEntryName refuses empty, `.` and `..` segments and NUL before the comparer sees them)
  fc.string({ minLength: 1, maxLength: 12 }).filter((s) => !s.includes("\0") && s.split("/").every((x) => x !== "" && x !== "." && x !== "..")).map((s) => `l/${s}`),
);

describe("streamed index comparison", () => {
  it("property: the same findings as the parsed index, in the same order, for any chunking", () => {
    fc.assert(fc.property(
      fc.array(fc.tuple(name, fc.nat(5000), fc.nat(3)), { minLength: 0, maxLength: 12 }),
      fc.array(fc.tuple(fc.nat(20), fc.nat(4)), { maxLength: 6 }),
      fc.array(fc.nat(4000), { maxLength: 8 }),
      (raw, edits, cuts) => {
        const entries: PayloadEntry[] = raw.map(([n, size, h]) => ({ name: n, size, sha256: sha(`${n}${h}`) }));
        let artifacts: IndexEntry[] = entries.map((e) => ({ path: e.name, layer: e.name.split("/")[0]!, kind: "file", size: e.size, sha256: e.sha256, mode: 420, mtime: "2026-01-01T00:00:00.000Z" }));
        for (const [i, op] of edits) {
          const k = artifacts.length ? i % artifacts.length : 0;
          const a = artifacts[k];
          if (op === 0 && a) artifacts.splice(k, 1); // missing from the index
          else if (op === 1 && a) artifacts.push({ ...a }); // listed twice
          else if (op === 2 && a) artifacts[k] = { ...a, sha256: sha("other") }; // mismatch
          else if (op === 3) artifacts.push({ ...(a ?? artifacts[0] ?? { kind: "file", size: 1, sha256: sha("q"), mode: 420, mtime: "x" }), layer: "gone", path: `gone/${i}` } as IndexEntry); // not in the payload
          else if (a) artifacts = [...artifacts.slice(k), ...artifacts.slice(0, k)]; // another order
        }
        const doc: IndexDocument = { format: "memsnap-index", snapshot_id: ID, artifacts };
        const { parsed, streamed } = both(entries, doc, encodeIndex(doc), cuts);
        expect(streamed).toEqual(parsed);
      },
    ), { numRuns: 400 });
  });

  it("an index with no artifacts, and one chunk per byte", () => {
    const doc: IndexDocument = { format: "memsnap-index", snapshot_id: ID, artifacts: [] };
    const bytes = encodeIndex(doc);
    const { parsed, streamed } = both([{ name: "a/b", size: 1, sha256: sha("b") }], doc, bytes, [...bytes.keys()]);
    expect(streamed).toEqual(parsed);
    expect(parsed).toEqual([{ code: "MEMSNAP_INDEX_MISMATCH", message: "payload entry a/b is not in the index", path: "a/b" }]);
  });

  it("not canonical JSON, cut short, or an artifact that is not an object: reported as not parsing", () => {
    const doc: IndexDocument = { format: "memsnap-index", snapshot_id: ID, artifacts: [{ path: "a/b", layer: "a", kind: "file", size: 1, sha256: sha("b"), mode: 420, mtime: "t" }] };
    const good = encodeIndex(doc);
    const end = (b: Buffer): unknown => {
      const c = new IndexComparer(new EntryTable());
      c.push(b);
      return c.end();
    };
    expect(end(Buffer.from(JSON.stringify(doc, null, 1)))).toEqual({ error: "it is not canonical JSON" });
    expect(end(good.subarray(0, good.length - 5))).toHaveProperty("error");
    expect(end(good.subarray(0, 40))).toEqual({ error: "it ends inside its artifacts" });
    expect(end(Buffer.from('{"artifacts":[{"kind":"x"},{"kind":"y}],"format":"memsnap-index","snapshot_id":"a"}'))).toHaveProperty("error");
    expect(end(Buffer.from('{"artifacts":[{"kind":1}],"format":"memsnap-index","snapshot_id":"a"}'))).toEqual({ error: "an artifact is not an object with a path" });
    expect(end(good)).toMatchObject({ tail: { format: "memsnap-index", snapshot_id: ID }, findings: [{ message: "indexed artifact a/b is missing from the payload" }] });
  });
});
