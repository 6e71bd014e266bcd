/**
 * Fuzz (issue #35): the manifest parser, the payload tar scanner and the container reader on
 * random and mutated inputs (seeded by every golden and hostile bundle): no MEMSNAP_INTERNAL,
 * no error that is not a MemsnapError with a hint, no input slower than 2 s, bounded RSS. A few
 * seconds here; `node scripts/fuzz.mjs MINUTES` runs the same harness (scripts/lib/fuzz-harness.mjs)
 * for longer on dist/.
 */
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { isMemsnapError } from "../../src/errors.js";
import { readLayout } from "../../src/format/container.js";
import { checkSeal, parseManifest } from "../../src/format/manifest.js";
import { TarScanner } from "../../src/read/tar-scan.js";
// @ts-ignore: an .mjs script without types
import { fileSeeds, fuzz, fuzzManifest, manifestOf, mutateBytes, rng } from "../../scripts/lib/fuzz-harness.mjs";

const work = mkdtempSync(join(tmpdir(), "memsnap-fuzz-"));
afterAll(() => rmSync(work, { recursive: true, force: true }));

const api = { parseManifest, checkSeal, TarScanner, readLayout, isMemsnapError };
const fixtures = new URL("../../fixtures/", import.meta.url).pathname;
const bundles = fileSeeds([join(fixtures, "golden"), join(fixtures, "hostile")]) as Buffer[];
const SECONDS = Number(process.env.MEMSNAP_FUZZ_SECONDS ?? 4);

describe("fuzz", () => {
  it("the seeds are real bundles whose manifests parse", () => {
    expect(bundles.length).toBeGreaterThan(20);
    const parsed = bundles.map((b) => manifestOf(b)).filter(Boolean).map((m) => fuzzManifest(api, m, 0));
    expect(parsed.filter((x) => x === "parsed").length).toBeGreaterThan(5);
  });

  it(`parseManifest, TarScanner and readLayout for ${SECONDS} s: no MEMSNAP_INTERNAL, no hang, bounded RSS`, async () => {
    const seed = Number(process.env.MEMSNAP_FUZZ_SEED ?? Date.now() % 2 ** 31);
    const end = Date.now() + SECONDS * 1000;
    let r;
    try {
      r = await fuzz(api, { seed, bundles, scratch: join(work, "c.memsnap"), until: () => Date.now() < end });
    } catch (e) {
      throw new Error(`fuzz failed (replay with MEMSNAP_FUZZ_SEED=${seed}): ${(e as Error).message}`, { cause: e });
    }
    expect(r.runs).toBeGreaterThan(100);
    // every target ran and both outcomes were reached for the manifest and the tar
    const c = r.counts as Record<string, number>;
    for (const k of ["manifest:refused", "tar:framed", "tar:refused", "layout:refused"]) expect(c[k] ?? 0, JSON.stringify(c)).toBeGreaterThan(0);
  }, 60_000);

  it("the mutator is deterministic for a seed (a failure replays)", () => {
    const b = Buffer.from('{"a":[1,2,3],"b":"x"}');
    expect(mutateBytes(rng(7), b)).toEqual(mutateBytes(rng(7), b));
  });
});
