import { getHeapStatistics } from "node:v8";
import { describe, expect, it } from "vitest";
import { HEAP_CHECK_EVERY, gcPacer, heapPacer } from "../../src/util/gc.js";

const used = (): number => getHeapStatistics().used_heap_size;
const MiB = 1024 * 1024;

/** Small objects (600k: ~40 MiB) that survive long enough to reach the old generation, then are dropped. */
function oldGarbage(n = 600_000): void {
  let keep: object[] | null = [];
  for (let i = 0; i < n; i++) keep.push({ i, s: `x${i}` });
  for (let k = 0; k < 4; k++) {
    let churn: number[] | null = [];
    for (let i = 0; i < 200_000; i++) churn.push(i); // scavenges promote `keep`
    churn = null;
  }
  expect(keep.length).toBe(n);
  keep = null;
}

describe("gc pacing", () => {
  it("a major pacer really collects the old generation (gc({type: 'major'}) alone does not)", () => {
    const pace = gcPacer(1, "major");
    oldGarbage();
    const before = used();
    pace(1);
    expect(before - used()).toBeGreaterThan(20 * MiB);
  });

  it("heapPacer collects once the heap holds `slack` more than after its last look, and not before", () => {
    const pace = heapPacer(32 * MiB);
    for (let i = 0; i < HEAP_CHECK_EVERY; i++) pace(); // first look: the baseline
    const base = used();
    oldGarbage(60_000); // a few MiB: under the slack, left for V8
    const some = used();
    for (let i = 0; i < HEAP_CHECK_EVERY * 2; i++) pace();
    expect(some - used()).toBeLessThan(2 * MiB);
    oldGarbage(1_200_000);
    const full = used();
    expect(full - base).toBeGreaterThan(40 * MiB);
    for (let i = 0; i < HEAP_CHECK_EVERY - 1; i++) pace();
    expect(used()).toBeGreaterThan(full - 8 * MiB); // not yet its turn to look
    pace();
    expect(full - used()).toBeGreaterThan(40 * MiB);
  });
});
