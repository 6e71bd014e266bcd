/**
 * pfimg source: ProcessFork image stores through the real pipeline (snapshot → verify →
 * restore), hostile stores, deep verify and materialize on damaged bytes.
 */
import { createHash, randomBytes } from "node:crypto";
import { createRequire } from "node:module";
import { appendFileSync, existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, statSync, unlinkSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, relative } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { isMemsnapError, parseConfig, restoreToDir, snapshot, verifyBundle, type Manifest } from "../../src/index.js";
import { pfimgSource } from "../../src/sources/pfimg/source.js";
import type { Artifact } from "../../src/sources/types.js";
import type { Redactor } from "../../src/redact/types.js";
import { reseal } from "../helpers/reseal.js";
import { blobPath, generatePfimgStore, imagePath, PF_MEDIA_TYPE, writeBlob, writeImage } from "../helpers/pfimg-store.js";

const require = createRequire(import.meta.url);
const zstd = require("zstd-napi") as { compress(b: Buffer, p?: { compressionLevel?: number }): Buffer; decompress(b: Buffer): Buffer };

const made: string[] = [];
function tmp(prefix = "memsnap-pfimg-"): string {
  const d = mkdtempSync(join(tmpdir(), prefix));
  made.push(d);
  return d;
}
afterAll(() => {
  for (const d of made.splice(0)) rmSync(d, { recursive: true, force: true });
});

const sha = (b: Buffer | string): string => createHash("sha256").update(b).digest("hex");
const hexOf = (digest: string): string => digest.replace(/^sha256:/, "");

/** Every regular file under `root` (relative path → sha256 of its bytes). */
function tree(root: string): Record<string, string> {
  const out: Record<string, string> = {};
  const walk = (d: string): void => {
    for (const e of readdirSync(d, { withFileTypes: true })) {
      const p = join(d, e.name);
      if (e.isDirectory()) walk(p);
      else if (e.isFile()) out[relative(root, p).split("\\").join("/")] = sha(readFileSync(p));
    }
  };
  walk(root);
  return out;
}

/** Recompute every digest of a store: blobs decompress to their name, manifests hash to theirs. */
function checkStore(root: string): number {
  let n = 0;
  for (const [rel] of Object.entries(tree(root))) {
    const bm = /^blobs\/sha256\/([0-9a-f]{2})\/([0-9a-f]{64})\.zst$/.exec(rel);
    const im = /^images\/([0-9a-f]{64})\.json$/.exec(rel);
    if (bm) {
      expect(bm[2]!.startsWith(bm[1]!)).toBe(true);
      expect(sha(zstd.decompress(readFileSync(join(root, rel)))), rel).toBe(bm[2]);
    } else if (im) {
      expect(sha(readFileSync(join(root, rel))), rel).toBe(im[1]);
    } else {
      throw new Error(`unexpected file in store: ${rel}`);
    }
    n++;
  }
  return n;
}

interface SnapOpts {
  store: string;
  images?: string[];
  withParents?: boolean;
}

async function snap(dir: string, o: SnapOpts): Promise<{ path: string; manifest: Manifest }> {
  const src: Record<string, unknown> = { kind: "pfimg", name: "pf", store: o.store };
  if (o.images) src.images = o.images;
  if (o.withParents !== undefined) src.with_parents = o.withParents;
  const config = parseConfig({ agent: "a", redaction: { enabled: false }, sources: [src] }, null, dir);
  const outDir = join(dir, "bundles");
  mkdirSync(outDir, { recursive: true });
  const out = join(outDir, `b-${randomBytes(3).toString("hex")}.memsnap`);
  const r = await snapshot({ config, out });
  return { path: r.path, manifest: r.manifest };
}

function expectErr(err: unknown, code: string, msg?: RegExp): void {
  expect(isMemsnapError(err), String(err)).toBe(true);
  expect((err as { code: string }).code, String(err)).toBe(code);
  if (msg) expect((err as Error).message).toMatch(msg);
}

