/**
 * The per-class zstd level (src/snapshot/levels.ts): bytes that level 3 makes smaller keep it,
 * bytes it does not (random, or float32 vectors alone) get level 1. The case that set the sample
 * size (#38): a real SQLite database of prose and float32 embedding BLOBs, whose 1 MiB chunks
 * level 3 makes 5-6 % smaller, was judged dense by four 4 KiB slices (they showed ~2 %).
 */
import { randomBytes } from "node:crypto";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { createRequire } from "node:module";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { isDense, LevelPolicy } from "../../src/snapshot/levels.js";
import { mulberry32 } from "../../scripts/lib/prng.mjs";

interface Db {
  pragma(s: string): unknown;
  exec(s: string): void;
  prepare(s: string): { run(...a: unknown[]): unknown };
  transaction(f: () => void): () => void;
  close(): void;
}
const req = createRequire(import.meta.url);
const Database = req("better-sqlite3") as new (p: string) => Db;
const zstd = req("zstd-napi/binding") as { CCtx: new () => { compress(d: Uint8Array, s: Uint8Array, l: number): number } };

const dir = mkdtempSync(join(tmpdir(), "memsnap-levels-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

const prng = mulberry32 as (seed: number) => () => number;
/** Words of a large vocabulary (made of syllables, with common words twice), as an agent's notes have. */
const SYL = ["ka", "lo", "mi", "ne", "ru", "sa", "ti", "vo", "ze", "pa", "de", "gu", "ho", "ji", "be", "fo", "an", "el"];
const WORDS = (() => {
  const r = prng(777);
  const common = "the a of to and in is that for it with as on was user agent said tool file memory task plan".split(" ");
  const made = Array.from({ length: 3000 }, () => {
    let w = "";
    for (let k = 1 + Math.floor(r() * 3); k >= 0; k--) w += SYL[Math.floor(r() * SYL.length)];
    return w;
  });
  return [...common, ...common, ...made];
})();
function prose(r: () => number, n: number): string {
  let s = "";
  while (s.length < n) s += WORDS[Math.floor(r() * WORDS.length)] + (r() < 0.1 ? ". " : " ");
  return s;
}
function embedding(r: () => number, dim: number): Buffer {
  const f = new Float32Array(dim);
  for (let i = 0; i < dim; i++) f[i] = (r() + r() + r() - 1.5) * 0.1;
  return Buffer.from(f.buffer);
}

/** A database of `rows` chunks of prose (with `embeddings`, a 768-float BLOB each); its bytes. */
function database(name: string, rows: number, text: boolean, embeddings: boolean): Buffer {
  const file = join(dir, name);
  const db = new Database(file);
  db.pragma("journal_mode = DELETE");
  db.exec("CREATE TABLE chunks(id INTEGER PRIMARY KEY, text TEXT, embedding BLOB)");
  const ins = db.prepare("INSERT INTO chunks VALUES (?, ?, ?)");
  const r = prng(7);
  db.transaction(() => {
    for (let i = 1; i <= rows; i++)
      ins.run(i, text ? prose(r, 500 + Math.floor(r() * 600)) : null, embeddings ? embedding(r, 768) : null);
  })();
  db.close();
  return readFileSync(file);
}

const cctx = new zstd.CCtx();
const out = Buffer.allocUnsafe(4 << 20);
const gain = (b: Buffer): number => 1 - cctx.compress(out, b, 3) / cctx.compress(out, b, 1);
const middleMiB = (b: Buffer): Buffer => b.subarray(b.length / 2 - (1 << 19), b.length / 2 + (1 << 19));

describe("per-class zstd levels", () => {
  it("a database of prose and embedding BLOBs keeps level 3, which makes it smaller", () => {
    const chunk = middleMiB(database("knowledge.db", 1500, true, true));
    expect(gain(chunk)).toBeGreaterThan(0.04); // the premise: level 3 pays on these bytes
    expect(isDense(chunk, 3)).toBe(false);
    const p = new LevelPolicy(3);
    expect(p.start("db", 8 << 20, chunk)).toBe(3);
    expect(p.denseSamples).toBe(0);
  });

  it("random bytes and a table of embeddings alone are dense: level 1", () => {
    const vectors = middleMiB(database("vectors.db", 1500, false, true));
    expect(gain(vectors)).toBeLessThan(0.02);
    expect(isDense(vectors, 3)).toBe(true);
    const random = randomBytes(1 << 20);
    expect(isDense(random, 3)).toBe(true);
    const p = new LevelPolicy(3);
    expect(p.start("kv", 8 << 20, random)).toBe(1);
    expect(p.denseSamples).toBe(1);
  });

  it("text is not dense (it compresses at level 1 already)", () => {
    const text = Buffer.from(prose(prng(3), 1 << 20));
    expect(isDense(text, 3)).toBe(false);
  });
});
