#!/usr/bin/env node
// The redaction pre-filter's speed, JS finders against the native scan, on the text files of a
// directory (default: the bench mix's traces and notes), in the stream redactor's 64 KiB pieces.
//   npm run build && node scripts/prefilter-speed.mjs [DIR...]
import { readFileSync, readdirSync, statSync } from "node:fs";
import { join } from "node:path";

const { FINDERS } = await import("../dist/redact/prefilter.js");
const { nativePrefilter } = await import("../dist/redact/native.js");
const native = nativePrefilter();
const dirs = process.argv.slice(2);
if (dirs.length === 0) dirs.push(".bench/mix-1/data/traces", ".bench/mix-1/data/memory");
const PIECE = 64 * 1024;

function files(dir) {
  return readdirSync(dir, { recursive: true }).map((f) => join(dir, String(f)))
    .filter((f) => /\.(jsonl|md|txt|json)$/.test(f) && statSync(f).isFile());
}

function time(bufs, hit) {
  let bytes = 0, hits = 0, pieces = 0;
  const t0 = performance.now();
  for (const b of bufs) {
    for (let o = 0; o < b.length; o += PIECE) {
      const p = b.subarray(o, o + PIECE);
      bytes += p.length;
      pieces++;
      if (hit(p)) hits++;
    }
  }
  const ms = performance.now() - t0;
  return { ms, msPerMB: ms / (bytes / 1e6), mb: bytes / 1e6, hits, pieces };
}

for (const dir of dirs) {
  const bufs = files(dir).map((f) => readFileSync(f));
  const js = (p) => { const v = p.toString("latin1"); return FINDERS.some((f) => f.cursor(v)(0) >= 0); };
  const nat = native ? (p) => native.scan(p) >= 0 : null;
  for (let round = 0; round < 3; round++) { // the last round counts (the first ones warm up)
    const a = time(bufs, js);
    const b = nat ? time(bufs, nat) : null;
    if (round < 2) continue;
    console.log(`${dir}: ${a.mb.toFixed(1)} MB in ${a.pieces} pieces`);
    console.log(`  JS finders   ${a.msPerMB.toFixed(2)} ms/MB  (pieces with a candidate: ${a.hits})`);
    console.log(b ? `  native scan  ${b.msPerMB.toFixed(2)} ms/MB  (pieces with a trigger that passed: ${b.hits}; simd ${native.simd})` : "  native scan  not built");
  }
}
