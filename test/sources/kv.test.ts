/**
 * kv source: KV-cache dumps (memsnap format, ProcessFork paged-batchinvariant-v1, LMCache
 * chunks) through the real pipeline; dedup counts, byte-plane shuffle on/off for each dtype,
 * broken dumps, deep verify on damaged pages.
 */
import { spawnSync } from "node:child_process";
import { createHash, randomBytes } from "node:crypto";
import { createRequire } from "node:module";
import { chmodSync, existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, statSync, truncateSync, unlinkSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, relative } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { isMemsnapError, parseConfig, restoreToDir, snapshot, verifyBundle, type Manifest } from "../../src/index.js";
import { kvSource } from "../../src/sources/kv/source.js";
import { RestoreSpool } from "../../src/sources/spool.js";
import { shuffle, unshuffle } from "../../src/sources/kv/format.js";
import { generateKvDump, generateLmcacheChunks, kvValues, type KvDtype } from "../helpers/kv-dump.js";
import { blobPath, writePagedCache } from "../helpers/pfimg-store.js";

const require = createRequire(import.meta.url);
const zstd = require("zstd-napi") as { decompress(b: Buffer): Buffer };

const made: string[] = [];
function tmp(prefix = "memsnap-kv-"): string {
  const d = mkdtempSync(join(tmpdir(), prefix));
  made.push(d);
  return d;
}
afterAll(() => {
  for (const d of made.splice(0)) rmSync(d, { recursive: true, force: true });
});

const sha = (b: Buffer | string): string => createHash("sha256").update(b).digest("hex");

/** Every regular file under `root`: relative path → {sha256, mode, size, mtime (to the ms, as the index keeps it)}. */
function tree(root: string): Record<string, { sha: string; mode: number; size: number; mtime: number }> {
  const out: Record<string, { sha: string; mode: number; size: number; mtime: number }> = {};
  const walk = (d: string): void => {
    for (const e of readdirSync(d, { withFileTypes: true })) {
      const p = join(d, e.name);
      if (e.isDirectory()) walk(p);
      else if (e.isFile()) {
        const st = statSync(p);
        out[relative(root, p).split("\\").join("/")] = { sha: sha(readFileSync(p)), mode: st.mode & 0o777, size: st.size, mtime: Math.round(st.mtimeMs) };
      }
    }
  };
  walk(root);
  return out;
}

type Meta = Record<string, any>;

async function snap(dir: string, src: Record<string, unknown>): Promise<{ path: string; manifest: Manifest; meta: Meta; bundleBytes: number }> {
  const config = parseConfig({ agent: "a", redaction: { enabled: false }, sources: [{ kind: "kv", name: "kv", ...src }] }, null, dir);
  const outDir = join(dir, "bundles");
  mkdirSync(outDir, { recursive: true });
  const r = await snapshot({ config, out: join(outDir, `b-${randomBytes(3).toString("hex")}.memsnap`) });
  return { path: r.path, manifest: r.manifest, meta: r.manifest.layers[0]!.meta as Meta, bundleBytes: r.bundleBytes };
}

/** Snapshot, deep-verify, restore, and check the restored layer equals `original` byte for byte. */
async function roundTrip(dir: string, src: Record<string, unknown>, original: string): Promise<{ meta: Meta; manifest: Manifest; paths: string[] }> {
  const before = tree(original);
  const r = await snap(dir, src);
  const rep = await verifyBundle(r.path, { deep: true });
  expect(rep.ok, JSON.stringify(rep.findings)).toBe(true);
  expect(rep.checks.find((c) => c.name === "deep")?.status).toBe("passed");
  const out = join(dir, `restored-${randomBytes(3).toString("hex")}`);
  await restoreToDir(r.path, out);
  expect(tree(join(out, "kv"))).toEqual(before);
  return { meta: r.meta, manifest: r.manifest, paths: (r.manifest.index ?? []).map((e) => e.path) };
}

function expectErr(err: unknown, code: string, msg?: RegExp): void {
  expect(isMemsnapError(err), String(err)).toBe(true);
  expect((err as { code: string }).code, String(err)).toBe(code);
  if (msg) expect((err as Error).message).toMatch(msg);
}

/** A capture that fails, through the real pipeline: the code and message, and no bundle or temp file left. */
async function expectSnapFails(dir: string, src: Record<string, unknown>, code: string, msg?: RegExp): Promise<void> {
  const outDir = join(dir, "bundles");
  mkdirSync(outDir, { recursive: true });
  const before = readdirSync(outDir).sort();
  let err: unknown;
  try {
    await snap(dir, src);
  } catch (e) {
    err = e;
  }
  expectErr(err, code, msg);
  expect(readdirSync(outDir).sort()).toEqual(before);
}


