/**
 * The walk and the small-file reads through the native/directio addon (scanDir, readFiles)
 * against node:fs (`MEMSNAP_NATIVE=0`): the same files in the same order with the same stats
 * (an incremental snapshot compares mtimes and ctimes exactly), the same left-out entries, the
 * same bundle index; and a file removed, grown, rewritten or replaced by a symlink after the
 * walk reported as it always was, whichever path read it.
 */
import { appendFileSync, mkdirSync, rmSync, statSync, symlinkSync, utimesSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { afterEach, describe, expect, it } from "vitest";
import { isMemsnapError, parseConfig, snapshot } from "../../src/index.js";
import { filesSource, type FilesConfig } from "../../src/sources/files.js";
import { readAhead } from "../../src/sources/prefetch.js";
import type { Artifact } from "../../src/sources/types.js";
import { walkFiles, walkStream } from "../../src/sources/walk.js";
import { nativeFs } from "../../src/util/native-fs.js";
import { tempDir } from "../helpers/cli.js";

const saved = process.env.MEMSNAP_NATIVE;
afterEach(() => {
  if (saved === undefined) delete process.env.MEMSNAP_NATIVE;
  else process.env.MEMSNAP_NATIVE = saved;
});

async function withNative<T>(on: boolean, fn: () => Promise<T>): Promise<T> {
  if (on) delete process.env.MEMSNAP_NATIVE;
  else process.env.MEMSNAP_NATIVE = "0";
  try {
    return await fn();
  } finally {
    if (saved === undefined) delete process.env.MEMSNAP_NATIVE;
    else process.env.MEMSNAP_NATIVE = saved;
  }
}

/** A tree with nested folders, a symlink, a FIFO-free special-less mix, odd names and an excluded folder. */
function tree(): string {
  const root = tempDir("memsnap-nfs-");
  for (let d = 0; d < 3; d++) {
    mkdirSync(join(root, `d${d}`, "deep"), { recursive: true });
    for (let i = 0; i < 40; i++) {
      writeFileSync(join(root, `d${d}`, `n${i}.md`), `note ${d}/${i}\n`.repeat(i));
      const t = new Date(1714979289000 + i * 37 + 0.5); // sub-millisecond times, which round and truncate differently
      utimesSync(join(root, `d${d}`, `n${i}.md`), t, t);
    }
    writeFileSync(join(root, `d${d}`, "deep", "x.json"), "{}");
  }
  writeFileSync(join(root, "Zeta.md"), "z");
  writeFileSync(join(root, "émoji-😀.md"), "valid UTF-8 name");
  writeFileSync(Buffer.from(join(root, "bad\xff.md"), "latin1"), "not UTF-8");
  symlinkSync(join(root, "Zeta.md"), join(root, "link.md"));
  mkdirSync(join(root, "skip"));
  writeFileSync(join(root, "skip", "no.md"), "excluded");
  writeFileSync(join(root, "big.md"), "b".repeat(200_000));
  return root;
}

const describeNative = nativeFs() ? describe : describe.skip;

describeNative("the walk with the addon and without", () => {
  it("finds the same files in the same order with the same stats, and leaves out the same", async () => {
    const root = tree();
    const opts = { exclude: ["/skip/"] };
    const a = await withNative(true, () => walkFiles(root, opts));
    const b = await withNative(false, () => walkFiles(root, opts));
    expect(a.files.length).toBe(3 * 41 + 3);
    const view = (r: typeof a) => r.files.map((f) => ({
      rel: f.rel, abs: f.abs, dev: f.stats.dev, ino: f.stats.ino, mode: f.stats.mode, size: f.stats.size,
      mtimeMs: f.stats.mtimeMs, ctimeMs: f.stats.ctimeMs, mtime: f.stats.mtime.getTime(),
    }));
    expect(view(a)).toEqual(view(b));
    // and as node:fs's own Stats says (its Dates round the milliseconds)
    for (const f of a.files) expect(f.stats.mtime.getTime(), f.rel).toBe(statSync(f.abs).mtime.getTime());
    expect(a.skipped).toEqual(b.skipped);
    expect(a.skipped).toMatchObject({ symlinks: 1, unsafe_names: 1 });
    expect(a.unsafe).toEqual(["bad\\xff.md"]);
  });

  it("a missing or unreadable folder is the same error", async () => {
    const root = tree();
    for (const on of [true, false]) {
      const e = await withNative(on, () => walkFiles(join(root, "nope"))).catch((x: unknown) => x);
      expect(isMemsnapError(e) && e.code).toBe("MEMSNAP_SOURCE_MISSING");
    }
    if (process.getuid?.() !== 0) {
      mkdirSync(join(root, "locked"));
      writeFileSync(join(root, "locked", "f.md"), "x");
      const { chmodSync } = await import("node:fs");
      chmodSync(join(root, "locked"), 0);
      for (const on of [true, false]) {
        const e = await withNative(on, async () => {
          const w = await walkStream(root);
          for await (const _ of w); // eslint-disable-line no-empty
        }).catch((x: unknown) => x);
        expect(isMemsnapError(e) && e.code).toBe("MEMSNAP_SOURCE_UNREADABLE");
      }
      chmodSync(join(root, "locked"), 0o700);
    }
  });
});

describeNative("small files read ahead in batches", () => {
  async function capture(root: string, between?: () => void): Promise<Map<string, Artifact>> {
    const cfg: FilesConfig = { kind: "files", name: "m", path: root };
    const cap = await filesSource.capture(cfg, { baseDir: root, tmpDir: tempDir("memsnap-nfs-tmp-") });
    between?.();
    const arts = new Map<string, Artifact>();
    for await (const a of cap.artifacts) arts.set(a.path, a);
    return arts;
  }

  async function outcome(a: Artifact): Promise<string> {
    try {
      const parts: Buffer[] = [];
      for await (const c of a.open() as AsyncIterable<Buffer>) parts.push(Buffer.from(c));
      const b = Buffer.concat(parts);
      if (b.length !== a.size) return `size ${b.length} of ${a.size}`;
      await a.check!();
      return b.toString();
    } catch (e) {
      return isMemsnapError(e) ? `${e.code}: ${e.message.replace(/^.*\//, "")}` : String(e);
    }
  }

  it("over 600 files (three batches) give the bytes node:fs gives", async () => {
    const root = tempDir("memsnap-nfs-");
    for (let i = 0; i < 600; i++) writeFileSync(join(root, `f${String(i).padStart(3, "0")}.md`), `file ${i}\n`.repeat(i % 50));
    const seen: string[] = [];
    const pres: number[] = [];
    const w = await walkStream(root);
    for await (const { f, pre } of readAhead(w, root, (x) => x.stats.size + 1)) {
      seen.push(f.rel);
      if (pre) pres.push(pre.bytes.length);
      expect(pre?.bytes.toString(), f.rel).toBe(`file ${Number(f.rel.slice(1, 4))}\n`.repeat(Number(f.rel.slice(1, 4)) % 50));
      expect(pre?.stats.ino).toBe(f.stats.ino);
    }
    expect(seen).toHaveLength(600);
    expect(pres).toHaveLength(600);
  });

  it("a file removed, grown, rewritten or replaced by a symlink after the walk: reported, not packed", async () => {
    const root = tempDir("memsnap-nfs-");
    for (const n of ["removed", "grown", "rewritten", "linked", "kept"]) writeFileSync(join(root, `${n}.md`), `${n} v1\n`);
    writeFileSync(join(root, "target.txt"), "elsewhere\n");
    const results: Record<string, Record<string, string>> = {};
    for (const on of [true, false]) {
      for (const n of ["removed", "grown", "rewritten", "linked", "kept"]) writeFileSync(join(root, `${n}.md`), `${n} v1\n`);
      rmSync(join(root, "linked.md"), { force: true });
      writeFileSync(join(root, "linked.md"), "linked v1\n");
      const arts = await withNative(on, () => capture(root, () => {
        rmSync(join(root, "removed.md"));
        appendFileSync(join(root, "grown.md"), "more\n");
        writeFileSync(join(root, "rewritten.md"), "rewritten v2\n"); // same size
        const t = Date.now() / 1000 + 7;
        utimesSync(join(root, "rewritten.md"), t, t);
        rmSync(join(root, "linked.md"));
        symlinkSync(join(root, "target.txt"), join(root, "linked.md"));
      }));
      const r: Record<string, string> = {};
      for (const [p, a] of arts) if (p !== "target.txt") r[p] = await outcome(a);
      results[on ? "native" : "node"] = r;
    }
    expect(results.native).toEqual({
      "grown.md": "size 10 of 9", // at most size + 1 bytes are read
      "kept.md": "kept v1\n",
      "linked.md": expect.stringMatching(/^MEMSNAP_SOURCE_CHANGED: linked\.md changed while it was captured \(it was replaced\)$/),
      "removed.md": expect.stringMatching(/^MEMSNAP_SOURCE_CHANGED: removed\.md changed while it was captured \(it was removed\)$/),
      "rewritten.md": expect.stringMatching(/^MEMSNAP_SOURCE_CHANGED: rewritten\.md changed while it was captured \(modified during capture\)$/),
    });
    expect(results.node).toEqual(results.native);
  });

  it("a snapshot's index is the same with the addon and without", async () => {
    const root = tree();
    const config = parseConfig({ agent: "a1", redaction: { enabled: true }, sources: [{ kind: "files", name: "m", path: ".", exclude: ["/skip/"] }] }, null, root);
    const outDir = tempDir("memsnap-nfs-out-");
    const index = async (on: boolean, out: string) => withNative(on, async () => {
      const r = await snapshot({ config, out: join(outDir, out) });
      return r.manifest.index!.map((e) => [e.path, e.size, e.sha256, e.mode, e.mtime]);
    });
    const a = await index(true, "a.memsnap");
    const b = await index(false, "b.memsnap");
    expect(a.length).toBe(3 * 41 + 3);
    expect(a).toEqual(b);
  });
});