/** A capture that fails, through the real pipeline: the code and message, and no bundle or temp file left. */
async function expectSnapFails(dir: string, o: SnapOpts, code: string, msg?: RegExp): Promise<void> {
  const outDir = join(dir, "bundles");
  mkdirSync(outDir, { recursive: true });
  const before = readdirSync(outDir).sort();
  let err: unknown;
  try {
    await snap(dir, o);
  } catch (e) {
    err = e;
  }
  expectErr(err, code, msg);
  expect(readdirSync(outDir).sort()).toEqual(before);
}


describe("pfimg: round trips", () => {
  it("bundles a whole store (root, forks, merge, CRIU procs) and restores a byte-identical, valid store", async () => {
    const dir = tmp();
    const store = join(dir, "store");
    const g = generatePfimgStore({ root: store, forks: 2, merge: true, criu: true, pages: 3, zeroPages: 2 });
    const before = tree(store);
    const { path, manifest } = await snap(dir, { store });
    const layer = manifest.layers[0]!;
    expect(layer.kind).toBe("pfimg");
    const meta = layer.meta as Record<string, any>;
    expect(meta.images).toHaveLength(4);
    expect(new Set(meta.images)).toEqual(new Set(g.images.map((i) => i.id)));
    expect(meta.blobs).toBe(g.blobs);
    expect(meta.stored_bytes).toBe(g.blobBytes);
    const merge = g.images.find((i) => i.kind === "merge")!;
    expect(meta.parents[merge.id]).toEqual(merge.parents);
    for (const k of ["model", "cache", "world", "effects", "trace", "image"]) {
      expect(meta.bytes_by_layer[k].blobs, k).toBeGreaterThan(0);
      expect(meta.bytes_by_layer[k].raw_bytes, k).toBeGreaterThan(0);
    }
    // Every file once: blobs shared by the four images are deduplicated.
    expect(layer.artifacts).toBe(Object.keys(before).length);

    const rep = await verifyBundle(path, { deep: true });
    expect(rep.ok, JSON.stringify(rep.findings)).toBe(true);
    expect(rep.checks.find((c) => c.name === "deep")?.status).toBe("passed");

    const out = join(dir, "restored");
    await restoreToDir(path, out);
    expect(tree(join(out, "pf"))).toEqual(before);
    expect(checkStore(join(out, "pf"))).toBe(Object.keys(before).length);
  });

  it("selects images; with_parents follows parents, without it only the image's own blobs", async () => {
    const dir = tmp();
    const store = join(dir, "store");
    const g = generatePfimgStore({ root: store, forks: 2 });
    const fork = g.images.find((i) => i.kind === "fork")!;
    const alone = await snap(dir, { store, images: [fork.id.toUpperCase().replace("SHA256:", "sha256:")] });
    const m1 = alone.manifest.layers[0]!.meta as Record<string, any>;
    expect(m1.images).toEqual([fork.id]);
    expect(m1.parents[fork.id]).toEqual([g.rootId]);
    const withP = await snap(dir, { store, images: [fork.id], withParents: true });
    const m2 = withP.manifest.layers[0]!.meta as Record<string, any>;
    expect(m2.images).toEqual([fork.id, g.rootId]);
    expect(m2.blobs).toBeGreaterThan(m1.blobs);
    const out = join(dir, "r");
    await restoreToDir(alone.path, out);
    const restored = tree(join(out, "pf"));
    expect(Object.keys(restored).filter((p) => p.startsWith("images/"))).toEqual([`images/${hexOf(fork.id)}.json`]);
    checkStore(join(out, "pf"));
  });

  it("accepts camelCase manifests and older cache manifests (page_size_bytes)", async () => {
    const dir = tmp();
    const store = join(dir, "store");
    generatePfimgStore({ root: store, camelCase: true, oldCacheShape: true });
    const one = readdirSync(join(store, "images"))[0]!;
    expect(readFileSync(join(store, "images", one), "utf8")).toContain('"schemaVersion":1');
    const before = tree(store);
    const { path, manifest } = await snap(dir, { store });
    expect((manifest.layers[0]!.meta as Record<string, any>).images).toHaveLength(2);
    const out = join(dir, "r");
    await restoreToDir(path, out);
    expect(tree(join(out, "pf"))).toEqual(before);
  });

  it("streams a big blob through the zstd worker and checks it", async () => {
    const dir = tmp();
    const store = join(dir, "store");
    mkdirSync(store);
    const big = randomBytes(3 * 1024 * 1024);
    const base = writeBlob(store, big, 1);
    expect(statSync(blobPath(store, base)).size).toBeGreaterThan(1024 * 1024);
    const id = writeImage(store, { schema_version: 1, media_type: PF_MEDIA_TYPE, model: { base: base, diff: null }, parents: [] }, { asBlob: false });
    const { path, manifest } = await snap(dir, { store });
    const meta = manifest.layers[0]!.meta as Record<string, any>;
    expect(meta.images).toEqual([id]);
    expect(meta.bytes_by_layer.model.raw_bytes).toBe(big.length);
    const out = join(dir, "r");
    await restoreToDir(path, out);
    expect(tree(join(out, "pf"))).toEqual(tree(store));

    // The same blob, altered: a valid frame of other bytes under the old name.
    const other = Buffer.from(big);
    other[12345] = other[12345]! ^ 1;
    writeFileSync(blobPath(store, base), zstd.compress(other, { compressionLevel: 1 }));
    await expectSnapFails(dir, { store }, "MEMSNAP_SOURCE_DIGEST_MISMATCH", new RegExp(`blob ${base} \\(model base, image ${id}\\) decompresses to content with digest`));
  });
});

