// Every golden bundle of every format version must keep verifying and restoring.
import { createHash } from "node:crypto";
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { loadIdentities, restoreToDir, verifyBundle } from "../src/index.js";

const dir = new URL("../fixtures/golden/", import.meta.url).pathname;
const versions = readdirSync(dir).filter((f) => f.endsWith("-plain.memsnap")).map((f) => f.split("-")[0]!);
const work = mkdtempSync(join(tmpdir(), "memsnap-golden-"));
afterAll(() => rmSync(work, { recursive: true, force: true }));

describe.each(versions)("golden %s bundles", (v) => {
  const expected = readFileSync(join(dir, `${v}-files.sha256`), "utf8").trim().split("\n").map((l) => l.split("  ") as [string, string]);

  it("has files to check", () => {
    expect(expected.length).toBeGreaterThan(0);
  });

  // Version 3 is a plaintext bundle (its manifest leaves the index out): it has no age golden.
  for (const kind of (["plain", "age"] as const).filter((k) => existsSync(join(dir, `${v}-${k}.memsnap`)))) {
    it(`${kind}: verifies with every check run`, async () => {
      const identities = kind === "age" ? await loadIdentities([join(dir, `${v}-age.key`)]) : [];
      const r = await verifyBundle(join(dir, `${v}-${kind}.memsnap`), { keys: { identities }, deep: true });
      expect(r.findings).toEqual([]);
      expect(r.ok).toBe(true);
      expect(r.checks.filter((c) => c.status === "skipped").map((c) => c.name)).toEqual(["signature"]); // golden bundles are unsigned
    });

    it(`${kind}: restores byte for byte`, async () => {
      const identities = kind === "age" ? await loadIdentities([join(dir, `${v}-age.key`)]) : [];
      const to = join(work, `${v}-${kind}`);
      const r = await restoreToDir(join(dir, `${v}-${kind}.memsnap`), to, { keys: { identities } });
      expect(r.artifacts).toBe(expected.length);
      for (const [sha, rel] of expected) {
        expect(createHash("sha256").update(readFileSync(join(to, rel))).digest("hex"), rel).toBe(sha);
      }
    });
  }
});

// A KV layer of schema 1 (every page spooled by name, no place), made by memsnap 0.1.0 before
// pages carried their place (schema 2): it must keep verifying and restoring byte for byte.
describe("golden v1 bundle with a kv layer of schema 1", () => {
  const bundle = join(dir, "v1-kv-schema1.memsnap");
  const expected = readFileSync(join(dir, "v1-kv-schema1.sha256"), "utf8").trim().split("\n").map((l) => l.split("  ") as [string, string]);

  it("verifies deep and restores byte for byte", async () => {
    const v = await verifyBundle(bundle, { deep: true });
    expect(v.findings).toEqual([]);
    expect(v.ok).toBe(true);
    const to = join(work, "v1-kv-schema1");
    const r = await restoreToDir(bundle, to);
    expect(r.manifest.layers[0]!.schema_version).toBe(1);
    expect(expected.length).toBe(2);
    for (const [sha, rel] of expected) {
      expect(createHash("sha256").update(readFileSync(join(to, rel))).digest("hex"), rel).toBe(sha);
    }
    expect(readdirSync(join(to, "kv")).sort()).toEqual(["data", "kv-manifest.json"]);
  });
});

// Version 2 is the incremental bundle: each golden v2 bundle references artifacts of a base that
// sits beside it in fixtures/golden/ under its id.
describe("golden v2 bundles are incremental", () => {
  for (const kind of ["plain", "age"] as const) {
    it(`${kind}: references artifacts of a base beside it`, async () => {
      const [{ parseManifest }, { readLayout }] = await Promise.all([import("../src/format/manifest.js"), import("../src/format/container.js")]);
      const m = parseManifest((await readLayout(join(dir, `v2-${kind}.memsnap`))).manifestBytes);
      expect(m.manifest_version).toBe(2);
      expect(m.bases).toHaveLength(1);
      expect(readdirSync(dir)).toContain(`${m.bases![0]!.snapshot_id}.memsnap`);
      expect(m.layers.reduce((n, l) => n + (l.referenced ?? 0), 0)).toBeGreaterThan(0);
    });
  }
});

// Version 3: a plaintext bundle whose manifest leaves the index out (past MANIFEST_INDEX_MAX
// artifacts; the golden one by a lowered limit): the index is read from the payload.
describe("golden v3 bundle leaves the index out of its manifest", () => {
  it("has none in its manifest, and verifies deep without one", async () => {
    const [{ parseManifest }, { readLayout }] = await Promise.all([import("../src/format/manifest.js"), import("../src/format/container.js")]);
    const m = parseManifest((await readLayout(join(dir, "v3-plain.memsnap"))).manifestBytes);
    expect(m.manifest_version).toBe(3);
    expect(m.payload.encryption).toBeNull();
    expect(m.index).toBeUndefined();
    const r = await verifyBundle(join(dir, "v3-plain.memsnap"), { deep: true });
    expect(r.checks.find((c) => c.name === "artifacts")?.status).toBe("passed");
  });
});
