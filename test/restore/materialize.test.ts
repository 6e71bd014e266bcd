// Layers are materialized as soon as extraction has moved past them: extractPayload reports a
// layer done before it writes the next layer's first entry, and LayerMaterializer runs the
// rebuilds one at a time, in that order, and reports the first failure only at the end.
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { readLayout } from "../../src/format/container.js";
import { parseManifest } from "../../src/format/manifest.js";
import { extractPayload } from "../../src/read/extract.js";
import { LayerMaterializer } from "../../src/restore/materialize.js";

const golden = new URL("../../fixtures/golden/v1-plain.memsnap", import.meta.url).pathname;
const work = mkdtempSync(join(tmpdir(), "memsnap-materialize-"));
afterAll(() => rmSync(work, { recursive: true, force: true }));

describe("extraction reports each layer as soon as it is complete", () => {
  it("every entry of a layer comes before its done event, and the done event before the next layer's first entry", async () => {
    const layout = await readLayout(golden);
    const manifest = parseManifest(layout.manifestBytes);
    const events: string[] = [];
    const root = join(work, "x");
    await extractPayload(layout, manifest, (layer) => join(root, layer), {
      onEntry: (e) => events.push(`entry ${e.name.split("/")[0]}`),
      onLayerDone: (l) => events.push(`done ${l}`),
    });
    const compact = events.filter((e, i) => e !== events[i - 1]);
    expect(compact).toEqual(["entry memory", "done memory", "entry state", "done state"]);
  });
});

describe("LayerMaterializer", () => {
  const tick = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));
  const H1 = "a1".repeat(32);

  it("starts a layer when told, runs one at a time in order, and finishes the layers never started", async () => {
    const log: string[] = [];
    let running = 0;
    const m = new LayerMaterializer(async (layer, verified) => {
      running++;
      expect(running).toBe(1);
      log.push(`start ${layer} ${verified.get(`${layer}/a`) ?? "-"}`);
      await tick(20);
      log.push(`end ${layer}`);
      running--;
    });
    m.verified.add("one/a", 1, Buffer.alloc(32, 0xa1));
    m.layerDone("one");
    m.layerDone("two");
    m.layerDone("one"); // a second report starts nothing
    await tick(5);
    expect(log).toEqual([`start one ${H1}`]); // started while "extraction" goes on
    await m.finish(["one", "two", "three"]);
    expect(log).toEqual([`start one ${H1}`, "end one", "start two -", "end two", "start three -", "end three"]);
  });

  it("a failure stops the layers after it; settle never throws; finish throws the first failure", async () => {
    const ran: string[] = [];
    const m = new LayerMaterializer(async (layer) => {
      ran.push(layer);
      if (layer !== "ok") throw new Error(`broken ${layer}`);
    });
    m.layerDone("ok");
    m.layerDone("bad");
    m.layerDone("worse");
    await m.settle();
    expect(ran).toEqual(["ok", "bad"]);
    await expect(m.finish(["later"])).rejects.toThrow("broken bad");
    expect(ran).toEqual(["ok", "bad"]);
  });
});
