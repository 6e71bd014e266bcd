/**
 * walkFiles and fileArtifact on real files: byte order, symlinks and private dirs skipped,
 * small files (synchronous reads) and big ones (streams) giving the same bytes either way,
 * and a file removed, grown or rewritten after the walk reported, never silently packed.
 */
import { appendFileSync, mkdirSync, rmSync, symlinkSync, utimesSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { randomBytes } from "node:crypto";
import { describe, expect, it } from "vitest";
import { isMemsnapError } from "../../src/errors.js";
import { fileArtifact, walkFiles } from "../../src/sources/walk.js";
import { tempDir } from "../helpers/cli.js";

async function bytesOf(chunks: AsyncIterable<Buffer>): Promise<Buffer> {
  const parts: Buffer[] = [];
  for await (const c of chunks) parts.push(Buffer.from(c)); // reused chunks must be copied
  return Buffer.concat(parts);
}

describe("walkFiles", () => {
  it("lists regular files in byte order of their paths, skipping symlinks and memsnap's private dirs", async () => {
    const root = tempDir("memsnap-walk-");
    mkdirSync(join(root, "b/c"), { recursive: true });
    mkdirSync(join(root, ".memsnap"));
    writeFileSync(join(root, "b/c/z.md"), "z");
    writeFileSync(join(root, "b/a.md"), "a");
    writeFileSync(join(root, "B.md"), "B");
    writeFileSync(join(root, ".memsnap/lock"), "x");
    symlinkSync(join(root, "B.md"), join(root, "link.md"));
    const r = await walkFiles(root);
    expect(r.files.map((f) => f.rel)).toEqual(["B.md", "b/a.md", "b/c/z.md"]);
    expect(r.skipped.symlinks).toBe(1);
  });

  it("walks thousands of entries and still lets timers run", async () => {
    const root = tempDir("memsnap-walk-");
    for (let d = 0; d < 20; d++) {
      mkdirSync(join(root, `d${d}`));
      for (let i = 0; i < 150; i++) writeFileSync(join(root, `d${d}`, `n${i}.md`), `${d}/${i}`);
    }
    let ticks = 0;
    const t = setInterval(() => { ticks++; }, 1);
    const r = await walkFiles(root);
    clearInterval(t);
    expect(r.files.length).toBe(3000);
    expect(ticks).toBeGreaterThan(0);
  });

  it("a missing root is MEMSNAP_SOURCE_MISSING", async () => {
    const err = await walkFiles(join(tempDir("memsnap-walk-"), "nope")).catch((e: unknown) => e);
    expect(isMemsnapError(err) && err.code).toBe("MEMSNAP_SOURCE_MISSING");
  });
});

describe("fileArtifact", () => {
  const sizes = [0, 1, 64 * 1024 - 1, 64 * 1024, 3 * 1024 * 1024 + 5];

  it("gives the file's bytes with and without reused buffers, small and big", async () => {
    const root = tempDir("memsnap-walk-");
    const written = new Map<string, Buffer>();
    for (const n of sizes) {
      const b = randomBytes(n);
      written.set(`f${n}`, b);
      writeFileSync(join(root, `f${n}`), b);
    }
    const { files } = await walkFiles(root);
    expect(files.length).toBe(sizes.length);
    for (const f of files) {
      const a = fileArtifact(f, "file");
      const plain = await bytesOf(a.open() as AsyncIterable<Buffer>);
      const reused = await bytesOf(a.open({ reuse: true }) as AsyncIterable<Buffer>);
      expect(plain.equals(written.get(f.rel)!), f.rel).toBe(true);
      expect(reused.equals(plain), f.rel).toBe(true);
      await a.check!();
    }
  });

  it("a file removed after the walk is MEMSNAP_SOURCE_CHANGED, small or big", async () => {
    const root = tempDir("memsnap-walk-");
    writeFileSync(join(root, "small"), "tiny");
    writeFileSync(join(root, "big"), randomBytes(200 * 1024));
    const { files } = await walkFiles(root);
    for (const f of files) {
      rmSync(f.abs);
      for (const reuse of [false, true]) {
        const err = await bytesOf(fileArtifact(f, "file").open({ reuse }) as AsyncIterable<Buffer>).catch((e: unknown) => e);
        expect(isMemsnapError(err) && err.code, `${f.rel} reuse=${reuse}`).toBe("MEMSNAP_SOURCE_CHANGED");
      }
    }
  });

  it("a small file that grew after the walk yields one byte more than declared (the packer refuses it), and check() sees a rewrite", async () => {
    const root = tempDir("memsnap-walk-");
    writeFileSync(join(root, "note.md"), "before\n");
    const { files } = await walkFiles(root);
    const f = files[0]!;
    appendFileSync(f.abs, "after, and more\n");
    for (const reuse of [false, true]) {
      const got = await bytesOf(fileArtifact(f, "file").open({ reuse }) as AsyncIterable<Buffer>);
      expect(got.length).toBe(f.stats.size + 1);
    }
    utimesSync(f.abs, new Date(), new Date(Date.now() + 5000));
    const err = await fileArtifact(f, "file").check!().catch((e: unknown) => e);
    expect(isMemsnapError(err) && err.code).toBe("MEMSNAP_SOURCE_CHANGED");
  });
});
