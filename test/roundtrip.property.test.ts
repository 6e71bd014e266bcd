/**
 * Property: for random small trees (unicode and spaces in names, nested dirs, empty files,
 * sizes up to ~200 KB, compressible or not) snapshot → restore is the identity on files,
 * plaintext or encrypted. Uses the library (snapshot / restoreToDir / parseConfig) in-process
 * for speed. Empty directories are not captured (sources capture files), so only files are
 * compared. Redaction is switched off: it changes content by design.
 */
import { mkdirSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import fc from "fast-check";
import { beforeAll, describe, expect, it } from "vitest";
import { generateIdentity, parseConfig, restoreToDir, snapshot, verifyBundle } from "../src/index.js";
import { isMemsnapError } from "../src/errors.js";
import { listLeftovers, tempDir, treeHashes } from "./helpers/cli.js";

let identity: string;
let recipient: string;

beforeAll(async () => {
  ({ identity, recipient } = await generateIdentity());
});

/** Deterministic bytes: compressible (a repeating phrase) or not (xorshift). */
function content(size: number, seed: number, compressible: boolean): Buffer {
  if (compressible) return Buffer.from("memory line ✓ ".repeat(Math.ceil(size / 16)).slice(0, size * 2)).subarray(0, size);
  const b = Buffer.allocUnsafe(size);
  let x = seed | 1;
  for (let i = 0; i < size; i++) {
    x ^= x << 13;
    x ^= x >>> 17;
    x ^= x << 5;
    b[i] = x & 0xff;
  }
  return b;
}

const TRICKY = [
  "a", "MEMORY.md", "with space.md", " leading", "trailing ", "ünïcødé", "日本語.txt", "emoji 🧠.md", ".hidden", "-dash",
  "#hash", "100%", "a'b\"c", "tab\there", "new\nline", "e\u0301 (combining)", "x".repeat(120), "ÅÄÖ", "файл", "{braces}", "*star?",
];

/** One file or directory name: valid on Linux, and not one memsnap reserves for itself. */
const nameArb = fc.oneof(
  fc.constantFrom(...TRICKY),
  fc.string({ unit: "grapheme", minLength: 1, maxLength: 12 }),
  fc.string({ unit: "grapheme-ascii", minLength: 1, maxLength: 8 }),
).filter((n) => n !== "." && n !== ".." && !/[/\0\\]/.test(n) && Buffer.byteLength(n) <= 200 && !n.includes("memsnap"));

const fileArb = fc.record({
  dirs: fc.array(nameArb, { maxLength: 3 }),
  name: nameArb,
  size: fc.oneof(fc.constant(0), fc.integer({ min: 1, max: 2000 }), fc.integer({ min: 2000, max: 200_000 })),
  seed: fc.integer(),
  compressible: fc.boolean(),
});

const treeArb = fc.record({
  files: fc.array(fileArb, { maxLength: 8 }),
  state: fc.array(fc.tuple(nameArb, fc.jsonValue({ maxDepth: 3 })), { maxLength: 2 }),
  encrypt: fc.boolean(),
});

/** Write the tree, dropping entries that clash with an earlier file or directory. */
function writeFiles(root: string, files: { path: string[]; data: Buffer }[]): number {
  const fileSet = new Set<string>();
  const dirSet = new Set<string>();
  let n = 0;
  mkdirSync(root, { recursive: true });
  for (const f of files) {
    const p = f.path.join("/");
    const prefixes = f.path.slice(0, -1).map((_, i) => f.path.slice(0, i + 1).join("/"));
    if (fileSet.has(p) || dirSet.has(p) || prefixes.some((x) => fileSet.has(x))) continue;
    prefixes.forEach((x) => dirSet.add(x));
    fileSet.add(p);
    mkdirSync(join(root, ...f.path.slice(0, -1)), { recursive: true });
    writeFileSync(join(root, ...f.path), f.data);
    n++;
  }
  return n;
}

describe("snapshot → restore round trip (property)", () => {
  it("restores every file byte for byte, for random trees, plaintext and encrypted", async () => {
    await fc.assert(
      fc.asyncProperty(treeArb, async (t) => {
        const dir = tempDir("memsnap-prop-");
        try {
          const nFiles = writeFiles(join(dir, "memory"), t.files.map((f) => ({ path: [...f.dirs, f.name], data: content(f.size, f.seed, f.compressible) })));
          const nState = writeFiles(join(dir, "state"), t.state.map(([name, v]) => ({ path: [`${name}.json`], data: Buffer.from(JSON.stringify(v) ?? "null") })));
          const config = parseConfig({
            agent: "prop",
            sources: [{ kind: "files", name: "memory", path: "memory" }, { kind: "state", name: "state", path: "state" }],
          }, join(dir, "memsnap.json"), dir);
          const out = join(dir, "b.memsnap");
          const r = await snapshot({ config, out, redact: false, ...(t.encrypt ? { recipients: [recipient] } : {}) });
          expect(r.manifest.payload.artifacts).toBe(nFiles + nState);
          expect(r.manifest.payload.encryption !== null).toBe(t.encrypt);
          const keys = { identities: [identity] };
          const rep = await verifyBundle(out, { keys });
          expect(rep.ok, JSON.stringify(rep.findings)).toBe(true);
          const target = join(dir, "restored");
          const rr = await restoreToDir(out, target, { keys });
          expect(rr.artifacts).toBe(nFiles + nState);
          expect(treeHashes(join(target, "memory"))).toEqual(treeHashes(join(dir, "memory")));
          expect(treeHashes(join(target, "state"))).toEqual(treeHashes(join(dir, "state")));
          expect(listLeftovers(dir)).toEqual([]);
        } finally {
          rmSync(dir, { recursive: true, force: true });
        }
      }),
      { numRuns: 15 },
    );
  });

  // A backslash is a legal byte in a POSIX file name: snapshot captures such a file, so restore must take it back.
  it("a file whose name holds a backslash round-trips", async () => {
    const dir = tempDir("memsnap-prop-");
    writeFiles(join(dir, "memory"), [{ path: ["win\\style.md"], data: Buffer.from("x") }]);
    const config = parseConfig({ agent: "prop", sources: [{ kind: "files", name: "memory", path: "memory" }] }, null, dir);
    const out = join(dir, "b.memsnap");
    await snapshot({ config, out, redact: false });
    const hung = new Promise((res) => setTimeout(() => res("restoreToDir hung"), 10_000).unref());
    const e = await Promise.race([restoreToDir(out, join(dir, "restored")).then(() => null, (x: unknown) => x), hung]);
    expect(isMemsnapError(e) ? e.code : e).toBeNull();
  }, 30_000);
});
