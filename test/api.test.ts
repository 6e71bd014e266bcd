/**
 * The public API is verbs and types only, documented in docs/API.md, and the example in examples/ runs
 * against the built package by its name.
 */
import { execFileSync } from "node:child_process";
import { mkdtempSync, readFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { describe, expect, it } from "vitest";
import * as api from "../src/index.js";

const root = join(dirname(fileURLToPath(import.meta.url)), "..");

describe("public API", () => {
  it("exports exactly the values docs/API.md documents", () => {
    const doc = readFileSync(join(root, "docs/API.md"), "utf8");
    const documented = [...doc.matchAll(/^### `([A-Za-z_]+)`/gm)].map((m) => m[1]!).sort();
    expect(Object.keys(api).sort()).toEqual(documented);
  });

  it("does not export internals", () => {
    for (const name of ["acquireLock", "readJournal", "controlDir", "stripJsonComments", "selectLayers", "readLayout",
      "computeSeal", "parseDuration", "removeOrphans", "runHook", "SOURCE_KINDS"]) {
      expect(Object.hasOwn(api, name), name).toBe(false);
    }
  });

  it("runs the example: snapshot, keyless and keyed verify, list, restore", () => {
    const work = mkdtempSync(join(tmpdir(), "memsnap-api-"));
    const out = execFileSync(process.execPath, [join(root, "examples/library.mjs"), work], { cwd: root, encoding: "utf8" });
    const r = JSON.parse(out.trim().split("\n").pop()!);
    expect(r).toMatchObject({
      encrypted: true, layers: ["notes", "cursor"], keyless_ok: true, keyed_ok: true, restored_artifacts: 2, notes_restored: true,
    });
    expect(r.listed).toEqual([r.id]);
  }, 60_000);
});