describe("kv: memsnap dump format", () => {
  it("dedups a 4-sequence dump with a shared prefix and zero pages, and restores it byte for byte", async () => {
    const dir = tmp();
    const d = generateKvDump({ dir: join(dir, "dump"), sequences: 4, prefixBlocks: 3, ownBlocks: 2, zeroBlocks: 3, nLayers: 3, shuffleBlocks: true });
    // 4 × (3 + 2) + 3 = 23 blocks per layer; distinct non-zero: 3 + 4 × 2 = 11 per layer.
    expect(d.expected).toEqual({ pagesTotal: 69, pagesUnique: 33, pagesZero: 9, dedupRatio: 69 / 33 });
    const { meta, paths } = await roundTrip(dir, { path: "dump" }, d.dir);
    expect(meta.format).toBe("memsnap");
    expect(meta.pages_total).toBe(69);
    expect(meta.pages_unique).toBe(33);
    expect(meta.pages_zero).toBe(9);
    expect(meta.dedup_ratio).toBeCloseTo(69 / 33, 3);
    expect(meta.bytes_total).toBe(69 * d.pageBytes);
    expect(meta.sequences).toBe(4);
    expect(meta.declared_sha256).toBe(69);
    // One artifact per distinct non-zero page; zero pages are flags only.
    const pages = paths.filter((p) => p.startsWith("kv/pages/"));
    expect(pages).toHaveLength(33);
    expect(meta.bytes_stored).toBe(33 * d.pageBytes);
    expect(paths).toContain("kv/files/kv-manifest.json");
    expect(paths.at(-1)).toBe("kv/kv-index.json");
  });

  it("takes dumps whose manifest leaves sha256 empty, and one file per page", async () => {
    const dir = tmp();
    const d = generateKvDump({ dir: join(dir, "dump"), hashes: false, layout: "per-page", nLayers: 2 });
    const { meta } = await roundTrip(dir, { path: "dump/kv-manifest.json" }, d.dir);
    expect(meta.declared_sha256).toBe(0);
    expect(meta.pages_unique).toBe(d.expected.pagesUnique);
    expect(meta.pages_zero).toBe(d.expected.pagesZero);
    expect(meta.files.data).toBe(d.expected.pagesTotal);
  });

  for (const dtype of ["bf16", "f16", "f32", "fp8e4m3"] as KvDtype[]) {
    it(`shuffle on/off/auto round-trips a ${dtype} dump exactly`, async () => {
      const dir = tmp();
      const d = generateKvDump({ dir: join(dir, "dump"), dtype, nLayers: 2, sequences: 2, prefixBlocks: 1, ownBlocks: 2, zeroBlocks: 1 });
      const elem = { bf16: 2, f16: 2, f32: 4, fp8e4m3: 1 }[dtype];
      for (const mode of ["on", "off", "auto"] as const) {
        const { meta, paths } = await roundTrip(dir, { path: "dump", shuffle: mode }, d.dir);
        const pages = paths.filter((p) => p.startsWith("kv/pages/"));
        expect(pages).toHaveLength(d.expected.pagesUnique);
        expect(meta.shuffle.mode).toBe(mode);
        expect(meta.shuffle.elem_bytes).toBe(elem);
        if (elem === 1) {
          expect(meta.shuffle.applied).toBe(false);
          expect(meta.shuffle.reason).toMatch(/1-byte elements/);
        } else if (mode === "on") {
          expect(meta.shuffle.applied).toBe(true);
        } else if (mode === "off") {
          expect(meta.shuffle.applied).toBe(false);
        } else {
          expect(meta.shuffle.sample.pages).toBeGreaterThan(0);
          expect(meta.shuffle.applied).toBe(meta.shuffle.sample.saving_pct >= 10);
        }
        // Shuffled or not, a page is named with its place (layer schema 3 when shuffled).
        const suffixed = pages.filter((p) => /\.s[24]@\d+\.\d+$/.test(p));
        expect(suffixed).toHaveLength(meta.shuffle.applied ? pages.length : 0);
        if (meta.shuffle.applied) expect(suffixed.every((p) => p.includes(`.s${elem}@`))).toBe(true);
        expect(pages.every((p) => /@\d+\.\d+$/.test(p))).toBe(true);
      }
    });
  }

  it("byte-plane shuffle: low bytes then high bytes, and back", () => {
    const b = Buffer.from([1, 2, 3, 4, 5, 6]);
    expect([...shuffle(b, 2)]).toEqual([1, 3, 5, 2, 4, 6]);
    expect([...shuffle(Buffer.from([1, 2, 3, 4, 5, 6, 7, 8]), 4)]).toEqual([1, 5, 2, 6, 3, 7, 4, 8]);
    const r = randomBytes(4096);
    expect(unshuffle(shuffle(r, 2), 2).equals(r)).toBe(true);
    expect(unshuffle(shuffle(r, 4), 4).equals(r)).toBe(true);
    // native/directio's planes (used when built) against the definition, at odd sizes too.
    for (const [n, elem] of [[2, 2], [65_538, 2], [12, 4], [65_540, 4]] as const) {
      const src = randomBytes(n);
      const want = Buffer.alloc(n);
      const k = n / elem;
      for (let i = 0; i < k; i++) for (let e = 0; e < elem; e++) want[e * k + i] = src[i * elem + e]!;
      expect(shuffle(src, elem).equals(want)).toBe(true);
      expect(unshuffle(want, elem).equals(src)).toBe(true);
    }
  });

  it("auto keeps the shuffle only when it shrinks the sample by ≥ 10 % (realistic bf16 values save less)", async () => {
    const dir = tmp();
    generateKvDump({ dir: join(dir, "dump"), nLayers: 4, nKvHeads: 8, headDim: 128, sequences: 2, prefixBlocks: 1, ownBlocks: 3, zeroBlocks: 1 });
    const { meta } = await snap(dir, { path: "dump" });
    expect(meta.shuffle.sample.saving_pct).toBeGreaterThan(0);
    expect(meta.shuffle.sample.saving_pct).toBeLessThan(10);
    expect(meta.shuffle.applied).toBe(false);
    const forced = await snap(dir, { path: "dump", shuffle: "on" });
    expect(forced.meta.shuffle.applied).toBe(true);
  });
});

