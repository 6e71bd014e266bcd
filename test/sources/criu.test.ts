/**
 * The `criu` source end to end through the library (parseConfig → snapshot → verifyBundle /
 * restoreToDir) on synthetic CRIU dumps (scripts/lib/gen-criu.mjs): images directories,
 * incremental chains with `parent` links, procs.criu.v1 blobs, `criu dump` through a stand-in
 * criu; every validation failure with its code and nothing left behind; the plaintext refusal
 * for process memory; deep verify; and the one symlink restore makes.
 */
import { createHash } from "node:crypto";
import {
  chmodSync, existsSync, lstatSync, mkdirSync, readdirSync, readFileSync, readlinkSync, realpathSync, rmSync, symlinkSync,
  truncateSync, unlinkSync, writeFileSync,
} from "node:fs";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { describe, expect, it } from "vitest";
import { generateIdentity, isMemsnapError, parseConfig, restoreToDir, snapshot, verifyBundle, type Manifest } from "../../src/index.js";
import { SOURCE_KINDS } from "../../src/sources/registry.js";
import {
  classifyImage, decodeMessage, decodePagemapEntry, ImageFormatError, PE_PARENT as PE_PARENT_SRC, scanImage,
} from "../../src/sources/criu/format.js";
import type { SourceKind } from "../../src/sources/types.js";
import { runCli, tempDir } from "../helpers/cli.js";
import {
  appendBytes, dirItems, fVarint, genCriuDump, imageBytes, MAGIC, pagemapEntry, PE_PARENT, PE_PRESENT, pokeU32, tarOf, writeBlob,
} from "../helpers/criu-dump.js";

const GEN = fileURLToPath(new URL("../../scripts/lib/gen-criu.mjs", import.meta.url));
const sha = (b: Buffer): string => createHash("sha256").update(b).digest("hex");

interface Agent {
  dir: string;
  out: string;
}

function agent(): Agent {
  const dir = tempDir("memsnap-criu-");
  const out = join(dir, "out");
  mkdirSync(out);
  return { dir, out };
}

function config(a: Agent, sources: Record<string, unknown>[]) {
  return parseConfig({ agent: "a1", redaction: { enabled: false }, sources }, null, a.dir);
}

async function snap(a: Agent, sources: Record<string, unknown>[], extra: Record<string, unknown> = {}) {
  return snapshot({ config: config(a, sources), out: join(a.out, "b.memsnap"), allowPlaintextMemory: true, ...extra });
}

/** Expect a failed snapshot with `code`, and no bundle or temp file in the out dir. */
async function expectRefused(a: Agent, p: Promise<unknown>, code: string, msg?: RegExp): Promise<Error> {
  const e = await p.then(() => null, (x: unknown) => x as Error);
  expect(e, "snapshot should fail").not.toBeNull();
  expect(isMemsnapError(e) ? e.code : e).toBe(code);
  if (msg) expect(e!.message).toMatch(msg);
  expect(readdirSync(a.out)).toEqual([]);
  return e!;
}

/** Every regular file of `dir` (top level): name → bytes. */
function filesOf(dir: string): Record<string, Buffer> {
  const out: Record<string, Buffer> = {};
  for (const n of readdirSync(dir)) {
    const p = join(dir, n);
    if (lstatSync(p).isFile()) out[n] = readFileSync(p);
  }
  return out;
}

/** Restore and check every artifact against the index's digest. */
async function restoreChecked(bundle: string, to: string, manifest: Manifest, keys = {}): Promise<void> {
  await restoreToDir(bundle, to, { keys });
  const index = manifest.index ?? [];
  for (const e of index) expect(sha(readFileSync(join(to, e.path))), e.path).toBe(e.sha256);
}