describe("pfimg: broken and hostile stores", () => {
  it("a missing K page blob names the digest, the page and the image", async () => {
    const dir = tmp();
    const store = join(dir, "store");
    const g = generatePfimgStore({ root: store, pages: 4, zeroPages: 0 });
    // Find page 3's k blob through the root image's cache manifest.
    const m = JSON.parse(readFileSync(imagePath(store, g.rootId), "utf8"));
    const cm = JSON.parse(zstd.decompress(readFileSync(blobPath(store, m.cache.manifest))).toString("utf8"));
    const k3 = cm.pages.find((p: { ix: number }) => p.ix === 3).k as string;
    unlinkSync(blobPath(store, k3));
    await expectSnapFails(dir, { store, images: [g.rootId] }, "MEMSNAP_SOURCE_INVALID",
      new RegExp(`pfimg: blob ${k3} \\(cache page k of page 3, image ${g.rootId}\\) is missing`));
  });

  it("a blob whose content does not match its digest (streamed, structural, and not zstd at all)", async () => {
    const dir = tmp();
    const store = join(dir, "store");
    const g = generatePfimgStore({ root: store, forks: 0 });
    const m = JSON.parse(readFileSync(imagePath(store, g.rootId), "utf8"));
    const trace = m.trace.messages as string;
    const good = readFileSync(blobPath(store, trace));
    writeFileSync(blobPath(store, trace), zstd.compress(Buffer.from('{"content":"forged","role":"user"}\n')));
    await expectSnapFails(dir, { store }, "MEMSNAP_SOURCE_DIGEST_MISMATCH", new RegExp(`blob ${trace} \\(trace messages, image ${g.rootId}\\)`));
    writeFileSync(blobPath(store, trace), Buffer.from("this is not zstd"));
    await expectSnapFails(dir, { store }, "MEMSNAP_SOURCE_DIGEST_MISMATCH", /not a valid zstd frame/);
    writeFileSync(blobPath(store, trace), good);
    const fsTree = m.world.fs as string;
    writeFileSync(blobPath(store, fsTree), zstd.compress(Buffer.from('{"entries":[]}')));
    await expectSnapFails(dir, { store }, "MEMSNAP_SOURCE_DIGEST_MISMATCH", new RegExp(`blob ${fsTree} \\(world fs tree, image ${g.rootId}\\)`));
  });

  it("a manifest whose bytes do not hash to its id", async () => {
    const dir = tmp();
    const store = join(dir, "store");
    const g = generatePfimgStore({ root: store, forks: 0 });
    appendFileSync(imagePath(store, g.rootId), " ");
    await expectSnapFails(dir, { store }, "MEMSNAP_SOURCE_DIGEST_MISMATCH", new RegExp(`images/${hexOf(g.rootId)}\\.json hashes to sha256:[0-9a-f]{64}, not its id`));
  });

  it("a selected image that is not in the store, a parent that is not, a bad manifest, no store", async () => {
    const dir = tmp();
    const store = join(dir, "store");
    const g = generatePfimgStore({ root: store, forks: 1 });
    await expectSnapFails(dir, { store, images: [`sha256:${"ab".repeat(32)}`] }, "MEMSNAP_SOURCE_MISSING", /is not in the store/);
    rmSync(imagePath(store, g.rootId));
    const fork = g.images.find((i) => i.kind === "fork")!;
    await expectSnapFails(dir, { store, images: [fork.id], withParents: true }, "MEMSNAP_SOURCE_INVALID", /parent image .* is not in the store/);
    const bad = writeImage(store, { schema_version: 2, parents: [] });
    await expectSnapFails(dir, { store, images: [bad] }, "MEMSNAP_SOURCE_INVALID", /schema_version 2/);
    await expectSnapFails(dir, { store: join(dir, "nope") }, "MEMSNAP_SOURCE_MISSING");
  });

  it("rejects bad config", () => {
    const bad = (src: Record<string, unknown>, code: string): void => {
      expect(() => parseConfig({ agent: "a", sources: [{ kind: "pfimg", name: "pf", ...src }] }, null, "/")).toThrow(expect.objectContaining({ code }));
    };
    bad({ images: ["nope"] }, "MEMSNAP_CONFIG_INVALID");
    bad({ images: [] }, "MEMSNAP_CONFIG_INVALID");
    bad({ images: ["all", `sha256:${"0".repeat(64)}`] }, "MEMSNAP_CONFIG_INVALID");
    bad({ with_parents: "yes" }, "MEMSNAP_CONFIG_INVALID");
    bad({ layers: 1 }, "MEMSNAP_CONFIG_UNKNOWN_KEY");
  });
});

