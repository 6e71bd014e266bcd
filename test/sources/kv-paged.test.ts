/**
 * kv source, generic paged mode (`format: "paged"`, issue #38): a dump memsnap does not know by
 * name — `layer_NN.kvpages` files of 64 KiB pages and a manifest.json giving page_bytes, or
 * page-aligned files with the page size in the config — gets page dedup and zero-page elision;
 * restore (to a directory, in place, from an incremental chain) is byte-exact, deep and keyless
 * verify pass.
 */
import { createHash, randomBytes } from "node:crypto";
import { closeSync, mkdirSync, mkdtempSync, openSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync, writeSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, relative } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { generateIdentity, isMemsnapError, parseConfig, restoreInPlace, restoreToDir, snapshot, verifyBundle } from "../../src/index.js";
import { generatePagedKvDump } from "../../scripts/lib/gen-paged-kv.mjs";

const made: string[] = [];
function tmp(): string {
  const d = mkdtempSync(join(tmpdir(), "memsnap-kv-paged-"));
  made.push(d);
  return d;
}
afterAll(() => {
  for (const d of made.splice(0)) rmSync(d, { recursive: true, force: true });
});

const sha = (b: Buffer): string => createHash("sha256").update(b).digest("hex");

/** Every regular file under `root`: relative path → {whole-file SHA-256, size, mode, mtime to the ms}. */
function tree(root: string): Record<string, { sha: string; size: number; mode: number; mtime: number }> {
  const out: Record<string, { sha: string; size: number; mode: number; mtime: number }> = {};
  const walk = (d: string): void => {
    for (const e of readdirSync(d, { withFileTypes: true })) {
      const p = join(d, e.name);
      if (e.isDirectory()) walk(p);
      else if (e.isFile()) {
        const st = statSync(p);
        out[relative(root, p)] = { sha: sha(readFileSync(p)), size: st.size, mode: st.mode & 0o777, mtime: Math.round(st.mtimeMs) };
      }
    }
  };
  walk(root);
  return out;
}

type Meta = Record<string, any>;

function config(dir: string, src: Record<string, unknown>, recipients: string[] = []) {
  return parseConfig({ agent: "a", recipients, redaction: { enabled: false }, sources: [{ kind: "kv", name: "kv", path: "kv", ...src }] }, null, dir);
}