describe("criu: images directories", () => {
  it("round-trips a dump byte for byte, with the layer meta", async () => {
    const a = agent();
    const dump = join(a.dir, "dump");
    const g = genCriuDump(dump, { pids: [100, 101], pagesPerProcess: 40, seed: 7 });
    writeFileSync(join(dump, "dump.log"), "criu log, not an image\n");
    const r = await snap(a, [{ kind: "criu", name: "proc", path: "dump" }]);
    const layer = r.manifest.layers[0]!;
    expect(layer.kind).toBe("criu");
    expect(layer.artifacts).toBe(g.files.length);
    expect(layer.meta).toMatchObject({
      origin: "dir", processes: 2, pids: [100, 101], images: g.files.length, pages_bytes: g.pagesBytes, parent_depth: 0,
      skipped: { other: 1, symlinks: 0, dirs: 0 },
    });
    const idx = r.manifest.index!;
    expect(idx.map((e) => e.path).sort()).toEqual(g.files.map((f) => `proc/images/${f}`).sort());
    expect(idx.find((e) => e.path === "proc/images/pages-1.img")!.kind).toBe("criu-pages");
    expect(idx.find((e) => e.path === "proc/images/core-100.img")!.kind).toBe("criu-image");
    const v = await verifyBundle(r.path, { deep: true });
    expect(v.findings).toEqual([]);
    expect(v.checks.find((c) => c.name === "deep")?.status).toBe("passed");
    const to = join(a.dir, "restored");
    await restoreChecked(r.path, to, r.manifest);
    const want = filesOf(dump);
    delete want["dump.log"];
    const got = filesOf(join(to, "proc", "images"));
    expect(Object.keys(got).sort()).toEqual(Object.keys(want).sort());
    for (const [n, b] of Object.entries(want)) expect(got[n]!.equals(b), n).toBe(true);
    expect(existsSync(join(to, "proc", "images", "parent"))).toBe(false);
  });

  it("accepts older pagemaps that use in_parent instead of flags", async () => {
    const a = agent();
    const base = join(a.dir, "dumps");
    genCriuDump(join(base, "1"), { pids: [5], pagesPerProcess: 4, legacyFlags: true });
    genCriuDump(join(base, "2"), { pids: [5], pagesPerProcess: 4, parentPages: 2, legacyFlags: true, parent: "../1" });
    const r = await snap(a, [{ kind: "criu", name: "proc", path: "dumps/2" }]);
    expect(r.manifest.layers[0]!.meta).toMatchObject({ parent_depth: 1, pages_bytes: 8 * 4096 });
  });

  it("captures an incremental chain as parent/… and restores images/parent as a relative link inside the layer", async () => {
    const a = agent();
    const base = join(a.dir, "dumps");
    const g1 = genCriuDump(join(base, "1"), { pids: [300], pagesPerProcess: 8, seed: 1 });
    const g2 = genCriuDump(join(base, "2"), { pids: [300], pagesPerProcess: 3, parentPages: 5, seed: 2, parent: "../1" });
    const g3 = genCriuDump(join(base, "3"), { pids: [300], pagesPerProcess: 2, parentPages: 6, seed: 3, parent: "../2" });
    const r = await snap(a, [{ kind: "criu", name: "proc", path: "dumps/3" }]);
    const paths = r.manifest.index!.map((e) => e.path);
    expect(paths).toContain("proc/images/pages-1.img");
    expect(paths).toContain("proc/parent/pages-1.img");
    expect(paths).toContain("proc/parent/parent/pages-1.img");
    expect(paths.filter((p) => p.endsWith("/parent"))).toEqual([]);
    expect(r.manifest.layers[0]!.meta).toMatchObject({
      parent_depth: 2, images: g1.files.length + g2.files.length + g3.files.length,
      pages_bytes: (8 + 3 + 2) * 4096,
    });
    const to = join(a.dir, "restored");
    await restoreChecked(r.path, to, r.manifest);
    const layer = join(to, "proc");
    const link = join(layer, "images", "parent");
    expect(lstatSync(link).isSymbolicLink()).toBe(true);
    expect(readlinkSync(link)).toBe("../parent");
    expect(realpathSync(link)).toBe(realpathSync(join(layer, "parent")));
    expect(lstatSync(join(layer, "parent", "parent")).isDirectory()).toBe(true);
    for (const [dir, src] of [["images", "3"], ["parent", "2"], ["parent/parent", "1"]] as const) {
      const want = filesOf(join(base, src));
      const got = filesOf(join(layer, dir));
      expect(Object.keys(got).sort(), dir).toEqual(Object.keys(want).sort());
      for (const [n, b] of Object.entries(want)) expect(got[n]!.equals(b), `${dir}/${n}`).toBe(true);
    }
    // Through the link, CRIU's view: images/parent/parent/… is the first dump.
    expect(readFileSync(join(link, "parent", "pages-1.img")).equals(readFileSync(join(base, "1", "pages-1.img")))).toBe(true);
  });

  it("refuses a parent link that points outside the captured dump series", async () => {
    const a = agent();
    const outside = tempDir("memsnap-criu-outside-");
    genCriuDump(join(outside, "prev"), { pids: [9] });
    const base = join(a.dir, "dumps");
    genCriuDump(join(base, "2"), { pids: [9], parentPages: 1, parent: join(outside, "prev") });
    await expectRefused(a, snap(a, [{ kind: "criu", name: "proc", path: "dumps/2" }]), "MEMSNAP_CRIU_INVALID", /outside the captured dump series/);
    rmSync(join(base, "2", "parent"));
    symlinkSync("../../..", join(base, "2", "parent"));
    await expectRefused(a, snap(a, [{ kind: "criu", name: "proc", path: "dumps/2" }]), "MEMSNAP_CRIU_INVALID", /outside the captured dump series/);
    rmSync(join(base, "2", "parent"));
    symlinkSync("..", join(base, "2", "parent"));
    await expectRefused(a, snap(a, [{ kind: "criu", name: "proc", path: "dumps/2" }]), "MEMSNAP_CRIU_INVALID", /outside/);
    rmSync(join(base, "2", "parent"));
    symlinkSync("../nope", join(base, "2", "parent"));
    await expectRefused(a, snap(a, [{ kind: "criu", name: "proc", path: "dumps/2" }]), "MEMSNAP_CRIU_INVALID", /does not resolve/);
  });

  it("refuses a parent chain that loops", async () => {
    const a = agent();
    const base = join(a.dir, "dumps");
    genCriuDump(join(base, "1"), { pids: [9], parent: "../2" });
    genCriuDump(join(base, "2"), { pids: [9], parent: "../1" });
    await expectRefused(a, snap(a, [{ kind: "criu", name: "proc", path: "dumps/2" }]), "MEMSNAP_CRIU_INVALID", /loops/);
  });

  it("refuses in-parent pages without a parent link", async () => {
    const a = agent();
    genCriuDump(join(a.dir, "d"), { pids: [9], parentPages: 2 });
    await expectRefused(a, snap(a, [{ kind: "criu", name: "proc", path: "d" }]), "MEMSNAP_CRIU_INVALID", /no parent link/);
  });
});

