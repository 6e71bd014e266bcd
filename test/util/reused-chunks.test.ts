/**
 * util/reused-chunks: the bytes come back exactly (up to end + 1, like createReadStream), in
 * two buffers that take turns, a consumer that stops early leaves no read behind, and a read
 * error reaches the consumer.
 */
import { randomBytes } from "node:crypto";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { open } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { reusedChunks } from "../../src/util/reused-chunks.js";

const dir = mkdtempSync(join(tmpdir(), "memsnap-reused-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

async function collect(path: string, end: number, chunk: number): Promise<{ bytes: Buffer; chunks: Buffer[]; copies: Buffer[] }> {
  const fh = await open(path, "r");
  try {
    const chunks: Buffer[] = [];
    const copies: Buffer[] = [];
    for await (const c of reusedChunks(fh, 0, end, chunk)) {
      chunks.push(c);
      copies.push(Buffer.from(c)); // what the chunk held when it was handed out
    }
    return { bytes: Buffer.concat(copies), chunks, copies };
  } finally {
    await fh.close();
  }
}

describe("reusedChunks", () => {
  const CHUNK = 4096;
  for (const size of [0, 1, CHUNK - 1, CHUNK, CHUNK + 1, 3 * CHUNK + 5]) {
    it(`a ${size}-byte file read to size + 1 comes back whole`, async () => {
      const data = randomBytes(size);
      const p = join(dir, `f${size}`);
      writeFileSync(p, data);
      const { bytes, chunks } = await collect(p, size, CHUNK);
      expect(bytes.equals(data)).toBe(true);
      expect(chunks.every((c) => c.length <= CHUNK)).toBe(true);
    });
  }

  it("reads no further than end + 1 of a longer file (a grown file is seen, not read to its end)", async () => {
    const data = randomBytes(10 * CHUNK);
    const p = join(dir, "long");
    writeFileSync(p, data);
    const { bytes } = await collect(p, 2 * CHUNK + 100, CHUNK);
    expect(bytes.equals(data.subarray(0, 2 * CHUNK + 101))).toBe(true);
  });

  it("two buffers take turns: a chunk is overwritten by the one two reads later", async () => {
    const data = randomBytes(6 * CHUNK);
    const p = join(dir, "turns");
    writeFileSync(p, data);
    const { chunks, copies } = await collect(p, data.length, CHUNK);
    expect(chunks).toHaveLength(6);
    const buffers = new Set(chunks.map((c) => c.buffer));
    expect(buffers.size).toBe(2);
    expect(chunks[0]!.buffer).toBe(chunks[2]!.buffer);
    expect(chunks[0]!.buffer).not.toBe(chunks[1]!.buffer);
    // The first chunk's buffer now holds a later chunk's bytes: why consumers must copy to keep.
    expect(chunks[0]!.equals(copies[0]!)).toBe(false);
  });

  it("a consumer that stops after one chunk leaves no read in flight, and the file closes", async () => {
    const data = randomBytes(8 * CHUNK);
    const p = join(dir, "early");
    writeFileSync(p, data);
    const fh = await open(p, "r");
    let first: Buffer | undefined;
    for await (const c of reusedChunks(fh, 0, data.length, CHUNK)) {
      first = Buffer.from(c);
      break;
    }
    await fh.close();
    expect(first!.equals(data.subarray(0, CHUNK))).toBe(true);
  });

  it("a read error reaches the consumer", async () => {
    const p = join(dir, "closed");
    writeFileSync(p, randomBytes(3 * CHUNK));
    const fh = await open(p, "r");
    const it = reusedChunks(fh, 0, 3 * CHUNK, CHUNK);
    await it.next();
    await fh.close(); // the next read (already issued) or the one after fails on a closed handle
    await expect((async () => { for (;;) { const r = await it.next(); if (r.done) return; } })()).rejects.toThrow();
  });
});
