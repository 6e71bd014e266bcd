/**
 * A layer's finish() (its meta: the git history scan, the SQLite workers' results) settles
 * while the next layer packs; the manifest still gets every meta, and a finish that fails
 * fails the snapshot with nothing left behind.
 */
import { mkdirSync, readdirSync } from "node:fs";
import { join } from "node:path";
import { Readable } from "node:stream";
import { describe, expect, it } from "vitest";
import { isMemsnapError, parseConfig, snapshot, MemsnapError } from "../../src/index.js";
import type { LayerCapture } from "../../src/sources/types.js";
import { tempDir } from "../helpers/cli.js";

/** A two-layer config whose captures are given (the kinds' own captures are not run). */
function twoLayers(first: () => LayerCapture, second: () => LayerCapture): { config: ReturnType<typeof parseConfig>; dir: string } {
  const dir = tempDir("memsnap-finish-");
  mkdirSync(join(dir, "a"));
  mkdirSync(join(dir, "b"));
  const config = parseConfig({ agent: "finisher", sources: [{ kind: "files", name: "a", path: "a" }, { kind: "files", name: "b", path: "b" }] }, null, dir);
  const caps = [first, second];
  config.sources = config.sources.map((s, i) => ({ cfg: s.cfg, impl: { ...s.impl, capture: async () => caps[i]!() } }));
  return { config, dir };
}

const file = (path: string, text: string) => ({
  path, kind: "file", size: Buffer.byteLength(text), mode: 0o644, mtime: new Date(), open: () => Readable.from([Buffer.from(text)]),
});

describe("snapshot: a layer's finish() overlaps the next layer", () => {
  it("the next layer streams before the previous finish() resolves, and the manifest has both metas", async () => {
    let secondStarted!: () => void;
    const started = new Promise<boolean>((res) => { secondStarted = () => res(true); });
    const { config, dir } = twoLayers(
      () => ({
        artifacts: (async function* () { yield file("one.txt", "first layer\n"); })(),
        // Resolves once the second layer streams, or after 2 s (when finish() held it back).
        finish: async () => ({ overlapped: await Promise.race([started, new Promise<boolean>((r) => setTimeout(() => r(false), 2000))]) }),
      }),
      () => ({
        artifacts: (async function* () {
          secondStarted();
          yield file("two.txt", "second layer\n");
        })(),
        finish: async () => ({ second: true }),
      }),
    );
    const r = await snapshot({ config, out: join(dir, "s.memsnap") });
    expect(r.manifest.layers.map((l) => [l.name, l.meta])).toEqual([["a", { overlapped: true }], ["b", { second: true }]]);
  });

  it("a finish() that fails after the next layer started fails the snapshot, and leaves no file", async () => {
    let secondStarted!: () => void;
    const started = new Promise<void>((res) => { secondStarted = res; });
    const { config, dir } = twoLayers(
      () => ({
        artifacts: (async function* () { yield file("one.txt", "first layer\n"); })(),
        finish: async () => {
          await started;
          throw new MemsnapError("MEMSNAP_SOURCE_INVALID", "the history scan failed", { hint: "test" });
        },
      }),
      () => ({
        artifacts: (async function* () {
          secondStarted();
          yield file("two.txt", "second layer\n");
        })(),
      }),
    );
    const outDir = join(dir, "out");
    mkdirSync(outDir);
    const err = await snapshot({ config, out: join(outDir, "s.memsnap") }).then(() => null, (e: unknown) => e);
    expect(isMemsnapError(err) && err.code).toBe("MEMSNAP_SOURCE_INVALID");
    expect((err as Error).message).toBe("the history scan failed");
    expect(readdirSync(outDir)).toEqual([]); // no bundle, no temp file, no work dir
  });
});