describe("criu: broken dumps are refused with MEMSNAP_CRIU_INVALID and leave nothing", () => {
  const cases: [string, (d: string) => void, RegExp][] = [
    ["bad common magic", (d) => pokeU32(join(d, "core-100.img"), 0, 0xdeadbeef), /core-100\.img: bad magic 0xdeadbeef/],
    ["unknown image magic", (d) => pokeU32(join(d, "ids-100.img"), 4, 0x12345678), /ids-100\.img: unknown image magic 0x12345678/],
    ["bad inventory magic", (d) => pokeU32(join(d, "inventory.img"), 0, MAGIC.PSTREE), /inventory\.img: bad magic/],
    ["service magic on a regular image", (d) => pokeU32(join(d, "fs-100.img"), 0, MAGIC.SERVICE), /fs-100\.img: service magic/],
    ["stray bytes after the last frame", (d) => appendBytes(join(d, "mm-100.img"), Buffer.from([1, 2, 3])), /mm-100\.img: 3 stray byte/],
    ["a frame running past EOF", (d) => appendBytes(join(d, "fdinfo-2.img"), Buffer.from([0x40, 0, 0, 0, 1])), /fdinfo-2\.img: frame 4 runs 63 byte\(s\) past the end/],
    ["a truncated header", (d) => truncateSync(join(d, "files.img"), 6), /files\.img: truncated header/],
    ["pages file larger than the pagemap says", (d) => appendBytes(join(d, "pages-1.img"), Buffer.alloc(4096)), /pages-1\.img has 20480 bytes but pagemap-100\.img lists 4 present page\(s\) = 16384 bytes/],
    ["pages file shorter than the pagemap says", (d) => truncateSync(join(d, "pages-2.img"), 4096), /pages-2\.img has 4096 bytes/],
    ["pages file missing", (d) => unlinkSync(join(d, "pages-2.img")), /pages-2\.img, which is missing/],
    ["an orphan pages file", (d) => writeFileSync(join(d, "pages-9.img"), Buffer.alloc(4096)), /pages-9\.img is not referenced by any pagemap/],
    ["core- missing for a pstree pid", (d) => unlinkSync(join(d, "core-101.img")), /pid 101 is in pstree\.img but core-101\.img is missing/],
    ["mm- missing for a pstree pid", (d) => unlinkSync(join(d, "mm-100.img")), /mm-100\.img is missing/],
    ["pagemap- missing for a pstree pid", (d) => { unlinkSync(join(d, "pagemap-101.img")); unlinkSync(join(d, "pages-2.img")); }, /pagemap-101\.img is missing/],
    ["no inventory", (d) => unlinkSync(join(d, "inventory.img")), /no inventory\.img/],
    ["no pstree", (d) => unlinkSync(join(d, "pstree.img")), /no pstree\.img/],
    ["a malformed pstree entry", (d) => writeFileSync(join(d, "pstree.img"), imageBytes(MAGIC.PSTREE, [Buffer.from([0x08, 0xff])])), /pstree\.img: truncated varint/],
    ["a pstree with pagemap magic", (d) => pokeU32(join(d, "pstree.img"), 4, MAGIC.PAGEMAP), /pstree\.img: has pagemap magic/],
    ["a pagemap with a bad entry", (d) => writeFileSync(join(d, "pagemap-100.img"), imageBytes(MAGIC.PAGEMAP, [fVarint(1, 1), fVarint(2, 4)])), /pagemap-100\.img: pagemap entry without vaddr/],
  ];
  for (const [what, damage, msg] of cases) {
    it(what, async () => {
      const a = agent();
      const d = join(a.dir, "dump");
      genCriuDump(d, { pids: [100, 101], pagesPerProcess: 4 });
      damage(d);
      await expectRefused(a, snap(a, [{ kind: "criu", name: "proc", path: "dump" }]), "MEMSNAP_CRIU_INVALID", msg);
    });
  }

  it("a missing path is MEMSNAP_SOURCE_MISSING", async () => {
    const a = agent();
    await expectRefused(a, snap(a, [{ kind: "criu", name: "proc", path: "nope" }]), "MEMSNAP_SOURCE_MISSING");
  });
});