async function* chunks(b: Buffer): AsyncGenerator<Buffer> {
  for (let i = 0; i < b.length; i += 7000) yield b.subarray(i, i + 7000);
}

describe("pfimg: deep verify, materialize, redaction scan", () => {
  it("deepVerify names the damaged artifact", async () => {
    const dir = tmp();
    const store = join(dir, "store");
    const g = generatePfimgStore({ root: store, forks: 0 });
    const m = JSON.parse(readFileSync(imagePath(store, g.rootId), "utf8"));
    const hex = hexOf(m.trace.messages);
    const rel = `blobs/sha256/${hex.slice(0, 2)}/${hex}.zst`;
    const good = readFileSync(join(store, rel));
    const dv = pfimgSource.deepVerify!;
    expect(await dv({ entry: { path: `pf/${rel}`, layer: "pf" }, bytes: chunks(good) })).toBeNull();
    const forged = zstd.compress(Buffer.from("forged"));
    expect(await dv({ entry: { path: `pf/${rel}`, layer: "pf" }, bytes: chunks(forged) })).toMatch(new RegExp(`^pf/${rel}: blob decompresses to sha256:${sha("forged")}`));
    const cut = good.subarray(0, good.length - 3);
    expect(await dv({ entry: { path: `pf/${rel}`, layer: "pf" }, bytes: chunks(cut) })).toMatch(new RegExp(`^pf/${rel}: blob is not a valid zstd frame`));
    const irel = `images/${hexOf(g.rootId)}.json`;
    const img = readFileSync(join(store, irel));
    expect(await dv({ entry: { path: `pf/${irel}`, layer: "pf" }, bytes: chunks(img) })).toBeNull();
    expect(await dv({ entry: { path: `pf/${irel}`, layer: "pf" }, bytes: chunks(Buffer.concat([img, Buffer.from(" ")])) })).toMatch(new RegExp(`^pf/${irel}: image manifest hashes to`));
    expect(await dv({ entry: { path: "pf/other.txt", layer: "pf" }, bytes: chunks(Buffer.from("x")) })).toMatch(/^pf\/other\.txt: not a ProcessFork store path/);
  });

  it("verify --deep of a bundle reports a damaged blob by name", async () => {
    // A bundle whose blob artifact is consistent with the index but not with its digest
    // cannot come from memsnap (capture checks digests); build the layer by hand through the
    // Source API to prove the deep check runs on the real pipeline.
    const dir = tmp();
    const store = join(dir, "store");
    generatePfimgStore({ root: store, forks: 0 });
    const hex = sha("real content");
    const rel = `blobs/sha256/${hex.slice(0, 2)}/${hex}.zst`;
    mkdirSync(join(store, "blobs", "sha256", hex.slice(0, 2)), { recursive: true });
    writeFileSync(join(store, rel), zstd.compress(Buffer.from("other content")));
    const config = parseConfig({ agent: "a", redaction: { enabled: false }, sources: [{ kind: "files", name: "pf", path: "store" }] }, null, dir);
    // Re-label the files layer as pfimg so the pfimg deep check runs on it.
    config.sources[0]!.impl = { ...config.sources[0]!.impl, kind: "pfimg" };
    const r = await snapshot({ config, out: join(dir, "x.memsnap") });
    // The raw size every pfimg capture declares (deep verify decompresses within it).
    await reseal(r.path, (m) => { m.layers[0]!.meta = { ...m.layers[0]!.meta, raw_bytes: 1 << 30 }; });
    const rep = await verifyBundle(r.path, { deep: true });
    expect(rep.ok).toBe(false);
    expect(rep.findings.map((f) => f.code)).toEqual(["MEMSNAP_DEEP_VERIFY_FAILED"]);
    expect(rep.findings[0]!.path).toBe(`pf/${rel}`);
    expect(rep.findings[0]!.message).toMatch(new RegExp(`^pf/${rel}: blob decompresses to sha256:${sha("other content")}`));
  });

  it("materialize verifies the restored store and refuses a damaged one", async () => {
    const dir = tmp();
    const store = join(dir, "store");
    const g = generatePfimgStore({ root: store, forks: 0 });
    const layer = { name: "pf", kind: "pfimg", schema_version: 1, artifacts: 0, bytes: 0, meta: { raw_bytes: 1 << 30 } };
    await pfimgSource.materialize!(store, { ...layer });
    const m = JSON.parse(readFileSync(imagePath(store, g.rootId), "utf8"));
    writeFileSync(blobPath(store, m.effects.ledger), zstd.compress(Buffer.from("{}")));
    await expect(pfimgSource.materialize!(store, { ...layer })).rejects.toMatchObject({
      code: "MEMSNAP_ARTIFACT_HASH_MISMATCH", message: expect.stringContaining(`pf/blobs/sha256/${hexOf(m.effects.ledger).slice(0, 2)}/${hexOf(m.effects.ledger)}.zst`),
    });
    unlinkSync(blobPath(store, m.effects.ledger));
    await expect(pfimgSource.materialize!(store, { ...layer })).rejects.toMatchObject({ code: "MEMSNAP_ARTIFACT_HASH_MISMATCH", message: expect.stringContaining("incomplete") });
  });

  it("with redaction on (the default), a secret in a trace blob is reported unredacted, never rewritten", async () => {
    const dir = tmp();
    const store = join(dir, "store");
    generatePfimgStore({ root: store, forks: 0, secret: true });
    const config = parseConfig({ agent: "a", sources: [{ kind: "pfimg", name: "pf", store: "store" }] }, null, dir);
    await expect(snapshot({ config, out: join(dir, "plain.memsnap") })).rejects.toMatchObject({ code: "MEMSNAP_UNREDACTED_SECRETS" });
    const r = await snapshot({ config, out: join(dir, "allowed.memsnap"), allowUnredacted: true });
    const red = r.manifest.redaction as { unredacted: Record<string, Record<string, number>>; total_redacted: number };
    expect(red.total_redacted).toBe(0);
    const where = Object.keys(red.unredacted);
    expect(where).toHaveLength(1);
    expect(where[0]).toMatch(/^pf\/blobs\/sha256\/[0-9a-f]{2}\/[0-9a-f]{64}\.zst$/);
    const out = join(dir, "r");
    await restoreToDir(r.path, out);
    expect(tree(join(out, "pf"))).toEqual(tree(store));
    // A store without secrets snapshots cleanly with redaction on.
    const clean = join(dir, "clean");
    generatePfimgStore({ root: clean, forks: 1, criu: true });
    const c2 = parseConfig({ agent: "a", sources: [{ kind: "pfimg", name: "pf", store: "clean" }] }, null, dir);
    const r2 = await snapshot({ config: c2, out: join(dir, "clean.memsnap") });
    expect((r2.manifest.redaction as { total_unredacted: number }).total_unredacted).toBe(0);
  });

  it("scans text blobs with the redactor (scan only: the bytes are stored as they are)", async () => {
    const dir = tmp();
    const store = join(dir, "store");
    generatePfimgStore({ root: store, forks: 0, secret: true });
    const scanned: { artifact: string; text: string }[] = [];
    const redactor: Redactor = {
      candidate: (t) => t.includes("sk-ant-") || t.includes("role"),
      redactText: async () => { throw new Error("content-addressed blobs must not be rewritten"); },
      scanText: async (text, artifact) => { scanned.push({ artifact, text }); },
      redactArtifact: async () => { throw new Error("content-addressed blobs must not be rewritten"); },
      report: () => ({ policy: "test", rules_fired: [], redacted: {}, unredacted: {}, total_redacted: 0, total_unredacted: 0, bytes_scanned: 0 }),
      cleanup: async () => undefined,
    };
    const cfg = pfimgSource.parseConfig({ kind: "pfimg", name: "pf", store }, "test");
    const cap = await pfimgSource.capture(cfg, { baseDir: dir, tmpDir: dir, redactor });
    const arts: Artifact[] = [];
    for await (const a of cap.artifacts) {
      expect(a.text).toBeFalsy();
      let n = 0;
      const src = a.open() as AsyncIterable<Buffer>;
      for await (const c of src) n += c.length;
      expect(n).toBe(a.size);
      arts.push(a);
    }
    const hits = scanned.filter((s) => s.text.includes("sk-ant-api03-"));
    expect(hits).toHaveLength(1);
    expect(hits[0]!.artifact).toMatch(/^pf\/blobs\/sha256\/[0-9a-f]{2}\/[0-9a-f]{64}\.zst$/);
    expect(existsSync(join(store, hits[0]!.artifact.slice(3)))).toBe(true);
  });
});

