/**
 * The pages of an artifact read and hashed on the thread pool (src/snapshot/page-reader.ts, the
 * native addon's readHash): the same bytes and the same page hashes as reading the file and
 * hashing each page in JS, zero pages and a short last page included, across block boundaries;
 * a file shorter than declared fails as changed; without a descriptor or without the addon there
 * is no such reader (the chunker then hashes the pages itself).
 */
import { createHash, randomBytes } from "node:crypto";
import { mkdtempSync, openSync, closeSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, afterEach, describe, expect, it } from "vitest";
import { aeadAddon } from "../../src/codecs/aead.js";
import type { Artifact } from "../../src/format/artifact.js";
import { pageBlocks } from "../../src/snapshot/page-reader.js";

const work = mkdtempSync(join(tmpdir(), "memsnap-page-reader-"));
afterAll(() => rmSync(work, { recursive: true, force: true }));
const fds: number[] = [];
afterEach(() => {
  for (const fd of fds.splice(0)) closeSync(fd);
  delete process.env.MEMSNAP_NATIVE;
});

const native = typeof aeadAddon()?.readHash === "function";
const CI = process.env.CI === "true";

function artifact(file: string, size: number, descriptor = true): Artifact {
  const fd = openSync(file, "r");
  fds.push(fd);
  return {
    path: "x.db",
    kind: "sqlite",
    size,
    mode: 0o644,
    mtime: new Date(),
    open: () => [readFileSync(file).subarray(0, size)],
    ...(descriptor ? { descriptor: { fd, path: file } } : {}),
  };
}

describe("pageBlocks", () => {
  it.skipIf(!native && !CI)("gives the file's bytes and each page's SHA-256 (first 16 bytes), zero pages and a short tail too", async () => {
    for (const pageSize of [4096, 65536]) {
      // 300 pages of 4 KiB cross the 1 MiB block; 20 of 64 KiB too. Zero pages first, inside, and last whole.
      const pages = pageSize === 4096 ? 300 : 20;
      const bytes = randomBytes(pages * pageSize + 100);
      for (const p of [0, 7, pages - 1]) bytes.fill(0, p * pageSize, (p + 1) * pageSize);
      const file = join(work, `db-${pageSize}`);
      writeFileSync(file, bytes);
      const it = pageBlocks(artifact(file, bytes.length), pageSize);
      expect(it).not.toBeNull();
      const got: Buffer[] = [];
      const hashes: string[] = [];
      for await (const b of it!) {
        got.push(Buffer.from(b.bytes));
        for (let k = 0; k < b.count; k++) hashes.push(b.hashes.toString("hex", 16 * k, 16 * k + 16));
      }
      expect(Buffer.concat(got).equals(bytes)).toBe(true);
      const want: string[] = [];
      for (let at = 0; at < bytes.length; at += pageSize) {
        want.push(createHash("sha256").update(bytes.subarray(at, at + pageSize)).digest("hex").slice(0, 32));
      }
      expect(hashes).toHaveLength(pages + 1);
      expect(hashes).toEqual(want);
    }
  });

  it.skipIf(!native && !CI)("a file shorter than the artifact's size fails as changed (MEMSNAP_SOURCE_CHANGED)", async () => {
    const file = join(work, "short");
    writeFileSync(file, randomBytes(3 * 4096));
    const it = pageBlocks(artifact(file, 5 * 4096), 4096)!;
    const err = await (async () => {
      for await (const _ of it) void _;
    })().catch((e: unknown) => e);
    expect(err).toMatchObject({ code: "MEMSNAP_SOURCE_CHANGED" });
    expect(String((err as Error).message)).toMatch(/ends at 12288 bytes/);
  });

  it("no descriptor, or no addon (MEMSNAP_NATIVE=0): no reader", () => {
    const file = join(work, "plain");
    writeFileSync(file, randomBytes(4096));
    expect(pageBlocks(artifact(file, 4096, false), 4096)).toBeNull();
    process.env.MEMSNAP_NATIVE = "0";
    expect(pageBlocks(artifact(file, 4096), 4096)).toBeNull();
  });
});