describe("criu: procs.criu.v1 blobs", () => {
  it("unpacks a blob, validates it, and round-trips the images byte for byte", async () => {
    const a = agent();
    const d = join(tempDir("memsnap-criu-src-"), "images");
    genCriuDump(d, { pids: [42], pagesPerProcess: 9 });
    await writeBlob(join(a.dir, "proc.blob"), { format: "procs.criu.v1", pid: 42 }, dirItems(d));
    const r = await snap(a, [{ kind: "criu", name: "proc", path: "proc.blob" }]);
    expect(r.manifest.layers[0]!.meta).toMatchObject({ origin: "blob", blob_header: { format: "procs.criu.v1", pid: 42 }, processes: 1 });
    const to = join(a.dir, "restored");
    await restoreChecked(r.path, to, r.manifest);
    const want = filesOf(d);
    const got = filesOf(join(to, "proc", "images"));
    expect(Object.keys(got).sort()).toEqual(Object.keys(want).sort());
    for (const [n, b] of Object.entries(want)) expect(got[n]!.equals(b), n).toBe(true);
  });

  it("accepts a tar of the images directory itself (one top-level directory)", async () => {
    const a = agent();
    const d = join(tempDir("memsnap-criu-src-"), "images");
    genCriuDump(d, { pids: [42] });
    await writeBlob(join(a.dir, "proc.blob"), { format: "procs.criu.v1" }, [{ name: "images/", type: "directory" }, ...dirItems(d, "images/")]);
    const r = await snap(a, [{ kind: "criu", name: "proc", path: "proc.blob" }]);
    expect(r.manifest.layers[0]!.artifacts).toBe(readdirSync(d).length);
  });

  const bad: [string, () => Promise<Buffer>, RegExp][] = [
    ["no header line", async () => Buffer.from("{\"format\":\"procs.criu.v1\"}"), /no header line/],
    ["a header that is not JSON", async () => Buffer.concat([Buffer.from("nope\n"), await tarOf([{ name: "a", data: Buffer.alloc(1) }])]), /header line is not JSON/],
    ["a `../x` entry", async () => Buffer.concat([Buffer.from("{}\n"), await tarOf([{ name: "../x.img", data: Buffer.alloc(8) }])]), /unsafe tar entry "\.\.\/x\.img"/],
    ["an absolute entry", async () => Buffer.concat([Buffer.from("{}\n"), await tarOf([{ name: "/etc/x.img", data: Buffer.alloc(8) }])]), /absolute path/],
    ["a symlink entry", async () => Buffer.concat([Buffer.from("{}\n"), await tarOf([{ name: "core-1.img", type: "symlink", linkname: "/etc/passwd" }])]), /symlink entry/],
    ["an entry through a symlink", async () => Buffer.concat([Buffer.from("{}\n"), await tarOf([
      { name: "parent", type: "symlink", linkname: "../../.." }, { name: "parent/x.img", data: Buffer.alloc(8) },
    ])]), /goes through a symlink/],
    ["a malformed tar", async () => Buffer.concat([Buffer.from("{}\n"), Buffer.alloc(1024, 0x41)]), /tar after the header line is malformed/],
  ];
  for (const [what, make, msg] of bad) {
    it(`refuses a blob with ${what}`, async () => {
      const a = agent();
      writeFileSync(join(a.dir, "proc.blob"), await make());
      await expectRefused(a, snap(a, [{ kind: "criu", name: "proc", path: "proc.blob" }]), "MEMSNAP_CRIU_INVALID", msg);
    });
  }

  it("refuses a blob whose images fail validation", async () => {
    const a = agent();
    const d = join(tempDir("memsnap-criu-src-"), "images");
    genCriuDump(d, { pids: [42] });
    pokeU32(join(d, "mm-42.img"), 0, 1);
    await writeBlob(join(a.dir, "proc.blob"), {}, dirItems(d));
    await expectRefused(a, snap(a, [{ kind: "criu", name: "proc", path: "proc.blob" }]), "MEMSNAP_CRIU_INVALID", /mm-42\.img: bad magic/);
  });
});

