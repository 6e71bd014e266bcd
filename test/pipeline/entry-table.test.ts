/** EntryTable: the restore's per-entry record (names, sizes, binary SHA-256s). */
import { createHash } from "node:crypto";
import { describe, expect, it } from "vitest";
import { EntryTable } from "../../src/read/entry-table.js";

const digest = (s: string): Buffer => createHash("sha256").update(s).digest();

describe("EntryTable", () => {
  it("keeps every entry through growth, finds the first of a name, and sums sizes", () => {
    const t = new EntryTable();
    const N = 5000; // past several doublings of the typed arrays
    for (let i = 0; i < N; i++) t.add(`${i % 2 ? "kv" : "memory"}/e${i}`, i, digest(`e${i}`));
    t.add("kv/e1", 7, digest("again")); // a duplicate name: a second entry, not a second position
    expect(t.length).toBe(N + 1);
    for (const i of [0, 1, 1023, 1024, 4999]) {
      expect(t.name(i)).toBe(`${i % 2 ? "kv" : "memory"}/e${i}`);
      expect(t.size(i)).toBe(i);
      expect(t.sha256(i)).toBe(digest(`e${i}`).toString("hex"));
    }
    expect(t.position("kv/e1")).toBe(1);
    expect(t.get("kv/e1")).toBe(digest("e1").toString("hex"));
    expect(t.sha256(N)).toBe(digest("again").toString("hex"));
    expect(t.get("nope")).toBeUndefined();
    expect(t.position("nope")).toBeUndefined();
    const all = (N * (N - 1)) / 2 + 7;
    expect(t.bytes()).toBe(all);
    const kv = Array.from({ length: N }, (_, i) => i).filter((i) => i % 2).reduce((a, b) => a + b, 0) + 7;
    expect(t.bytes((n) => n.startsWith("kv/"))).toBe(kv);
  });
});