describe("kv: generic paged dumps", () => {
  it("a dump of .kvpages files and a manifest.json: each distinct page stored once, zero pages elided, restored byte for byte", async () => {
    const dir = tmp();
    const d = generatePagedKvDump({ dir: join(dir, "kv"), pages: 400, distinct: 240, zeroPages: 20, nLayers: 8 });
    const before = tree(d.dir);
    const id = await generateIdentity();
    const r = await snapshot({ config: config(dir, {}, [id.recipient]), out: join(dir, "b.memsnap") });
    const meta = r.manifest.layers[0]!.meta as Meta;
    // detected without a format in the config: the manifest gives page_bytes, the files are whole pages
    expect(meta.format).toBe("paged");
    expect(meta.page_bytes).toBe(65536);
    expect(meta.page_bytes_from).toBe("manifest");
    expect(meta.files).toEqual({ data: 8, verbatim: 1 });
    expect(meta.pages_total).toBe(400);
    expect(meta.pages_unique).toBe(239); // 240 distinct contents, one of them the zero page
    expect(meta.pages_zero).toBe(20);
    expect(meta.bytes_total).toBe(d.rawBytes);
    expect(meta.bytes_stored).toBe(239 * 65536);
    const pages = (r.manifest.index ?? []).map((e) => e.path).filter((p) => p.startsWith("kv/pages/"));
    expect(pages).toHaveLength(239);
    // the bundle holds about distinct/total of the raw dump (KV values barely compress)
    expect(r.bundleBytes).toBeLessThan(d.rawBytes * (240 / 400) * 1.02);
    expect(r.bundleBytes).toBeGreaterThan(d.rawBytes * (240 / 400) * 0.5);

    const keys = { identities: [id.identity] };
    const deep = await verifyBundle(r.path, { deep: true, keys });
    expect(deep.ok, JSON.stringify(deep.findings)).toBe(true);
    expect(deep.checks.find((c) => c.name === "deep")?.status).toBe("passed");
    const keyless = await verifyBundle(r.path);
    expect(keyless.ok, JSON.stringify(keyless.findings)).toBe(true);
    const out = join(dir, "out");
    await restoreToDir(r.path, out, { keys });
    expect(tree(join(out, "kv"))).toEqual(before);
  });

  it("page-aligned files and no manifest: the page size from the config; text and a shorter last page kept exact", async () => {
    const dir = tmp();
    const d = generatePagedKvDump({ dir: join(dir, "kv"), pages: 64, distinct: 20, zeroPages: 4, pageBytes: 4096, nLayers: 4, manifest: false });
    // a file that is not a whole number of pages (its last page is shorter), a text file, a subdirectory
    writeFileSync(join(d.dir, "tail.bin"), Buffer.concat([readFileSync(join(d.dir, "layer_00.kvpages")).subarray(0, 4096 * 3), Buffer.from("tail")]));
    mkdirSync(join(d.dir, "meta"));
    writeFileSync(join(d.dir, "meta", "notes.txt"), "engine v1\n");
    const before = tree(d.dir);
    const r = await snapshot({ config: config(dir, { format: "paged", page_bytes: 4096 }), out: join(dir, "b.memsnap") });
    const meta = r.manifest.layers[0]!.meta as Meta;
    expect(meta).toMatchObject({ format: "paged", page_bytes: 4096, page_bytes_from: "config", manifest: null, aligned_files: 4 });
    expect(meta.files).toEqual({ data: 5, verbatim: 1 });
    expect(meta.pages_total).toBe(64 + 4);
    expect(meta.pages_unique).toBe(19 + 1); // tail.bin's first three pages are layer_00's; its 4-byte page is new
    expect(meta.pages_zero).toBe(4);
    const v = await verifyBundle(r.path, { deep: true });
    expect(v.ok, JSON.stringify(v.findings)).toBe(true);
    const out = join(dir, "out");
    await restoreToDir(r.path, out);
    expect(tree(join(out, "kv"))).toEqual(before);
  });

  it("an incremental snapshot references the unchanged pages and stores the changed one; restored in place byte for byte", async () => {
    const dir = tmp();
    const d = generatePagedKvDump({ dir: join(dir, "kv"), pages: 96, distinct: 60, zeroPages: 6, pageBytes: 16384, nLayers: 4 });
    const store = join(dir, "store");
    const cfg = config(dir, { format: "paged" });
    const first = await snapshot({ config: cfg, store, incremental: true });
    // one page of one layer changes
    const fd = openSync(join(d.dir, "layer_02.kvpages"), "r+");
    writeSync(fd, randomBytes(16384), 0, 16384, 16384 * 5);
    closeSync(fd);
    const after = tree(d.dir);
    const second = await snapshot({ config: cfg, store, incremental: true });
    // every page but the new one is a reference to the first bundle
    const pages = (second.manifest.index ?? []).filter((e) => e.path.startsWith("kv/pages/"));
    expect(pages.filter((e) => e.ref === undefined)).toHaveLength(1);
    expect(pages.filter((e) => e.ref === first.id).length).toBeGreaterThan(50);
    expect(second.manifest.layers[0]!.referenced).toBeGreaterThan(50);
    expect(second.bundleBytes).toBeLessThan(first.bundleBytes / 4);
    expect((await verifyBundle(second.path, { deep: true })).ok).toBe(true);
    const out = join(dir, "out");
    await restoreToDir(second.path, out);
    expect(tree(join(out, "kv"))).toEqual(after);

    // in place, over a dump that moved on
    writeFileSync(join(d.dir, "layer_01.kvpages"), randomBytes(4 * 16384));
    writeFileSync(join(d.dir, "extra.kvpages"), randomBytes(16384));
    await restoreInPlace(second.path, cfg, { safetySnapshot: false });
    expect(tree(d.dir)).toEqual(after);
  });

  it("refuses a paged dump with no page size, one whose manifest and config disagree, and page_bytes on another format", async () => {
    const dir = tmp();
    mkdirSync(join(dir, "kv"));
    writeFileSync(join(dir, "kv", "a.kvpages"), randomBytes(8192));
    const fails = async (src: Record<string, unknown>, re: RegExp): Promise<void> => {
      const err = await snapshot({ config: config(dir, src), out: join(dir, `b-${randomBytes(3).toString("hex")}.memsnap`) }).then(() => null, (e: unknown) => e);
      expect(isMemsnapError(err), String(err)).toBe(true);
      expect((err as { code: string }).code).toBe("MEMSNAP_SOURCE_INVALID");
      expect((err as Error).message).toMatch(re);
    };
    await fails({ format: "paged" }, /does not say its page size/);
    await fails({}, /"format": "paged" with "page_bytes"/); // nothing to detect it by
    writeFileSync(join(dir, "kv", "manifest.json"), JSON.stringify({ page_bytes: 4096 }));
    await fails({ page_bytes: 8192 }, /gives page_bytes 4096, the config says 8192/);
    writeFileSync(join(dir, "kv", "manifest.json"), JSON.stringify({ page_bytes: 100 }));
    await fails({ format: "paged" }, /page_bytes 100; a page size is an integer from 512/);
    expect(() => config(dir, { format: "lmcache", page_bytes: 4096 })).toThrow(/"page_bytes" is for "format": "paged"/);
    expect(() => config(dir, { format: "paged", page_bytes: 1 })).toThrow(/"page_bytes" must be an integer from 512/);
  });
});