describe("criu: process memory is never written in plaintext by accident", () => {
  it("refuses a plaintext bundle without the flag, before capturing anything", async () => {
    const a = agent();
    genCriuDump(join(a.dir, "dump"), {});
    const e = await expectRefused(a, snapshot({ config: config(a, [{ kind: "criu", name: "proc", path: "dump" }]), out: join(a.out, "b.memsnap") }),
      "MEMSNAP_PLAINTEXT_PROCESS_MEMORY", /proc hold process memory/);
    expect((e as { hint?: string }).hint).toMatch(/encrypt the bundle.*--allow-plaintext-memory/);
  });

  it("writes an encrypted bundle without the flag, which restores with the identity", async () => {
    const a = agent();
    const g = genCriuDump(join(a.dir, "dump"), { pids: [7, 8] });
    const { identity: id, recipient } = await generateIdentity();
    const r = await snapshot({ config: config(a, [{ kind: "criu", name: "proc", path: "dump" }]), out: join(a.out, "b.memsnap"), recipients: [recipient] });
    expect(r.manifest.payload.encryption).not.toBeNull();
    const v = await verifyBundle(r.path, { keys: { identities: [id] }, deep: true });
    expect(v.findings).toEqual([]);
    const to = join(a.dir, "restored");
    await restoreToDir(r.path, to, { keys: { identities: [id] } });
    for (const f of g.files) expect(readFileSync(join(to, "proc", "images", f)).equals(readFileSync(join(a.dir, "dump", f))), f).toBe(true);
  });

  it("the CLI refuses without --allow-plaintext-memory (exit 2) and writes with it", async () => {
    const a = agent();
    genCriuDump(join(a.dir, "dump"), {});
    writeFileSync(join(a.dir, "memsnap.json"), JSON.stringify({ agent: "a1", redaction: { enabled: false }, sources: [{ kind: "criu", name: "proc", path: "dump" }] }));
    const no = await runCli(["snapshot", "-c", "memsnap.json", "-o", "out/b.memsnap"], { cwd: a.dir });
    expect(no.code).toBe(2);
    expect(no.stderr).toContain("MEMSNAP_PLAINTEXT_PROCESS_MEMORY");
    expect(readdirSync(a.out)).toEqual([]);
    const yes = await runCli(["snapshot", "-c", "memsnap.json", "-o", "out/b.memsnap", "--allow-plaintext-memory"], { cwd: a.dir });
    expect(yes.stderr).toBe("");
    expect(yes.code).toBe(0);
    expect(readdirSync(a.out)).toEqual(["b.memsnap"]);
  });
});