describe("pfimg: a blob decompresses only as far as the layer declares (meta.raw_bytes)", () => {
  /** 128 MiB of zeros in ~4 KB: the frame a decompression bomb repeats. */
  const zeroFrame = zstd.compress(Buffer.alloc(128 * 1024 * 1024));

  /**
   * A bundle whose pfimg layer holds `blob` under the name of `named`'s digest, declaring
   * `raw_bytes` (undefined: no meta at all). Made as an attacker would: the blob is captured by a
   * files layer (which checks nothing of it) and the manifest relabelled pfimg and resealed.
   */
  async function bombBundle(dir: string, blob: Buffer, named: Buffer, rawBytes: number | undefined): Promise<string> {
    const hex = sha(named);
    mkdirSync(join(dir, "store", "blobs", "sha256", hex.slice(0, 2)), { recursive: true });
    writeFileSync(join(dir, "store", "blobs", "sha256", hex.slice(0, 2), `${hex}.zst`), blob);
    const config = parseConfig({ agent: "a", redaction: { enabled: false }, sources: [{ kind: "files", name: "pf", path: "store" }] }, null, dir);
    const r = await snapshot({ config, out: join(dir, "files.memsnap") });
    return reseal(r.path, (m) => {
      m.layers[0]!.kind = "pfimg";
      m.layers[0]!.meta = rawBytes === undefined ? undefined : { raw_bytes: rawBytes, blobs: 1 };
      if (rawBytes === undefined) delete m.layers[0]!.meta;
    }, join(dir, "hostile.memsnap"));
  }

  it("concatenated zero frames (0.3 MB, ~9 GiB out) are stopped at the declared size: MEMSNAP_UNSAFE_BUNDLE, restore and verify --deep", async () => {
    const dir = tmp();
    const bomb = Buffer.concat(Array.from({ length: 73 }, () => zeroFrame));
    expect(bomb.length).toBeLessThan(400_000);
    const path = await bombBundle(dir, bomb, Buffer.from("anything"), 1024 * 1024);
    const t0 = Date.now();
    const to = join(dir, "restored");
    const e = await restoreToDir(path, to).then(() => null, (x: unknown) => x);
    expectErr(e, "MEMSNAP_UNSAFE_BUNDLE", /decompress to more than the 1048576 bytes its manifest declares/);
    expect(existsSync(to)).toBe(false);
    const v = await verifyBundle(path, { deep: true });
    expect(v.findings.map((f) => [f.code, f.message])).toEqual([
      ["MEMSNAP_DEEP_VERIFY_FAILED", expect.stringMatching(/decompress to more than the 1048576 bytes its manifest declares/)],
    ]);
    // A loose bound: it fails in a second or two; unbounded, this takes a minute or more.
    expect(Date.now() - t0).toBeLessThan(20_000);
  }, 60_000);

  it("a blob that matches its name but is bigger than the layer declares is refused; one within it restores", async () => {
    const dir = tmp();
    const content = Buffer.from("x".repeat(8192));
    const path = await bombBundle(dir, zstd.compress(content), content, 100);
    expectErr(await restoreToDir(path, join(dir, "r1")).catch((x: unknown) => x), "MEMSNAP_UNSAFE_BUNDLE", /more than the 100 bytes/);
    const ok = await reseal(path, (m) => { (m.layers[0]!.meta as { raw_bytes: number }).raw_bytes = 8192; }, join(dir, "honest.memsnap"));
    // Within the budget the layer is checked as before: a lone blob is not a store with images, but its digest is right.
    await restoreToDir(ok, join(dir, "r2"));
    expect(readFileSync(join(dir, "r2", "pf", "blobs", "sha256", sha(content).slice(0, 2), `${sha(content)}.zst`)).length).toBeGreaterThan(0);
  });

  it("a layer that declares no raw size is refused before anything is decompressed (restore), and reported once (verify --deep)", async () => {
    const dir = tmp();
    const content = Buffer.from("hello");
    const path = await bombBundle(dir, zstd.compress(content), content, undefined);
    expectErr(await restoreToDir(path, join(dir, "r")).catch((x: unknown) => x), "MEMSNAP_UNSAFE_BUNDLE", /does not declare the layer's raw size/);
    const v = await verifyBundle(path, { deep: true });
    expect(v.findings.map((f) => [f.code, f.message])).toEqual([
      ["MEMSNAP_DEEP_VERIFY_FAILED", expect.stringMatching(/does not declare the layer's raw size/)],
    ]);
  });

  it("a blob whose content is not its name, within the budget, is MEMSNAP_ARTIFACT_HASH_MISMATCH", async () => {
    const dir = tmp();
    const path = await bombBundle(dir, zstd.compress(Buffer.from("other")), Buffer.from("named"), 1000);
    expectErr(await restoreToDir(path, join(dir, "r")).catch((x: unknown) => x), "MEMSNAP_ARTIFACT_HASH_MISMATCH", /not its name/);
  });
});
