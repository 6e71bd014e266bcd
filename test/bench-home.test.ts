/**
 * The realistic home of the benchmark (scripts/lib/gen-home.mjs, issue #38 item 5) at a tiny
 * scale: it has the shapes the issue names (a paged KV dump with manifest.json page_bytes, a WAL
 * database with frames still in its -wal, a git memdir with history, JSONL, JSON cursors), and
 * `memsnap init` on it finds each and captures every byte.
 */
import { spawnSync } from "node:child_process";
import { readFileSync, readdirSync, statSync } from "node:fs";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { generateHome } from "../scripts/lib/gen-home.mjs";
import { shaExtensions } from "../scripts/lib/measure.mjs";
import { expectOk, jsonOut, runCliSync, tempDir } from "./helpers/cli.js";

describe("bench: the realistic agent home", () => {
  it("has the issue's shapes at scale 0.02, and memsnap init captures all of it", async () => {
    const dir = join(tempDir("memsnap-home-"), "home");
    const h = await generateHome({ dir, scale: 0.02 });

    // KV: 32 layer files of whole 64 KiB pages, a manifest giving page_bytes and a hash per page, ~60 % distinct
    const kv = readdirSync(join(dir, "kv"));
    const layers = kv.filter((f) => /^layer_\d\d\.kvpages$/.test(f));
    expect(layers).toHaveLength(32);
    const man = JSON.parse(readFileSync(join(dir, "kv", "manifest.json"), "utf8"));
    expect(man.page_bytes).toBe(65536);
    const pages = layers.reduce((n, f) => n + statSync(join(dir, "kv", f)).size / 65536, 0);
    expect(pages).toBe(h.parts.kv.pages);
    const hashes = man.layers.flatMap((l: { page_sha256: string[] }) => l.page_sha256);
    expect(hashes).toHaveLength(pages);
    expect(new Set(hashes).size).toBe(h.parts.kv.distinct);
    expect(h.parts.kv.distinct / pages).toBeGreaterThan(0.55);
    expect(h.parts.kv.distinct / pages).toBeLessThan(0.65);

    // SQLite: memory.db in WAL mode (header bytes 18/19 = 2) with frames in its -wal (magic 0x377f068x)
    const hdr = readFileSync(join(dir, "db", "memory.db")).subarray(0, 20);
    expect([hdr[18], hdr[19]]).toEqual([2, 2]);
    const wal = readFileSync(join(dir, "db", "memory.db-wal"));
    expect(wal.readUInt32BE(0) & 0xfffffffe).toBe(0x377f0682);
    expect(h.parts.wal.frames).toBeGreaterThan(10);
    expect(wal.length).toBe(32 + h.parts.wal.frames * (4096 + 24));
    expect(Object.keys(h.parts.sqlite).sort()).toEqual(["db/episodes.db", "db/knowledge.db", "db/memory.db"]);

    // the memdir: its history
    const count = spawnSync("git", ["-C", join(dir, "memory"), "rev-list", "--count", "HEAD"], { encoding: "utf8" });
    expect(Number(count.stdout.trim())).toBe(h.parts.git.commits);
    expect(h.parts.git.commits).toBe(60);
    expect(readdirSync(join(dir, "traces")).filter((f) => f.endsWith(".jsonl")).length).toBe(h.parts.traces.files);

    // memsnap init: every shape found, every byte captured
    const r = runCliSync(["init", dir, "--print", "--json"]);
    expectOk(r);
    const d = jsonOut(r) as {
      sources: { kind: string; path: string; extra?: Record<string, string> }[];
      coverage: { captured_bytes: number; total_bytes: number };
      left_out: unknown[];
    };
    expect(d.coverage.captured_bytes).toBe(d.coverage.total_bytes);
    expect(d.coverage.total_bytes).toBe(h.bytes);
    expect(d.left_out).toEqual([]);
    const kinds = d.sources.map((s) => `${s.kind} ${s.path}${s.extra?.format ? ` ${s.extra.format}` : ""}`).sort();
    expect(kinds).toEqual([
      "files traces", "git memory", "kv kv paged", "sqlite db/episodes.db", "sqlite db/knowledge.db",
      "sqlite db/memory.db", "state state",
    ]);
    const text = runCliSync(["init", dir, "--force"]);
    expectOk(text);
    expect(text.stdout).toMatch(/^captures (\S+ \S+) of \1$/m);
  });

  it("names SHA extensions from /proc/cpuinfo flags (x86 sha_ni, arm64 sha2), and their absence", () => {
    expect(shaExtensions("processor\t: 0\nflags\t\t: fpu sse2 sha_ni avx2\n")).toBe("yes (sha_ni)");
    expect(shaExtensions("processor\t: 0\nFeatures\t: fp asimd aes sha1 sha2 crc32\n")).toBe("yes (sha2)");
    expect(shaExtensions("processor\t: 0\nflags\t\t: fpu sse2 avx2 sha\n")).toBe("no");
  });
});
