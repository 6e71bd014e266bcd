/**
 * n pseudo-random bytes, the same for the same seed (xorshift32). Tests that need a database
 * whose live read is clean register it as the SQL function seeded_blob(n, seed) in place of
 * randomblob(): random bytes left in stale space next to text sometimes read as a token (about
 * one database in a hundred), and the live read then rightly takes the copy path.
 */
export function seededBlob(n: number, seed: number): Buffer {
  const out = Buffer.allocUnsafe(n);
  let x = (Math.imul(seed, 0x9e3779b1) + 0x7f4a7c15) >>> 0 || 1;
  for (let i = 0; i < n; i++) {
    x ^= x << 13; x >>>= 0; x ^= x >>> 17; x ^= x << 5; x >>>= 0;
    out[i] = x & 0xff;
  }
  return out;
}

/** Registers seeded_blob(n, seed) on a better-sqlite3 connection. */
export function registerSeededBlob(db: { function(name: string, o: { deterministic?: boolean }, f: (...a: unknown[]) => unknown): void }): void {
  db.function("seeded_blob", { deterministic: true }, (n, seed) => seededBlob(Number(n), Number(seed)));
}

/** n bytes of text-like words from a seeded generator: compressible, but not trivially. */
export function seededText(n: number, seed: number): Buffer {
  const words = ["agent", "memory", "note", "tool", "result", "vector", "cursor", "trace", "plan", "step", "0x3f", "{\"k\":", "42"];
  const out = Buffer.allocUnsafe(n);
  let x = seed >>> 0 || 1;
  let i = 0;
  while (i < n) {
    x ^= x << 13;
    x ^= x >>> 17;
    x ^= x << 5;
    const w = words[(x >>> 0) % words.length]!;
    i += out.write(`${w}${(x >>> 8) % 7 === 0 ? "\n" : " "}`, i, "latin1");
  }
  return out;
}
