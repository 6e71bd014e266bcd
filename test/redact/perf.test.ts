/**
 * Throughput of the redaction stage (redactArtifact: read → pre-filter → rules on candidate
 * regions → spool file), on generated agent memory:
 *   (a) markdown / JSONL with no secret,
 *   (b) the same with one secret about every 100 KB.
 * Size per scenario: MEMSNAP_REDACT_BENCH_MB, else 100 MB with MEMSNAP_SLOW_TESTS=1 and 10 MB
 * without. The MB/s are printed; loose floors are asserted only when the file is run for numbers;
 * the targets are (a) ≥ 300, (b) ≥ 100 MB/s. For numbers, run this file alone:
 *   MEMSNAP_SLOW_TESTS=1 npx vitest run test/redact/perf.test.ts
 */
import { afterAll, describe, expect, it } from "vitest";
import { jsonl, markdown } from "./helpers/corpus.js";
import { redactor, removeTempDirs } from "./helpers/redactor.js";
import type { Artifact } from "../../src/sources/types.js";

afterAll(removeTempDirs);

const MB = 1e6;
const TOTAL = Number(process.env.MEMSNAP_REDACT_BENCH_MB ?? (process.env.MEMSNAP_SLOW_TESTS ? 100 : 10)) * MB;
const SECRETS = [
  "password=hunter2-fake", "aws key AKIAI44QH8DHBEXAMPLE", "deploy token ghp_FAKEFAKEFAKEFAKEFAKEFAKEFAKEFAKE0000",
  "jwt eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiJmYWtlLXRlc3QtdXNlciJ9.ZmFrZS1zaWduYXR1cmU",
  "db postgres://fakeuser:fake-p4ssw0rd@db.example.net:5432/app", "Authorization: Bearer fake0token0for0tests0only",
];

/** `total` bytes cycling `base` in ~1 MiB chunks cut at newlines; with `every`, a secret line about every `every` bytes. */
function chunks(base: Buffer, total: number, every?: number, wrap: (s: string) => string = (s) => s): Buffer[] {
  const out: Buffer[] = [];
  let size = 0;
  let off = 0;
  let n = 0;
  while (size < total) {
    let end = Math.min(base.length, off + (1 << 20));
    const nl = base.lastIndexOf(10, end - 1);
    if (nl > off) end = nl + 1;
    let c = base.subarray(off, end);
    off = end >= base.length ? 0 : end;
    if (every) {
      const parts: Buffer[] = [];
      let p = 0;
      for (let want = every; want < c.length; want += every) {
        const at = c.indexOf(10, want);
        if (at < 0) break;
        parts.push(c.subarray(p, at + 1), Buffer.from(wrap(SECRETS[n++ % SECRETS.length]!) + "\n"));
        p = at + 1;
      }
      parts.push(c.subarray(p));
      c = Buffer.concat(parts);
    }
    out.push(c);
    size += c.length;
  }
  return out;
}

async function measure(label: string, path: string, data: Buffer[]): Promise<{ wall: number; cpu: number; redacted: number }> {
  const r = await redactor();
  const size = data.reduce((n, c) => n + c.length, 0);
  const a: Artifact = { path, kind: "file", size, mode: 0o644, mtime: new Date(), text: true, open: () => (async function* () { yield* data; })() };
  const c0 = process.cpuUsage();
  const t0 = performance.now();
  const out = await r.redactArtifact(a, `bench/${path}`);
  const s = (performance.now() - t0) / 1000;
  const c = process.cpuUsage(c0);
  const rep = r.report();
  await r.cleanup();
  expect(rep.bytes_scanned).toBe(size);
  expect(out.size).toBeGreaterThan(0);
  const res = { wall: size / MB / s, cpu: size / MB / ((c.user + c.system) / 1e6), redacted: rep.total_redacted };
  console.log(`[redact perf] ${label}: ${(size / MB).toFixed(0)} MB, ${res.wall.toFixed(0)} MB/s wall, ${res.cpu.toFixed(0)} MB/s CPU, ${res.redacted} redacted`);
  return res;
}

describe("redaction throughput", () => {
  it("(a) no secrets and (b) one secret per ~100 KB, markdown and JSONL", async () => {
    const md = Buffer.from(markdown(8 << 20, 5));
    const jl = Buffer.from(jsonl(8 << 20, 6));
    await measure("warm-up", "warm.md", chunks(md, Math.min(8 * MB, TOTAL), 100_000));
    const a1 = await measure("(a) markdown, no secrets", "notes.md", chunks(md, TOTAL));
    const a2 = await measure("(a) JSONL, no secrets", "trace.jsonl", chunks(jl, TOTAL));
    const b1 = await measure("(b) markdown, a secret per 100 KB", "notes.md", chunks(md, TOTAL, 100_000));
    const b2 = await measure("(b) JSONL, a secret per 100 KB", "trace.jsonl", chunks(jl, TOTAL, 100_000, (s) => JSON.stringify({ role: "user", content: s })));
    expect(a1.redacted + a2.redacted).toBe(0);
    expect(b1.redacted).toBeGreaterThanOrEqual(Math.floor(TOTAL / 110_000));
    expect(b2.redacted).toBeGreaterThanOrEqual(Math.floor(TOTAL / 110_000));
    // Speed is measured in `npm run bench`, not asserted in the suite: a CPU-time floor flaked on
    // this machine's noise (JSONL (a): 57 to 113 MB/s CPU for the same code in two CI runs). The
    // floors hold only when this file is run for numbers (MEMSNAP_SLOW_TESTS or MEMSNAP_REDACT_BENCH_MB).
    if (process.env.MEMSNAP_SLOW_TESTS || process.env.MEMSNAP_REDACT_BENCH_MB) {
      for (const x of [a1, a2]) expect(x.cpu).toBeGreaterThan(60);
      for (const x of [b1, b2]) expect(x.cpu).toBeGreaterThan(30);
    }
  }, 300_000);
});
