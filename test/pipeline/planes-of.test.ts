/**
 * The packer's byte planes of a shuffled artifact (src/snapshot/pack.ts, planesOf): a page that
 * arrives as one chunk is shuffled from where it lies, before its reader is asked for more (a
 * reader may reuse its buffer); one that arrives in pieces is gathered first. Both give the
 * planes of the whole page, and a page that is not its declared size is refused.
 */
import { randomBytes } from "node:crypto";
import { describe, expect, it } from "vitest";
import { planesOf } from "../../src/snapshot/pack.js";
import { shuffleInto } from "../../src/util/planes.js";
import type { Artifact } from "../../src/format/artifact.js";

function artifact(chunks: () => AsyncIterable<Buffer> | Iterable<Buffer>, size: number): Artifact {
  return { path: "pages/x", kind: "kv-page", size, mode: 0o644, mtime: new Date(0), open: chunks } as Artifact;
}
async function planes(a: Artifact, elem: number): Promise<Buffer> {
  const out: Buffer[] = [];
  for await (const c of planesOf("kv/pages/x", a, elem)) out.push(Buffer.from(c));
  return Buffer.concat(out);
}
function expected(page: Buffer, elem: number): Buffer {
  const out = Buffer.alloc(page.length);
  shuffleInto(out, page, elem);
  return out;
}

describe("planesOf: a page's byte planes, whole or in pieces", () => {
  it("one chunk and the same bytes in pieces give the same planes, for 2- and 4-byte elements", async () => {
    for (const elem of [2, 4]) {
      const page = randomBytes(65536);
      const want = expected(page, elem);
      expect(want.equals(page)).toBe(false);
      expect((await planes(artifact(() => [page], page.length), elem)).equals(want)).toBe(true);
      const pieces = [page.subarray(0, 1000), page.subarray(1000, 40000), page.subarray(40000)];
      expect((await planes(artifact(() => pieces, page.length), elem)).equals(want)).toBe(true);
    }
  });

  it("a whole chunk is shuffled before the reader runs again (a reader that reuses its buffer)", async () => {
    const page = randomBytes(8192);
    const want = expected(page, 2);
    const buf = Buffer.from(page);
    const reusing = async function* (): AsyncGenerator<Buffer> {
      yield buf;
      buf.fill(0xee); // the reader's next read, into the same buffer, finds the end
    };
    expect((await planes(artifact(reusing, page.length), 2)).equals(want)).toBe(true);
  });

  it("a page longer or shorter than declared is refused", async () => {
    const page = randomBytes(4096);
    await expect(planes(artifact(() => [page, Buffer.alloc(2)], page.length), 2)).rejects.toThrow(/grew past/);
    await expect(planes(artifact(() => [page.subarray(0, 100), page.subarray(100)], page.length - 2), 2)).rejects.toThrow(/grew past/);
    await expect(planes(artifact(() => [page.subarray(0, 4000)], page.length), 2)).rejects.toThrow(/shrank/);
  });
});