describe("criu: running criu dump", () => {
  function fakeCriu(dir: string, checkOk: boolean): string {
    const p = join(dir, "fake-criu.mjs");
    writeFileSync(p, `#!/usr/bin/env node
import { genCriuDump } from ${JSON.stringify(GEN)};
const [op, ...rest] = process.argv.slice(2);
if (op === "check") {
  if (${checkOk}) { console.log("Looks good."); process.exit(0); }
  console.error("Error (criu/cr-check.c:1): vdso: kernel 6.13 is not supported");
  process.exit(1);
}
if (op === "dump") {
  const at = (f) => rest[rest.indexOf(f) + 1];
  if (!rest.includes("--leave-running")) { console.error("expected --leave-running"); process.exit(1); }
  genCriuDump(at("-D"), { pids: [Number(at("-t"))], pagesPerProcess: 3 });
  process.exit(0);
}
process.exit(2);
`);
    chmodSync(p, 0o755);
    return p;
  }

  it("runs criu check and criu dump --leave-running when the config names a pid, into a temp dir removed afterwards", async () => {
    const a = agent();
    const bin = fakeCriu(a.dir, true);
    const r = await snap(a, [{ kind: "criu", name: "proc", pid: 4242, criu_bin: bin }]);
    expect(r.manifest.layers[0]!.meta).toMatchObject({ origin: "dump", pid: 4242, pids: [4242], criu_bin: bin });
    expect(r.manifest.index!.map((e) => e.path)).toContain("proc/images/core-4242.img");
    expect(readdirSync(a.out)).toEqual(["b.memsnap"]);
  });

  it("dumps into path when it is given (new or empty), and refuses a non-empty one", async () => {
    const a = agent();
    const bin = fakeCriu(a.dir, true);
    await snap(a, [{ kind: "criu", name: "proc", pid: 77, criu_bin: bin, path: "dumps/now" }]);
    expect(existsSync(join(a.dir, "dumps", "now", "core-77.img"))).toBe(true);
    rmSync(join(a.out, "b.memsnap"));
    await expectRefused(a, snap(a, [{ kind: "criu", name: "proc", pid: 77, criu_bin: bin, path: "dumps/now" }]), "MEMSNAP_SOURCE_INVALID", /not empty/);
  });

  it("a failing criu check is MEMSNAP_SOURCE_UNREADABLE with the reason", async () => {
    const a = agent();
    const bin = fakeCriu(a.dir, false);
    await expectRefused(a, snap(a, [{ kind: "criu", name: "proc", pid: 1, criu_bin: bin }]), "MEMSNAP_SOURCE_UNREADABLE",
      /^criu dump needs a working criu \(criu check failed: .*kernel 6\.13 is not supported\)$/);
  });

  it("a missing criu is MEMSNAP_SOURCE_UNREADABLE", async () => {
    const a = agent();
    await expectRefused(a, snap(a, [{ kind: "criu", name: "proc", pid: 1, criu_bin: "/nonexistent/criu" }]), "MEMSNAP_SOURCE_UNREADABLE",
      /criu dump needs a working criu \(criu check failed: \/nonexistent\/criu not found\)/);
  });

  it("config: needs path or pid; rejects unknown keys and bad pids", () => {
    const a = agent();
    expect(() => config(a, [{ kind: "criu", name: "p" }])).toThrow(/needs "path"/);
    expect(() => config(a, [{ kind: "criu", name: "p", path: "x", bogus: 1 }])).toThrow(/unknown key "bogus"/);
    expect(() => config(a, [{ kind: "criu", name: "p", pid: 0 }])).toThrow(/"pid" must be an integer/);
  });
});

