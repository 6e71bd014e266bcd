/**
 * kv layers built as an attacker would (scripts/hostile/layer-kv.mjs, fixtures/hostile/kv-*):
 * a valid seal and payload hash, a kv-index.json whose contents, files or sizes are the attack.
 * Restore refuses each before the rebuild writes a byte, with a stable code; modes are masked;
 * verify --deep catches a zero page whose digest is not that of zeros. The same layer without
 * the attack restores (the control), so each refusal is the attack's.
 */
import { mkdtempSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { createHash } from "node:crypto";
import { loadIdentities, restoreToDir, verifyBundle } from "../../src/index.js";
import { KvIndexUnsafe, parseKvIndex } from "../../src/sources/kv/index-format.js";

const HOSTILE = new URL("../../fixtures/hostile/", import.meta.url).pathname;
interface Case { file: string; exit: number; code: string; check: string; key?: boolean; group: string; note: string }
const cases = (JSON.parse(readFileSync(join(HOSTILE, "cases.json"), "utf8")) as Case[]).filter((c) => c.group === "layer-kv");
interface KvLayer { files: { path: string; mode: number }[]; meta: Record<string, unknown> }
const group = (await import(new URL("../../scripts/hostile/layer-kv.mjs", import.meta.url).href)) as {
  baseKv(): KvLayer;
  kvBundle(bundle: unknown, k: KvLayer, o?: { encrypt?: boolean }): Buffer;
};
const { bundle } = (await import(new URL("../../scripts/lib/hostile-bundle.mjs", import.meta.url).href)) as { bundle: unknown };

const work = mkdtempSync(join(tmpdir(), "memsnap-kv-hostile-"));
afterAll(() => rmSync(work, { recursive: true, force: true }));
const keys = { identities: await loadIdentities([join(HOSTILE, "victim.key")]) };

/** Restore `file` into a fresh directory; returns the error (or null) and what the parent holds after. */
async function restore(file: string, encrypted = false): Promise<{ err: unknown; parent: string; left: string[] }> {
  const parent = mkdtempSync(join(work, "to-"));
  let err: unknown = null;
  try {
    await restoreToDir(file, join(parent, "r"), encrypted ? { keys } : {});
  } catch (e) {
    err = e;
  }
  return { err, parent, left: readdirSync(parent) };
}

describe("kv: hostile layer contents", () => {
  it("the control: the layer the attacks start from restores, plaintext and encrypted", async () => {
    for (const encrypt of [false, true]) {
      const f = join(work, `control-${encrypt}.memsnap`);
      writeFileSync(f, group.kvBundle(bundle, group.baseKv(), { encrypt }));
      const r = await restore(f, encrypt);
      expect(r.err).toBeNull();
      const data = readFileSync(join(r.parent, "r", "kv", "data.bin"));
      expect(data).toEqual(Buffer.concat([Buffer.from("0123456789abcdef"), Buffer.alloc(16)]));
      expect(readdirSync(join(r.parent, "r", "kv")).sort()).toEqual(["README.txt", "data.bin"]);
      expect((await verifyBundle(f, { deep: true, ...(encrypt ? { keys } : {}) })).ok).toBe(true);
    }
  });

  it("the group holds the attacks, plaintext and encrypted", () => {
    expect(cases.length).toBeGreaterThanOrEqual(12);
    expect(cases.filter((c) => c.key).length).toBeGreaterThanOrEqual(4);
  });

  // Each refusal: the case's code, a hint, and nothing left beside the target (staging removed).
  it.each(cases.filter((c) => c.check === "to").map((c) => [c.file, c] as const))("%s: refused before the rebuild writes anything", async (file, c) => {
    const r = await restore(join(HOSTILE, file), c.key === true);
    expect(r.err, c.note).toMatchObject({ code: c.code });
    expect((r.err as { hint?: string }).hint).toBeTruthy();
    expect(r.left).toEqual([]);
  });

  it("kv-setuid-mode.memsnap: setuid, setgid and 0777 modes come back as mode & 0o777 & ~umask", async () => {
    const old = process.umask(0o022);
    try {
      const r = await restore(join(HOSTILE, "kv-setuid-mode.memsnap"));
      expect(r.err).toBeNull();
      expect(statSync(join(r.parent, "r", "kv", "data.bin")).mode & 0o7777).toBe(0o755); // 0o6777 in the index
      expect(statSync(join(r.parent, "r", "kv", "README.txt")).mode & 0o7777).toBe(0o755); // 0o4755
      process.umask(0o077);
      const r2 = await restore(join(HOSTILE, "kv-setuid-mode.memsnap"));
      expect(r2.err).toBeNull();
      expect(statSync(join(r2.parent, "r", "kv", "data.bin")).mode & 0o7777).toBe(0o700);
      expect(statSync(join(r2.parent, "r", "kv", "README.txt")).mode & 0o7777).toBe(0o700);
    } finally {
      process.umask(old);
    }
  });

  it("verify --deep: a zero content whose digest is not that of zeros is a finding (kv-zero-digest-lie.memsnap, -enc)", async () => {
    for (const [file, enc] of [["kv-zero-digest-lie.memsnap", false], ["kv-zero-digest-lie-enc.memsnap", true]] as const) {
      const rep = await verifyBundle(join(HOSTILE, file), { deep: true, ...(enc ? { keys } : {}) });
      expect(rep.ok, file).toBe(false);
      const deep = rep.checks.find((x) => x.name === "deep");
      expect(deep?.status, file).toBe("failed");
      expect(deep?.detail, file).toMatch(/kv\/kv-index\.json: kv-index content [0-9a-f]{64} is marked zero, but 16 zero bytes hash to sha256:/);
    }
  });

  it("verify --deep names the index's unsafe paths and sizes too", async () => {
    for (const file of ["kv-file-under-file.memsnap", "kv-negative-size.memsnap", "kv-tiles-size-mismatch.memsnap", "kv-sparse-8tib.memsnap"]) {
      const rep = await verifyBundle(join(HOSTILE, file), { deep: true });
      expect(rep.checks.find((x) => x.name === "deep")?.status, file).toBe("failed");
    }
  });

  it("the index checks hold in any member order, and zero digests are checked for every length in one pass", async () => {
    const z = (n: number): string => createHash("sha256").update(Buffer.alloc(n)).digest("hex");
    const lens = [1, 100, 8192, (1 << 20) + 3, 64 * 1024 * 1024];
    const doc = (contents: unknown[], files: unknown[]): Buffer => Buffer.from(JSON.stringify({
      files, pages: [], format: "memsnap-kv-index", version: 1, source_format: "memsnap", dtype: "bf16", page_bytes: 16, shuffle: { applied: false, elem_bytes: 2 }, contents,
    }));
    const contents = lens.map((n) => ({ sha256: z(n), bytes: n, zero: true, artifact: null }));
    const file = (tiles: number[], bytes: number): unknown => ({ path: "d.bin", bytes, mode: 0o644, mtime: "2026-01-01T00:00:00.000Z", tiles });
    const total = lens.reduce((a, b) => a + b, 0);
    expect((await parseKvIndex(doc([...contents].reverse(), [file([0, 1, 2, 3, 4], total)]))).files).toHaveLength(1);
    // Files before contents (the tiles are summed once the contents are known).
    await expect(parseKvIndex(doc(contents, [file([0, 1, 2, 3, 4], total + 1)]))).rejects.toBeInstanceOf(KvIndexUnsafe);
    const lie = contents.map((c, i) => (i === 2 ? { ...c, sha256: z(8191) } : c));
    await expect(parseKvIndex(doc(lie, []))).rejects.toThrow(/marked zero, but 8192 zero bytes hash to/);
  });
});
