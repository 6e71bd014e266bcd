import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { encodeIndex, type IndexEntry } from "../../src/format/manifest.js";
import fc from "fast-check";
import { IndexSpill, entryJson } from "../../src/snapshot/index-spill.js";
import { canonicalJson } from "../../src/util/canonical-json.js";

function entry(i: number, name: string): IndexEntry {
  return {
    path: `mem/${name}-${i}`, layer: "mem", kind: i % 2 ? "file" : "kv-page", size: i * 7,
    sha256: (i * 2654435761 % 2 ** 32).toString(16).padStart(64, "0"), mode: 0o644, mtime: new Date(i * 1000).toISOString(),
  };
}

describe("index spill", () => {
  for (const [label, n, name] of [["empty", 0, "x"], ["one", 1, "x"], ["unicode and escapes", 50, "ünï \"q\" \\ ✓"], ["over 1 MiB", 9000, "a".repeat(60)]] as const) {
    it(`streams exactly encodeIndex's bytes: ${label}`, () => {
      const dir = mkdtempSync(join(tmpdir(), "memsnap-spill-"));
      const spill = new IndexSpill(join(dir, "index.spill"));
      try {
        const entries = Array.from({ length: n }, (_, i) => entry(i, name));
        for (const e of entries) spill.add(e);
        const parts: Buffer[] = [];
        for (const b of spill.document("01TESTSNAPSHOT")) parts.push(Buffer.from(b)); // pieces are reused: copy each
        const got = Buffer.concat(parts);
        const want = encodeIndex({ format: "memsnap-index", snapshot_id: "01TESTSNAPSHOT", artifacts: entries });
        expect(got.equals(want)).toBe(true);
        expect(spill.documentBytes("01TESTSNAPSHOT")).toBe(want.length);
        expect(spill.count).toBe(n);
      } finally {
        spill.close();
        rmSync(dir, { recursive: true, force: true });
      }
    });
  }

  it("entryJson is canonicalJson for any entry, and for entries with extra or missing keys", () => {
    const str = fc.string({ unit: "binary", maxLength: 24 });
    fc.assert(fc.property(str, str, str, fc.nat(), fc.nat(), str, str, (path, layer, kind, size, mode, mtime, sha256) => {
      const e: IndexEntry = { path, layer, kind, size, sha256, mode, mtime };
      expect(entryJson(e)).toBe(canonicalJson(e));
    }), { numRuns: 500 });
    const extra = { ...entry(3, "x"), ref: "01BASE" } as IndexEntry;
    expect(entryJson(extra)).toBe(canonicalJson(extra));
    expect(entryJson(extra)).toContain('"ref":"01BASE"');
    const { mode: _m, ...missing } = entry(4, "x");
    expect(entryJson(missing as IndexEntry)).toBe(canonicalJson(missing));
    expect(entryJson(missing as IndexEntry)).not.toContain('"mode"');
  });
});
