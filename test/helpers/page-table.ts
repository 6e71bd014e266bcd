/** The table of page hashes the `pages` chunking records: 16 bytes of SHA-256 a page (the last may be short). */
import { createHash } from "node:crypto";

export function pageTableOf(b: Buffer, ps: number): Buffer {
  const out = Buffer.alloc(16 * Math.ceil(b.length / ps));
  for (let p = 0; p * ps < b.length; p++) {
    createHash("sha256")
      .update(b.subarray(p * ps, (p + 1) * ps))
      .digest()
      .copy(out, 16 * p, 0, 16);
  }
  return out;
}
