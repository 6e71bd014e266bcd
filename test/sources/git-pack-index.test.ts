/**
 * The git layer's pack index (`repo.idx`, src/sources/git/pack-index.ts): a snapshot writes git's
 * index of the full bundle's pack (and nothing in the source repository); restore installs the
 * pack with it instead of `git index-pack`, after checking that the index describes exactly this
 * pack; a hostile index (unsorted names, offsets off the objects, another pack's index, a delta by
 * object name, a wrong size) is refused before anything is checked out; an index the layer meta
 * does not declare is ignored; verify --deep indexes the pack with git and compares.
 */
import { spawnSync } from "node:child_process";
import { createHash } from "node:crypto";
import { cpSync, existsSync, mkdirSync, readdirSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { Readable } from "node:stream";
import { afterEach, beforeAll, describe, expect, it } from "vitest";
import { isMemsnapError, parseConfig, restoreToDir, snapshot, verifyBundle, type LayerEntry } from "../../src/index.js";
import { materializeLayer } from "../../src/sources/git/materialize.js";
import { checkAndCopyPack, PACK_INDEX_ARTIFACT } from "../../src/sources/git/pack-index.js";
import { gitSource } from "../../src/sources/git/source.js";
import type { Artifact } from "../../src/sources/types.js";
import { tempDir } from "../helpers/cli.js";
import { commitAll, git, initRepo, repoRefs, writeFiles } from "../helpers/git.js";
import { requireTool } from "../helpers/tools.js";

const haveGit = requireTool("git");
const itGit = it.skipIf(!haveGit);

afterEach(() => {
  delete process.env.MEMSNAP_GIT_IMPL;
});

// ------------------------------------------------------------------------------ idx v2, by hand

interface Idx {
  names: Buffer[];
  crcs: number[];
  offsets: number[];
  packChecksum: Buffer;
}

function parseIdx(b: Buffer): Idx {
  const n = b.readUInt32BE(8 + 255 * 4);
  const names: Buffer[] = [];
  const crcs: number[] = [];
  const offsets: number[] = [];
  const at = 8 + 1024;
  for (let i = 0; i < n; i++) names.push(Buffer.from(b.subarray(at + i * 20, at + i * 20 + 20)));
  for (let i = 0; i < n; i++) crcs.push(b.readUInt32BE(at + n * 20 + i * 4));
  for (let i = 0; i < n; i++) offsets.push(b.readUInt32BE(at + n * 24 + i * 4));
  return { names, crcs, offsets, packChecksum: Buffer.from(b.subarray(at + n * 28, at + n * 28 + 20)) };
}

/** An index v2 of these entries, in the order given (not sorted), with a right fanout and checksum. */
function buildIdx(x: Idx): Buffer {
  const n = x.names.length;
  const head = Buffer.alloc(8 + 1024);
  head.writeUInt32BE(0xff744f63, 0);
  head.writeUInt32BE(2, 4);
  for (let b = 0; b < 256; b++) head.writeUInt32BE(x.names.filter((nm) => nm[0]! <= b).length, 8 + b * 4);
  const crc = Buffer.alloc(n * 4);
  const off = Buffer.alloc(n * 4);
  x.crcs.forEach((c, i) => crc.writeUInt32BE(c >>> 0, i * 4));
  x.offsets.forEach((o, i) => off.writeUInt32BE(o >>> 0, i * 4));
  const body = Buffer.concat([head, ...x.names, crc, off, x.packChecksum]);
  return Buffer.concat([body, createHash("sha1").update(body).digest()]);
}

const packOf = (bundle: Buffer): Buffer => bundle.subarray(bundle.indexOf("\n\nPACK") + 2);

// ------------------------------------------------------------------------------ fixtures

interface Layer {
  root: string;
  bundle: Buffer;
  idx: Buffer;
  meta: Record<string, unknown>;
}

/** Capture the git source at `root` and return its bundle, index and meta. */
async function capture(root: string): Promise<Layer> {
  const tmp = tempDir("memsnap-idx-cap-");
  const c = gitSource.parseConfig({ kind: "git", name: "mem", path: root, worktree: false }, "test");
  const cap = await gitSource.capture(c, { baseDir: "/", tmpDir: tmp });
  const got: Record<string, Buffer> = {};
  try {
    for await (const a of cap.artifacts) {
      const parts: Buffer[] = [];
      const src = a.open();
      for await (const ch of (src instanceof Readable ? src : Readable.from(src)) as AsyncIterable<Buffer>) parts.push(ch);
      got[a.path] = Buffer.concat(parts);
      expect(got[a.path]!.length, a.path).toBe(a.size);
    }
    const meta = (await cap.finish?.()) ?? {};
    return { root, bundle: got["repo.bundle"]!, idx: got[PACK_INDEX_ARTIFACT]!, meta };
  } finally {
    await cap.cleanup?.();
  }
}

/** A repository of ~60 objects. */
function smallRepo(): string {
  const root = initRepo(join(tempDir("memsnap-idx-"), "memdir"));
  for (let i = 0; i < 12; i++) {
    writeFiles(root, { [`notes/n${i % 5}.md`]: `# note ${i % 5}\n\n${"the agent remembered a fact. ".repeat(40)}revision ${i}\n` });
    commitAll(root, `memory ${i}`);
  }
  git(root, ["branch", "side", "HEAD~3"]);
  git(root, ["tag", "-a", "v1", "-m", "first release", "HEAD~1"]);
  return root;
}

/** Restore a layer of these artifacts with the git source's materialize; returns the work tree. */
async function materialize(l: Layer, bundle: Buffer, idx: Buffer | null, meta: Record<string, unknown> = l.meta): Promise<string> {
  const dir = join(tempDir("memsnap-idx-mat-"), "mem");
  mkdirSync(dir);
  writeFileSync(join(dir, "repo.bundle"), bundle);
  if (idx) writeFileSync(join(dir, PACK_INDEX_ARTIFACT), idx);
  const layer: LayerEntry = { name: "mem", kind: "git", schema_version: 3, artifacts: idx ? 2 : 1, bytes: bundle.length, meta };
  await materializeLayer(dir, layer);
  return dir;
}

async function refused(p: Promise<unknown>, msg: RegExp): Promise<void> {
  const e = await p.then(() => null, (x: unknown) => x);
  expect(e, `expected a refusal matching ${msg}`).not.toBeNull();
  if (!isMemsnapError(e)) throw e;
  expect(e.code, e.message).toBe("MEMSNAP_DEEP_VERIFY_FAILED");
  expect(e.message).toMatch(msg);
}

/** Run `fn` with a `git` on PATH that logs each command's arguments (then runs the real git); returns the log. */
async function gitLog(fn: () => Promise<unknown>): Promise<string[]> {
  const dir = tempDir("memsnap-idx-shim-");
  const real = spawnSync("sh", ["-c", "command -v git"], { encoding: "utf8" }).stdout.trim();
  writeFileSync(join(dir, "git"), `#!/bin/sh\necho "$*" >> ${dir}/log\nexec ${real} "$@"\n`, { mode: 0o755 });
  const saved = process.env.PATH;
  process.env.PATH = `${dir}:${saved ?? ""}`;
  try {
    await fn();
  } finally {
    process.env.PATH = saved;
  }
  return existsSync(join(dir, "log")) ? readFileSync(join(dir, "log"), "utf8").split("\n").filter(Boolean) : [];
}

const looseObjects = (repo: string): number => Number(/^count: (\d+)$/m.exec(git(repo, ["count-objects", "-v"]))![1]);
const packs = (repo: string): string[] => readdirSync(join(repo, ".git/objects/pack")).sort();

// ------------------------------------------------------------------------------ tests

describe("git pack index: snapshot", () => {
  itGit("a full bundle comes with git's index of its pack, written outside the source repository", async () => {
    const root = smallRepo();
    git(root, ["gc", "-q"]);
    const before = packs(root);
    const l = await capture(root);
    expect(packs(root)).toEqual(before); // no temporary pack files in the memdir
    expect(l.meta.bundle_index_bytes).toBe(l.idx.length);
    // It is the index git writes for that pack.
    const dir = tempDir("memsnap-idx-check-");
    writeFileSync(join(dir, "p.pack"), packOf(l.bundle));
    git(dir, ["index-pack", "-o", join(dir, "p.idx"), join(dir, "p.pack")]);
    expect(readFileSync(join(dir, "p.idx")).equals(l.idx)).toBe(true);
    expect(parseIdx(l.idx).packChecksum.equals(l.bundle.subarray(l.bundle.length - 20))).toBe(true);
  });

  itGit("an object directory whose path git's alternates list cannot hold gets no index (the bundle is fetched)", async () => {
    const root = initRepo(join(tempDir("memsnap-idx-colon-"), "mem:dir"));
    writeFiles(root, { "a.md": "a\n" });
    commitAll(root, "one");
    const l = await capture(root);
    expect(l.idx).toBeUndefined();
    expect(l.meta.bundle_index_bytes).toBeUndefined();
  });
});

describe("git pack index: restore", () => {
  let l: Layer;
  beforeAll(async () => {
    if (haveGit) l = await capture(smallRepo());
  });

  itGit("installs the pack with its index: no index-pack, one pack named by its checksum, the same repository", async () => {
    let dir = "";
    const log = await gitLog(async () => {
      dir = await materialize(l, l.bundle, l.idx);
    });
    expect(log.some((c) => /^(fetch|index-pack|bundle|unpack-objects)\b/.test(c)), log.join("\n")).toBe(false);
    expect(log.some((c) => /^update-ref -z --stdin/.test(c)), log.join("\n")).toBe(true);
    const name = `pack-${l.bundle.subarray(l.bundle.length - 20).toString("hex")}`;
    expect(packs(dir)).toEqual([`${name}.idx`, `${name}.pack`]);
    expect(readFileSync(join(dir, `.git/objects/pack/${name}.idx`)).equals(l.idx)).toBe(true);
    expect(readFileSync(join(dir, `.git/objects/pack/${name}.pack`)).equals(packOf(l.bundle))).toBe(true);
    expect(looseObjects(dir)).toBe(0);
    git(dir, ["fsck", "--full", "--strict", "--no-progress"]);
    expect(repoRefs(dir)).toEqual(repoRefs(l.root));
    expect(git(dir, ["status", "--porcelain"])).toBe("");
    expect(readFileSync(join(dir, "notes/n1.md"), "utf8")).toBe(readFileSync(join(l.root, "notes/n1.md"), "utf8"));
    expect(existsSync(join(dir, PACK_INDEX_ARTIFACT))).toBe(false);
  });

  itGit("an index the layer meta does not declare is ignored: the bundle is fetched", async () => {
    const { bundle_index_bytes: _, ...meta } = l.meta;
    let dir = "";
    const log = await gitLog(async () => {
      dir = await materialize(l, l.bundle, l.idx, meta);
    });
    expect(log.some((c) => /^fetch\b/.test(c)), log.join("\n")).toBe(true);
    expect(repoRefs(dir)).toEqual(repoRefs(l.root));
    expect(existsSync(join(dir, PACK_INDEX_ARTIFACT))).toBe(false);
  });

  itGit("isomorphic-git restores the same layer and leaves the index out", async () => {
    process.env.MEMSNAP_GIT_IMPL = "isomorphic";
    const dir = await materialize(l, l.bundle, l.idx);
    delete process.env.MEMSNAP_GIT_IMPL;
    expect(repoRefs(dir)).toEqual(repoRefs(l.root));
    expect(existsSync(join(dir, PACK_INDEX_ARTIFACT))).toBe(false);
  });

  itGit("refuses an index that does not describe exactly this pack", async () => {
    const good = parseIdx(l.idx);
    const n = good.names.length;
    const edit = (f: (x: Idx) => void): Buffer => {
      const x: Idx = { names: [...good.names], crcs: [...good.crcs], offsets: [...good.offsets], packChecksum: good.packChecksum };
      f(x);
      return buildIdx(x);
    };
    const packLen = packOf(l.bundle).length;
    const byOffset = [...good.offsets].sort((a, b) => a - b);
    const at = (o: number): number => good.offsets.indexOf(o);
    const cases: Array<[string, Buffer, RegExp]> = [
      ["unsorted names", edit((x) => { [x.names[3], x.names[4]] = [x.names[4]!, x.names[3]!]; }), /not in strict order|outside its fanout bucket/],
      ["a bad checksum", (() => { const b = Buffer.from(l.idx); b[8 + 1024 + n * 20] ^= 1; return b; })(), /checksum does not match its bytes/],
      ["an offset past the pack", edit((x) => { x.offsets[at(byOffset.at(-1)!)] = packLen + 100; }), /past the pack's end/],
      ["two objects at one offset", edit((x) => { x.offsets[at(byOffset[2]!)] = byOffset[1]!; }), /share an offset/],
      ["an offset inside an object", edit((x) => { x.offsets[at(byOffset[5]!)] = byOffset[5]! + 1; }), /offset|declares|type|delta/],
      ["no object right after the header", edit((x) => { x.offsets[at(12)] = 13; }), /does not start after the pack header/],
      ["another pack's index", edit((x) => { x.packChecksum = createHash("sha1").update("another pack").digest(); }), /not the index of this pack/],
      ["an object left out", edit((x) => { x.names.pop(); x.crcs.pop(); x.offsets.pop(); }), new RegExp(`holds ${n} objects, its index ${n - 1}`)],
      ["a truncated index", l.idx.subarray(0, l.idx.length - 30), /truncated|does not fit/],
      ["not an index", Buffer.alloc(2000, 0x41), /not a version 2 git pack index/],
    ];
    for (const [what, idx, msg] of cases) {
      const meta = { ...l.meta, bundle_index_bytes: idx.length };
      await refused(materialize(l, l.bundle, idx, meta), msg).catch((e: unknown) => {
        throw new Error(`${what}: ${(e as Error).message}`);
      });
    }
    // A size other than the meta declares.
    await refused(materialize(l, l.bundle, l.idx, { ...l.meta, bundle_index_bytes: l.idx.length + 8 }), /declares/);
  });

  itGit("refuses a pack with deltas by object name (a delta cycle could hide there), which memsnap never writes", async () => {
    const root = smallRepo();
    const tips = git(root, ["for-each-ref", "--format=%(objectname)"]);
    const pack = spawnSync("git", ["pack-objects", "--stdout", "--revs", "-q"], { cwd: root, input: tips, maxBuffer: 1 << 28 }).stdout;
    const dir = tempDir("memsnap-idx-ref-");
    writeFileSync(join(dir, "p.pack"), pack);
    git(dir, ["index-pack", "-o", join(dir, "p.idx"), join(dir, "p.pack")]);
    expect(git(dir, ["verify-pack", "-v", join(dir, "p.idx")])).toMatch(/chain length = 1: \d+ objects?/); // it has deltas
    const l2 = await capture(root);
    const bundle = Buffer.concat([l2.bundle.subarray(0, l2.bundle.indexOf("\n\nPACK") + 2), pack]);
    const idx = readFileSync(join(dir, "p.idx"));
    await refused(materialize(l2, bundle, idx, { ...l2.meta, bundle_index_bytes: idx.length }), /delta by object name/);
  });

  itGit("checkAndCopyPack leaves the pack bytes as they were (the copy is byte for byte)", async () => {
    const dir = tempDir("memsnap-idx-copy-");
    writeFileSync(join(dir, "b"), l.bundle);
    writeFileSync(join(dir, "i"), l.idx);
    const r = await checkAndCopyPack(join(dir, "b"), l.bundle.indexOf("\n\nPACK") + 2, join(dir, "i"), 20, join(dir, "p"));
    expect(r).toEqual({ objects: parseIdx(l.idx).names.length, packName: l.bundle.subarray(l.bundle.length - 20).toString("hex") });
    expect(readFileSync(join(dir, "p")).equals(packOf(l.bundle))).toBe(true);
  });
});

describe("git pack index: through a snapshot (hostile writer, valid seal)", () => {
  /** A snapshot of `root` whose git layer carries `idx` (as its index, declared in the meta) instead of git's. */
  async function forged(base: string, idx: (good: Buffer) => Buffer): Promise<string> {
    const config = parseConfig({ agent: "scribe", sources: [{ kind: "git", name: "mem", path: "memdir", worktree: false }] }, null, base);
    const src = config.sources[0]!;
    const real = src.impl.capture.bind(src.impl);
    config.sources[0] = {
      cfg: src.cfg,
      impl: {
        ...src.impl,
        capture: async (cfg, ctx) => {
          const cap = await real(cfg, ctx);
          let bytes = 0;
          return {
            ...cap,
            artifacts: (async function* () {
              for await (const a of cap.artifacts) {
                if (a.path !== PACK_INDEX_ARTIFACT) {
                  yield a;
                  continue;
                }
                const parts: Buffer[] = [];
                const s = a.open();
                for await (const ch of (s instanceof Readable ? s : Readable.from(s)) as AsyncIterable<Buffer>) parts.push(ch);
                const bad = idx(Buffer.concat(parts));
                bytes = bad.length;
                yield { ...a, size: bad.length, open: () => Readable.from([bad]) } satisfies Artifact;
              }
            })(),
            finish: async () => ({ ...((await cap.finish?.()) ?? {}), bundle_index_bytes: bytes }),
          };
        },
      },
    };
    const out = join(tempDir("memsnap-idx-forged-"), "s.memsnap");
    await snapshot({ config, out });
    return out;
  }

  let base: string;
  beforeAll(() => {
    if (!haveGit) return;
    base = tempDir("memsnap-idx-e2e-");
    cpSync(smallRepo(), join(base, "memdir"), { recursive: true });
  });

  itGit("verify --deep passes on a good snapshot and reports an index whose names lie about their objects", async () => {
    const good = await forged(base, (b) => b);
    const ok = await verifyBundle(good, { deep: true });
    expect(ok.findings).toEqual([]);
    // Two objects' offsets swapped: every structural check passes, only indexing the pack tells.
    const lying = await forged(base, (b) => {
      const x = parseIdx(b);
      [x.offsets[0], x.offsets[1]] = [x.offsets[1]!, x.offsets[0]!];
      return buildIdx(x);
    });
    expect((await verifyBundle(lying)).ok).toBe(true);
    const deep = await verifyBundle(lying, { deep: true });
    expect(deep.ok).toBe(false);
    expect(deep.findings).toEqual([expect.objectContaining({ code: "MEMSNAP_DEEP_VERIFY_FAILED" })]);
    expect(deep.findings[0]!.message).toMatch(/^mem\/repo\.idx: not the index git writes for mem\/repo\.bundle's pack$|^mem\/repo\.bundle: mem\/repo\.idx is not the index git writes/);
  });

  itGit("restore --to refuses a hostile index with the stable code, and leaves no destination", async () => {
    const bad = await forged(base, (b) => {
      const x = parseIdx(b);
      x.packChecksum = createHash("sha1").update("x").digest();
      return buildIdx(x);
    });
    const deep = await verifyBundle(bad, { deep: true });
    expect(deep.ok).toBe(false);
    expect(deep.findings[0]!.message).toMatch(/not the index git writes/);
    const to = join(tempDir("memsnap-idx-to-"), "r");
    const e = await restoreToDir(bad, to).then(() => null, (x: unknown) => x);
    expect(isMemsnapError(e) && e.code).toBe("MEMSNAP_DEEP_VERIFY_FAILED");
    expect((e as Error).message).toMatch(/mem\/repo\.bundle: the pack index is not the index of this pack/);
    expect(existsSync(to)).toBe(false);
  });
});
