// `memsnap init` takes a paged KV dump it does not know by name (issue #38: per-layer
// `layer_NN.kvpages` files and a manifest.json giving page_bytes) for a kv source of format
// "paged", so its pages are deduplicated; a directory that only looks like one is not claimed.
import { randomBytes } from "node:crypto";
import { mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { detectAgent } from "../../src/index.js";
import { generatePagedKvDump } from "../../scripts/lib/gen-paged-kv.mjs";
import { expectOk, jsonOut, runCliSync, sha256, tempDir } from "../helpers/cli.js";
import { writeFiles } from "../helpers/git.js";

describe("memsnap init: paged KV dumps", () => {
  it("detects a dir of .kvpages files with a manifest.json giving page_bytes; the snapshot dedups its pages and restores it", () => {
    const top = tempDir("memsnap-init-paged-");
    const home = join(top, "agent");
    writeFiles(join(home, "notes"), { "a.md": "a\n" });
    const d = generatePagedKvDump({ dir: join(home, "runtime", "kv"), pages: 160, distinct: 96, zeroPages: 8, pageBytes: 65536, nLayers: 8 });
    const j = runCliSync(["init", home, "--print", "--json"]);
    expectOk(j);
    const found = (jsonOut(j) as { sources: { kind: string; path: string; extra?: Record<string, string> }[] }).sources;
    expect(found.filter((s) => s.path.startsWith("runtime"))).toEqual([
      expect.objectContaining({ kind: "kv", path: "runtime/kv", extra: { format: "paged" } }),
    ]);
    expectOk(runCliSync(["init", home]));
    expect(readFileSync(join(home, "memsnap.json"), "utf8")).toContain('"format": "paged"');
    const s = runCliSync(["snapshot", "-c", join(home, "memsnap.json"), "--out", join(top, "b.memsnap"), "--json"]);
    expectOk(s);
    const snap = jsonOut(s) as { path: string; bundle_bytes?: number };
    const out = join(top, "restored");
    expectOk(runCliSync(["restore", snap.path, "--to", out, "--json"]));
    for (const f of [...d.files.map((x) => x.path), "manifest.json"]) {
      expect(sha256(readFileSync(join(out, "kv", f)))).toBe(sha256(readFileSync(join(d.dir, f))));
    }
    const v = runCliSync(["verify", snap.path, "--deep", "--json"]);
    expectOk(v);
    const insp = runCliSync(["inspect", snap.path, "--json"]);
    expectOk(insp);
    const layer = (jsonOut(insp) as { manifest?: { layers: { name: string; meta: Record<string, unknown> }[] }; layers?: { name: string; meta: Record<string, unknown> }[] });
    const layers = layer.manifest?.layers ?? layer.layers ?? [];
    expect(layers.find((l) => l.name === "kv")?.meta).toMatchObject({ format: "paged", pages_total: 160, pages_unique: 95, pages_zero: 8 });
  });

  it("does not claim a directory that is not paged", async () => {
    const home = join(tempDir("memsnap-init-notpaged-"), "agent");
    // a manifest.json without page_bytes beside binaries
    writeFiles(join(home, "a"), { "manifest.json": JSON.stringify({ name: "x" }), "data.bin": randomBytes(8192) });
    // page_bytes, but a binary file that is not a whole number of pages
    writeFiles(join(home, "b"), { "manifest.json": JSON.stringify({ page_bytes: 4096 }), "l0.kvpages": randomBytes(8192), "l1.kvpages": randomBytes(5000) });
    // page_bytes, but no binary file beside it
    writeFiles(join(home, "c"), { "manifest.json": JSON.stringify({ page_bytes: 4096 }), "notes.txt": "x\n" });
    // a page_bytes that is no page size, and a manifest.json that is not JSON
    writeFiles(join(home, "d"), { "manifest.json": JSON.stringify({ page_bytes: 3 }), "l0.kvpages": randomBytes(4096) });
    mkdirSync(join(home, "e"));
    writeFileSync(join(home, "e", "manifest.json"), "{not json");
    writeFileSync(join(home, "e", "l0.kvpages"), randomBytes(4096));
    const det = await detectAgent(home);
    expect(det.sources.filter((s) => s.kind === "kv")).toEqual([]);
  });
});