describe("criu: deep verify and restore safety", () => {
  /** A layer labelled criu whose artifacts are whatever files are under `dir` (bypasses capture's checks). */
  function unchecked(a: Agent, dir: string) {
    const c = config(a, [{ kind: "files", name: "proc", path: dir }]);
    const files = SOURCE_KINDS.files!;
    c.sources[0]!.impl = { ...files, kind: "criu", schemaVersion: 1 } as SourceKind<{ name: string }>;
    return c;
  }

  it("names the artifact whose framing is broken", async () => {
    const a = agent();
    const d = join(a.dir, "raw", "images");
    genCriuDump(d, { pids: [100] });
    appendBytes(join(d, "mm-100.img"), Buffer.from([9]));
    pokeU32(join(d, "core-100.img"), 4, 0x11111111);
    appendBytes(join(d, "pages-1.img"), Buffer.alloc(10));
    const r = await snapshot({ config: unchecked(a, "raw"), out: join(a.out, "b.memsnap") });
    const v = await verifyBundle(r.path, { deep: true });
    expect(v.ok).toBe(false);
    const deep = v.findings.filter((f) => f.code === "MEMSNAP_DEEP_VERIFY_FAILED");
    expect(deep.map((f) => f.path).sort()).toEqual(["proc/images/core-100.img", "proc/images/mm-100.img", "proc/images/pages-1.img"]);
    expect(deep.find((f) => f.path === "proc/images/mm-100.img")!.message).toMatch(/^proc\/images\/mm-100\.img: 1 stray byte/);
    expect(deep.find((f) => f.path === "proc/images/core-100.img")!.message).toMatch(/unknown image magic 0x11111111/);
    expect(deep.find((f) => f.path === "proc/images/pages-1.img")!.message).toMatch(/not a whole number of 4096-byte pages/);
    // The other checks still pass: the bytes are what the index says.
    expect(v.checks.find((c) => c.name === "artifacts")?.status).toBe("passed");
  });

  it("refuses to restore a bundle whose images/parent is a file (the link name is reserved)", async () => {
    const a = agent();
    mkdirSync(join(a.dir, "raw", "images"), { recursive: true });
    mkdirSync(join(a.dir, "raw", "parent"), { recursive: true });
    writeFileSync(join(a.dir, "raw", "images", "parent"), "not a link");
    writeFileSync(join(a.dir, "raw", "parent", "inventory.img"), "x");
    const r = await snapshot({ config: unchecked(a, "raw"), out: join(a.out, "b.memsnap") });
    const to = join(a.dir, "restored");
    const e = await restoreToDir(r.path, to).then(() => null, (x: unknown) => x);
    expect(isMemsnapError(e, "MEMSNAP_UNSAFE_PATH")).toBe(true);
    expect(existsSync(to)).toBe(false);
    expect(readdirSync(a.dir).filter((n) => n.includes("staging"))).toEqual([]);
  });
});

describe("criu-format", () => {
  it("classifies image names", () => {
    expect(classifyImage("inventory.img")).toBe("inventory");
    expect(classifyImage("pages-12.img")).toBe("pages");
    expect(classifyImage("route6-3.img")).toBe("raw");
    expect(classifyImage("tmpfs-dev-5.tar.gz.img")).toBe("raw");
    expect(classifyImage("stats-dump")).toBe("service");
    expect(classifyImage("irmap-cache")).toBe("service");
    expect(classifyImage("core-1.img")).toBe("framed");
    expect(classifyImage("dump.log")).toBeNull();
  });

  it("decodes protobuf fields by number and skips unknown ones", () => {
    const msg = Buffer.concat([fVarint(1, 0x7fff00001000n), fVarint(2, 3), Buffer.from([0x2a, 0x02, 0x61, 0x62]), fVarint(4, PE_PRESENT | PE_PARENT)]);
    const f = decodeMessage(msg);
    expect(f.map((x) => x.no)).toEqual([1, 2, 5, 4]);
    expect(decodePagemapEntry(msg)).toEqual({ vaddr: 0x7fff00001000n, nrPages: 3, flags: PE_PRESENT | PE_PARENT_SRC });
    expect(decodePagemapEntry(pagemapEntry({ vaddr: 4096, nrPages: 1, inParent: true })).flags).toBe(PE_PARENT);
    expect(decodePagemapEntry(pagemapEntry({ vaddr: 4096, nrPages: 1, inParent: false })).flags).toBe(PE_PRESENT);
    expect(() => decodeMessage(Buffer.from([0x08, 0x80]))).toThrow(ImageFormatError);
    expect(() => decodeMessage(Buffer.from([0x0a, 0x05, 0x01]))).toThrow(/runs past/);
  });

  it("scans frames split across arbitrary chunk boundaries", async () => {
    const img = imageBytes(MAGIC.PAGEMAP, [fVarint(1, 1), pagemapEntry({ vaddr: 0x1000, nrPages: 2, flags: PE_PRESENT })]);
    for (let cut = 1; cut < img.length; cut++) {
      const r = await scanImage("framed", (async function* () {
        yield img.subarray(0, cut);
        yield img.subarray(cut);
      })(), true);
      expect(r.type).toBe("pagemap");
      expect(r.frames).toBe(2);
      expect(r.collected.length).toBe(2);
    }
    const stats = imageBytes(MAGIC.STATS, [fVarint(1, 1)], { service: true });
    expect((await scanImage("service", (async function* () { yield stats; })())).type).toBe("stats");
  });
});
