/**
 * The pages of an artifact read and hashed on the thread pool (src/snapshot/page-reader.ts, the
 * native addon's readHash): the same bytes and the same page hashes as reading the file and
 * hashing each page in JS, zero pages and a short last page included, across block boundaries;
 * a file shorter than declared fails as changed; without a descriptor or without the addon there
 * is no such reader (the chunker then hashes the pages itself). A database chunked against its
 * base through the reader (whole unchanged blocks referenced at once) gives the same entry,
 * recipe, table and stored bytes as chunked page by page in JS.
 */
import { createHash, randomBytes } from "node:crypto";
import { mkdtempSync, openSync, closeSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, afterEach, describe, expect, it } from "vitest";
import { aeadAddon } from "../../src/codecs/aead.js";
import type { Artifact } from "../../src/format/artifact.js";
import { pageBlocks } from "../../src/snapshot/page-reader.js";
import { packChunked, packWhole, type ChunkBase, type ChunkContext } from "../../src/snapshot/chunking.js";
import type { IndexEntry } from "../../src/format/manifest.js";

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

describe("packChunked through the page reader", () => {
  it.skipIf(!native && !CI)("the same ranges, recipe, table and stored bytes as page by page in JS", async () => {
    const ps = 4096;
    const pages = 1000; // four 1 MiB blocks of the reader, the last one short
    const before = randomBytes(pages * ps);
    const file = join(work, "chunk.db");
    writeFileSync(file, before);
    const stored: Buffer[] = [];
    const pack = async (x: Artifact): Promise<IndexEntry> => {
      const parts: Buffer[] = [];
      for await (const c of x.open() as AsyncIterable<Buffer>) parts.push(Buffer.from(c));
      const b = Buffer.concat(parts);
      stored.push(b);
      const sha256 = createHash("sha256").update(b).digest("hex");
      return { path: "db/chunk.db", layer: "db", kind: "sqlite", size: b.length, sha256, mode: 0o644, mtime: new Date(0).toISOString() };
    };
    const hint = { mode: "pages" as const, pageSize: ps };
    const whole = await packWhole(artifact(file, before.length, false), hint, pack);
    const base: ChunkBase = { size: before.length, sha256: whole.entry.sha256, holder: "BASE", rec: whole.rec, table: whole.table };
    // A page changed in the first block and one in the last, two pages of the second swapped
    // (found by hash, off their place), the third unchanged (referenced at once), two pages appended.
    const after = Buffer.concat([before, randomBytes(2 * ps)]);
    randomBytes(ps).copy(after, 5 * ps);
    before.copy(after, 300 * ps, 301 * ps, 302 * ps);
    before.copy(after, 301 * ps, 300 * ps, 301 * ps);
    randomBytes(ps).copy(after, 900 * ps);
    writeFileSync(file, after);
    const ctx = (): ChunkContext => ({ name: "db/chunk.db", layer: "db", self: "SELF", workDir: work, pack, use: () => undefined });
    const results = [];
    for (const descriptor of [true, false]) {
      stored.length = 0;
      const a = artifact(file, after.length, descriptor);
      expect(pageBlocks(a, ps) === null).toBe(!descriptor);
      const r = await packChunked(a, hint, base, ctx());
      results.push({ ranges: r.entry.ranges, sha256: r.entry.sha256, recipe: r.rec.r, table: r.table!.toString("hex"), stored: Buffer.concat(stored).toString("hex") });
    }
    // the hashes a reader of every byte computed already (Artifact.pageHashes, a SQLite
    // incremental scan): the same entry, with only the stored pages read
    const tableOf = (b: Buffer): Buffer => {
      const t = Buffer.alloc(16 * Math.ceil(b.length / ps));
      for (let p = 0; p * ps < b.length; p++) createHash("sha256").update(b.subarray(p * ps, (p + 1) * ps)).digest().copy(t, 16 * p, 0, 16);
      return t;
    };
    const pageHashes = { pageSize: ps, table: tableOf(after), sha256: createHash("sha256").update(after).digest("hex") };
    stored.length = 0;
    const pre = await packChunked({ ...artifact(file, after.length), pageHashes }, hint, base, ctx());
    results.push({ ranges: pre.entry.ranges, sha256: pre.entry.sha256, recipe: pre.rec.r, table: pre.table!.toString("hex"), stored: Buffer.concat(stored).toString("hex") });
    expect(results[0]).toEqual(results[1]);
    expect(results[2]).toEqual(results[1]);
    expect(results[0]!.sha256).toBe(createHash("sha256").update(after).digest("hex"));
    // a stored page whose bytes are not those its hash says (changed after they were hashed): refused
    const wrong = Buffer.from(pageHashes.table);
    wrong[16 * 900] ^= 1;
    await expect(packChunked({ ...artifact(file, after.length), pageHashes: { ...pageHashes, table: wrong } }, hint, base, ctx()))
      .rejects.toMatchObject({ code: "MEMSNAP_SOURCE_CHANGED" });
    // unchanged pages are never read: a hash table that says they are as they were is taken as it is
    const later = Buffer.from(after);
    randomBytes(ps).copy(later, 100 * ps); // (a page the table still gives as unchanged)
    writeFileSync(file, later);
    stored.length = 0;
    const unread = await packChunked({ ...artifact(file, after.length), pageHashes }, hint, base, ctx());
    expect(unread.entry.sha256).toBe(pageHashes.sha256);
    expect(Buffer.concat(stored).toString("hex")).toBe(results[1]!.stored);
    // pages 5 and 900 and the two appended stored; 300 and 301 referenced off their place
    expect(results[0]!.stored.length / 2).toBe(4 * ps);
    expect(results[0]!.ranges).toEqual([[5 * ps, "BASE", 0], [ps], [294 * ps, "BASE", 6 * ps], [ps, "BASE", 301 * ps], [ps, "BASE", 300 * ps], [598 * ps, "BASE", 302 * ps], [ps], [99 * ps, "BASE", 901 * ps], [2 * ps]]);
  });
});
