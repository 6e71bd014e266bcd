/**
 * How far ahead of the packing the captures start (src/snapshot/snapshot.ts): one layer ahead,
 * two while the layer about to pack is still being prepared. The `files` kind is wrapped so
 * that its captures say when they start and the first one waits, as a git memdir's does while
 * its bundle is written; everything else is the real pipeline.
 */
import { mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { afterEach, describe, expect, it } from "vitest";
import { parseConfig, restoreToDir, snapshot } from "../../src/index.js";
import { SOURCE_KINDS } from "../../src/sources/registry.js";
import type { SourceKind } from "../../src/sources/types.js";
import { tempDir } from "../helpers/cli.js";

const realFiles = SOURCE_KINDS.files!;
afterEach(() => {
  SOURCE_KINDS.files = realFiles;
});

/**
 * `files`, with each capture's start (`start X`) and the start of its packing (`pack X`, its
 * first artifact asked for) recorded, and the capture of `slow` held until `release` says so
 * (or 10 s).
 */
function gatedFiles(slow: string | null, release: (events: string[]) => boolean = () => true): { events: string[]; atRelease: string[] | null } {
  const seen = { events: [] as string[], atRelease: null as string[] | null };
  const kind: SourceKind<{ name: string }> = {
    ...realFiles,
    capture: async (cfg, ctx) => {
      seen.events.push(`start ${cfg.name}`);
      if (cfg.name === slow) {
        const t0 = Date.now();
        while (!release(seen.events) && Date.now() - t0 < 10_000) await new Promise((res) => setTimeout(res, 10));
        seen.atRelease = [...seen.events];
      }
      const cap = await realFiles.capture(cfg, ctx);
      const inner = cap.artifacts;
      return {
        ...cap,
        artifacts: (async function* () {
          seen.events.push(`pack ${cfg.name}`);
          yield* inner;
        })(),
      };
    },
  };
  SOURCE_KINDS.files = kind;
  return seen;
}

function home(): { dir: string; names: string[] } {
  const dir = tempDir("memsnap-capture-ahead-");
  const names = ["a", "b", "c", "d", "e"];
  for (const n of names) {
    mkdirSync(join(dir, n));
    writeFileSync(join(dir, n, `${n}.txt`), `layer ${n}\n`.repeat(100));
  }
  return { dir, names };
}

describe("captures ahead of the packing", () => {
  it("while the first layer is still being prepared, the next two start; the layers stay in config order", async () => {
    const { dir, names } = home();
    const seen = gatedFiles("a", (e) => e.includes("start c"));
    const config = parseConfig({ agent: "ahead", sources: names.map((n) => ({ kind: "files", name: n, path: n })) }, null, dir);
    const r = await snapshot({ config, out: join(dir, "s.memsnap") });
    // b and c started while a was held, d only once b packed: two ahead at most
    expect(seen.atRelease).toEqual(["start a", "start b", "start c"]);
    expect(seen.events.indexOf("start d")).toBeGreaterThan(seen.events.indexOf("pack b"));
    expect(r.manifest.layers.map((l) => l.name)).toEqual(names);
    await restoreToDir(r.path, join(dir, "back"));
    for (const n of names) expect(readFileSync(join(dir, "back", n, `${n}.txt`), "utf8")).toBe(`layer ${n}\n`.repeat(100));
  });

  it("no more than two captures run ahead of the layer that packs", async () => {
    const { dir, names } = home();
    const seen = gatedFiles(null);
    const config = parseConfig({ agent: "ahead", sources: names.map((n) => ({ kind: "files", name: n, path: n })) }, null, dir);
    await snapshot({ config, out: join(dir, "s.memsnap") });
    // At the first layer nothing is ready yet: two ahead. Later, one ahead, or two while the
    // layer whose turn it is is not ready (how soon a capture resolves varies).
    expect(seen.events.indexOf("start c")).toBeLessThan(seen.events.indexOf("pack a"));
    let ahead = 0;
    for (const e of seen.events) {
      ahead += e.startsWith("start ") ? 1 : -1;
      expect(ahead, seen.events.join(", ")).toBeLessThanOrEqual(3);
    }
    expect(seen.events.filter((e) => e.startsWith("start ")).map((e) => e.slice(6))).toEqual(names);
    expect(seen.events.filter((e) => e.startsWith("pack ")).map((e) => e.slice(5))).toEqual(names);
  });
});
