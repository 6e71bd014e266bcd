/**
 * EarlySync: a syncfs round after every `every` bytes restored or on a kick, one round in
 * flight at a time, staged roots that do not exist yet skipped, errors kept for settle().
 */
import { mkdirSync } from "node:fs";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { EarlySync } from "../../src/util/fs-atomic.js";
import { tempDir } from "../helpers/cli.js";

describe("EarlySync", () => {
  it("starts a round each time another `every` bytes have passed, never two at once", async () => {
    const dir = tempDir("memsnap-es-");
    let rounds = 0;
    const es = new EarlySync(() => { rounds++; return [dir]; }, 100);
    es.bytes(60);
    expect(rounds).toBe(0);
    es.bytes(60); // 120 ≥ 100: a round starts
    expect(rounds).toBe(1);
    es.bytes(500); // past the next mark, but the first round is still in flight
    expect(rounds).toBe(1);
    await es.settle();
    es.kick(); // a layer materialized
    expect(rounds).toBe(2);
    await es.settle();
    es.bytes(10); // the mark moved to 620 + 100 when the skipped round was due
    expect(rounds).toBe(2);
    es.bytes(200);
    expect(rounds).toBe(3);
    await es.settle();
  });

  it("skips a staged root that does not exist yet, and flushes the ones that do", async () => {
    const base = tempDir("memsnap-es-");
    const made = join(base, "made");
    mkdirSync(made);
    const es = new EarlySync(() => [join(base, "not-yet"), made], 1);
    es.bytes(1);
    await expect(es.settle()).resolves.toBeUndefined();
  });
});