describe("kv: broken dumps", () => {
  it("a data file of the wrong size for the declared shape", async () => {
    const dir = tmp();
    const d = generateKvDump({ dir: join(dir, "dump"), nLayers: 2 });
    const f = join(d.dir, "data", "layer-001.bin");
    truncateSync(f, statSync(f).size - 1);
    await expectSnapFails(dir, { path: "dump" }, "MEMSNAP_SOURCE_INVALID",
      new RegExp(`data file data/layer-001\\.bin is ${statSync(f).size} bytes, but its ${d.numBlocks} page\\(s\\) of \\[2, 16, 2, 64\\] bf16 \\(${d.pageBytes} bytes each\\) need ${d.numBlocks * d.pageBytes}`));
  });

  it("a page whose bytes do not match the manifest's sha256 (and a zero flag that lies)", async () => {
    const dir = tmp();
    const d = generateKvDump({ dir: join(dir, "dump"), nLayers: 2, shuffleBlocks: false });
    const m = JSON.parse(readFileSync(d.manifestPath, "utf8"));
    const victim = m.pages.find((p: { layer: number; block: number; zero: boolean }) => p.layer === 1 && !p.zero && p.block === 3);
    const f = join(d.dir, victim.file);
    const bytes = readFileSync(f);
    bytes[victim.offset + 100] = bytes[victim.offset + 100]! ^ 0x40;
    writeFileSync(f, bytes);
    await expectSnapFails(dir, { path: "dump" }, "MEMSNAP_SOURCE_DIGEST_MISMATCH",
      new RegExp(`page L1/B3 \\(${victim.file} at offset ${victim.offset}\\) hashes to sha256:[0-9a-f]{64}, but the dump's manifest says sha256:${victim.sha256}`));

    const d2 = generateKvDump({ dir: join(dir, "dump2"), nLayers: 1, hashes: false });
    const m2 = JSON.parse(readFileSync(d2.manifestPath, "utf8"));
    m2.pages[0].zero = true;
    writeFileSync(d2.manifestPath, JSON.stringify(m2));
    await expectSnapFails(dir, { path: "dump2" }, "MEMSNAP_SOURCE_DIGEST_MISMATCH", /page L0\/B0 .* is marked zero but holds non-zero bytes/);
  });

  it("manifest problems: bad shape, bad page size, missing data file, unsafe paths, unknown blocks", async () => {
    const dir = tmp();
    const d = generateKvDump({ dir: join(dir, "dump"), nLayers: 1 });
    const good = readFileSync(d.manifestPath, "utf8");
    const edit = (f: (m: any) => void): void => {
      const m = JSON.parse(good);
      f(m);
      writeFileSync(d.manifestPath, JSON.stringify(m));
    };
    edit((m) => { m.page.shape = [2, 16, 2, 32]; });
    await expectSnapFails(dir, { path: "dump" }, "MEMSNAP_SOURCE_INVALID", /page\.shape \[2,16,2,32\] does not match/);
    edit((m) => { m.page.bytes = 1234; });
    await expectSnapFails(dir, { path: "dump" }, "MEMSNAP_SOURCE_INVALID", /page\.bytes 1234 is not 2 × 16 × 2 × 64 × 2 = 8192/);
    edit((m) => { m.pages[0].file = "../outside.bin"; });
    await expectSnapFails(dir, { path: "dump" }, "MEMSNAP_SOURCE_INVALID", /not a safe relative path/);
    edit((m) => { m.sequences[0].blocks.push(9999); });
    await expectSnapFails(dir, { path: "dump" }, "MEMSNAP_SOURCE_INVALID", /names block 9999, which has no page/);
    edit((m) => { m.dtype = "int4"; });
    await expectSnapFails(dir, { path: "dump" }, "MEMSNAP_SOURCE_INVALID", /unknown dtype "int4"/);
    edit(() => undefined);
    unlinkSync(join(d.dir, "data", "layer-000.bin"));
    await expectSnapFails(dir, { path: "dump" }, "MEMSNAP_SOURCE_INVALID", /data file data\/layer-000\.bin named by kv-manifest\.json: .* is missing/);
    await expectSnapFails(dir, { path: "nowhere" }, "MEMSNAP_SOURCE_MISSING");
    await expectSnapFails(dir, { path: "dump/data" }, "MEMSNAP_SOURCE_INVALID", /cannot tell what/);
    await expectSnapFails(dir, { path: "dump", shape: { n_layers: 7, n_kv_heads: 2, head_dim: 64, dtype: "bf16" } }, "MEMSNAP_SOURCE_INVALID", /n_layers 1, the config's shape says 7/);
  });

  it("the manifest is read as it streams: member order does not matter, and every page check still holds", async () => {
    const dir = tmp();
    const d = generateKvDump({ dir: join(dir, "dump"), nLayers: 2, sequences: 2, prefixBlocks: 1, ownBlocks: 2, zeroBlocks: 1 });
    const good = JSON.parse(readFileSync(d.manifestPath, "utf8")) as Record<string, unknown>;
    const write = (m: Record<string, unknown>, text?: string): void => writeFileSync(d.manifestPath, text ?? JSON.stringify(m, null, 1));
    // pages first, the header after: the page checks that need the header run once it is known
    const { pages, ...rest } = good;
    write({ pages, ...rest });
    const r = await snap(dir, { path: "dump" });
    expect(r.manifest.layers[0]!.meta!.pages_total).toBe((pages as unknown[]).length);
    const edit = (f: (m: any) => void): void => {
      const m = JSON.parse(JSON.stringify({ pages, ...rest }));
      f(m);
      write(m);
    };
    edit((m) => { m.pages[3].layer = 2; });
    await expectSnapFails(dir, { path: "dump" }, "MEMSNAP_SOURCE_INVALID", /pages\[3\]\.layer 2 is not in 0\.\.1/);
    edit((m) => { m.pages[2].offset = 100; });
    await expectSnapFails(dir, { path: "dump" }, "MEMSNAP_SOURCE_INVALID", /pages\[2\]\.offset 100 is not a multiple of the page size 8192/);
    edit((m) => { m.pages.push({ ...m.pages[1] }); });
    await expectSnapFails(dir, { path: "dump" }, "MEMSNAP_SOURCE_INVALID", /layer \d+ block \d+ is listed twice/);
    edit((m) => { m.pages[1].file = "data/elsewhere.bin"; });
    await expectSnapFails(dir, { path: "dump" }, "MEMSNAP_SOURCE_INVALID", /pages\[1\]\.file data\/elsewhere\.bin is not in data_files/);
    edit((m) => { m.pages[0].sha256 = "xyz"; });
    await expectSnapFails(dir, { path: "dump" }, "MEMSNAP_SOURCE_INVALID", /pages\[0\]\.sha256 "xyz" is not a hex SHA-256/);
    write(good, JSON.stringify(good).slice(0, -20));
    await expectSnapFails(dir, { path: "dump" }, "MEMSNAP_SOURCE_INVALID", /kv-manifest\.json is not valid JSON/);
  });

  it("a manifest rewritten between planning and packing (same size) is MEMSNAP_SOURCE_CHANGED", async () => {
    const dir = tmp();
    const d = generateKvDump({ dir: join(dir, "dump"), nLayers: 1 });
    const cap = await kvSource.capture({ kind: "kv", name: "kv", path: "dump" }, { baseDir: dir, tmpDir: dir });
    const text = readFileSync(d.manifestPath, "utf8");
    writeFileSync(d.manifestPath, text.replace('"format"', '"formax"')); // same size, other bytes
    let err: unknown;
    try {
      for await (const a of cap.artifacts) for await (const _ of a.open()) { /* read */ }
    } catch (e) {
      err = e;
    } finally {
      await cap.cleanup?.();
    }
    expectErr(err, "MEMSNAP_SOURCE_CHANGED", /kv-manifest\.json/);
  });

  it("rejects bad config", () => {
    const bad = (src: Record<string, unknown>, code: string): void => {
      expect(() => parseConfig({ agent: "a", sources: [{ kind: "kv", name: "kv", path: "x", ...src }] }, null, "/")).toThrow(expect.objectContaining({ code }));
    };
    bad({ format: "lmcache" }, "MEMSNAP_CONFIG_INVALID");
    bad({ format: "vllm" }, "MEMSNAP_CONFIG_INVALID");
    bad({ shuffle: "yes" }, "MEMSNAP_CONFIG_INVALID");
    bad({ shape: { n_layers: 1, n_kv_heads: 1, head_dim: 1, dtype: "int8" } }, "MEMSNAP_CONFIG_INVALID");
    bad({ shape: { n_layers: 0, n_kv_heads: 1, head_dim: 1, dtype: "bf16" } }, "MEMSNAP_CONFIG_INVALID");
    bad({ shape: { n_layers: 1, n_kv_heads: 1, head_dim: 1, dtype: "bf16", heads: 2 } }, "MEMSNAP_CONFIG_UNKNOWN_KEY");
    bad({ compress: true }, "MEMSNAP_CONFIG_UNKNOWN_KEY");
  });
});

describe("kv: other input formats", () => {
  it("a ProcessFork paged-batchinvariant-v1 page manifest (blob, JSON file, raw page blobs)", async () => {
    const dir = tmp();
    const store = join(dir, "store");
    const pc = writePagedCache(store, { pages: ["a", "b", "a", null, null], nLayers: 2, nHeads: 2, headDim: 16 });
    // 5 pages × (k, v) = 10 original pages; "a" twice and two zero pages (K = V = zeros).
    const zst = blobPath(store, pc.manifest);
    const r1 = await roundTrip(dir, { path: relative(dir, zst) }, store);
    expect(r1.meta.format).toBe("pfimg-paged");
    expect(r1.meta.pages_total).toBe(10);
    expect(r1.meta.pages_zero).toBe(4);
    expect(r1.meta.pages_unique).toBe(4);
    expect(r1.meta.shuffle.applied).toBe(false); // zstd blobs are kept as stored

    // The uncompressed manifest as a file in the store directory, format given.
    writeFileSync(join(store, "cache-manifest.json"), pc.json);
    const r2 = await snap(dir, { path: "store", format: "pfimg-paged" });
    expect(r2.meta.manifest).toBe("cache-manifest.json");
    expect(r2.meta.pages_total).toBe(10);

    // Raw (uncompressed) page blobs: stored deduplicated, shuffled when it pays.
    for (const p of pc.pages) {
      for (const dg of [p.k, p.v]) {
        const z = blobPath(store, dg);
        try {
          writeFileSync(z.slice(0, -4), zstd.decompress(readFileSync(z)));
          unlinkSync(z);
        } catch { /* already converted (a repeated page) */ }
      }
    }
    unlinkSync(zst); // the dump is now cache-manifest.json and the raw pages
    const r3 = await roundTrip(dir, { path: "store/cache-manifest.json", shuffle: "on" }, store);
    expect(r3.meta.pages_total).toBe(10);
    expect(r3.meta.pages_unique).toBe(4);
    expect(r3.meta.pages_zero).toBe(4);
    expect(r3.paths.filter((p) => p.startsWith("kv/pages/") && /\.s2@\d+\.\d+$/.test(p))).toHaveLength(4);

    // A missing page blob names the page.
    unlinkSync(blobPath(store, pc.pages[1]!.v).slice(0, -4));
    await expectSnapFails(dir, { path: "store/cache-manifest.json" }, "MEMSNAP_SOURCE_INVALID", new RegExp(`blob ${pc.pages[1]!.v} \\(page v of page 1\\) is missing`));
  });

  it("LMCache chunk files with the shape from the config: dedup by content across prefix hashes", async () => {
    const dir = tmp();
    const shape = { n_layers: 2, n_kv_heads: 2, head_dim: 32, dtype: "bf16" as const, block_size: 16, tokens_per_chunk: 64 };
    const g = generateLmcacheChunks({ dir: join(dir, "lm"), shape, sequences: 3, prefixChunks: 2, ownChunks: 2, lastTokens: 40 });
    // 3 sequences × 4 chunks; the 2 prefix chunks repeat under 3 names each.
    const { meta } = await roundTrip(dir, { path: "lm", format: "lmcache", shape }, g.dir);
    expect(meta.format).toBe("lmcache");
    expect(meta.pages_total).toBe(g.expected.pagesTotal);
    expect(meta.pages_unique).toBe(g.expected.pagesUnique);
    expect(meta.chunks).toBe(12);
    expect(meta.dedup_ratio).toBeCloseTo(g.expected.dedupRatio, 2);
    // Autodetected as LMCache when only the shape is given.
    const r = await snap(dir, { path: "lm", shape });
    expect(r.meta.format).toBe("lmcache");
    // A chunk that is not a whole number of tokens.
    writeFileSync(join(g.dir, "broken.kvchunk"), Buffer.alloc(1000));
    await expectSnapFails(dir, { path: "lm", format: "lmcache", shape }, "MEMSNAP_SOURCE_INVALID", /chunk file broken\.kvchunk is 1000 bytes, not 1\.\.64 tokens/);
  });
});

async function* chunks(b: Buffer): AsyncGenerator<Buffer> {
  for (let i = 0; i < b.length; i += 5000) yield b.subarray(i, i + 5000);
}

describe("kv: deep verify and materialize", () => {
  it("deepVerify recomputes page hashes after un-shuffling and names the damaged artifact", async () => {
    const dv = kvSource.deepVerify!;
    const page = kvValues(3, "x", 8192, "bf16");
    const hex = sha(page);
    const ok2 = await dv({ entry: { path: `kv/pages/${hex}.s2`, layer: "kv" }, bytes: chunks(shuffle(page, 2)) });
    expect(ok2).toBeNull();
    expect(await dv({ entry: { path: `kv/pages/${hex}`, layer: "kv" }, bytes: chunks(page) })).toBeNull();
    // Stored shuffled, read as if not: the hash is of the original bytes, so it fails.
    expect(await dv({ entry: { path: `kv/pages/${hex}`, layer: "kv" }, bytes: chunks(shuffle(page, 2)) })).toMatch(new RegExp(`^kv/pages/${hex}: page hashes to`));
    const bad = shuffle(page, 2);
    bad[17] = bad[17]! ^ 1;
    expect(await dv({ entry: { path: `kv/pages/${hex}.s2`, layer: "kv" }, bytes: chunks(bad) })).toMatch(new RegExp(`^kv/pages/${hex}\\.s2: page hashes to sha256:[0-9a-f]{64} after un-shuffling, not the digest in its name`));
    expect(await dv({ entry: { path: `kv/pages/${hex}.s4`, layer: "kv" }, bytes: chunks(page.subarray(0, 8190)) })).toMatch(/not a whole number of 4-byte elements/);
    expect(await dv({ entry: { path: "kv/kv-index.json", layer: "kv" }, bytes: chunks(Buffer.from("{}")) })).toMatch(/^kv\/kv-index\.json: not a memsnap-kv-index document/);
    expect(await dv({ entry: { path: "kv/files/kv-manifest.json", layer: "kv" }, bytes: chunks(Buffer.from('{"format":"x"}')) })).toMatch(/^kv\/files\/kv-manifest\.json: .*format is "x"/);
    expect(await dv({ entry: { path: "kv/elsewhere", layer: "kv" }, bytes: chunks(Buffer.from("x")) })).toMatch(/not a kv layer path/);
  });

  it("materialize refuses a page that does not match its content hash", async () => {
    const dir = tmp();
    const d = generateKvDump({ dir: join(dir, "dump"), nLayers: 1 });
    const { path, manifest } = await snap(dir, { path: "dump", shuffle: "on" });
    // Restore normally, then rebuild from a damaged copy of the bundle-side layer.
    const out = join(dir, "r");
    await restoreToDir(path, out);
    expect(tree(join(out, "kv"))).toEqual(tree(d.dir));
    const layer = manifest.layers[0]!;
    const staged = join(dir, "staged");
    mkdirSync(join(staged, "pages"), { recursive: true });
    mkdirSync(join(staged, "files"), { recursive: true });
    // Re-create the bundle-side artifacts from the dump itself.
    const cap = await kvSource.capture(kvSource.parseConfig({ kind: "kv", name: "kv", path: "dump", shuffle: "on" }, "t"), { baseDir: dir, tmpDir: dir });
    for await (const a of cap.artifacts) {
      mkdirSync(join(staged, a.path, ".."), { recursive: true });
      writeFileSync(join(staged, a.path), await storedBytes(a));
    }
    const meta = await cap.finish!();
    const victim = readdirSync(join(staged, "pages"))[0]!;
    const vb = readFileSync(join(staged, "pages", victim));
    vb[0] = vb[0]! ^ 1;
    writeFileSync(join(staged, "pages", victim), vb);
    await expect(kvSource.materialize!(staged, { ...layer, meta })).rejects.toMatchObject({
      code: "MEMSNAP_ARTIFACT_HASH_MISMATCH", message: expect.stringContaining(`kv/pages/${victim}: page does not hash to its name`),
    });
  });
});

/** An artifact's bytes as the packer stores them (a page it shuffles, as its planes). */
async function storedBytes(a: { open: () => unknown; shuffle?: { elem: number } }): Promise<Buffer> {
  const parts: Buffer[] = [];
  for await (const c of a.open() as AsyncIterable<Buffer>) parts.push(c);
  const raw = Buffer.concat(parts);
  return a.shuffle ? shuffle(raw, a.shuffle.elem) : raw;
}

describe("kv: pages placed on restore (layer schema 2)", () => {
  /** Capture a dump and stage its artifacts the way extraction does (spool, placed parts, files). */
  async function staged(dir: string, shuffleMode: "on" | "off"): Promise<{ dump: string; stage: string; meta: Meta; layer: Manifest["layers"][number]; verified: Map<string, string>; placed: string[] }> {
    const d = generateKvDump({ dir: join(dir, "dump"), nLayers: 2 });
    const stage = join(dir, `stage-${randomBytes(3).toString("hex")}`);
    mkdirSync(stage, { recursive: true });
    const cap = await kvSource.capture(kvSource.parseConfig({ kind: "kv", name: "kv", path: "dump", shuffle: shuffleMode }, "t"), { baseDir: dir, tmpDir: dir });
    const spool = new RestoreSpool(stage, "kv");
    const verified = new Map<string, string>();
    const placed: string[] = [];
    for await (const a of cap.artifacts) {
      const body = await storedBytes(a);
      verified.set(`kv/${a.path}`, sha(body));
      const to = kvSource.restoreSpool!(a.path);
      if (to) {
        if (to !== true) placed.push(a.path);
        await spool.put(`kv/${a.path}`, a.path, body.length, [body], to === true ? null : to, () => undefined);
      } else {
        mkdirSync(join(stage, a.path, ".."), { recursive: true });
        writeFileSync(join(stage, a.path), body);
      }
    }
    await spool.close();
    const meta = await cap.finish!();
    return { dump: d.dir, stage, meta, layer: { name: "kv", kind: "kv", schema_version: 2, artifacts: 0, bytes: 0, meta }, verified, placed };
  }

  it("names each unshuffled page with its first place, writes it there, and leaves zero pages as holes", async () => {
    const dir = tmp();
    const s = await staged(dir, "off");
    expect(s.placed.length).toBeGreaterThan(0);
    for (const p of s.placed) expect(p).toMatch(/^pages\/[0-9a-f]{64}@[0-9]+\.[0-9]+$/);
    expect(readdirSync(s.stage).filter((n) => n.startsWith(".memsnap-spool-")).length).toBeGreaterThan(0);
    await kvSource.materialize!(s.stage, s.layer, s.verified);
    expect(tree(s.stage)).toEqual(tree(s.dump));
    // The data files hold zero pages: they are holes, not written blocks.
    const data = Object.keys(tree(s.dump)).filter((p) => p.endsWith(".bin"));
    const allocated = data.reduce((n, p) => n + statSync(join(s.stage, p)).blocks * 512, 0);
    const apparent = data.reduce((n, p) => n + statSync(join(s.stage, p)).size, 0);
    expect(allocated).toBeLessThan(apparent);
  });

  it("the same, checking every placed page itself when extraction vouched for none", async () => {
    const dir = tmp();
    const s = await staged(dir, "off");
    await kvSource.materialize!(s.stage, s.layer);
    expect(tree(s.stage)).toEqual(tree(s.dump));
  });

  it("shuffled pages are placed too (schema 3): put back in element order on extraction, and come back exactly", async () => {
    const dir = tmp();
    const s = await staged(dir, "on");
    expect(s.placed.length).toBeGreaterThan(0);
    expect(s.placed.every((p) => /\.s[24]@\d+\.\d+$/.test(p))).toBe(true);
    expect(existsSync(join(s.stage, ".memsnap-spool"))).toBe(false); // nothing went through the plain spool
    // The parts hold the pages as the dump has them, not their planes.
    const m = spoolMap(s.stage);
    const [off, len, file] = m[s.placed[0]!]!;
    const part = readFileSync(join(s.stage, `.memsnap-spool-${file}`)).subarray(off!, off! + len!);
    expect(sha(part)).toBe(/^pages\/([0-9a-f]{64})/.exec(s.placed[0]!)![1]);
    await kvSource.materialize!(s.stage, { ...s.layer, schema_version: 3 }, s.verified);
    expect(tree(s.stage)).toEqual(tree(s.dump));
  });

  it("refuses a shuffled page whose planes, put back in order, do not hash to its name", async () => {
    const dir = tmp();
    generateKvDump({ dir: join(dir, "dump"), nLayers: 1 });
    const cap = await kvSource.capture(kvSource.parseConfig({ kind: "kv", name: "kv", path: "dump", shuffle: "on" }, "t"), { baseDir: dir, tmpDir: dir });
    expect(cap.schemaVersion).toBe(3);
    const spool = new RestoreSpool(join(dir, "stage"), "kv");
    mkdirSync(join(dir, "stage"));
    let tried = 0;
    for await (const a of cap.artifacts) {
      const to = kvSource.restoreSpool!(a.path);
      if (to === false || to === true || !to.planes) continue;
      const body = await storedBytes(a);
      body[body.length - 1] = body[body.length - 1]! ^ 0x40; // the planes' bytes, as a (sealed) hostile bundle stores them
      await expect(spool.put(`kv/${a.path}`, a.path, body.length, [body], to, () => undefined)).rejects.toMatchObject({
        code: "MEMSNAP_ARTIFACT_HASH_MISMATCH",
        message: expect.stringContaining("do not hash to the digest in its name"),
      });
      // An odd length is not a whole number of elements.
      const odd = body.subarray(0, body.length - 1);
      await expect(spool.put(`kv/${a.path}.x`, `${a.path}.x`, odd.length, [odd], to, () => undefined)).rejects.toMatchObject({
        code: "MEMSNAP_ARTIFACT_HASH_MISMATCH",
      });
      // A header declaring more than a page may hold is refused before anything is gathered.
      const big = 64 * 1024 * 1024 + 2;
      await expect(spool.put(`kv/${a.path}.y`, `${a.path}.y`, big, [], to, () => undefined)).rejects.toMatchObject({
        code: "MEMSNAP_ARTIFACT_HASH_MISMATCH",
      });
      tried++;
      break;
    }
    await spool.release();
    expect(tried).toBe(1);
  });

  // The spool map: one JSON array per line, ["<name>", offset, length(, part)].
  const spoolMap = (stage: string): Record<string, number[]> => Object.fromEntries(readFileSync(join(stage, ".memsnap-spool.json"), "utf8")
    .split("\n").filter((l) => l !== "").map((l) => { const [k, ...v] = JSON.parse(l) as [string, ...number[]]; return [k, v]; }));
  const writeMap = (stage: string, m: Record<string, number[]>): void => writeFileSync(join(stage, ".memsnap-spool.json"),
    Object.entries(m).map(([k, v]) => `${JSON.stringify([k, ...v])}\n`).join(""));

  it("refuses a page placed off its tile, two pages at one place, a page placed in a file without tiles, and damaged placed bytes", async () => {
    const dir = tmp();
    const cases: [string, (s: Awaited<ReturnType<typeof staged>>) => void, RegExp][] = [
      ["off its tile", (s) => {
        const m = spoolMap(s.stage);
        m[s.placed[1]!]![0]! += 512;
        writeMap(s.stage, m);
      }, /placed off the file's tiles|where the index has another page/],
      ["at another page's place", (s) => {
        const m = spoolMap(s.stage);
        m[s.placed[1]!] = [...m[s.placed[0]!]!];
        writeMap(s.stage, m);
      }, /where the index has another page|placed off the file's tiles/],
      ["in a file the index does not tile", (s) => {
        const m = spoolMap(s.stage);
        m[s.placed[0]!]![2] = 999;
        writeMap(s.stage, m);
      }, /no part 999|placed in file 999|placed off the file's tiles/],
      ["damaged", (s) => {
        const m = spoolMap(s.stage);
        const [off, , file] = m[s.placed[0]!]!;
        const part = join(s.stage, `.memsnap-spool-${file}`);
        const b = readFileSync(part);
        b[off! + 3] = b[off! + 3]! ^ 0xff;
        writeFileSync(part, b);
        s.verified.clear();
      }, /page does not hash to its name/],
    ];
    for (const [what, damage, msg] of cases) {
      const s = await staged(dir, "off");
      damage(s);
      let err: unknown;
      try {
        await kvSource.materialize!(s.stage, s.layer, s.verified);
      } catch (e) {
        err = e;
      }
      expect(err, what).toBeDefined();
      expectErr(err, "MEMSNAP_ARTIFACT_HASH_MISMATCH", msg);
    }
  });

  /** Rewrite the staged kv-index.json with `edit`, and the layer meta's index_sha256 to match it (unless `keepSha`). */
  function tamper(s: Awaited<ReturnType<typeof staged>>, edit: (idx: any, meta: Meta) => void, keepSha = false): void {
    const path = join(s.stage, "kv-index.json");
    const idx = JSON.parse(readFileSync(path, "utf8"));
    const meta = { ...s.meta };
    edit(idx, meta);
    const bytes = Buffer.from(JSON.stringify(idx));
    writeFileSync(path, bytes);
    if (!keepSha) meta.index_sha256 = sha(bytes);
    s.layer = { ...s.layer, meta };
  }

  it("a real dump's index made hostile is refused before any dump file is written", async () => {
    const dir = tmp();
    const cases: [string, (idx: any, meta: Meta) => void, string, RegExp, boolean?][] = [
      ["a file under a data file", (idx) => {
        const v = idx.files.find((f: any) => f.artifact);
        idx.files.push({ ...v, path: `${idx.files.find((f: any) => f.tiles).path}/evil` });
      }, "MEMSNAP_UNSAFE_PATH", /under the file data\/layer-000\.bin/],
      ["a verbatim file over a data file's directory", (idx) => {
        const v = idx.files.find((f: any) => f.artifact);
        v.path = "data";
      }, "MEMSNAP_UNSAFE_PATH", /names data\/layer-000\.bin under the file data$/],
      ["a file in the rebuild's work directory", (idx) => { idx.files.find((f: any) => f.artifact).path = ".memsnap-work-kv-00000000/x"; }, "MEMSNAP_UNSAFE_PATH", /reserved path/],
      ["a data file of 2^53-1 bytes", (idx) => { idx.files.find((f: any) => f.tiles).bytes = 2 ** 53 - 1; }, "MEMSNAP_UNSAFE_BUNDLE", /more than 1099511627776 bytes/],
      ["a negative content size", (idx) => { idx.contents.find((c: any) => c.zero).bytes = -8192; }, "MEMSNAP_UNSAFE_BUNDLE", /has -8192 bytes/],
      ["a data file's bytes that are not its tiles'", (idx) => { idx.files.find((f: any) => f.tiles).bytes += 8192; }, "MEMSNAP_UNSAFE_BUNDLE", /its tiles hold/],
      ["a page marked zero", (idx) => { idx.contents.find((c: any) => !c.zero).zero = true; }, "MEMSNAP_ARTIFACT_HASH_MISMATCH", /is marked zero, but 8192 zero bytes hash to/],
      ["data files past bytes_total", (_idx, meta) => { meta.bytes_total -= 1; }, "MEMSNAP_UNSAFE_BUNDLE", /the layer declares \d+ \(bytes_total\)/],
      ["an index that is not the one index_sha256 names", (idx) => { idx.files[0].mode = 0o600; }, "MEMSNAP_ARTIFACT_HASH_MISMATCH", /the layer's index_sha256 is/, true],
    ];
    for (const [what, edit, code, msg, keepSha] of cases) {
      const s = await staged(dir, "off");
      tamper(s, edit, keepSha);
      let err: unknown;
      try {
        await kvSource.materialize!(s.stage, s.layer, s.verified);
      } catch (e) {
        err = e;
      }
      expect(err, what).toBeDefined();
      expectErr(err, code, msg);
      // Nothing rebuilt: the stage holds the bundle-side artifacts (moved aside, or not yet).
      for (const n of readdirSync(s.stage)) expect(n, what).toMatch(/^(\.memsnap-work-kv-[0-9a-f]{8}|kv-index\.json|pages|files|\.memsnap-spool.*)$/);
    }
  });

  it("a dump whose files were captured setuid and setgid comes back without those bits, within the umask", async () => {
    const dir = tmp();
    const d = generateKvDump({ dir: join(dir, "dump"), nLayers: 1 });
    const data = join(d.dir, "data", "layer-000.bin");
    chmodSync(data, 0o6777);
    chmodSync(d.manifestPath, 0o2644);
    const r = await snap(dir, { path: "dump" });
    const old = process.umask(0o022);
    try {
      for (const [umask, dataMode, manifestMode] of [[0o022, 0o755, 0o644], [0o077, 0o700, 0o600]] as const) {
        process.umask(umask);
        const out = join(dir, `r-${umask}`);
        await restoreToDir(r.path, out);
        expect(statSync(join(out, "kv", "data", "layer-000.bin")).mode & 0o7777).toBe(dataMode);
        expect(statSync(join(out, "kv", "kv-manifest.json")).mode & 0o7777).toBe(manifestMode);
      }
    } finally {
      process.umask(old);
    }
  });

  it("a spool on a full disk (64 KiB tmpfs) fails as MEMSNAP_DEST_FULL naming its part file", async (ctx) => {
    const dir = tmp();
    const mnt = join(dir, "tiny");
    mkdirSync(mnt);
    const m = spawnSync("mount", ["-t", "tmpfs", "-o", "size=64k", "tmpfs", mnt], { encoding: "utf8" });
    if (m.status !== 0) ctx.skip(`cannot mount a 64 KiB tmpfs (needs root/CAP_SYS_ADMIN): ${m.stderr || m.error?.message}`);
    try {
      const spool = new RestoreSpool(mnt, "kv");
      let err: unknown = null;
      try {
        for (let i = 0; i < 32; i++) {
          await spool.put(`kv/pages/p${i}`, `pages/p${i}`, 8192, [Buffer.alloc(8192, i + 1)], { file: 2, offset: i * 8192 }, () => undefined);
        }
        await spool.close();
      } catch (e) {
        err = e;
        await spool.release();
      }
      expect(err).toMatchObject({ code: "MEMSNAP_DEST_FULL" });
      expect((err as Error).message).toContain(".memsnap-spool-2");
    } finally {
      spawnSync("umount", [mnt]);
    }
  });

  it("the spool refuses a place past its bound and a part file made twice", async () => {
    const dir = tmp();
    const spool = new RestoreSpool(dir, "kv");
    await expect(spool.put("kv/pages/x", "pages/x", 10, [Buffer.alloc(10)], { file: 0, offset: 2 ** 40 }, () => undefined))
      .rejects.toMatchObject({ code: "MEMSNAP_UNSAFE_BUNDLE" });
    await spool.put("kv/pages/a", "pages/a", 4, [Buffer.from("abcd")], { file: 3, offset: 8192 }, () => undefined);
    await expect(spool.put("kv/pages/a", "pages/a", 4, [Buffer.from("abcd")], { file: 3, offset: 0 }, () => undefined))
      .rejects.toMatchObject({ code: "MEMSNAP_UNSAFE_PATH" });
    await spool.close();
    expect(statSync(join(dir, ".memsnap-spool-3")).size).toBe(8196);
    const again = new RestoreSpool(dir, "kv");
    await expect(again.put("kv/pages/b", "pages/b", 4, [Buffer.from("abcd")], { file: 3, offset: 0 }, () => undefined))
      .rejects.toMatchObject({ code: "MEMSNAP_UNSAFE_PATH" });
    await again.release();
  });
});
